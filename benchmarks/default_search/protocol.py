"""The default search's protocol as data (candidates, cells, the printed steps) and its decision functions: the
screen's carry, the confirmation's size, the decision on validation numbers, and the extension's plan and verdict.
Reads rows, writes nothing."""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from benchmarks import cells
from benchmarks.cells import cell_of, regime_of  # noqa: F401 (the search's modules read them here)
from benchmarks.cells import BenchmarkError, Cell, digits_cell
from debias.metrics.paired import Paired, paired, seeds_needed, tost


# CNC's own settings (CNC App. D.2.4; params.yaml's), the same in every candidate.
CNC_COMMON: dict[str, Any] = {
    "stage2.method": "cnc", "stage2.selection": "best_unbiased", "stage2.lr_milestones": [],
    "stage2.optimizer": "adam", "stage2.lr": 0.001, "stage2.weight_decay": 0.0001, "stage2.epochs": 3,
    "stage2.augment_shift": 2, "stage2.cnc.accumulation": 1, "stage2.cnc.head_gradient": "step",
    "stage2.cnc.encoder_mode": "train", "stage2.cnc.temperature": 0.05, "stage2.cnc.contrastive_weight": 0.75,
    "stage2.cnc.two_sided": True, "stage2.cnc.init": "scratch", "stage2.cnc.skip_empty_classes": True,
    "stage2.cnc.forward_chunk": 8,
}


# Schedules: Adam 1e-3 for 3 epochs (CNC App. D.2.4's epochs), each over a share of the anchors, with pools of M = N
# images. The three see the same images per run (anchor share x (1 + 2 (M + N)) is constant): q3 in batches of 129,
# q3m16 twice the steps in batches of 65, q3m8 four times the steps in batches of 33.
SCHEDULES: dict[str, dict[str, Any]] = {
    "q3": {"stage2.cnc.anchor_fraction": 0.25, "stage2.cnc.num_positives": 32, "stage2.cnc.num_negatives": 32},
    "q3m16": {"stage2.cnc.anchor_fraction": 0.5, "stage2.cnc.num_positives": 16, "stage2.cnc.num_negatives": 16},
    "q3m8": {"stage2.cnc.anchor_fraction": 1.0, "stage2.cnc.num_positives": 8, "stage2.cnc.num_negatives": 8},
}


EPSILONS = (0.0, 0.5)  # CNC's loss without a margin, and with the released FairKL objective's (FairKL Table 6)


POOLS = ("replace", "shrink")


PREVIOUS = "cnc-q3-cluster-shrink-e0"  # the default this search was run against


# The released FairKL objective (FairKL Table 6 at rho 0.99: alpha 0.03, lambda 0.5, eps 0.5; tau 0.1), on clusters.
FAIRKL = "fairkl-released"


FAIRKL_SETS: dict[str, Any] = {
    "stage2.method": "eps_supinfonce", "stage2.selection": "best_unbiased", "stage2.optimizer": "adam",
    "stage2.lr": 0.001, "stage2.weight_decay": 0.00001, "stage2.batch_size": 256, "stage2.epochs": 30,
    "stage2.lr_milestones": [], "stage2.augment_shift": 0, "loss.temperature": 0.1, "loss.epsilon": 0.5,
    "loss.alpha": 0.03, "loss.fairkl.variant": "released", "loss.fairkl.weight": 0.5, "loss.fairkl.sampler": "shuffle",
}


REGIMES = ("digits", "cmnist", "bmnist")  # decided separately


COST_BUDGET = 2.0  # stage-2 CPU seconds summed over a regime's cells, over FairKL's on the same cells


CARRY_TOP = 3


DETECT = 2.0  # points of validation unbiased accuracy the confirmation must detect at 80 % power


MARGIN = 1.0  # points: the equivalence margin (TOST)


FLOOR = {"digits": 10, "cmnist": 8, "bmnist": 8}


CAP = {"digits": 40, "cmnist": 20, "bmnist": 20}


RULES = ("best_unbiased", "best_worst_group", "last")


RANKED_RULE = "best_unbiased"


