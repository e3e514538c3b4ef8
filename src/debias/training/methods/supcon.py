"""Supervised contrastive learning and FairKL: ``supcon`` (SupCon L_out), ``eps_supcon`` and ``eps_supinfonce``
(FairKL paper Eq. 5 and 4), each optionally with the FairKL regulariser (Eq. 9-10) on the bias labels from
infer_groups (true or inferred).

Shuffled batches; loss = alpha * L_con(z/|z|, y) + fairkl.weight * FairKL(z/|z|, y, b); no projection head;
the linear head is fitted after every epoch (:mod:`debias.training.methods.head`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from tqdm.auto import tqdm

from debias import distributed, losses
from debias.data.augment import random_shift
from debias.data.store import BiasedSplit
from debias.models import Network
from debias.params import Params
from debias.training.loop import GeneratorTask, ensure_finite
from debias.training.methods.base import (Progress, Stage2Inputs, Stage2Setup, fresh_model, normalise, register_method,
                                          stage2_optimiser)

CONTRASTIVE: dict[str, Callable[[torch.Tensor, torch.Tensor, Params], torch.Tensor]] = {
    "supcon": lambda z, y, p: losses.supcon(z, y, p.loss.temperature),
    "eps_supcon": lambda z, y, p: losses.eps_supcon(z, y, p.loss.epsilon, p.loss.temperature),
    "eps_supinfonce": lambda z, y, p: losses.eps_supinfonce(z, y, p.loss.epsilon, p.loss.temperature),
}


class ContrastiveTask(GeneratorTask):
    """Shuffled batches; alpha * L_con + lambda * FairKL on normalised features, plus an online linear head."""

    def __init__(self, model: Network, optimizer: torch.optim.Optimizer, train: BiasedSplit, bias: torch.Tensor,
                 params: Params, generator: torch.Generator, device: torch.device) -> None:
        self.model, self.optimizer, self.train, self.bias = model, optimizer, train, bias
        self.params, self.generator, self.device = params, generator, device
        self.contrastive = CONTRASTIVE[params.stage2.method]

    def train_epoch(self, epoch: int) -> dict[str, float]:
        loss_params = self.params.loss
        order = torch.randperm(len(self.train), generator=self.generator)
        progress = Progress()
        bar = tqdm(order.split(self.params.stage2.batch_size), desc=f"epoch {epoch}", leave=False,
                   disable=None if distributed.is_main() else True)
        for step, index in enumerate(bar):
            if len(index) < 2:
                continue  # a single sample has no pair
            x = random_shift(self.train.x[index], self.params.stage2.augment_shift, self.generator)
            x = x[distributed.shard_slice(len(index))].to(self.device)
            y = self.train.y[index].to(self.device)
            z = self.model.embed(x)
            zn = distributed.all_gather_rows(normalise(z), len(index))
            con = self.contrastive(zn, y, self.params)
            loss = loss_params.alpha * con
            parts = {"contrastive": con.detach()}
            if loss_params.fairkl.weight > 0:
                reg = losses.fairkl(zn, y, self.bias[index].to(self.device), loss_params.fairkl.variant)
                loss = loss + loss_params.fairkl.weight * reg
                parts["fairkl"] = reg.detach()
            ensure_finite(loss, step)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            distributed.sum_gradients(self.optimizer)
            self.optimizer.step()
            progress.add(loss=loss.detach(), **parts)
            bar.set_postfix(loss=f"{progress.sums['loss'] / progress.count:.4f}", refresh=False)
        return progress.means()


def contrastive_method(inputs: Stage2Inputs) -> Stage2Setup:
    model = fresh_model(inputs)
    optimizer, scheduler = stage2_optimiser(inputs, model.encoder.parameters())
    bias = inputs.bias_scores if inputs.bias_scores is not None else inputs.inferred  # soft scores (groups: soft)
    task = ContrastiveTask(model, optimizer, inputs.splits["train"], bias, inputs.params, inputs.generator, inputs.device)
    return Stage2Setup(task, model, optimizer, scheduler)


def _temperature(params: Params) -> tuple[str, float]:
    return "loss.temperature", params.loss.temperature


for _name in CONTRASTIVE:
    register_method(_name, temperature=_temperature)(contrastive_method)
