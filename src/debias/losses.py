r"""Every training objective of the project (no other module may define a loss).

Conventions
-----------
* ``z`` is a float tensor ``[B, D]`` whose rows the caller has L2-normalised;
  ``s_ij = z_i . z_j / tau``.  Self-pairs (i, i) never count.
* Supervised losses: for anchor ``i``, positives ``P(i) = {j != i : y_j = y_i}``,
  negatives ``N(i) = {j : y_j != y_i}``.  They return the mean over anchors with
  ``|P(i)| >= 1`` (the others are left out of the mean, not counted as 0); if no anchor
  has a positive they return ``(z * 0).sum()`` (a zero that still carries grad).
* float16 / bfloat16 inputs are computed in float32 and the result is float32.
* Every log of a sum of exponentials is a max-shifted log-sum-exp, ``softplus`` or ``logaddexp``;
  nothing loops over samples or pairs in Python; memory is O(B^2) at most
  (``supcon``'s positive term, ``triplet`` and ``triplet_2view`` are O(B D)).

Functions (one-line formulas; ``lse`` = log-sum-exp)
----------------------------------------------------
``supcon(z, y, temperature)``
    SupCon L_out (Khosla et al.): ``l_i = lse_{a != i} s_ia - mean_{p in P(i)} s_ip``.
``eps_supcon(z, y, epsilon, temperature)``
    FairKL paper Eq. 5 without its additive constant ``eps``:
    ``l_i = mean_p [ -s_ip + log( sum_{p' in P(i)} e^{s_ip' - eps} + sum_{n in N(i)} e^{s_in} ) ]``.
``eps_supinfonce(z, y, epsilon, temperature)``
    FairKL paper Eq. 4 (mean over positives):
    ``l_i = mean_p [ -s_ip + log( e^{s_ip - eps} + sum_{n in N(i)} e^{s_in} ) ]``
    ``= mean_p softplus(lse_n s_in + eps - s_ip) - eps``.
``fairkl(z, y, bias, variant="kl")``
    FairKL regulariser on ``d_ij = ||z_i - z_j||^2`` over four pair sets
    (+a, +c, -a, -c: same/different class x same/different bias);
    ``"kl"``:  ``KL(N(mu_{+a}, var_{+a}) || N(mu_{+c}, var_{+c})) + KL(same for -)`` (Eq. 10),
    ``"mean"``: ``(mu_{+a} - mu_{+c})^2 + (mu_{-a} - mu_{-c})^2`` (Eq. 9),
    ``"released"``: the released code's moment matching on similarities plus two linear terms.
    ``fairkl_report`` returns the per-set pair counts / means / variances for logging.
``released_contrastive(z, y, epsilon, temperature, form)``
    The FairKL authors' released ε-SupInfoNCE / ε-SupCon value, with its ``τ / 0.07`` factor and
    its ``+1e-6`` inside the log, averaged over all anchors (the ``released`` objective's first term).
``cnc_contrastive(anchor, positives, negatives, temperature)``
    CNC Eq. 1 / 15: ``l_a = -mean_p log( e^{s_ap} / (sum_{p'} e^{s_ap'} + sum_n e^{s_an}) )``
    ``= lse([s_ap'; s_an]) - mean_p s_ap``; also batched over K contrastive batches.
``cnc_two_sided(anchors, positives, negatives, negatives2, temperature)``
    CNC Eq. 14: ``L(x_1, {x+}, {x-}) + L(x+_1, {x}, {x'-})`` averaged over contrastive batches.
``triplet(anchor, positive, negative=None, tau_plus=0.0)``
    Difficulty paper Eq. 5, batched: ``mean_i [ ||a_i - p_i||^2 - mean_{j != i} ||a_i - a_j||^2 ]``
    (or ``mean_n ||a_i - n||^2`` over a given negative pool); with ``tau_plus > 0`` the
    negative term becomes ``(mean_n ||a_i - n||^2 - tau_plus ||a_i - p_i||^2) / (1 - tau_plus)``.
``relative_difficulty(dist_debiased, dist_biased, mask=None)``
    ``w = 1 + Dd~ / (Dd~ + Db~)``, ``D~ = D / max_batch D`` (max over ``mask``); no gradient.

Two-view objectives: ``Z = [z1; z2]`` stacks two augmented views of B images; view ``k``'s
positive is the other view of its image (``k ± B``), its negatives ``N(k)`` the other
``N = 2B - 2`` views (``two_view_negatives``); all take the mean over the 2B views.

``nt_xent(z1, z2, temperature=0.5, tau_plus=0.0, weights=None)``
    ``l_k = -log( e^{s_k+} / (e^{s_k+} + g_k) )``, ``g_k = sum_{j in N(k)} w_kj e^{s_kj}``; with
    ``tau_plus > 0`` ``g_k = max( (g_k - tau_plus N e^{s_k+}) / (1 - tau_plus), N e^{-1/tau} )``.
``weighted_infonce_2view(z1, z2, weights, temperature, tau_plus)``
    WCL's L_wcl: ``nt_xent`` with the ``[2B, 2B]`` relative-difficulty weights.
``dcl(z1, z2, temperature, tau_plus)``
    Chuang et al.: ``nt_xent`` with ``w = 1`` and ``tau_plus > 0``.
``hcl(z1, z2, temperature, tau_plus, beta)``
    Robinson et al.: ``w_kj = e^{beta s_kj} / mean_{j' in N(k)} e^{beta s_kj'}`` (not detached).
``triplet_2view(z1, z2, tau_plus=0.0)``
    ``mean_k [ ||Z_k - Z_k+||^2 - mean_{j in N(k)} ||Z_k - Z_j||^2 ]`` (debiased like ``triplet``).
``wcl_weights(z_d1, z_d2, z_b1, z_b2)``
    ``relative_difficulty`` of the two encoders' distances on the ``[2B, 2B]`` pairs.
``wcl_loss(z_d_a, z_d_p, z_b_a, z_b_p, temperature, tau_plus)``
    Difficulty paper's full objective ``L_wcl(E_d; w) + L_tri(E_b)``, both over two views.

Classification-side objectives (logits ``[B, C]``, per-sample losses ``[B]``):

``generalized_cross_entropy(logits, y, q=0.7)``
    LfF's biased-model loss: ``mean_i (1 - p_{i,y_i}^q) / q`` (``q = 0``: cross-entropy).
``lff_weights(loss_biased, loss_debiased)``
    ``W = CE_b / (CE_b + CE_d)`` per sample, detached.
``group_dro_weights(q, group_losses, group_counts, step_size=0.01, adjustment=0.0, batch_counts=None)``
    ``q_g <- q_g exp(eta (L_g + C / sqrt(n_g)))`` over the groups in the batch, renormalised
    (absent groups keep ``q_g``).
``group_dro_loss(per_sample_loss, groups, q)``
    ``sum_g q_g mean_{i in g} loss_i``; ``group_mean_losses`` gives the per-group means.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

from debias.metrics import PAIR_KINDS

__all__ = [
    "supcon",
    "eps_supcon",
    "eps_supinfonce",
    "fairkl",
    "fairkl_report",
    "FAIRKL_SETS",
    "fairkl_pair_counts",
    "released_contrastive",
    "RELEASED_BASE_TEMPERATURE",
    "RELEASED_LOG_GUARD",
    "cnc_contrastive",
    "cnc_two_sided",
    "triplet",
    "relative_difficulty",
    "two_view_negatives",
    "nt_xent",
    "weighted_infonce_2view",
    "dcl",
    "hcl",
    "triplet_2view",
    "wcl_weights",
    "wcl_loss",
    "generalized_cross_entropy",
    "lff_weights",
    "group_mean_losses",
    "group_dro_weights",
    "group_dro_loss",
]

FairKLVariant = Literal["kl", "mean", "released"]
ReleasedForm = Literal["supinfonce", "supcon"]

#: The FairKL authors' released losses return ``-(temperature / base_temperature) * log_prob`` with this
#: ``base_temperature`` (EIDOSLAB/unbiased-contrastive-learning, debiasing/losses.py, EpsilonSupInfoNCE's default,
#: which main_infonce.py keeps).
RELEASED_BASE_TEMPERATURE = 0.07
#: ... and add this inside the log of their max-shifted denominator ("prevent nan", the same file).
RELEASED_LOG_GUARD = 1e-6

#: Names of the four FairKL pair sets, in the order used everywhere in this module (debias.metrics.PAIR_KINDS).
FAIRKL_SETS = PAIR_KINDS


# --------------------------------------------------------------------------- helpers


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


def _logits_no_self(z: Tensor, temperature: float) -> Tensor:
    """``s = z z^T / tau`` with ``-inf`` on the diagonal (self-pairs never count)."""
    s = torch.mm(z / temperature, z.T)
    return s.fill_diagonal_(float("-inf"))


def _same_label(y: Tensor) -> Tensor:
    """Boolean ``[B, B]`` matrix ``y_i == y_j`` (diagonal included)."""
    return y[:, None] == y[None, :]


def _off_diagonal(mask: Tensor) -> Tensor:
    """``mask`` with its diagonal set to False (a new tensor)."""
    return mask.clone().fill_diagonal_(False)


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


# --------------------------------------------------------------------------- SupCon family


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


# --------------------------------------------------------------------------- FairKL


def _bias_similarity(bias: Tensor, batch: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """``[B, B]`` probability that i and j share the bias: ``1[b_i == b_j]`` or ``p_i . p_j``."""
    bias = bias.to(device)
    if bias.dim() == 1 and not bias.is_floating_point():
        if bias.shape[0] != batch:
            raise ValueError(f"bias must have B = {batch} rows, got {bias.shape[0]}")
        return _same_label(bias).to(dtype)
    if bias.dim() == 2 and bias.is_floating_point():
        if bias.shape[0] != batch:
            raise ValueError(f"bias must have B = {batch} rows, got {bias.shape[0]}")
        p = bias.to(dtype)
        return torch.mm(p, p.T)
    raise ValueError(
        "bias must be integer labels [B] or float bias probabilities [B, K], "
        f"got dtype {bias.dtype} and shape {tuple(bias.shape)}"
    )


def _pair_weights(y: Tensor, bias: Tensor, dtype: torch.dtype) -> list[Tensor]:
    """Weights ``[B, B]`` (zero diagonal) of the four sets, in ``FAIRKL_SETS`` order."""
    batch = y.shape[0]
    same_y = _same_label(y)
    neg = (~same_y).to(dtype)
    pos = _off_diagonal(same_y).to(dtype)
    aligned = _bias_similarity(bias, batch, dtype, y.device)
    pos_aligned, neg_aligned = pos * aligned, neg * aligned
    return [pos_aligned, pos - pos_aligned, neg_aligned, neg - neg_aligned]


def _sq_dists(z: Tensor) -> Tensor:
    """``d_ij = ||z_i - z_j||^2 = |z_i|^2 + |z_j|^2 - 2 z_i . z_j``."""
    sq = (z * z).sum(1)
    return sq[:, None] + sq[None, :] - 2 * torch.mm(z, z.T)


def _weighted_moments(d: Tensor, w: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Unordered-pair count ``sum w / 2``, weighted mean and population variance of ``d``.

    Two passes; the mean is detached inside the variance, which changes neither the value
    nor the gradient (``sum w (d - mu) = 0``) and saves a reduction in the backward pass.
    """
    total = w.sum()
    safe = total.clamp_min(torch.finfo(d.dtype).tiny)
    flat_w = w.reshape(-1)
    mean = torch.dot(flat_w, d.reshape(-1)) / safe
    centred = d - mean.detach()
    var = torch.dot(flat_w, (centred * centred).reshape(-1)) / safe
    return total / 2, mean, var


