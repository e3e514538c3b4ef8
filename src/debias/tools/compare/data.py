"""``debias compare``'s data: which experiments, their table, and the same grouped by every differing param but the
seed (mean ± sample standard deviation over the seeds, ranked, with a Welch t-test of each group against the best)."""

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
from debias.core.headline import DETAILED, LABELS
from debias.tools.compare.collect import Experiment
from debias.tools.compare.columns import METRIC_KEYS, METRICS, Metric, param_text  # noqa: F401  (compare's columns)

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
        if any(param_text(experiment.params.get(key)) != value for key, value in wanted):
            continue
        chosen.append(experiment)
    chosen = chosen if keep_duplicates else dedupe(chosen)
    if last is not None:
        chosen = sorted(chosen, key=lambda e: e.timestamp or "")[-last:] if last > 0 else []
    return chosen


KIND_PREFERENCE = {"experiment": 0, "mlflow": 1, "baseline": 2, "workspace": 3}


def duplicates(experiments: list[Experiment]) -> list[tuple[Experiment, Experiment]]:
    """``(left out, kept)`` for each run that is another's again: the same params and the same value of every
    headline metric both have (a file written by a newer version may add keys; at least one shared, and neither
    run's results blanked as stale: a workspace whose params.yaml was restored while its outputs are another run's
    is no one's twin); a named experiment is kept before the baseline commit before the workspace."""
    kept: list[Experiment] = []
    dropped: list[tuple[Experiment, Experiment]] = []
    for experiment in sorted(experiments, key=lambda e: KIND_PREFERENCE.get(e.kind, 9)):
        params = {k: param_text(v) for k, v in experiment.params.items()}

        def same_run(other: Experiment) -> bool:
            shared = set(experiment.metrics) & set(other.metrics)  # none shared (a stale run's blanked): no claim
            return (bool(shared) and not experiment.stale and not other.stale
                    and params == {k: param_text(v) for k, v in other.params.items()}
                    and all(experiment.metrics[k] == other.metrics[k] for k in shared))

        twin = next((other for other in kept if same_run(other)), None)
        if twin is None:
            kept.append(experiment)
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


def same_params(experiments: list[Experiment]) -> tuple[list[Experiment], list[str]]:
    """One experiment per set of params: another with every param equal (the workspace holding the baseline's params,
    a rerun) is the same seed again, not another one, so it is left out of the grouped mean ± std, with a note. A
    named experiment is kept before the baseline commit before the workspace, then the newest."""
    kept: list[Experiment] = []
    notes: list[str] = []
    key = lambda e: {k: param_text(v) for k, v in e.params.items()}  # noqa: E731
    ordered = sorted(experiments, key=lambda e: (KIND_PREFERENCE.get(e.kind, 9), "~" if not e.timestamp else "",
                                                  [-ord(c) for c in (e.timestamp or "")]))
    for experiment in ordered:
        twin = next((other for other in kept if key(other) == key(experiment)), None)
        if twin is None:
            kept.append(experiment)
        else:
            notes.append(f"{experiment.name} has the same params as {twin.name} (seed included) but other results: "
                         f"not counted as another seed ({twin.name}'s results are used)")
    order = {id(e): i for i, e in enumerate(experiments)}
    return sorted(kept, key=lambda e: order[id(e)]), notes


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
    varying = [k for k in keys if len({param_text(e.params.get(k, "—")) for e in experiments}) > 1]
    return sorted(varying, key=lambda k: (k != SEED, keys.index(k)))


def experiments_frame(experiments: list[Experiment], params: list[str]) -> pd.DataFrame:
    """One row per experiment: name, the varying params (as text), the headline metrics, the warning count."""
    rows = []
    for experiment in experiments:
        row: dict[str, Any] = {"experiment": experiment.name}
        row.update({key: param_text(experiment.params.get(key, "—")) for key in params})
        row.update({key: experiment.metrics.get(key, math.nan) for key in METRIC_KEYS})
        row["warnings"] = sum(len(m) for m in experiment.warnings.values())
        rows.append(row)
    return pd.DataFrame(rows, columns=["experiment", *params, *METRIC_KEYS, "warnings"])


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


def welch(values_a: list[float], values_b: list[float]) -> float | None:
    """Two-sided Welch t-test p-value of two sets of seeds, None with fewer than two values in either."""
    a = [v for v in values_a if not math.isnan(v)]
    b = [v for v in values_b if not math.isnan(v)]
    if len(a) < 2 or len(b) < 2:
        return None
    from scipy.special import stdtr  # Student's t CDF (scipy.stats takes seconds to import)

    if max(a) == min(a) and max(b) == min(b):
        return 1.0 if a[0] == b[0] else 0.0
    mean_a, mean_b = sum(a) / len(a), sum(b) / len(b)
    var_a = sum((v - mean_a) ** 2 for v in a) / (len(a) - 1) / len(a)
    var_b = sum((v - mean_b) ** 2 for v in b) / (len(b) - 1) / len(b)
    t = (mean_a - mean_b) / math.sqrt(var_a + var_b)
    df = (var_a + var_b) ** 2 / (var_a ** 2 / (len(a) - 1) + var_b ** 2 / (len(b) - 1))  # Welch-Satterthwaite
    return float(2 * stdtr(df, -abs(t)))


def ranked_count(frame: pd.DataFrame, groups: pd.DataFrame) -> int:
    """How many groups (the first ones: :func:`groups_frame` puts the others last) have a value of the rank metric;
    only those are ranked, headlined and tested."""
    rank = rank_metric(frame)
    return 0 if rank is None else int(pd.to_numeric(groups[f"{rank}_mean"], errors="coerce").notna().sum())


