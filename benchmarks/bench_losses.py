"""Micro-benchmark: forward+backward time of every loss in debias.losses against a
straightforward mask-and-sum implementation over the full B x B matrix, written the way
the papers' released code writes it (the baselines live here, not in src/).

    nice python benchmarks/bench_losses.py [--sizes 256 1024 4096] [--dim 128] [--threads N]

Prints a Markdown table (median of repeated runs; ratio = baseline / debias, > 1 means
debias is faster).  Each pair is also checked to agree numerically.
"""

from __future__ import annotations

import argparse
import math
import platform
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from debias import losses as L

# --------------------------------------------------------------------------- baselines


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


def base_eps_supcon(z, y, eps, tau):
    """Authors' EpsilonSupCon.forward_out (without the tau / base_tau factor)."""
    b = z.shape[0]
    logits = z @ z.T / tau
    logits = logits - logits.max(1, keepdim=True).values.detach()
    inv_diag = ~torch.eye(b, dtype=torch.bool, device=z.device)
    pos = (y[:, None] == y[None, :]) & inv_diag
    unif = torch.exp(logits) * inv_diag
    unif = math.exp(-eps) * (unif * pos) + unif * (~pos) * inv_diag
    unif = torch.log(unif.sum(1, keepdim=True) + 1e-6)
    log_prob = logits - unif
    n_pos = pos.sum(1)
    valid = n_pos > 0
    return -((pos * log_prob).sum(1)[valid] / n_pos[valid]).mean()


def base_eps_supinfonce(z, y, eps, tau):
    """Authors' EpsilonSupInfoNCE.forward_out (without the tau / base_tau factor)."""
    b = z.shape[0]
    logits = z @ z.T / tau
    logits = logits - logits.max(1, keepdim=True).values.detach()
    inv_diag = ~torch.eye(b, dtype=torch.bool, device=z.device)
    pos = (y[:, None] == y[None, :]) & inv_diag
    unif = torch.exp(logits) * inv_diag
    unif = math.exp(-eps) * unif * pos + (unif * (~pos) * inv_diag).sum(1, keepdim=True)
    unif = torch.log(unif + 1e-6)
    log_prob = logits - unif
    n_pos = pos.sum(1)
    valid = n_pos > 0
    return -((pos * log_prob).sum(1)[valid] / n_pos[valid]).mean()


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


# --------------------------------------------------------------------------- cases

TAU, EPS, TAU_PLUS, M, N = 0.1, 0.5, 0.1, 32, 32


