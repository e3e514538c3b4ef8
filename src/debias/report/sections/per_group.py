"""The per-group accuracy section: heatmaps and every test group's accuracy with its interval."""

from __future__ import annotations

from debias.core.errors import NEEDS_BIAS_LABELS
from debias.metrics import GroupAccuracy, wilson_interval
from debias.params import Params
from debias.report import card
from debias.report.artifacts import FIGURE_FILES, PER_GROUP_CSV
from debias.report.document import Block, Figure, Section, Table, Text
from debias.report.inputs import JSON_INPUTS, MODELS, ReportInputs, missing_note
from debias.report.sections.base import ReportContext

TITLE = "Per-group accuracy"


def train_counts_known(summaries: dict[str, card.ModelSummary]) -> bool:
    """Whether the groups carry their training images (the bias summary was there to give them)."""
    return any(g.train_n is not None for s in summaries.values() for g in s.groups)


def train_cell(group: GroupAccuracy) -> str:
    """'0 (no training image)', '17' or 'n/a': the group's training images."""
    if group.train_n is None:
        return "n/a"
    return f"{group.train_n}" + (f" ({card.NO_TRAINING_IMAGE})" if group.train_n == 0 else "")


def interval_rows(summaries: dict[str, card.ModelSummary], min_n: int) -> list[list[str]]:
    """One row per non-empty test group: its test images n (and training images where known: a group without
    one says so) and each model's accuracy with its interval; lowest stage-2 accuracy first (ERM's when stage 2 did
    not run); groups under ``min_n`` test images are marked."""
    by_model = {m: {(g.y, g.a): g for g in s.groups} for m, s in summaries.items()}
    order = "stage2" if by_model["stage2"] else "erm"
    cells = sorted(by_model[order].values(), key=lambda g: (g.accuracy, g.y, g.a))
    train = train_counts_known(summaries)

    def cell(group: GroupAccuracy | None) -> str:
        return "n/a" if group is None else f"{card.pct(group.accuracy)} {card.interval_text(group.low, group.high)}"

    return [[str(g.y), str(g.a), f"{g.n}" + (f" (< {min_n})" if g.n < min_n else ""), *([train_cell(g)] if train else []),
             *(cell(by_model[m].get((g.y, g.a))) for m in MODELS)] for g in cells]


def class_rows(inputs: ReportInputs, confidence: float) -> list[list[str]]:
    """One row per class: its test images n and each model's test accuracy with its Wilson interval."""
    tables = {m: ((inputs.get(f"{m}_groups") or {}).get("test") or {}) for m in MODELS}
    known = next((t for t in tables.values() if t.get("class_counts")), None)
    if known is None:
        return []

    def cell(table: dict, label: int) -> str:
        value, n = (table.get("per_class") or [None] * (label + 1))[label], (table.get("class_counts") or [0] * (label + 1))[label]
        if value is None or not n:
            return "n/a"
        return f"{card.pct(value)} {card.interval_text(*wilson_interval(round(value * n), n, confidence))}"

    return [[str(label), str(n), *(cell(tables[m], label) for m in MODELS)] for label, n in enumerate(known["class_counts"])]


def inferred_group_rows(groups: dict | None, confidence: float) -> list[list[str]]:
    """One row per (class, inferred group) of the training split: its size n and ERM's accuracy with its interval."""
    rows = []
    for row in (groups or {}).get("inferred_groups") or []:
        accuracy = "n/a"
        if row.get("correct") is not None:
            low, high = wilson_interval(row["correct"], row["n"], confidence)
            accuracy = f"{card.pct(row['correct'] / row['n'])} {card.interval_text(low, high)}"
        rows.append([str(row["y"]), str(row["group"]), str(row["n"]), accuracy])
    return rows


def label_free_blocks(inputs: ReportInputs, labels: dict[str, str], params: Params) -> list[Block]:
    """What replaces the per-group tables when the data has no bias labels: a line saying so, the per-class test
    accuracies and ERM's training accuracy per inferred group, each with n and its Wilson interval."""
    level = f"{100 * params.report.confidence:g} %"
    blocks: list[Block] = [Text(
        f"Accuracy per group (class y, bias attribute a) {NEEDS_BIAS_LABELS}: this data has none. Shown instead: "
        "accuracy per class, and per group the pipeline inferred (groups.method = "
        f"{params.groups.method}).")]
    rows = class_rows(inputs, params.report.confidence)
    if rows:
        blocks.append(Table(["y", "test images n", *(f"{labels[m]} % [{level}]" for m in MODELS)], rows, caption=(
            f"Test accuracy per class with its {level} Wilson interval; the lowest is the worst-class accuracy.")))
    rows = inferred_group_rows(inputs.get("groups"), params.report.confidence)
    if rows:
        blocks.append(Table(["y", "inferred group", "training images n", f"{labels['erm']} % [{level}]"], rows, caption=(
            f"The inferred groups of the training split: their sizes and ERM's training accuracy on each with its "
            f"{level} Wilson interval (a low one is a group ERM's shortcut fails).")))
    return blocks


def per_group_section(inputs: ReportInputs, labels: dict[str, str], drawn: dict[str, bool],
                      summaries: dict[str, card.ModelSummary], params: Params) -> Section:
    """The per-group accuracy heatmaps of ERM and stage 2, and every group's accuracy with its interval and n
    (without bias labels: :func:`label_free_blocks`)."""
    if not all(summary.bias_labels for summary in summaries.values()):
        return Section(TITLE, label_free_blocks(inputs, labels, params))
    blocks: list[Block] = []
    if drawn["per_group"]:
        blocks.append(Figure(FIGURE_FILES["per_group"], (
            "Test accuracy (%) per (class y, bias attribute a); hatched: no test image in the group (not 0); red box: "
            "the bias-aligned attribute of each class (most frequent in training); orange cross: no training image in the "
            "group (the model never saw that combination). Also as CSV: "
            + ", ".join(str(p) for p in PER_GROUP_CSV.values()) + ".")))
    for model, name in (("erm", "erm_groups"), ("stage2", "stage2_groups")):
        if inputs.get(name) is None:
            blocks.append(missing_note(JSON_INPUTS[name], f"the {labels[model]} panel is not drawn"))
    rows = interval_rows(summaries, params.report.min_group_n)
    if rows:
        level = f"{100 * params.report.confidence:g} %"
        train = train_counts_known(summaries)
        blocks.append(Table(["y", "a", "test images n", *(["training images n"] if train else []),
                             *(f"{labels[m]} % [{level}]" for m in MODELS)], rows, caption=(
            f"Every non-empty test group, lowest first: accuracy with its {level} Wilson interval; test n under "
            f"{params.report.min_group_n} is marked" + (", and so is a group without a training image (the models never "
                                                        "saw that combination)" if train else "")
            + ". Also in the per-group CSVs (columns low, high).")))
    return Section(TITLE, blocks)


def section(context: ReportContext) -> Section:
    """The per-group accuracy of this run's models."""
    return per_group_section(context.inputs, context.labels, context.drawn, context.summaries, context.params)
