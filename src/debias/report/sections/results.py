"""The results section: one table of the test metrics, and the fairness block of binary tasks."""

from __future__ import annotations

from typing import Any

from debias.core.environment import KEY as ENVIRONMENT_KEY
from debias.core.environment import environment_differences
from debias.params import Params
from debias.report import card
from debias.report.card import pct
from debias.report.document import Block, Heading, Section, Table, Text, num
from debias.report.inputs import JSON_INPUTS, ReportInputs, missing_note, trained_entry
from debias.report.sections.base import ReportContext, ResultRow, result_cells

TITLE = "Results"
RESULT_HEADERS = ("", "average %", "unbiased %", "worst-group %", "worst group: y, a, n, interval", "aligned %",
                  "conflicting %", "alignment loss", "Î(Y;Z)", "Î(A;Z)")
FAIRNESS_HEADERS = ("", "average %", "equalized-odds diff.", "equalized-odds mean", "demographic-parity diff.",
                    "accuracy diff.", "TPR / FPR per a")


def results_section(rows: list[ResultRow], inputs: ReportInputs, summaries: dict[str, card.ModelSummary],
                    params: Params) -> Section:
    """The one results table (test split) and notes on what is missing or was skipped."""
    min_n = params.report.min_group_n
    cells = [result_cells(r, summaries[r.model].worst_group if not r.label.endswith("probe") else None, min_n)
             for r in rows]
    headers = list(RESULT_HEADERS)
    if not all(summary.bias_labels for summary in summaries.values()):  # no bias labels: worst-class beside them
        headers.append("worst-class %")
        cells = [row_cells + [pct((r.accuracy or {}).get("worst_class"))] for r, row_cells in zip(rows, cells)]
    blocks: list[Block] = [Table(headers, cells, caption=(
        "Test split. Accuracies in percent: average (sample-weighted), unbiased (mean over groups), worst-group (min "
        f"over non-empty groups; its group, test images n and {100 * params.report.confidence:g} % Wilson interval), "
        "bias-aligned and bias-conflicting. Alignment loss (CNC Eq. 2–3) and mutual information "
        "Î (CNC Eq. 16, nats) of the encoder's test representations; each probe shares its encoder's."))]
    representation = trained_entry(inputs.get("representation"), "erm") or {}
    test = representation.get("test") or {}
    if test:
        blocks.append(Text(f"For scale: H(Y) = {num(test.get('h_y'))} and H(A) = {num(test.get('h_a'))} nats on the test split."))
    for row in rows:
        if row.note:
            blocks.append(Text(f"{row.label}: {row.note}.", note=True))
    blocks += environment_notes(inputs)
    if inputs.get("representation") is None:
        blocks.append(missing_note(JSON_INPUTS["representation"], "the representation columns are n/a"))
    skipped = ((inputs.get("stage2_info") or {}).get("sampler") or {}).get("skipped_classes")
    if skipped:
        blocks.append(Text(f"Stage 2 skipped classes {skipped} as CNC anchors (no inferred minority point; "
                           f"see `{JSON_INPUTS['stage2_info']}`).", note=True))
    return Section(TITLE, blocks)


def environment_notes(inputs: ReportInputs) -> list[Block]:
    """A warning when ERM and stage 2 were trained under other threads, processes, device or torch build (their
    metrics files' ``environment``): their numbers side by side differ by that too."""
    lines = environment_differences({label: (inputs.get(name) or {}).get(ENVIRONMENT_KEY)
                                     for name, label in (("erm", "ERM"), ("stage2", "stage 2"))})
    if not lines:
        return []
    return [Text("WARNING ERM and stage 2 were trained under different settings that change numbers: "
                 + "; ".join(lines) + ".", note=True)]


def fairness_blocks(rows: list[ResultRow], inputs: ReportInputs) -> list[Block]:
    """The fairness block of binary tasks (test split): one row per results row that has it, plus each probe's
    equalized-odds post-processing; empty for tasks without it."""
    table = []
    for row in rows:
        fairness = (row.accuracy or {}).get("fairness")
        if not fairness:
            continue
        per_group = (((inputs.get(f"{row.model}_groups") or {}).get("test") or {}).get("fairness") or {}).get(
            "per_group") if not row.label.endswith("probe") else None
        per_group = per_group if isinstance(per_group, dict) else {}  # a str: needs bias labels (the reason says so)
        rates = " · ".join(f"a={a}: {pct(g.get('tpr'))} / {pct(g.get('fpr'))}" for a, g in per_group.items())
        table.append(_fairness_cells(row.label, row.accuracy, rates or fairness.get("reason") or "–"))
        post = (((trained_entry(inputs.get("probe"), row.model) or {}).get("probe") or {}).get("equalized_odds")
                or {}).get("test") if row.label.endswith("probe") else None
        if post and post.get("fairness"):
            table.append(_fairness_cells(f"{row.label} + equalized-odds post-processing", post, "–"))
    if not table:
        return []
    return [Heading("Fairness (binary task: sensitive attribute a)"), Table(list(FAIRNESS_HEADERS), table, caption=(
        "Test split, fairlearn's definitions: equalized-odds difference = the larger of the between-group ranges of "
        "TPR and FPR (Hardt et al.; the WCL paper's EOd, lower is better), its mean variant, demographic-parity "
        "difference (range of the selection rate) and the range of accuracy over a. TPR / FPR in percent."))]


def _fairness_cells(label: str, report: dict[str, Any], rates: str) -> list[str]:
    fairness = report["fairness"]
    return [label, pct(report.get("avg")), num(fairness.get("equalized_odds_difference")),
            num(fairness.get("equalized_odds_mean")), num(fairness.get("demographic_parity_difference")),
            num(fairness.get("accuracy_difference")), rates]


def section(context: ReportContext) -> Section:
    """The results table followed by the fairness block (empty for tasks without it)."""
    results = results_section(context.rows, context.inputs, context.summaries, context.params)
    results.blocks.extend(fairness_blocks(context.rows, context.inputs))
    return results