def _gauss_kl(mu_a: Tensor, var_a: Tensor, mu_c: Tensor, var_c: Tensor) -> Tensor:
    """``KL(N(mu_a, var_a) || N(mu_c, var_c)) = ½[(var_a + (mu_a-mu_c)²)/var_c - log(var_a/var_c) - 1]``."""
    return 0.5 * ((var_a + (mu_a - mu_c).square()) / var_c - torch.log(var_a / var_c) - 1)


def _fairkl_moments(z: Tensor, y: Tensor, bias: Tensor) -> list[tuple[Tensor, Tensor, Tensor]]:
    """(count, mean, variance) of ``d_ij`` for each set in ``FAIRKL_SETS``."""
    d = _sq_dists(z)
    return [_weighted_moments(d, w) for w in _pair_weights(y, bias, z.dtype)]


def _fairkl_released(
    z: Tensor,
    y: Tensor,
    bias: Tensor,
    temperature: float,
    kld: float,
    include_self: bool,
) -> Tensor:
    """The released code's FairKL term: see ``fairkl(variant="released")``."""
    sim = torch.mm(z / temperature, z.T)
    same_y = _same_label(y)
    neg = (~same_y).to(z.dtype)
    pos = (same_y if include_self else _off_diagonal(same_y)).to(z.dtype)
    aligned = _bias_similarity(bias, y.shape[0], z.dtype, y.device)
    pos_aligned, neg_aligned = pos * aligned, neg * aligned
    masks = [pos_aligned, pos - pos_aligned, neg_aligned, neg - neg_aligned]
    padded = [sim * m for m in masks]  # zero-padded B x B matrices, as in the code
    mus = [x.sum() / m.sum().clamp_min(1) for x, m in zip(padded, masks)]
    spreads = [torch.std(x) for x in padded]  # unbiased std over all B^2 entries
    mu_pa, mu_pc, mu_na, mu_nc = mus
    sd_pa, sd_pc, sd_na, sd_nc = spreads
    mu_loss = (mu_pc - mu_pa).square() + (mu_na - mu_nc).square()
    spread_loss = (sd_pa - sd_pc).square() + (sd_na - sd_nc).square()
    return mu_loss + kld * spread_loss - mu_pc + mu_na


