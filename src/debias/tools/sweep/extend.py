"""More seeds for a sweep, and seeds added in batches until the verdict is decided.

``--resume --seeds 0-9`` adds to the plan the seeds it lacks, for every setting of the sweep (the jobs grouped by
their overrides but the seed), named as the sweep names them; the experiments done are kept (DVC's experiments
of the sweep's commit), the shared upstream runs done are kept, and only the new seeds' upstream runs and
experiments run.

``--until-decided MAX --margin D`` compares the sweep's two settings paired by seed on one headline metric at
planned looks (the seeds the sweep has, then every ``--batch`` more, up to ``MAX``): at each look the paired
t-test ("differs") and TOST within ``±D`` ("within"), each at ``alpha / looks`` (Bonferroni over the looks planned,
:func:`debias.metrics.paired.sequential_look`), so looking again after each batch keeps the chance of a false
verdict of either kind at ``alpha`` or below. The plan is kept in the sweep's state: a later call with another plan
is refused (its looks would not be counted)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from debias.metrics.paired import ALPHA, MIN_VERDICT_PAIRS, Look, sequential_look
from debias.tools.sweep.grid import Job, SweepError, value_label

# What --until-decided compares by default: stage 2's test unbiased accuracy (the mean over the (class, bias) groups:
# every test image counts; a worst group of a few images moves by 10-50 points per image on the bundled digits)
DECIDE_METRIC = "s2_unbiased"

SEED = "seed"


def setting_key(job: Job) -> str:
    """A job's overrides but the seed, as canonical JSON: the setting it runs one seed of."""
    return json.dumps({k: v for k, v in job.overrides.items() if k != SEED}, sort_keys=True, default=str)


def settings(jobs: list[Job]) -> dict[str, list[Job]]:
    """Setting -> its jobs (in plan order); a SweepError when a job has no seed (the sweep has no seed axis)."""
    found: dict[str, list[Job]] = {}
    for job in jobs:
        if SEED not in job.overrides:
            raise SweepError(f"experiment {job.name} sets no seed: this sweep has no seed axis to extend (its plan "
                             "names its experiments one by one); launch a new sweep with --seeds")
        found.setdefault(setting_key(job), []).append(job)
    return found


def seed_name(job: Job, seed: int) -> str:
    """``job``'s name for another seed: its trailing ``seed<value>`` replaced (``eps-epsilon0-seed0`` ->
    ``eps-epsilon0-seed3``), else ``-seed<value>`` added."""
    label = f"seed{value_label(job.overrides[SEED])}"
    base = job.name[: -len(label)].rstrip("-") if job.name.endswith(label) else job.name
    return f"{base}-seed{value_label(seed)}"


def extended_jobs(jobs: list[Job], seeds: list[int]) -> list[Job]:
    """The jobs to add so that every setting of ``jobs`` runs every seed of ``seeds`` (settings in plan order,
    then seeds in the given order); none for a seed a setting has."""
    new = []
    for members in settings(jobs).values():
        have = {job.overrides[SEED] for job in members}
        first = members[0]
        for seed in seeds:
            if seed not in have:
                new.append(Job(seed_name(first, seed), {**first.overrides, SEED: seed}, list(first.targets)))
    return new


def next_seeds(have: list[int], count: int) -> list[int]:
    """``count`` seeds after the largest of ``have``."""
    start = max(have, default=-1) + 1
    return list(range(start, start + count))


