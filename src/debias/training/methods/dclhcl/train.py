"""WCL's comparison rows (difficulty-based sampling paper, Tables 1-3): ``dcl``, debiased contrastive learning
(Chuang et al. 2020: InfoNCE whose negative term is corrected for same-class "negatives" with the class prior τ+),
and ``hcl``, hard-negative contrastive learning (Robinson et al. 2021: the same with negatives reweighted by
``e^{β s}``), both self-supervised (labels unused) on two augmented views per row: :func:`debias.losses.dcl`,
:func:`debias.losses.hcl` (two-view, symmetric, the other 2B - 2 views as negatives, as WCL's Sec. 6).

Views by modality (:class:`debias.training.methods.views.Views`): images get WCL's SimCLR views
(:func:`debias.training.methods.selfsup.train.wcl_image_view`, ``stage2.wcl``'s crop, colour strength 1.0 and grayscale
options), feature vectors SCARF's feature corruption, so the WCL, DCL and HCL rows differ only in their loss. One
encoder and, as the official DCL / HCL code (a 128-d head after the encoder) and our WCL, a projection head
(:func:`debias.training.methods.selfsup.train.projection_head`, ``stage2.dcl.projection_dim`` /
``stage2.hcl.projection_dim``) the loss is computed on; the linear head is fitted on the encoder's output after every
epoch (:mod:`debias.training.methods.head`). Each method has its own temperature and τ+ (``stage2.dcl``,
``stage2.hcl``; WCL paper Sec. 6.1: t = 0.5 for all methods, τ+ = 0.1 on CIFAR-10, β = 1; τ+ null: 1 / classes).
"""

from __future__ import annotations

import torch
from torch import nn

from debias import losses
from debias.core import distributed
from debias.data.store import BiasedSplit
from debias.models import Network
from debias.params import Params
from debias.training.loop import GeneratorTask
from debias.training.methods.base import (Progress, Stage2Inputs, Stage2Setup, class_prior, epoch_steps, fresh_model,
                                          gather_rows, normalise, on_device, shuffled_batches,
                                          stage2_optimiser, to_device)
from debias.training.methods.dclhcl import DCL, HCL
from debias.training.methods.selfsup.train import projection_head, wcl_image_view
from debias.training.methods.views import Views


def two_view_loss(method: str, z1: torch.Tensor, z2: torch.Tensor, params: Params, tau_plus: float) -> torch.Tensor:
    """``dcl`` or ``hcl`` of the two normalised (projected) views with the method's params and class prior."""
    if method == DCL:
        return losses.dcl(z1, z2, params.stage2.dcl.temperature, tau_plus)
    hcl = params.stage2.hcl
    return losses.hcl(z1, z2, hcl.temperature, tau_plus, hcl.beta)


class TwoViewTask(GeneratorTask):
    """Shuffled batches, two views per row, the method's two-view loss on the normalised projections."""

    def __init__(self, method: str, model: Network, projector: nn.Module, optimizer: torch.optim.Optimizer,
                 train: BiasedSplit, params: Params, generator: torch.Generator, device: torch.device) -> None:
        self.method, self.model, self.projector, self.optimizer = method, model, projector, optimizer
        self.train = on_device(train, device)  # batches are gathered (and augmented) on the device
        self.params, self.generator, self.device = params, generator, device
        self.views = Views(self.train, params, wcl_image_view(params.stage2.wcl))
        own = getattr(params.stage2, method)
        self.tau_plus = class_prior(own.tau_plus, train.n_classes, f"stage2.{method}.tau_plus")

    def modules(self) -> dict[str, nn.Module]:
        return {"model": self.model, "projector": self.projector}

    def project(self, views: torch.Tensor) -> torch.Tensor:
        """``z = g(f(x)) / |g(f(x))|``: encoder, projection head, L2-normalised (the official code's ``out``)."""
        return normalise(self.projector(self.model.embed(views)))

    def batch_loss(self, first: torch.Tensor, second: torch.Tensor, batch: int) -> torch.Tensor:
        """The two-view loss of one batch's two views (this rank's shard; ``batch`` rows in all)."""
        z1, z2 = (distributed.all_gather_rows(self.project(v), batch) for v in (first, second))
        return two_view_loss(self.method, z1, z2, self.params, self.tau_plus)

    def train_epoch(self, epoch: int) -> dict[str, float]:
        progress = Progress()
        batches = shuffled_batches(len(self.train), self.params.stage2.batch_size, self.generator)
        for step, index in epoch_steps(batches, epoch, self.train.x.device):
            if len(index) < 2:
                continue  # the loss needs another row's views as negatives
            rows = gather_rows(self.train.x, index)
            local = distributed.shard_slice(len(index))
            first = to_device(self.views(rows, self.generator)[local], self.device)
            second = to_device(self.views(rows, self.generator)[local], self.device)
            loss = self.batch_loss(first, second, len(index))
            progress.watch(loss, step)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            distributed.sum_gradients(self.optimizer)
            self.optimizer.step()
            progress.add(loss=loss.detach())
        return progress.means()


def _setup(method: str, inputs: Stage2Inputs) -> Stage2Setup:
    model = fresh_model(inputs)
    projector = projection_head(model.encoder.dim, getattr(inputs.params.stage2, method).projection_dim)
    projector = projector.to(inputs.device)
    optimizer, scheduler = stage2_optimiser(inputs, [*model.encoder.parameters(), *projector.parameters()])
    task = TwoViewTask(method, model, projector, optimizer, inputs.splits["train"], inputs.params, inputs.generator,
                       inputs.device)
    return Stage2Setup(task, model, optimizer, scheduler)


def dcl_method(inputs: Stage2Inputs) -> Stage2Setup:
    return _setup(DCL, inputs)


def hcl_method(inputs: Stage2Inputs) -> Stage2Setup:
    return _setup(HCL, inputs)
