"""Cross-entropy training of a classifier on in-memory tensors (ERM; JTT reuses it with a pool).

Batches are index tensors into the stored uint8 images, shuffled by a seeded generator;
``pool`` lists the indices one epoch visits (ERM: every index once; JTT: errors repeated).
Under ``torchrun`` every rank draws and augments the same global batch, forwards its shard and
gathers the logits, so the loss is the global batch's mean cross-entropy (see
:mod:`debias.distributed`); only rank 0 writes outputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from debias import distributed, health
from debias.data.augment import random_shift
from debias.data.store import BiasedSplit
from debias.io import CorruptFileError, atomic_path, load_torch, save_json, save_torch
from debias.metrics import accuracy_report, fairness_report, fairness_scalars, scalars
from debias.models import Network, build_model, save_network
from debias.params import HealthParams, ModelParams, OptimParams
from debias.paths import embeddings_path
from debias.runtime import pick_device, seed_everything
from debias.tracking import StageRun
from debias.training.loop import (FitResult, GeneratorTask, StepMetrics, build_optimizer, build_scheduler, finish, fit,
                                  on_device, resume_key, to_device)
from debias.training.memory import check_classifier_fits


@torch.no_grad()
def predict(model: nn.Module, x: torch.Tensor, batch_size: int, device: torch.device,
            keep_on_device: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Encoder outputs and logits for every image, in eval mode, on CPU (on ``device``: ``keep_on_device``):
    ``(z [N,D], logits [N,C])``."""
    was_training = model.training
    model.eval()
    zs, logits = [], []
    for start in range(0, len(x), batch_size):
        z, out = model.embed_and_classify(x[start : start + batch_size].to(device, non_blocking=True))
        zs.append(z.to(torch.get_default_dtype()))  # float32 (from bf16 too), float64 in float64 tests
        logits.append(out.to(torch.get_default_dtype()))
        if not keep_on_device:
            zs[-1], logits[-1] = zs[-1].cpu(), logits[-1].cpu()
    model.train(was_training)
    return torch.cat(zs), torch.cat(logits)


def evaluate(model: nn.Module, split: BiasedSplit, batch_size: int, device: torch.device) -> dict:
    """The accuracy report of ``model`` on ``split``."""
    _, logits = predict(model, split.x, batch_size, device)
    return accuracy_report(logits.argmax(1), split.y, split.a, split.aligned, split.n_classes, split.n_attrs)


def validator(model: nn.Module, split: BiasedSplit, batch_size: int, device: torch.device):
    """A ``fit`` validation callback: scalar accuracies prefixed ``val/``."""
    return lambda: scalars(evaluate(model, split, batch_size, device), "val/")


