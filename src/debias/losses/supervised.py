"""Supervised contrastive losses: SupCon, eps-SupCon, eps-SupInfoNCE and the FairKL authors' released form."""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

from debias.losses._common import _check_batch, _check_temperature, _compute, _logsumexp, _off_diagonal, _same_label

ReleasedForm = Literal["supinfonce", "supcon"]

#: The FairKL authors' released losses return ``-(temperature / base_temperature) * log_prob`` with this
#: ``base_temperature`` (EIDOSLAB/unbiased-contrastive-learning, debiasing/losses.py, EpsilonSupInfoNCE's default,
#: which main_infonce.py keeps).
RELEASED_BASE_TEMPERATURE = 0.07
#: ... and add this inside the log of their max-shifted denominator ("prevent nan", the same file).
RELEASED_LOG_GUARD = 1e-6


def _logits_no_self(z: Tensor, temperature: float) -> Tensor:
    """``s = z z^T / tau`` with ``-inf`` on the diagonal (self-pairs never count)."""
    s = torch.mm(z / temperature, z.T)
    return s.fill_diagonal_(float("-inf"))


def _class_ids(y: Tensor) -> tuple[Tensor, Tensor]:
    """Per row: an id of its class in ``[0, B)`` (its first position in sorted ``y``) and the class's size.

    ``torch.unique``'s output size needs a host sync on a GPU; sort + searchsorted has fixed shapes."""
    ys = torch.sort(y).values
    first = torch.searchsorted(ys, y)
    return first, torch.searchsorted(ys, y, right=True) - first


def _positive_logit_mean(z: Tensor, y: Tensor, temperature: float) -> tuple[Tensor, Tensor]:
    """``mean_{p in P(i)} s_ip`` (0 where ``P(i)`` is empty) and ``|P(i)|``, in O(B D).

    ``sum_{p in P(i)} z_i . z_p = z_i . (C_{y_i} - z_i)`` with ``C_c`` the sum of class ``c``'s rows.
    """
    inverse, count = _class_ids(y)
    n_pos = count - 1
    class_sum = z.new_zeros(z.shape[0], z.shape[1]).index_add(0, inverse, z)
    pos_sum = ((z * class_sum[inverse]).sum(1) - (z * z).sum(1)) / temperature
    return pos_sum / n_pos.clamp_min(1), n_pos


def _num_positives(y: Tensor) -> Tensor:
    """``|P(i)|`` for every anchor, from class counts (O(B log B))."""
    return _class_ids(y)[1] - 1


def _mean_over_anchors(per_anchor: Tensor, valid: Tensor) -> Tensor:
    """Mean of ``per_anchor`` over ``valid`` anchors; 0 (zero gradient) where none is valid (no host sync)."""
    return torch.where(valid, per_anchor, 0.0).sum() / valid.sum().clamp_min(1)


def _no_anchor_zero(z: Tensor) -> Tensor:
    """A zero that still carries grad, returned when no anchor has a positive."""
    return (z * 0).sum()


def supcon(z: Tensor, y: Tensor, temperature: float = 0.1) -> Tensor:
    r"""SupCon L_out: ``l_i = (1/|P(i)|) sum_p -log( e^{s_ip} / sum_{a != i} e^{s_ia} )``.

    Computed as ``lse_{a != i} s_ia - mean_p s_ip``; the positive sum uses class sums of
    ``z`` (``sum_{p in P(i)} z_i . z_p = z_i . (C_{y_i} - z_i)``) so only the log-sum-exp
    touches the ``B x B`` matrix.
    """
    _check_batch(z, y)
    _check_temperature(temperature)
    zc = _compute(z)
    pos_mean, n_pos = _positive_logit_mean(zc, y.to(zc.device), temperature)
    valid = n_pos > 0
    if z.shape[0] < 2:  # no pair at all (no host sync: anchors without positive add 0 below)
        return _no_anchor_zero(z)
    lse = _logsumexp(_logits_no_self(zc, temperature), dim=1)
    return _mean_over_anchors(lse - pos_mean, valid)


def eps_supcon(z: Tensor, y: Tensor, epsilon: float = 0.0, temperature: float = 0.1) -> Tensor:
    r"""ε-SupCon (FairKL Eq. 5, no additive ε):
    ``l_i = mean_p -log( e^{s_ip} / (sum_{p' in P(i)} e^{s_ip' - ε} + sum_{n in N(i)} e^{s_in}) )``.

    ``epsilon`` is in logit units (after division by ``temperature``); ε = 0 is ``supcon``.
    """
    if epsilon == 0:
        return supcon(z, y, temperature)
    _check_batch(z, y)
    _check_temperature(temperature)
    zc = _compute(z)
    y = y.to(zc.device)
    pos_mean, n_pos = _positive_logit_mean(zc, y, temperature)
    valid = n_pos > 0
    if z.shape[0] < 2:  # no pair at all (no host sync: anchors without positive add 0 below)
        return _no_anchor_zero(z)
    s = _logits_no_self(zc, temperature)
    lse = _logsumexp(s - epsilon * _same_label(y).to(s.dtype), dim=1)  # diagonal stays -inf
    return _mean_over_anchors(lse - pos_mean, valid)


