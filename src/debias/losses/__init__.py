r"""Every training objective of the project (no module outside this package may define a loss).

One module per family, all names imported here (``from debias import losses; losses.fairkl(...)``):
``supervised`` (SupCon, ε-SupCon, ε-SupInfoNCE, the released contrastive term), ``regulariser`` (FairKL),
``cnc``, ``selfsup`` (triplet, NT-Xent, DCL, HCL, WCL), ``reweighting`` (LfF's GCE and weights, GroupDRO);
``_common`` holds the private helpers they share.

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
``cnc_contrastive(anchor, positives, negatives, temperature, epsilon=0)``
    CNC Eq. 1 / 15 with ε-SupCon's margin (FairKL Eq. 5's form; ε = 0: CNC's loss):
    ``l_a = -mean_p log( e^{s_ap} / (sum_{p'} e^{s_ap' - eps} + sum_n e^{s_an}) )``
    ``= lse([s_ap' - eps; s_an]) - mean_p s_ap``; also batched over K contrastive batches.
``cnc_two_sided(anchors, positives, negatives, negatives2, temperature, epsilon=0)``
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

from types import ModuleType as _ModuleType

from debias.losses.cnc import cnc_contrastive, cnc_two_sided
from debias.losses.regulariser import FAIRKL_SETS, FairKLVariant, fairkl, fairkl_pair_counts, fairkl_report
from debias.losses.reweighting import (
    generalized_cross_entropy,
    group_dro_loss,
    group_dro_weights,
    group_mean_losses,
    lff_weights,
)
from debias.losses.selfsup import (
    dcl,
    hcl,
    nt_xent,
    relative_difficulty,
    triplet,
    triplet_2view,
    two_view_negatives,
    wcl_loss,
    wcl_weights,
    weighted_infonce_2view,
)
from debias.losses.supervised import (
    RELEASED_BASE_TEMPERATURE,
    RELEASED_LOG_GUARD,
    ReleasedForm,
    eps_supcon,
    eps_supinfonce,
    released_contrastive,
    supcon,
)

# Every public name imported above (a new loss is its import line; no list of names to keep in step).
__all__ = sorted(name for name, value in globals().items()
                 if not name.startswith("_") and name != "annotations" and not isinstance(value, _ModuleType))