def fairkl(
    z: Tensor,
    y: Tensor,
    bias: Tensor,
    variant: FairKLVariant = "kl",
    *,
    variance_floor: float = 1e-6,
    released_temperature: float = 1.0,
    released_kld: float = 1.0,
    released_include_self: bool = True,
) -> Tensor:
    r"""FairKL: ``KL(N_{+a} || N_{+c}) + KL(N_{-a} || N_{-c})`` on ``d_ij = ||z_i - z_j||^2``.

    Pair sets over unordered pairs ``i != j``: positive aligned (same ``y``, same bias),
    positive conflicting (same ``y``, different bias), negative aligned (different ``y``,
    same bias), negative conflicting (different ``y``, different bias).  Each set has a
    mean ``mu`` and population variance ``var`` (divide by the count), floored at
    ``variance_floor`` so the loss stays finite.

    * ``variant="kl"`` (default, Eq. 10 for + and -):
      ``½[(var_a + (mu_a - mu_c)²)/var_c - log(var_a/var_c) - 1]`` per side.
    * ``variant="mean"`` (Eq. 9): ``(mu_{+a} - mu_{+c})² + (mu_{-a} - mu_{-c})²``.
    * ``variant="released"``: the FairKL term of the authors' released code
      (EIDOSLAB/unbiased-contrastive-learning, debiasing/losses.py ``fairkl``), not Eq. 10:
      on similarities ``s = z z^T / released_temperature`` (main_infonce.py passes 1.0),
      means ``sum(s * mask) / max(|mask|, 1)``, "spreads" = unbiased ``torch.std`` of the
      zero-padded ``B x B`` matrix ``s * mask`` (all ``B²`` entries), and
      ``L = (mu_{+c}-mu_{+a})² + (mu_{-a}-mu_{-c})² + released_kld ((sd_{+a}-sd_{+c})² +
      (sd_{-a}-sd_{-c})²) - mu_{+c} + mu_{-a}`` (the two linear terms pull same-class /
      different-bias pairs together and push different-class / same-bias pairs apart).
      Empty sets give mean 0 as in the code.  The code's positive mask ``y_i == y_j``
      keeps the diagonal, so self-pairs (i, i) count in the positive-aligned set
      (``released_include_self=True``, the default here, against this module's
      convention); ``released_kld`` is main_infonce.py's ``--kld`` (default 1).

    A side (+ or -) where either set has fewer than two pairs contributes 0 in ``"kl"``
    and ``"mean"``.

    ``bias`` is either integer labels ``[B]`` or, extension of FairKL App. B.2.4, soft bias
    probabilities ``[B, K]`` (rows of a bias-capturing model's softmax).  Then pair
    membership is weighted, ``w_same_ij = sum_k p_ik p_jk``, ``w_diff_ij = 1 - w_same_ij``,
    counts are weight sums, and ``mu``/``var`` are weighted moments
    (``sum w d / sum w``).  The paper instead divides the weighted sums by the batch size;
    normalising by the weight sum makes one-hot probabilities reproduce the hard-label
    result exactly.
    """
    _check_batch(z, y)
    zc = _compute(z)
    y = y.to(zc.device)
    if variant == "released":
        _check_temperature(released_temperature)
        return _fairkl_released(zc, y, bias, released_temperature, released_kld, released_include_self)
    if variant not in ("kl", "mean"):
        raise ValueError(f"unknown FairKL variant {variant!r}; use 'kl', 'mean' or 'released'")
    (n_pa, mu_pa, var_pa), (n_pc, mu_pc, var_pc), (n_na, mu_na, var_na), (n_nc, mu_nc, var_nc) = (
        _fairkl_moments(zc, y, bias)
    )
    if variant == "mean":
        pos_term = (mu_pa - mu_pc).square()
        neg_term = (mu_na - mu_nc).square()
    else:
        floor = variance_floor
        pos_term = _gauss_kl(mu_pa, var_pa.clamp_min(floor), mu_pc, var_pc.clamp_min(floor))
        neg_term = _gauss_kl(mu_na, var_na.clamp_min(floor), mu_nc, var_nc.clamp_min(floor))
    pos_ok = (n_pa >= 2) & (n_pc >= 2)
    neg_ok = (n_na >= 2) & (n_nc >= 2)
    return torch.where(pos_ok, pos_term, 0.0) + torch.where(neg_ok, neg_term, 0.0)


