"""What every report section is built from (:class:`ReportContext`) and the results rows several sections share."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from debias.core.errors import NEEDS_BIAS_LABELS
from debias.metrics import GroupAccuracy
from debias.params import Params
from debias.report import card
from debias.report.card import pct
from debias.report.document import num
from debias.report.inputs import JSON_INPUTS, MODELS, ReportInputs, trained_entry

ACCURACY_KEYS = ("avg", "unbiased", "worst_group", "aligned", "conflicting")


@dataclass(frozen=True)
class ResultRow:
    """One row of the results table: test accuracies and the encoder's representation metrics."""

    label: str
    model: str
    accuracy: dict[str, Any] | None
    representation: dict[str, Any] | None
    note: str | None = None


def result_rows(inputs: ReportInputs, labels: dict[str, str]) -> list[ResultRow]:
    """ERM, stage 2 and the two linear probes on the test split; probes share their encoder's representation."""
    rows = []
    for model in MODELS:
        rep_entry = trained_entry(inputs.get("representation"), model)
        representation = (rep_entry or {}).get("test")
        metrics = inputs.get(model)
        accuracy = (metrics or {}).get("test")
        note = None if accuracy else f"`{JSON_INPUTS[model]}` not found"
        rows.append(ResultRow(labels[model], model, accuracy, representation, note))
    for model in MODELS:
        probe_entry = trained_entry(inputs.get("probe"), model)
        representation = ((trained_entry(inputs.get("representation"), model) or {}).get("test"))
        accuracy = ((probe_entry or {}).get("probe") or {}).get("test")
        if inputs.get("probe") is None:
            note = f"`{JSON_INPUTS['probe']}` not found"
        else:
            note = None if accuracy else ((inputs.get("probe").get(model) or {}).get("note") or "not trained")
        rows.append(ResultRow(f"{'ERM' if model == 'erm' else 'stage-2'} linear probe", model, accuracy,
                              representation, note))
    return rows


def worst_cell(group: GroupAccuracy | None, min_n: int) -> str:
    """'y=3, a=1 · n = 13 (< 30) · [17.7, 64.5]', or '–' without a per-group table."""
    if group is None:
        return "–"
    flag = f" (< {min_n})" if group.n < min_n else ""
    return f"{card.group_name(group)} · n = {group.n}{flag} · {card.interval_text(group.low, group.high)}"


def result_cells(row: ResultRow, worst: GroupAccuracy | None = None, min_n: int = 0) -> list[str]:
    """The formatted cells of a results row (n/a where a value is missing); ``worst``: its worst test group."""
    accuracy = row.accuracy or {}
    representation = row.representation or {}
    worst_text = NEEDS_BIAS_LABELS if isinstance(accuracy.get("worst_group"), str) else worst_cell(worst, min_n)
    return [row.label, *(pct(accuracy.get(k)) for k in ACCURACY_KEYS[:3]), worst_text,
            *(pct(accuracy.get(k)) for k in ACCURACY_KEYS[3:]), num(representation.get("alignment_loss")),
            num(representation.get("mi_y")), num(representation.get("mi_a"))]


def model_summaries(inputs: ReportInputs, labels: dict[str, str], confidence: float) -> dict[str, card.ModelSummary]:
    """ERM's and stage 2's test results with their per-group intervals (missing files give empty summaries)."""
    train_counts = card.train_group_counts(inputs.get("summary"))
    return {model: card.model_summary(labels[model], (inputs.get(model) or {}).get("test"),
                                      (inputs.get(f"{model}_groups") or {}).get("test"), confidence, train_counts)
            for model in MODELS}


@dataclass(frozen=True)
class ReportContext:
    """What a section is built from: the inputs, the run's params, the workspace root, the report stage's MLflow run
    id, the models' labels, which figures were drawn, and the results rows and per-model summaries (computed once)."""

    inputs: ReportInputs
    params: Params
    root: Path
    run_id: str | None
    labels: dict[str, str]
    drawn: dict[str, bool]
    rows: list[ResultRow]
    summaries: dict[str, card.ModelSummary]
