"""The papers' full-size protocols (benchmarks/fullsize.yaml, the papers' epochs) stage by stage on one device.

For every setting x method x seed (``--seeds``) of the config a fresh work directory gets the repository's
pipeline/, dvc.yaml and a params.yaml (the repository's, with the config's base, setting and method, the seed and
``--set``'s overrides merged in), the Fashion-MNIST idx files linked into data/raw/fashion_mnist/FashionMNIST/raw/
(``--raw``), and every stage of dvc.yaml (up to ``--until``) runs in DAG order as its command, directly (no DVC,
DEBIAS_TRACKING=off, DEBIAS_DEVICE=``--device``), the way docs/gpu.md's machine ran them. Per stage and row: the
device (named in every row), wall seconds, training steps per second (the training stages: optimiser steps from
the params and the training-set size, over the stage's wall time), the device's peak memory and its idle fraction
while the stage ran (CUDA: sampled every ``--sample-ms`` by ``nvidia-smi``; other devices: empty), and for the
training stages their kept model's test accuracies. ``--parallel N`` runs N rows at once on the device (more
throughput; their timings share it, column ``concurrent``). OUT.csv and OUT.md are rewritten after each row; the
last row (setting, method and seed ``all``, stage ``table``) is the whole table's: its wall time from the first
row's start to the last row's end, its training steps and their rate, the device's peak memory and idle fraction
sampled over the whole table (one ``nvidia-smi`` sampler for the run), and the stage walls summed (the time one
row after another would take at these rates), in OUT.md's notes.

    python -m benchmarks.gpu --raw DIR [--device cuda] [--settings cmnist_0995 ...] [--methods cnc ...]
        [--seeds 0 1 2] [--parallel 3] [--until evaluate] [--set stage2.epochs=1 ...]
        [--stages train_erm train_contrastive ...] [--out benchmarks/results/gpu]
    python -m benchmarks.gpu --device cpu --quick          # a smoke run: the default digits, 1 epoch, 2 stages

``--quick`` replaces the data by the default source (scikit-learn's digits, offline), one setting and the
eps-SupInfoNCE + FairKL method at 1 epoch, and runs the stages up to train_contrastive; it checks the tool, not
the device.
"""

from __future__ import annotations

import argparse
import copy
import csv
import datetime
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

from benchmarks.clones import NUMBA_CACHE, stage_order
from benchmarks.dvc_queue import expand_preset, parse_sets
from debias.core.trees import merge

FIELDS = ["device", "setting", "method", "seed", "stage", "wall_s", "steps", "steps_per_s", "peak_memory_mib",
          "idle_fraction", "concurrent", "test_avg", "test_unbiased", "test_worst_group", "exit"]
# the metrics file a training stage writes (its kept model's test accuracies go into that stage's row)
TRAINING_METRICS = {"train_erm": "reports/metrics/erm.json", "train_contrastive": "reports/metrics/stage2_train.json"}
QUICK = {"setting": {"bias": {"protocol": "foreground"}}, "method": "eps_supinfonce_fairkl_true",
         "overrides": {"data": {"source": "digits"}, "erm": {"epochs": 1},
                       "stage2": {"epochs": 1, "lr_milestones": []}, "evaluate": {"umap": {"max_points": 200}}},
         "last_stage": "train_contrastive"}


class DeviceMonitor:
    """Samples a CUDA device's utilisation and memory with ``nvidia-smi`` while a stage runs (nothing elsewhere)."""

    def __init__(self, device: str, every_ms: int) -> None:
        index = device.split(":", 1)[1] if ":" in device else "0"
        self.command = ["nvidia-smi", f"--id={index}", "--query-gpu=utilization.gpu,memory.used",
                        "--format=csv,noheader,nounits"]
        self.active = device.startswith("cuda") and shutil.which("nvidia-smi") is not None
        self.every = every_ms / 1000
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        while not self._stop.is_set():
            done = subprocess.run(self.command, capture_output=True, text=True)
            try:
                utilisation, memory = (float(v) for v in done.stdout.strip().splitlines()[0].split(","))
                self.samples.append((utilisation, memory))
            except (ValueError, IndexError):
                pass
            self._stop.wait(self.every)

    def __enter__(self) -> "DeviceMonitor":
        if self.active:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def summary(self) -> tuple[float | None, float | None]:
        """(peak memory used in MiB, fraction of samples with 0 % utilisation); None without samples."""
        if not self.samples:
            return None, None
        return max(m for _, m in self.samples), sum(u == 0 for u, _ in self.samples) / len(self.samples)


