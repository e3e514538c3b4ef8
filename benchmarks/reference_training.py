"""The papers' way of training one epoch, the speed benchmark's baseline: a per-sample Dataset of PIL images with
torchvision transforms, a DataLoader, and the mask-and-sum losses of :mod:`benchmarks.reference_losses`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torchvision import transforms as T

from benchmarks.reference_losses import (base_cnc_two_sided, base_eps_supcon, base_eps_supinfonce, base_fairkl,
                                         base_supcon, base_wcl)
from debias.schema import Params
from debias.training.methods.cnc.sampling import CNCBatchSampler
from debias.training.methods import supcon as supcon_family


class PaperImages(Dataset):
    """One sample at a time: a PIL image through torchvision transforms (``views`` of it), its label and extras."""

    def __init__(self, images_hwc: np.ndarray, labels: np.ndarray, transform: Callable, views: int = 1,
                 extras: tuple[np.ndarray, ...] = ()) -> None:
        self.images, self.labels, self.transform, self.views, self.extras = images_hwc, labels, transform, views, extras

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple:
        image = Image.fromarray(self.images[index])
        views = [self.transform(image) for _ in range(self.views)]
        return (*views, int(self.labels[index]), *(int(e[index]) for e in self.extras))


class AddGaussianNoise:
    """Pixel noise in [0, 1] units, clamped (WCL's view; debias adds std/255 of it to 0..255 pixels)."""

    def __init__(self, std: float) -> None:
        self.std = std

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return (x + torch.randn_like(x) * self.std).clamp(0.0, 1.0)


def paper_transform(size: int, shift: int, noise_std: float = 0.0) -> T.Compose:
    """RandomCrop with zero padding (= a random shift of up to ``shift`` px), ToTensor, (noise), Normalize(0.5, 0.5)."""
    steps: list[Any] = [T.RandomCrop(size, padding=shift)] if shift else []
    steps.append(T.ToTensor())
    if noise_std:
        steps.append(AddGaussianNoise(noise_std / 255.0))
    steps.append(T.Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)))
    return T.Compose(steps)


class PaperNet(nn.Module):
    """The same LeNet-5 encoder and head, fed normalised float images (the papers' transforms normalise)."""

    def __init__(self, network: nn.Module) -> None:
        super().__init__()
        self.encoder, self.head = network.encoder, network.head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x))


def loader(dataset: Dataset, batch_size: int, num_workers: int, seed: int) -> DataLoader:
    return DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=num_workers, drop_last=False,
                      generator=torch.Generator().manual_seed(seed), persistent_workers=num_workers > 0)


def baseline_classifier_epoch(model: PaperNet, optimizer: torch.optim.Optimizer, data: DataLoader,
                              device: torch.device) -> None:
    model.train()
    total_loss, correct, seen = 0.0, 0, 0
    for x, y in data:
        x, y = x.to(device), y.to(device)
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total_loss += loss.item() * len(y)
        correct += (logits.argmax(1) == y).sum().item()
        seen += len(y)


def baseline_contrastive_epoch(model: PaperNet, optimizer: torch.optim.Optimizer, data: DataLoader, params: Params,
                               device: torch.device) -> None:
    method, loss_params = params.stage2.method, params.loss
    tau, eps = loss_params.temperature, supcon_family.epsilon(params, method)
    model.train()
    running = 0.0
    for x, y, bias in data:
        x, y, bias = x.to(device), y.to(device), bias.to(device)
        z = F.normalize(model.encoder(x), dim=1)
        if method == "supcon":
            con = base_supcon(z, y, tau)
        elif method == "eps_supcon":
            con = base_eps_supcon(z, y, eps, tau)
        else:
            con = base_eps_supinfonce(z, y, eps, tau)
        loss = loss_params.alpha * con
        if supcon_family.fairkl_weight(params, method) > 0:
            loss = loss + supcon_family.fairkl_weight(params, method) * base_fairkl(z, y, bias)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        running += loss.item()


def simclr_transform(size: int, wcl: Any) -> T.Compose:
    """torchvision's SimCLR view with the strengths of stage2.wcl: RandomResizedCrop, ColorJitter (p), RandomGrayscale."""
    s = wcl.colour_strength
    return T.Compose([T.RandomResizedCrop(size, scale=(wcl.crop_min_scale, 1.0)),
                      T.RandomApply([T.ColorJitter(0.8 * s, 0.8 * s, 0.8 * s, min(0.2 * s, 0.5))], p=wcl.jitter_p),
                      T.RandomGrayscale(p=wcl.grayscale_p), T.ToTensor(), T.Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))])


def baseline_wcl_epoch(model: PaperNet, biased: PaperNet, projectors: tuple[nn.Module, nn.Module],
                       optimizer: torch.optim.Optimizer, data: DataLoader, params: Params, device: torch.device) -> None:
    wcl = params.stage2.wcl
    model.train()
    biased.train()
    projector, biased_projector = projectors
    running = 0.0
    for anchor, positive, _ in data:
        anchor, positive = anchor.to(device), positive.to(device)
        z_d_a, z_d_p = (F.normalize(projector(model.encoder(v)), dim=1) for v in (anchor, positive))
        z_b_a, z_b_p = (F.normalize(biased_projector(biased.encoder(v)), dim=1) for v in (anchor, positive))
        assert wcl.triplet_weight == 1.0, "base_wcl sums both terms with weight 1"
        loss = base_wcl(z_d_a, z_d_p, z_b_a, z_b_p, wcl.temperature, wcl.tau_plus)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        running += loss.item()


def baseline_cnc_epoch(model: PaperNet, optimizer: torch.optim.Optimizer, dataset: PaperImages,
                       sampler: CNCBatchSampler, params: Params, device: torch.device) -> None:
    """CNC's code: per contrastive batch, every index loaded through the dataset, one forward, a loop loss."""
    lam = params.stage2.cnc.contrastive_weight
    model.train()
    running = 0.0
    for batch in sampler:
        groups = [batch.anchors, batch.positives, batch.negatives, batch.negatives2]
        samples = [dataset[i] for group in groups for i in group.tolist()]
        x = torch.stack([s[0] for s in samples]).to(device)
        y = torch.tensor([s[1] for s in samples]).to(device)
        z = model.encoder(x)
        logits = model.head(z)
        anchors, positives, negatives, negatives2 = F.normalize(z, dim=1).split([len(g) for g in groups])
        contrastive = base_cnc_two_sided(anchors[None], positives[None], negatives[None], negatives2[None],
                                         params.stage2.cnc.temperature)
        loss = lam * contrastive + (1 - lam) * F.cross_entropy(logits, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        running += loss.item()
