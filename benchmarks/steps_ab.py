"""Training steps per second of ERM and every stage-2 method, side by side for two or more source trees, in one run.

Each tree (a directory holding ``src/debias``: this working tree, or a ``git worktree`` of another commit) is timed
in its own processes (``PYTHONPATH=TREE/src``) on the same mnist10k-sized biased data in memory and the same settings
(``benchmarks/speed.yaml``'s throughput section: LeNet-5, batch sizes, optimisers; ``--epoch-steps`` steps per timed
epoch), resolved by this tree (:func:`resolve`), so an older tree's worker needs only the debias APIs every commit
since 11a1806 has. Every round starts, per method, a fresh process per tree (as a stage trains one method: the
tasks a process built and trained before change its allocations' page faults, hence its speed, by several per
cent); their epochs alternate (the first tree first every other time), so they see the same background load; the
median epoch (``--rounds`` x ``--repeats`` of them) is reported, with the spread of the paired epochs' ratios.
Methods the speed.yaml section lacks are timed with its ``base`` settings (lff, groupdro: batches of 32 like jtt;
dcl, hcl like wcl).

    nice -n 5 python -m benchmarks.steps_ab --trees . /tmp/base-11a1806 [--rounds 3] [--repeats 2]
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
from typing import Any

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


def resolve(methods: list[str], epoch_steps: int) -> dict[str, dict]:
    """Each method's params tree (speed.yaml's throughput base with its overrides), stage-2 method and steps per
    epoch, resolved here, in this tree, so the workers of older trees need only debias' stable APIs."""
    import yaml

    from debias.core.trees import merge

    config = yaml.safe_load((HERE / "speed.yaml").read_text())["throughput"]
    specs = {}
    for name in methods:
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
        elif name in EXTRA_METHODS:
            overrides, steps = EXTRA_METHODS[name]
            method = name
        else:
            allowed = ", ".join(["erm", *config["methods"], *EXTRA_METHODS])
            raise SystemExit(f"--methods {name}: unknown; allowed: {allowed}")
        specs[name] = {"params": merge(config["base"], overrides), "method": method, "steps": epoch_steps or steps}
    return {"base": config["base"], "methods": specs}


def like_for_like(raw: dict, method: str) -> dict:
    """``raw`` made to compute in this tree the loss 11a1806 computed: eps_supcon there took ``loss.epsilon`` (0.25
    in speed.yaml); trees with ``loss.eps_supcon`` (FairKL Table 6's own margin, default 0, which computes SupCon)
    get the same epsilon there, so both sides time eps-SupCon."""
    from debias.params import LossParams

    if method == "eps_supcon" and "eps_supcon" in LossParams.model_fields:
        raw = {**raw, "loss": {**raw.get("loss", {}),
                               "eps_supcon": {**raw.get("loss", {}).get("eps_supcon", {}),
                                              "epsilon": raw.get("loss", {}).get(
                                                  "epsilon", LossParams.model_fields["epsilon"].default)}}}
    return raw


def build_tasks(spec: dict, npz: Path, device: Any) -> dict[str, tuple[Any, int]]:
    """``{method: (its stage-2 task, steps per epoch)}`` for the resolved settings ``spec`` (:func:`resolve`), built
    with the debias of the tree under test (its worker runs with ``PYTHONPATH=TREE/src``): each on its own seeded
    subset of the training split."""
    import torch

    from benchmarks.throughput import fill_npz, subset, throughput_train

    from debias.core.runtime import seed_everything
    from debias.schema import validate
    from debias.training.methods import Stage2Inputs, setup_method
    from debias.training.methods.cnc.sampling import CNCBatchSampler

    _, full = throughput_train(spec, npz)
    tasks = {}
    for name, entry in spec["methods"].items():
        method, steps = entry["method"], entry["steps"]
        p = validate(like_for_like(fill_npz(entry["params"], npz), method))
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
    return tasks


def worker(args: argparse.Namespace) -> None:
    """Time ``--repeats`` epochs of each method in this process (after one warm-up epoch); print JSON lines.
    Reads the resolved settings (:func:`resolve`) as JSON on the first line of stdin."""
    import torch

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    tasks = build_tasks(json.loads(sys.stdin.readline()), Path(args.npz), device)
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


def paired_range(first: list[float], other: list[float]) -> str:
    """The spread of a ratio of rates: ``min-max`` over the run's epoch pairs of ``first[i] / other[i]`` (times; the
    i-th epochs of two trees ran back to back, so each pair saw the same background load)."""
    ratios = [a / b for a, b in zip(first, other)]
    return f"{min(ratios):.3f}-{max(ratios):.3f}"


