"""``debias compare``'s terminal table: no line wider than ``--width`` (160 characters by default); the lowest-priority
metric columns are dropped first, and the page shows them."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from debias.core.errors import NEEDS_BIAS_LABELS
from debias.core.headline import LABELS
from debias.metrics.paired import ALPHA, MAX_SEEDS, POWER
from debias.report.card import points_text
from debias.tools.compare.collect import Experiment
from debias.tools.compare.data import (METRICS, MIN_EVIDENCE_PAIRS, SEED, STEP_SHOWN, Comparison, MetricVerdict,
                                       data_family, evidence_of_best, fmt, fmt_mean_std, group_label, metric_present)

MAX_WIDTH = 160  # terminal table, characters
POWER_WORDS = f"{100 * POWER:g} % power, two-sided paired t-test at alpha {ALPHA:g}"
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
    whole_label: bool = False  # a param's label (its shortest unique key): never cut, its values are

    def width(self, limit: int | None = None) -> int:
        natural = max([len(self.label), *map(len, self.cells)] or [1])
        if limit is None or self.numeric:
            return natural
        return max(len(self.label), min(natural, limit)) if self.whole_label else min(natural, limit)


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
    # a long label is cut from the left: its end tells columns apart (…name_0, …name_1); a param's label is whole
    labels_line = [c.label.rjust(w) if c.numeric else (c.label if c.whole_label else _cut_left(c.label, w)).ljust(w)
                   for c, w in zip(columns, widths)]
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


def short_keys(keys: list[str]) -> dict[str, str]:
    """Each dotted key as its shortest suffix of whole components that no other of ``keys`` ends with
    (``stage2.method`` -> ``method``; ``stage2.cnc.temperature`` and ``stage2.supcon.temperature`` keep ``cnc.`` and
    ``supcon.``): a swept param is named in full words in a narrow table, never cut to ``…ge2.method``."""
    short = {}
    for key in keys:
        parts = key.split(".")
        for n in range(1, len(parts) + 1):
            suffix = ".".join(parts[-n:])
            if not any(other != key and (other == suffix or other.endswith("." + suffix)) for other in keys):
                break
        short[key] = suffix
    return short


def _param_columns(frame: pd.DataFrame, params: list[str]) -> list[TextColumn]:
    labels = short_keys(params)  # the full keys are named above the table
    return [TextColumn("params" if i == 0 else "", labels[key], [str(v) for v in frame[key]], numeric=False,
                       whole_label=True) for i, key in enumerate(params)]


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
    """``text`` in lines of at most ``width`` characters; an indented text's further lines indented two more."""
    import textwrap

    lead = text[: len(text) - len(text.lstrip(" "))]
    return textwrap.wrap(text, width, subsequent_indent=lead + "  " if lead else "") or [""]


def seed_count(measured: int, seeds: int) -> str:
    """``measured`` (the seeds with the metric) in words, with the group's ``seeds`` where some lack it."""
    text = f"{measured} seed{'s' if measured != 1 else ''}"
    missing = seeds - measured
    return text + (f" of {seeds}: the other{'s lack' if missing > 1 else ' lacks'} it" if missing > 0 else "")


def seeds_text(count: int | None) -> str:
    """'about 512 seeds', or 'more than 10000 seeds' where no count up to the search's bound decides it."""
    return f"more than {MAX_SEEDS} seeds" if count is None else f"about {count} seed{'s' if count != 1 else ''}"


def detect_phrase(v: MetricVerdict) -> str:
    """What these seeds could detect: '3 seeds detect 50.4 points (80 % power at alpha 0.05)'."""
    if not v.spread:
        return "the differences have no spread: what more seeds would detect is unknown"
    return f"{v.pairs} seeds detect {v.detectable:.1f} points or more ({POWER_WORDS})"


def decide_parts(v: MetricVerdict) -> tuple[str, str]:
    """('about 512 seeds', 'for two one-sided tests to show ±2 at a true difference of 0; for the t-test to find a
    2-point difference: about 470 seeds'): the seeds that decide ±decide_points whichever holds (the larger count),
    and which test needs them, the other's count beside it."""
    count, which = v.seeds_to_decide
    margin = f"{v.decide_points:g}"
    within = f"for two one-sided tests to show ±{margin} at a true difference of 0"
    differ = f"for the t-test to find a {margin}-point difference"
    if which == "within":
        return seeds_text(count), f"{within}; {differ}: {seeds_text(v.seeds_differ)}"
    return seeds_text(count), f"{differ}; {within}: {seeds_text(v.seeds_within)}"


def decide_phrase(v: MetricVerdict) -> str:
    """'±2 points: about 512 seeds decide it (for two one-sided tests ...; for the t-test ...: about 470 seeds)'."""
    if not v.spread:
        return f"±{v.decide_points:g} points: no seed count follows from differences without spread"
    count, which = decide_parts(v)
    return f"±{v.decide_points:g} points: {count} decide it ({which})"


