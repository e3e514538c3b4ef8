"""The losses written the way the papers' released code writes them: exp, masks and sums over the full B x B
matrix. The baselines the loss micro-benchmark and the speed benchmark time debias.losses against (they live here,
not in src/)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def base_supcon(z, y, tau):
    """SupContrast (Khosla et al. code): exp, masks and sums over the full matrix."""
    b = z.shape[0]
    logits = z @ z.T / tau
    logits = logits - logits.max(1, keepdim=True).values.detach()
    mask = (y[:, None] == y[None, :]).float()
    logits_mask = 1 - torch.eye(b, device=z.device)
    mask = mask * logits_mask
    exp_logits = torch.exp(logits) * logits_mask
    log_prob = logits - torch.log(exp_logits.sum(1, keepdim=True))
    n_pos = mask.sum(1)
    valid = n_pos > 0
    mean_log_prob_pos = (mask * log_prob).sum(1)[valid] / n_pos[valid]
    return -mean_log_prob_pos.mean()


def _epsilon_parts(z, y, tau):
    """The authors' shared start of both ε-losses: max-shifted logits, the positives and the off-diagonal exps."""
    b = z.shape[0]
    logits = z @ z.T / tau
    logits = logits - logits.max(1, keepdim=True).values.detach()
    inv_diag = ~torch.eye(b, dtype=torch.bool, device=z.device)
    pos = (y[:, None] == y[None, :]) & inv_diag
    return logits, pos, inv_diag, torch.exp(logits) * inv_diag


def _mean_positive_log_prob_loss(logits, log_denominator, pos):
    """Minus the mean over anchors with a positive of their positives' mean log-probability."""
    log_prob = logits - log_denominator
    n_pos = pos.sum(1)
    valid = n_pos > 0
    return -((pos * log_prob).sum(1)[valid] / n_pos[valid]).mean()


def base_eps_supcon(z, y, eps, tau):
    """Authors' EpsilonSupCon.forward_out (without the tau / base_tau factor)."""
    logits, pos, inv_diag, unif = _epsilon_parts(z, y, tau)
    unif = math.exp(-eps) * (unif * pos) + unif * (~pos) * inv_diag
    return _mean_positive_log_prob_loss(logits, torch.log(unif.sum(1, keepdim=True) + 1e-6), pos)


def base_eps_supinfonce(z, y, eps, tau):
    """Authors' EpsilonSupInfoNCE.forward_out (without the tau / base_tau factor)."""
    logits, pos, inv_diag, unif = _epsilon_parts(z, y, tau)
    unif = math.exp(-eps) * unif * pos + (unif * (~pos) * inv_diag).sum(1, keepdim=True)
    return _mean_positive_log_prob_loss(logits, torch.log(unif + 1e-6), pos)


def base_fairkl(z, y, bias, floor=1e-6):
    """Paper Eq. 10 with four explicit masks over the full distance matrix."""
    b = z.shape[0]
    d = torch.cdist(z, z).pow(2)
    offdiag = ~torch.eye(b, dtype=torch.bool, device=z.device)
    same_y = y[:, None] == y[None, :]
    same_b = bias[:, None] == bias[None, :]
    out = z.new_zeros(())
    for side in (same_y & offdiag, ~same_y):
        stats = []
        for m in (side & same_b, side & ~same_b):
            m = m.float()
            n = m.sum()
            mu = (m * d).sum() / n
            var = (m * (d - mu) ** 2).sum() / n
            stats.append((n, mu, var.clamp_min(floor)))
        (na, mua, va), (nc, muc, vc) = stats
        if na >= 4 and nc >= 4:  # >= 2 unordered pairs each
            out = out + 0.5 * ((va + (mua - muc) ** 2) / vc - torch.log(va / vc) - 1)
    return out


def base_fairkl_authors(z, y, bias):
    """Authors' released fairkl() (temperature 1, kld 1), self-pairs excluded."""
    b = z.shape[0]
    sim = z @ z.T
    offdiag = ~torch.eye(b, dtype=torch.bool, device=z.device)
    positive = (y[:, None] == y[None, :]) & offdiag
    aligned = bias[:, None] == bias[None, :]
    masks = [positive & aligned, positive & ~aligned, ~(y[:, None] == y[None, :]) & aligned,
             ~(y[:, None] == y[None, :]) & ~aligned]
    xs = [sim * m for m in masks]
    mus = [x.sum() / max(int(m.sum()), 1) for x, m in zip(xs, masks)]
    sds = [torch.std(x) for x in xs]
    mu_loss = (mus[1] - mus[0]) ** 2 + (mus[2] - mus[3]) ** 2
    sd_loss = (sds[0] - sds[1]) ** 2 + (sds[2] - sds[3]) ** 2
    return mu_loss + sd_loss - mus[1] + mus[2]