TABLE = "all"  # setting, method and seed of the whole table's row; its stage is "table"


def table_row(rows: list[dict[str, Any]], wall: float, monitor: DeviceMonitor, device: str,
              parallel: int) -> dict[str, Any]:
    """The whole table's row: ``wall`` (first row's start to last row's end), the rows' training steps and their rate
    over ``wall``, the peak memory and idle fraction of ``monitor`` (sampled over the whole table; None off CUDA),
    ``parallel`` rows at once; ``exit``: the first failing stage's status, else 0."""
    steps = sum(row["steps"] or 0 for row in rows)
    peak, idle = monitor.summary()
    return {"device": device, "setting": TABLE, "method": TABLE, "seed": TABLE, "stage": "table",
            "wall_s": round(wall, 2), "steps": steps or None, "steps_per_s": round(steps / wall, 2) if steps else None,
            "peak_memory_mib": peak, "idle_fraction": None if idle is None else round(idle, 3),
            "concurrent": parallel, "test_avg": None, "test_unbiased": None, "test_worst_group": None,
            "exit": next((row["exit"] for row in rows if row["exit"] != 0), 0)}


def training_steps(params: Any, stage: str, n_train: int) -> int | None:
    """Optimiser steps a training stage takes: ERM and minibatch methods ceil(N / batch) per epoch (JTT's pool and
    GroupDRO's draws: as many points as the pool; JTT approximated by N), CNC its batches / accumulation."""
    if stage == "train_erm":
        return params.erm.epochs * math.ceil(n_train / params.erm.batch_size)
    if stage != "train_contrastive":
        return None
    s2 = params.stage2
    if s2.method == "cnc":
        return None  # from the anchor pool, known after infer_groups: not derived here
    return s2.epochs * math.ceil(n_train / s2.batch_size)


def prepare(work: Path, raw_params: dict, raw_dir: Path | None) -> None:
    """A work directory with the pipeline, dvc.yaml, params.yaml and the Fashion-MNIST files linked in."""
    work.mkdir(parents=True)
    shutil.copytree(REPO / "pipeline", work / "pipeline")
    shutil.copy(REPO / "dvc.yaml", work / "dvc.yaml")
    (work / "params.yaml").write_text(yaml.safe_dump(raw_params, sort_keys=False))
    if raw_dir is not None:
        target = work / "data" / "raw" / "fashion_mnist" / "FashionMNIST" / "raw"
        target.mkdir(parents=True)
        for file in raw_dir.iterdir():
            (target / file.name).symlink_to(file.resolve())


def n_train(work: Path) -> int | None:
    """The training split's size, once inject_bias has written it."""
    from debias.data.store import load_splits
    try:
        return len(load_splits(work / "data" / "biased")["train"])
    except Exception:  # noqa: BLE001 - not written yet, or unreadable: no steps/s for this row
        return None


def test_accuracies(work: Path, stage: str) -> dict[str, Any]:
    """The kept model's test avg / unbiased / worst-group accuracy from a training stage's metrics (else None)."""
    path = work / TRAINING_METRICS.get(stage, "-")
    test = json.loads(path.read_text()).get("test", {}) if path.is_file() else {}
    return {f"test_{key}": test.get(key) for key in ("avg", "unbiased", "worst_group")}


