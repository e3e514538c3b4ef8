"""Speed benchmark, in one run on one machine:

(a) pipeline timing: wall time, stage-body time and peak RSS of every stage of the default pipeline and
    of the mnist10k CMNIST* pipeline, each in a fresh temporary git clone of the repository with a fresh
    (empty) MLflow store and DEBIAS_TRACKING=required, stages run in DAG order with `dvc repro -s <stage>`
    (or the stage's command directly: --runner direct); peak RSS is the largest process of each stage's tree;
(b) training-step throughput (samples/s) of ERM and of every stage-2 method, using debias' own Task
    classes (ClassifierTask, CNCTask, ContrastiveTask, WCLTask) on mnist10k-sized biased data in memory,
    against a plain PyTorch baseline written the way the papers' code is: a per-sample Dataset with
    torchvision transforms on PIL images, a DataLoader, and mask-and-sum losses over the full B x B
    matrix (benchmarks/reference_losses.py). Same model (LeNet-5), batch sizes, steps, optimiser and thread
    count; debias and baseline epochs alternate, median of repeats.

Results: benchmarks/results/speed.md and speed.csv (settings: benchmarks/speed.yaml).

    nice -n 5 python -m benchmarks.speed [--npz ../shared/datasets/mnist10k.npz] [--threads 1]
        [--pipelines default mnist10k] [--methods ...] [--repeats 5] [--num-workers 0] [--skip-pipeline]
        [--skip-throughput] [--runner dvc|direct] [--cold-numba] [--trees worktree|COMMIT ...]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.clones import NUMBA_CACHE

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("NUMBA_CACHE_DIR", str(NUMBA_CACHE))
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ["DEBIAS_TRACKING"] = "off"  # this process trains no stage; the pipeline children track

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torchvision  # noqa: E402
import yaml  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import Subset  # noqa: E402

from benchmarks.clones import child_env, home_relative, make_clone, run_measured, stage_order  # noqa: E402
from benchmarks.pages import add_out_arguments, render, write_commented_csv  # noqa: E402
from benchmarks.reference_training import (PaperImages, PaperNet, baseline_classifier_epoch,  # noqa: E402
                                           baseline_cnc_epoch, baseline_contrastive_epoch, baseline_wcl_epoch,
                                           loader, paper_transform, simclr_transform)
from benchmarks.throughput import fill_npz, subset, throughput_train  # noqa: E402
from debias.core.trees import merge  # noqa: E402
from debias.data.store import BiasedSplit  # noqa: E402
from debias.models import build_model  # noqa: E402
from debias.schema import Params, validate  # noqa: E402
from debias.training.classifier import ClassifierTask  # noqa: E402
from debias.training.loop import build_optimizer  # noqa: E402
from debias.training.methods import Stage2Inputs, method_spec, setup_method  # noqa: E402
from debias.training.methods.cnc.sampling import CNCBatchSampler  # noqa: E402
from debias.training.methods.selfsup.train import projection_head  # noqa: E402

DEFAULT_NPZ = REPO.parent / "shared" / "datasets" / "mnist10k.npz"
CONTRASTIVE_METHODS = ("supcon", "eps_supcon", "eps_supinfonce")


# =========================================================================== (a) pipeline timing


def time_pipeline(name: str, overrides: dict, args: argparse.Namespace, numba_cache: Path,
                  logs: Path) -> list[dict[str, Any]]:
    """Per tree (``args.trees``: the working tree and/or commits) one row per stage (wall, body, CPU, peak
    RSS), one for the empty MLflow store and one for the total. With several trees, each gets its own clone
    and they take turns stage by stage (alternating who goes first), so both see the same background load.
    """
    rows: list[dict[str, Any]] = []
    work = Path(tempfile.mkdtemp(prefix=f"speed-{name}-"))
    labels = {tree: name if len(args.trees) == 1 else f"{name}@{tree}" for tree in args.trees}
    try:
        clones: dict[str, Path] = {}
        envs: dict[str, dict[str, str]] = {}
        for index, tree in enumerate(args.trees):
            (work / str(index)).mkdir()
            clone = clones[tree] = make_clone(work / str(index), overrides, None if tree == "worktree" else tree)
            env = envs[tree] = child_env(args.threads, numba_cache, clone)
            check = "import debias, sys; sys.exit(0 if debias.__file__.startswith(sys.argv[1]) else 3)"
            subprocess.run([sys.executable, "-c", check, str(clone / "src")], env=env, cwd=clone, check=True)
            log = logs / f"{labels[tree]}.log"
            log.unlink(missing_ok=True)
            # A fresh, empty (migrated) MLflow store, as tests/conftest.py makes it: not part of the total.
            status, wall, cpu, rss = run_measured(
                [sys.executable, "-c", "import sys; from mlflow.tracking import MlflowClient; "
                 "MlflowClient(tracking_uri=f'sqlite:///{sys.argv[1]}/mlflow.db').search_experiments()", str(clone)],
                clone, env, log)
            if status != 0:
                raise SystemExit(f"creating the MLflow store failed; see {log}")
            rows.append({"kind": "pipeline", "config": labels[tree], "name": "(setup) empty MLflow store",
                         "wall_s": wall, "cpu_s": cpu, "peak_rss_mib": rss})
        stages: dict[str, list[dict[str, Any]]] = {tree: [] for tree in args.trees}
        commands = {tree: dict(stage_order(clone / "dvc.yaml")) for tree, clone in clones.items()}
        for turn, (stage, _) in enumerate(stage_order(clones[args.trees[0]] / "dvc.yaml")):
            for tree in args.trees if turn % 2 == 0 else args.trees[::-1]:
                clone, log, label = clones[tree], logs / f"{labels[tree]}.log", labels[tree]
                command = ["dvc", "repro", "-s", stage] if args.runner == "dvc" else shlex.split(commands[tree][stage])
                status, wall, cpu, rss = run_measured(command, clone, envs[tree], log)
                if status != 0:
                    tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
                    raise SystemExit(f"[{label}] stage {stage} failed ({status}); log {log}:\n{tail}")
                body = json.loads((clone / "reports" / "runs" / f"{stage}.json").read_text())["wall_time_s"]
                stages[tree].append({"kind": "pipeline", "config": label, "name": stage, "wall_s": wall,
                                     "body_s": body, "cpu_s": cpu, "peak_rss_mib": rss})
                print(f"[speed] {label} {stage}: {wall:.1f} s (body {body:.1f} s, CPU {cpu:.1f} s), "
                      f"peak RSS {rss:.0f} MiB", flush=True)
        for tree in args.trees:
            rows += stages[tree]
            rows.append({"kind": "pipeline", "config": labels[tree], "name": "total",
                         **{key: sum(r[key] for r in stages[tree]) for key in ("wall_s", "body_s", "cpu_s")},
                         "peak_rss_mib": max(r["peak_rss_mib"] for r in stages[tree]),
                         "outcome": outcome(clones[tree])})
    finally:
        if args.keep:
            print(f"[speed] kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return rows


def outcome(clone: Path) -> str:
    """Test accuracy of the pipeline's models (a sanity check that changes kept the results)."""
    parts = []
    for label, path in (("erm", "reports/metrics/erm.json"), ("stage2", "reports/metrics/stage2_train.json")):
        test = json.loads((clone / path).read_text())["test"]
        parts.append(f"{label} test avg {test['avg']:.4f} worst-group {test['worst_group']:.4f}")
    probe = json.loads((clone / "reports/metrics/probe.json").read_text())
    parts.append(f"probe stage2 test worst-group {probe['stage2']['probe']['test']['worst_group']:.4f}")
    representation = json.loads((clone / "reports/metrics/representation.json").read_text())
    parts.append(f"I(Y;Z) stage2 test {representation['stage2']['test']['mi_y']:.4f}")
    return "; ".join(parts)


