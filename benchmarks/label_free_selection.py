"""What the label-free selection rules give up against the oracle, on the quality settings (benchmarks/quality.yaml).

The oracle keeps the epoch of best validation worst-group accuracy (it reads the bias labels); the label-free rules
keep the best validation worst-class or worst-inferred-group epoch, or the last one (src/debias/training/selection.py).
One stage-2 run per (setting, method, seed) serves every rule: the stage keeps each rule's model and its selection
block records what each gives on test (``selection.picks_test.<rule>.*`` in MLflow). The runs go through
benchmarks/quality.py's scratch clone and DVC queue (``--workdir`` resumes; the upstream of a (setting, seed) is
shared through DVC's run-cache), up to train_contrastive. Per run and rule, OUT.csv; OUT.md: per setting x method,
the oracle's test worst-group accuracy and each label-free rule's loss against it in points, mean +- std over
seeds (a negative loss: the rule's model did better on test than the oracle's).

    python -m benchmarks.label_free_selection --npz ../shared/datasets/mnist10k.npz --seeds 0 1 2 --jobs 2 \\
        --workdir /tmp/label-free --out benchmarks/results/label_free_selection
"""

from __future__ import annotations

import argparse
import csv
import datetime
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent

from benchmarks import dvc_queue
from benchmarks import pages
from debias.core.trees import merge

ORACLE = "best_worst_group"
LABEL_FREE = ("best_worst_class", "best_worst_inferred_group", "last")
SETTINGS = ["cmnist_096", "bmnist_096"]
METHODS = ["cnc_cluster", "jtt", "groupdro_cluster", "eps_supinfonce_fairkl_cluster"]
TARGET = "train_contrastive"
FIELDS = ["setting", "seed", "method", "rule", "epoch", "test_avg", "test_worst_group", "test_unbiased",
          "test_worst_class"]


def jobs_for(config: dict, settings: list[str], seeds: list[int], methods: list[str]) -> list[dict]:
    """The quality study's plan (:func:`benchmarks.dvc_queue.plan`) with every method experiment stopped at
    train_contrastive (no probe, no evaluate)."""
    return [job if job["method"] == dvc_queue.UPSTREAM else {**job, "targets": [TARGET]}
            for job in dvc_queue.plan(config, settings, seeds, methods)]


def collect(workdir: Path, jobs: list[dict]) -> list[dict[str, Any]]:
    """One row per (experiment, rule) from the train_contrastive runs' ``selection.picks`` / ``picks_test`` metrics."""
    from mlflow.tracking import MlflowClient

    by_name = {job["name"]: job for job in jobs if job["method"] != dvc_queue.UPSTREAM}
    client = MlflowClient(tracking_uri=dvc_queue.store_uri(workdir))
    experiments = [e.experiment_id for e in client.search_experiments()]
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for found in client.search_runs(experiments, filter_string="attributes.status = 'FINISHED'", max_results=50000):
        job = by_name.get(found.data.tags.get("debias.dvc_experiment", ""))
        if job is None or found.data.tags.get("debias.stage") != TARGET:
            continue
        metrics = found.data.metrics
        for rule in (ORACLE, *LABEL_FREE):
            if f"selection.picks_test.{rule}.avg" not in metrics:
                continue
            test = {key: metrics.get(f"selection.picks_test.{rule}.{key}")
                    for key in ("avg", "worst_group", "unbiased", "worst_class")}
            rows[(job["name"], rule)] = {"setting": job["setting"], "seed": job["seed"], "method": job["method"],
                                         "rule": rule, "epoch": int(metrics[f"selection.picks.{rule}"]),
                                         **{f"test_{key}": value for key, value in test.items()}}
    return sorted(rows.values(), key=lambda r: (r["setting"], r["method"], r["seed"], r["rule"]))


def mean_std(values: list[float]) -> str:
    """``mean ± std`` (sample std, :func:`benchmarks.pages.mean_std`), with the number of seeds when it is not 3."""
    text = pages.mean_std(values)
    return text if len(values) == 3 else f"{text} (n={len(values)})"


