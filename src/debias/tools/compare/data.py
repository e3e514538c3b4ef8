"""``debias compare``'s data: which experiments, their table, and the same grouped by every differing param but the
seed (mean ± sample standard deviation over the seeds, ranked, with a Welch t-test of each group against the best)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from debias.core.errors import NEEDS_BIAS_LABELS
from debias.core.headline import LABELS
from debias.report.collect import Experiment
from debias.report.columns import METRIC_KEYS, METRICS, Metric, param_text  # noqa: F401  (compare's columns)

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
           last: int | None = None) -> list[Experiment]:
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
    chosen = dedupe(chosen)
    if last is not None:
        chosen = sorted(chosen, key=lambda e: e.timestamp or "")[-last:] if last > 0 else []
    return chosen


KIND_PREFERENCE = {"experiment": 0, "mlflow": 1, "baseline": 2, "workspace": 3}


def dedupe(experiments: list[Experiment]) -> list[Experiment]:
    """One of each run: the same params and the same value of every headline metric both have (a file written
    by a newer version may add keys) is the same run; a named experiment is kept before the baseline commit
    before the workspace."""
    kept: list[Experiment] = []
    for experiment in sorted(experiments, key=lambda e: KIND_PREFERENCE.get(e.kind, 9)):
        params = {k: param_text(v) for k, v in experiment.params.items()}
        if not any(params == {k: param_text(v) for k, v in other.params.items()}
                   and all(experiment.metrics[k] == other.metrics[k] for k in set(experiment.metrics) & set(other.metrics))
                   for other in kept):
            kept.append(experiment)
    order = {id(e): i for i, e in enumerate(experiments)}
    return sorted(kept, key=lambda e: order[id(e)])


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


def differences(frame: pd.DataFrame, groups: pd.DataFrame, group_params: list[str]) -> list[dict[str, Any]]:
    """Each ranked group against the best one on the rank metric: difference of means (points), Welch's p-value and
    ``n``, the seeds of each that have the rank metric. A group without the rank metric is not ranked: no difference,
    no test."""
    rank = rank_metric(frame)
    groups = groups.iloc[:ranked_count(frame, groups)]
    if rank is None or len(groups) < 2:
        return []
    frame = numeric(frame)

    def members(row: pd.Series) -> list[float]:
        """The group's values of the rank metric, one per seed that has it (a seed without it is not counted)."""
        mask = pd.Series(True, index=frame.index)
        for key in group_params:
            mask &= frame[key] == row[key]
        return frame.loc[mask, rank].dropna().tolist()

    best = groups.iloc[0]
    best_values = members(best)
    out = []
    for _, row in groups.iloc[1:].iterrows():
        values = members(row)
        out.append({"group": group_label(row, group_params), "metric": rank,
                    "difference": 100 * (row[f"{rank}_mean"] - best[f"{rank}_mean"]),
                    "p": welch(best_values, values), "n": (len(best_values), len(values))})
    return out


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
    others = [e for e in (all_experiments or []) if not comparable(e)]
    return Comparison(experiments, params, group_params, frame, groups, differences(frame, groups, group_params),
                      others, source, filters, notes, ranked)
