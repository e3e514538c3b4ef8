"""The group-inference section: the inferred groups against the true ones, and their UMAP."""

from __future__ import annotations

from debias.report.artifacts import FIGURE_FILES
from debias.report.card import pct
from debias.report.document import Block, Figure, Section, Table, Text, num
from debias.report.inputs import JSON_INPUTS, ReportInputs, missing_note
from debias.report.sections.base import ReportContext

TITLE = "Group inference"


def groups_section(inputs: ReportInputs, drawn: dict[str, bool]) -> Section:
    """Quality of the inferred groups and the UMAP of the training features when there is one."""
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
    return Section(TITLE, blocks)


def section(context: ReportContext) -> Section:
    """The quality of this run's inferred groups."""
    return groups_section(context.inputs, context.drawn)
