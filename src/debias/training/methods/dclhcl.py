"""WCL's comparison rows (difficulty-based sampling paper, Tables 1-3): ``dcl``, debiased contrastive learning
(Chuang et al. 2020: InfoNCE whose negative term is corrected for same-class "negatives" with the class prior τ+),
and ``hcl``, hard-negative contrastive learning (Robinson et al. 2021: the same with negatives reweighted by
``e^{β s}``), both self-supervised (labels unused) on two augmented views per row: :func:`debias.losses.dcl`,
:func:`debias.losses.hcl` (two-view, symmetric, the other 2B - 2 views as negatives, as WCL's Sec. 6).

Views by modality (:class:`debias.training.methods.views.Views`): images get the SimCLR views these papers train
with (:func:`debias.data.augment.simclr_view`: random resized crop, colour jitter, grayscale), feature vectors
SCARF's feature corruption. One encoder, no projection head; its linear head is fitted after every epoch
(:mod:`debias.training.methods.head`). Each method has its own temperature and τ+ (``stage2.dcl``, ``stage2.hcl``;
WCL paper Sec. 6.1: t = 0.5 for all methods, τ+ = 0.1 on CIFAR-10, β = 1).
"""

from __future__ import annotations

import torch

from debias import distributed, losses
from debias.data.augment import simclr_view
from debias.data.store import BiasedSplit
from debias.models import Network
from debias.params import Params
from debias.training.loop import GeneratorTask
from debias.training.methods.base import (Progress, Stage2Inputs, Stage2Setup, epoch_steps, fresh_model, normalise,
                                          on_device, register_method, shuffled_batches, stage2_optimiser,
                                          to_device)
from debias.training.methods.views import Views


def two_view_loss(method: str, z1: torch.Tensor, z2: torch.Tensor, params: Params) -> torch.Tensor:
    """``dcl`` or ``hcl`` of the two normalised views with the method's params."""
    if method == "dcl":
        dcl = params.stage2.dcl
        return losses.dcl(z1, z2, dcl.temperature, dcl.tau_plus)
    hcl = params.stage2.hcl
    return losses.hcl(z1, z2, hcl.temperature, hcl.tau_plus, hcl.beta)


class TwoViewTask(GeneratorTask):
    """Shuffled batches, two views per row, the method's two-view loss on the normalised encoder outputs."""

    def __init__(self, method: str, model: Network, optimizer: torch.optim.Optimizer, train: BiasedSplit,
                 params: Params, generator: torch.Generator, device: torch.device) -> None:
        self.method, self.model, self.optimizer = method, model, optimizer
        self.train = on_device(train, device)  # batches are gathered (and augmented) on the device
        self.params, self.generator, self.device = params, generator, device
        self.views = Views(self.train, params, lambda x, g: simclr_view(x, g))

    def train_epoch(self, epoch: int) -> dict[str, float]:
        progress = Progress()
        batches = shuffled_batches(len(self.train), self.params.stage2.batch_size, self.generator)
        for step, index in epoch_steps(batches, epoch, self.train.x.device):
            if len(index) < 2:
                continue  # the loss needs another row's views as negatives
            rows = self.train.x[index]
            local = distributed.shard_slice(len(index))
            first = to_device(self.views(rows, self.generator)[local], self.device)
            second = to_device(self.views(rows, self.generator)[local], self.device)
            z1, z2 = (distributed.all_gather_rows(normalise(self.model.embed(v)), len(index)) for v in (first, second))
            loss = two_view_loss(self.method, z1, z2, self.params)
            progress.watch(loss, step)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            distributed.sum_gradients(self.optimizer)
            self.optimizer.step()
            progress.add(loss=loss.detach())
        return progress.means()


def _setup(method: str, inputs: Stage2Inputs) -> Stage2Setup:
    model = fresh_model(inputs)
    optimizer, scheduler = stage2_optimiser(inputs, model.encoder.parameters())
    task = TwoViewTask(method, model, optimizer, inputs.splits["train"], inputs.params, inputs.generator, inputs.device)
    return Stage2Setup(task, model, optimizer, scheduler)


@register_method("dcl", temperature=lambda p: ("stage2.dcl.temperature", p.stage2.dcl.temperature))
def dcl_method(inputs: Stage2Inputs) -> Stage2Setup:
    return _setup("dcl", inputs)


@register_method("hcl", temperature=lambda p: ("stage2.hcl.temperature", p.stage2.hcl.temperature))
def hcl_method(inputs: Stage2Inputs) -> Stage2Setup:
    return _setup("hcl", inputs)
