"""CNC's contrastive loss (Eq. 1 / 15), single or batched over K contrastive batches, and its two-sided form (Eq. 14),
with the FairKL paper's ε margin in its ε-SupCon form (Eq. 5: CNC's denominator holds every positive, as L_out's)."""

from __future__ import annotations

import torch
from torch import Tensor

from debias.losses._common import _check_temperature, _compute, _logsumexp


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
    anchor: Tensor, positives: Tensor, negatives: Tensor, temperature: float = 0.05, epsilon: float = 0.0
) -> Tensor:
    r"""CNC Eq. 1/15 with an ε margin:
    ``l_a = -(1/P) sum_p log( e^{s_ap} / (sum_{p'} e^{s_ap' - ε} + sum_n e^{s_an}) )``.

    Computed as ``lse([s_ap' - ε; s_an]) - mean_p s_ap`` with ``s = z_a . z / temperature``.  ``epsilon`` is in
    logit units (after division by ``temperature``, as the FairKL authors' code places it); ε = 0 is CNC's loss,
    computed by the same operations.  The ε form is ε-SupCon's (FairKL Eq. 5, without its additive constant ε):
    CNC's denominator holds all P positives, as SupCon's L_out, which Eq. 5 generalises.

    Shapes: one contrastive batch, ``anchor [D]`` or ``[A, D]``, ``positives [P, D]``,
    ``negatives [N, D]``; or K batches at once, ``anchor [K, D]`` or ``[K, A, D]``,
    ``positives [K, P, D]``, ``negatives [K, N, D]``.  Returns the mean over all anchors
    (and batches).  ``N = 0`` is allowed.
    """
    _check_temperature(temperature)
    if positives.shape[-2] == 0:
        raise ValueError("cnc_contrastive needs at least one positive")
    a, p, n = (_compute(t) for t in _cnc_batched(anchor, positives, negatives))
    if not epsilon >= 0:
        raise ValueError(f"epsilon must be >= 0, got {epsilon}")
    a = a / temperature
    s_pos = torch.bmm(a, p.transpose(1, 2))  # [K, A, P]
    s_neg = torch.bmm(a, n.transpose(1, 2))  # [K, A, N]
    den_pos = s_pos - epsilon if epsilon else s_pos  # ε = 0: not even a subtraction (CNC's loss bit for bit)
    lse = _logsumexp(torch.cat([den_pos, s_neg], dim=2), dim=2)
    return (lse - s_pos.mean(dim=2)).mean()


def cnc_two_sided(
    anchors: Tensor,
    positives: Tensor,
    negatives: Tensor,
    negatives2: Tensor | None,
    temperature: float = 0.05,
    epsilon: float = 0.0,
) -> Tensor:
    r"""CNC Eq. 14: ``L(x_1, {x+_m}, {x-_n}) + L(x+_1, {x_i}, {x'-_n})``, mean over batches, each side with margin ε.

    ``anchors [M, D]`` or ``[K, M, D]``, ``positives`` same shape, ``negatives`` and
    ``negatives2 [N, D]`` or ``[K, N, D]`` (embeddings of ``CNCBatch`` index groups).  Side 1
    uses the first anchor against the M positives; side 2 the first positive against the
    M anchors and its own negatives.  ``negatives2=None`` gives the one-sided loss.
    """
    one = cnc_contrastive(anchors[..., 0, :], positives, negatives, temperature, epsilon)
    if negatives2 is None:
        return one
    return one + cnc_contrastive(positives[..., 0, :], anchors, negatives2, temperature, epsilon)