def step_phrase(v: MetricVerdict) -> str | None:
    """'one image moves it by up to 7.7 points (its worst group holds as few as 13 test images)' where that is more than
    :data:`STEP_SHOWN` points; None otherwise."""
    if v.step is None or v.step <= STEP_SHOWN:
        return None
    return f"one image moves it by up to {points_text(v.step)} points (its worst group holds as few as {v.worst_n} test images)"


def p_text(p: float) -> str:
    """'p = 0.012', or 'p < 0.001' where three decimals would print 0.000."""
    return "p < 0.001" if p < 0.0005 else f"p = {p:.3f}"


def verdict_phrase(v: MetricVerdict) -> str:
    """The verdict in words; 'not distinguishable' always with what the seeds could detect, 'undecided' with the
    seeds that would decide it."""
    if v.verdict == "unpaired":
        return ("not distinguishable: fewer than 2 seeds in common, nothing to pair (run more seeds: "
                "-S 'seed=0,1,2')")
    if v.verdict == "too few seeds":
        return f"no verdict: {v.pairs} seeds (evidence needs {MIN_EVIDENCE_PAIRS} or more)"
    if v.verdict == "evidence":
        return "evidence of a difference (the interval excludes 0)"
    if v.verdict == "differs":
        return "differs (the interval excludes 0)"
    if v.verdict == "within":
        smaller = (f", a difference smaller than ±{v.margin:g} (the interval excludes 0)"
                   if v.paired.excludes_zero else "")
        return f"within ±{v.margin:g} points (two one-sided tests at alpha {ALPHA:g}: {p_text(v.tost_p)}){smaller}"
    if not v.spread:
        return (f"{v.verdict} (every seed differs by the same amount: an interval without width is no evidence, and "
                "tells nothing of what more seeds would show)")
    if v.verdict == "undecided":
        count, which = decide_parts(v)
        return f"undecided: {count} would decide it ({which})"
    return (f"not distinguishable (the interval holds 0): {v.pairs} seeds detect only differences of "
            f"{v.detectable:.1f} points or more ({POWER_WORDS})")


def metric_line(v: MetricVerdict) -> str:
    """One metric of a difference: the means, the paired interval and verdict, what the seeds detect, the seeds
    that decide ±decide_points and, for a worst group of few images, what one image moves it by."""
    label = LABELS.get(v.metric, v.metric)
    means = "–" if math.isnan(v.difference) else f"{v.difference:+.1f}"
    parts = [f"{label}: {means} points in the means"]
    if v.pairs >= 2:
        parts[0] += (f"; paired by seed ({v.pairs} seeds): {v.paired.mean:+.1f} points, 95 % interval "
                     f"[{v.paired.low:+.1f}, {v.paired.high:+.1f}]")
    parts[0] += f": {verdict_phrase(v)}"
    if v.pairs >= 2:
        if v.verdict not in ("not distinguishable",):
            parts.append(detect_phrase(v))
        if v.verdict != "undecided":
            parts.append(decide_phrase(v))
    parts.append(step_phrase(v))
    return "; ".join(part for part in parts if part)


def difference_lines(comparison: Comparison, max_width: int = MAX_WIDTH) -> list[str]:
    """'Is the difference real?': per data family, the top group against the others, paired by seed on each judged
    metric; "best" only where every paired interval of the rank metric excludes 0. Lines of at most ``max_width``."""
    if not comparison.differences:
        return []
    rank = comparison.differences[0].rank.metric
    label = LABELS.get(rank, rank)
    lines = []
    for family in dict.fromkeys(d.family for d in comparison.differences):
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
        for d in [d for d in comparison.differences if d.family == family][:4]:
            lines.append(f"  {d.group} vs {d.best}:")
            lines += [f"    {metric_line(v)}" for v in d.verdicts]
    if len({d.family for d in comparison.differences}) > 1:
        lines.append("groups on different data (data.*, bias.* differ) are not ranked against each other")
    return [line for text in lines for line in wrap(text, max_width)]


DECIDED = ("evidence", "differs", "within")


def seeds_to_add(needed: int, pairs: int) -> int:
    """The seeds to add to ``pairs`` seed-matched pairs so that they reach ``needed`` (the power estimate), at least
    :data:`MIN_EVIDENCE_PAIRS` (no verdict below) and at least one more than ``pairs`` (they did not decide)."""
    return max(needed, MIN_EVIDENCE_PAIRS, pairs + 1) - pairs


def sweep_seeds(comparison: Comparison) -> list[int]:
    """The seeds of the compared experiments, sorted (each once)."""
    values = pd.to_numeric(comparison.frame[SEED], errors="coerce").dropna() if SEED in comparison.frame else []
    return sorted({int(v) for v in values})


