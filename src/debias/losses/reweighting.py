"""Classification-side reweighting objectives: LfF's generalised cross-entropy and weights, GroupDRO."""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from debias.losses._common import _compute


def _check_logits(logits: Tensor, y: Tensor) -> None:
    if logits.dim() != 2:
        raise ValueError(f"logits must be [B, C], got shape {tuple(logits.shape)}")
    if y.dim() != 1 or y.shape[0] != logits.shape[0]:
        raise ValueError(f"y must be [B] with B = {logits.shape[0]}, got shape {tuple(y.shape)}")


def generalized_cross_entropy(
    logits: Tensor, y: Tensor, q: float = 0.7, *, reduction: Literal["mean", "none"] = "mean"
) -> Tensor:
    r"""Generalised cross-entropy (Zhang & Sabuncu 2018; LfF's biased-model loss): ``mean_i (1 - p_{i,y_i}^q) / q``.

    ``p = softmax(logits)``; computed as ``-expm1(q log p_y) / q`` (accurate for small
    ``q``); ``q = 0`` is the limit, cross-entropy ``-log p_y``.  Its gradient is
    ``p_y^q (softmax - onehot(y))`` per sample: cross-entropy's, scaled by how confident the
    model already is, so easy (bias-aligned) samples dominate.  LfF and the WCL paper use
    ``q = 0.7`` / a grid over ``(0, 1]``.  (LfF's released code trains with the surrogate
    ``CE * detach(p_y^q) * q``, whose gradient is ``q`` times this one; this is the formula.)
    ``reduction="none"`` returns the ``[B]`` per-sample losses.
    """
    _check_logits(logits, y)
    if not 0 <= q <= 1:
        raise ValueError(f"q must be in [0, 1], got {q}")
    lc = _compute(logits)
    log_p_y = torch.log_softmax(lc, dim=1).gather(1, y.to(lc.device)[:, None]).squeeze(1)
    per_sample = -log_p_y if q == 0 else -torch.expm1(q * log_p_y) / q
    if reduction == "none":
        return per_sample
    if reduction != "mean":
        raise ValueError(f"reduction must be 'mean' or 'none', got {reduction!r}")
    return per_sample.mean()


def lff_weights(loss_biased: Tensor, loss_debiased: Tensor) -> Tensor:
    r"""LfF relative difficulty ``W(x) = CE_b(x) / (CE_b(x) + CE_d(x))`` per sample (detached, in [0, 1]).

    ``loss_biased`` / ``loss_debiased``: per-sample cross-entropies ``[B]`` of the biased
    (GCE-trained) and the debiased model; ``0 / 0`` gives 0, as LfF's train.py
    (``loss_b / (loss_b + loss_d + 1e-8)``; its ``1e-8`` is left out elsewhere).  The debiased model then
    minimises ``mean_i W(x_i) CE_d(x_i)`` (LfF Eq. 3; WCL paper Eq. 4).  LfF's released code
    first smooths each sample's CE by a per-sample exponential moving average over epochs
    (α = 0.7) and divides it by the maximum of that average over the sample's class in the
    whole training set; both need state across steps and are the caller's job (pass the
    smoothed, normalised losses here).
    """
    if loss_biased.shape != loss_debiased.shape:
        raise ValueError("loss_biased and loss_debiased must have the same shape")
    with torch.no_grad():
        den = loss_biased + loss_debiased
        ratio = loss_biased / den.clamp_min(torch.finfo(den.dtype).tiny)
        return torch.where(den > 0, ratio, 0.0)