def fairkl_pair_counts(y: Tensor, bias: Tensor) -> Tensor:
    """Unordered pairs ``i != j`` in each FairKL set (``FAIRKL_SETS`` order; weight sums for soft bias): float ``[4]``.

    A side (+: the two positive sets, -: the two negative sets) contributes to ``fairkl`` only where both of its
    sets hold at least two pairs."""
    with torch.no_grad():
        return torch.stack([w.sum() / 2 for w in _pair_weights(y, bias.to(y.device), torch.float32)])


def fairkl_report(
    z: Tensor, y: Tensor, bias: Tensor, *, variance_floor: float = 1e-6
) -> dict[str, object]:
    """Per-set statistics of ``d_ij = ||z_i - z_j||^2`` for logging (no gradient).

    Returns ``{set: {"pairs", "mean", "var"}}`` for each name in ``FAIRKL_SETS`` (pairs are
    unordered; weight sums for soft bias), ``"small_sets"`` (sets with < 2 pairs, which
    zero their side), and the loss parts ``"kl_pos"``, ``"kl_neg"``, ``"mean_pos"``,
    ``"mean_neg"`` as Python floats.
    """
    _check_batch(z, y)
    with torch.no_grad():
        zc = _compute(z.detach())
        moments = _fairkl_moments(zc, y.to(zc.device), bias)
        report: dict[str, object] = {}
        for name, (count, mean, var) in zip(FAIRKL_SETS, moments):
            report[name] = {"pairs": float(count), "mean": float(mean), "var": float(var)}
        report["small_sets"] = [n for n, (c, _, _) in zip(FAIRKL_SETS, moments) if float(c) < 2]
        (n_pa, mu_pa, v_pa), (n_pc, mu_pc, v_pc), (n_na, mu_na, v_na), (n_nc, mu_nc, v_nc) = moments
        f = variance_floor
        pos_ok = float(n_pa) >= 2 and float(n_pc) >= 2
        neg_ok = float(n_na) >= 2 and float(n_nc) >= 2
        kl_pos = _gauss_kl(mu_pa, v_pa.clamp_min(f), mu_pc, v_pc.clamp_min(f))
        kl_neg = _gauss_kl(mu_na, v_na.clamp_min(f), mu_nc, v_nc.clamp_min(f))
        report["kl_pos"] = float(kl_pos) if pos_ok else 0.0
        report["kl_neg"] = float(kl_neg) if neg_ok else 0.0
        report["mean_pos"] = float((mu_pa - mu_pc).square()) if pos_ok else 0.0
        report["mean_neg"] = float((mu_na - mu_nc).square()) if neg_ok else 0.0
    return report


# --------------------------------------------------------------------------- CNC


