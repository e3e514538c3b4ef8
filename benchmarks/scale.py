"""Scaling benchmark: the whole pipeline at several training-set sizes, per stage wall time, CPU time and peak RSS,
and how each stage's time grows with the training-set size N.

For every size (benchmarks/scale.yaml ``sizes``; at 54,000 the papers' 54k / 6k / 10k) a fresh temporary git clone
of the repository gets params.yaml with the config's overrides and ``data.max_train = N`` (a nested seeded subset:
validation and test keep their size), the complete Fashion-MNIST idx files linked into
``data/raw/fashion_mnist/FashionMNIST/raw/`` and a fresh MLflow store; every stage runs in DAG order as
``dvc repro -s <stage>`` (or its command: ``--runner direct``) with DEBIAS_TRACKING=required and
DEBIAS_THREADS=1, with the first stage-2 method of the config (CNC). Every further method (FairKL) then reruns
train_contrastive and the stages after it. Per stage: wall seconds, CPU seconds (user + system of its process
tree), peak RSS (its largest process; RUSAGE_CHILDREN of a small launcher, as benchmarks/speed.py) and the body
seconds its run record holds. The growth exponent of a stage is the least-squares slope of log(time) against
log(N) over the sizes measured (1: linear, 2: quadratic). Peak RSS is also given above the RSS of a process that
only imports torch (the issue's budget: 1.5 GB above it at 54k).

Results: OUT.md and OUT.csv (default benchmarks/results/scale); rows are written to the CSV as they come, so an
interrupted run keeps what it measured (``--render OUT.csv`` rewrites the Markdown).

    nice -n 5 python -m benchmarks.scale [--sizes 6000 18000 54000] [--quick] [--raw DIR] [--threads 1]
        [--runner dvc|direct] [--methods cnc fairkl] [--keep] [--out benchmarks/results/scale]
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import math
import os
import shlex
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

from benchmarks.clones import NUMBA_CACHE, child_env, home_relative, make_clone, run_measured, stage_order
from benchmarks.dvc_queue import link_raw_files
from benchmarks.pages import add_out_arguments, render
from debias.core.trees import merge

STAGE2_STAGES = ("train_contrastive", "linear_probe", "evaluate", "report")  # rerun for every further method
FIELDS = ["size", "method", "stage", "n_train", "wall_s", "body_s", "cpu_s", "peak_rss_mib", "rss_above_torch_mib",
          "cnc_batches"]


def growth_exponent(sizes: list[float], values: list[float | None]) -> float | None:
    """Least-squares slope of log(value) against log(size) over the positive values; None with fewer than 2."""
    points = [(math.log(n), math.log(v)) for n, v in zip(sizes, values) if v is not None and v > 0]
    if len({x for x, _ in points}) < 2:
        return None
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    return (sum((x - mean_x) * (y - mean_y) for x, y in points) / sum((x - mean_x) ** 2 for x, _ in points))


def size_params(config: dict, size: int, method: str, quick: bool) -> dict:
    """The params.yaml overrides of one (size, method): base <- method <- quick <- data.max_train."""
    overrides = merge(config["base"], config["methods"][method])
    if quick:
        overrides = merge(overrides, config.get("quick", {}).get("base", {}))
        overrides = merge(overrides, config.get("quick", {}).get("methods", {}).get(method, {}))
    return merge(overrides, {"data": {"max_train": int(size)}})


def torch_baseline_rss(env: dict[str, str], cwd: Path, log: Path) -> float:
    """Peak RSS (MiB) of a process that only imports torch, measured like the stages."""

    status, _, _, rss = run_measured([sys.executable, "-c", "import torch"], cwd, env, log)
    if status != 0:
        raise SystemExit(f"importing torch failed; see {log}")
    return rss


def write_params(clone: Path, overrides: dict) -> None:
    params = yaml.safe_load((clone / "params.yaml").read_text())
    (clone / "params.yaml").write_text(yaml.safe_dump(merge(params, overrides), sort_keys=False))


def run_stage(clone: Path, env: dict[str, str], stage: str, cmd: str, runner: str, log: Path) -> dict[str, Any]:

    command = ["dvc", "repro", "-s", stage] if runner == "dvc" else shlex.split(cmd.split("#")[0])
    if runner == "direct" and command[0] == "python":
        command[0] = sys.executable
    status, wall, cpu, rss = run_measured(command, clone, env, log)
    if status != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
        raise SystemExit(f"stage {stage} failed ({status}) in {clone}; log {log}:\n{tail}")
    record = clone / "reports" / "runs" / f"{stage}.json"
    body = json.loads(record.read_text())["wall_time_s"] if record.exists() else None
    return {"wall_s": wall, "body_s": body, "cpu_s": cpu, "peak_rss_mib": rss}


def cnc_batches(clone: Path, stage: str) -> int | None:
    """CNC's two-sided batches per epoch (Alg. 3: one per anchor of its anchor pool, times anchor_fraction), from
    train_contrastive's info file: its work per epoch follows the inferred groups' anchor pool, not N alone."""
    info = clone / "reports" / "metrics" / "stage2_train_info.json"
    if stage != "train_contrastive" or not info.exists():
        return None
    return json.loads(info.read_text()).get("sampler", {}).get("batches_per_epoch")


def run_size(size: int, config: dict, methods: list[str], args: argparse.Namespace, work: Path, logs: Path,
             writer: csv.DictWriter, handle: Any) -> list[dict[str, Any]]:

    clone = work / f"n{size}"
    clone.mkdir()
    make_clone(clone, size_params(config, size, methods[0], args.quick), None)
    link_raw_files(clone, args.raw)
    env = child_env(args.threads, NUMBA_CACHE, clone)
    log = logs / f"n{size}.log"
    status, _, _, _ = run_measured(  # a fresh, migrated MLflow store (not timed as a stage)
        [sys.executable, "-c", "import sys; from mlflow.tracking import MlflowClient; "
         "MlflowClient(tracking_uri=f'sqlite:///{sys.argv[1]}/mlflow.db').search_experiments()", str(clone)],
        clone, env, log)
    if status != 0:
        raise SystemExit(f"creating the MLflow store failed; see {log}")
    baseline = torch_baseline_rss(env, clone, log)
    rows = []
    stages = stage_order(clone / "dvc.yaml")
    for index, method in enumerate(methods):
        if index:
            write_params(clone, size_params(config, size, method, args.quick))
        for stage, cmd in stages:
            if index and stage not in STAGE2_STAGES:
                continue
            row = {"size": size, "method": method, "stage": stage,
                   **run_stage(clone, env, stage, cmd, args.runner, log)}
            summary = clone / "data" / "biased" / "summary.json"
            row["n_train"] = json.loads(summary.read_text())["splits"]["train"]["n"] if summary.exists() else None
            row["rss_above_torch_mib"] = row["peak_rss_mib"] - baseline
            row["cnc_batches"] = cnc_batches(clone, stage)
            rows.append(row)
            writer.writerow({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()})
            handle.flush()
            print(f"[scale] N={size} {method} {stage}: {row['wall_s']:.1f} s wall, {row['cpu_s']:.1f} s CPU, "
                  f"peak RSS {row['peak_rss_mib']:.0f} MiB ({row['rss_above_torch_mib']:+.0f} above torch)",
                  flush=True)
    if args.keep:
        print(f"[scale] N={size}: clone kept in {clone}")
    else:
        shutil.rmtree(clone, ignore_errors=True)
    return rows


def fmt(value: Any, digits: int = 1) -> str:
    return "" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def markdown(rows: list[dict[str, Any]], header: list[str]) -> str:
    sizes = sorted({int(r["size"]) for r in rows})
    keys = list(dict.fromkeys((r["method"], r["stage"]) for r in rows))
    first_method = keys[0][0] if keys else None

    def label(method: str, stage: str) -> str:
        return stage if method == first_method or stage not in STAGE2_STAGES else f"{stage} ({method})"

    def cell(method: str, stage: str, size: int, key: str) -> Any:
        return next((r.get(key) for r in rows if (r["method"], r["stage"], int(r["size"])) == (method, stage, size)),
                    None)

    lines = ["# Scaling benchmark", "", *[f"- {h}" for h in header], "",
             "Per stage and training-set size N: wall and CPU seconds (user + system of the stage's process tree), body "
             "seconds (the stage's MLflow run as its run record times it: wall, without the process start-up) and "
             "peak RSS of its largest process (MiB). Exponent: least-squares slope of log(seconds) against log(N) over "
             "the sizes measured (1 = linear, 2 = quadratic); validation (6k) and test (10k) do not grow with N, so a "
             "stage whose work is mostly on them (evaluate) stays near 0. Total: the sum over the stages.", ""]
    head = "| stage |" + "".join(f" N={n} wall (s) | N={n} CPU (s) | N={n} body (s) |" for n in sizes) + \
        " exponent wall | exponent CPU | exponent body |" + "".join(f" N={n} peak RSS (MiB) |" for n in sizes)
    lines += [head, "|---|" + "---:|" * (3 * len(sizes) + 3 + len(sizes))]
    for method, stage in keys:
        series = {key: [cell(method, stage, n, key) for n in sizes] for key in ("wall_s", "cpu_s", "body_s")}
        lines.append(f"| {label(method, stage)} | "
                     + " | ".join(" | ".join(fmt(series[key][i]) for key in series) for i in range(len(sizes)))
                     + " | " + " | ".join(fmt(growth_exponent(sizes, series[key]), 2) for key in series) + " | "
                     + " | ".join(fmt(cell(method, stage, n, "peak_rss_mib"), 0) for n in sizes) + " |")
    totals = {key: [sum(r[key] for r in rows if int(r["size"]) == n and r.get(key) is not None) for n in sizes]
              for key in ("wall_s", "cpu_s", "body_s")}
    peaks = [max((r["peak_rss_mib"] for r in rows if int(r["size"]) == n), default=None) for n in sizes]
    lines.append("| **total** | "
                 + " | ".join(" | ".join(fmt(totals[key][i]) for key in totals) for i in range(len(sizes)))
                 + " | " + " | ".join(fmt(growth_exponent(sizes, totals[key]), 2) for key in totals) + " | "
                 + " | ".join(fmt(p, 0) for p in peaks) + " |")
    lines.append("")
    for n in sizes:
        above = [r for r in rows if int(r["size"]) == n and r.get("rss_above_torch_mib") is not None]
        if above:
            top = max(above, key=lambda r: r["rss_above_torch_mib"])
            n_train = next((r["n_train"] for r in rows if int(r["size"]) == n and r.get("n_train")), None)
            lines.append(f"- N={n} ({n_train} training images): largest peak RSS {top['peak_rss_mib']:.0f} MiB "
                         f"({label(top['method'], top['stage'])}), {top['rss_above_torch_mib']:.0f} MiB above a process "
                         "that only imports torch")
    work = [r for r in rows if r.get("cnc_batches")]
    if work:
        lines += ["", "CNC's train_contrastive per unit of work (its epoch is one two-sided batch per anchor of the "
                      "inferred groups' anchor pool, so its time follows that pool, not N alone):"]
        lines += [f"- N={int(r['size'])}: {int(r['cnc_batches'])} batches per epoch, {r['body_s'] or r['wall_s']:.1f} s "
                  f"({1000 * (r['body_s'] or r['wall_s']) / r['cnc_batches']:.1f} ms a batch)" for r in work]
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(HERE / "scale.yaml"))
    parser.add_argument("--sizes", nargs="+", type=int, help="training-set sizes (default: the config's)")
    parser.add_argument("--methods", nargs="+", help="stage-2 methods of the config, the first with the whole pipeline")
    parser.add_argument("--quick", action="store_true", help="the config's short epochs (checks the script)")
    parser.add_argument("--raw", help="folder of the Fashion-MNIST idx files (default: the config's, from the repo root)")
    parser.add_argument("--threads", type=int, default=1, help="DEBIAS_THREADS of the stages")
    parser.add_argument("--runner", choices=("dvc", "direct"), default="dvc",
                        help="dvc: `dvc repro -s <stage>`; direct: the stage's cmd from dvc.yaml")
    parser.add_argument("--keep", action="store_true", help="keep the temporary clones")
    add_out_arguments(parser, HERE / "results" / "scale")
    args = parser.parse_args(argv)
    if args.render:
        return render(Path(args.render), markdown)

    config = yaml.safe_load(Path(args.config).read_text())
    sizes = args.sizes or config["sizes"]
    methods = args.methods or list(config["methods"])
    unknown = [m for m in methods if m not in config["methods"]]
    if unknown:
        raise SystemExit(f"methods {unknown} are not in {args.config} (allowed: {list(config['methods'])})")
    args.raw = Path(args.raw or REPO / config["raw"]).resolve()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    started = datetime.datetime.now().astimezone()
    load_before = os.getloadavg()[0]
    command = shlex.join(["python", "-m", "benchmarks.scale", *(argv if argv is not None else sys.argv[1:])])
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    header = [f"Command: `{command}`",
              f"Started {started:%Y-%m-%d %H:%M %Z}; load average (1 min) before {load_before:.2f}; {cores} usable cores",
              f"Runner `{args.runner}`, DEBIAS_TRACKING=required, DEBIAS_THREADS={args.threads}, fresh clone and MLflow "
              f"store per size, numba cache {home_relative(NUMBA_CACHE)}; epochs: {'--quick' if args.quick else 'the config'}"
              f"; methods {', '.join(methods)} (the first with the whole pipeline)"]
    work = Path(tempfile.mkdtemp(prefix="scale-"))
    logs = work / "logs"
    logs.mkdir()
    rows: list[dict[str, Any]] = []
    with open(out.with_suffix(".csv"), "w", newline="") as handle:
        handle.write("".join(f"# {h}\n" for h in header))
        writer = csv.DictWriter(handle, fieldnames=FIELDS, extrasaction="ignore")
        writer.writeheader()
        for size in sizes:
            rows += run_size(size, config, methods, args, work, logs, writer, handle)
    header.append(f"Finished {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}; load average (1 min) after "
                  f"{os.getloadavg()[0]:.2f}")
    out.with_suffix(".md").write_text(markdown(rows, header))
    print(out.with_suffix(".md").read_text())
    print(f"[scale] logs in {logs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