def base_cnc_two_sided(a, p, n, n2, tau):
    """CNC authors' loss: a Python loop over contrastive batches, exp / sum / log."""
    total = 0.0
    for k in range(a.shape[0]):
        for anchor, pos, neg in ((a[k, 0], p[k], n[k]), (p[k, 0], a[k], n2[k])):
            exp_pos = torch.exp(F.cosine_similarity(anchor[None], pos) / tau)
            exp_neg = torch.exp(F.cosine_similarity(anchor[None], neg) / tau)
            total = total - (torch.log(exp_pos) - torch.log(exp_neg.sum() + exp_pos.sum())).mean()
    return total / a.shape[0]


def base_triplet(a, p, tau_plus):
    """Full B x B squared-distance matrix, masked mean over j != i."""
    b = a.shape[0]
    d_pos = ((a - p) ** 2).sum(1)
    d_all = torch.cdist(a, a).pow(2)
    mask = 1 - torch.eye(b, device=a.device)
    d_neg = (d_all * mask).sum(1) / (b - 1)
    if tau_plus > 0:
        d_neg = (d_neg - tau_plus * d_pos) / (1 - tau_plus)
    return (d_pos - d_neg).mean()


def _two_view_negatives(b, device):
    mask = ~torch.eye(2 * b, dtype=torch.bool, device=device)
    idx = torch.arange(b, device=device)
    mask[idx, idx + b] = False
    mask[idx + b, idx] = False
    return mask


def base_nt_xent(z1, z2, w, tau, tau_plus, beta=None):
    """DCL / HCL code style (Chuang et al., Robinson et al.): exp of the 2B x 2B matrix,
    masked_select of the 2B - 2 negatives, (importance-)weighted sum, clamp, log."""
    b = z1.shape[0]
    out = torch.cat([z1, z2])
    mask = _two_view_negatives(b, z1.device)
    neg = torch.exp(out @ out.T / tau).masked_select(mask).view(2 * b, -1)
    pos = torch.exp((z1 * z2).sum(-1) / tau)
    pos = torch.cat([pos, pos])
    n = 2 * b - 2
    if beta is not None:
        imp = (beta * neg.log()).exp()
        ng = (imp * neg).sum(-1) / imp.mean(-1)
    else:
        ng = (neg * w.masked_select(mask).view(2 * b, -1)).sum(-1)
    if tau_plus > 0:
        ng = ((ng - tau_plus * n * pos) / (1 - tau_plus)).clamp(min=n * math.exp(-1 / tau))
    return -torch.log(pos / (pos + ng)).mean()


def base_triplet_2view(z1, z2, tau_plus):
    """Full 2B x 2B squared-distance matrix, masked mean over the 2B - 2 negatives."""
    b = z1.shape[0]
    z = torch.cat([z1, z2])
    d_pos = ((z1 - z2) ** 2).sum(1)
    d_pos = torch.cat([d_pos, d_pos])
    mask = _two_view_negatives(b, z1.device).float()
    d_neg = (torch.cdist(z, z).pow(2) * mask).sum(1) / (2 * b - 2)
    if tau_plus > 0:
        d_neg = (d_neg - tau_plus * d_pos) / (1 - tau_plus)
    return (d_pos - d_neg).mean()


def base_wcl(zd_a, zd_p, zb_a, zb_p, tau, tau_plus):
    with torch.no_grad():
        mask = _two_view_negatives(zd_a.shape[0], zd_a.device)
        zd, zb = torch.cat([zd_a, zd_p]), torch.cat([zb_a, zb_p])
        dd, db = torch.cdist(zd, zd), torch.cdist(zb, zb)
        dd, db = dd / dd[mask].max(), db / db[mask].max()
        w = 1 + dd / (dd + db).clamp_min(1e-12)
    return base_nt_xent(zd_a, zd_p, w, tau, tau_plus) + base_triplet_2view(zb_a, zb_p, tau_plus)
