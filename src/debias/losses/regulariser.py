"""FairKL regulariser (Eq. 9 / Eq. 10 / the released code's term) on the four pair sets, and its per-set report."""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from debias.losses._common import _check_batch, _check_temperature, _compute, _off_diagonal, _same_label, _sq_dists
from debias.metrics import PAIR_KINDS

FairKLVariant = Literal["kl", "mean", "released"]

#: Names of the four FairKL pair sets, in the order used everywhere in debias.losses (debias.metrics.PAIR_KINDS).
FAIRKL_SETS = PAIR_KINDS


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
