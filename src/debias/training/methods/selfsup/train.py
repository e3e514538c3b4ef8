"""Self-supervised contrastive methods: ``wcl``, difficulty-weighted contrastive learning (difficulty-based
sampling paper, Sec. 5-6).

Per batch of B images two views are drawn (images: SimCLR's random resized crop, colour distortion and grayscale,
batched on tensors, :func:`debias.data.augment.simclr_view`, so colour alone cannot tell two images apart; feature
vectors: SCARF's corruption, :func:`debias.data.augment.tabular_view`). The debiased encoder E_d is trained with the
relative-difficulty weighted InfoNCE over both views (every view an anchor, its other view the positive, the other
2B - 2 views its negatives, symmetric; temperature ``stage2.wcl.temperature``, Sec. 6: 0.5; debiased-negative prior
``stage2.wcl.tau_plus``, null: 1 / number of classes), the biased encoder E_b jointly with the triplet loss on the
same views (class labels unused). As in the DCL / HCL code the paper follows, both losses are computed on a projection head
(Linear-BN-ReLU-Linear, ``stage2.wcl.projection_dim``) after each encoder; the linear head is fitted on the
encoder's own output, the penultimate layer (Sec. 6), after every epoch (:mod:`debias.training.methods.head`).
"""

from __future__ import annotations

import torch
from torch import nn

from debias import losses
from debias.core import distributed
from debias.data.augment import simclr_view
from debias.data.store import BiasedSplit
from debias.models import Network
from debias.params import Params
from debias.training.loop import GeneratorTask
from debias.training.methods.selfsup import WCLParams
from debias.training.methods.base import (Progress, Stage2Inputs, Stage2Setup, class_prior, epoch_steps, fresh_model,
                                          gather_rows, normalise, on_device, shuffled_batches,
                                          stage2_optimiser, to_device)
from debias.training.methods.views import Views


def projection_head(width: int, out: int) -> nn.Module:
    """SimCLR's / DCL's projection MLP: Linear(width, width, no bias), BatchNorm, ReLU, Linear(width, out); identity
    for ``out = 0``."""
    if out == 0:
        return nn.Identity()
    return nn.Sequential(nn.Linear(width, width, bias=False), nn.BatchNorm1d(width), nn.ReLU(), nn.Linear(width, out))


def wcl_image_view(wcl: WCLParams):
    """SimCLR's view of images with WCL's options (crop scale, colour strength s: brightness, contrast, saturation
    0.8 s, hue 0.2 s at most 0.5, jitter and grayscale probabilities)."""
    s = wcl.colour_strength
    options = dict(crop_scale=(wcl.crop_min_scale, 1.0), brightness=0.8 * s, contrast=0.8 * s, saturation=0.8 * s,
                   hue=min(0.2 * s, 0.5), jitter_p=wcl.jitter_p, grayscale_p=wcl.grayscale_p)
    return lambda x, generator: simclr_view(x, generator, **options)


class WCLTask(GeneratorTask):
    """Two views per image; E_d: weighted InfoNCE (2B - 2 negatives, symmetric), E_b: triplet loss, both on their
    projection heads; the network's linear head: the per-epoch probe on E_d's output."""

    def __init__(self, model: Network, biased: Network, projector: nn.Module, biased_projector: nn.Module,
                 optimizer: torch.optim.Optimizer, train: BiasedSplit, params: Params, generator: torch.Generator,
                 device: torch.device) -> None:
        self.model, self.biased, self.optimizer = model, biased, optimizer
        self.train = on_device(train, device)  # batches are gathered (and augmented) on the device
        self.projector, self.biased_projector = projector, biased_projector
        self.params, self.generator, self.device = params, generator, device
        wcl = params.stage2.wcl
        self.views = Views(self.train, params, wcl_image_view(wcl))  # SimCLR views of images, SCARF of feature vectors
        self.tau_plus = class_prior(wcl.tau_plus, train.n_classes, "stage2.wcl.tau_plus")

    def modules(self) -> dict[str, nn.Module]:
        return {"model": self.model, "biased": self.biased, "projector": self.projector,
                "biased_projector": self.biased_projector}

    def batch_loss(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(L, L_wcl, L_tri)`` of one batch of training indices (draws its two views from the task's generator)."""
        wcl = self.params.stage2.wcl
        local = distributed.shard_slice(len(index))
        rows = gather_rows(self.train.x, index)
        first, second = (to_device(self.views(rows, self.generator)[local], self.device) for _ in range(2))
        z_d = [normalise(self.projector(self.model.embed(v))) for v in (first, second)]
        z_b = [normalise(self.biased_projector(self.biased.embed(v))) for v in (first, second)]
        z_d_a, z_d_p, z_b_a, z_b_p = (distributed.all_gather_rows(z, len(index)) for z in (*z_d, *z_b))
        _, weighted, triplet = losses.wcl_loss(z_d_a, z_d_p, z_b_a, z_b_p, wcl.temperature, self.tau_plus,
                                               return_parts=True)
        return weighted + wcl.triplet_weight * triplet, weighted, triplet

    def train_epoch(self, epoch: int) -> dict[str, float]:
        progress = Progress()
        batches = shuffled_batches(len(self.train), self.params.stage2.batch_size, self.generator)
        for step, index in epoch_steps(batches, epoch, self.train.x.device):
            if len(index) < 2:
                continue
            loss, weighted, triplet = self.batch_loss(index)
            progress.watch(loss, step)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            distributed.sum_gradients(self.optimizer)
            self.optimizer.step()
            progress.add(loss=loss.detach(), weighted_infonce=weighted.detach(), triplet=triplet.detach())
        return progress.means()


def wcl_method(inputs: Stage2Inputs) -> Stage2Setup:
    model, biased = fresh_model(inputs), fresh_model(inputs)
    out = inputs.params.stage2.wcl.projection_dim
    projector = projection_head(model.encoder.dim, out).to(inputs.device)
    biased_projector = projection_head(biased.encoder.dim, out).to(inputs.device)
    parameters = [*model.encoder.parameters(), *projector.parameters(), *biased.encoder.parameters(),
                  *biased_projector.parameters()]
    optimizer, scheduler = stage2_optimiser(inputs, parameters)
    task = WCLTask(model, biased, projector, biased_projector, optimizer, inputs.splits["train"], inputs.params,
                   inputs.generator, inputs.device)
    return Stage2Setup(task, model, optimizer, scheduler)