DIGITS_SCREEN, CONFIRM_SEED, HELDOUT_SEED = 4, 10, 100


EXTENSION_SEED = 200  # the extension's fresh validation cells: seeds from here on


EXTENSION_CAP = 100  # cells at most, a regime


SCREEN_CELLS = ([digits_cell(s) for s in range(DIGITS_SCREEN)]
                + [Cell("mnist10k-A", p, "paper", s) for p in cells.PROTOCOLS for s in (0, 1)])


def confirm_cells(sizes: dict[str, int]) -> list[Cell]:
    """The confirmation's validation cells: seeds from :data:`CONFIRM_SEED` on, ``sizes[regime]`` of each regime, on
    the bundled digits and half A of mnist10k with the papers' palettes."""
    return ([digits_cell(CONFIRM_SEED + i) for i in range(sizes.get("digits", 0))]
            + [Cell("mnist10k-A", p, "paper", CONFIRM_SEED + i) for p in cells.PROTOCOLS for i in range(sizes.get(p, 0))])


# Held out: the bundled digits at 10 other seeds; half B of mnist10k with the palettes no choice saw, and Biased-MNIST
# at rho 0.98 as a fourth regime never chosen on.
HELDOUT_CELLS = ([digits_cell(HELDOUT_SEED + i) for i in range(10)]
                 + [Cell("mnist10k-B", p, palette, HELDOUT_SEED + i) for p in cells.PROTOCOLS
                    for palette in ("other", "fresh") for i in range(4)]
                 + [Cell("mnist10k-B", "bmnist", palette, HELDOUT_SEED + i, 0.98) for palette in ("other", "fresh")
                    for i in range(3)])


HELDOUT_REGIMES = ("digits", "cmnist", "bmnist", "bmnist0.98")


PROTOCOL = f"""1. Screen every candidate on {len(SCREEN_CELLS)} validation cells: the bundled digits (seeds 0-{DIGITS_SCREEN - 1}), half A of mnist10k under CMNIST* 0.96 and Biased-MNIST 0.96 (papers' palettes, seeds 0 and 1).
2. Carry the top {CARRY_TOP} eligible candidates by validation unbiased accuracy (the mean of the regimes' means), each regime's best eligible one, and the references: the previous default ({PREVIOUS}), the best eligible CNC on ERM predictions, the best eligible q3m16 schedule on clusters, the released FairKL objective.
3. Size the confirmation of each regime from the screen: the pooled paired sd s of the carried candidates' validation unbiased accuracy; n = the cells that detect a {DETECT:g}-point difference (two-sided paired t, α 0.05) and show equivalence within ±{MARGIN:g} point for a true difference of 0 (TOST, α 0.05), each at 80 % power; n between a floor and a cap per regime ({', '.join(f'{r} {FLOOR[r]}-{CAP[r]}' for r in REGIMES)}).
4. Confirm on fresh validation cells (seeds {CONFIRM_SEED} on). Decide on their validation numbers only: per regime, the winner is the candidate with the highest mean validation unbiased accuracy; a candidate holds a regime when it is the winner or shown equivalent to it (TOST within ±{MARGIN:g} point, α 0.05), and is shown worse (95 % paired interval below 0) than no carried candidate on validation unbiased or worst-group accuracy. The default is the cheapest candidate (stage-2 CPU seconds summed over the confirmation cells) that holds every regime; if none does, the page says so and names the candidate holding the bundled digits and the most other regimes (ties: the higher mean of the regime means).
5. Eligible: stage-2 CPU seconds summed over each regime's cells at most {COST_BUDGET:g} times FairKL's on the same cells, in every regime. Nothing else gates; a warning a candidate carries is reported with what was measured.
6. Report every carried candidate on held-out cells: half B of mnist10k (images the choice never saw; palettes other and fresh; Biased-MNIST at 0.98 too) and the bundled digits at seeds {HELDOUT_SEED}-{HELDOUT_SEED + 9}; test numbers per regime, each difference paired by cell (one difference per cell: intervals clustered by cell), with the difference its cells could detect."""


