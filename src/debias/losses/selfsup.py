"""Difficulty-based and two-view self-supervised losses: triplet, NT-Xent, DCL, HCL and WCL with its weights."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from debias.losses._common import _check_temperature, _compute, _logsumexp, _sq_dists


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
