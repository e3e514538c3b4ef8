"""Private helpers shared by several loss families: dtype promotion, input checks, log-sum-exp, pair masks."""

from __future__ import annotations

import torch
from torch import Tensor


def _compute(z: Tensor) -> Tensor:
    """Promote half-precision inputs to float32 (the losses are computed in >= float32)."""
    if z.dtype in (torch.float16, torch.bfloat16):
        return z.float()
    return z


def _check_batch(z: Tensor, y: Tensor) -> None:
    if z.dim() != 2:
        raise ValueError(f"z must be [B, D], got shape {tuple(z.shape)}")
    if y.dim() != 1 or y.shape[0] != z.shape[0]:
        raise ValueError(f"y must be [B] with B = {z.shape[0]}, got shape {tuple(y.shape)}")


def _check_temperature(temperature: float) -> None:
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")


def _logsumexp(x: Tensor, dim: int, weights: Tensor | None = None) -> Tensor:
    """``log sum w e^x = m + log sum w e^(x - m)``, ``m`` the (detached) max along ``dim``.

    Same values as ``torch.logsumexp`` (``weights=None``), about twice as fast
    forward+backward on CPU (measured); positive ``weights`` avoid a ``log(w)`` pass.
    """
    m = x.detach().amax(dim, keepdim=True)
    m = torch.where(torch.isfinite(m), m, 0.0)
    e = torch.exp(x - m)
    if weights is not None:
        e = e * weights
    return (m + torch.log(e.sum(dim, keepdim=True))).squeeze(dim)


def _same_label(y: Tensor) -> Tensor:
    """Boolean ``[B, B]`` matrix ``y_i == y_j`` (diagonal included)."""
    return y[:, None] == y[None, :]


def _off_diagonal(mask: Tensor) -> Tensor:
    """``mask`` with its diagonal set to False (a new tensor)."""
    return mask.clone().fill_diagonal_(False)


def _sq_dists(z: Tensor) -> Tensor:
    """``d_ij = ||z_i - z_j||^2 = |z_i|^2 + |z_j|^2 - 2 z_i . z_j``."""
    sq = (z * z).sum(1)
    return sq[:, None] + sq[None, :] - 2 * torch.mm(z, z.T)
