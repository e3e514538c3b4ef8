"""stage2.speed's opt-in settings, each alone against none, on one stage-2 method's training steps.

mnist10k-sized biased data in memory and benchmarks/speed.yaml's throughput settings (LeNet-5, batch 256 for the
contrastive methods); per setting a fresh task, one warm-up epoch (``compile``: it compiles there; its time is
reported apart), then ``--repeats`` timed epochs of ``--steps`` steps; settings take turns per round.

    nice -n 5 python -m benchmarks.speed_settings [--method eps_supinfonce+fairkl] [--device cpu] [--steps 20]
        [--rounds 2] [--repeats 2] [--settings none bf16 channels_last compile] [--out FILE.md]
    nice -n 5 python -m benchmarks.speed_settings --method cnc --accumulation 32 --steps 2 \
        --settings forward_chunk_1 forward_chunk_8 forward_chunk_32   # CNC's batches per forward pass
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch
import yaml

HERE = Path(__file__).resolve().parent

from benchmarks.throughput import subset, throughput_train
from debias.core.trees import merge

from debias.core.runtime import seed_everything
from debias.schema import validate
from debias.training.methods import Stage2Inputs, setup_method
from debias.training.methods.cnc.sampling import CNCBatchSampler

SETTINGS = {"none": {}, "bf16": {"speed": {"autocast": "bf16"}}, "channels_last": {"speed": {"channels_last": True}},
            "compile": {"speed": {"compile": True}},
            # CNC only: contrastive batches per forward pass (with --accumulation 32: per batch, in 4 chunks, at once)
            "forward_chunk_1": {"cnc": {"forward_chunk": 1}}, "forward_chunk_8": {"cnc": {"forward_chunk": 8}},
            "forward_chunk_32": {"cnc": {"forward_chunk": 32}}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--method", default="eps_supinfonce+fairkl")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--settings", nargs="+", default=["none", "bf16", "channels_last", "compile"],
                        choices=list(SETTINGS))
    parser.add_argument("--accumulation", type=int, help="cnc: stage2.cnc.accumulation (a step's batches)")
    parser.add_argument("--npz", default=str(HERE.parent.parent / "shared" / "datasets" / "mnist10k.npz"))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    config = yaml.safe_load((HERE / "speed.yaml").read_text())["throughput"]
    base, full = throughput_train(config, Path(args.npz))
    raw = merge(base, config["methods"][args.method])
    if args.accumulation:
        raw = merge(raw, {"stage2": {"cnc": {"accumulation": args.accumulation}}})
    p0 = validate(raw)
    cnc = p0.stage2.method == "cnc"
    train = full if cnc else subset(full, args.steps * p0.stage2.batch_size, p0.seed)
    times: dict[str, list[float]] = {name: [] for name in args.settings}
    warmup: dict[str, list[float]] = {name: [] for name in args.settings}
    for round_ in range(args.rounds):
        for name in (args.settings if round_ % 2 == 0 else args.settings[::-1]):
            p = validate(merge(raw, {"stage2": SETTINGS[name]}))
            setup = setup_method(Stage2Inputs({"train": train}, train.a.clone(), ~train.aligned.bool(), None, p, device,
                                              seed_everything(p.seed)))
            if cnc:  # an epoch of --steps optimiser steps
                c = p.stage2.cnc
                setup.task.sampler = CNCBatchSampler(train.y, train.a.clone(), c.num_positives, c.num_negatives,
                                                     c.two_sided, args.steps * c.accumulation, seed=p.seed,
                                                     skip_empty_classes=c.skip_empty_classes)
            for epoch in range(args.repeats + 1):
                setup.model.train()
                started = time.perf_counter()
                setup.task.train_epoch(epoch)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                (warmup if epoch == 0 else times)[name].append(time.perf_counter() - started)
            print(f"[speed_settings] round {round_} {name}: {[round(t, 2) for t in times[name]]}", flush=True)
    ref = args.steps / statistics.median(times[args.settings[0]])
    command = shlex.join(["python", "-m", "benchmarks.speed_settings", *sys.argv[1:]])
    lines = [f"# stage2.speed settings: {args.method} on {args.device}\n", f"- Command: `{command}`",
             f"- torch {torch.__version__}, {args.threads} thread(s); median of {args.rounds} x {args.repeats} epochs "
             f"of {args.steps} steps after a warm-up epoch (its time: the first epoch, compile included)\n",
             f"| setting | steps/s | vs {args.settings[0]} | warm-up epoch (s) |", "|---|---|---|---|"]
    for name in args.settings:
        rate = args.steps / statistics.median(times[name])
        lines.append(f"| {name} | {rate:.2f} | {rate / ref:.2f} | {statistics.median(warmup[name]):.1f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
