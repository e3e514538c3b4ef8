"""The training-curves section: loss and validation accuracy per epoch, and FairKL's activity."""

from __future__ import annotations

from debias.core.errors import NEEDS_BIAS_LABELS
from debias.report.artifacts import FIGURE_FILES
from debias.report.card import pct
from debias.report.document import Block, Figure, Section, Table, Text
from debias.report.inputs import CURVE_INPUTS, ReportInputs, missing_note
from debias.report.sections.base import ReportContext

TITLE = "Training curves"


def curves_section(inputs: ReportInputs, labels: dict[str, str], drawn: dict[str, bool]) -> Section:
    """Training curves of ERM and stage 2."""
    blocks: list[Block] = []
    if drawn["curves"]:
        unlabelled = any("val/avg" in columns and "val/worst_group" not in columns for columns in inputs.curves.values())
        worst = (f"validation worst-group accuracy ({NEEDS_BIAS_LABELS}: not drawn) and average (dashed)" if unlabelled
                 else "validation worst-group (solid) and average (dashed)")
        blocks.append(Figure(FIGURE_FILES["curves"], f"Training loss and {worst} accuracy per epoch; the dotted line "
                                                     "marks the epoch each model kept."))
    for model, rel in CURVE_INPUTS.items():
        if model not in inputs.curves:
            blocks.append(missing_note(rel, f"the {labels[model]} curves are not drawn"))
    blocks.extend(fairkl_activity_blocks(inputs))
    return Section(TITLE, blocks)


FAIRKL_SET_NAMES = {"pos_aligned": "same y, same b", "pos_conflicting": "same y, other b",
                    "neg_aligned": "other y, same b", "neg_conflicting": "other y, other b"}


def fairkl_activity_blocks(inputs: ReportInputs) -> list[Block]:
    """FairKL's activity per epoch (stage2_train_info.json ``fairkl``): the share of steps each side was active and
    the mean pairs per batch in each of its four sets; nothing when stage 2 did not use FairKL."""
    activity = (inputs.get("stage2_info") or {}).get("fairkl")
    if not activity:
        return []
    epochs = activity["epochs"]
    explain = (f"FairKL activity (sampler `{activity['sampler']}`, batches of {activity['batch_size']}): a side (+: same "
               "class, −: different classes) contributes only in batches where both of its sets (same / other bias "
               "label b) hold at least two pairs")
    active = {(pct(e["pos_active"], 0), pct(e["neg_active"], 0)) for e in epochs}
    if len(epochs) > 1 and len(active) == 1:  # the activity never changes: one line, the pair counts summarised
        (pos, neg), = active

        def spread(name: str, label: str) -> str:
            values = [e["pairs"].get(name, 0) for e in epochs]
            return f"{label} {sum(values) / len(values):.1f} ({min(values):.1f}–{max(values):.1f})"

        pairs = ", ".join(spread(name, label) for name, label in FAIRKL_SET_NAMES.items())
        return [Text(f"{explain}. In every one of the {len(epochs)} epochs the + side was active in {pos} % and the "
                     f"− side in {neg} % of the steps; mean pairs per batch over the epochs (min–max): {pairs}.")]
    rows = [[str(e["epoch"]), pct(e["pos_active"], 0), pct(e["neg_active"], 0),
             *(f"{e['pairs'].get(name, 0):.1f}" for name in FAIRKL_SET_NAMES)] for e in epochs]
    return [Table(["epoch", "+ side active %", "− side active %", *FAIRKL_SET_NAMES.values()], rows, same_rows="epochs",
                  caption=f"{explain}; last four columns: mean pairs per batch.")]


def section(context: ReportContext) -> Section:
    """The training curves of this run's models."""
    return curves_section(context.inputs, context.labels, context.drawn)