EXTENSION_PROTOCOL = f"""7. Extension, written after steps 1-6 ran and before its own runs. For each regime where the default of step 4 is neither the winner nor shown equivalent to it, and is shown worse than no carried candidate, run the default and that regime's winner on fresh validation cells of the regime's data (half A of mnist10k or the bundled digits, seeds {EXTENSION_SEED} on): as many cells as show equivalence within ±{MARGIN:g} point at 80 % power for a true difference of 0 (TOST, α 0.05), given the two's paired sd of validation unbiased accuracy over the confirmation cells; at most {EXTENSION_CAP}. The verdict reads the extension's cells alone (the confirmation's cells decided that it runs) and their validation numbers only, by step 4's rule for the two: the default holds the regime when its mean validation unbiased accuracy is the higher or it is shown equivalent (TOST within ±{MARGIN:g} point, α 0.05), and it is shown worse (95 % paired interval below 0) on neither validation unbiased nor worst-group accuracy. If it then holds every regime, it is a default that holds every regime; if not, the page names the regime no single setting holds, with the interval."""


REPORT_PROTOCOL = """8. Report only, written after step 7 ran and before its own runs: on step 7's cells, every other carried candidate whose mean validation unbiased accuracy on that regime's confirmation cells is above the default's, each against the default, paired by cell, on validation unbiased and worst-group accuracy, with the difference the cells detect. It changes no verdict: it says whether the default trails any of them on cells that can tell."""


FIELDS = ["phase", "regime", "data", "protocol", "strength", "palette", "seed", "candidate", "rule", "epoch",
          "degenerate", "val_unbiased", "val_worst", "test_avg", "test_unbiased", "test_worst", "test_worst_n",
          "cpu_seconds", "wall_seconds", "threads", "jobs", "rev", "data_sha", "date", "key"]


TEST_FIELDS = ("test_avg", "test_unbiased", "test_worst", "test_worst_n")  # read by the report, never by decide()


@dataclass(frozen=True)
class Candidate:
    name: str
    sets: dict[str, Any]
    group_source: str
    schedule: str = ""
    pools: str = ""
    epsilon: float = math.nan


def cnc_candidate(schedule: str, group_source: str, pools: str, epsilon: float) -> Candidate:
    name = f"cnc-{schedule}-{group_source}-{pools}-e{epsilon:g}"
    sets = {**CNC_COMMON, **SCHEDULES[schedule], "stage2.cnc.short_pools": pools, "loss.epsilon": epsilon}
    return Candidate(name, sets, group_source, schedule, pools, epsilon)


def candidates() -> dict[str, Candidate]:
    """Every candidate, by name: CNC's factorial (schedule x group source x pools x ε) and FairKL."""
    found = [cnc_candidate(schedule, groups, pools, eps) for schedule in SCHEDULES for groups in cells.GROUP_SOURCES
             for pools in POOLS for eps in EPSILONS]
    found.append(Candidate(FAIRKL, FAIRKL_SETS, "cluster"))
    return {c.name: c for c in found}


def duplicate_runs(rows: list[dict[str, str]]) -> list[str]:
    """Each run (phase, cell, candidate, rule) that more than one row gives, with those rows' numbers (1: the first
    row) and what made them differ; empty when every run has one row."""
    seen: dict[tuple[str, Cell, str, str], list[int]] = {}
    for number, row in enumerate(rows, 1):
        seen.setdefault((row["phase"], cell_of(row), row["candidate"], row["rule"]), []).append(number)
    found = []
    for (phase, cell, candidate, rule), numbers in seen.items():
        if len(numbers) > 1:
            differ = [f"{field} {' / '.join(dict.fromkeys(rows[n - 1].get(field, '') for n in numbers))}"
                      for field in (*cells.MADE_WITH, "key")
                      if len({rows[n - 1].get(field, "") for n in numbers}) > 1]
            found.append(f"rows {', '.join(map(str, numbers))} ({phase} {cell.name} {candidate} {rule}; "
                         f"{'; '.join(differ) or 'the same key'})")
    return found


