"""The dataset section: split sizes and correlations, group counts per split, the sample grid."""

from __future__ import annotations

from pathlib import Path

from debias.core import paths
from debias.core.errors import NEEDS_BIAS_LABELS
from debias.params import Params
from debias.report.document import Block, Columns, Figure, Heading, Section, Table, Text, num
from debias.report.inputs import ReportInputs, missing_note
from debias.report.sections.base import ReportContext

TITLE = "Dataset"


def label_free_blocks(summary: dict, params: Params) -> list[Block]:
    """Data without bias labels: split sizes and images per class; the attribute's counts say they need them."""
    return [Text(f"Source `{params.data.source}`, bias protocol `{summary['protocol']}`: the data has no bias labels "
                 "(no attribute column); groups are inferred from the ERM model (groups.method = "
                 f"{params.groups.method})."),
            Table(["split", "images", "classes", "images per class", "bias-aligned / conflicting, group counts"],
                  [[name, str(s["n"]), str(s["n_classes"]), " / ".join(map(str, s["class_counts"])), NEEDS_BIAS_LABELS]
                   for name, s in summary["splits"].items()])]


def dataset_section(inputs: ReportInputs, params: Params, root: Path) -> Section:
    """Split sizes and correlations, group counts per split and the sample grid."""
    summary = inputs.get("summary")
    blocks: list[Block] = []
    if summary is None:
        blocks.append(missing_note(paths.BIAS_SUMMARY, "the group counts are not shown"))
    elif any(s.get("bias_labels") is False for s in summary["splits"].values()):
        blocks.extend(label_free_blocks(summary, params))
    else:
        target = summary.get("target_correlation", {})
        blocks.append(Text(f"Source `{params.data.source}`, bias protocol `{summary['protocol']}`. Realised correlation "
                           "is the fraction of bias-aligned images."))
        blocks.append(Table(
            ["split", "images", "classes × attributes", "bias-aligned", "bias-conflicting", "target correlation",
             "realised correlation", "empty groups"],
            [[name, str(s["n"]), f"{s['n_classes']} × {s['n_attrs']}", str(s["n_aligned"]), str(s["n_conflicting"]),
              num(target.get(name)), num(s["realised_correlation"]), str(s["empty_groups"])]
             for name, s in summary["splits"].items()]))
        blocks.append(Heading("Group counts per split (rows: class y, columns: bias attribute a)"))
        blocks.append(Columns([
            Table(["y \\ a", *(str(a) for a in range(s["n_attrs"]))],
                  [[str(label), *(str(c) for c in row)] for label, row in enumerate(s["group_counts"])], caption=name)
            for name, s in summary["splits"].items()]))
    if inputs.sample_grid is not None:
        tabular = (summary or {}).get("modality") == "tabular"
        blocks.append(Figure(paths.SAMPLE_GRID, (
            "Training features: each feature's mean per (class y, bias attribute a), standardised; the features whose "
            "group means differ most." if tabular else
            "Training images per (class y, bias attribute a); blank where a group is empty." if params.bias_labels else
            "Training images per class y (no bias attribute to sort them by).")))
    else:
        blocks.append(missing_note(paths.SAMPLE_GRID, "the sample grid is not shown"))
    return Section(TITLE, blocks)


def section(context: ReportContext) -> Section:
    """This run's data."""
    return dataset_section(context.inputs, context.params, context.root)