def eps_supinfonce(
    z: Tensor, y: Tensor, epsilon: float = 0.0, temperature: float = 0.1
) -> Tensor:
    r"""ε-SupInfoNCE (FairKL Eq. 4, mean over positives):
    ``l_i = mean_p -log( e^{s_ip} / (e^{s_ip - ε} + sum_{n in N(i)} e^{s_in}) )``.

    Computed as ``mean_p softplus(lse_n s_in + ε - s_ip) - ε``.  ``epsilon`` is in logit
    units (after division by ``temperature``), as in the authors' code.  An anchor with
    no negative gets ``l_i = -ε`` (the denominator is only ``e^{s_ip - ε}``).
    """
    _check_batch(z, y)
    _check_temperature(temperature)
    zc = _compute(z)
    y = y.to(zc.device)
    n_pos = _num_positives(y)
    valid = n_pos > 0
    if z.shape[0] < 2:  # no pair at all (no host sync: anchors without positive add 0 below)
        return _no_anchor_zero(z)
    same = _same_label(y)
    s = _logits_no_self(zc, temperature)
    has_neg = ~same.all(1)
    # rows without negatives get a finite dummy row, then -inf: no NaN in backward
    neg_logits = torch.where(has_neg[:, None], s.masked_fill(same, float("-inf")), 0.0)
    lse_neg = torch.where(has_neg, _logsumexp(neg_logits, dim=1), float("-inf"))
    pos = _off_diagonal(same)
    s_pos = torch.where(pos, s, 0.0)
    pair = torch.nn.functional.softplus(lse_neg[:, None] + epsilon - s_pos)
    per_anchor = torch.where(pos, pair, 0.0).sum(1) / n_pos.clamp_min(1) - epsilon
    return _mean_over_anchors(per_anchor, valid)


def released_contrastive(
    z: Tensor, y: Tensor, epsilon: float = 0.0, temperature: float = 0.1, form: ReleasedForm = "supinfonce"
) -> Tensor:
    r"""The FairKL authors' released ε-SupInfoNCE / ε-SupCon (``forward_out``), value and gradient:
    ``(τ / 0.07) mean_i [ (1 / max(|P(i)|, 1)) sum_{p in P(i)} ( log(D_ip + 1e-6) - l_ip ) ]``.

    ``l_ij = s_ij - m_i`` with ``m_i = max_j s_ij`` (self included, detached); ``form="supinfonce"``:
    ``D_ip = e^{l_ip - ε} + sum_{n in N(i)} e^{l_in}``; ``form="supcon"``:
    ``D_ip = sum_{p' in P(i)} e^{l_ip' - ε} + sum_{n in N(i)} e^{l_in}``.  The mean runs over all B
    anchors (one without a positive adds 0), not only those with a positive as in ``eps_supinfonce``;
    the ``1e-6`` (``RELEASED_LOG_GUARD``) is added to the max-shifted sum, so it weighs
    ``1e-6 e^{m_i}`` in unshifted units.  Without those three (factor, guard, anchors) this is
    ``eps_supinfonce`` / ``eps_supcon``.  Source: EIDOSLAB/unbiased-contrastive-learning,
    debiasing/losses.py (``EpsilonSupInfoNCE``, ``EpsilonSupCon``), one view, ``contrast_mode='all'``.
    """
    _check_batch(z, y)
    _check_temperature(temperature)
    if form not in ("supinfonce", "supcon"):
        raise ValueError(f"unknown released form {form!r}; use 'supinfonce' or 'supcon'")
    zc = _compute(z)
    y = y.to(zc.device)
    s = torch.mm(zc / temperature, zc.T)
    m = s.detach().amax(1)
    same = _same_label(y)
    pos = _off_diagonal(same)
    n_pos = pos.sum(1)
    no_self = _logits_no_self(zc, temperature)
    if form == "supinfonce":
        neg_logits = no_self.masked_fill(same, float("-inf"))
        has_neg = ~same.all(1)
        safe = torch.where(has_neg[:, None], neg_logits, 0.0)  # finite rows: no NaN in backward
        lse_neg = torch.where(has_neg, _logsumexp(safe, dim=1), float("-inf"))
        log_den = torch.logaddexp(torch.where(pos, s, 0.0) - epsilon, lse_neg[:, None])  # [B, B]
    else:
        log_den = _logsumexp(no_self - epsilon * same.to(s.dtype), dim=1)[:, None]  # [B, 1]
    guarded = torch.logaddexp(log_den - m[:, None], s.new_tensor(math.log(RELEASED_LOG_GUARD)))
    pair = guarded - (s - m[:, None])
    per_anchor = torch.where(pos, pair, 0.0).sum(1) / n_pos.clamp_min(1)
    return (temperature / RELEASED_BASE_TEMPERATURE) * per_anchor.mean()