def make_cases(b: int, d: int, device: torch.device) -> list[tuple[str, Callable, Callable, list[torch.Tensor]]]:
    g = torch.Generator().manual_seed(b)
    unit = lambda *shape: F.normalize(torch.randn(*shape, generator=g), dim=-1).to(device)  # noqa: E731
    z = unit(b, d)
    y = torch.randint(0, 10, (b,), generator=g).to(device)
    bias = torch.where(torch.rand(b, generator=g) < 0.9, y, torch.randint(0, 10, (b,), generator=g)).to(device)
    half = b // 2
    w = (1 + torch.rand(2 * half, 2 * half, generator=g)).to(device)
    k = max(1, b // (2 * M + 2 * N))
    cnc = [unit(k, M, d), unit(k, M, d), unit(k, N, d), unit(k, N, d)]
    return [
        ("supcon", lambda z: L.supcon(z, y, TAU), lambda z: base_supcon(z, y, TAU), [z]),
        ("eps_supcon", lambda z: L.eps_supcon(z, y, EPS, TAU), lambda z: base_eps_supcon(z, y, EPS, TAU), [z]),
        ("eps_supinfonce", lambda z: L.eps_supinfonce(z, y, EPS, TAU),
         lambda z: base_eps_supinfonce(z, y, EPS, TAU), [z]),
        ("fairkl (kl)", lambda z: L.fairkl(z, y, bias), lambda z: base_fairkl(z, y, bias), [z]),
        ("fairkl (released)", lambda z: L.fairkl(z, y, bias, "released", released_include_self=False),
         lambda z: base_fairkl_authors(z, y, bias), [z]),
        (f"cnc_two_sided (K={k}, M=N={M})", lambda *t: L.cnc_two_sided(*t, TAU),
         lambda *t: base_cnc_two_sided(*t, TAU), cnc),
        ("triplet (B/2 pairs)", lambda a, p: L.triplet(a, p, tau_plus=TAU_PLUS),
         lambda a, p: base_triplet(a, p, TAU_PLUS), [z[:half], z[half:]]),
        ("weighted_infonce_2view (B/2 images x 2 views)", lambda a, p: L.weighted_infonce_2view(a, p, w, 0.5, TAU_PLUS),
         lambda a, p: base_nt_xent(a, p, w, 0.5, TAU_PLUS), [z[:half], z[half:]]),
        ("dcl (B/2 x 2)", lambda a, p: L.dcl(a, p, 0.5, TAU_PLUS),
         lambda a, p: base_nt_xent(a, p, torch.ones_like(w), 0.5, TAU_PLUS), [z[:half], z[half:]]),
        ("hcl (B/2 x 2, beta=1)", lambda a, p: L.hcl(a, p, 0.5, TAU_PLUS, 1.0),
         lambda a, p: base_nt_xent(a, p, None, 0.5, TAU_PLUS, beta=1.0), [z[:half], z[half:]]),
        ("triplet_2view (B/2 x 2)", lambda a, p: L.triplet_2view(a, p, TAU_PLUS),
         lambda a, p: base_triplet_2view(a, p, TAU_PLUS), [z[:half], z[half:]]),
        ("wcl_loss (B/2 x 2, 2 encoders)", lambda *t: L.wcl_loss(*t, 0.5, TAU_PLUS),
         lambda *t: base_wcl(*t, 0.5, TAU_PLUS), [z[:half], z[half:], unit(half, d), unit(half, d)]),
    ]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_pair(
    ours: Callable, base: Callable, inputs: list[torch.Tensor], device: torch.device, budget: float
) -> tuple[float, float, float, float]:
    """Median seconds of forward+backward for both implementations, and their loss values.

    Runs alternate between the two so that both see the same background load.
    """
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    values = [float(fn(*leaves).detach()) for fn in (ours, base)]
    for fn in (ours, base, ours, base):  # warm-up
        fn(*leaves).backward()
    times: tuple[list[float], list[float]] = ([], [])
    start = time.perf_counter()
    while len(times[0]) < 3 or (time.perf_counter() - start < budget and len(times[0]) < 50):
        for fn, out in zip((ours, base), times):
            for t in leaves:
                t.grad = None
            sync(device)
            t0 = time.perf_counter()
            fn(*leaves).backward()
            sync(device)
            out.append(time.perf_counter() - t0)
    return statistics.median(times[0]), statistics.median(times[1]), values[0], values[1]


def fmt_ms(seconds: float) -> str:
    ms = seconds * 1e3
    return f"{ms:.2f}" if ms < 10 else f"{ms:.1f}" if ms < 100 else f"{ms:.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 1024, 4096])
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--budget", type=float, default=2.0, help="seconds of repeats per row")
    parser.add_argument("--devices", nargs="+", default=None, help="cpu and/or cuda (default: all available)")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    devices = args.devices or (["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, "
          f"CPU threads: {torch.get_num_threads()}, D = {args.dim}, float32, forward+backward, median\n")
    print("| device | loss | B | debias (ms) | baseline (ms) | baseline / debias |")
    print("|---|---|---:|---:|---:|---:|")
    for dev_name in devices:
        device = torch.device(dev_name)
        for b in args.sizes:
            for name, ours, base, inputs in make_cases(b, args.dim, device):
                t_ours, t_base, v_ours, v_base = time_pair(ours, base, inputs, device, args.budget)
                if not math.isclose(v_ours, v_base, rel_tol=1e-3, abs_tol=1e-4):
                    raise SystemExit(f"{name} B={b}: debias {v_ours} != baseline {v_base}")
                print(f"| {dev_name} | {name} | {b} | {fmt_ms(t_ours)} | {fmt_ms(t_base)} | "
                      f"{t_base / t_ours:.2f} |", flush=True)


if __name__ == "__main__":
    main()