def one_row_per_run(rows: list[dict[str, str]]) -> None:
    """Refuse rows giving one run twice (a stale run beside its rerun, other threads or code): a table of them
    would keep whichever came last, and the protocol decides on one run per cell."""
    found = duplicate_runs(rows)
    if found:
        raise BenchmarkError(f"{len(found)} run(s) given by more than one row, e.g. {'; '.join(found[:3])}: keep one "
                             "row per run (remove the rows of the other key, or rerun with --workdir to replace them)")

Table = dict[str, dict[str, dict[Cell, float]]]  # regime -> candidate -> cell -> value


def table(rows: list[dict[str, str]], phases: tuple[str, ...], metric: str, rule: str = RANKED_RULE) -> Table:
    """``regime -> candidate -> cell -> metric`` (points for accuracies, seconds for costs) of ``phases`` under
    ``rule``."""
    out: Table = {}
    scale = 1.0 if metric.endswith("seconds") else 100.0
    for row in rows:
        if row["phase"] in phases and row["rule"] == rule:
            out.setdefault(row["regime"], {}).setdefault(row["candidate"], {})[cell_of(row)] = scale * float(row[metric])
    return out


def differences(per_cell: dict[str, dict[Cell, float]], a: str, b: str) -> list[float]:
    """``a - b`` on every cell both have: one difference per cell."""
    shared = sorted(set(per_cell.get(a, {})) & set(per_cell.get(b, {})))
    return [per_cell[a][c] - per_cell[b][c] for c in shared]


def mean_of(per_cell: dict[str, dict[Cell, float]], name: str) -> float:
    found = per_cell.get(name, {})
    return statistics.fmean(found.values()) if found else math.nan


def cost_ratios(cpu: Table, name: str) -> dict[str, float]:
    """Per regime: the candidate's stage-2 CPU seconds summed over the cells it shares with FairKL, over FairKL's."""
    ratios = {}
    for regime, per_cell in cpu.items():
        shared = set(per_cell.get(name, {})) & set(per_cell.get(FAIRKL, {}))
        if shared:
            ratios[regime] = sum(per_cell[name][c] for c in shared) / sum(per_cell[FAIRKL][c] for c in shared)
    return ratios


def eligible(cpu: Table, name: str) -> bool:
    """At most :data:`COST_BUDGET` times FairKL's summed CPU seconds in every regime it ran in."""
    ratios = cost_ratios(cpu, name)
    return bool(ratios) and all(r <= COST_BUDGET for r in ratios.values())


def complete(per_regime: Table, name: str, chosen: list[Cell]) -> bool:
    """Whether ``name`` has a number on every cell of ``chosen``."""
    have = {cell for per_cell in per_regime.values() for cell in per_cell.get(name, {})}
    return set(chosen) <= have


def pooled_mean(per_regime: Table, name: str) -> float:
    """The mean of the regimes' means (each regime weighted equally)."""
    means = [mean_of(per_cell, name) for per_cell in per_regime.values()]
    return statistics.fmean(means) if means and not any(math.isnan(m) for m in means) else math.nan


def carried(rows: list[dict[str, str]], all_candidates: dict[str, Candidate]) -> list[str]:
    """Step 2: the top :data:`CARRY_TOP` eligible candidates pooled over the regimes, each regime's best eligible one,
    then the references (the previous default, the best eligible CNC on predictions, the best eligible q3m16 on
    clusters, FairKL). Reads the screen's validation numbers and costs only."""
    val_u = table(rows, ("screen",), "val_unbiased")
    cpu = table(rows, ("screen",), "cpu_seconds")
    ready = [n for n in all_candidates if complete(val_u, n, SCREEN_CELLS)]
    contenders = sorted((n for n in ready if eligible(cpu, n)), key=lambda n: (-pooled_mean(val_u, n), n))
    if not contenders:
        return []
    chosen = contenders[:CARRY_TOP]
    for regime in REGIMES:
        chosen.append(max(contenders, key=lambda n: (mean_of(val_u.get(regime, {}), n), n)))
    cnc = [n for n in contenders if all_candidates[n].schedule]
    pred = next((n for n in cnc if all_candidates[n].group_source == "pred"), None)
    q3m16 = next((n for n in cnc if all_candidates[n].schedule == "q3m16" and all_candidates[n].group_source == "cluster"),
                 None)
    references = [n for n in (PREVIOUS, pred, q3m16, FAIRKL) if n is not None and n in ready]
    return list(dict.fromkeys(chosen + references))