def group_mean_losses(per_sample_loss: Tensor, groups: Tensor, num_groups: int) -> tuple[Tensor, Tensor]:
    """Mean loss of each group in the batch ``[G]`` (0 for absent groups, with grad) and the batch counts ``[G]``."""
    if per_sample_loss.dim() != 1 or groups.shape != per_sample_loss.shape:
        raise ValueError("per_sample_loss and groups must both be [B]")
    groups = groups.to(per_sample_loss.device)
    # a scatter, not bincount (whose output size needs a host sync on a GPU); an id outside [0, G) is an IndexError
    counts = torch.zeros(num_groups, dtype=torch.long, device=groups.device).index_add_(0, groups, torch.ones_like(groups))
    sums = per_sample_loss.new_zeros(num_groups).index_add(0, groups, per_sample_loss)
    return sums / counts.clamp_min(1).to(sums.dtype), counts


def group_dro_weights(
    q: Tensor,
    group_losses: Tensor,
    group_counts: Tensor,
    step_size: float = 0.01,
    adjustment: float = 0.0,
    *,
    batch_counts: Tensor | None = None,
) -> Tensor:
    r"""GroupDRO online step (Sagawa et al. 2020, Alg. 1, with Sec. 3.3's group adjustment):
    ``q_g <- q_g exp(η (L_g + C / sqrt(n_g)))`` for the groups present in the batch, renormalised.

    ``q [G]``: current group weights (sum 1); ``group_losses [G]``: mean loss of each group in
    the batch (detached here); ``group_counts [G]``: the groups' training-set sizes ``n_g``
    of the adjustment ``C / sqrt(n_g)`` (``adjustment`` = C, 0 = none); ``step_size`` = η_q
    (the paper's 0.01).  ``batch_counts [G]`` (``None`` = every group present) marks the
    groups with no sample in the batch: they keep their weight exactly, and the present
    groups are renormalised to the mass they held before,
    ``q_P <- (sum_P q) q_P e^{η a_P} / sum_P q e^{η a}``.  This equals the full update with
    each absent group's adjusted loss set to ``(1/η) log(sum_P q e^{η a} / sum_P q)``, a
    soft maximum of the present ones: an unobserved group is neither rewarded nor penalised.
    (The authors' code gives an absent group loss 0 but still its adjustment, so it loses
    weight for not being drawn.)  With no group present ``q`` is returned unchanged.
    Alg. 1: update ``q`` first, then step θ on ``group_dro_loss`` with the new ``q``.
    """
    if q.dim() != 1 or group_losses.shape != q.shape or group_counts.shape != q.shape:
        raise ValueError("q, group_losses and group_counts must all be [G]")
    if step_size < 0 or adjustment < 0:
        raise ValueError("step_size and adjustment must be >= 0")
    with torch.no_grad():
        present = torch.ones_like(q, dtype=torch.bool) if batch_counts is None else batch_counts.to(q.device) > 0
        adjusted = group_losses.detach().to(q.dtype)
        if adjustment != 0:
            adjusted = adjusted + adjustment / group_counts.to(q.dtype).sqrt()
        adjusted = torch.where(present, adjusted, 0.0)
        shift = torch.where(present, adjusted, float("-inf")).max()  # e^{η (a - shift)} <= 1: no overflow
        shift = torch.where(torch.isfinite(shift), shift, 0.0)  # no group present: q comes back unchanged below
        scaled = torch.where(present, q * torch.exp(step_size * (adjusted - shift)), 0.0)
        mass = torch.where(present, q, 0.0).sum()
        total = scaled.sum()
        renormalised = scaled * (mass / total.clamp_min(torch.finfo(q.dtype).tiny))
        return torch.where(present, renormalised, q)


def group_dro_loss(per_sample_loss: Tensor, groups: Tensor, q: Tensor) -> Tensor:
    r"""GroupDRO objective ``sum_g q_g L_g``, ``L_g = mean_{i in batch: g_i = g} loss_i`` (absent groups add 0).

    ``q [G]`` is a constant (detached); ``groups [B]`` are integer ids in ``[0, G)``.
    """
    if q.dim() != 1:
        raise ValueError("q must be [G]")
    means, _ = group_mean_losses(per_sample_loss, groups, q.shape[0])
    return (q.detach().to(means.dtype) * means).sum()
