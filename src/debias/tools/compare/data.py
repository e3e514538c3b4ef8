"""``debias compare``'s data: which experiments, their table, and the same grouped by every differing param but the
seed (mean ± sample standard deviation over the seeds, ranked, with a Welch t-test of each group against the best),
and each group's difference from the best paired by seed, on worst-group and unbiased accuracy: its interval, its
verdict, the smallest difference these seeds could detect and the seeds that would decide it
(:mod:`debias.metrics.paired`)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from debias.core.environment import KEY as ENVIRONMENT_KEY
from debias.core.environment import environment_differences
from debias.core.errors import NEEDS_BIAS_LABELS
from debias.core.headline import DETAILED, LABELS, percent_text
from debias.metrics.paired import (ALPHA, MIN_VERDICT_PAIRS, Paired, detectable_difference, paired, seeds_needed,
                                   tost, welch)
from debias.report.card import image_step
from debias.tools.compare.collect import GROUP_FILES, Experiment
from debias.tools.compare.columns import (  # noqa: F401  (compare's columns)
    METRIC_KEYS, METRICS, Metric, param_key, param_text, same_param)

SEED = "seed"
RANK_METRIC = "s2_worst"  # groups are ranked by it (ERM's worst-group when no stage 2 ran)






def parse_filter(text: str) -> tuple[str, str]:
    """``key=value`` (value in YAML: ``0.25``, ``[0.1, 1]``, ``cnc``) as ``(key, value as param_text)``."""
    import yaml

    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"--param {text!r}: expected key=value, e.g. loss.epsilon=0.25")
    return key.strip(), param_text(yaml.safe_load(value))


def comparable(experiment: Experiment) -> bool:
    """Finished, with at least one of the compared test metrics (:data:`METRIC_KEYS`); a run with only the data's
    or the groups' numbers, or none, has nothing to rank."""
    return experiment.status == "done" and any(key in experiment.metrics for key in METRIC_KEYS)


def missing_reason(experiment: Experiment) -> str:
    """Why ``experiment`` is not compared, and the command that fixes it, in words."""
    if experiment.status in ("queued", "running", "failed"):
        return experiment.status + (f" ({experiment.reason})" if experiment.reason else "")
    reason = experiment.reason or (
        f"no ERM or stage-2 test metrics (only {', '.join(sorted(experiment.metrics))})" if experiment.metrics
        else "no metrics")
    return reason + (f"; run `{experiment.fix}`" if experiment.fix else "")


def check_filter_keys(experiments: list[Experiment], param_filters: Iterable[str]) -> None:
    """Raise a ValueError naming each ``--param`` key that none of ``experiments`` has, with the closest key they
    have (difflib); nothing when ``experiments`` is empty."""
    import difflib

    known = sorted({key for experiment in experiments for key in experiment.params})
    if not known:
        return
    problems = []
    for text in param_filters:
        key, _ = parse_filter(text)
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
            problems.append(f"--param {text}: no experiment has the param '{key}'"
                            + (f"; did you mean '{close[0]}'?" if close else f"; their params: {', '.join(known)}"))
    if problems:
        raise ValueError("; ".join(problems))


def select(experiments: list[Experiment], method: str | None = None, param_filters: Iterable[str] = (),
           last: int | None = None, keep_duplicates: bool = False) -> list[Experiment]:
    """The finished experiments with comparable results (:func:`comparable`) whose ``stage2.method`` is ``method``
    and whose params equal every ``key=value``; of those the ``last`` most recent. Duplicates (the same params and
    metrics, e.g. the workspace holding the last experiment's results) are kept once, under the experiment's name."""
    wanted = [parse_filter(f) for f in param_filters]
    chosen = []
    for experiment in experiments:
        if not comparable(experiment):  # a running experiment shows its baseline's metrics
            continue
        if method is not None and param_text(experiment.params.get("stage2.method")) != method:
            continue
        if any(not same_param(experiment.params.get(key), value) for key, value in wanted):
            continue
        chosen.append(experiment)
    chosen = chosen if keep_duplicates else dedupe(chosen)
    if last is not None:
        chosen = sorted(chosen, key=lambda e: e.timestamp or "")[-last:] if last > 0 else []
    return chosen


