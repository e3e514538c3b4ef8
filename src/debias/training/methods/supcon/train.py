"""Supervised contrastive learning and FairKL: ``supcon`` (SupCon L_out), ``eps_supcon`` and ``eps_supinfonce``
(FairKL paper Eq. 5 and 4), each optionally with the FairKL regulariser (Eq. 9-10) on the bias labels from
infer_groups (true or inferred).

Batches of ``stage2.batch_size``; the loss is composed by ``loss.fairkl.variant`` (:data:`OBJECTIVES`):
``kl`` / ``mean`` (the paper, Eq. 10 / 9 with Eq. 11): ``alpha * L_con(z/|z|, y) + lambda * FairKL(z/|z|, y, b)``;
``released`` (the authors' released main_infonce.py, which produced the paper's tables):
``alpha^2 * (tau / 0.07) * L_con + lambda * FairKL_released`` (:func:`debias.losses.released_contrastive`,
``fairkl(variant="released")``; with lambda = 0 the code applies alpha once). ``lambda`` is ``loss.fairkl.weight``,
``loss.eps_supcon.fairkl_weight`` for eps_supcon (which also has its own epsilon, FairKL Table 6). No projection
head (so the encoder's feature layer ends in Tanh under ``model.feature_activation: auto``, as the FairKL authors'
encoder); temperature ``loss.temperature`` (both papers: 0.1). The linear head is fitted after every epoch
(:mod:`debias.training.methods.head`).

FairKL's positive side needs, in the batch, pairs of the same class with the same and with a different bias label;
its negative side pairs of different classes with the same and with a different bias label. A side whose sets hold
fewer than two pairs contributes 0 in ``kl`` / ``mean`` (:func:`debias.losses.fairkl`; ``released`` takes an
empty set's mean as 0, as the code), so under strong bias, where a batch often holds
no bias-conflicting point, FairKL silently does nothing. Every epoch records how many steps each side was active and
the mean pair counts (``train/fairkl_*``); training that left a side inactive in most steps ends with a
``fairkl-starved`` warning. ``loss.fairkl.sampler: stratified`` (an extension, not in the paper) puts
``loss.fairkl.minority_per_batch`` inferred-minority points into every batch (repeating them across batches as
needed; every other point once per epoch), so both sides are active in every batch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from debias import losses
from debias.core import distributed, health
from debias.data.augment import shifted
from debias.data.store import BiasedSplit
from debias.models import Network
from debias.params import Params
from debias.training.captured import EagerStep, StepInputs, StepOutputs, StepRunner, shift_inputs
from debias.training.loop import GeneratorTask
from debias.training.methods.base import (Progress, Stage2Inputs, Stage2Setup, epoch_steps, fresh_model, gather_rows,
                                          normalise, on_device, shuffled_batches, stage2_optimiser,
                                          to_device)
from debias.training.methods.supcon import (EPS_SUPCON, EPS_SUPINFONCE, RELEASED_FORM, SUPCON, epsilon,
                                            fairkl_weight)

CONTRASTIVE: dict[str, Callable[[torch.Tensor, torch.Tensor, Params], torch.Tensor]] = {
    SUPCON: lambda z, y, p: losses.supcon(z, y, p.loss.temperature),
    EPS_SUPCON: lambda z, y, p: losses.eps_supcon(z, y, epsilon(p, EPS_SUPCON), p.loss.temperature),
    EPS_SUPINFONCE: lambda z, y, p: losses.eps_supinfonce(z, y, p.loss.epsilon, p.loss.temperature),
}
# Below this fraction of active steps (over the whole training) a FairKL side counts as starved.
STARVED_FRACTION = 0.5
# What a missing pair set does to each composition (the released code takes an empty set's mean as 0).
STARVED_EFFECT = {"paper": "FairKL contributes 0",
                  "released": "FairKL (released) compares against an empty set's mean taken as 0, as the code does,"}
SIDES = {"pos": "positive side (same class: same vs different bias label)",
         "neg": "negative side (different classes: same vs different bias label)"}


def stratified_batches(minority: torch.Tensor, batch_size: int, per_batch: int,
                       generator: torch.Generator) -> list[torch.Tensor]:
    """Batches that each hold ``min(per_batch, batch_size // 2)`` points of ``minority`` (bool ``[N]``): the other
    points once each in a random order, filling the rest of every batch; minority points in random order, cycling
    through fresh permutations where the epoch needs more than there are. No minority point: shuffled batches."""
    minority_index = torch.nonzero(minority).flatten()
    majority_index = torch.nonzero(~minority).flatten()
    k = min(per_batch, batch_size // 2) if len(minority_index) else 0
    if k == 0 or len(majority_index) == 0:
        return shuffled_batches(len(minority), batch_size, generator)
    majority = majority_index[torch.randperm(len(majority_index), generator=generator)].split(batch_size - k)
    needed = len(majority) * k
    rounds = -(-needed // len(minority_index))
    order = torch.cat([minority_index[torch.randperm(len(minority_index), generator=generator)] for _ in range(rounds)])
    return [torch.cat([order[i * k:(i + 1) * k], part]) for i, part in enumerate(majority)]


Terms = dict[str, torch.Tensor]


def paper_objective(z: torch.Tensor, y: torch.Tensor, bias: torch.Tensor | None, method: str,
                    params: Params) -> tuple[torch.Tensor, Terms]:
    """FairKL paper Eq. 11: ``alpha * L_con + lambda * FairKL`` (Eq. 10 or 9 by ``loss.fairkl.variant``)."""
    con = CONTRASTIVE[method](z, y, params)
    loss, terms = params.loss.alpha * con, {"contrastive": con}
    weight = fairkl_weight(params, method)
    if weight > 0 and bias is not None:
        reg = losses.fairkl(z, y, bias, params.loss.fairkl.variant, variance_floor=params.loss.fairkl.variance_floor)
        loss, terms["fairkl"] = loss + weight * reg, reg
    return loss, terms


def released_objective(z: torch.Tensor, y: torch.Tensor, bias: torch.Tensor | None, method: str,
                       params: Params) -> tuple[torch.Tensor, Terms]:
    """The released main_infonce.py: ``target_loss = alpha * infonce``; with lambda != 0 the criterion is
    ``alpha * target_loss + lambda * fairkl(F.normalize(feats), y, b, 1.0, kld=1)``, i.e. ``alpha^2 * L_con``
    (``infonce`` already carries ``tau / 0.07``); without FairKL, ``alpha * L_con``."""
    loss_params = params.loss
    con = losses.released_contrastive(z, y, epsilon(params, method), loss_params.temperature,
                                      RELEASED_FORM[method])
    weight = fairkl_weight(params, method)
    if weight == 0 or bias is None:
        return loss_params.alpha * con, {"contrastive": con}
    reg = losses.fairkl(z, y, bias, "released")
    return loss_params.alpha * loss_params.alpha * con + weight * reg, {"contrastive": con, "fairkl": reg}


# loss.fairkl.variant -> the composition of the stage-2 loss
OBJECTIVES: dict[str, Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None, str, Params],
                               tuple[torch.Tensor, Terms]]] = {
    "kl": paper_objective, "mean": paper_objective, "released": released_objective}


def objective(z: torch.Tensor, y: torch.Tensor, bias: torch.Tensor | None, method: str,
              params: Params) -> tuple[torch.Tensor, Terms]:
    """The stage-2 loss of one batch of normalised features ``z`` and its terms (undetached), by
    ``loss.fairkl.variant``; ``bias=None`` leaves FairKL out."""
    return OBJECTIVES[params.loss.fairkl.variant](z, y, bias, method, params)


class ContrastiveTask(GeneratorTask):
    """Batches (shuffled, or stratified by inferred minority); alpha * L_con + lambda * FairKL on normalised
    features; FairKL's activity per epoch."""

    def __init__(self, model: Network, optimizer: torch.optim.Optimizer, train: BiasedSplit, bias: torch.Tensor,
                 minority: torch.Tensor, params: Params, generator: torch.Generator, device: torch.device) -> None:
        self.model, self.optimizer = model, optimizer
        self.train = on_device(train, device)  # batches are gathered by index where the data is (the device)
        self.bias = bias.to(self.train.x.device)
        self.minority = minority
        self.params, self.generator, self.device = params, generator, device
        self.method = params.stage2.method
        self.fairkl_on = fairkl_weight(params, self.method) > 0
        self.runner: StepRunner = EagerStep(self.step_compute)  # stage2.speed.step's runner replaces it

    def batches(self) -> list[torch.Tensor]:
        fairkl = self.params.loss.fairkl
        batch_size = self.params.stage2.batch_size
        if self.fairkl_on and fairkl.sampler == "stratified":
            return stratified_batches(self.minority, batch_size, fairkl.minority_per_batch, self.generator)
        return shuffled_batches(len(self.train), batch_size, self.generator)

    def step_inputs(self, index: torch.Tensor) -> StepInputs:
        """The batch's indices and its shift draws, on the training data's device (:mod:`debias.training.captured`)."""
        return shift_inputs(index, self.train.x, self.params.stage2.augment_shift, self.generator)

    def step_compute(self, inputs: StepInputs) -> StepOutputs:
        """One optimiser step on the batch ``inputs`` describes; returns its loss, terms and FairKL activity."""
        index = inputs["index"]
        x = gather_rows(self.train.x, index)
        if "dy" in inputs:
            x = shifted(x, inputs["dy"], inputs["dx"], self.params.stage2.augment_shift)
        x = to_device(x[distributed.shard_slice(len(index))], self.device)
        y = to_device(self.train.y[index], self.device)
        z = self.model.embed(x)
        zn = distributed.all_gather_rows(normalise(z), len(index))
        bias = to_device(self.bias[index], self.device) if self.fairkl_on else None
        loss, terms = objective(zn, y, bias, self.method, self.params)
        parts: dict[str, Any] = {name: term.detach() for name, term in terms.items()}
        if bias is not None:
            parts.update(fairkl_activity(y, bias))
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        distributed.sum_gradients(self.optimizer)
        self.optimizer.step()
        return {"loss": loss.detach(), **parts}

    def train_epoch(self, epoch: int) -> dict[str, float]:
        progress = Progress()
        for step, index in epoch_steps(self.batches(), epoch, self.train.x.device):
            if len(index) < 2:
                continue  # a single sample has no pair
            out = self.runner(self.step_inputs(index))
            progress.watch(out["loss"], step)
            progress.add(**out)
        return progress.means()


def fairkl_activity(y: torch.Tensor, bias: torch.Tensor) -> dict[str, torch.Tensor]:
    """One step's FairKL activity, as 0-dim tensors on the batch's device (no host sync): whether each side was
    active (1 / 0) and the pairs in each of the four sets."""
    pairs = dict(zip(losses.FAIRKL_SETS, losses.fairkl_pair_counts(y, bias).unbind()))
    return {"fairkl_pos_active": ((pairs["pos_aligned"] >= 2) & (pairs["pos_conflicting"] >= 2)).float(),
            "fairkl_neg_active": ((pairs["neg_aligned"] >= 2) & (pairs["neg_conflicting"] >= 2)).float(),
            **{f"fairkl_pairs_{name}": value for name, value in pairs.items()}}


def fairkl_summary(history: list[dict[str, float]], params: Params) -> dict[str, Any] | None:
    """FairKL's activity over training from the per-epoch history: per epoch the fraction of steps each side was
    active and the mean pairs per set; ``None`` without FairKL."""
    weight = fairkl_weight(params, params.stage2.method)
    if weight <= 0 or not history or "train/fairkl_pos_active" not in history[0]:
        return None
    epochs = [{"epoch": int(row["epoch"]),
               "pos_active": row["train/fairkl_pos_active"], "neg_active": row["train/fairkl_neg_active"],
               "pairs": {name: row[f"train/fairkl_pairs_{name}"] for name in losses.FAIRKL_SETS}} for row in history]
    return {"sampler": params.loss.fairkl.sampler, "variant": params.loss.fairkl.variant,
            "batch_size": params.stage2.batch_size,
            "pos_active": sum(e["pos_active"] for e in epochs) / len(epochs),
            "neg_active": sum(e["neg_active"] for e in epochs) / len(epochs), "epochs": epochs}


def fairkl_warnings(summary: dict[str, Any] | None) -> list[str]:
    """A ``fairkl-starved`` warning when a side of FairKL was active in fewer than half of the training steps."""
    if summary is None:
        return []
    starved = [side for side in SIDES if summary[f"{side}_active"] < STARVED_FRACTION]
    if not starved:
        return []
    last = summary["epochs"][-1]["pairs"]
    mean_pairs = ", ".join(f"{name} {value:.1f}" for name, value in last.items())
    where = "; ".join(f"its {SIDES[side]} was active in {summary[f'{side}_active']:.0%} of the steps" for side in starved)
    remedy = ("" if summary["sampler"] == "stratified" else
              "; loss.fairkl.sampler: stratified puts inferred-minority points into every batch (an extension)")
    effect = (STARVED_EFFECT["released"] if summary.get("variant") == "released" else STARVED_EFFECT["paper"])
    return [health.warning("fairkl-starved", f"{effect} where a batch lacks one of its pair sets: {where} "
                                             f"(mean pairs per batch in the last epoch: {mean_pairs}){remedy}")]


def contrastive_method(inputs: Stage2Inputs) -> Stage2Setup:
    model = fresh_model(inputs)
    optimizer, scheduler = stage2_optimiser(inputs, model.encoder.parameters())
    bias = inputs.bias_scores if inputs.bias_scores is not None else inputs.inferred  # soft scores (groups: soft)
    task = ContrastiveTask(model, optimizer, inputs.splits["train"], bias, inputs.minority, inputs.params,
                           inputs.generator, inputs.device)

    def report(history: list[dict[str, float]]) -> dict[str, Any]:
        summary = fairkl_summary(history, inputs.params)
        return {} if summary is None else {"fairkl": summary}

    return Stage2Setup(task, model, optimizer, scheduler, report=report,
                       warnings=lambda history: fairkl_warnings(fairkl_summary(history, inputs.params)))