def run_row(work: Path, device: str, setting: str, method: str, seed: int, stages: list[tuple[str, str]],
            args: argparse.Namespace, log: Path) -> list[dict[str, Any]]:
    from debias.schema import validate

    params = validate(yaml.safe_load((work / "params.yaml").read_text()))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), *filter(None, [os.environ.get("PYTHONPATH")])]),
           "DEBIAS_TRACKING": "off", "DEBIAS_DEVICE": device,
           "NUMBA_CACHE_DIR": os.environ.get("NUMBA_CACHE_DIR", str(NUMBA_CACHE)), "DEBIAS_THREADS": str(args.threads), "OMP_WAIT_POLICY": "PASSIVE", "MLFLOW_DISABLE_TELEMETRY": "true"}
    rows = []
    for stage, cmd in stages:
        with open(log, "a") as handle, DeviceMonitor(device, args.sample_ms) as monitor:  # one log per row
            handle.write(f"$ ({work}) {cmd}\n")
            handle.flush()
            started = time.perf_counter()
            status = subprocess.call(shlex.split(cmd), cwd=work, env=env, stdout=handle, stderr=subprocess.STDOUT)
            wall = time.perf_counter() - started
        peak, idle = monitor.summary()
        size = n_train(work) if stage in ("train_erm", "train_contrastive") else None
        steps = training_steps(params, stage, size) if size else None
        rows.append({"device": args.device_name, "setting": setting, "method": method, "seed": seed, "stage": stage,
                     "wall_s": round(wall, 2), "steps": steps, "steps_per_s": round(steps / wall, 2) if steps else None,
                     "peak_memory_mib": peak, "idle_fraction": None if idle is None else round(idle, 3),
                     "concurrent": args.parallel, **test_accuracies(work, stage), "exit": status})
        print(f"[gpu] {rows[-1]}", flush=True)
        if status != 0:
            break
    return rows


def device_name(device: str) -> str:
    """The device in words, e.g. 'cuda: NVIDIA H100 80GB HBM3' or 'cpu: 2 cores'."""
    if device.startswith("cuda"):
        import torch
        index = int(device.split(":", 1)[1]) if ":" in device else 0
        return f"{device}: {torch.cuda.get_device_name(index)}"
    return f"{device}: {os.cpu_count()} cores"


def table_note(rows: list[dict[str, Any]], table: dict[str, Any]) -> str:
    """The whole table in words: rows, wall time against the stage walls summed, idle fraction."""
    runs = {(row["setting"], row["method"], row["seed"]) for row in rows}
    summed = sum(row["wall_s"] for row in rows)
    idle = "not sampled (CUDA only)" if table["idle_fraction"] is None else f"{table['idle_fraction']:.1%}"
    return (f"Whole table: {len(runs)} row(s) of {len(rows)} stage(s), {table['concurrent']} at once: "
            f"{table['wall_s']} s wall (stage walls summed: {round(summed, 2)} s, "
            f"{summed / table['wall_s'] if table['wall_s'] else 0:.2f}x); device idle over the table: {idle}")


