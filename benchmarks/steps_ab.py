"""Training steps per second of ERM and every stage-2 method, side by side for two or more source trees, in one run.

Each tree (a directory holding ``src/debias``: this working tree, or a ``git worktree`` of another commit) is timed
in its own process (``PYTHONPATH=TREE/src``), alive for the whole run, on the same mnist10k-sized biased data in
memory and the same settings (``benchmarks/speed.yaml``'s throughput section: LeNet-5, batch sizes, optimisers;
``--epoch-steps`` steps per timed epoch); the trees' epochs alternate, method by method (the first tree first every
other time), so they see the same background load; the median epoch (``--rounds`` x ``--repeats`` of them) is
reported. Methods the speed.yaml section lacks are
timed with its ``base`` settings (lff, groupdro: batches of 32 like jtt; dcl, hcl like wcl).

    nice -n 5 python benchmarks/steps_ab.py --trees . /tmp/base-11a1806 [--rounds 3] [--repeats 2]
        [--methods erm cnc ...] [--device cpu] [--out benchmarks/results/steps_ab]

Writes OUT.md and OUT.csv (with the command). ``--worker`` is the per-tree process (internal).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_NPZ = HERE.parent.parent / "shared" / "datasets" / "mnist10k.npz"
EXTRA_METHODS = {  # not in speed.yaml's throughput section (it holds the methods with a paper-style baseline)
    "lff": ({"stage2": {"method": "lff", "optimizer": "sgd", "lr": 0.01, "momentum": 0.9, "batch_size": 32}}, 100),
    "groupdro": ({"stage2": {"method": "groupdro", "optimizer": "sgd", "lr": 0.01, "momentum": 0.9,
                             "batch_size": 32}}, 100),
    "dcl": ({"stage2": {"method": "dcl"}}, 10),
    "hcl": ({"stage2": {"method": "hcl"}}, 10),
}
KIND_STEPS = {"supcon": "contrastive", "eps_supcon": "contrastive", "eps_supinfonce": "contrastive"}


def worker(args: argparse.Namespace) -> None:
    """Time ``--repeats`` epochs of each method in this process (after one warm-up epoch); print JSON lines."""
    import torch
    import yaml

    sys.path.insert(0, str(HERE))
    from quality import merge
    from speed import subset, throughput_train

    from debias.params import validate
    from debias.runtime import seed_everything
    from debias.sampling import CNCBatchSampler
    from debias.training.methods import Stage2Inputs, setup_method

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    config = yaml.safe_load((HERE / "speed.yaml").read_text())["throughput"]
    base, full = throughput_train(config, Path(args.npz))
    tasks = {}
    for name in args.methods:
        if name == "erm":  # ERM's own settings (speed.yaml's erm block), run as stage-2 method erm
            erm = config["base"]["erm"]
            overrides = {"stage2": {"method": "erm", **{k: erm[k] for k in ("optimizer", "lr", "momentum",
                                                                            "weight_decay", "batch_size",
                                                                            "augment_shift")}}}
            method, steps = "erm", int(config["steps"]["erm"])
        elif name in config["methods"]:
            overrides = config["methods"][name]
            method = overrides.get("stage2", {}).get("method", "erm")
            steps = int(config["steps"][KIND_STEPS.get(method, method)])
        else:
            overrides, steps = EXTRA_METHODS[name]
            method = name
        steps = args.epoch_steps or steps
        p = validate(merge(base, overrides))
        batch = p.stage2.batch_size
        train = full if method in ("cnc", "jtt") else subset(full, steps * batch, p.seed)
        inferred = train.a.clone()
        generator = seed_everything(p.seed)
        setup = setup_method(Stage2Inputs({"train": train}, inferred, ~train.aligned.bool(), None, p, device, generator,
                                          inferred_group=train.y * train.n_attrs + train.a))
        task = setup.task
        if method == "jtt":
            task.pool = task.pool[torch.randperm(len(task.pool), generator=torch.Generator().manual_seed(0))]
            task.pool = task.pool[: steps * batch]
        if method == "cnc":
            cnc = p.stage2.cnc
            task.sampler = CNCBatchSampler(train.y, inferred, cnc.num_positives, cnc.num_negatives, cnc.two_sided,
                                           steps * cnc.accumulation, seed=p.seed,
                                           skip_empty_classes=cnc.skip_empty_classes)
        tasks[name] = (task, steps)
    epochs = dict.fromkeys(tasks, 0)
    print("ready", flush=True)
    for line in sys.stdin:  # one timed epoch per request; each method's first epoch is a warm-up
        name = line.strip()
        task, steps = tasks[name]
        for _ in range(2 if epochs[name] == 0 else 1):
            for module in task.modules().values():
                module.train()
            started, started_cpu = time.perf_counter(), time.process_time()
            task.train_epoch(epochs[name])
            if device.type == "cuda":
                torch.cuda.synchronize()
            epochs[name] += 1
        print(json.dumps({"method": name, "steps": steps, "time": time.perf_counter() - started,
                          "cpu": time.process_time() - started_cpu}), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trees", nargs="+", default=["."])
    parser.add_argument("--methods", nargs="+", default=["erm", "jtt", "cnc", "supcon", "eps_supcon", "eps_supinfonce",
                                                          "eps_supinfonce+fairkl", "wcl", "lff", "groupdro", "dcl",
                                                          "hcl"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2, help="timed epochs per method per round")
    parser.add_argument("--epoch-steps", type=int, default=0, help="steps per timed epoch (0: speed.yaml's)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--npz", default=str(DEFAULT_NPZ))
    parser.add_argument("--out", type=Path, default=HERE / "results" / "steps_ab")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return 0
    trees = [Path(t).resolve() for t in args.trees]
    for tree in trees:
        if not (tree / "src" / "debias").is_dir():
            raise SystemExit(f"--trees {tree}: no src/debias there (a checkout of this repository is needed)")
    times: dict[tuple[str, str], list[float]] = {}
    cpu: dict[tuple[str, str], list[float]] = {}
    steps: dict[str, int] = {}
    started = datetime.datetime.now().astimezone()
    workers = []
    for tree in trees:  # one process per tree, alive for the whole run: epochs interleave at a fine grain
        env = {**os.environ, "PYTHONPATH": str(tree / "src"), "DEBIAS_THREADS": str(args.threads),
               "DEBIAS_TRACKING": "off", "OMP_WAIT_POLICY": "PASSIVE"}
        command = [sys.executable, str(Path(__file__).resolve()), "--worker", "--methods", *args.methods,
                   "--threads", str(args.threads), "--device", args.device, "--npz", args.npz,
                   "--epoch-steps", str(args.epoch_steps)]
        workers.append(subprocess.Popen(command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                        bufsize=1))
    for tree, worker_process in zip(trees, workers):
        if worker_process.stdout.readline().strip() != "ready":
            raise SystemExit(f"{tree}: the worker failed to start (run it with --worker to see why)")
    turn = 0
    for method in args.methods:
        for _ in range(args.rounds * args.repeats):  # the trees take turns, the first tree first every other time
            order = list(zip(trees, workers))
            for tree, worker_process in (order if turn % 2 == 0 else order[::-1]):
                worker_process.stdin.write(method + "\n")
                line = worker_process.stdout.readline()
                if not line.startswith("{"):
                    raise SystemExit(f"{tree}: the worker failed on {method}")
                row = json.loads(line)
                times.setdefault((str(tree), method), []).append(row["time"])
                cpu.setdefault((str(tree), method), []).append(row["cpu"])
                steps[method] = row["steps"]
            turn += 1
        print(f"[steps_ab] {method} done", flush=True)
    for worker_process in workers:
        worker_process.stdin.close()
        worker_process.wait()
    names = [t.name if t != Path.cwd() else "worktree" for t in trees]
    header = (["method", "steps"] + [f"{n} steps/s" for n in names] + [f"{n} / {names[0]}" for n in names[1:]]
              + [f"{n} steps/CPU-s" for n in names] + [f"{n} / {names[0]} (CPU)" for n in names[1:]])
    rows = []
    for method in args.methods:
        rates = [steps[method] / statistics.median(times[(str(t), method)]) for t in trees]
        cpu_rates = [steps[method] / statistics.median(cpu[(str(t), method)]) for t in trees]
        rows.append([method, steps[method], *[round(r, 2) for r in rates], *[round(r / rates[0], 3) for r in rates[1:]],
                     *[round(r, 2) for r in cpu_rates], *[round(r / cpu_rates[0], 3) for r in cpu_rates[1:]]])
    command = shlex.join(["python", "benchmarks/steps_ab.py", *sys.argv[1:]])
    notes = [f"Command: `{command}`", f"Date: {started:%Y-%m-%d %H:%M %Z}; load average after "
             f"{os.getloadavg()[0]:.2f}", f"Device {args.device}, torch threads {args.threads}; trees: "
             + ", ".join(f"{n} = {t}" for n, t in zip(names, trees)),
             f"Median of {args.rounds * args.repeats} epochs per method and tree (after a warm-up epoch), the trees' "
             "epochs alternating (one process per tree); "
             "steps/s: wall time; steps/CPU-s: the process's CPU time (less sensitive to other jobs on the machine)"]
    text = "# Training steps per second, side by side\n\n" + "".join(f"- {n}\n" for n in notes) + "\n"
    text += "| " + " | ".join(header) + " |\n|" + "---|" * len(header) + "\n"
    text += "".join("| " + " | ".join(str(v) for v in row) + " |\n" for row in rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".md").write_text(text)
    with open(args.out.with_suffix(".csv"), "w", newline="") as handle:
        handle.write("".join(f"# {n}\n" for n in notes))
        csv.writer(handle).writerows([header, *rows])
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
