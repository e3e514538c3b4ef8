"""Micro-benchmark: forward+backward time of every loss in debias.losses against a
straightforward mask-and-sum implementation over the full B x B matrix, written the way
the papers' released code writes it (the baselines: benchmarks/reference_losses.py, not in src/).

    nice python -m benchmarks.bench_losses [--sizes 256 1024 4096] [--dim 128] [--threads N]

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

from benchmarks.reference_losses import (base_cnc_two_sided, base_eps_supcon, base_eps_supinfonce, base_fairkl,
                                         base_fairkl_authors, base_nt_xent, base_supcon, base_triplet,
                                         base_triplet_2view, base_wcl)
from debias import losses as L

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
