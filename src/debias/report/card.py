"""The headline card at the top of the report and of ``debias compare``'s page: ERM against stage 2 on the test
split (average, unbiased, worst-group; the worst group named with its n, what one of its images moves it by and its
Wilson interval), the test groups without a training image, the warning count with links, and one line saying what
to look at next, chosen by the first rule of :data:`NEXT_STEPS` that fires.

Content only (strings, rows): :mod:`debias.report.sections.headline` turns it into the document's blocks.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from debias.core.errors import NEEDS_BIAS_LABELS
from debias.core.headline import percent_text, warning_code
from debias.metrics import GroupAccuracy, group_accuracies, wilson_interval, worst_group_of

WARNINGS_LINK = "#warnings"
QUALITY_SEEDS = 3  # the project's rule: a quality claim rests on >= 3 seeds


# --------------------------------------------------------------------------- formatting


def pct(value: float | None, digits: int = 1) -> str:
    """An accuracy in [0, 1] as a percentage with ``digits`` decimals, 'n/a' for None/NaN; the needs-bias-labels
    marker as itself (data without bias labels)."""
    if isinstance(value, str):
        return value
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return percent_text(value, digits)


def interval_text(low: float, high: float) -> str:
    """'[17.7, 64.5]' (percent)."""
    return f"[{pct(low)}, {pct(high)}]"


NO_TRAINING_IMAGE = "no training image"


def group_name(group: GroupAccuracy) -> str:
    """'y=3, a=1': the group's class and bias attribute; 'y=4, a=0, no training image' where the training split holds
    none of it (its accuracy measures a combination the model never saw, not what training did to a minority)."""
    return f"y={group.y}, a={group.a}" + (f", {NO_TRAINING_IMAGE}" if group.train_n == 0 else "")


def train_group_counts(summary: dict[str, Any] | None) -> list[list[int]] | None:
    """The training split's images per (class, attribute) from the bias summary (``data/biased/summary.json``);
    None without one or without bias labels."""
    counts = (((summary or {}).get("splits") or {}).get("train") or {}).get("group_counts")
    return counts if isinstance(counts, list) else None


def small(group: GroupAccuracy | None, min_n: int) -> bool:
    """Whether ``group`` has fewer than ``min_n`` test images."""
    return group is not None and group.n < min_n


def image_step(n: int) -> float:
    """What one test image moves a group's accuracy by, in points: 100 / n."""
    return 100 / n


def points_text(value: float) -> str:
    """'7.7', '0.010': a number of points with two significant digits, at least one decimal."""
    decimals = max(1, 1 - math.floor(math.log10(value))) if value > 0 else 1
    return f"{value:.{decimals}f}"


def step_text(group: GroupAccuracy) -> str:
    """'n = 13: one image = 7.7 points': a group's test images and what one of them moves its accuracy by."""
    return f"n = {group.n}: one image = {points_text(image_step(group.n))} points"


def untrained(groups: list[GroupAccuracy]) -> list[GroupAccuracy]:
    """The groups the training split holds no image of (``train_n == 0``; unknown counts claim nothing)."""
    return [g for g in groups if g.train_n == 0]


def group_text(group: GroupAccuracy | None, min_n: int) -> str:
    """'38.5 % [17.7, 64.5] (y=3, a=1; n = 13, n < 30)': a group accuracy with its interval, name and n."""
    if group is None:
        return "n/a"
    flag = f", n < {min_n}" if small(group, min_n) else ""
    return f"{pct(group.accuracy)} % {interval_text(group.low, group.high)} ({group_name(group)}; n = {group.n}{flag})"


# --------------------------------------------------------------------------- one model


@dataclass(frozen=True)
class ModelSummary:
    """One model's test results as the card shows them."""

    label: str
    avg: float | None
    unbiased: float | None
    worst: float | None
    n: int | None  # test images
    avg_interval: tuple[float, float] | None
    worst_group: GroupAccuracy | None
    groups: tuple[GroupAccuracy, ...] = ()
    worst_class: float | None = None  # needs no bias labels

    @property
    def bias_labels(self) -> bool:
        """False when the run's data has no bias labels (its worst-group accuracy is the needs-bias-labels marker)."""
        return not isinstance(self.worst, str)