class ClassifierTask(GeneratorTask):
    """One epoch = the shuffled ``pool`` in minibatches, cross-entropy, one optimizer step per batch."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, train: BiasedSplit, batch_size: int,
                 generator: torch.Generator, device: torch.device, pool: torch.Tensor | None = None,
                 progress: bool = True, augment_shift: int = 0) -> None:
        self.model, self.optimizer, self.train = model, optimizer, train
        self.batch_size, self.generator, self.device = batch_size, generator, device
        self.augment_shift = augment_shift
        self.pool = torch.arange(len(train)) if pool is None else pool
        self.train = on_device(train, device)  # batches are gathered by index on the device
        self.progress = progress

    def train_epoch(self, epoch: int) -> dict[str, float]:
        order = self.pool[torch.randperm(len(self.pool), generator=self.generator)]
        metrics = StepMetrics()  # loss and correct predictions summed on the device, read once at the epoch's end
        seen = 0
        batches = order.to(self.train.x.device, non_blocking=True).split(self.batch_size)  # one copy to the data
        bar = tqdm(batches, desc=f"epoch {epoch}", leave=False,
                   disable=None if self.progress and distributed.is_main() else True)
        for step, index in enumerate(bar):
            x = random_shift(self.train.x[index], self.augment_shift, self.generator)  # the global batch
            x = to_device(x[distributed.shard_slice(len(index))], self.device)
            y = to_device(self.train.y[index], self.device)
            logits = distributed.all_gather_rows(self.model(x), len(index))
            loss = F.cross_entropy(logits, y)
            metrics.watch(loss, step)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            distributed.sum_gradients(self.optimizer)
            self.optimizer.step()
            metrics.add(loss=loss.detach() * len(index), correct=(logits.argmax(1) == y).sum())
            seen += len(index)
        totals = metrics.read()
        bar.set_postfix(loss=f"{totals['loss'] / seen:.4f}", acc=f"{totals['correct'] / seen:.3f}", refresh=False)
        return {"train/loss": totals["loss"] / seen, "train/acc": totals["correct"] / seen}


def write_curves(path: Path, history: list[dict[str, float]]) -> None:
    """Per-epoch history as CSV (DVC plots and the report read it)."""
    keys = sorted({key for row in history for key in row}, key=lambda k: (k != "epoch", k))
    lines = [",".join(keys)] + [",".join("" if row.get(k) is None else f"{row[k]:.6g}" for k in keys) for row in history]
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
            health.extend(health_warnings(z, reports[name]["avg"], split, name))
    return reports


HEALTH_SPLITS = ("val", "test")  # the splits whose features and accuracy the health checks read


def health_warnings(z: torch.Tensor, accuracy: float, split: BiasedSplit, name: str) -> list[str]:
    """``collapsed-representation`` and ``chance-level`` warnings for the selected model on one split."""
    found = [health.collapse_warning(z, f"the {name} split"),
             health.chance_warning(accuracy, health.chance_level(split.y, split.n_classes), f"{name} average")]
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
    entry = {k: report[k] for k in ("per_group", "group_counts", "empty_groups")}
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
    """A ``degenerate-selection`` warning when the selection had nothing to choose by (see ``describe_selection``)."""
    if result.selection.get("degenerate"):
        return [health.warning("degenerate-selection", result.selection["reason"])]
    return []


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


def write_outputs(model: Network, model_name: str, result: FitResult, splits: dict[str, BiasedSplit], run: StageRun,
                  out: "StageOutputs", eval_batch_size: int, device: torch.device, label: str,
                  extra_metrics: dict | None = None, meta: dict | None = None,
                  warnings: list[str] | None = None, thresholds: HealthParams | None = None) -> dict[str, dict]:
    """Load the selected weights and write a training stage's outputs: checkpoint, embeddings, metrics (with the
    ``selection`` block and the ``warnings``: ``warnings`` given by the method, then the selection's, the loss
    curve's (``thresholds``: params ``health``) and the health checks'), curves; print each warning and log them
    to MLflow."""
    model.load_state_dict(result.selected_state["model"])
    found = (list(warnings or []) + selection_warnings(result)
             + instability_warnings(result, thresholds or HealthParams()))
    reports = export_embeddings(model, splits, out.embeddings_dir, eval_batch_size, device, health=found)
    metrics = {"selected_epoch": result.selected_epoch, **(extra_metrics or {}), "selection": result.selection,
               "warnings": found}
    metrics.update({split: metrics_entry(report) for split, report in reports.items()})
    save_json(out.metrics, metrics)
    save_json(out.metrics.with_name(f"{out.metrics.stem}_groups.json"),
              {split: groups_entry(report) for split, report in reports.items()})
    write_curves(out.curves, result.history)
    input_shape = tuple(splits["train"].x.shape[1:])
    save_network(str(out.model), model, model_name, splits["train"].n_classes, input_shape,
                 selected_epoch=result.selected_epoch, **(meta or {}))
    run.log_metrics({f"{split}.{k}": v for split, report in reports.items() for k, v in scalars(report).items()})
    run.log_metrics({f"{split}.fairness.{k}": v for split, report in reports.items() if report.get("fairness")
                     for k, v in fairness_scalars(report["fairness"]).items()})
    run.log_metrics({"selected_epoch": result.selected_epoch})
    run.log_metrics(selected_metrics(result))
    run.log_warnings(found)
    for path in (out.metrics, out.curves):
        run.log_artifact(path)
    run.log_model(model.cpu(), checkpoint=out.model, input_example=splits["train"].x[:2])  # an MLflow logged model
    test = reports["test"]
    print(f"[{label}] selected epoch {result.selected_epoch} ({result.selection.get('reason', '')}); test avg "
          f"{test['avg']:.3f}, worst-group {test['worst_group']:.3f}, unbiased {test['unbiased']:.3f}")
    for message in found:
        print(f"[{label}] WARNING {message}", flush=True)
    return reports


def split_tensors(splits: dict[str, BiasedSplit], names: tuple[str, ...] = ("train", "val")) -> dict[str, torch.Tensor]:
    """The tensors training reads from ``splits`` (images, classes, attributes), named ``split.field``."""
    return {f"{name}.{field}": getattr(splits[name], field) for name in names if name in splits
            for field in ("x", "y", "a")}


def note_resume(run: StageRun, result: FitResult) -> None:
    """Record in the run's metadata (MLflow tag, run record) that training resumed an interrupted run."""
    if result.resumed_from is not None:
        run.note("resumed_from_epoch", result.resumed_from)