# =========================================================================== (b) throughput: both sides


def hwc(split: BiasedSplit) -> np.ndarray:
    return np.ascontiguousarray(split.x.permute(0, 2, 3, 1).numpy())


def setup_pair(method: str, params: Params, train_full: BiasedSplit, steps: int, seed: int, num_workers: int,
               device: torch.device) -> tuple[Callable[[int], Any], Callable[[], Any], int, int]:
    """(debias epoch, baseline epoch, batch size, samples per epoch) for one method, both freshly initialised."""
    size = int(train_full.x.shape[-1])
    s2 = params.stage2
    generator = torch.Generator().manual_seed(seed)

    def fresh() -> nn.Module:  # the encoder the method builds (its feature activation included)
        torch.manual_seed(seed)
        return build_model(params.model, train_full.n_classes, size, method_spec(method).feature_activation).to(device)

    if method == "erm":
        train = subset(train_full, steps * params.erm.batch_size, seed)
        model = fresh()
        optim = params.erm
        optimizer = build_optimizer(model.parameters(), optim.optimizer, optim.lr, optim.momentum, optim.weight_decay)
        task = ClassifierTask(model, optimizer, train, optim.batch_size, generator, device,
                              augment_shift=optim.augment_shift)
        base = PaperNet(fresh())
        base_opt = build_optimizer(base.parameters(), optim.optimizer, optim.lr, optim.momentum, optim.weight_decay)
        data = loader(PaperImages(hwc(train), train.y.numpy(), paper_transform(size, optim.augment_shift)),
                      optim.batch_size, num_workers, seed)
        return (task.train_epoch, lambda: baseline_classifier_epoch(base, base_opt, data, device), optim.batch_size,
                len(train))

    kind = "contrastive" if s2.method in CONTRASTIVE_METHODS else s2.method
    train = train_full if kind in ("cnc", "jtt") else subset(train_full, steps * s2.batch_size, seed)
    inferred, minority = train.a.clone(), ~train.aligned  # true bias labels: no group inference needed here
    torch.manual_seed(seed)
    setup = setup_method(Stage2Inputs({"train": train}, inferred, minority, None, params, device, generator))
    task = setup.task
    base = PaperNet(fresh())
    base_params = base.encoder.parameters() if kind in ("contrastive", "wcl") else base.parameters()
    if kind == "wcl":
        biased = PaperNet(fresh())
        out = s2.wcl.projection_dim
        projectors = (projection_head(base.encoder.dim, out).to(device), projection_head(biased.encoder.dim, out).to(device))
        base_params = [*base.encoder.parameters(), *projectors[0].parameters(), *biased.encoder.parameters(),
                       *projectors[1].parameters()]
    base_opt = build_optimizer(base_params, s2.optimizer, s2.lr, s2.momentum, s2.weight_decay)
    transform = paper_transform(size, s2.augment_shift)
    images, labels = hwc(train), train.y.numpy()

    if kind == "jtt":
        task.pool = task.pool[torch.randperm(len(task.pool), generator=torch.Generator().manual_seed(seed))]
        task.pool = task.pool[: steps * s2.batch_size]  # a sample of JTT's upweighted pool, the same on both sides
        data = loader(Subset(PaperImages(images, labels, transform), task.pool.tolist()), s2.batch_size, num_workers,
                      seed)
        return (task.train_epoch, lambda: baseline_classifier_epoch(base, base_opt, data, device), s2.batch_size,
                len(task.pool))
    if kind == "contrastive":
        data = loader(PaperImages(images, labels, transform, extras=(inferred.numpy(),)), s2.batch_size, num_workers,
                      seed)
        return (task.train_epoch, lambda: baseline_contrastive_epoch(base, base_opt, data, params, device),
                s2.batch_size, len(train))
    if kind == "wcl":
        wcl = s2.wcl
        data = loader(PaperImages(images, labels, simclr_transform(size, wcl), views=2), s2.batch_size, num_workers, seed)
        return (task.train_epoch, lambda: baseline_wcl_epoch(base, biased, projectors, base_opt, data, params, device),
                s2.batch_size, len(train))
    if kind == "cnc":
        cnc = s2.cnc
        if cnc.accumulation != 1 or not cnc.two_sided:
            raise SystemExit("the CNC baseline does one two-sided contrastive batch per optimiser step")
        if params.loss.epsilon != 0:  # the authors' loss has no margin: both sides must compute the same loss
            raise SystemExit(f"the CNC baseline computes CNC's loss without a margin; loss.epsilon = "
                             f"{params.loss.epsilon} would time another loss (set it to 0 in speed.yaml's cnc entry)")
        sampler = CNCBatchSampler(train.y, inferred, cnc.num_positives, cnc.num_negatives, cnc.two_sided, steps,
                                  seed=params.seed, skip_empty_classes=cnc.skip_empty_classes)
        task.sampler = CNCBatchSampler(train.y, inferred, cnc.num_positives, cnc.num_negatives, cnc.two_sided, steps,
                                       seed=params.seed, skip_empty_classes=cnc.skip_empty_classes)  # `steps` batches
        dataset = PaperImages(images, labels, transform)
        per_batch = 2 * cnc.num_positives + 2 * cnc.num_negatives
        return (task.train_epoch, lambda: baseline_cnc_epoch(base, base_opt, dataset, sampler, params, device),
                per_batch, steps * per_batch)
    raise SystemExit(f"no baseline for stage2.method = {s2.method}")