def model_summary(label: str, accuracy: dict[str, Any] | None, table: dict[str, Any] | None,
                  confidence: float, train_counts: list[list[int]] | None = None) -> ModelSummary:
    """From a stage's test accuracies (``erm.json``'s ``test``) and per-group table (``erm_groups.json``'s
    ``test``); either may be None (the stage did not run). ``train_counts``: :func:`train_group_counts`."""
    accuracy, table = accuracy or {}, table or {}
    counts = table.get("group_counts") if isinstance(table.get("group_counts"), list) else [table.get("class_counts") or []]
    n = accuracy.get("n") or sum(map(sum, counts or [])) or None  # the metrics file keeps no n
    avg = accuracy.get("avg")
    avg_interval = wilson_interval(round(avg * n), n, confidence) if avg is not None and n else None
    groups = (tuple(group_accuracies(table["per_group"], table["group_counts"], confidence, train_counts))
              if isinstance(table.get("per_group"), list) and table.get("group_counts") else ())  # a str: no labels
    return ModelSummary(label, avg, accuracy.get("unbiased"), accuracy.get("worst_group"), n, avg_interval,
                        worst_group_of(list(groups)), groups, accuracy.get("worst_class"))


def card_table(models: list[ModelSummary], min_n: int, confidence: float) -> tuple[list[str], list[list[str]]]:
    """(headers, rows) of the card's table: one column per model."""
    level = f"{100 * confidence:g} %"

    def avg(m: ModelSummary) -> str:
        interval = f" {interval_text(*m.avg_interval)}" if m.avg_interval else ""
        return f"{pct(m.avg)}{interval}" + (f" (n = {m.n})" if m.n else "")

    def worst(m: ModelSummary) -> str:
        g = m.worst_group
        return pct(m.worst) if g is None or m.worst is None else f"{pct(m.worst)} ({step_text(g)})"

    def worst_n(m: ModelSummary) -> str:
        g = m.worst_group
        return "n/a" if g is None else f"{g.n}" + (f" (fewer than {min_n}: read with care)" if small(g, min_n) else "")

    if not all(m.bias_labels for m in models):  # data without bias labels: say which rows need them, once each
        return ["test split", *(m.label for m in models)], [
            [f"average % [{level} interval]", *(avg(m) for m in models)],
            ["worst-class %", *(pct(m.worst_class) for m in models)],
            *([name, *(NEEDS_BIAS_LABELS for _ in models)] for name in (
                "unbiased % (mean over groups)", "worst-group %", "worst group (class y, attribute a)"))]
    rows = [
        [f"average % [{level} interval]", *(avg(m) for m in models)],
        ["unbiased % (mean over groups)", *(pct(m.unbiased) for m in models)],
        ["worst-group %", *(worst(m) for m in models)],
        ["worst group (class y, attribute a)", *(group_name(m.worst_group) if m.worst_group else "n/a" for m in models)],
        ["its test images n", *(worst_n(m) for m in models)],
        [f"its {level} interval (Wilson)", *(interval_text(m.worst_group.low, m.worst_group.high)
                                             if m.worst_group else "n/a" for m in models)],
    ]
    return ["test split", *(m.label for m in models)], rows


def untrained_line(models: list[ModelSummary]) -> str | None:
    """'No training image: y=4, a=0 (n = 13 test images: ERM 0.0 %, stage 2 76.9 %). …': every test group the
    training split holds no image of, with each model's accuracy on it; None when there is none (or no counts)."""
    found: dict[tuple[int, int], dict[str, GroupAccuracy]] = {}
    for m in models:
        for g in untrained(list(m.groups)):
            found.setdefault((g.y, g.a), {})[m.label] = g
    if not found:
        return None

    def entry(by_model: dict[str, GroupAccuracy]) -> str:
        g = next(iter(by_model.values()))
        scores = ", ".join(f"{label} {pct(h.accuracy)} %" for label, h in by_model.items())
        return f"y={g.y}, a={g.a} (n = {g.n} test images: {scores})"

    one = len(found) == 1
    return (f"{NO_TRAINING_IMAGE.capitalize()}: " + "; ".join(entry(found[key]) for key in sorted(found))
            + f". The training split holds no image of {'this group' if one else 'these groups'}: "
            f"{'its' if one else 'their'} accuracy measures a (class, attribute) combination the models never saw, "
            "not what training did to a minority.")


# --------------------------------------------------------------------------- warnings and next step