def table(rows: list[dict[str, Any]], labels: dict[str, str]) -> str:
    """Per setting x method: the oracle's test worst-group and each label-free rule's loss against it, in points."""
    lines = ["| setting | method | oracle: test worst-group % | " + " | ".join(
        f"{rule}: points lost (same epoch)" for rule in LABEL_FREE) + " |", "|---" * (3 + len(LABEL_FREE)) + "|"]
    cells = sorted({(r["setting"], r["method"]) for r in rows})
    for setting, method in cells:
        runs = {(r["seed"], r["rule"]): r for r in rows if (r["setting"], r["method"]) == (setting, method)}
        seeds = sorted({seed for seed, rule in runs if rule == ORACLE})
        oracle = [100 * runs[s, ORACLE]["test_worst_group"] for s in seeds]
        parts = []
        for rule in LABEL_FREE:
            paired = [s for s in seeds if (s, rule) in runs]
            lost = [100 * (runs[s, ORACLE]["test_worst_group"] - runs[s, rule]["test_worst_group"]) for s in paired]
            same = sum(runs[s, rule]["epoch"] == runs[s, ORACLE]["epoch"] for s in paired)
            parts.append(f"{mean_std(lost)} ({same}/{len(paired)})" if paired else "n/a")
        lines.append(f"| {setting} | {labels.get(method, method)} | {mean_std(oracle)} | " + " | ".join(parts) + " |")
    return "\n".join(lines)


def write(out: Path, rows: list[dict[str, Any]], text: str, header: str) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_suffix(".csv"), "w", newline="") as handle:
        handle.write("".join(f"# {line}\n" for line in header.splitlines() if line))
        writer = csv.DictWriter(handle, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    out.with_suffix(".md").write_text(f"# Label-free model selection against the oracle\n\n{header}\n\n{text}\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--npz", help="path to mnist10k.npz, read in place as data.path")
    parser.add_argument("--config", type=Path, default=HERE / "quality.yaml")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--settings", nargs="*", default=SETTINGS)
    parser.add_argument("--methods", nargs="*", default=METHODS)
    parser.add_argument("--jobs", type=int, default=2, help="DVC queue workers")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads per worker (DEBIAS_THREADS)")
    parser.add_argument("--workdir", type=Path, required=True, help="scratch clone to create or resume")
    parser.add_argument("--collect-only", action="store_true", help="only rebuild the tables from --workdir")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "label_free_selection")
    args = parser.parse_args(argv)
    config = yaml.safe_load(args.config.read_text())
    unknown = [s for s in args.settings if s not in config["settings"]]
    unknown += [m for m in args.methods if m not in config["methods"]]
    if unknown:
        parser.error(f"not in {args.config}: {', '.join(unknown)}")
    if not args.collect_only and not (args.npz and Path(args.npz).is_file()):
        parser.error(f"--npz {args.npz}: give the path of mnist10k.npz")
    jobs = jobs_for(config, args.settings, args.seeds, args.methods)
    workdir = args.workdir.resolve()
    started = time.time()
    if not args.collect_only:
        base = merge(config["base"], {"data": {"path": str(Path(args.npz).resolve())}})
        dvc_queue.open_workdir(parser, workdir, base)
        dvc_queue.run_queue(workdir, jobs, args.jobs, dvc_queue.stage_env(args.threads, workdir))
    rows = collect(workdir, jobs)
    if not rows:
        print("[label-free] no results", file=sys.stderr)
        return 1
    command = "python -m benchmarks.label_free_selection " + " ".join(sys.argv[1:] if argv is None else argv)
    commit = dvc_queue.run(["git", "rev-parse", "--short", "HEAD~1"], cwd=workdir).strip()
    header = (f"Command: `{command}` (pipeline code at commit {commit}); date "
              f"{datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}. Machine: {os.cpu_count()} CPUs "
              f"({platform.processor() or platform.machine()}), {args.jobs} queue workers x {args.threads} thread(s)"
              + ("" if args.collect_only else f"; benchmark wall time {(time.time() - started) / 60:.1f} min") + ".\n\n"
              f"Oracle: `{ORACLE}` (validation worst-group accuracy, needs bias labels). Each label-free rule's "
              "column: the oracle's test worst-group accuracy minus the rule's, in points, mean ± std over seeds "
              "(paired by seed); in brackets, in how many seeds the rule kept the oracle's epoch.")
    text = table(rows, config.get("labels", {}))
    write(args.out, rows, text, header)
    print(header + "\n\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
