"""Self-supervised contrastive methods: ``wcl``, difficulty-weighted contrastive learning (difficulty-based
sampling paper, Sec. 5.2): debiased encoder E_d trained with the relative-difficulty weighted InfoNCE between
two augmented views, biased encoder E_b trained jointly with the triplet loss (class labels unused); the
linear head of E_d is fitted after every epoch (:mod:`debias.training.methods.head`)."""

from __future__ import annotations

import torch
from torch import nn
from tqdm.auto import tqdm

from debias import distributed, losses
from debias.data.augment import view
from debias.data.store import BiasedSplit
from debias.models import Network
from debias.params import Params
from debias.training.loop import GeneratorTask, ensure_finite
from debias.training.methods.base import (Progress, Stage2Inputs, Stage2Setup, fresh_model, normalise, register_method,
                                          stage2_optimiser)
from debias.training.methods.views import Views


class WCLTask(GeneratorTask):
    """Two augmented views per image; E_d: weighted InfoNCE, E_b: triplet loss, head: online probe on E_d."""

    def __init__(self, model: Network, biased: Network, optimizer: torch.optim.Optimizer, train: BiasedSplit,
                 params: Params, generator: torch.Generator, device: torch.device) -> None:
        self.model, self.biased, self.optimizer, self.train = model, biased, optimizer, train
        self.params, self.generator, self.device = params, generator, device
        wcl = params.stage2.wcl
        self.views = Views(train, params, lambda x, g: view(x, wcl.max_shift, wcl.noise_std, g))  # by modality

    def modules(self) -> dict[str, nn.Module]:
        return {"model": self.model, "biased": self.biased}

    def train_epoch(self, epoch: int) -> dict[str, float]:
        wcl = self.params.stage2.wcl
        order = torch.randperm(len(self.train), generator=self.generator)
        progress = Progress()
        for step, index in enumerate(tqdm(order.split(self.params.stage2.batch_size), desc=f"epoch {epoch}",
                                          leave=False, disable=None if distributed.is_main() else True)):
            if len(index) < 2:
                continue
            images = self.train.x[index]
            local = distributed.shard_slice(len(index))
            anchor = self.views(images, self.generator)[local].to(self.device)
            positive = self.views(images, self.generator)[local].to(self.device)
            z_d_a, z_d_p = self.model.embed(anchor), self.model.embed(positive)
            z_b_a, z_b_p = self.biased.embed(anchor), self.biased.embed(positive)
            z_d_a, z_d_p, z_b_a, z_b_p = (distributed.all_gather_rows(normalise(z), len(index))
                                          for z in (z_d_a, z_d_p, z_b_a, z_b_p))
            _, weighted, triplet = losses.wcl_loss(z_d_a, z_d_p, z_b_a, z_b_p, self.params.loss.temperature,
                                                   wcl.tau_plus, return_parts=True)
            loss = weighted + wcl.triplet_weight * triplet
            ensure_finite(loss, step)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            distributed.sum_gradients(self.optimizer)
            self.optimizer.step()
            progress.add(loss=loss.detach(), weighted_infonce=weighted.detach(), triplet=triplet.detach())
        return progress.means()


def _temperature(params: Params) -> tuple[str, float]:
    return "loss.temperature", params.loss.temperature


@register_method("wcl", temperature=_temperature)
def wcl_method(inputs: Stage2Inputs) -> Stage2Setup:
    model, biased = fresh_model(inputs), fresh_model(inputs)
    optimizer, scheduler = stage2_optimiser(inputs, list(model.encoder.parameters()) + list(biased.encoder.parameters()))
    task = WCLTask(model, biased, optimizer, inputs.splits["train"], inputs.params, inputs.generator, inputs.device)
    return Stage2Setup(task, model, optimizer, scheduler)
