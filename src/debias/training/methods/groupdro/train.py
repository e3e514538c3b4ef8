"""``groupdro``: Group DRO (Sagawa et al. 2020, Alg. 1 with Sec. 3.3's group adjustment; the CNC paper's oracle
row, CMNIST* 78.5 / 90.6 with training group labels).

Groups come from the groups table's ``inferred_group`` column, so the one method covers both rows of the tables:
with ``groups.method: true`` they are the true (class, attribute) groups ``y * A + a`` (the oracle GroupDRO); with
inferred groups they are the groups stage's (``pred``: (class, ERM prediction); ``cluster`` with ``per_class: k``:
GEORGE-style (class, cluster) groups). Group ids are renumbered to ``0 .. G-1`` over the groups present in the
training split (empty ids are never groups). Batches are drawn group-balanced with replacement
(``stage2.groupdro.balanced_sampling``, default: Alg. 1 draws a group uniformly, then a point of it; the authors'
commands add ``--reweight_groups``, a sampler with weights 1 / n_g; without it a minority group of a dozen points is
absent from ~94 % of batches of 32, its ``q`` barely moves and its loss barely counts). Per batch: the mean
cross-entropy of each group present, ``q_g <- q_g exp(η (L_g + C / sqrt(n_g)))`` over the groups present,
renormalised to the mass they held (:func:`debias.losses.group_dro_weights`; an absent group keeps its weight), then
a step on ``sum_g q_g L_g`` (:func:`debias.losses.group_dro_loss`). ``η`` = ``stage2.groupdro.step_size`` (the
paper's 0.01), ``C`` = ``stage2.groupdro.adjustment`` (CNC's CMNIST* runs: 0), ``n_g`` the training size of group
g. ``q`` is training state, saved and restored on resume; the stage's info file reports the final ``q`` per group.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from debias import losses
from debias.core import distributed
from debias.data.store import BiasedSplit
from debias.models import Network
from debias.params import Params
from debias.training.captured import StepInputs, StepOutputs
from debias.training.methods.base import (Stage2Inputs, Stage2Setup, StepTask, fresh_model, group_balanced_batches,
                                          on_device, stage2_optimiser, to_device)


def compact_groups(groups: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids in 0 .. G-1, the original id of each)``: groups renumbered over the ids present, in increasing order."""
    original, compact = torch.unique(groups.long().cpu(), return_inverse=True)
    return compact, original


class GroupDROTask(StepTask):
    """Group-balanced (or shuffled) batches; online group weights ``q``; cross-entropy head trained with the encoder."""

    def __init__(self, model: Network, optimizer: torch.optim.Optimizer, train: BiasedSplit, groups: torch.Tensor,
                 params: Params, generator: torch.Generator, device: torch.device) -> None:
        self.model, self.optimizer = model, optimizer
        self.train = on_device(train, device)  # batches are gathered by index on the device
        self.params, self.generator, self.device = params, generator, device
        self.groups, self.group_ids = compact_groups(groups)  # on the CPU: the sampler's
        self.n_groups = len(self.group_ids)
        self.group_counts = torch.bincount(self.groups, minlength=self.n_groups).double()
        self.q = torch.full((self.n_groups,), 1.0 / self.n_groups, dtype=torch.float64)
        # the step's copies, on the device (q: float32 on MPS, which has no float64)
        self._groups = self.groups.to(self.train.x.device)  # indexed where the batches are gathered
        self._counts = self.group_counts.to(device, torch.float32 if device.type == "mps" else torch.float64)
        self._q = self.q.to(device, self._counts.dtype)

    def batches(self) -> list[torch.Tensor]:
        if self.params.stage2.groupdro.balanced_sampling:
            return group_balanced_batches(self.groups, self.params.stage2.batch_size, self.generator)
        return super().batches()

    @property
    def q(self) -> torch.Tensor:
        """The group weights (float64, on the CPU; the step keeps its copy on the device)."""
        return self._q.to("cpu", torch.float64)

    @q.setter
    def q(self, value: torch.Tensor) -> None:
        """Set the weights in place once the device copy exists (a captured step reads that buffer)."""
        if not hasattr(self, "_counts"):
            self._q = value.clone()
        elif not hasattr(self, "_q") or self._q.device != self._counts.device:
            self._q = value.to(self._counts.device, self._counts.dtype).clone()
        else:
            self._q.copy_(value)

    def extra_state(self) -> dict[str, Any]:
        return {**super().extra_state(), "q": self.q.clone()}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        super().load_extra_state(state)
        self.q = state["q"].clone()

    def step_compute(self, inputs: StepInputs) -> StepOutputs:
        """Update ``q`` (in place) from the batch's group losses, then one optimiser step on ``sum_g q_g L_g``."""
        dro = self.params.stage2.groupdro
        index = inputs["index"]
        x = self.batch_images(inputs)
        y = to_device(self.train.y[index], self.device)
        groups = to_device(self._groups[index], self.device)
        logits = distributed.all_gather_rows(self.model(x), len(index))
        per_sample = F.cross_entropy(logits, y, reduction="none")
        group_losses, batch_counts = losses.group_mean_losses(per_sample, groups, self.n_groups)
        self._q.copy_(losses.group_dro_weights(self._q, group_losses.detach(), self._counts, dro.step_size,
                                               dro.adjustment, batch_counts=batch_counts))
        loss = losses.group_dro_loss(per_sample, groups, self._q)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        distributed.sum_gradients(self.optimizer)
        self.optimizer.step()
        present = batch_counts > 0  # (no boolean indexing: its result's size would need a host sync)
        return {"loss": loss.detach(), "ce": per_sample.detach().mean(),
                "worst_group_loss": torch.where(present, group_losses.detach(), float("-inf")).max(),
                "q_max": self._q.max()}


def groupdro_method(inputs: Stage2Inputs) -> Stage2Setup:
    if inputs.inferred_group is None:
        raise ValueError("stage2.method = groupdro needs the groups table's inferred_group column (run infer_groups; "
                         "groups.method: true for the true groups)")
    train = inputs.splits["train"]
    if len(inputs.inferred_group) != len(train):
        raise ValueError(f"stage2.method = groupdro: {len(inputs.inferred_group)} group ids for {len(train)} training "
                         "points; rerun infer_groups")
    model = fresh_model(inputs)
    optimizer, scheduler = stage2_optimiser(inputs, model.parameters())
    task = GroupDROTask(model, optimizer, train, inputs.inferred_group, inputs.params, inputs.generator, inputs.device)

    def report(history: list[dict[str, float]]) -> dict[str, Any]:  # history: unused
        return {"groupdro_groups": task.group_ids.tolist(), "groupdro_group_counts": task.group_counts.long().tolist(),
                "groupdro_q": [round(float(v), 6) for v in task.q]}

    return Stage2Setup(task, model, optimizer, scheduler, report=report)
