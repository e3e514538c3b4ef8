"""``debias compare``'s terminal table: no line wider than ``--width`` (160 characters by default); the lowest-priority
metric columns are dropped first, and the page shows them."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from debias.core.errors import NEEDS_BIAS_LABELS
from debias.core.headline import LABELS
from debias.tools.compare.collect import Experiment
from debias.tools.compare.data import (METRICS, MIN_EVIDENCE_PAIRS, ZERO_WIDTH, Comparison, data_family,
                                       evidence_of_best, fmt, fmt_mean_std, group_label, metric_present)

MAX_WIDTH = 160  # terminal table, characters
LEGEND = ("test split; accuracies in %: avg = sample-weighted, unb = unbiased (mean over groups), wg = worst-group, "
          "wc = worst-class (data without bias labels); "
          "align = alignment loss (CNC Eq. 2-3); Î(A;Z) in nats; ! = warnings (listed in the page)")


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


def _cut_left(text: str, width: int) -> str:
    return text if len(text) <= width else "…" + text[len(text) - max(width - 1, 0):]


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
    # a param's key is cut from the left: its end tells params of one section apart (…name_0, …name_1)
    labels_line = [c.label.rjust(w) if c.numeric else _cut_left(c.label, w).ljust(w) for c, w in zip(columns, widths)]
    lines = [sep.join(groups_line).rstrip(), sep.join(labels_line).rstrip()]
    for r in range(len(columns[0].cells) if columns else 0):
        cells = [(c.cells[r].rjust(w) if c.numeric else _cut(c.cells[r], w).ljust(w)) for c, w in zip(columns, widths)]
        lines.append(sep.join(cells).rstrip())
    return lines


MIN_METRICS = 3  # ours: the metric columns a table keeps however many params differ (the highest priorities)


def fit_columns(columns: list[TextColumn], max_width: int = MAX_WIDTH,
                text_width: int = 24) -> tuple[list[str], list[TextColumn]]:
    """Render within ``max_width``: shorten text columns (names, param values) to ``text_width`` characters, then
    drop the lowest-priority metric columns down to :data:`MIN_METRICS`, then shorten text columns down to 10
    characters, then drop the last param columns; lines are never longer than ``max_width``. Returns the lines and
    the columns left out."""
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
        if len([c for c in droppable if c.key]) <= MIN_METRICS:
            break  # the headline metrics stay: params give way below instead
        lowest = min(droppable, key=lambda c: c.priority)
        kept.remove(lowest)
        dropped.append(lowest)
    while limit is not None and limit > 10 and width(limit) > max_width:
        limit -= 1
    while width(limit) > max_width:  # still too wide: the last param columns leave (named below the table)
        params = [c for c in kept[1:] if not c.numeric]
        if not params:
            break
        kept.remove(params[-1])
        dropped.append(params[-1])
    return [line[:max_width] for line in render_columns(kept, limit)], dropped


def split_unlabelled(columns: list[TextColumn]) -> tuple[list[TextColumn], list[str]]:
    """Metric columns whose every cell is the needs-bias-labels marker leave the table for one line naming them (a
    column of the marker would crowd out the numbers the data has)."""
    kept = [c for c in columns if not (c.key and c.cells and all(cell == NEEDS_BIAS_LABELS for cell in c.cells))]
    return kept, [LABELS.get(c.key, c.key) for c in columns if c not in kept]


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


def experiments_columns(frame: pd.DataFrame, params: list[str]) -> list[TextColumn]:
    columns = [TextColumn("", "experiment", [str(v) for v in frame["experiment"]], numeric=False)]
    columns += _param_columns(frame, params)
    columns += [TextColumn(m.group, m.label, [fmt(v, m.percent) for v in frame[m.key]], priority=m.priority, key=m.key)
                for m in METRICS if metric_present(frame, m.key)]
    columns.append(TextColumn("", "!", [str(n) if n else "" for n in frame["warnings"]], priority=99))
    return columns


def groups_columns(groups: pd.DataFrame, group_params: list[str]) -> list[TextColumn]:
    columns = _param_columns(groups, group_params) or [TextColumn("", "group", ["all"] * len(groups), numeric=False)]
    columns.append(TextColumn("", "seeds", [str(n) for n in groups["seeds"]], priority=99))
    columns += [TextColumn(m.group, m.label, [fmt_mean_std(a, b, m.percent) for a, b in
                                              zip(groups[f"{m.key}_mean"], groups[f"{m.key}_std"])],
                           priority=m.priority, key=m.key)
                for m in METRICS if metric_present(groups, m.key, "_mean")]
    columns.append(TextColumn("", "!", [str(n) if n else "" for n in groups["warnings"]], priority=99))
    return columns


def wrap(text: str, width: int = MAX_WIDTH) -> list[str]:
    import textwrap

    return textwrap.wrap(text, width) or [""]


def seed_count(measured: int, seeds: int) -> str:
    """``measured`` (the seeds with the metric) in words, with the group's ``seeds`` where some lack it."""
    text = f"{measured} seed{'s' if measured != 1 else ''}"
    missing = seeds - measured
    return text + (f" of {seeds}: the other{'s lack' if missing > 1 else ' lacks'} it" if missing > 0 else "")