def method_params(base: dict, overrides: dict, kind_steps: dict[str, int], name: str) -> tuple[Params, int]:
    raw = merge(base, overrides)
    method = raw.get("stage2", {}).get("method", "erm") if name != "erm" else "erm"
    kind = "contrastive" if method in CONTRASTIVE_METHODS else method
    steps = int(kind_steps[kind])  # CNC: setup_pair gives both sides a sampler of `steps` batches per epoch
    return validate(raw), steps


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def time_throughput(config: dict, npz: Path, methods: list[str], repeats: int, num_workers: int,
                    device: torch.device) -> list[dict[str, Any]]:
    base, train = throughput_train(config, npz)
    rows = []
    for name in methods:
        method, steps = method_params(base, config["methods"][name], config["steps"], name)
        ours, baseline, batch_size, samples = setup_pair(name, method, train, steps, method.seed, num_workers, device)
        epoch = iter(range(10**9))
        ours_epoch = lambda: ours(next(epoch))  # noqa: E731
        timed(ours_epoch), timed(baseline)  # warm-up (allocator, lazy inits, DataLoader workers)
        times: dict[str, list[float]] = {"debias": [], "baseline": []}
        for repeat in range(repeats):  # alternate which side goes first, so both see the same background load
            pair = [("debias", ours_epoch), ("baseline", baseline)]
            for side, fn in (pair if repeat % 2 == 0 else pair[::-1]):
                times[side].append(timed(fn))
        ours_s, base_s = statistics.median(times["debias"]), statistics.median(times["baseline"])
        row = {"kind": "throughput", "config": "mnist10k", "name": name, "batch_size": batch_size, "steps": steps,
               "samples": samples, "repeats": repeats, "debias_s": ours_s, "baseline_s": base_s,
               "debias_sps": samples / ours_s, "baseline_sps": samples / base_s, "ratio": base_s / ours_s}
        rows.append(row)
        print(f"[speed] {name}: debias {row['debias_sps']:.0f} samples/s, baseline {row['baseline_sps']:.0f} "
              f"samples/s, ratio {row['ratio']:.2f} (epoch s: {[round(t, 2) for t in times['debias']]} vs "
              f"{[round(t, 2) for t in times['baseline']]})", flush=True)
    return rows


