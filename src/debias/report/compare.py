"""``debias compare``: many experiments on one page, and a terminal table no wider than 160 characters.

One row per experiment (the params that differ between the experiments compared, the headline test metrics
of :mod:`debias.headline`, its warnings), then the same grouped by every differing param but the seed: mean
± sample standard deviation over the seeds and their count, ranked by stage-2 worst-group accuracy, with a
Welch t-test of each group against the best one ("is the difference real?"). The HTML page (self-contained:
inline CSS, figures as data URIs; it opens from disk, offline) adds the per-group accuracy heatmaps and the
validation curves of the runs compared, side by side, and every warning. Tables are pandas data frames;
figures are matplotlib, as the report's.

The experiments come from :mod:`debias.report.collect` (DVC's experiments and/or MLflow's pipeline runs);
this module only selects, groups, renders and writes.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from debias import paths
from debias.headline import LABELS, warning_code
from debias.io import atomic_path
from debias.metrics import GroupAccuracy
from debias.params import ReportParams
from debias.report import card, figures
from debias.report.build import (Block, Figure, Section, Table, Text, card_blocks, render_html, render_markdown,
                                 worst_cell)
from debias.report.collect import CURVE_FILES, GROUP_FILES, Experiment

MAX_WIDTH = 160  # terminal table, characters
MIN_WIDTH = 40  # ours: the narrowest --width accepted (a name column and one metric column)
MAX_FIGURE_RUNS = 8  # runs drawn in the per-group and curve figures
SEED = "seed"
RANK_METRIC = "s2_worst"  # groups are ranked by it (ERM's worst-group when no stage 2 ran)


@dataclass(frozen=True)
class Metric:
    """A headline metric as a column: ``group`` and ``label`` are its two header lines in the terminal."""

    key: str
    group: str
    label: str
    percent: bool = True
    priority: int = 5  # the terminal table drops the lowest first when it is too wide


METRICS: tuple[Metric, ...] = (
    Metric("erm_avg", "ERM", "avg", priority=2), Metric("erm_unbiased", "ERM", "unb", priority=2),
    Metric("erm_worst", "ERM", "wg", priority=6),
    Metric("s2_avg", "stage 2", "avg", priority=9), Metric("s2_unbiased", "stage 2", "unb", priority=9),
    Metric("s2_worst", "stage 2", "wg", priority=10),
    Metric("probe_erm_avg", "ERM probe", "avg", priority=1), Metric("probe_erm_unbiased", "ERM probe", "unb", priority=1),
    Metric("probe_erm_worst", "ERM probe", "wg", priority=3),
    Metric("probe_s2_avg", "S2 probe", "avg", priority=4), Metric("probe_s2_unbiased", "S2 probe", "unb", priority=4),
    Metric("probe_s2_worst", "S2 probe", "wg", priority=8),
    Metric("align_erm", "align", "ERM", percent=False, priority=3), Metric("align_s2", "align", "S2", percent=False, priority=7),
    Metric("mi_a_erm", "Î(A;Z)", "ERM", percent=False, priority=3), Metric("mi_a_s2", "Î(A;Z)", "S2", percent=False, priority=7),
)
METRIC_KEYS = tuple(m.key for m in METRICS)
# The page holds wide tables: a wider column, and cells that do not wrap ("85.4 ± 3.6" stays on one line).
PAGE_STYLE = "main { max-width: 1500px; } td, th { white-space: nowrap; }"
LEGEND = ("test split; accuracies in %: avg = sample-weighted, unb = unbiased (mean over groups), wg = worst-group; "
          "align = alignment loss (CNC Eq. 2-3); Î(A;Z) in nats; ! = warnings (listed in the page)")


# --------------------------------------------------------------------------- selection


def param_text(value: Any) -> str:
    """A param value as text, the same for DVC's (typed) and MLflow's (string) params: ``0.25``, ``cnc``, ``[1, 2]``."""
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            return value
        return value if isinstance(parsed, str) else json.dumps(parsed)
    return "null" if value is None else json.dumps(value)


def parse_filter(text: str) -> tuple[str, str]:
    """``key=value`` (value in YAML: ``0.25``, ``[0.1, 1]``, ``cnc``) as ``(key, value as param_text)``."""
    import yaml

    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"--param {text!r}: expected key=value, e.g. loss.epsilon=0.25")
    return key.strip(), param_text(yaml.safe_load(value))


def select(experiments: list[Experiment], method: str | None = None, param_filters: Iterable[str] = (),
           last: int | None = None) -> list[Experiment]:
    """The finished experiments with results whose ``stage2.method`` is ``method`` and whose params equal every
    ``key=value``; of those the ``last`` most recent. Duplicates (the same params and metrics, e.g. the workspace
    holding the last experiment's results) are kept once, under the experiment's name."""
    wanted = [parse_filter(f) for f in param_filters]
    chosen = []
    for experiment in experiments:
        if not experiment.has_results or experiment.status != "done":  # a running experiment shows its baseline's
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


# --------------------------------------------------------------------------- tables


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


def groups_frame(frame: pd.DataFrame, group_params: list[str]) -> pd.DataFrame:
    """Rows grouped by ``group_params`` (every varying param but the seed): per metric the mean and the sample
    standard deviation (NaN for one seed), ``seeds`` (how many experiments), the experiments' names and the
    warnings summed; ranked by :data:`RANK_METRIC` (best first)."""
    keys = group_params or ["_all"]
    data = frame.assign(_all="all") if not group_params else frame
    grouped = data.groupby(keys, sort=False, dropna=False)
    metrics = [k for k in METRIC_KEYS if k in frame]
    out = grouped[metrics].agg(["mean", "std"])
    out.columns = [f"{metric}_{stat}" for metric, stat in out.columns]
    out["seeds"] = grouped.size()
    out["experiments"] = grouped["experiment"].agg(lambda names: ", ".join(names))
    out["warnings"] = grouped["warnings"].sum()
    out = out.reset_index()
    rank = rank_metric(frame)
    if rank is not None:
        out = out.sort_values(f"{rank}_mean", ascending=False, na_position="last", kind="stable").reset_index(drop=True)
    return out.drop(columns=["_all"], errors="ignore")


RANK_ORDER = (RANK_METRIC, "s2_unbiased", "s2_avg", "erm_worst", "erm_unbiased", "erm_avg")


def rank_metric(frame: pd.DataFrame) -> str | None:
    """The metric groups are ranked by: stage-2 worst-group accuracy, unless it is the same everywhere (e.g. 0
    in every experiment) or missing; then stage-2 unbiased, average, then ERM's."""
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


def differences(frame: pd.DataFrame, groups: pd.DataFrame, group_params: list[str]) -> list[dict[str, Any]]:
    """Each group against the best one on the rank metric: difference of means (points) and Welch's p-value."""
    rank = rank_metric(frame)
    if rank is None or len(groups) < 2:
        return []

    def members(row: pd.Series) -> list[float]:
        mask = pd.Series(True, index=frame.index)
        for key in group_params:
            mask &= frame[key] == row[key]
        return frame.loc[mask, rank].tolist()

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


def fmt(value: float, percent: bool, digits: int | None = None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{100 * value:.{1 if digits is None else digits}f}" if percent else f"{value:.{3 if digits is None else digits}f}"


def fmt_mean_std(mean: float, std: float, percent: bool, sep: str = "±") -> str:
    if mean is None or math.isnan(mean):
        return "–"
    text = fmt(mean, percent)
    return text if std is None or math.isnan(std) else f"{text}{sep}{fmt(std, percent)}"


# --------------------------------------------------------------------------- terminal


@dataclass
class TextColumn:
    """A terminal column: two header lines and its cells; text columns are left-aligned and may be shortened."""

    group: str
    label: str
    cells: list[str]
    numeric: bool = True
    priority: int = 100  # dropped lowest first; text columns (name, params) are never dropped
    key: str = ""

    def width(self, limit: int | None = None) -> int:
        natural = max([len(self.label), *map(len, self.cells)] or [1])
        return natural if limit is None or self.numeric else min(natural, limit)


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def _spans(columns: list[TextColumn]) -> list[tuple[int, int]]:
    """``(first, last)`` column index of each run of columns under one group label."""
    spans, i = [], 0
    while i < len(columns):
        j = i
        while j + 1 < len(columns) and columns[i].group and columns[j + 1].group == columns[i].group:
            j += 1
        spans.append((i, j))
        i = j + 1
    return spans


def render_columns(columns: list[TextColumn], text_limit: int | None = None, sep: str = "  ") -> list[str]:
    """Two header lines (a group label centred over its run of columns, then each column's label), then the rows.
    A run of columns is widened (its last column) where its group label is wider than the run."""
    widths = [c.width(text_limit) for c in columns]
    spans = _spans(columns)
    for first, last in spans:
        span = sum(widths[first : last + 1]) + len(sep) * (last - first)
        widths[last] += max(0, len(columns[first].group) - span)
    groups_line = []
    for first, last in spans:
        span = sum(widths[first : last + 1]) + len(sep) * (last - first)
        group = columns[first].group
        groups_line.append(group.ljust(span) if not columns[first].numeric else group.center(span))
    labels_line = [c.label.rjust(w) if c.numeric else _cut(c.label, w).ljust(w) for c, w in zip(columns, widths)]
    lines = [sep.join(groups_line).rstrip(), sep.join(labels_line).rstrip()]
    for r in range(len(columns[0].cells) if columns else 0):
        cells = [(c.cells[r].rjust(w) if c.numeric else _cut(c.cells[r], w).ljust(w)) for c, w in zip(columns, widths)]
        lines.append(sep.join(cells).rstrip())
    return lines


def fit_columns(columns: list[TextColumn], max_width: int = MAX_WIDTH,
                text_width: int = 24) -> tuple[list[str], list[TextColumn]]:
    """Render within ``max_width``: shorten text columns (names, param values) to ``text_width`` characters, then
    drop the lowest-priority metric columns, then shorten text columns down to 10 characters; lines are never
    longer than ``max_width``. Returns the lines and the columns left out."""
    kept = list(columns)
    dropped: list[TextColumn] = []

    def width(limit: int | None) -> int:
        lines = render_columns(kept, limit)
        return max(map(len, lines)) if lines else 0

    limit: int | None = None
    if width(None) > max_width:
        limit = text_width
    while width(limit) > max_width:
        droppable = [c for c in kept if c.numeric and c.priority < 100]
        if not droppable:
            break
        lowest = min(droppable, key=lambda c: c.priority)
        kept.remove(lowest)
        dropped.append(lowest)
    while limit is not None and limit > 10 and width(limit) > max_width:
        limit -= 1
    return [line[:max_width] for line in render_columns(kept, limit)], dropped


def split_constant(columns: list[TextColumn]) -> tuple[list[TextColumn], list[str]]:
    """Metric columns with the same value in every row (two rows or more) leave the table for one line
    (``'ERM avg 23.8'``), as ``dvc exp show --only-changed`` does."""
    if not columns or len(columns[0].cells) < 2:
        return columns, []
    kept, same = [], []
    for column in columns:
        means = {cell.split("±")[0] for cell in column.cells}  # a grouped cell is mean±std; one seed: the mean
        if column.key and len(means) == 1:
            same.append(f"{LABELS.get(column.key, column.key)} {next(iter(means))}")
        else:
            kept.append(column)
    return kept, same


def _param_columns(frame: pd.DataFrame, params: list[str]) -> list[TextColumn]:
    return [TextColumn("params" if i == 0 else "", key, [str(v) for v in frame[key]], numeric=False)
            for i, key in enumerate(params)]


def _metric_present(frame: pd.DataFrame, key: str, suffix: str = "") -> bool:
    column = f"{key}{suffix}"
    return column in frame and frame[column].notna().any()


def experiments_columns(frame: pd.DataFrame, params: list[str]) -> list[TextColumn]:
    columns = [TextColumn("", "experiment", [str(v) for v in frame["experiment"]], numeric=False)]
    columns += _param_columns(frame, params)
    columns += [TextColumn(m.group, m.label, [fmt(v, m.percent) for v in frame[m.key]], priority=m.priority, key=m.key)
                for m in METRICS if _metric_present(frame, m.key)]
    columns.append(TextColumn("", "!", [str(n) if n else "" for n in frame["warnings"]], priority=99))
    return columns


def groups_columns(groups: pd.DataFrame, group_params: list[str]) -> list[TextColumn]:
    columns = _param_columns(groups, group_params) or [TextColumn("", "group", ["all"] * len(groups), numeric=False)]
    columns.append(TextColumn("", "seeds", [str(n) for n in groups["seeds"]], priority=99))
    columns += [TextColumn(m.group, m.label, [fmt_mean_std(a, b, m.percent) for a, b in
                                              zip(groups[f"{m.key}_mean"], groups[f"{m.key}_std"])],
                           priority=m.priority, key=m.key)
                for m in METRICS if _metric_present(groups, m.key, "_mean")]
    columns.append(TextColumn("", "!", [str(n) if n else "" for n in groups["warnings"]], priority=99))
    return columns


def wrap(text: str, width: int = MAX_WIDTH) -> list[str]:
    import textwrap

    return textwrap.wrap(text, width) or [""]


# --------------------------------------------------------------------------- the whole comparison


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
    others = [e for e in (all_experiments or []) if not e.has_results or e.status != "done"]
    return Comparison(experiments, params, group_params, frame, groups, differences(frame, groups, group_params),
                      others, source, filters, notes)


def difference_lines(comparison: Comparison) -> list[str]:
    """'Is the difference real?': the best group against the next ones on the rank metric."""
    if not comparison.differences:
        return []
    rank = comparison.differences[0]["metric"]
    best = comparison.groups.iloc[0]
    lines = [f"best by {LABELS.get(rank, rank)}: {group_label(best, comparison.group_params)} "
             f"({fmt_mean_std(best[f'{rank}_mean'], best[f'{rank}_std'], True, ' ± ')} %, {int(best['seeds'])} seed"
             f"{'s' if best['seeds'] > 1 else ''})"]
    for d in comparison.differences[:3]:
        p = d["p"]
        verdict = ("p not computed: fewer than 2 seeds in a group" if p is None else
                   f"Welch t-test p = {p:.3f} ({d['n'][0]} vs {d['n'][1]} seeds): "
                   + ("unlikely to be seed noise" if p < 0.05 else "within seed noise"))
        lines.append(f"  vs {d['group']}: {d['difference']:+.1f} points; {verdict}")
    return [line for text in lines for line in wrap(text)]


def terminal_text(comparison: Comparison, max_width: int = MAX_WIDTH) -> str:
    """The comparison as plain text, every line at most ``max_width`` characters."""
    out: list[str] = []
    n = len(comparison.experiments)
    out += wrap(f"{n} experiment{'s' if n != 1 else ''} ({comparison.source}{'; ' + comparison.filters if comparison.filters else ''})"
                f"; params that differ: {', '.join(comparison.params) or 'none'}", max_width)
    out.append("")
    columns, same = split_constant(experiments_columns(comparison.frame, comparison.params))
    lines, dropped = fit_columns(columns, max_width)
    out += lines
    if comparison.group_params and len(comparison.groups) < len(comparison.frame):
        out.append("")
        out += wrap(f"grouped by {', '.join(comparison.group_params)} (every differing param but the seed): "
                    "mean±std over seeds", max_width)
        columns, _ = split_constant(groups_columns(comparison.groups, comparison.group_params))
        group_lines, group_dropped = fit_columns(columns, max_width)
        out += group_lines
        dropped += [c for c in group_dropped if c.key not in {d.key for d in dropped}]
        out += difference_lines(comparison)
    out.append("")
    for note in comparison.notes:
        out += wrap(f"note: {note}", max_width)
    if same:
        out += wrap("the same in every experiment: " + ", ".join(same), max_width)
    out += wrap(LEGEND, max_width)
    if dropped:
        out += wrap("not shown here for width (see the page): " + ", ".join(LABELS.get(c.key, c.key) for c in dropped),
                    max_width)
    if comparison.without_results:
        out += wrap(f"not finished or without results: {describe_without_results(comparison.without_results)}",
                    max_width)
    return "\n".join(line[:max_width] for line in out) + "\n"


def describe_without_results(experiments: list[Experiment]) -> str:
    by_status: dict[str, list[str]] = {}
    for e in experiments:
        by_status.setdefault(e.status, []).append(e.name)
    return "; ".join(f"{status}: {', '.join(names)}" for status, names in by_status.items())


# --------------------------------------------------------------------------- the page


def worst_groups(experiment: Experiment, confidence: float) -> dict[str, GroupAccuracy | None]:
    """ERM's and stage 2's worst test group of ``experiment`` (None where its per-group file is missing)."""
    return {model: card.model_summary(model, None, (experiment.read_json(GROUP_FILES[model]) or {}).get("test"),
                                      confidence).worst_group for model in GROUP_FILES}


def _distinct(values: list[str]) -> str:
    """The values joined, or one of them with '(every run)' when they all agree."""
    return f"{values[0]} (every run)" if len(values) > 1 and len(set(values)) == 1 else "; ".join(values) or "n/a"


def headline_section(comparison: Comparison, worst: dict[str, dict[str, GroupAccuracy | None]], confidence: float,
                     min_n: int) -> Section:
    """The page's card: ERM against stage 2 for the best group (mean ± std over its seeds), each seed's worst group
    named with its n and interval, the warning count with a link, and what to look at next."""
    c = comparison
    best = c.groups.iloc[0]
    names = str(best["experiments"]).split(", ")
    members = [e for e in c.experiments if e.name in names]
    seeds = int(best["seeds"])

    def mean(key: str) -> str:
        if f"{key}_mean" not in best or pd.isna(best[f"{key}_mean"]):
            return "n/a"
        return fmt_mean_std(best[f"{key}_mean"], best[f"{key}_std"], True, " ± ")

    def per_run(model: str, text: Any) -> str:
        found = [worst[e.name].get(model) for e in members]
        return _distinct([text(g) if g is not None else "n/a" for g in found])

    level = f"{100 * confidence:g} %"
    models = (("erm", "erm"), ("stage2", "s2"))
    rows = [
        ["average %", *(mean(f"{short}_avg") for _, short in models)],
        ["unbiased %", *(mean(f"{short}_unbiased") for _, short in models)],
        ["worst-group %", *(mean(f"{short}_worst") for _, short in models)],
        ["worst group (class y, attribute a)", *(per_run(m, card.group_name) for m, _ in models)],
        ["its test images n", *(per_run(m, lambda g: f"{g.n}" + (f" (< {min_n})" if g.n < min_n else "")) for m, _ in models)],
        [f"its {level} interval (Wilson)", *(per_run(m, lambda g: card.interval_text(g.low, g.high)) for m, _ in models)],
    ]
    label = group_label(best, c.group_params) if c.group_params else "every experiment"
    headers = [f"best: {label} ({seeds} seed{'s' if seeds != 1 else ''})", "ERM", "stage 2"]
    found = [(f"{e.name}/{stage}", m) for e in c.experiments for stage, ms in e.warnings.items() for m in ms]
    mine = [w for w in found if w[0].split("/")[0] in names]
    chosen = [worst[e.name].get("stage2") or worst[e.name].get("erm") for e in members]
    smallest = min((g for g in chosen if g is not None), key=lambda g: g.n, default=None)
    number = {key: (None if f"{key}_mean" not in best or pd.isna(best[f"{key}_mean"]) else float(best[f"{key}_mean"]))
              for key in ("erm_worst", "s2_worst")}
    facts = card.Facts(mine, number["erm_worst"], number["s2_worst"], smallest, min_n, confidence, seeds)
    caption = (f"Test split, ranked first of {len(c.groups)} group{'s' if len(c.groups) != 1 else ''}: mean ± sample std "
               f"over its seeds; the worst group and its Wilson interval per run ({', '.join(names)}).")
    return Section("Headline", card_blocks(headers, rows, card.warnings_line(found), card.next_step(facts), caption),
                   card=True)


def _table(frame: pd.DataFrame, params: list[str], grouped: bool, extra: dict[str, str] | None = None,
           extra_header: str = "") -> Table:
    """The grouped or per-experiment table; ``extra``: one more cell per experiment name (per-experiment only)."""
    metrics = [m for m in METRICS if _metric_present(frame, m.key, "_mean" if grouped else "")]
    headers = (params if grouped else ["experiment", *params]) or ["group"]
    headers = [*headers, *(["seeds"] if grouped else []), *(f"{m.group} {m.label}" for m in metrics),
               *([extra_header] if extra is not None else []), "warnings"]
    rows = []
    for _, row in frame.iterrows():
        cells = [str(row[k]) for k in ([] if grouped else ["experiment"]) + params] or ["all"]
        if grouped:
            cells.append(str(row["seeds"]))
            cells += [fmt_mean_std(row[f"{m.key}_mean"], row[f"{m.key}_std"], m.percent, " ± ") for m in metrics]
        else:
            cells += [fmt(row[m.key], m.percent) for m in metrics]
        if extra is not None:
            cells.append(extra.get(row["experiment"], "–"))
        cells.append(str(row["warnings"]) if row["warnings"] else "")
        rows.append(cells)
    return Table(headers, rows)


def page_sections(comparison: Comparison, figure_paths: dict[str, list[Path]], chosen: list[Experiment],
                  confidence: float = ReportParams().confidence, min_n: int = ReportParams().min_group_n) -> list[Section]:
    """The page: headline card, summary, warnings, grouped table, per-experiment table, per-group heatmaps,
    validation curves. ``confidence``, ``min_n``: the Wilson intervals' level and the small-group mark."""
    c = comparison
    worst = {e.name: worst_groups(e, confidence) for e in c.experiments}
    summary: list[Block] = [Text(
        f"{len(c.experiments)} experiments from {c.source}{' (' + c.filters + ')' if c.filters else ''}, compared "
        f"{dt.datetime.now().isoformat(timespec='seconds')}. Params that differ: "
        + (", ".join(f"`{k}`" for k in c.params) or "none") + ". Test split; accuracies in %.")]
    summary += [Text(line.strip()) for line in difference_lines(c)[:1]]
    if c.differences:
        rank = c.differences[0]["metric"]
        summary.append(Table(["group", f"difference in {LABELS.get(rank, rank)} (points)", "Welch p", "seeds"],
                             [[d["group"], f"{d['difference']:+.1f}", "–" if d["p"] is None else f"{d['p']:.3f}",
                               f"{d['n'][0]} vs {d['n'][1]}"] for d in c.differences],
                             caption="Each group against the best one: p < 0.05 says the difference is unlikely to be "
                                     "seed noise (two-sided Welch t-test over seeds; no p with fewer than 2 seeds)."))
    if c.without_results:
        summary.append(Text(f"Not finished or without results (not compared): {describe_without_results(c.without_results)}.",
                            note=True))
    summary += [Text(note[0].upper() + note[1:] + ".", note=True) for note in c.notes]

    warnings: list[Block] = []
    rows = [[e.name, stage, warning_code(m), m] for e in c.experiments for stage, ms in e.warnings.items() for m in ms]
    if rows:
        warnings.append(Text(f"{len(rows)} warnings in {len({r[0] for r in rows})} experiments.", note=True))
        warnings.append(Table(["experiment", "stage", "warning", "message"], rows, numeric=False))
    else:
        warnings.append(Text("None: no stage of these experiments reported a warning."))

    grouped = [Text(f"Grouped by {', '.join(f'`{k}`' for k in c.group_params) or 'nothing'} (every differing param "
                    "but the seed): mean ± sample standard deviation over the seeds, best first."), _table(c.groups, c.group_params, True)]
    if figure_paths.get("groups"):
        grouped.append(Figure(figure_paths["groups"][0], "Stage-2 test accuracy per group: mean ± std (bars) and each "
                              "seed (dots)."))
    worst_cells = {name: worst_cell(w.get("stage2") or w.get("erm"), min_n) for name, w in worst.items()}
    per_experiment: list[Block] = [_table(c.frame, c.params, False, worst_cells, "worst group: y, a · n · interval"),
                                   Text(f"{LEGEND}; worst group: stage 2's (ERM's where stage 2 did not run) worst test "
                                        f"group, its n and {100 * confidence:g} % Wilson interval")]
    names = ", ".join(e.name for e in chosen)
    heatmaps: list[Block] = [Figure(path, f"Test accuracy (%) per (class y, bias attribute a) of the stage-2 model "
                                    f"(ERM where stage 2 did not run); hatched: no test image; red box: the bias-aligned "
                                    f"attribute of each class.") for path in figure_paths.get("per_group", [])]
    curves: list[Block] = [Figure(path, "Validation accuracy per epoch: worst-group (solid) and average (dashed), "
                                  "one colour per experiment; ERM left, stage 2 right.") for path in figure_paths.get("curves", [])]
    missing = figure_paths.get("missing", [])
    if len(chosen) < len(c.experiments):
        heatmaps.insert(0, Text(f"The {len(chosen)} experiments drawn: {names} (of {len(c.experiments)}; choose "
                                "with --method, --param, --last).", note=True))
    for blocks, what in ((heatmaps, "per-group accuracy"), (curves, "validation curves")):
        if not any(isinstance(b, Figure) for b in blocks):
            blocks.append(Text(f"No {what} to draw (the files were not found for these experiments).", note=True))
    if missing:
        curves.append(Text("Not found: " + "; ".join(missing) + ".", note=True))
    return [headline_section(c, worst, confidence, min_n), Section("Summary", summary), Section("Warnings", warnings),
            Section("Grouped by everything but the seed", grouped),
            Section("Experiments", per_experiment), Section("Per-group accuracy", heatmaps),
            Section("Validation curves", curves)]


def draw(comparison: Comparison, out: Path, dpi: int = 100) -> tuple[dict[str, list[Path]], list[Experiment]]:
    """The page's figures under ``out/figures``; returns their paths (relative to ``out``) and the runs drawn."""
    chosen = comparison.experiments[:MAX_FIGURE_RUNS]
    drawn: dict[str, list[Path]] = {"groups": [], "per_group": [], "curves": [], "missing": []}
    folder = out / "figures"
    folder.mkdir(parents=True, exist_ok=True)
    rank = rank_metric(comparison.frame)
    if rank is not None:
        prefix = rank.split("_")[0]
        points = {}
        for _, row in comparison.groups.iterrows():
            label = group_label(row, comparison.group_params)
            mask = pd.Series(True, index=comparison.frame.index)
            for key in comparison.group_params:
                mask &= comparison.frame[key] == row[key]
            points[label] = {f"{prefix}_{k}": comparison.frame.loc[mask, f"{prefix}_{k}"].tolist()
                             for k in ("avg", "unbiased", "worst")}
        path = folder / "groups.png"
        figures.group_summary(points, [f"{prefix}_worst", f"{prefix}_unbiased", f"{prefix}_avg"],
                              {k: LABELS[k] for k in LABELS}, path, dpi)
        drawn["groups"].append(path.relative_to(out))
    panels, aligned = [], None
    curves: dict[str, dict[str, dict[str, list[float]]]] = {"ERM": {}, "stage 2": {}}
    for experiment in chosen:
        table = None
        for model in ("stage2", "erm"):
            groups = experiment.read_json(GROUP_FILES[model]) or {}
            if (groups.get("test") or {}).get("per_group"):
                table = groups["test"]
                break
        if table is not None:
            panels.append((experiment.name, table["per_group"], table.get("group_counts")))
        else:
            drawn["missing"].append(f"per-group accuracy of {experiment.name}")
        if aligned is None:
            summary = experiment.read_json(paths.BIAS_SUMMARY)
            counts = (((summary or {}).get("splits") or {}).get("train") or {}).get("group_counts")
            aligned = [max(range(len(row)), key=row.__getitem__) for row in counts] if counts else None
        for model, title in (("erm", "ERM"), ("stage2", "stage 2")):
            columns = experiment.read_curves(CURVE_FILES[model])
            if columns:
                curves[title][experiment.name] = columns
    shapes = {(len(t), len(t[0]) if t else 0) for _, t, _ in panels}
    for i in range(0, len(panels), 4):
        path = folder / f"per_group_{i // 4 + 1}.png"
        figures.per_group_heatmaps(panels[i : i + 4], path, aligned if len(shapes) == 1 else None, dpi)
        drawn["per_group"].append(path.relative_to(out))
    if any(curves.values()):
        path = folder / "curves.png"
        figures.run_curves(curves, path, dpi)
        drawn["curves"].append(path.relative_to(out))
    return drawn, chosen


MANIFEST = ".debias-compare.json"  # in the --out folder: the files compare wrote there, the only ones it replaces
PAGE_FILES = ("index.html", "compare.md", "experiments.csv", "groups.csv", "table.txt")
FIGURE_FILES = ("figures/groups.png", "figures/curves.png",
                *(f"figures/per_group_{i + 1}.png" for i in range(math.ceil(MAX_FIGURE_RUNS / 4))))


def default_out(root: Path) -> Path:
    return root / "reports" / "compare"


def written_before(out: Path) -> set[str]:
    """The files (relative to ``out``) the last comparison wrote into ``out``, from its manifest; empty without one."""
    try:
        listed = json.loads((out / MANIFEST).read_text(encoding="utf-8")).get("files", [])
    except (OSError, ValueError, AttributeError):
        return set()
    return {str(name) for name in listed if isinstance(name, str)}


def check_out(out: Path, own_folder: bool = False) -> set[str]:
    """Refuse (ValueError, one line) an ``out`` that is a file, cannot be written, or holds a file of the page's names
    that compare did not write (its manifest does not list it: a user's file, a pipeline report); return the files
    it may replace. ``own_folder``: the default ``reports/compare``, whose files are compare's (older versions wrote
    no manifest)."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file; allowed: a folder (new, or one debias compare wrote)")
    try:
        out.mkdir(parents=True, exist_ok=True)
        handle, probe = tempfile.mkstemp(prefix=".write-probe.", dir=out)
        os.close(handle)
        os.unlink(probe)
    except OSError as exc:
        raise ValueError(f"--out {out}: cannot write there ({exc.strerror}); choose a writable folder") from None
    owned = written_before(out) | (set(PAGE_FILES + FIGURE_FILES) if own_folder else set())
    foreign = [name for name in (*PAGE_FILES, *FIGURE_FILES) if (out / name).exists() and name not in owned]
    if foreign:
        raise ValueError(f"--out {out} holds {', '.join(foreign[:5])}{' and more' if len(foreign) > 5 else ''}, which "
                         f"debias compare did not write (its {MANIFEST} does not list them); it never replaces other "
                         "files: choose another folder (default: reports/compare)")
    return owned


def write_page(comparison: Comparison, out: Path, title: str = "debias: experiments compared",
               own_folder: bool = False, report: ReportParams | None = None) -> dict[str, Path]:
    """``out/index.html`` (self-contained), ``out/compare.md``, ``out/experiments.csv``, ``out/groups.csv`` and
    the figures, into a folder :func:`check_out` accepts; figures the last comparison there wrote and this one did
    not are removed (its manifest lists them), nothing else. Returns the written files by name. ``report``: the
    intervals' level and small-group mark (params.yaml's ``report`` section; the schema's defaults without one)."""
    owned = check_out(out, own_folder)
    report = report or ReportParams()
    figure_paths, chosen = draw(comparison, out)
    sections = page_sections(comparison, figure_paths, chosen, report.confidence, report.min_group_n)
    written = {"html": out / "index.html", "md": out / "compare.md", "experiments": out / "experiments.csv",
               "groups": out / "groups.csv", "text": out / "table.txt"}
    with atomic_path(written["html"]) as tmp:
        tmp.write_text(render_html(title, sections, out, PAGE_STYLE), encoding="utf-8")
    with atomic_path(written["md"]) as tmp:
        tmp.write_text(render_markdown(title, sections, out, out), encoding="utf-8")
    with atomic_path(written["experiments"]) as tmp:
        comparison.frame.to_csv(tmp, index=False)
    with atomic_path(written["groups"]) as tmp:
        comparison.groups.to_csv(tmp, index=False)
    with atomic_path(written["text"]) as tmp:
        tmp.write_text(terminal_text(comparison), encoding="utf-8")
    for paths in figure_paths.values():
        for i, path in enumerate(paths):
            if isinstance(path, Path):
                written[f"figure:{path.stem}"] = out / path
    names = sorted(str(path.relative_to(out)) for path in written.values())
    for stale in sorted(owned - set(names)):  # an older comparison's figures (fewer runs drawn now), and only those
        if stale in PAGE_FILES + FIGURE_FILES:
            (out / stale).unlink(missing_ok=True)
    with atomic_path(out / MANIFEST) as tmp:
        tmp.write_text(json.dumps({"written_by": "debias compare", "files": names}, indent=1), encoding="utf-8")
    return written


# --------------------------------------------------------------------------- entry


def log_to_mlflow(comparison: Comparison, written: dict[str, Path], root: Path) -> str:
    """Log the page, tables and figures as one run of the MLflow experiment ``<experiment>-compare`` (its own
    experiment, so the pipeline experiment keeps one row per pipeline run). Follows ``DEBIAS_TRACKING``:
    ``off`` skips, ``optional`` warns on a failure, ``required`` raises it. Returns what happened, in words."""
    import os

    from debias.errors import TrackingError
    from debias.tracking import (DEFAULT_EXPERIMENT, KIND_TAG, check_reachable, ensure_experiment, tracking_mode,
                                 tracking_uri)

    mode = tracking_mode()
    if mode == "off":
        return "not logged to MLflow (DEBIAS_TRACKING=off)"
    uri = tracking_uri(root)
    name = os.environ.get("MLFLOW_EXPERIMENT_NAME", DEFAULT_EXPERIMENT) + "-compare"
    try:
        check_reachable(uri)
        from mlflow.entities import Metric, Param
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=uri)
        experiment_id = ensure_experiment(uri, name, root)
        stamp = dt.datetime.now().isoformat(timespec="seconds")
        run_id = client.create_run(experiment_id, tags={
            "mlflow.runName": f"compare {stamp}", KIND_TAG: "compare", "debias.source": comparison.source,
            "debias.filters": comparison.filters or "none",
            "debias.experiments": ", ".join(e.name for e in comparison.experiments)[:5000]}).info.run_id
        client.log_batch(run_id, params=[Param("experiments", str(len(comparison.experiments))),
                                         Param("groups", str(len(comparison.groups))),
                                         Param("varying_params", ", ".join(comparison.params)[:6000] or "none")])
        rank = rank_metric(comparison.frame)
        if rank is not None and len(comparison.groups):
            best = comparison.groups.iloc[0]
            client.log_batch(run_id, metrics=[Metric(f"best_{rank}_mean", float(best[f"{rank}_mean"]),
                                                     int(dt.datetime.now().timestamp() * 1000), 0)])
        for key, path in written.items():
            client.log_artifact(run_id, str(path), "compare/figures" if key.startswith("figure:") else "compare")
        client.set_terminated(run_id, "FINISHED")
    except Exception as exc:
        message = f"the comparison was not logged to MLflow store {uri}: {type(exc).__name__}: {str(exc)[:300]}"
        if mode == "required":
            raise TrackingError(message + " (DEBIAS_TRACKING=optional logs nothing and goes on)") from None
        return message
    return f"logged to MLflow experiment '{name}' as run {run_id}"


def workspace_report_params(root: Path) -> ReportParams:
    """The ``report`` section of ``root``'s params.yaml (the intervals' level; the page states it), the schema's
    defaults where the file is missing or does not validate."""
    from debias.params import load_params

    try:
        return load_params(root / "params.yaml").report
    except (OSError, ValueError):
        return ReportParams()


def compare(root: Path, source: str = "dvc", method: str | None = None, param_filters: Iterable[str] = (),
            last: int | None = None, tags: dict[str, str] | None = None, out: Path | None = None,
            mlflow: bool = True, max_width: int = MAX_WIDTH) -> tuple[Comparison, dict[str, Path], str]:
    """Gather, select, tabulate, write the page (``out``, default ``reports/compare``) and log it; returns the
    comparison, the files written and the terminal text."""
    import os

    from debias.report import collect
    from debias.tracking import DEFAULT_EXPERIMENT, tracking_uri

    if last is not None and last < 1:
        raise ValueError(f"--last {last}; allowed: a whole number >= 1 (the most recent experiments to compare)")
    if max_width < MIN_WIDTH:
        raise ValueError(f"--width {max_width}; allowed: {MIN_WIDTH} or more characters")
    page = out or default_out(root)
    check_out(page, own_folder=page.resolve() == default_out(root).resolve())  # before the slow gathering
    gathered: list[Experiment] = []
    if source in ("dvc", "both"):
        gathered += collect.from_dvc(root)
    if source in ("mlflow", "both"):
        gathered += collect.from_mlflow(tracking_uri(root), os.environ.get("MLFLOW_EXPERIMENT_NAME", DEFAULT_EXPERIMENT),
                                        tags)
    filters = "; ".join(filter(None, [f"--method {method}" if method else "",
                                      *(f"--param {p}" for p in param_filters), f"--last {last}" if last else "",
                                      *(f"--tag {k}={v}" for k, v in (tags or {}).items())]))
    chosen = select(gathered, method, param_filters, last)
    if not chosen:
        with_results = [e.name for e in gathered if e.has_results]
        raise ValueError(f"no experiment to compare ({source}{'; ' + filters if filters else ''}): "
                         + (f"those with results are {', '.join(with_results)}" if with_results else
                            "none has results yet (run `dvc repro` or `dvc exp run`)"))
    for experiment in chosen:
        experiment.load_notes()
    comparison = build_comparison(chosen, gathered, source, filters)
    text = terminal_text(comparison, max_width)
    written = write_page(comparison, page, own_folder=page.resolve() == default_out(root).resolve(),
                         report=workspace_report_params(root))
    logged = log_to_mlflow(comparison, written, root) if mlflow else "not logged to MLflow (--no-mlflow)"
    text += "\n".join(wrap(f"page: {written['html']} (opens offline); {logged}", max_width)) + "\n"
    return comparison, written, text