def warnings_line(found: list[tuple[str, str]], link: str = WARNINGS_LINK) -> str:
    """'5 warnings: [chance-level](#warnings) × 3 (train_erm, train_contrastive), …' or 'No warnings.': one entry
    per warning code, with its count and stages (``found``: (where, message), where = stage or experiment/stage)."""
    if not found:
        return "No warnings."
    by_code: dict[str, list[str]] = {}
    for where, message in found:
        by_code.setdefault(warning_code(message), []).append(where)

    def entry(code: str, places: list[str]) -> str:
        stages = ", ".join(dict.fromkeys(p.rpartition("/")[2] for p in places))
        runs = {p.rpartition("/")[0] for p in places} - {""}
        count = f" × {len(places)}" if len(places) > 1 else ""
        return f"[{code}]({link}){count} ({stages}{f'; {len(runs)} experiments' if len(runs) > 1 else ''})"

    return (f"{len(found)} warning{'s' if len(found) > 1 else ''}: "
            + ", ".join(entry(code, places) for code, places in by_code.items()) + ". Read them before the numbers.")


@dataclass(frozen=True)
class Facts:
    """What the next-step rules look at."""

    warnings: list[tuple[str, str]]  # (where: stage or experiment/stage, message), in order
    erm_worst: float | None
    s2_worst: float | None
    worst: GroupAccuracy | None  # the worst test group of stage 2 (of ERM when stage 2 did not run)
    min_n: int
    confidence: float
    seeds: int | None = None  # runs behind the numbers (the compare page); None: one run (the report)


def _warning_first(f: Facts) -> str | None:
    if not f.warnings:
        return None
    where, message = f.warnings[0]
    more = f" (and {len(f.warnings) - 1} more)" if len(f.warnings) > 1 else ""
    return f"Read the warning `{warning_code(message)}` of {where} first{more}: [Warnings]({WARNINGS_LINK})."


def _no_bias_labels(f: Facts) -> str | None:
    if not isinstance(f.erm_worst, str) and not isinstance(f.s2_worst, str):
        return None
    return ("This data has no bias labels, so worst-group accuracy cannot be measured: compare worst-class accuracy "
            "and the accuracy per inferred group (Per-group accuracy), and add an attribute column to a sample of the "
            "data to measure the groups you suspect.")


def _no_stage2(f: Facts) -> str | None:
    if f.s2_worst is not None:
        return None
    return "Stage 2 has no test result: run `dvc repro` to the end (train_contrastive) before comparing with ERM."


def _small_worst_group(f: Facts) -> str | None:
    if not small(f.worst, f.min_n):
        return None
    g = f.worst
    return (f"The worst group ({group_name(g)}) has only n = {g.n} test images (< {f.min_n}): its "
            f"{100 * f.confidence:g} % interval {interval_text(g.low, g.high)} spans {100 * (g.high - g.low):.0f} points, "
            "so worst-group differences smaller than that are not evidence; test on more images or more seeds.")


def _stage2_not_better(f: Facts) -> str | None:
    if f.erm_worst is None or f.s2_worst > f.erm_worst:
        return None
    return (f"Stage 2 does not beat ERM on worst-group ({pct(f.s2_worst)} % against {pct(f.erm_worst)} %): check the "
            "inferred groups (group inference) and the training curves before tuning.")


def _gain(f: Facts) -> str:
    if f.erm_worst is None:
        return f"Stage 2's worst-group is {pct(f.s2_worst)} % (no ERM result to compare with)"
    return f"Stage 2 beats ERM on worst-group by {100 * (f.s2_worst - f.erm_worst):.1f} points"


def _too_few_seeds(f: Facts) -> str | None:
    if f.seeds is None:
        return f"{_gain(f)} on one run: check it holds over >= {QUALITY_SEEDS} seeds (`debias compare`)."
    if f.seeds < QUALITY_SEEDS:
        return f"{_gain(f)} (mean of {f.seeds} seed{'s' if f.seeds > 1 else ''}): run >= {QUALITY_SEEDS} seeds before claiming it."
    return None


def _settled(f: Facts) -> str | None:
    return f"{_gain(f)} over {f.seeds} seeds: the Welch tests below say against which groups the lead is real."


# Tried in order; the first that returns a line is the card's "next" line.
NEXT_STEPS: tuple[Callable[[Facts], str | None], ...] = (
    _warning_first, _no_bias_labels, _no_stage2, _small_worst_group, _stage2_not_better, _too_few_seeds, _settled,
)


def next_step(facts: Facts) -> str:
    """The one line saying what to look at next."""
    return next(line for rule in NEXT_STEPS if (line := rule(facts)) is not None)