# =========================================================================== output


def machine(threads: int, num_workers: int) -> list[str]:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return [f"{platform.system()} {platform.release()}, {model}, {cores} usable cores (os.cpu_count {os.cpu_count()})",
            f"Python {platform.python_version()}, torch {torch.__version__}, torchvision {torchvision.__version__}",
            f"torch threads {threads} (benchmark process; DEBIAS_THREADS={threads} for pipeline stages), "
            f"baseline DataLoader num_workers={num_workers}"]


def fmt(value: Any, digits: int = 1) -> str:
    return "" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def markdown(rows: list[dict], header: list[str]) -> str:
    lines = ["# Speed benchmark", "", *[f"- {h}" for h in header], ""]
    pipelines = list(dict.fromkeys(r["config"] for r in rows if r["kind"] == "pipeline"))
    if pipelines:
        lines += ["## Pipeline stages", "",
                  "Wall: the stage's `dvc repro -s` (or command) as a child process; body: the stage body as its "
                  "run record (reports/runs/<stage>.json) times it; CPU: user + system seconds of the stage's "
                  "process tree; peak RSS: its largest process (DVC or the stage; RUSAGE_CHILDREN of a small "
                  "launcher). Total: the sum over the stages (the empty MLflow store, made first, is not in it).", ""]
        head = "| stage |" + "".join(f" {p} wall (s) | {p} body (s) | {p} CPU (s) | {p} peak RSS (MiB) |"
                                     for p in pipelines)
        lines += [head, "|---|" + "---:|---:|---:|---:|" * len(pipelines)]
        names = list(dict.fromkeys(r["name"] for r in rows if r["kind"] == "pipeline"))
        for name in names:
            cells = []
            for p in pipelines:
                r = next((r for r in rows if r["kind"] == "pipeline" and r["config"] == p and r["name"] == name), {})
                cells += [fmt(r.get(key)) for key in ("wall_s", "body_s", "cpu_s")] + [fmt(r.get("peak_rss_mib"), 0)]
            label = f"**{name}**" if name == "total" else name
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines.append("")
        for p in pipelines:
            total = next(r for r in rows if r["kind"] == "pipeline" and r["config"] == p and r["name"] == "total")
            lines.append(f"- {p}: total {total['wall_s'] / 60:.1f} min; {total.get('outcome', '')}")
        lines.append("")
    through = [r for r in rows if r["kind"] == "throughput"]
    if through:
        lines += ["## Training-step throughput (mnist10k CMNIST*, LeNet-5)", "",
                  "samples/s of one training epoch of `steps` steps (median of the repeats; debias and baseline "
                  "alternate); ratio = debias / baseline samples/s. debias: its Task classes (ClassifierTask for "
                  "erm/jtt, CNCTask, ContrastiveTask, WCLTask) on the uint8 training tensors, batched shift "
                  "augmentation, vectorised losses. Baseline: a per-sample Dataset (PIL image, torchvision "
                  "RandomCrop(28, padding=2), ToTensor, Normalize; WCL: two views plus Gaussian noise), a "
                  "DataLoader (shuffle; CNC: every index of its batches loaded through the dataset), the "
                  "mask-and-sum losses of benchmarks/reference_losses.py, `.item()` per step. Both run the same "
                  "LeNet-5 module (debias' own, so the model's cost is the same on both sides), optimiser, batch "
                  "size and steps, on one process with the same torch threads; tqdm bars are off when stdout "
                  "is not a terminal.", "",
                  "| method | batch | steps | debias (samples/s) | baseline (samples/s) | debias / baseline |",
                  "|---|---:|---:|---:|---:|---:|"]
        for r in through:
            lines.append(f"| {r['name']} | {r['batch_size']} | {r['steps']} | {r['debias_sps']:.0f} | "
                         f"{r['baseline_sps']:.0f} | {r['ratio']:.2f} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(HERE / "speed.yaml"))
    parser.add_argument("--npz", default=str(DEFAULT_NPZ), help="mnist10k.npz (x uint8 [N,28,28], y)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads here and DEBIAS_THREADS of the stages")
    parser.add_argument("--pipelines", nargs="*", help="subset of the config's pipelines (default: all)")
    parser.add_argument("--methods", nargs="*", help="subset of the config's throughput methods (default: all)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--num-workers", type=int, default=0, help="the baseline DataLoader's workers")
    parser.add_argument("--runner", choices=("dvc", "direct"), default="dvc",
                        help="dvc: `dvc repro -s <stage>`; direct: the stage's cmd from dvc.yaml")
    parser.add_argument("--cold-numba", action="store_true", help="stages get an empty NUMBA_CACHE_DIR")
    parser.add_argument("--trees", nargs="+", default=["worktree"],
                        help="what the pipeline clones hold: 'worktree' and/or commits; several take turns per stage")
    parser.add_argument("--skip-pipeline", action="store_true")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--keep", action="store_true", help="keep the temporary clones")
    add_out_arguments(parser, HERE / "results" / "speed")
    args = parser.parse_args(argv)
    if args.render:
        return render(Path(args.render), markdown, drop_empty=True)
    torch.set_num_threads(args.threads)
    npz = Path(args.npz).resolve()
    config = yaml.safe_load(Path(args.config).read_text())
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    started = datetime.datetime.now().astimezone()
    load_before = os.getloadavg()
    rows: list[dict[str, Any]] = []
    cold = None
    if not args.skip_pipeline:
        logs = Path(tempfile.mkdtemp(prefix="speed-logs-"))
        cold = Path(tempfile.mkdtemp(prefix="speed-numba-")) if args.cold_numba else None
        for name, overrides in config["pipelines"].items():
            if args.pipelines and name not in args.pipelines:
                continue
            rows += time_pipeline(name, fill_npz(overrides, npz), args, cold or NUMBA_CACHE, logs)
        print(f"[speed] stage logs in {logs}")
    if not args.skip_throughput:
        methods = [m for m in config["throughput"]["methods"] if not args.methods or m in args.methods]
        rows += time_throughput(config["throughput"], npz, methods, args.repeats, args.num_workers,
                                torch.device("cpu"))
    command = shlex.join(["python", "-m", "benchmarks.speed", *(argv if argv is not None else sys.argv[1:])])
    header = [f"Command: `{command}`",
              f"Date: {started:%Y-%m-%d %H:%M %Z}; load average (1 min) before {load_before[0]:.2f}, "
              f"after {os.getloadavg()[0]:.2f}",
              *machine(args.threads, args.num_workers),
              f"Pipeline stages: runner `{args.runner}`, DEBIAS_TRACKING=required, fresh MLflow store per clone, "
              f"numba cache {'empty (cold)' if cold else f'{home_relative(NUMBA_CACHE)} (warm after a first run)'}, "
              f"clones of {', '.join('the working tree' if t == 'worktree' else 'commit ' + t for t in args.trees)}"]
    out.with_suffix(".md").write_text(markdown(rows, header))
    fields = ["kind", "config", "name", "wall_s", "body_s", "cpu_s", "peak_rss_mib", "batch_size", "steps", "samples",
              "repeats", "debias_s", "baseline_s", "debias_sps", "baseline_sps", "ratio", "outcome"]
    write_commented_csv(out.with_suffix(".csv"), header, fields, rows)
    print(out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
