"""The representations section: UMAP of the test representations and their metrics per encoder."""

from __future__ import annotations

from debias.report.artifacts import FIGURE_FILES
from debias.report.document import Block, Figure, Section, Table, num
from debias.report.inputs import JSON_INPUTS, MODELS, ReportInputs, missing_note, trained_entry, umap_test_path
from debias.report.sections.base import ReportContext

TITLE = "Representations"


def representation_section(inputs: ReportInputs, labels: dict[str, str], drawn: dict[str, bool]) -> Section:
    """UMAP scatter plots and the representation metrics per encoder."""
    blocks: list[Block] = []
    if drawn["umap"]:
        blocks.append(Figure(FIGURE_FILES["umap"], "UMAP of the encoders' test representations (evaluate stage), "
                             "coloured by class (top) and by bias attribute (bottom, in the colours the bias protocol "
                             "paints where it has colours); ERM beside stage 2."))
    for model in MODELS:
        if model not in inputs.umaps:
            blocks.append(missing_note(umap_test_path(model), f"the {labels[model]} UMAP is not drawn"))
    rows = []
    for model in MODELS:
        test = (trained_entry(inputs.get("representation"), model) or {}).get("test")
        if not test:
            continue
        distances = test.get("distances") or {}
        kinds = ("pos_aligned", "pos_conflicting", "neg_aligned", "neg_conflicting")
        mi_a = (num(test.get("mi_a")) if isinstance(test.get("mi_a"), str)  # no bias labels: said once, not twice
                else f"{num(test.get('mi_a'))} / {num(test.get('h_a'))}")
        rows.append([labels[model], num(test.get("alignment_loss")), f"{num(test.get('mi_y'))} / {num(test.get('h_y'))}",
                     mi_a, *(distances if isinstance(distances, str) else num((distances.get(kind) or {}).get("mean"))
                             for kind in kinds)])
    if rows:
        blocks.append(Table(["encoder", "alignment loss", "Î(Y;Z) / H(Y)", "Î(A;Z) / H(A)", "same y, same a",
                             "same y, other a", "other y, same a", "other y, other a"], rows, caption=(
            "Test split. Last four columns: mean squared distance between L2-normalised representations per pair "
            "kind; a bias-free encoder puts same-class pairs close whatever their attribute.")))
    elif inputs.get("representation") is None:
        blocks.append(missing_note(JSON_INPUTS["representation"], "no representation metrics are shown"))
    return Section(TITLE, blocks)


def section(context: ReportContext) -> Section:
    """The representations of this run's encoders."""
    return representation_section(context.inputs, context.labels, context.drawn)