@dataclass(frozen=True)
class StageOutputs:
    """Where a training stage writes (paths dvc.yaml declares)."""

    model: Path
    embeddings_dir: Path
    metrics: Path
    curves: Path
    resume: Path


def train_erm(splits: dict[str, BiasedSplit], model_params: str | ModelParams, optim: OptimParams, seed: int,
              run: StageRun, out: StageOutputs, thresholds: HealthParams | None = None) -> dict[str, dict]:
    """Cross-entropy training from scratch, selection by ``optim.selection``, then every output.

    ``model_params`` is ``params.model`` (or just a registry name, with the encoder's default options);
    ``thresholds`` is ``params.health`` (its defaults when None).

    Under ``torchrun`` every rank trains (joining the process group first); rank 0 writes the
    outputs and returns the accuracy reports, the other ranks return ``{}``.
    """
    device = distributed.init_from_env(pick_device())
    generator = seed_everything(seed)
    train = splits["train"]
    model_name = model_params if isinstance(model_params, str) else model_params.name
    model = build_model(model_params, train.n_classes, tuple(train.x.shape[1:])).to(device)
    optimizer = build_optimizer(model.parameters(), optim.optimizer, optim.lr, optim.momentum, optim.weight_decay)
    scheduler = build_scheduler(optimizer, optim.lr_milestones, optim.lr_gamma)
    task = ClassifierTask(model, optimizer, train, optim.batch_size, generator, device, augment_shift=optim.augment_shift)
    check_classifier_fits(model, optimizer, model_name, "erm", optim.batch_size, optim.eval_batch_size, len(train),
                          max(len(split) for split in splits.values()), tuple(train.x.shape[1:]), device)
    key = resume_key({"seed": seed, "model": model_name, "options": model.encoder.options,
                      "erm": optim.model_dump(mode="json")}, split_tensors(splits))
    result = fit(task, optimizer, optim.epochs, validator(model, splits["val"], optim.eval_batch_size, device),
                 selection=optim.selection, scheduler=scheduler, state_path=out.resume, state_key=key,
                 on_epoch=lambda epoch, metrics: run.log_metrics(metrics, step=epoch), label="train_erm",
                 divergence_advice=f"erm.lr (now {optim.lr:g})")
    note_resume(run, result)
    reports: dict[str, dict] = {}
    if distributed.is_main():
        reports = write_outputs(model, model_name, result, splits, run, out, optim.eval_batch_size, device, "erm",
                                meta={"method": "erm", "head_trained": True}, thresholds=thresholds)
        finish(out.resume)
    distributed.barrier()
    return reports
