"""The group-inference section: the inferred groups against the true ones, their UMAP, and what they discovered
(per class, images of its largest and smallest inferred group with ERM's accuracy on each; :mod:`debias.report.montage`)."""

from __future__ import annotations

from debias.metrics import wilson_interval
from debias.report.artifacts import FIGURE_FILES
from debias.report.card import pct
from debias.report.card import interval_text
from debias.report.document import Block, Figure, Section, Table, Text, num
from debias.report.inputs import JSON_INPUTS, ReportInputs, missing_note
from debias.report.montage import group_caption, share_text, shown_groups
from debias.report.sections.base import ReportContext

TITLE = "Group inference"


def groups_section(inputs: ReportInputs, drawn: dict[str, bool], confidence: float = 0.95) -> Section:
    """Quality of the inferred groups, the UMAP of the training features when there is one, and the discovered
    groups (:func:`discovered_blocks`, intervals at ``confidence``)."""
    groups = inputs.get("groups")
    blocks: list[Block] = []
    if groups is None:
        blocks.append(missing_note(JSON_INPUTS["groups"], "group-inference quality is not shown"))
    else:
        blocks.append(Table(["method", "matched accuracy %", "NMI", "ARI", "minority recall %", "minority precision %",
                             "inferred minority", "true bias-conflicting", "found"],
                            [[f"`{groups.get('method')}`", pct(groups.get("matched_accuracy")), num(groups.get("nmi")),
                              num(groups.get("ari")), pct(groups.get("minority_recall")),
                              pct(groups.get("minority_precision")), str(groups.get("n_inferred_minority", "n/a")),
                              str(groups.get("n_true_conflicting", "n/a")), str(groups.get("n_found_conflicting", "n/a"))]],
                            caption="Inferred bias labels of the training split against the true ones (matched accuracy "
                                    "after the best one-to-one matching); minority = inferred bias-conflicting."))
        inferred, true = groups.get("inferred_minority_per_class"), groups.get("true_conflicting_per_class")
        if inferred and true:
            true_row = [true] * len(inferred) if isinstance(true, str) else [str(v) for v in true]  # str: no labels
            blocks.append(Table(["class", *(str(c) for c in range(len(inferred)))],
                                [["inferred minority", *(str(v) for v in inferred)],
                                 ["true bias-conflicting", *true_row]], caption="Per class"))
    if drawn["groups_umap"]:
        blocks.append(Figure(FIGURE_FILES["groups_umap"], "UMAP of the ERM training features used for group inference."))
    else:
        blocks.append(Text(f"No UMAP of the training features: {inputs.train_umap_note}.", note=True))
    blocks.extend(discovered_blocks(inputs, drawn.get("discovered", False), confidence))
    return Section(TITLE, blocks)


def discovered_blocks(inputs: ReportInputs, drawn: bool, confidence: float = 0.95) -> list[Block]:
    """The montage of the discovered groups and the table of every inferred group: its class, size, ERM's training
    accuracy on it with its Wilson interval at ``confidence``, and the true attribute's share where the data has one
    (otherwise said to need bias labels, never a number)."""
    summary = inputs.get("groups_summary")
    if not summary or not summary.get("groups"):
        return [missing_note(JSON_INPUTS["groups_summary"], "the discovered groups are not shown")]
    rows = summary["groups"]
    blocks: list[Block] = []
    if drawn:
        shown = "; ".join(group_caption(row) for row in shown_groups(rows))
        blocks.append(Figure(FIGURE_FILES["discovered"], "What the inferred groups captured: per class, training "
                             f"images of its largest and its smallest inferred group ({shown})."))
    table = []
    for row in rows:
        n, correct = int(row["n"]), int(row["erm_correct"])
        low, high = wilson_interval(correct, n, confidence)
        table.append([str(row["class"]), str(row["group"]), str(row.get("inferred_label", "n/a")), str(n),
                      f"{pct(row['erm_accuracy'])} {interval_text(low, high)}",
                      share_text(row.get("attribute_share"), top=3) or "n/a (needs bias labels)"])
    blocks.append(Table(["class", "inferred group", "inferred bias label", "n", "ERM training accuracy %",
                         "true attribute share"], table,
                        caption=f"Every inferred group of the training split (`{summary.get('method')}`), per class "
                                f"largest first; ERM's accuracy with its {confidence:.0%} Wilson interval. A small "
                                "group ERM gets wrong is the shortcut's exceptions; its attribute share names the "
                                "shortcut where the data has a bias attribute."))
    return blocks


def section(context: ReportContext) -> Section:
    """The quality of this run's inferred groups and what they discovered."""
    return groups_section(context.inputs, context.drawn, context.params.report.confidence)