def write(out: Path, rows: list[dict[str, Any]], notes: list[str], table: dict[str, Any] | None = None) -> None:
    """OUT.csv and OUT.md: ``notes``, the rows, and the whole table's row (``table``) last where given."""
    notes = notes + ([table_note(rows, table)] if table is not None else [])
    rows = rows + ([table] if table is not None else [])
    with open(out.with_suffix(".csv"), "w", newline="") as handle:
        handle.write("".join(f"# {n}\n" for n in notes))
        writer = csv.DictWriter(handle, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    lines = ["# Full-size protocols, stage by stage\n", *[f"- {n}" for n in notes], "",
             "| " + " | ".join(FIELDS) + " |", "|" + "---|" * len(FIELDS)]
    lines += ["| " + " | ".join("" if row[k] is None else str(row[k]) for k in FIELDS) + " |" for row in rows]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


def committed_params() -> dict:
    """The committed params.yaml (``git show HEAD:params.yaml``) as the base of every plan, as quality.py's clones
    use it: a workspace edited by ``dvc exp run -S`` does not change the benchmark. Outside git: the file."""
    done = subprocess.run(["git", "show", "HEAD:params.yaml"], cwd=REPO, capture_output=True, text=True)
    return yaml.safe_load(done.stdout if done.returncode == 0 else (REPO / "params.yaml").read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=HERE / "fullsize.yaml")
    parser.add_argument("--raw", type=Path, help="the Fashion-MNIST idx files (.gz accepted)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--settings", nargs="*")
    parser.add_argument("--methods", nargs="*")
    parser.add_argument("--stages", nargs="*", help="stages to time (default: every stage of dvc.yaml)")
    parser.add_argument("--threads", type=int, default=2, help="DEBIAS_THREADS of the stages")
    parser.add_argument("--sample-ms", type=int, default=100)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="a row per seed (params `seed`)")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="params overrides merged over every row's, e.g. stage2.cnc.anchor_fraction=0.1")
    parser.add_argument("--until", help="the last stage to run (default: dvc.yaml's last; the report stage needs "
                        "vl-convert-python)")
    parser.add_argument("--parallel", type=int, default=1,
                        help="rows run at once on the device (their timings then share it: column `concurrent`)")
    parser.add_argument("--work", type=Path, help="keep the work directories here (default: a temporary one)")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "gpu")
    args = parser.parse_args(argv)
    config = yaml.safe_load(args.config.read_text())
    repo_params = committed_params()
    order = stage_order(REPO / "dvc.yaml")
    names = [name for name, _ in order]
    if args.until and args.until not in names:
        raise SystemExit(f"--until {args.until}: not a stage of dvc.yaml; allowed: {', '.join(names)}")
    if args.parallel < 1:
        raise SystemExit(f"--parallel {args.parallel}: at least 1")
    try:
        forced = parse_sets(args.set)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    if args.quick or args.until:
        order = order[: names.index(QUICK["last_stage"] if args.quick else args.until) + 1]
    if args.quick:
        plan = [("quick", QUICK["method"], merge(merge(merge(repo_params, config["base"]), expand_preset(QUICK["setting"])),
                                                 merge(expand_preset(config["methods"][QUICK["method"]]),
                                                       QUICK["overrides"])))]
    else:
        if args.raw is None or not args.raw.is_dir():
            raise SystemExit(f"--raw {args.raw}: a directory with the Fashion-MNIST idx files is needed "
                             "(or --quick for a smoke run on the default digits)")
        plan = [(setting, method, merge(merge(merge(repo_params, config["base"]), expand_preset(changes)),
                                        expand_preset(config["methods"][method])))
                for setting, changes in config["settings"].items() if not args.settings or setting in args.settings
                for method in config["methods"] if not args.methods or method in args.methods]
    if args.stages:
        unknown = sorted(set(args.stages) - {name for name, _ in order})
        if unknown:
            raise SystemExit(f"--stages {' '.join(unknown)}: not stages of dvc.yaml; allowed: "
                             f"{', '.join(name for name, _ in order)}")
    args.device_name = device_name(args.device)
    started = datetime.datetime.now().astimezone()
    command = shlex.join(["python", "-m", "benchmarks.gpu", *(argv if argv is not None else sys.argv[1:])])
    notes = [f"Command: `{command}`", f"Date: {started:%Y-%m-%d %H:%M %Z}", f"Device: {args.device_name}; "
             f"DEBIAS_THREADS={args.threads}; idle fraction: share of {args.sample_ms} ms nvidia-smi samples at 0 % "
             f"utilisation (CUDA only); {args.parallel} row(s) at once (timings of rows run together share the "
             "device); test accuracies: the training stage's kept model (its metrics file)"]
    root = args.work or Path(tempfile.mkdtemp(prefix="gpu-bench-"))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    lock = threading.Lock()

    def one(setting: str, method: str, seed: int, raw_params: dict) -> None:
        name = f"{setting}-{method}-s{seed}"
        work = root / name
        prepare(work, merge(merge(copy.deepcopy(raw_params), {"seed": seed}), forced), None if args.quick else args.raw)
        # upstream stages always run (their outputs feed the timed ones); only the --stages rows are kept
        new = run_row(work, args.device, setting, method, seed, order, args, root / f"{name}.log")
        with lock:
            rows.extend(row for row in new if not args.stages or row["stage"] in args.stages)
            rows.sort(key=lambda row: (row["setting"], row["method"], row["seed"], names.index(row["stage"])))
            write(args.out, rows, notes)
        if any(row["exit"] != 0 for row in new):
            print(f"[gpu] {name}: a stage failed, see {root / (name + '.log')}", flush=True)

    from concurrent.futures import ThreadPoolExecutor

    table_started = time.perf_counter()
    with DeviceMonitor(args.device, args.sample_ms) as table_monitor, \
            ThreadPoolExecutor(args.parallel) as pool:  # threads only wait on the stages' processes
        for future in [pool.submit(one, setting, method, seed, raw_params)
                       for setting, method, raw_params in plan for seed in args.seeds]:
            future.result()
    table_wall = time.perf_counter() - table_started
    write(args.out, rows, notes, table_row(rows, table_wall, table_monitor, args.device_name, args.parallel))
    if args.work is None:
        shutil.rmtree(root, ignore_errors=True)
    print(args.out.with_suffix(".md").read_text())
    return 0 if all(row["exit"] == 0 for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