def _cnc_batched(anchor: Tensor, positives: Tensor, negatives: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Bring CNC inputs to ``[K, A, D]``, ``[K, P, D]``, ``[K, N, D]``."""
    if positives.dim() == 2:  # one contrastive batch
        if negatives.dim() != 2:
            raise ValueError("positives [P, D] needs negatives [N, D]")
        anchor = anchor.reshape(1, -1, anchor.shape[-1])
        return anchor, positives[None], negatives[None]
    if positives.dim() == 3:  # K contrastive batches
        if negatives.dim() != 3 or negatives.shape[0] != positives.shape[0]:
            raise ValueError("positives [K, P, D] needs negatives [K, N, D]")
        if anchor.dim() == 2:
            anchor = anchor[:, None, :]
        if anchor.dim() != 3 or anchor.shape[0] != positives.shape[0]:
            raise ValueError("positives [K, P, D] needs anchor [K, D] or [K, A, D]")
        return anchor, positives, negatives
    raise ValueError(f"positives must be [P, D] or [K, P, D], got {tuple(positives.shape)}")


def cnc_contrastive(
    anchor: Tensor, positives: Tensor, negatives: Tensor, temperature: float = 0.05
) -> Tensor:
    r"""CNC Eq. 1/15: ``l_a = -(1/P) sum_p log( e^{s_ap} / (sum_{p'} e^{s_ap'} + sum_n e^{s_an}) )``.

    Computed as ``lse([s_ap'; s_an]) - mean_p s_ap`` with ``s = z_a . z / temperature``.

    Shapes: one contrastive batch, ``anchor [D]`` or ``[A, D]``, ``positives [P, D]``,
    ``negatives [N, D]``; or K batches at once, ``anchor [K, D]`` or ``[K, A, D]``,
    ``positives [K, P, D]``, ``negatives [K, N, D]``.  Returns the mean over all anchors
    (and batches).  ``N = 0`` is allowed.
    """
    _check_temperature(temperature)
    if positives.shape[-2] == 0:
        raise ValueError("cnc_contrastive needs at least one positive")
    a, p, n = (_compute(t) for t in _cnc_batched(anchor, positives, negatives))
    a = a / temperature
    s_pos = torch.bmm(a, p.transpose(1, 2))  # [K, A, P]
    s_neg = torch.bmm(a, n.transpose(1, 2))  # [K, A, N]
    lse = _logsumexp(torch.cat([s_pos, s_neg], dim=2), dim=2)
    return (lse - s_pos.mean(dim=2)).mean()


def cnc_two_sided(
    anchors: Tensor,
    positives: Tensor,
    negatives: Tensor,
    negatives2: Tensor | None,
    temperature: float = 0.05,
) -> Tensor:
    r"""CNC Eq. 14: ``L(x_1, {x+_m}, {x-_n}) + L(x+_1, {x_i}, {x'-_n})``, mean over batches.

    ``anchors [M, D]`` or ``[K, M, D]``, ``positives`` same shape, ``negatives`` and
    ``negatives2 [N, D]`` or ``[K, N, D]`` (embeddings of ``CNCBatch`` index groups).  Side 1
    uses the first anchor against the M positives; side 2 the first positive against the
    M anchors and its own negatives.  ``negatives2=None`` gives the one-sided loss.
    """
    one = cnc_contrastive(anchors[..., 0, :], positives, negatives, temperature)
    if negatives2 is None:
        return one
    return one + cnc_contrastive(positives[..., 0, :], anchors, negatives2, temperature)


# --------------------------------------------------------------------------- difficulty-based (WCL)


def _check_pair_views(anchor: Tensor, positive: Tensor) -> None:
    if anchor.dim() != 2 or anchor.shape != positive.shape:
        raise ValueError(
            f"anchor and positive must both be [B, D], got {tuple(anchor.shape)} and "
            f"{tuple(positive.shape)}"
        )
    if anchor.shape[0] < 2:
        raise ValueError("needs B >= 2: the negatives of an anchor are the other batch items")


def _check_tau_plus(tau_plus: float) -> None:
    if not 0 <= tau_plus < 1:
        raise ValueError(f"tau_plus must be in [0, 1), got {tau_plus}")


def triplet(
    anchor: Tensor, positive: Tensor, negative: Tensor | None = None, tau_plus: float = 0.0
) -> Tensor:
    r"""Self-supervised triplet loss (difficulty paper Eq. 5), batched:
    ``mean_i [ ||a_i - p_i||² - mean_n ||a_i - n||² ]``.

    The positive of anchor ``i`` is its augmented view ``p_i``.  Its negatives are, with
    ``negative=None``, all other batch items ``a_j, j != i`` (Algorithm 1:
    ``x- in X_t \ {x_a}``), or every row of a shared pool ``negative [N, D]``.  With
    ``tau_plus > 0`` the negative term is the debiased one of Sec. 5.2,
    ``(mean_n ||a_i - n||² - tau_plus ||a_i - p_i||²) / (1 - tau_plus)``.
    Centred norms make it O((B + N) D): ``sum_j ||a_i - a_j||² = B ||a_i - ā||² + sum_j ||a_j - ā||²``.
    """
    _check_pair_views(anchor, positive)
    _check_tau_plus(tau_plus)
    a, p = _compute(anchor), _compute(positive)
    d_pos = (a - p).square().sum(1)
    if negative is None:
        batch = a.shape[0]
        centred = (a - a.mean(0, keepdim=True)).square().sum(1)
        d_neg = (batch * centred + centred.sum()) / (batch - 1)
    else:
        if negative.dim() != 2 or negative.shape[0] == 0 or negative.shape[1] != a.shape[1]:
            raise ValueError(f"negative must be [N, D] with N >= 1, got {tuple(negative.shape)}")
        n = _compute(negative)
        centre = n.mean(0, keepdim=True)
        d_neg = (a - centre).square().sum(1) + (n - centre).square().sum(1).mean()
    if tau_plus > 0:
        d_neg = (d_neg - tau_plus * d_pos) / (1 - tau_plus)
    return (d_pos - d_neg).mean()


def _positive_max(d: Tensor, mask: Tensor | None) -> Tensor:
    """Maximum of ``d`` (over ``mask`` where given), at least the smallest positive float."""
    m = d.max() if mask is None else d.masked_fill(~mask, float("-inf")).max()
    return m.clamp_min(torch.finfo(d.dtype).tiny)


def relative_difficulty(dist_debiased: Tensor, dist_biased: Tensor, mask: Tensor | None = None) -> Tensor:
    r"""``w = 1 + Dd~ / (Dd~ + Db~)`` with ``D~ = D / max_batch D`` (detached, in [1, 2]).

    Distances of the same (anchor, negative) pairs under the debiased and the biased
    encoder, any matching shape; each is normalised by its own maximum over all entries,
    or over the entries where the boolean ``mask`` is True (the (anchor, negative) pairs;
    the others are still returned, normalised by that maximum).
    Where both normalised distances are 0 (e.g. self-pairs) ``w = 1.5``.
    """
    if dist_debiased.shape != dist_biased.shape:
        raise ValueError("dist_debiased and dist_biased must have the same shape")
    with torch.no_grad():
        dd = dist_debiased / _positive_max(dist_debiased, mask)
        db = dist_biased / _positive_max(dist_biased, mask)
        den = dd + db
        ratio = torch.where(den > 0, dd / den.clamp_min(torch.finfo(den.dtype).tiny), 0.5)
        return 1 + ratio


def _log1mexp(x: Tensor) -> Tensor:
    """``log(1 - e^x)`` for ``x < 0``, accurate on both sides of ``-log 2`` (NaN-free grads)."""
    near = x > -math.log(2)
    a = torch.log(-torch.expm1(torch.where(near, x, -1.0)))
    b = torch.log1p(-torch.exp(torch.where(near, -1.0, x)))
    return torch.where(near, a, b)


def _check_two_views(z1: Tensor, z2: Tensor) -> None:
    if z1.dim() != 2 or z1.shape != z2.shape:
        raise ValueError(f"z1 and z2 must both be [B, D], got {tuple(z1.shape)} and {tuple(z2.shape)}")
    if z1.shape[0] < 2:
        raise ValueError("needs B >= 2: the negatives of a view are the 2B - 2 views of the other images")


def two_view_negatives(batch: int, device: torch.device | str | None = None) -> Tensor:
    """Boolean ``[2B, 2B]`` mask of the negative pairs of the stacked views ``[z1; z2]``.

    Row ``k`` is one view; its positive is ``k ± B`` (the other view of the same image) and
    its ``N = 2B - 2`` negatives are every other view; self and positive are False.
    """
    idx = torch.arange(2 * batch, device=device)
    positive = (idx + batch) % (2 * batch)
    return (idx[:, None] != idx[None, :]) & (positive[:, None] != idx[None, :])


def _two_view_logits(z1: Tensor, z2: Tensor, temperature: float) -> tuple[Tensor, Tensor, Tensor]:
    """``s_k+`` ``[2B]``, the raw ``[2B, 2B]`` logits ``s = Z Z^T / τ`` of ``Z = [z1; z2]``, and the negative mask."""
    z = torch.cat([z1, z2])
    s = torch.mm(z / temperature, z.T)
    s_pos_half = (z1 * z2).sum(1) / temperature
    return torch.cat([s_pos_half, s_pos_half]), s, two_view_negatives(z1.shape[0], z.device)


def _debiased_log_g(log_sum: Tensor, s_pos: Tensor, n_neg: int, temperature: float, tau_plus: float) -> Tensor:
    r"""``log g``, ``g = max( (e^{log_sum} - τ+ N e^{s+}) / (1 - τ+), N e^{-1/τ} )`` (Chuang et al.), in log space.

    ``tau_plus = 0`` returns ``log_sum`` unchanged (no floor: plain InfoNCE / NT-Xent).
    """
    if tau_plus == 0:
        return log_sum
    log_sub = math.log(tau_plus * n_neg) + s_pos
    gap = log_sub - log_sum  # log of (subtracted / sum); the difference is positive iff gap < 0
    ok = gap < 0
    safe_gap = torch.where(ok, gap, -1.0)
    log_diff = torch.where(ok, log_sum + _log1mexp(safe_gap), float("-inf"))
    log_floor = math.log(n_neg) - 1.0 / temperature
    return torch.clamp_min(log_diff - math.log(1 - tau_plus), log_floor)


def nt_xent(
    z1: Tensor,
    z2: Tensor,
    temperature: float = 0.5,
    tau_plus: float = 0.0,
    weights: Tensor | None = None,
) -> Tensor:
    r"""Two-view NT-Xent: ``mean_k -log( e^{s_k+} / (e^{s_k+} + g_k) )``, ``g_k = sum_{j in N(k)} w_kj e^{s_kj}``.

    The core of the two-view objectives (SimCLR, DCL, WCL; HCL shares its parts).  ``Z = [z1; z2]`` stacks
    the two views of B images (rows L2-normalised by the caller), ``s_kj = Z_k . Z_j / τ``;
    view ``k``'s positive is the other view of its image (``k ± B``) and its negatives
    ``N(k)`` are the other ``N = 2B - 2`` views; the mean runs over all 2B views, so the
    loss is symmetric in ``z1`` and ``z2``.  ``weights [2B, 2B]`` (rows/columns in the
    stacked order; self and positive entries ignored; ``None`` = all ones) must be positive
    and are constants (detached).  With ``tau_plus > 0`` (class prior of Chuang et al.'s
    debiased estimator) ``g_k = max( (g_k - τ+ N e^{s_k+}) / (1 - τ+), N e^{-1/τ} )``.
    ``tau_plus = 0`` and no weights is SimCLR's NT-Xent; evaluated in log space throughout.
    """
    _check_two_views(z1, z2)
    _check_temperature(temperature)
    _check_tau_plus(tau_plus)
    a, b = _compute(z1), _compute(z2)
    s_pos, s, neg = _two_view_logits(a, b, temperature)
    w = None
    if weights is not None:
        size = 2 * a.shape[0]
        if weights.shape != (size, size):
            raise ValueError(f"weights must be [2B, 2B] = [{size}, {size}], got {tuple(weights.shape)}")
        w = weights.detach().to(device=s.device, dtype=s.dtype)
    log_sum = _logsumexp(s.masked_fill(~neg, float("-inf")), dim=1, weights=w)
    log_g = _debiased_log_g(log_sum, s_pos, 2 * a.shape[0] - 2, temperature, tau_plus)
    return (torch.logaddexp(s_pos, log_g) - s_pos).mean()


def weighted_infonce_2view(
    z1: Tensor, z2: Tensor, weights: Tensor, temperature: float = 0.5, tau_plus: float = 0.0
) -> Tensor:
    r"""WCL's L_wcl (difficulty paper Sec. 5.2), symmetric over both views:
    ``mean_k -log( e^{s_k+} / (e^{s_k+} + g'_k) )``,
    ``g'_k = max( (sum_{j in N(k)} w_kj e^{s_kj} - τ+ N e^{s_k+}) / (1 - τ+), N e^{-1/τ} )``.

    ``N = 2B - 2`` (Sec. 6: M = 254 at batch 128); ``weights`` is the ``[2B, 2B]`` relative
    difficulty of every (view, negative view) pair (``wcl_weights``), a constant.  The paper
    writes ``g'`` without the floor; the floor ``N e^{-1/τ}`` (the smallest value the
    negative sum can take on the sphere) is Chuang et al.'s and keeps ``g' > 0``.
    Same as ``nt_xent(z1, z2, temperature, tau_plus, weights)``.
    """
    return nt_xent(z1, z2, temperature, tau_plus, weights)


def dcl(z1: Tensor, z2: Tensor, temperature: float = 0.5, tau_plus: float = 0.1) -> Tensor:
    r"""Debiased contrastive loss (Chuang et al. 2020, ``L^{N,M}_Debiased`` with M = 1 positive), two views:
    ``mean_k -log( e^{s_k+} / (e^{s_k+} + g_k) )``,
    ``g_k = max( (sum_{j in N(k)} e^{s_kj} - τ+ N e^{s_k+}) / (1 - τ+), N e^{-1/τ} )``.

    ``N = 2B - 2``; ``tau_plus`` is the class prior τ+ (WCL paper: 0.1 CIFAR-10, 0.05
    CIFAR-100, 0.3 CelebA / Waterbirds).  ``tau_plus = 0`` is NT-Xent.
    """
    return nt_xent(z1, z2, temperature, tau_plus)


def hcl(
    z1: Tensor, z2: Tensor, temperature: float = 0.5, tau_plus: float = 0.1, beta: float = 1.0
) -> Tensor:
    r"""Hard-negative contrastive loss (Robinson et al. 2021), two views:
    ``g_k = max( (sum_{j in N(k)} v_kj e^{s_kj} - τ+ N e^{s_k+}) / (1 - τ+), N e^{-1/τ} )``,
    ``v_kj = e^{β s_kj} / mean_{j' in N(k)} e^{β s_kj'}``.

    Importance weights ``v`` (mean 1 over the ``N = 2B - 2`` negatives) estimate
    ``E_{q_β}[e^{s-}]`` with ``q_β ∝ e^{β s} p``; with a single positive its
    importance-weighted term is just ``e^{s_k+}``.  ``v`` is part of the estimator, so the
    gradient flows through it (as in the authors' estimator; it is not a detached weight):
    ``log sum_j v_kj e^{s_kj} = lse_j((1 + β) s_kj) - lse_j(β s_kj) + log N``.  ``β = 0`` is
    ``dcl``; the WCL paper uses ``β = 1``.
    """
    _check_two_views(z1, z2)
    _check_temperature(temperature)
    _check_tau_plus(tau_plus)
    a, b = _compute(z1), _compute(z2)
    s_pos, s, neg = _two_view_logits(a, b, temperature)
    n_neg = 2 * a.shape[0] - 2
    log_sum = _logsumexp(((1 + beta) * s).masked_fill(~neg, float("-inf")), dim=1)
    if beta != 0:
        log_sum = log_sum - _logsumexp((beta * s).masked_fill(~neg, float("-inf")), dim=1) + math.log(n_neg)
    log_g = _debiased_log_g(log_sum, s_pos, n_neg, temperature, tau_plus)
    return (torch.logaddexp(s_pos, log_g) - s_pos).mean()


def triplet_2view(z1: Tensor, z2: Tensor, tau_plus: float = 0.0) -> Tensor:
    r"""Self-supervised triplet loss (difficulty paper Eq. 5) over both views:
    ``mean_k [ ||Z_k - Z_k+||² - mean_{j in N(k)} ||Z_k - Z_j||² ]``, ``Z = [z1; z2]``.

    The same (view, positive, ``N = 2B - 2`` negatives) sets as ``nt_xent``.  With
    ``tau_plus > 0`` the negative term is Sec. 5.2's debiased one,
    ``(mean_n ||Z_k - Z_n||² - τ+ ||Z_k - Z_k+||²) / (1 - τ+)``.  O(B D) through
    ``sum_j ||Z_k - Z_j||² = 2B ||Z_k - Z̄||² + sum_j ||Z_j - Z̄||²`` (the sum over all 2B
    rows, whose ``j = k`` term is 0) minus the positive's term.
    """
    _check_two_views(z1, z2)
    _check_tau_plus(tau_plus)
    a, b = _compute(z1), _compute(z2)
    z = torch.cat([a, b])
    rows = z.shape[0]
    d_pos_half = (a - b).square().sum(1)
    d_pos = torch.cat([d_pos_half, d_pos_half])
    centred = (z - z.mean(0, keepdim=True)).square().sum(1)
    d_neg = (rows * centred + centred.sum() - d_pos) / (rows - 2)
    if tau_plus > 0:
        d_neg = (d_neg - tau_plus * d_pos) / (1 - tau_plus)
    return (d_pos - d_neg).mean()


def _euclid(z: Tensor) -> Tensor:
    """Pairwise Euclidean distances ``[B, B]`` (no gradient)."""
    with torch.no_grad():
        return _sq_dists(z).clamp_min(0).sqrt()


def wcl_weights(z_d1: Tensor, z_d2: Tensor, z_b1: Tensor, z_b2: Tensor) -> Tensor:
    r"""WCL relative difficulty of every (view, negative view) pair, ``[2B, 2B]``, detached:
    ``w_kj = 1 + Dd~_kj / (Dd~_kj + Db~_kj)``, ``D~ = D / max_{negative pairs} D``.

    ``D`` is the Euclidean distance between stacked views ``[z1; z2]`` under the debiased
    (``z_d*``) and the biased (``z_b*``) encoder; each is normalised by its maximum over
    the batch's (view, negative) pairs only, as in the paper's ``max_{(x^a, x^-) in B}``.
    Self and positive entries are 1 (``nt_xent`` ignores them).
    """
    _check_two_views(z_d1, z_d2)
    _check_two_views(z_b1, z_b2)
    if z_d1.shape[0] != z_b1.shape[0]:
        raise ValueError("both encoders must embed the same batch")
    dd = _euclid(torch.cat([_compute(z_d1), _compute(z_d2)]))
    db = _euclid(torch.cat([_compute(z_b1), _compute(z_b2)]).to(dd.device))
    neg = two_view_negatives(z_d1.shape[0], dd.device)
    w = relative_difficulty(dd, db.to(dd.dtype), mask=neg)
    return torch.where(neg, w, 1.0)


def wcl_loss(
    z_d_a: Tensor,
    z_d_p: Tensor,
    z_b_a: Tensor,
    z_b_p: Tensor,
    temperature: float = 0.5,
    tau_plus: float = 0.0,
    *,
    return_parts: bool = False,
) -> Tensor | tuple[Tensor, Tensor, Tensor]:
    r"""Difficulty paper's objective ``L = L_wcl(E_d; w) + L_tri(E_b)`` for one batch of two views:
    ``L_wcl = weighted_infonce_2view(z_d_a, z_d_p, w, τ, τ+)``, ``L_tri = triplet_2view(z_b_a, z_b_p, τ+)``.

    ``z_?_a`` and ``z_?_p`` are the two augmented views (their roles are symmetric);
    ``w = wcl_weights(z_d_a, z_d_p, z_b_a, z_b_p)`` (detached, so no gradient crosses
    between the encoders).  Both terms use every view as an anchor and the other
    ``2B - 2`` views as negatives: Algorithm 1 draws one (x^a, x^+, x^-) set that both
    encoders embed (w compares their distances on the same pairs, so E_b is trained on
    the pairs it is measured on) and Sec. 6 fixes M = 254 = 2B - 2 for all models.
    (Algorithm 1 step 3 writes L_tri with z_d and L_w-ctr with z_b, a swap; Fig. 2 and
    Sec. 5.2 train E_b with L_tri and E_d with L_wcl, as here.)
    ``return_parts=True`` returns ``(L, L_wcl, L_tri)``.
    """
    w = wcl_weights(z_d_a, z_d_p, z_b_a, z_b_p)
    l_wcl = weighted_infonce_2view(z_d_a, z_d_p, w, temperature, tau_plus)
    l_tri = triplet_2view(z_b_a, z_b_p, tau_plus)
    total = l_wcl + l_tri
    if return_parts:
        return total, l_wcl, l_tri
    return total


# --------------------------------------------------------------------------- LfF (GCE) and GroupDRO


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
