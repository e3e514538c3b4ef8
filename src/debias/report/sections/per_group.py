"""The per-group accuracy section: heatmaps and every test group's accuracy with its interval."""

from __future__ import annotations

from debias.metrics import GroupAccuracy
from debias.params import Params
from debias.report import card
from debias.report.artifacts import FIGURE_FILES, PER_GROUP_CSV
from debias.report.document import Block, Figure, Section, Table
from debias.report.inputs import JSON_INPUTS, MODELS, ReportInputs, missing_note
from debias.report.sections.base import ReportContext

TITLE = "Per-group accuracy"


def interval_rows(summaries: dict[str, card.ModelSummary], min_n: int) -> list[list[str]]:
    """One row per non-empty test group: n and each model's accuracy with its interval; lowest stage-2 accuracy
    first (ERM's when stage 2 did not run); groups under ``min_n`` images are marked."""
    by_model = {m: {(g.y, g.a): g for g in s.groups} for m, s in summaries.items()}
    order = "stage2" if by_model["stage2"] else "erm"
    cells = sorted(by_model[order].values(), key=lambda g: (g.accuracy, g.y, g.a))

    def cell(group: GroupAccuracy | None) -> str:
        return "n/a" if group is None else f"{card.pct(group.accuracy)} {card.interval_text(group.low, group.high)}"

    return [[str(g.y), str(g.a), f"{g.n}" + (f" (< {min_n})" if g.n < min_n else ""),
             *(cell(by_model[m].get((g.y, g.a))) for m in MODELS)] for g in cells]


def per_group_section(inputs: ReportInputs, labels: dict[str, str], drawn: dict[str, bool],
                      summaries: dict[str, card.ModelSummary], params: Params) -> Section:
    """The per-group accuracy heatmaps of ERM and stage 2, and every group's accuracy with its interval and n."""
    blocks: list[Block] = []
    if drawn["per_group"]:
        blocks.append(Figure(FIGURE_FILES["per_group"], (
            "Test accuracy (%) per (class y, bias attribute a); hatched: no test image in the group (not 0); red box: "
            "the bias-aligned attribute of each class (most frequent in training). Also as CSV: "
            + ", ".join(str(p) for p in PER_GROUP_CSV.values()) + ".")))
    for model, name in (("erm", "erm_groups"), ("stage2", "stage2_groups")):
        if inputs.get(name) is None:
            blocks.append(missing_note(JSON_INPUTS[name], f"the {labels[model]} panel is not drawn"))
    rows = interval_rows(summaries, params.report.min_group_n)
    if rows:
        level = f"{100 * params.report.confidence:g} %"
        blocks.append(Table(["y", "a", "test images n", *(f"{labels[m]} % [{level}]" for m in MODELS)], rows, caption=(
            f"Every non-empty test group, lowest first: accuracy with its {level} Wilson interval; n under "
            f"{params.report.min_group_n} is marked. Also in the per-group CSVs (columns low, high).")))
    return Section(TITLE, blocks)


def section(context: ReportContext) -> Section:
    """The per-group accuracy of this run's models."""
    return per_group_section(context.inputs, context.labels, context.drawn, context.summaries, context.params)
