"""``lff``: Learning from Failure (Nam et al. 2020; a baseline in the CNC, FairKL and WCL papers' tables).

Two networks of ``model.name`` trained together on the same shuffled batches:

- the biased model ``f_b`` minimises generalised cross-entropy ``GCE(f_b(x), y) = (1 - p_y^q) / q``
  (:func:`debias.losses.generalized_cross_entropy`, ``stage2.lff.q``), which amplifies what is easy to learn,
  the bias;
- the debiased model ``f_d`` minimises ``W(x) CE(f_d(x), y)`` with the relative difficulty
  ``W(x) = CE_b(x) / (CE_b(x) + CE_d(x))`` (LfF Eq. 3; :func:`debias.losses.lff_weights`), large where the biased
  model fails: the bias-conflicting points.

As the authors' code does, ``CE_b`` and ``CE_d`` in ``W`` are per-sample exponential moving averages over the
training (``stage2.lff.ema_alpha``; a point's first loss starts its average) divided by their maximum over the
point's class in the whole training set; the averages are training state, saved and restored on resume.
Both models step on ``mean GCE + mean W CE`` (one optimiser over both: per-parameter updates, the same as the
code's two). The debiased model is the stage's model (checkpoint, head, validation); the biased one is
kept only in the resume state.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from debias import losses
from debias.core import distributed
from debias.core.errors import NEEDS_BIAS_LABELS
from debias.data.store import BiasedSplit
from debias.models import Network
from debias.params import Params
from debias.training.captured import StepInputs, StepOutputs
from debias.training.methods.base import (Stage2Inputs, Stage2Setup, StepTask, fresh_model, on_device, stage2_optimiser,
                                          to_device)


class LossEMA:
    """Per-sample exponential moving average of a loss, ``m_i <- α m_i + (1 - α) l_i`` (the first value sets ``m_i``),
    and its maximum over each class (LfF code's ``EMA``)."""

    def __init__(self, labels: torch.Tensor, n_classes: int, alpha: float, device: torch.device | None = None) -> None:
        """The averages live on ``device`` (the labels' by default), where the losses are: no host sync per step
        (float64, float32 on MPS, which has no float64)."""
        device = labels.device if device is None else torch.device(device)
        dtype = torch.float32 if device.type == "mps" else torch.float64
        self.labels, self.n_classes, self.alpha = labels.long().to(device), n_classes, alpha
        self.value = torch.zeros(len(labels), dtype=dtype, device=device)
        self.seen = torch.zeros(len(labels), dtype=torch.bool, device=device)

    def update(self, index: torch.Tensor, loss: torch.Tensor) -> None:
        index = index.to(self.value.device, non_blocking=True)
        loss = loss.detach().to(self.value.device, self.value.dtype)
        old = self.value[index]
        self.value[index] = torch.where(self.seen[index], self.alpha * old + (1 - self.alpha) * loss, loss)
        self.seen.index_fill_(0, index, True)  # not `seen[index] = True`: that copies the scalar (a host sync)

    def normalised(self, index: torch.Tensor) -> torch.Tensor:
        """``m_i / max_{j: y_j = y_i} m_j`` for the rows ``index`` (a class whose maximum is 0 gives 0)."""
        index = index.to(self.value.device, non_blocking=True)
        class_max = self.value.new_zeros(self.n_classes).scatter_reduce(
            0, self.labels, self.value, reduce="amax", include_self=True)
        top = class_max[self.labels[index]]
        return torch.where(top > 0, self.value[index] / top.clamp_min(torch.finfo(top.dtype).tiny), 0.0)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"value": self.value.cpu().clone(), "seen": self.seen.cpu().clone()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore the averages in place (a captured step reads these buffers)."""
        self.value.copy_(state["value"])
        self.seen.copy_(state["seen"])


class LfFTask(StepTask):
    """One epoch = shuffled batches; both models forward the same batch; GCE for f_b, W-weighted CE for f_d."""

    def __init__(self, model: Network, biased: Network, optimizer: torch.optim.Optimizer, train: BiasedSplit,
                 params: Params, generator: torch.Generator, device: torch.device) -> None:
        self.model, self.biased, self.optimizer = model, biased, optimizer
        self.train = on_device(train, device)  # batches are gathered by index on the device
        self.params, self.generator, self.device = params, generator, device
        lff = params.stage2.lff
        self.ema_biased = LossEMA(train.y, train.n_classes, lff.ema_alpha, device)
        self.ema_debiased = LossEMA(train.y, train.n_classes, lff.ema_alpha, device)

    def modules(self) -> dict[str, nn.Module]:
        return {"model": self.model, "biased": self.biased}

    def extra_state(self) -> dict[str, Any]:
        return {**super().extra_state(), "ema_biased": self.ema_biased.state_dict(),
                "ema_debiased": self.ema_debiased.state_dict()}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        super().load_extra_state(state)
        self.ema_biased.load_state_dict(state["ema_biased"])
        self.ema_debiased.load_state_dict(state["ema_debiased"])

    def step_compute(self, inputs: StepInputs) -> StepOutputs:
        """One optimiser step on the rows ``inputs["index"]`` (the averages updated in place); returns the batch's loss
        parts (detached)."""
        index = inputs["index"]
        x = self.batch_images(inputs)
        y = to_device(self.train.y[index], self.device)
        logits_b = distributed.all_gather_rows(self.biased(x), len(index))
        logits_d = distributed.all_gather_rows(self.model(x), len(index))
        ce_b = F.cross_entropy(logits_b, y, reduction="none")
        ce_d = F.cross_entropy(logits_d, y, reduction="none")
        self.ema_biased.update(index, ce_b)
        self.ema_debiased.update(index, ce_d)
        weight = losses.lff_weights(self.ema_biased.normalised(index), self.ema_debiased.normalised(index))
        weight = weight.to(device=self.device, dtype=ce_d.dtype)
        gce = losses.generalized_cross_entropy(logits_b, y, self.params.stage2.lff.q)
        weighted = (weight * ce_d).mean()
        loss = gce + weighted
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        distributed.sum_gradients(self.optimizer)
        self.optimizer.step()
        return {"loss": loss.detach(), "gce_biased": gce.detach(), "weighted_ce": weighted.detach(),
                "ce_debiased": ce_d.detach().mean(), "weight": weight.mean()}


def lff_method(inputs: Stage2Inputs) -> Stage2Setup:
    model, biased = fresh_model(inputs), fresh_model(inputs)
    optimizer, scheduler = stage2_optimiser(inputs, list(model.parameters()) + list(biased.parameters()))
    task = LfFTask(model, biased, optimizer, inputs.splits["train"], inputs.params, inputs.generator, inputs.device)

    def report(history: list[dict[str, float]]) -> dict[str, Any]:  # history: unused
        weights = losses.lff_weights(task.ema_biased.normalised(torch.arange(len(task.train))),
                                     task.ema_debiased.normalised(torch.arange(len(task.train))))
        train = inputs.splits["train"]
        if train.aligned is None:  # no bias labels: the weights of aligned / conflicting images cannot be told apart
            return {"lff_q": inputs.params.stage2.lff.q, "lff_mean_weight_aligned": NEEDS_BIAS_LABELS,
                    "lff_mean_weight_conflicting": NEEDS_BIAS_LABELS}
        weights, conflicting = weights.cpu(), ~train.aligned.bool()
        return {"lff_q": inputs.params.stage2.lff.q,
                "lff_mean_weight_aligned": float(weights[~conflicting].mean()) if bool((~conflicting).any()) else None,
                "lff_mean_weight_conflicting": float(weights[conflicting].mean()) if bool(conflicting.any()) else None}

    return Stage2Setup(task, model, optimizer, scheduler, report=report)