def planned_looks(start: int, batch: int, maximum: int) -> list[int]:
    """Seed counts at which to look: ``start`` (at least :data:`MIN_VERDICT_PAIRS`, below which no look decides),
    then every ``batch`` more, the last at ``maximum`` (``planned_looks(3, 3, 10)`` -> ``[3, 6, 9, 10]``)."""
    if batch < 1:
        raise SweepError(f"--batch {batch}; allowed: a whole number >= 1 (seeds added per look)")
    if maximum < MIN_VERDICT_PAIRS:
        raise SweepError(f"--until-decided {maximum}; allowed: {MIN_VERDICT_PAIRS} or more seeds (a verdict rests "
                         f"on {MIN_VERDICT_PAIRS} or more, as debias compare's does): e.g. --until-decided 10")
    looks = [min(max(start, MIN_VERDICT_PAIRS), maximum)]
    while looks[-1] < maximum:
        looks.append(min(looks[-1] + batch, maximum))
    return looks


def setting_label(job: Job, other: Job) -> str:
    """What ``job``'s setting sets differently from ``other``'s: ``'loss.epsilon=0.25'``."""
    keys = [k for k in job.overrides if k != SEED and job.overrides.get(k) != other.overrides.get(k)]
    return ", ".join(f"{k}={job.overrides[k]}" for k in keys) or job.name


@dataclass(frozen=True)
class Plan:
    """A sequential comparison's plan, fixed before its first look: the metric, the margin, the seed counts of
    the looks and the level ``alpha`` shared out over them."""

    metric: str
    margin: float
    looks: list[int]
    batch: int
    alpha: float = ALPHA

    def as_state(self) -> dict[str, Any]:
        return {"metric": self.metric, "margin": self.margin, "looks": self.looks, "batch": self.batch,
                "alpha": self.alpha}


def check_plan(kept: dict[str, Any] | None, plan: Plan) -> Plan:
    """The plan to follow: ``plan``, or the one kept in the sweep's state when it is the same; a SweepError when
    another plan was started (its looks happened: a new plan would look again uncounted)."""
    if kept is None:
        return plan
    same = (kept["metric"], float(kept["margin"]), kept["looks"][-1], kept["batch"]) == (
        plan.metric, float(plan.margin), plan.looks[-1], plan.batch)
    if not same:
        raise SweepError(f"this sweep follows the sequential plan --until-decided {kept['looks'][-1]} --margin "
                         f"{kept['margin']} --metric {kept['metric']} --batch {kept['batch']} (looks at "
                         f"{', '.join(map(str, kept['looks']))} seeds, each test at alpha/{len(kept['looks'])}); its "
                         "looks were counted against that plan, so another plan cannot keep false verdicts at alpha: "
                         "repeat the same options, or launch a new sweep")
    return Plan(kept["metric"], float(kept["margin"]), list(kept["looks"]), int(kept["batch"]),
                float(kept.get("alpha", ALPHA)))


def paired_differences(members: dict[str, list[Job]], values: dict[str, float]) -> tuple[list[int], list[float]]:
    """Seeds both settings ran, and per seed the second setting's value minus the first's (``values``: experiment
    name -> metric)."""
    first, second = list(members.values())
    by_seed = [{job.overrides[SEED]: values.get(job.name) for job in jobs} for jobs in (first, second)]
    seeds = [s for s in by_seed[0] if s in by_seed[1] and by_seed[0][s] is not None and by_seed[1][s] is not None]
    return seeds, [by_seed[1][s] - by_seed[0][s] for s in seeds]


def look_text(look: Look, index: int, plan: Plan, metric: str, names: tuple[str, str], unit: str) -> str:
    """One look in words: the paired difference, its interval at the look's level, both verdicts."""
    p = look.paired
    verdict = ("differs" + (f" and within ±{plan.margin:g} {unit}" if look.within else "") if look.differs
               else f"within ±{plan.margin:g} {unit}" if look.within else "undecided")
    return (f"look {index + 1} of {len(plan.looks)} at {p.n} seeds (each test at alpha/{len(plan.looks)} = "
            f"{look.level:.4g}, Bonferroni over the planned looks): {metric} {names[1]} - {names[0]}: "
            f"{p.mean:+.2f} {unit}, {100 * (1 - look.level):.4g} % interval [{p.low:+.2f}, {p.high:+.2f}]: {verdict}")

