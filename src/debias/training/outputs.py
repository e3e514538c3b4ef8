"""What every training stage writes and reads back: checkpoint, embeddings, metrics, curves (:func:`write_outputs`),
their health warnings, and the resume bookkeeping the stages share (:func:`split_tensors`, :func:`note_resume`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from debias.core import health
from debias.core.environment import KEY as ENVIRONMENT_KEY
from debias.core.environment import environment_tags, numbers_environment, trained_by_lines
from debias.core.io import CorruptFileError, atomic_path, load_torch, save_json, save_torch
from debias.core.paths import embeddings_path
from debias.core.stage_run import StageRun
from debias.data.store import BiasedSplit
from debias.metrics import accuracy_report, fairness_report, fairness_scalars, scalars, shown
from debias.models import Network, save_network
from debias.params import HealthParams
from debias.training.classifier import evaluate, predict
from debias.training.loop import FitResult


@dataclass(frozen=True)
class StageOutputs:
    """Where a training stage writes (paths dvc.yaml declares)."""

    model: Path
    embeddings_dir: Path
    metrics: Path
    curves: Path
    resume: Path



def write_curves(path: Path, history: list[dict[str, float]]) -> None:
    """Per-epoch history as CSV (DVC plots and the report read it)."""
    keys = sorted({key for row in history for key in row}, key=lambda k: (k != "epoch", k))
    lines = [",".join(keys)] + [",".join("" if row.get(k) is None else row[k] if isinstance(row[k], str)  # needs bias labels
                                         else f"{row[k]:.6g}" for k in keys) for row in history]
    with atomic_path(path) as tmp:
        tmp.write_text("\n".join(lines) + "\n")


def export_embeddings(model: nn.Module, splits: dict[str, BiasedSplit], directory: Path, batch_size: int,
                      device: torch.device, health: list[str] | None = None) -> dict[str, dict]:
    """Write ``embeddings_{split}.pt`` (z, logits) for every split; return each split's accuracy report.

    ``health`` (a list) receives the warnings of :func:`health_warnings` for the validation and test splits."""
    reports = {}
    for name, split in splits.items():
        z, logits = predict(model, split.x, batch_size, device)
        save_torch(embeddings_path(directory, name), {"z": z, "logits": logits}, kind="embeddings")
        reports[name] = accuracy_report(logits.argmax(1), split.y, split.a, split.aligned, split.n_classes, split.n_attrs)
        if split.n_classes == 2:  # binary tasks: equalized odds and friends (fairlearn) beside the accuracies
            reports[name]["fairness"] = fairness_report(logits.argmax(1), split.y, split.a, split.n_classes)
        if health is not None and name in HEALTH_SPLITS:
            health.extend(health_warnings(z, reports[name]["avg"], split, name, reports[name].get("aligned")))
    return reports


NOTES_TAG = "debias.notes"  # the MLflow tag of a stage's notes (its warnings: debias.warnings)
HEALTH_SPLITS = ("val", "test")  # the splits whose features and accuracy the health checks read


def health_warnings(z: torch.Tensor, accuracy: float, split: BiasedSplit, name: str,
                    aligned: float | None = None) -> list[str]:
    """``collapsed-representation`` and ``chance-level`` warnings for the selected model on one split (``aligned``:
    its accuracy on the split's bias-aligned samples, None without bias labels)."""
    shortcut = None
    if aligned is not None and split.aligned is not None and bool(split.aligned.bool().any()):
        shortcut = (aligned, health.chance_level(split.y[split.aligned.bool()], split.n_classes))
    found = [health.collapse_warning(z, f"the {name} split"),
             health.chance_warning(accuracy, health.chance_level(split.y, split.n_classes), f"{name} average",
                                   shortcut)]
    return [w for w in found if w is not None]


def metrics_entry(report: dict) -> dict:
    """A split's entry of a metrics JSON: the scalar accuracies, plus ``fairness`` (its scalar differences) for
    binary tasks; the per-group tables (accuracies, TPR/FPR and notes) go to the ``*_groups.json`` file."""
    entry: dict = scalars(report)
    if report.get("fairness") is not None:
        entry["fairness"] = fairness_scalars(report["fairness"])
        if report["fairness"].get("reason"):  # differences not computed (one attribute value): say why, not 0
            entry["fairness"]["reason"] = report["fairness"]["reason"]
    return entry


def groups_entry(report: dict) -> dict:
    """A split's entry of a ``*_groups.json`` file: per-group accuracies and counts (+ per-group fairness rates)."""
    entry = {k: report[k] for k in ("per_group", "group_counts", "empty_groups", "per_class", "class_counts")
             if k in report}  # per_class, class_counts: without bias labels
    if report.get("fairness") is not None:
        entry["fairness"] = {k: report["fairness"][k] for k in ("per_group", "notes")}
    return entry


def load_embeddings(directory: Path, split: str) -> dict[str, torch.Tensor]:
    """``{"z", "logits"}`` of a split; non-finite values (a diverged model) are refused, naming the file."""
    path = embeddings_path(directory, split)
    payload = load_torch(path, "embeddings", ("z", "logits"))
    for key in ("z", "logits"):
        if not bool(torch.isfinite(payload[key]).all()):
            raise CorruptFileError(f"{path}: {key} holds NaN or infinite values (the model that wrote it diverged); "
                                   "rerun the stage that writes it with a lower learning rate")
    return payload


def selection_warnings(result: FitResult) -> list[str]:
    """A ``degenerate-selection`` warning when the selection had nothing to choose by, a ``first-epoch-kept`` line
    when it kept the first of several epochs, a ``fragile-selection`` one when one or two validation images decided
    it (see ``describe_selection``)."""
    if result.selection.get("degenerate"):
        code = "first-epoch-kept" if result.selection.get("first_epoch") else "degenerate-selection"
        return [health.warning(code, result.selection["reason"])]
    if result.selection.get("fragile"):
        return [health.warning("fragile-selection", fragile_text(result.selected_epoch, result.selection))]
    return []


def fragile_text(epoch: int, selection: dict) -> str:
    """Why a fragile selection is fragile: a tie decided by the tie-breaks, or a lead of one or two images."""
    won = selection.get("won_by_images")
    how = (f"was kept by {won} validation image{'s' if won != 1 else ''} of its {selection.get('unit', 'worst group')}"
           if won else "tied another epoch and was kept by the tie-breaks")
    return (f"epoch {epoch} {how}: {selection['reason']}; a lead that small is noise at this validation size, so the "
            f"kept epoch is not shown to be better than the others ({FRAGILE_UNMEASURED})")


# What the warning-value study could say of fragile-selection (benchmarks/results/warning_value.md, its row): said in
# the warning, which stays one because its effect on the numbers was not measured.
FRAGILE_UNMEASURED = ("whether such runs test worse is not measured: no setting avoids this on the same cell, "
                      "benchmarks/results/warning_value.md")


def resumed_environment_warnings(result: FitResult) -> list[str]:
    """A ``mixed-environment`` warning when the processes that trained a resumed run differ in what shapes the numbers
    (thread count, CPU kernels, device, torch): the run is none of them alone (``trained_by`` lists each)."""
    lines = trained_by_lines(result.trained_by)
    if not lines:
        return []
    return [health.warning("mixed-environment", "this run resumed an interrupted one under other settings, so its "
                           "numbers are neither's: " + "; ".join(lines) + " (rerun it whole to compare it with others)")]


def instability_warnings(result: FitResult, thresholds: HealthParams) -> list[str]:
    """An ``unstable-training`` warning when the per-epoch training loss spiked or ended high (``health.*``)."""
    found = health.instability_warning([row["train/loss"] for row in result.history if "train/loss" in row],
                                       thresholds.loss_spike, thresholds.loss_end, thresholds.loss_min_fall)
    return [] if found is None else [found]


def selected_metrics(result: FitResult) -> dict[str, float]:
    """The selected epoch's validation metrics under their own MLflow keys (``val/worst_group`` ->
    ``selected.val.worst_group``), beside the per-epoch series whose last value is the last epoch's."""
    row = next(row for row in result.history if int(row["epoch"]) == result.selected_epoch)
    return {f"selected.{key.replace('/', '.')}": value for key, value in row.items() if key.startswith("val/")}


def kept_model_metrics(result: FitResult, reports: dict[str, dict]) -> dict[str, float | str]:
    """The kept model's accuracies on every split as MLflow metrics, one value per key: ``<split>.<metric>``
    (``test.worst_group``), except where a per-epoch series has that key (``val.worst_group``: step = epoch), which
    the selected epoch's value goes under ``selected.<split>.<metric>`` instead (:func:`selected_metrics`, the
    validation row the selection read, taking precedence), so no series gets a second point at step 0."""
    series = {key.replace("/", ".") for row in result.history for key in row}
    found: dict[str, float | str] = {}
    for split, report in reports.items():
        values = {f"{split}.{key}": value for key, value in scalars(report).items()}
        values.update({f"{split}.fairness.{key}": value for key, value in fairness_scalars(report["fairness"]).items()}
                      if report.get("fairness") else {})
        found.update({(f"selected.{key}" if key in series else key): value for key, value in values.items()})
    return {**found, **selected_metrics(result)}


PICK_TEST_KEYS = ("avg", "worst_group", "unbiased", "worst_class")  # what the selection block says of each rule's pick


def rule_test_reports(model: Network, result: FitResult, test: BiasedSplit, batch_size: int,
                      device: torch.device) -> dict[int, dict]:
    """Epoch -> test accuracy report of the model every other selection rule would have kept (``result.pick_states``;
    the selected epoch's report is the stage's own). Read only to compare the rules: the stage keeps its own rule's."""
    reports = {}
    for epoch, state in sorted(result.pick_states.items()):
        model.load_state_dict(state["model"])
        reports[epoch] = evaluate(model, test, batch_size, device)
    return reports


def picks_test(picks: dict[str, int], reports: dict[int, dict]) -> dict[str, dict]:
    """Rule -> ``{"epoch", "avg", "worst_group", "unbiased"}`` on test for each rule's pick whose model was kept, and
    ``worst_class`` where the report has it (data without bias labels); a number the data cannot give, e.g.
    worst-group without bias labels, is its marker, never 0."""
    return {rule: {"epoch": epoch, **{key: reports[epoch][key] for key in PICK_TEST_KEYS if key in reports[epoch]}}
            for rule, epoch in picks.items() if epoch in reports}


def write_outputs(model: Network, model_name: str, result: FitResult, splits: dict[str, BiasedSplit], run: StageRun,
                  out: "StageOutputs", eval_batch_size: int, device: torch.device, label: str,
                  extra_metrics: dict | None = None, meta: dict | None = None,
                  warnings: list[str] | None = None, thresholds: HealthParams | None = None) -> dict[str, dict]:
    """Load the selected weights and write a training stage's outputs: checkpoint, embeddings, metrics (with the
    ``selection`` block, the ``environment`` the numbers were made under (:mod:`debias.core.environment`; also MLflow
    tags) and the ``warnings``: ``warnings`` given by the method, then the selection's, the loss
    curve's (``thresholds``: params ``health``) and the health checks', less the notes, which go to ``notes``
    (:func:`debias.core.health.split_notes`)), curves; print each warning and note and log them to MLflow (tags
    ``debias.warnings`` and ``debias.notes``)."""
    picked = rule_test_reports(model, result, splits["test"], eval_batch_size, device)
    model.load_state_dict(result.selected_state["model"])
    lines = (list(warnings or []) + selection_warnings(result)
             + instability_warnings(result, thresholds or HealthParams()) + resumed_environment_warnings(result))
    reports = export_embeddings(model, splits, out.embeddings_dir, eval_batch_size, device, health=lines)
    found, notes = health.split_notes(lines)
    picked[result.selected_epoch] = reports["test"]
    result.selection["picks_test"] = picks_test(result.selection.get("picks", {}), picked)
    environment = numbers_environment(device)  # what shapes the numbers besides the params
    metrics = {"selected_epoch": result.selected_epoch, **(extra_metrics or {}), "selection": result.selection,
               "warnings": found, "notes": notes, ENVIRONMENT_KEY: environment, "trained_by": result.trained_by}
    metrics.update({split: metrics_entry(report) for split, report in reports.items()})
    save_json(out.metrics, metrics)
    save_json(out.metrics.with_name(f"{out.metrics.stem}_groups.json"),
              {split: groups_entry(report) for split, report in reports.items()})
    write_curves(out.curves, result.history)
    input_shape = tuple(splits["train"].x.shape[1:])
    save_network(str(out.model), model, model_name, splits["train"].n_classes, input_shape,
                 selected_epoch=result.selected_epoch, **(meta or {}))
    run.log_metrics({"selected_epoch": result.selected_epoch, **kept_model_metrics(result, reports)})
    run.log_metrics({f"selection.picks.{rule}": float(epoch) for rule, epoch in result.selection.get("picks", {}).items()})
    run.log_metrics({f"selection.picks_test.{rule}.{key}": value for rule, row in result.selection["picks_test"].items()
                     for key, value in row.items() if key != "epoch" and isinstance(value, float)})
    run.log_warnings(found)
    if notes:
        run.set_tags({NOTES_TAG: "\n".join(notes)[:5000]})
    run.set_tags(environment_tags(environment))
    for path in (out.metrics, out.curves):
        run.log_artifact(path)
    run.log_model(model.cpu(), checkpoint=out.model, input_example=splits["train"].x[:2])  # an MLflow logged model
    test = reports["test"]
    print(f"[{label}] selected epoch {result.selected_epoch} ({result.selection.get('reason', '')}); test avg "
          f"{test['avg']:.3f}, worst-group {shown(test['worst_group'])}, unbiased {shown(test['unbiased'])}"
          + (f", worst-class {test['worst_class']:.3f}" if "worst_class" in test else ""))
    for message in found:
        print(f"[{label}] WARNING {message}", flush=True)
    for message in notes:
        print(f"[{label}] note {message}", flush=True)
    return reports


def split_tensors(splits: dict[str, BiasedSplit], names: tuple[str, ...] = ("train", "val")) -> dict[str, torch.Tensor]:
    """The tensors training reads from ``splits`` (images, classes, attributes), named ``split.field``."""
    return {f"{name}.{field}": getattr(splits[name], field) for name in names if name in splits
            for field in ("x", "y", "a") if getattr(splits[name], field) is not None}  # a: None without bias labels


def note_resume(run: StageRun, result: FitResult) -> None:
    """Record in the run's metadata (MLflow tag, run record) that training resumed an interrupted run."""
    if result.resumed_from is not None:
        run.note("resumed_from_epoch", result.resumed_from)