def seed_range_end(seeds: list[int], add: int) -> int:
    """The last seed of the range from ``seeds[0]`` that holds exactly ``add`` seeds ``seeds`` lacks (the first
    gaps, then seeds after the largest): ``--seeds <first>-<end>`` adds those and no other."""
    new, candidate, have = [], seeds[0], set(seeds)
    while len(new) < add:
        if candidate not in have:
            new.append(candidate)
        candidate += 1
    return new[-1] if new else seeds[-1]


def next_text(comparison: Comparison) -> str | None:
    """What to run next where a sweep's stage-2 unbiased accuracy is not decided: the seeds that would decide it (the
    most any of its differences needs, never below :data:`MIN_EVIDENCE_PAIRS` nor at the pairs that did not decide)
    and the commands that add them, reusing every finished run (seeds without the metric count for nothing;
    ``--until-decided`` only for a sweep of two settings, the only kind it takes); None otherwise."""
    verdicts = [v for d in comparison.differences for v in d.verdicts if v.metric == "s2_unbiased"]
    if comparison.sweep is None or not verdicts or all(v.verdict in DECIDED for v in verdicts):
        return None
    open_ = [v for v in verdicts if v.verdict not in DECIDED and v.spread and v.pairs >= 2]
    counts = [v.seeds_to_decide[0] for v in open_]
    seeds = sweep_seeds(comparison)
    if not counts or any(c is None for c in counts) or not seeds:
        return None
    add = max(seeds_to_add(count, v.pairs) for count, v in zip(counts, open_))
    needed, pairs = max(max(counts), MIN_EVIDENCE_PAIRS), min(v.pairs for v in open_)
    margin, name = verdicts[0].decide_points, comparison.sweep
    what = f"±{margin:g} points of stage-2 unbiased accuracy"
    head = (f"about {needed} seeds decide {what}" if needed > pairs else
            f"{pairs} seeds did not decide {what}, though about {needed} decide it on average: {add} more")
    lacking = len(seeds) - pairs
    if lacking > 0:
        head += (f" ({lacking} of the sweep's {len(seeds)} seeds lack{'s' if lacking == 1 else ''} it on one side and "
                 "count for nothing)")
    text = (f"next: {head}: `debias sweep --name {name} --resume --seeds {seeds[0]}-{max(seeds[-1], seed_range_end(seeds, add))}` adds the seeds "
            f"it lacks (finished runs are kept), then `debias compare --sweep {name} --margin {margin:g}`")
    if len(comparison.groups) == 2:  # --until-decided compares two settings paired by seed, and no other sweep
        text += (f"; or `debias sweep --name {name} --resume --until-decided {len(seeds) + add} --margin {margin:g}` "
                 "adds them in batches and stops once decided")
    return text


def one_seed_text(comparison: Comparison) -> str | None:
    """What a comparison of one seed per setting cannot answer (whether a difference, or stage 2's gain over ERM, is
    more than seed noise) and the seeds that can; None when a setting has two seeds or more."""
    if comparison.groups.empty or int(comparison.groups["seeds"].max()) > 1:
        return None
    settings = len(comparison.groups)
    what = "whether these settings differ" if settings > 1 else "whether stage 2's gain over ERM holds"
    rerun = (f" (`debias sweep --name {comparison.sweep} --resume --seeds` with {MIN_EVIDENCE_PAIRS} or more seeds "
             "adds them; finished runs are kept)" if comparison.sweep else "")
    return (f"one seed cannot answer {what}: with one seed per setting no difference can be told from seed noise, "
            f"and no verdict is drawn; run {MIN_EVIDENCE_PAIRS} or more seeds of each{rerun}")


def other_commits_text(comparison: Comparison) -> str | None:
    """'4 experiments of 2 other commits are not shown ...': DVC's experiments of other commits, which ``dvc exp
    show`` (and so compare) leaves out, and how to show them; None when there is none."""
    count, commits = sum(map(len, comparison.other_commits.values())), len(comparison.other_commits)
    if not count:
        return None
    return (f"{count} experiment{'s' if count != 1 else ''} of {commits} other commit{'s' if commits != 1 else ''} "
            f"{'are' if count != 1 else 'is'} not shown (DVC lists this commit's experiments only): `debias compare "
            "--all-commits` compares them too, `dvc exp show -A` lists them")


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
        out += difference_lines(comparison, max_width)
        following = next_text(comparison)
        if following:
            out += wrap(following, max_width)
    out.append("")
    alone = one_seed_text(comparison)
    if alone:
        out += wrap(f"note: {alone}", max_width)
    for note in comparison.notes:
        out += wrap(note if note.startswith("WARNING ") else f"note: {note}", max_width)
    elsewhere = other_commits_text(comparison)
    if elsewhere:
        out += wrap(f"note: {elsewhere}", max_width)
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