def difference_line(d: dict) -> str:
    """One group against the top of its data family: the difference of means, and the verdict paired by seed."""
    if d["paired"] is None:
        how = ("not distinguishable: fewer than 2 seeds in common, nothing to pair (run more seeds: "
               "-S 'seed=0,1,2')")
    else:
        mean, low, high = d["paired"]
        reason = {"evidence": "evidence of a difference",
                  "too few seeds": f"no verdict: {d['pairs']} seeds (evidence needs {MIN_EVIDENCE_PAIRS} or more)",
                  "not distinguishable": ("not distinguishable (the interval holds 0)" if high - low > ZERO_WIDTH else
                                          "not distinguishable (every seed differs by the same amount: an interval "
                                          "without width is no evidence)")}[d["verdict"]]
        how = f"paired by seed ({d['pairs']} seeds): {mean:+.1f} points, 95 % interval [{low:+.1f}, {high:+.1f}]: {reason}"
    return f"  {d['group']} vs {d['best']}: {d['difference']:+.1f} points in the means; {how}"


def difference_lines(comparison: Comparison) -> list[str]:
    """'Is the difference real?': per data family, the top group against the others, paired by seed; "best" only
    where every paired interval excludes 0."""
    if not comparison.differences:
        return []
    rank = comparison.differences[0]["metric"]
    label = LABELS.get(rank, rank)
    lines = []
    for family in dict.fromkeys(d["family"] for d in comparison.differences):
        top = next(row for _, row in comparison.groups.iterrows()
                   if data_family(row, comparison.group_params) == family)
        n = int(pd.to_numeric(comparison.frame.loc[
            comparison.frame["experiment"].isin(str(top["experiments"]).split(", ")), rank],
            errors="coerce").notna().sum())
        shown = (f"{group_label(top, comparison.group_params)} "
                 f"({fmt_mean_std(top[f'{rank}_mean'], top[f'{rank}_std'], True, ' ± ')} %, {seed_count(n, int(top['seeds']))})")
        where = f" on data {family}" if family else ""
        if evidence_of_best(comparison.differences, family):
            lines.append(f"best by {label}{where}: {shown}")
        else:
            lines.append(f"no best by {label}{where}: the highest mean, {shown}, is not shown better than every other "
                         "group")
        lines += [difference_line(d) for d in comparison.differences if d["family"] == family][:4]
    if len({d["family"] for d in comparison.differences}) > 1:
        lines.append("groups on different data (data.*, bias.* differ) are not ranked against each other")
    return [line for text in lines for line in wrap(text)]


def terminal_text(comparison: Comparison, max_width: int = MAX_WIDTH) -> str:
    """The comparison as plain text, every line at most ``max_width`` characters."""
    out: list[str] = []
    n = len(comparison.experiments)
    out += wrap(f"{n} experiment{'s' if n != 1 else ''} ({comparison.source}{'; ' + comparison.filters if comparison.filters else ''})"
                f"; params that differ: {', '.join(comparison.params) or 'none'}", max_width)
    out.append("")
    columns, unlabelled = split_unlabelled(experiments_columns(comparison.frame, comparison.params))
    columns, same = split_constant(columns)
    lines, dropped = fit_columns(columns, max_width)
    out += lines
    if comparison.group_params and len(comparison.groups) < len(comparison.frame):
        out.append("")
        out += wrap(f"grouped by {', '.join(comparison.group_params)} (every differing param but the seed): "
                    "mean±std over seeds", max_width)
        columns, _ = split_constant(split_unlabelled(groups_columns(comparison.groups, comparison.group_params))[0])
        group_lines, group_dropped = fit_columns(columns, max_width)
        out += group_lines
        dropped += [c for c in group_dropped if c.key not in {d.key for d in dropped}]
        out += difference_lines(comparison)
    out.append("")
    for note in comparison.notes:
        out += wrap(note if note.startswith("WARNING ") else f"note: {note}", max_width)
    if unlabelled:
        out += wrap(f"{NEEDS_BIAS_LABELS} (the data has no bias attribute; no number): " + ", ".join(unlabelled),
                    max_width)
    if same:
        out += wrap("the same in every experiment: " + ", ".join(same), max_width)
    out += wrap(LEGEND, max_width)
    if dropped:
        out += wrap("not shown here for width (see the page): " + ", ".join(LABELS.get(c.key, c.key) or c.label
                                                                            for c in dropped),
                    max_width)
    if comparison.without_results:
        out += wrap(f"not finished or without results: {describe_without_results(comparison.without_results)}",
                    max_width)
    return "\n".join(line[:max_width] for line in out) + "\n"


def describe_without_results(experiments: list[Experiment]) -> str:
    """Each run that is not compared: queued and running ones by status, the others each with the reason and the
    command that gives it results."""
    from debias.tools.compare.data import missing_reason

    by_status: dict[str, list[str]] = {}
    for e in experiments:
        if e.status in ("queued", "running") and not e.reason:
            by_status.setdefault(e.status, []).append(e.name)
    listed = [f"{status}: {', '.join(names)}" for status, names in by_status.items()]
    listed += [f"{e.name}: {missing_reason(e)}" for e in experiments if not (e.status in ("queued", "running")
                                                                             and not e.reason)]
    return "; ".join(listed)
