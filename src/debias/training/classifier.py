"""Cross-entropy training of a classifier on in-memory tensors, and its prediction and validation helpers.

Every training stage uses them: ``train_erm`` (ERM), the stage-2 ``erm`` / ``jtt`` methods (JTT with a pool), the
per-epoch head of the other stage-2 methods, and the evaluation's frozen features (:func:`predict`).
Batches are index tensors into the stored uint8 images, shuffled by a seeded generator;
``pool`` lists the indices one epoch visits (ERM: every index once; JTT: errors repeated).
Under ``torchrun`` every rank draws and augments the same global batch, forwards its shard and
gathers the logits, so the loss is the global batch's mean cross-entropy (see
:mod:`debias.core.distributed`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from debias.core import distributed
from debias.core.errors import NEEDS_BIAS_LABELS
from debias.core.progress import advance
from debias.data.augment import shifted
from debias.data.store import BiasedSplit
from debias.metrics import accuracy_report, needs_bias_labels, scalars
from debias.training.captured import EagerStep, StepInputs, StepOutputs, StepRunner, shift_inputs
from debias.training.loop import GeneratorTask, StepMetrics, cut_batches, gather_rows, on_device, to_device
from debias.training.selection import label_free_scalars


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


def worst_group_n(report: dict) -> int | str:
    """The number of images of the report's worst group (of the smallest, where several groups tie on it);
    :data:`~debias.core.errors.NEEDS_BIAS_LABELS` for a report of data without bias labels."""
    if needs_bias_labels(report["worst_group"]):
        return NEEDS_BIAS_LABELS
    sizes = [n for accuracies, counts in zip(report["per_group"], report["group_counts"])
             for accuracy, n in zip(accuracies, counts) if accuracy is not None and accuracy == report["worst_group"]]
    return int(min(sizes))


def validation_scalars(report: dict) -> dict[str, float | str]:
    """The scalar accuracies prefixed ``val/``, and ``val/worst_group_n`` (the worst group's size, which tells by how
    many images an epoch's worst-group accuracy differs from another's: the selection's margin)."""
    n = worst_group_n(report)
    return {**scalars(report, "val/"), "val/worst_group_n": n if isinstance(n, str) else float(n)}


def validator(model: nn.Module, split: BiasedSplit, batch_size: int, device: torch.device,
              inferred_group: torch.Tensor | None = None):
    """A ``fit`` validation callback: :func:`validation_scalars` of ``model`` on ``split`` and the label-free numbers
    (:func:`debias.training.selection.label_free_scalars`: per class, and per inferred group where ``split``'s
    ``inferred_group`` [N] is given)."""

    def check() -> dict[str, float]:
        _, logits = predict(model, split.x, batch_size, device)
        pred = logits.argmax(1)
        report = accuracy_report(pred, split.y, split.a, split.aligned, split.n_classes, split.n_attrs)
        return {**validation_scalars(report), **label_free_scalars(pred, split.y, inferred_group)}

    return check


class ClassifierTask(GeneratorTask):
    """One epoch = the shuffled ``pool`` in minibatches, cross-entropy, one optimizer step per batch.

    The step is split for :mod:`debias.training.captured`: :meth:`step_inputs` (the batch's indices and its shift
    draws) and :meth:`step_compute` (the device work); ``runner`` runs it (eager unless replaced)."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, train: BiasedSplit, batch_size: int,
                 generator: torch.Generator, device: torch.device, pool: torch.Tensor | None = None,
                 progress: bool = True, augment_shift: int = 0) -> None:
        self.model, self.optimizer, self.train = model, optimizer, train
        self.batch_size, self.generator, self.device = batch_size, generator, device
        self.augment_shift = augment_shift
        self.pool = torch.arange(len(train)) if pool is None else pool
        self.train = on_device(train, device)  # batches are gathered by index on the device
        self.progress = progress
        self.runner: StepRunner = EagerStep(self.step_compute)

    def step_inputs(self, index: torch.Tensor) -> StepInputs:
        """The batch's indices (on the training data's device) and its shift draws, on the device."""
        return shift_inputs(index, self.train.x, self.augment_shift, self.generator)

    def step_compute(self, inputs: StepInputs) -> StepOutputs:
        """Gather and shift the global batch, forward this rank's shard, cross-entropy, one optimiser step; returns
        the batch's mean loss (``loss``), its sum (``loss_sum``) and its correct predictions (``correct``)."""
        index = inputs["index"]
        x = gather_rows(self.train.x, index)
        if "dy" in inputs:
            x = shifted(x, inputs["dy"], inputs["dx"], self.augment_shift)
        x = to_device(x[distributed.shard_slice(len(index))], self.device)
        y = to_device(self.train.y[index], self.device)
        logits = distributed.all_gather_rows(self.model(x), len(index))
        loss = F.cross_entropy(logits, y)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        distributed.sum_gradients(self.optimizer)
        self.optimizer.step()
        return {"loss": loss.detach(), "loss_sum": loss.detach() * len(index), "correct": (logits.argmax(1) == y).sum()}

    def train_epoch(self, epoch: int) -> dict[str, float]:
        order = self.pool[torch.randperm(len(self.pool), generator=self.generator)]
        metrics = StepMetrics()  # loss and correct predictions summed on the device, read once at the epoch's end
        seen = 0
        batches = cut_batches(order.to(self.train.x.device, non_blocking=True), self.batch_size)  # one copy to the data
        for step, index in enumerate(batches):
            out = self.runner(self.step_inputs(index))
            metrics.watch(out["loss"], step)
            metrics.add(loss=out["loss_sum"], correct=out["correct"])
            seen += len(index)
            if self.progress:
                advance(f"epoch {epoch}", step + 1, len(batches), unit="batch")
        totals = metrics.read()
        return {"train/loss": totals["loss"] / seen, "train/acc": totals["correct"] / seen}