@dataclass(frozen=True)
class Sizing:
    sd: float
    detect: int | None  # cells to detect DETECT points at 80 % power
    equivalence: int | None  # cells for TOST within ±MARGIN at 80 % power (true difference 0)
    cells: int  # what the confirmation runs: the larger, between FLOOR and CAP


def pooled_sd(per_cell: dict[str, dict[Cell, float]], names: list[str]) -> float:
    """sqrt of the mean over the pairs of ``names`` of the variance of their per-cell differences."""
    variances = []
    for a, b in itertools.combinations(names, 2):
        found = paired(differences(per_cell, a, b))
        if not math.isnan(found.sd):
            variances.append(found.sd ** 2)
    return math.sqrt(statistics.fmean(variances)) if variances else math.nan


def sizes(rows: list[dict[str, str]], names: list[str]) -> dict[str, Sizing]:
    """Step 3: each regime's confirmation cells from the screen's pooled paired sd of the carried candidates."""
    val_u = table(rows, ("screen",), "val_unbiased")
    out = {}
    for regime in REGIMES:
        sd = pooled_sd(val_u.get(regime, {}), names)
        detect, equivalence = seeds_needed(sd, delta=DETECT), seeds_needed(sd, margin=MARGIN)
        wanted = max((n for n in (detect, equivalence) if n is not None), default=CAP[regime])
        if detect is None or equivalence is None:
            wanted = CAP[regime]
        out[regime] = Sizing(sd, detect, equivalence, min(CAP[regime], max(FLOOR[regime], wanted)))
    return out


@dataclass
class Decision:
    contenders: list[str]
    winners: dict[str, str]
    holds: dict[str, dict[str, str]]  # candidate -> regime -> "winner" | "equivalent (p ...)" | "" (not held)
    worse: dict[str, list[str]]  # candidate -> "regime: metric below other" (shown worse)
    cost: dict[str, float]  # summed confirmation CPU seconds
    default: str
    held_everywhere: bool
    notes: list[str] = field(default_factory=list)


def decide(val_u: Table, val_w: Table, cpu: Table, names: list[str]) -> Decision:
    """Step 4 on the confirmation's validation numbers (``val_u``, ``val_w``: regime -> candidate -> cell, points) and
    CPU seconds only: the per-regime winners, what each contender holds, and the default (see :data:`PROTOCOL`)."""
    regimes = [r for r in REGIMES if r in val_u]
    contenders = [n for n in names if eligible(cpu, n) and all(val_u[r].get(n) for r in regimes)]
    if not contenders or not regimes:
        return Decision(contenders, {}, {}, {}, {}, "", False, ["no contender has every regime's cells yet"])
    winners = {r: max(contenders, key=lambda n: (mean_of(val_u[r], n), n)) for r in regimes}
    holds: dict[str, dict[str, str]] = {}
    worse: dict[str, list[str]] = {}
    for name in contenders:
        holds[name], worse[name] = {}, []
        for regime in regimes:
            below = [f"{regime}: {metric} below {other}" for other in names if other != name
                     for metric, per_cell in (("unbiased", val_u[regime]), ("worst-group", val_w.get(regime, {})))
                     if (shown := paired(differences(per_cell, name, other))).excludes_zero and shown.high < 0]
            worse[name] += below
            if below:
                holds[name][regime] = ""
            elif name == winners[regime]:
                holds[name][regime] = "winner"
            else:
                p_value = tost(differences(val_u[regime], name, winners[regime]), MARGIN)
                holds[name][regime] = f"equivalent (p {p_value:.3f})" if p_value < 0.05 else ""
    cost = {n: sum(sum(per_cell.get(n, {}).values()) for per_cell in cpu.values()) for n in contenders}
    qualifying = [n for n in contenders if all(holds[n][r] for r in regimes)]
    if qualifying:
        default = min(qualifying, key=lambda n: (cost[n], n))
        return Decision(contenders, winners, holds, worse, cost, default, True)
    fallback = [n for n in contenders if holds[n].get("digits")] or contenders
    default = max(fallback, key=lambda n: (sum(bool(holds[n][r]) for r in regimes), pooled_mean(val_u, n), n))
    missing = [r for r in regimes if not holds[default][r]]
    note = (f"no candidate holds every regime; {default} holds the bundled digits and the most others (not: "
            f"{', '.join(missing)})")
    return Decision(contenders, winners, holds, worse, cost, default, False, [note])


