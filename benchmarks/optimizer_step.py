"""The optimiser's update, PyTorch's one-tensor-at-a-time loop (its CPU default) against the foreach kernels
:func:`debias.training.loop.build_optimizer` asks for: microseconds per ``step()`` on the default encoder's
parameters, and whether training comes out bit-identical.

Per optimiser (``adam``: the default stage 2 and ERM; ``sgd``: the CNC paper's and other presets), on LeNet-5 for
10 classes of 28 px (the default encoder): ``--rounds`` rounds, each timing ``--steps`` updates of each
implementation one after the other (the order alternating between rounds) on fixed random gradients; the median
round is reported with the ratio foreach / one-tensor of every round. Then 50 training steps of the same model and
batches with each implementation (weight decay, momentum for SGD): whether the weights are equal, bit for bit.

    python -m benchmarks.optimizer_step [--rounds 7] [--steps 2000] [--out benchmarks/results/optimizer_step]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from benchmarks.pages import when_and_where
from debias.models import build_model
from debias.training.loop import build_optimizer

OPTIMISERS = {"adam": (torch.optim.Adam, {}), "sgd": (torch.optim.SGD, {"momentum": 0.9})}
LR, MOMENTUM, WEIGHT_DECAY = 1e-3, 0.9, 1e-4


def one_tensor(name: str, parameters) -> torch.optim.Optimizer:
    """PyTorch's update with ``foreach=False``: the loop its CPU default runs."""
    kind, extra = OPTIMISERS[name]
    return kind(parameters, lr=LR, weight_decay=WEIGHT_DECAY, foreach=False, **extra)


def built(name: str, parameters) -> torch.optim.Optimizer:
    return build_optimizer(parameters, name, LR, MOMENTUM, WEIGHT_DECAY)


def step_seconds(make, name: str, steps: int) -> float:
    """Seconds per ``step()`` of a fresh optimiser on LeNet-5's parameters with fixed gradients."""
    torch.manual_seed(0)
    parameters = list(build_model("lenet5", 10, 28).parameters())
    for parameter in parameters:
        parameter.grad = torch.randn_like(parameter)
    optimizer = make(name, parameters)
    for _ in range(20):  # state allocated, caches warm
        optimizer.step()
    started = time.perf_counter()
    for _ in range(steps):
        optimizer.step()
    return (time.perf_counter() - started) / steps


def trained(make, name: str) -> torch.Tensor:
    """LeNet-5's weights after 50 steps of cross-entropy on fixed random batches of 32 images."""
    torch.manual_seed(0)
    model = build_model("lenet5", 10, 28)
    optimizer = make(name, model.parameters())
    batches = torch.Generator().manual_seed(1)
    for _ in range(50):
        x = torch.rand(32, 3, 28, 28, generator=batches)
        y = torch.randint(0, 10, (32,), generator=batches)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/optimizer_step"))
    args = parser.parse_args()
    torch.set_num_threads(1)  # as a stage runs under DEBIAS_THREADS=1
    load = os.getloadavg()[0]
    rows = []
    for name in OPTIMISERS:
        times: dict[str, list[float]] = {"one-tensor": [], "foreach": []}
        for round_ in range(args.rounds):
            order = [("one-tensor", one_tensor), ("foreach", built)]
            for label, make in order if round_ % 2 == 0 else order[::-1]:
                times[label].append(step_seconds(make, name, args.steps))
        ratios = [f / o for f, o in zip(times["foreach"], times["one-tensor"])]
        equal = torch.equal(trained(one_tensor, name), trained(built, name))
        rows.append((name, statistics.median(times["one-tensor"]) * 1e6, statistics.median(times["foreach"]) * 1e6,
                     statistics.median(ratios), min(ratios), max(ratios), equal))
        print(rows[-1], flush=True)
    command = " ".join(["python -m benchmarks.optimizer_step", *sys.argv[1:]])
    lines = [
        "# The optimiser's update: one tensor at a time against foreach",
        "",
        f"- Command: `{command}`",
        f"- Date: {when_and_where(load, os.getloadavg()[0])}; torch "
        f"{torch.__version__}, 1 thread",
        f"- LeNet-5 (10 classes, 28 px: the default encoder), lr {LR}, weight decay {WEIGHT_DECAY}, SGD momentum "
        f"{MOMENTUM}; {args.rounds} rounds of {args.steps} steps per implementation, the order alternating; the "
        "median round and the ratio foreach / one-tensor (median, smallest, largest of the rounds)",
        "- Bit-identical: the weights after 50 training steps of each implementation, compared with `torch.equal`",
        "",
        "| optimiser | one-tensor µs/step | foreach µs/step | foreach / one-tensor | min | max | bit-identical |",
        "|---|---:|---:|---:|---:|---:|---|",
        *(f"| {n} | {o:.1f} | {f:.1f} | {r:.2f} | {lo:.2f} | {hi:.2f} | {'yes' if e else 'NO'} |"
          for n, o, f, r, lo, hi, e in rows),
        "",
    ]
    args.out.with_suffix(".md").write_text("\n".join(lines))
    print(f"wrote {args.out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