KIND_PREFERENCE = {"experiment": 0, "mlflow": 1, "baseline": 2, "workspace": 3}


def params_key(experiment: Experiment) -> tuple[tuple[str, str], ...]:
    """The experiment's params as DVC compares them (:func:`param_key` of each value), hashable: two runs have the
    same params exactly when their keys are equal."""
    return tuple(sorted((k, param_key(v)) for k, v in experiment.params.items()))


def duplicates(experiments: list[Experiment]) -> list[tuple[Experiment, Experiment]]:
    """``(left out, kept)`` for each run that is another's again: the same params and the same value of every
    headline metric both have (a file written by a newer version may add keys; at least one shared, and neither
    run's results blanked as stale: a workspace whose params.yaml was restored while its outputs are another run's
    is no one's twin); a named experiment is kept before the baseline commit before the workspace. Each run is held
    against the kept runs of its own params only (linear in the runs, not quadratic)."""
    kept: dict[tuple, list[Experiment]] = {}  # params key -> the runs kept with those params, in order
    dropped: list[tuple[Experiment, Experiment]] = []
    for experiment in sorted(experiments, key=lambda e: KIND_PREFERENCE.get(e.kind, 9)):

        def same_run(other: Experiment) -> bool:
            shared = set(experiment.metrics) & set(other.metrics)  # none shared (a stale run's blanked): no claim
            return (bool(shared) and not experiment.stale and not other.stale
                    and all(experiment.metrics[k] == other.metrics[k] for k in shared))

        siblings = kept.setdefault(params_key(experiment), [])
        twin = next((other for other in siblings if same_run(other)), None)
        if twin is None:
            siblings.append(experiment)
        else:
            dropped.append((experiment, twin))
    return dropped


def dedupe(experiments: list[Experiment]) -> list[Experiment]:
    """One of each run (:func:`duplicates` left out), in the given order."""
    gone = {id(e) for e, _ in duplicates(experiments)}
    return [e for e in experiments if id(e) not in gone]


def duplicate_notes(experiments: list[Experiment], method: str | None = None, param_filters: Iterable[str] = ()) -> list[str]:
    """One note per run :func:`select` leaves out as another's duplicate (e.g. the workspace holding the last
    experiment's results), naming the run kept."""
    candidates = select(experiments, method, param_filters, None, keep_duplicates=True)
    return [f"{gone.name} holds the same params and results as {twin.name}: shown once, as {twin.name}"
            for gone, twin in duplicates(candidates)]


def twin_note(experiment: Experiment, twin: Experiment) -> str:
    """Why ``experiment``, with ``twin``'s params (seed included), is not counted as another seed: "other results"
    only where a number both have differs; else the numbers one of them has left out (stale, or a metrics file that
    does not match dvc.lock), each with its reason."""
    shared = set(experiment.metrics) & set(twin.metrics)
    start = f"{experiment.name} has the same params as {twin.name} (seed included)"
    end = f"not counted as another seed ({twin.name}'s results are used)"
    if any(experiment.metrics[k] != twin.metrics[k] for k in shared):
        return f"{start} but other results: {end}"
    why = "; ".join(f"{e.name}: {e.reason}" for e in (experiment, twin) if e.reason) or "no number both have"
    return f"{start} and the same results where both have a number (numbers left out: {why}): {end}"


def same_params(experiments: list[Experiment]) -> tuple[list[Experiment], list[str]]:
    """One experiment per set of params: another with every param equal (the workspace holding the baseline's params,
    a rerun) is the same seed again, not another one, so it is left out of the grouped mean ± std, with a note. A
    named experiment is kept before the baseline commit before the workspace, then the newest."""
    kept: dict[tuple, Experiment] = {}  # params key -> the run kept with those params
    notes: list[str] = []
    ordered = sorted(experiments, key=lambda e: (KIND_PREFERENCE.get(e.kind, 9), "~" if not e.timestamp else "",
                                                  [-ord(c) for c in (e.timestamp or "")]))
    for experiment in ordered:
        twin = kept.setdefault(params_key(experiment), experiment)
        if twin is not experiment:
            notes.append(twin_note(experiment, twin))
    order = {id(e): i for i, e in enumerate(experiments)}
    return sorted(kept.values(), key=lambda e: order[id(e)]), notes


