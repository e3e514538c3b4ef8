"""Batched augmentations (no per-sample Python loops): uint8 image tensors and float feature vectors.

Images ``[N,3,H,W]``: :func:`random_shift`, :func:`add_noise`, :func:`view` (WCL's views on digits).
Feature vectors ``[N,F]``: :func:`tabular_view`, SCARF's random feature corruption. Pixel
augmentations are image-only: :func:`random_shift` passes feature vectors through unchanged (and
says so once), :func:`view` refuses them rather than clamp standardised features to 0..255.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch
import torch.nn.functional as F


def random_shift(x: torch.Tensor, max_shift: int, generator: torch.Generator) -> torch.Tensor:
    """Translate each image by (dy, dx) ~ U{-max_shift..max_shift}^2, zero-filled; shape and dtype kept.

    Feature vectors ``[N,F]`` have no pixels to shift: they are returned unchanged (a warning says
    that the shift, e.g. ``erm.augment_shift``, is ignored), so image-only defaults do not fail on tabular data.

    One ``gather`` from the zero-padded images along their flattened pixels (4x faster on CPU than
    advanced indexing with broadcast row and column indices, with the same result).
    """
    if max_shift == 0:
        return x
    if x.ndim == 2:
        warnings.warn(f"a random shift of {max_shift} pixels (augment_shift / max_shift) is image-only: "
                      "ignored for feature vectors", stacklevel=2)
        return x
    n, c, h, w = x.shape
    padded = F.pad(x, (max_shift, max_shift, max_shift, max_shift))
    width = w + 2 * max_shift
    dy = torch.randint(0, 2 * max_shift + 1, (n,), generator=generator).to(x.device)
    dx = torch.randint(0, 2 * max_shift + 1, (n,), generator=generator).to(x.device)
    pixels = (torch.arange(h, device=x.device)[:, None] * width + torch.arange(w, device=x.device)[None, :]).flatten()
    index = (dy * width + dx)[:, None] + pixels[None, :]  # [n, h*w] flat positions in the padded image
    return padded.flatten(2).gather(2, index[:, None, :].expand(n, c, h * w)).view(n, c, h, w)


def add_noise(x: torch.Tensor, std: float, generator: torch.Generator) -> torch.Tensor:
    """Float images in 0..255 plus N(0, std^2) pixel noise, clamped to 0..255."""
    if std == 0:
        return x.float()
    noise = torch.randn(x.shape, generator=generator).to(x.device) * std
    return (x.float() + noise).clamp_(0, 255)


def view(x: torch.Tensor, max_shift: int, noise_std: float, generator: torch.Generator) -> torch.Tensor:
    """One augmented view of images: random translation, then Gaussian pixel noise (float, 0..255)."""
    if x.ndim != 4:
        raise ValueError(f"view() augments images [N,3,H,W], got shape {tuple(x.shape)}; "
                         "feature vectors take tabular_view() (SCARF feature corruption)")
    return add_noise(random_shift(x, max_shift, generator), noise_std, generator)


# --------------------------------------------------------------------------- feature vectors


def feature_groups(feature_names: Sequence[str]) -> torch.Tensor:
    """Original-column index per feature column: one-hot columns ``column=value`` of one column share it.

    int64 ``[F]``, numbered in order of first appearance (``age``, ``sex=Female``, ``sex=Male`` -> 0, 1, 1)."""
    index: dict[str, int] = {}
    return torch.tensor([index.setdefault(name.split("=", 1)[0], len(index)) for name in feature_names],
                        dtype=torch.long)


def tabular_view(x: torch.Tensor, generator: torch.Generator, *, corruption_rate: float = 0.6,
                 pool: torch.Tensor | None = None, groups: torch.Tensor | None = None) -> torch.Tensor:
    """One augmented view of feature vectors ``[N,F]`` by SCARF's random feature corruption (float, same shape).

    SCARF (Bahri, Jiang, Tay, Metzler: "SCARF: Self-Supervised Contrastive Learning using Random
    Feature Corruption", ICLR 2022): for every row, a random subset of ``round(corruption_rate * G)``
    of its G features is replaced by draws from each feature's empirical marginal distribution, i.e.
    by that feature's value in a uniformly drawn row of ``pool`` (SCARF: the training set; default:
    the batch ``x`` itself). 0.6 is SCARF's default corruption rate. ``groups`` (int64 ``[F]``, see
    :func:`feature_groups`) makes the one-hot columns of one original column a single feature,
    replaced together from one donor row, so a corrupted row stays a valid one-hot encoding
    (default: every column its own feature, as in SCARF). All randomness comes from ``generator``
    (on the CPU), so a seeded generator gives the same views on any device.
    """
    if not 0.0 <= corruption_rate <= 1.0:
        raise ValueError(f"corruption_rate = {corruption_rate}; allowed: 0 <= corruption_rate <= 1")
    if x.ndim != 2:
        raise ValueError(f"tabular_view() takes feature vectors [N,F], got shape {tuple(x.shape)}")
    pool = x if pool is None else pool
    n, n_features = x.shape
    if pool.ndim != 2 or pool.shape[1] != n_features or len(pool) == 0:
        raise ValueError(f"pool has shape {tuple(pool.shape)}; allowed: [M,{n_features}] with M >= 1")
    groups = torch.arange(n_features) if groups is None else groups.long().cpu()
    n_groups = int(groups.max()) + 1 if n_features else 0
    if groups.shape != (n_features,) or not torch.equal(torch.unique(groups), torch.arange(n_groups)):
        raise ValueError(f"groups {groups.tolist()[:10]} (shape {tuple(groups.shape)}); allowed: one index per feature "
                         f"column ([{n_features}]), using every index 0, 1, ..., G-1")
    n_corrupt = int(round(corruption_rate * n_groups))
    x = x.float()
    if n == 0 or n_corrupt == 0:
        return x.clone()
    # the n_corrupt groups with the smallest uniform scores: a uniformly random subset of that size per row
    scores = torch.rand(n, n_groups, generator=generator)
    chosen = torch.zeros(n, n_groups, dtype=torch.bool).scatter_(1, scores.topk(n_corrupt, dim=1, largest=False).indices, True)
    donors = torch.randint(0, len(pool), (n, n_groups), generator=generator)
    corrupt, donor = chosen[:, groups].to(x.device), donors[:, groups].to(pool.device)  # per feature column
    replacement = pool.float()[donor, torch.arange(n_features, device=pool.device)[None, :]].to(x.device)
    return torch.where(corrupt, replacement, x)