def validation_only(rows: list[dict[str, str]], phase: str) -> tuple[Table, Table, Table]:
    """The confirmation's inputs to :func:`decide`: validation unbiased, validation worst-group, CPU seconds. The
    rows passed on carry no test column, so nothing downstream can read one."""
    blind = [{k: v for k, v in row.items() if k not in TEST_FIELDS} for row in rows if row["phase"] == phase]
    return (table(blind, (phase,), "val_unbiased"), table(blind, (phase,), "val_worst"),
            table(blind, (phase,), "cpu_seconds"))


def validation_cell(regime: str, seed: int) -> Cell:
    """A validation cell of ``regime`` (the bundled digits, or half A of mnist10k with the papers' palette)."""
    return digits_cell(seed) if regime == "digits" else Cell("mnist10k-A", regime, "paper", seed)


@dataclass(frozen=True)
class Extension:
    regime: str
    default: str
    rival: str  # the regime's winner on the confirmation
    sd: float  # the two's paired sd of validation unbiased accuracy over the confirmation cells (points)
    cells: int
    others: tuple[str, ...] = ()  # step 8, report only: carried candidates ahead of the default on the confirmation

    def chosen(self) -> list[Cell]:
        return [validation_cell(self.regime, EXTENSION_SEED + i) for i in range(self.cells)]


def extension_plan(decision: Decision, val_u: Table) -> list[Extension]:
    """Step 7's runs: each regime the default neither wins nor is shown equivalent in, while shown worse than no one
    there; cells for TOST within ±MARGIN at 80 % power from the confirmation's paired sd, at most EXTENSION_CAP."""
    plan = []
    default = decision.default
    for regime, winner in decision.winners.items():
        shown_worse = any(w.startswith(f"{regime}:") for w in decision.worse.get(default, []))
        if not default or decision.holds[default][regime] or shown_worse:
            continue
        sd = paired(differences(val_u[regime], default, winner)).sd
        wanted = seeds_needed(sd, margin=MARGIN)
        ahead = tuple(n for n in decision.contenders if n not in (default, winner)
                      and mean_of(val_u[regime], n) > mean_of(val_u[regime], default))
        plan.append(Extension(regime, default, winner, sd, min(EXTENSION_CAP, wanted or EXTENSION_CAP), ahead))
    return plan


@dataclass(frozen=True)
class Verdict:
    unbiased: Paired  # default - rival, validation unbiased, one difference per extension cell
    worst: Paired  # the same for validation worst-group accuracy
    p_equivalent: float  # TOST within ±MARGIN
    holds: str  # "winner" | "equivalent (p ...)" | "" (not held)
    shown_worse: list[str]


def decide_extension(val_u: Table, val_w: Table, extension: Extension) -> Verdict:
    """Step 7's verdict on the extension's validation numbers only (``val_u``, ``val_w`` from
    :func:`validation_only` of the extension's rows): step 4's rule for the default and the regime's winner."""
    per_u, per_w = val_u.get(extension.regime, {}), val_w.get(extension.regime, {})
    du = paired(differences(per_u, extension.default, extension.rival))
    dw = paired(differences(per_w, extension.default, extension.rival))
    p_value = tost(differences(per_u, extension.default, extension.rival), MARGIN)
    worse = [metric for metric, found in (("unbiased", du), ("worst-group", dw))
             if found.excludes_zero and found.high < 0]
    if du.n < extension.cells or worse:
        held = ""
    elif du.mean >= 0:
        held = "winner"
    else:
        held = f"equivalent (p {p_value:.3f})" if p_value < 0.05 else ""
    return Verdict(du, dw, p_value, held, worse)