T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}
# Params that define the data: groups that differ in one of them are never ranked together (their accuracies are on
# different test sets).
DATA_PREFIXES = ("data.", "bias.")


def valid_pairs(pairs: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The seed-matched pairs where both numbers exist (a NaN on either side drops the pair)."""
    return [(a, b) for a, b in pairs if not (math.isnan(a) or math.isnan(b))]


def paired_interval(pairs: list[tuple[float, float]]) -> tuple[float, float, float] | None:
    """Mean of ``a - b`` over seed-matched pairs with its two-sided 95 % t-interval (Student t, n - 1 degrees of
    freedom); None with fewer than two pairs."""
    diffs = [a - b for a, b in valid_pairs(pairs)]
    if len(diffs) < 2:
        return None
    mean = sum(diffs) / len(diffs)
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1))
    if len(diffs) - 1 in T_975:
        t = T_975[len(diffs) - 1]
    else:
        from scipy.special import stdtrit  # Student's t quantile

        t = float(stdtrit(len(diffs) - 1, 0.975))
    half = t * sd / math.sqrt(len(diffs))
    return mean, mean - half, mean + half


ZERO_WIDTH = 1e-9  # points: an interval narrower is equal differences up to float rounding (0.3 - 0.5 vs 0.4 - 0.6)
MIN_EVIDENCE_PAIRS = 3  # the project's rule: a quality claim rests on >= 3 seeds (debias.report.card.QUALITY_SEEDS)


def verdict(interval: tuple[float, float, float] | None, pairs: int) -> str:
    """``evidence`` when the paired 95 % interval over ``pairs`` seeds (at least :data:`MIN_EVIDENCE_PAIRS`) has a
    width and excludes 0; ``not distinguishable`` when it holds 0, or has no width (every seed differs by the same
    amount: accuracies on a few images are quantised, so two equal differences are no evidence); ``too few seeds``
    with 2; ``unpaired`` with fewer than two seeds in common."""
    if interval is None:
        return "unpaired"
    _, low, high = interval
    if pairs < MIN_EVIDENCE_PAIRS:
        return "too few seeds"
    return "evidence" if high - low > ZERO_WIDTH and (low > 0 or high < 0) else "not distinguishable"


def data_family(row: pd.Series | dict, group_params: list[str]) -> str:
    """The values of the data-defining params (:data:`DATA_PREFIXES`) among ``group_params``, as text ('' if none
    varies): groups of one family share their data, the only ones ranked against each other."""
    return ", ".join(f"{k}={row[k]}" for k in group_params if k.startswith(DATA_PREFIXES))


def differences(frame: pd.DataFrame, groups: pd.DataFrame, group_params: list[str]) -> list[dict[str, Any]]:
    """Each ranked group against the top group of its data family (:func:`data_family`) on the rank metric:
    difference of means (points), Welch's p, and the difference paired by seed (``paired``: mean and 95 %
    interval in points over the seeds both have; ``verdict``: :func:`verdict`). A group without the rank metric is
    not ranked: no difference, no test."""
    rank = rank_metric(frame)
    groups = groups.iloc[:ranked_count(frame, groups)]
    if rank is None or len(groups) < 2:
        return []
    frame = numeric(frame)

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
        mine, theirs = members(row), members(best)
        interval = None
        if SEED in frame:
            by_seed = dict(zip(theirs[SEED], theirs[rank]))
            pairs = valid_pairs([(float(v), float(by_seed[s])) for s, v in zip(mine[SEED], mine[rank]) if s in by_seed])
            found = paired_interval(pairs)
            interval = None if found is None else tuple(100 * x for x in found)
            n_pairs = len(pairs)
        else:
            n_pairs = 0
        out.append({"group": group_label(row, group_params), "best": group_label(best, group_params),
                    "family": family, "metric": rank,
                    "difference": 100 * (row[f"{rank}_mean"] - best[f"{rank}_mean"]),
                    "p": welch(theirs[rank].tolist(), mine[rank].tolist()),
                    "n": (int(theirs[rank].notna().sum()), int(mine[rank].notna().sum())),
                    "paired": interval, "pairs": n_pairs, "verdict": verdict(interval, n_pairs)})
    return out


def evidence_of_best(diffs: list[dict[str, Any]], family: str = "") -> bool:
    """Whether the top group of ``family`` is shown better than every other group of it (each paired interval
    excludes 0 with the top group ahead): only then is it called "best"."""
    mine = [d for d in diffs if d["family"] == family]
    return bool(mine) and all(d["verdict"] == "evidence" and d["paired"][0] < 0 for d in mine)


def group_label(row: pd.Series | dict, group_params: list[str]) -> str:
    return ", ".join(f"{key}={row[key]}" for key in group_params) or "all experiments"


def fmt(value: float | str, percent: bool, digits: int | None = None) -> str:
    if isinstance(value, str):  # the needs-bias-labels marker
        return value
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{100 * value:.{1 if digits is None else digits}f}" if percent else f"{value:.{3 if digits is None else digits}f}"


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
    differences: list[dict[str, Any]]
    without_results: list[Experiment] = field(default_factory=list)
    source: str = "dvc"
    filters: str = ""
    notes: list[str] = field(default_factory=list)  # what was left out of the means, and why
    ranked: int = 0  # the first ``ranked`` groups have the rank metric; the others are listed, never ranked


def build_comparison(experiments: list[Experiment], all_experiments: list[Experiment] | None = None,
                     source: str = "dvc", filters: str = "") -> Comparison:
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
    return Comparison(experiments, params, group_params, frame, groups, differences(frame, groups, group_params),
                      others, source, filters, notes, ranked)