def rejected_notes(experiments: list[Experiment]) -> list[str]:
    """One note per experiment whose headline values include one that is not a number: left out of the means."""
    notes = []
    for experiment in experiments:
        shown = [f"{LABELS.get(k, k)} = {v}" for k, v in experiment.rejected.items() if k in METRIC_KEYS]
        if shown:
            notes.append(f"{experiment.name}: {', '.join(shown)} is not a number: left out of its group's mean ± std "
                         "(the seed count includes it)")
    return notes


TRAINING_FILES = {"ERM": DETAILED["train_erm"], "stage 2": DETAILED["train_contrastive"]}


def environment_notes(experiments: list[Experiment]) -> list[str]:
    """A warning per training stage whose experiments were trained under other threads, processes, device or torch
    build (the ``environment`` of their metrics files): their numbers differ by that too, not by the params alone."""
    notes = []
    for label, path in TRAINING_FILES.items():
        runs = {e.name: None if path in e.blanked else (e.read_json(path) or {}).get(ENVIRONMENT_KEY)
                for e in experiments}
        lines = environment_differences(runs)
        if lines:
            notes.append(f"WARNING the experiments' {label} models were trained under different settings that change "
                         f"numbers: {'; '.join(lines)}")
    return notes


def _typed(value: Any) -> Any:
    """A param as DVC (typed) or MLflow (text) gives it, typed: ``'0.25'`` -> 0.25, ``'[1, 2]'`` -> [1, 2]."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value


def unread_notes(experiments: list[Experiment], keys: list[str]) -> list[str]:
    """A warning per param of ``keys`` that differs between the experiments but that none of them reads
    (``loss.epsilon`` between CNC runs): their differences cannot come from it. Experiments whose params the
    schema refuses (another version's) are not judged."""
    from debias.core.errors import ParamsError
    from debias.core.trees import unflatten
    from debias.schema import validate
    from debias.schema.applicability import RunContext, unread

    contexts = []
    for experiment in experiments:
        try:
            contexts.append(RunContext(validate(unflatten({k: _typed(v) for k, v in experiment.params.items()}))))
        except ParamsError:
            return []
    notes = []
    for key in keys:
        reasons = [unread(key, context) for context in contexts]
        if contexts and all(reasons):
            notes.append(f"WARNING unread-param: {key} differs between the experiments, but none of them reads it "
                         f"({reasons[0]}): their differences do not come from it")
    return notes


def varying_params(experiments: list[Experiment]) -> list[str]:
    """The params whose value is not the same in every experiment, in params.yaml order (``seed`` first)."""
    keys: list[str] = []
    for experiment in experiments:
        keys += [k for k in experiment.params if k not in keys]
    varying = [k for k in keys if len({param_key(e.params.get(k, "—")) for e in experiments}) > 1]
    return sorted(varying, key=lambda k: (k != SEED, keys.index(k)))


def experiments_frame(experiments: list[Experiment], params: list[str]) -> pd.DataFrame:
    """One row per experiment: name, the varying params (as text), the headline metrics, the warning count, and the
    test images of the worst group behind each worst-group metric (:func:`worst_group_size`, NaN where unknown)."""
    sizes = [worst_n_column(metric) for metric in WORST_GROUP_FILES]
    shown: dict[tuple[str, str], str] = {}  # one text per value as DVC compares it: 0 and 0.0 are one group
    for experiment in experiments:
        for key in params:
            value = experiment.params.get(key, "—")
            shown.setdefault((key, param_key(value)), param_text(value))
    rows = []
    for experiment in experiments:
        row: dict[str, Any] = {"experiment": experiment.name}
        row.update({key: shown[key, param_key(experiment.params.get(key, "—"))] for key in params})
        row.update({key: experiment.metrics.get(key, math.nan) for key in METRIC_KEYS})
        row["warnings"] = sum(len(m) for m in experiment.warnings.values())
        for metric in WORST_GROUP_FILES:
            found = worst_group_size(experiment, metric) if metric in experiment.metrics else None
            row[worst_n_column(metric)] = math.nan if found is None else found
        rows.append(row)
    return pd.DataFrame(rows, columns=["experiment", *params, *METRIC_KEYS, "warnings", *sizes])


def numeric(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with each metric column as numbers: the needs-bias-labels marker (data without bias labels) is
    NaN here, for means, ranks and tests; the tables show the marker from the frame itself."""
    return frame.assign(**{k: pd.to_numeric(frame[k], errors="coerce") for k in METRIC_KEYS if k in frame})


def groups_frame(frame: pd.DataFrame, group_params: list[str]) -> pd.DataFrame:
    """Rows grouped by ``group_params`` (every varying param but the seed): per metric the mean and the sample
    standard deviation (NaN for one seed), ``seeds`` (how many experiments), the experiments' names and the
    warnings summed; ranked by :data:`RANK_METRIC` (best first). A metric every experiment of a group lacks for
    want of bias labels has the marker as its mean."""
    keys = group_params or ["_all"]
    data = frame.assign(_all="all") if not group_params else frame
    grouped = numeric(data).groupby(keys, sort=False, dropna=False)
    metrics = [k for k in METRIC_KEYS if k in frame]
    out = grouped[metrics].agg(["mean", "std"])
    out.columns = [f"{metric}_{stat}" for metric, stat in out.columns]
    unlabelled = data.groupby(keys, sort=False, dropna=False)[metrics].agg(
        lambda values: bool(len(values)) and all(v == NEEDS_BIAS_LABELS for v in values))
    for metric in metrics:
        marked = unlabelled[metric].astype(bool)
        if marked.any():
            out[f"{metric}_mean"] = out[f"{metric}_mean"].astype(object).where(~marked, NEEDS_BIAS_LABELS)
    out["seeds"] = grouped.size()
    out["experiments"] = grouped["experiment"].agg(lambda names: ", ".join(names))
    out["warnings"] = grouped["warnings"].sum()
    out = out.reset_index()
    rank = rank_metric(frame)
    if rank is not None:
        out = out.sort_values(f"{rank}_mean", ascending=False, na_position="last", kind="stable",
                              key=lambda column: pd.to_numeric(column, errors="coerce")).reset_index(drop=True)
    return out.drop(columns=["_all"], errors="ignore")


RANK_ORDER = (RANK_METRIC, "s2_unbiased", "s2_avg", "erm_worst", "erm_unbiased", "erm_avg")


def rank_metric(frame: pd.DataFrame) -> str | None:
    """The metric groups are ranked by: stage-2 worst-group accuracy, unless it is the same everywhere (e.g. 0
    in every experiment) or missing; then stage-2 unbiased, average, then ERM's."""
    frame = numeric(frame)
    present = [key for key in RANK_ORDER if key in frame and frame[key].notna().any()]
    varying = [key for key in present if frame[key].nunique(dropna=True) > 1]
    return (varying or present or [None])[0]


def ranked_count(frame: pd.DataFrame, groups: pd.DataFrame) -> int:
    """How many groups (the first ones: :func:`groups_frame` puts the others last) have a value of the rank metric;
    only those are ranked, headlined and tested."""
    rank = rank_metric(frame)
    return 0 if rank is None else int(pd.to_numeric(groups[f"{rank}_mean"], errors="coerce").notna().sum())


# Params that define the data: groups that differ in one of them are never ranked together (their accuracies are on
# different test sets).
DATA_PREFIXES = ("data.", "bias.")


def valid_pairs(pairs: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The seed-matched pairs where both numbers exist (a NaN on either side drops the pair)."""
    return [(a, b) for a, b in pairs if not (math.isnan(a) or math.isnan(b))]


ZERO_WIDTH = 1e-9  # points: an interval narrower is equal differences up to float rounding (0.3 - 0.5 vs 0.4 - 0.6)
MIN_EVIDENCE_PAIRS = MIN_VERDICT_PAIRS  # a quality claim rests on >= 3 seeds (debias.report.card.QUALITY_SEEDS)
DECIDE_POINTS = 2.0  # ours: without --margin, the seeds that would decide ±2 points stand beside every verdict
STEP_SHOWN = 5.0  # points: a worst group one of whose test images moves it by more is named, with that step
# The per-group file of the model each worst-group metric is of (its worst group's test images give its step).
WORST_GROUP_FILES = {"erm_worst": GROUP_FILES["erm"], "s2_worst": GROUP_FILES["stage2"]}


def worst_n_column(metric: str) -> str:
    """The frame's column of the worst group's test images behind ``metric`` (``s2_worst`` -> ``s2_worst_n``)."""
    return f"{metric}_n"


def worst_group_size(experiment: Experiment, metric: str) -> int | None:
    """The test images of the worst (class y, attribute a) group behind ``metric`` (the page's worst group:
    :func:`debias.metrics.worst_group_of` of the test table of :data:`WORST_GROUP_FILES`); None without the file or
    bias labels."""
    from debias.metrics import group_accuracies, worst_group_of

    table = (experiment.read_json(WORST_GROUP_FILES[metric]) or {}).get("test") or {}
    per_group, counts = table.get("per_group"), table.get("group_counts")
    if not isinstance(per_group, list) or not isinstance(counts, list):  # a str: data without bias labels
        return None
    worst = worst_group_of(group_accuracies(per_group, counts, 0.95))  # the level does not change which is worst
    return None if worst is None else worst.n


def verdict(found: Paired, margin: float | None = None, tost_p: float = math.nan) -> str:
    """The verdict on paired differences ``found`` (points). ``unpaired`` with fewer than 2; ``too few seeds``
    with fewer than :data:`MIN_EVIDENCE_PAIRS`. Without ``margin``: ``evidence`` when the interval has a width and
    excludes 0, else ``not distinguishable`` (an interval without width is equal differences of quantised
    accuracies: no evidence). With ``margin``: ``within`` when both one-sided tests at ±margin pass (``tost_p`` below
    :data:`~debias.metrics.paired.ALPHA`, from differences with a spread), else ``differs`` when the interval
    excludes 0, else ``undecided``."""
    if found.n < 2:
        return "unpaired"
    if found.n < MIN_EVIDENCE_PAIRS:
        return "too few seeds"
    if margin is None:
        return "evidence" if found.excludes_zero else "not distinguishable"
    if found.high - found.low > ZERO_WIDTH and tost_p < ALPHA:
        return "within"
    return "differs" if found.excludes_zero else "undecided"


@dataclass(frozen=True)
class MetricVerdict:
    """One metric of a group against the top group of its data family: the difference of means, Welch's p and the
    difference paired by seed (this group minus the top one) with its verdict, what these seeds could detect and
    how many would decide ±``decide_points``; every number in points."""

    metric: str
    difference: float  # of the means
    p: float | None  # Welch's two-sided p over the seeds (None with fewer than two on a side)
    n: tuple[int, int]  # seeds with the metric: the top group's, this group's
    paired: Paired  # the seed-matched differences, 95 % t-interval
    verdict: str  # :func:`verdict`
    margin: float | None  # --margin (points): equivalence tested within ±margin
    tost_p: float  # the two one-sided tests' p at ±margin (NaN without a margin)
    detectable: float  # the smallest true difference these seeds detect with 80 % power at alpha 0.05 (NaN: unknown)
    decide_points: float  # --margin, else DECIDE_POINTS
    seeds_within: int | None  # seeds for TOST to show ±decide_points at a true difference of 0 with 80 % power
    seeds_differ: int | None  # seeds for the t-test to detect a difference of decide_points with 80 % power
    worst_n: int | None = None  # the smallest worst group of the runs paired (test images; worst-group metrics only)

    @property
    def pairs(self) -> int:
        return self.paired.n

    @property
    def spread(self) -> bool:
        """The differences vary (an interval with a width): only then do they say what more seeds would do."""
        return self.pairs >= 2 and self.paired.high - self.paired.low > ZERO_WIDTH

    @property
    def shows_difference(self) -> bool:
        """Evidence of a difference: at least :data:`MIN_EVIDENCE_PAIRS` pairs whose interval has a width and excludes 0."""
        return self.pairs >= MIN_EVIDENCE_PAIRS and self.paired.excludes_zero

    @property
    def seeds_to_decide(self) -> tuple[int | None, str]:
        """The seeds that decide ±decide_points whichever holds (the larger of :attr:`seeds_within` and
        :attr:`seeds_differ`; None: more than :data:`~debias.metrics.paired.MAX_SEEDS`) and which of the two it is."""
        if self.seeds_within is None or self.seeds_differ is None:
            return None, "within" if self.seeds_within is None else "differ"
        return (self.seeds_within, "within") if self.seeds_within >= self.seeds_differ else (self.seeds_differ, "differ")

    @property
    def step(self) -> float | None:
        """What one test image moves the worst group by (points): 100 / its test images; None where unknown."""
        return None if not self.worst_n else image_step(self.worst_n)


def metric_verdict(metric: str, top: pd.DataFrame, mine: pd.DataFrame, margin: float | None) -> MetricVerdict:
    """``metric`` of the experiments ``mine`` against those of the top group ``top`` (rows of the numeric frame):
    the seed-matched differences in points (:func:`debias.metrics.paired.paired`), the verdict, the detectable
    difference and the seeds that would decide ±margin (±:data:`DECIDE_POINTS` without one)."""
    pairs: list[tuple[float, float]] = []
    members = []
    if SEED in top and SEED in mine:
        by_seed = {seed: (float(value), i) for seed, value, i in zip(top[SEED], top[metric], top.index)}
        for seed, value, i in zip(mine[SEED], mine[metric], mine.index):
            if seed in by_seed and valid_pairs([(float(value), by_seed[seed][0])]):
                pairs.append((float(value), by_seed[seed][0]))
                members += [i, by_seed[seed][1]]
    found = paired([100 * (a - b) for a, b in pairs])
    tost_p = tost([100 * (a - b) for a, b in pairs], margin) if margin is not None else math.nan
    decide = margin if margin is not None else DECIDE_POINTS
    sd = found.sd if found.n >= 2 and found.high - found.low > ZERO_WIDTH else math.nan  # no spread: unknown
    sizes = (pd.concat([top, mine])[worst_n_column(metric)].loc[members].dropna()
             if worst_n_column(metric) in top else pd.Series(dtype=float))
    return MetricVerdict(metric, 100 * (mine[metric].mean() - top[metric].mean()),
                         welch(top[metric].tolist(), mine[metric].tolist()),
                         (int(top[metric].notna().sum()), int(mine[metric].notna().sum())), found,
                         verdict(found, margin, tost_p), margin, tost_p, detectable_difference(sd, found.n), decide,
                         seeds_needed(sd, margin=decide), seeds_needed(sd, delta=decide),
                         int(sizes.min()) if len(sizes) else None)


def verdict_metrics(frame: pd.DataFrame, rank: str) -> list[str]:
    """The metrics each group is judged on: the rank metric, then the same model's worst-group and unbiased accuracy
    (a worst group of a few test images is quantised, unbiased accuracy reads every test image), those with a number."""
    prefix = rank.rsplit("_", 1)[0]
    numbers = numeric(frame)
    wanted = dict.fromkeys([rank, f"{prefix}_worst", f"{prefix}_unbiased"])
    return [key for key in wanted if key in numbers and numbers[key].notna().any()]


def data_family(row: pd.Series | dict, group_params: list[str]) -> str:
    """The values of the data-defining params (:data:`DATA_PREFIXES`) among ``group_params``, as text ('' if none
    varies): groups of one family share their data, the only ones ranked against each other."""
    return ", ".join(f"{k}={row[k]}" for k in group_params if k.startswith(DATA_PREFIXES))


@dataclass(frozen=True)
class Difference:
    """A ranked group against the top group of its data family: one :class:`MetricVerdict` per judged metric, the
    rank metric's first."""

    group: str
    best: str
    family: str
    verdicts: tuple[MetricVerdict, ...]

    @property
    def rank(self) -> MetricVerdict:
        return self.verdicts[0]


def differences(frame: pd.DataFrame, groups: pd.DataFrame, group_params: list[str],
                margin: float | None = None) -> list[Difference]:
    """Each ranked group against the top group of its data family (:func:`data_family`), on each metric of
    :func:`verdict_metrics` (:func:`metric_verdict`). A group without the rank metric is not ranked: no difference,
    no test."""
    rank = rank_metric(frame)
    groups = groups.iloc[:ranked_count(frame, groups)]
    if rank is None or len(groups) < 2:
        return []
    frame = numeric(frame)
    metrics = verdict_metrics(frame, rank)

    def members(row: pd.Series) -> pd.DataFrame:
        mask = pd.Series(True, index=frame.index)
        for key in group_params:
            mask &= frame[key] == row[key]
        return frame.loc[mask]

    out = []
    tops: dict[str, pd.Series] = {}
    for _, row in groups.iterrows():
        family = data_family(row, group_params)
        if family not in tops:
            tops[family] = row
            continue
        best = tops[family]
        out.append(Difference(group_label(row, group_params), group_label(best, group_params), family,
                              tuple(metric_verdict(metric, members(best), members(row), margin) for metric in metrics)))
    return out


def evidence_of_best(diffs: list[Difference], family: str = "") -> bool:
    """Whether the top group of ``family`` is shown better than every other group of it on the rank metric (each
    paired interval excludes 0 with the top group ahead): only then is it called "best"."""
    mine = [d for d in diffs if d.family == family]
    return bool(mine) and all(d.rank.shows_difference and d.rank.paired.mean < 0 for d in mine)


def group_label(row: pd.Series | dict, group_params: list[str]) -> str:
    return ", ".join(f"{key}={row[key]}" for key in group_params) or "all experiments"


def fmt(value: float | str, percent: bool, digits: int | None = None) -> str:
    if isinstance(value, str):  # the needs-bias-labels marker
        return value
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return percent_text(value, 1 if digits is None else digits) if percent else f"{value:.{3 if digits is None else digits}f}"


def fmt_mean_std(mean: float | str, std: float, percent: bool, sep: str = "±") -> str:
    if isinstance(mean, str):  # the needs-bias-labels marker
        return mean
    if mean is None or math.isnan(mean):
        return "–"
    text = fmt(mean, percent)
    return text if std is None or math.isnan(std) else f"{text}{sep}{fmt(std, percent)}"


def metric_present(frame: pd.DataFrame, key: str, suffix: str = "") -> bool:
    column = f"{key}{suffix}"
    return column in frame and frame[column].notna().any()


@dataclass
class Comparison:
    """Everything ``debias compare`` shows, computed once."""

    experiments: list[Experiment]
    params: list[str]  # varying params (the seed first when it varies)
    group_params: list[str]  # varying params but the seed
    frame: pd.DataFrame
    groups: pd.DataFrame
    differences: list[Difference]
    without_results: list[Experiment] = field(default_factory=list)
    source: str = "dvc"
    filters: str = ""
    notes: list[str] = field(default_factory=list)  # what was left out of the means, and why
    ranked: int = 0  # the first ``ranked`` groups have the rank metric; the others are listed, never ranked
    margin: float | None = None  # --margin (points): each verdict tests equivalence within ±margin
    other_commits: dict[str, list[str]] = field(default_factory=dict)  # commit -> its experiments, not shown
    sweep: str | None = None  # --sweep NAME: the sweep compared, which more seeds can extend


def build_comparison(experiments: list[Experiment], all_experiments: list[Experiment] | None = None,
                     source: str = "dvc", filters: str = "", margin: float | None = None) -> Comparison:
    experiments, notes = same_params(experiments)
    notes += rejected_notes(experiments)
    params = varying_params(experiments)
    group_params = [k for k in params if k != SEED]
    frame = experiments_frame(experiments, params)
    if group_params and SEED in frame:
        frame = frame.sort_values([*group_params, SEED], kind="stable").reset_index(drop=True)
        order = {name: i for i, name in enumerate(frame["experiment"])}
        experiments = sorted(experiments, key=lambda e: order.get(e.name, 0))
    groups = groups_frame(frame, group_params)
    ranked = ranked_count(frame, groups)
    rank = rank_metric(frame)
    if rank is not None:
        notes += [f"{group_label(row, group_params)} is not ranked: no {LABELS.get(rank, rank)} in its experiments "
                  f"({row['experiments']})" for _, row in groups.iloc[ranked:].iterrows()]
    notes += [f"{e.name}: {missing_reason(e)}" for e in experiments if e.stale]
    notes += environment_notes(experiments)
    notes += unread_notes(experiments, group_params)
    others = [e for e in (all_experiments or []) if not comparable(e)]
    return Comparison(experiments, params, group_params, frame, groups,
                      differences(frame, groups, group_params, margin), others, source, filters, notes, ranked, margin)