def commit_of(tree: Path) -> str:
    """The short commit ``tree`` has checked out, ``+changes`` where its tracked files differ from it."""
    head = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        return "unknown (not a git checkout)"
    dirty = subprocess.run(["git", "-C", str(tree), "diff", "--quiet", "HEAD", "--"], capture_output=True).returncode
    return head.stdout.strip() + ("+changes" if dirty else "")


def start_workers(trees: list[Path], spec: dict, args: argparse.Namespace) -> list[subprocess.Popen]:
    """One worker process per tree (``PYTHONPATH=TREE/src``), given ``spec`` and ready to time epochs."""
    workers = []
    for tree in trees:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree / "src"), *filter(None, [os.environ.get("PYTHONPATH")])]),
               "DEBIAS_THREADS": str(args.threads),
               "DEBIAS_TRACKING": "off", "OMP_WAIT_POLICY": "PASSIVE"}
        command = [sys.executable, "-m", "benchmarks.steps_ab", "--worker", "--threads", str(args.threads),
                   "--device", args.device, "--npz", str(Path(args.npz).resolve())]
        workers.append(subprocess.Popen(command, cwd=HERE.parent, env=env, stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True, bufsize=1))
        workers[-1].stdin.write(json.dumps(spec) + "\n")
    for tree, worker_process in zip(trees, workers):
        if worker_process.stdout.readline().strip() != "ready":
            raise SystemExit(f"{tree}: the worker failed to start (run it with --worker to see why)")
    return workers


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
    specs = resolve(args.methods, args.epoch_steps)
    times: dict[tuple[str, str], list[float]] = {}
    cpu: dict[tuple[str, str], list[float]] = {}
    steps: dict[str, int] = {}
    started = datetime.datetime.now().astimezone()
    turn = 0
    for round_index in range(args.rounds):
        for method in args.methods:
            # a fresh process per tree, method and round, as a stage runs one method: a process's allocation history
            # (the tasks built and trained before) changes its page faults per step by orders of magnitude
            workers = start_workers(trees, {**specs, "methods": {method: specs["methods"][method]}}, args)
            for _ in range(args.repeats):  # the trees take turns, the first tree first every other time
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
            for worker_process in workers:
                worker_process.stdin.close()
                worker_process.wait()
        print(f"[steps_ab] round {round_index + 1} of {args.rounds} done", flush=True)
    names = [t.name if t != Path.cwd() else "worktree" for t in trees]
    header = (["method", "steps"] + [f"{n} steps/s" for n in names] + [f"{n} / {names[0]}" for n in names[1:]]
              + [f"{n} steps/CPU-s" for n in names] + [f"{n} / {names[0]} (CPU)" for n in names[1:]]
              + [f"{n} / {names[0]} (CPU), paired epochs min-max" for n in names[1:]])
    rows = []
    for method in args.methods:
        rates = [steps[method] / statistics.median(times[(str(t), method)]) for t in trees]
        cpu_rates = [steps[method] / statistics.median(cpu[(str(t), method)]) for t in trees]
        rows.append([method, steps[method], *[round(r, 2) for r in rates], *[round(r / rates[0], 3) for r in rates[1:]],
                     *[round(r, 2) for r in cpu_rates], *[round(r / cpu_rates[0], 3) for r in cpu_rates[1:]],
                     *[paired_range(cpu[(str(trees[0]), method)], cpu[(str(t), method)]) for t in trees[1:]]])
    command = shlex.join(["python", "-m", "benchmarks.steps_ab", *sys.argv[1:]])
    notes = [f"Command: `{command}`", f"Date: {started:%Y-%m-%d %H:%M %Z}; load average after "
             f"{os.getloadavg()[0]:.2f}", f"Device {args.device}, torch threads {args.threads}; trees: "
             + ", ".join(f"{n} = {given} (commit {commit_of(t)})" for n, given, t in zip(names, args.trees, trees)),
             f"Median of {args.rounds * args.repeats} epochs per method and tree: {args.rounds} rounds, each a fresh "
             f"process per tree and method timing {args.repeats} epochs after a warm-up epoch, the trees' epochs "
             "alternating; "
             "steps/s: wall time; steps/CPU-s: the process's CPU time (less sensitive to other jobs on the machine); "
             "paired epochs: the ratio of each back-to-back pair of epochs, its smallest and largest "
             "(the run's spread)"]
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
