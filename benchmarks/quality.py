"""Method comparison on real MNIST digits, run through the pipeline itself (DVC experiment queue).

For every setting (bias protocol and strength) x seed x method of ``benchmarks/quality.yaml``
this runs ``dvc exp run -S ...`` in a scratch clone of the repository through ``debias sweep``'s
local launcher (DVC's queue, ``dvc queue start -j JOBS``: :func:`debias.tools.sweep.run_local`). The shared upstream of each (setting, seed) (download ->
inject_bias -> train_erm -> infer_groups with clusters) is queued first, so the method
experiments reuse it from DVC's run-cache. Results are collected from ``dvc exp show --json``
(metrics) and the clone's MLflow store (wall time of every stage run, by experiment tag), then
written as per-run CSV and a Markdown table of mean +- std over seeds.

    python -m benchmarks.quality --npz ../shared/datasets/mnist10k.npz --seeds 0 1 2 --jobs 2

``--workdir`` keeps the clone (and its MLflow store, ``mlflow ui`` there); rerunning with the
same ``--workdir`` skips experiments that already succeeded. ``--collect-only`` rebuilds the
tables from an existing workdir.
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from benchmarks.dvc_queue import (RAW_FILES, UPSTREAM, add_queue_arguments, apply_profile, checked_selection, finish,
                                  link_raw_files, missing_raw_files, open_workdir, plan, run, run_queue, shown_experiments,
                                  stage_env, stage_runs, stage_warnings, write_results, write_sweep_file)
from benchmarks.pages import mean_std, warning_flag, warning_notes
from debias.core.trees import merge

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
ACCURACY = ("avg", "unbiased", "worst_group")
HEADLINE = {"avg": "avg", "unbiased": "unbiased", "worst_group": "worst"}  # accuracy -> its headline key suffix


ROW_STAGE = {"erm": "train_erm"}  # the stage whose warnings a row carries (default: train_contrastive)


def add_warnings(rows: list[dict], warnings: dict[str, dict[str, list[str]]]) -> list[dict]:
    """Each row's ``warnings`` (the codes of the stage that produced its numbers, ';'-joined; '' when none)."""
    for row in rows:
        stage = ROW_STAGE.get(row["method"], "linear_probe" if row.get("from_probe") else "train_contrastive")
        row["warnings"] = ";".join(warnings.get(row["experiment"], {}).get(stage, []))
        row.pop("from_probe", None)
    return rows


def rows_of(jobs: list[dict], shown: dict[str, dict], seconds: dict[str, dict[str, float]],
            evaluated: dict[str, dict[str, float]] | None = None) -> list[dict]:
    """One CSV row per (setting, seed, method), the ERM row taken from each upstream experiment."""
    rows = []
    evaluated = evaluated or {}
    by_name = {job["name"]: job for job in jobs}
    erm_of: dict[tuple, dict] = {}  # (setting, seed) -> ERM representation metrics (identical in every method experiment)
    for job in jobs:
        got = shown.get(job["name"])
        if job["method"] != UPSTREAM and got and got["metrics"].get("align_erm") is not None:
            extra = evaluated.get(job["name"], {})
            erm_of[(job["setting"], job["seed"])] = {
                "alignment_loss": got["metrics"].get("align_erm"), "mi_a": got["metrics"].get("mi_a_erm"),
                "mi_y": extra.get("erm.test.mi_y"), "h_a": extra.get("erm.test.h_a")}
    for name, job in by_name.items():
        got = shown.get(name)
        if got is None:
            continue
        metrics = got["metrics"]
        row: dict[str, Any] = {"setting": job["setting"], "seed": job["seed"]}
        row.update(n_train=metrics.get("bias_n"), n_conflicting=metrics.get("bias_conflicting"))
        if job["method"] == UPSTREAM:
            prefix = "erm"
            rep = erm_of.get((job["setting"], job["seed"]), {})
            stage_time = seconds.get(name, {}).get("train_erm")
            row["method"] = "erm"
        elif job.get("result"):  # a linear probe's result (e.g. DFR on the ERM encoder): its headline keys
            encoder = "erm" if job["result"].get("encoder", "stage2") == "erm" else "s2"
            prefix = f"probe_{encoder}"
            rep = (erm_of.get((job["setting"], job["seed"]), {}) if encoder == "erm" else
                   {"alignment_loss": metrics.get("align_s2"), "mi_a": metrics.get("mi_a_s2")})
            stage_time = seconds.get(name, {}).get("linear_probe")
            row["method"] = job["method"]
            row["from_probe"] = True
        else:
            prefix = "s2"
            extra = evaluated.get(name, {})
            rep = {"alignment_loss": metrics.get("align_s2"), "mi_a": metrics.get("mi_a_s2"),
                   "mi_y": extra.get("stage2.test.mi_y"), "h_a": extra.get("stage2.test.h_a")}
            stage_time = seconds.get(name, {}).get("train_contrastive")
            row["method"] = job["method"]
        test = {k: metrics.get(f"{prefix}_{HEADLINE[k]}") for k in ACCURACY}
        if all(v is None for v in test.values()):
            continue  # queued, failed or stopped at the time limit: no result
        row.update({f"test_{k}": test[k] for k in ACCURACY})
        row.update(alignment_loss=rep.get("alignment_loss"), mi_a=rep.get("mi_a"), mi_y=rep.get("mi_y"),
                   h_a=rep.get("h_a"), train_seconds=stage_time,
                   experiment_seconds=sum(seconds.get(name, {}).values()) or None, experiment=name)
        rows.append(row)
    return rows


def markdown(rows: list[dict], config: dict, settings: list[str], methods: list[str]) -> str:
    """Mean ± std over seeds per (setting, method); accuracies in %, alignment loss and Î(A;Z) (nats) on test."""
    labels = config.get("labels", {})
    lines = ["| setting | method | test avg | test unbiased | test worst-group | alignment loss | Î(A;Z) | "
             "train s | experiment s | seeds | paper |",
             "|---|---|---|---|---|---|---|---:|---:|---:|---|"]
    for setting in settings:
        paper = config.get("paper", {}).get(setting, {})
        for method in ["erm", *methods]:
            group = [r for r in rows if r["setting"] == setting and r["method"] == method]
            if not group:
                continue
            cells = [mean_std([r[f"test_{k}"] for r in group], 100) for k in ACCURACY]
            cells += [mean_std([r[k] for r in group], digits=3) for k in ("alignment_loss", "mi_a")]
            for key in ("train_seconds", "experiment_seconds"):
                seconds = [r[key] for r in group if r[key] is not None]
                cells.append(f"{statistics.mean(seconds):.0f}" if seconds else "–")
            cells += [str(len(group)), paper.get(method, "")]
            lines.append(f"| {setting} | {labels.get(method, method)}{warning_flag(group)} | "
                         + " | ".join(cells) + " |")
    notes = [f"- {setting}: {config['paper'][setting]['reference']}" for setting in settings
             if setting in config.get("paper", {})]
    counts = []
    for setting in settings:
        conflicting = [r["n_conflicting"] for r in rows if r["setting"] == setting and r["method"] == "erm"
                       and r["n_conflicting"] is not None]
        n_train = [r["n_train"] for r in rows if r["setting"] == setting and r["n_train"]]
        if conflicting:
            low, high = min(conflicting), max(conflicting)
            counts.append(f"{setting}: {low if low == high else f'{low}–{high}'} of {n_train[0]}")
    return "\n".join(lines + ["", *warning_notes(rows),
                              "", "Bias-conflicting training images: " + "; ".join(counts) + ".",
                              "", "Papers' numbers (column *paper*):", *notes])


def read_rows(paths: list[str]) -> list[dict]:
    """Rows of earlier runs' CSV files (numbers parsed; empty cells are None); a (setting, seed, method) given
    twice keeps the later file's row (a rerun replaces the run before it), in the first one's place."""
    rows: dict[tuple, dict] = {}
    for path in paths:
        with open(path, newline="") as handle:
            for row in csv.DictReader(handle):
                parsed: dict[str, Any] = {}
                for key, value in row.items():
                    if value == "":
                        parsed[key] = None
                    elif key in ("setting", "method", "experiment", "warnings"):
                        parsed[key] = value
                    else:
                        parsed[key] = int(value) if key in ("seed", "n_train", "n_conflicting") else float(value)
                rows[parsed["setting"], parsed["seed"], parsed["method"]] = parsed
    return list(rows.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    data = parser.add_mutually_exclusive_group()
    data.add_argument("--npz", help="path to mnist10k.npz (x uint8 [N,28,28], y), read in place as data.path")
    data.add_argument("--raw", help="folder of the Fashion-MNIST idx files (.gz accepted), linked into the clone's "
                      "data/raw for data.source fashion_mnist (e.g. --config benchmarks/fullsize.yaml)")
    parser.add_argument("--config", default=str(HERE / "quality.yaml"))
    parser.add_argument("--profile", help="a profile of the config's `profiles` (e.g. cpu), merged over its base and "
                        "methods")
    add_queue_arguments(parser, seeds=[0, 1, 2])
    parser.add_argument("--upstream-only", action="store_true", help="run only each (setting, seed)'s upstream "
                        "(data, ERM, clusters): the ERM rows, e.g. a bias-free setting's plain-model ceiling")
    parser.add_argument("--from-csv", nargs="*", metavar="CSV",
                        help="only rebuild the Markdown from earlier runs' CSV files (e.g. halves run on two machines)")
    parser.add_argument("--out", default=str(HERE / "results" / "quality"))
    parser.add_argument("--sweep-file", metavar="YAML", help="only write the grid as a `debias sweep --file` (to run "
                        "it on a SLURM cluster: docs/cluster.md), then collect with --collect-only --workdir <repo>")
    parser.add_argument("--tracking-uri", help="--collect-only: the MLflow server the stages logged to (default: the "
                        "workdir's mlflow.db)")
    args = parser.parse_args(argv)

    config = yaml.safe_load(Path(args.config).read_text())
    if args.profile and args.profile not in config.get("profiles", {}):
        parser.error(f"--profile {args.profile}: not in {args.config}; allowed: {sorted(config.get('profiles', {}))}")
    config = apply_profile(config, args.profile)
    settings, methods, forced = checked_selection(parser, config, args)
    needs_data = not (args.from_csv or args.collect_only)
    if needs_data and not (args.npz or args.raw):
        parser.error("give --npz (mnist10k.npz) or --raw (Fashion-MNIST idx files)")
    if args.sweep_file and args.raw:
        parser.error("--sweep-file takes --npz (read in place by every task); --raw links files into one clone")
    if args.npz and not Path(args.npz).is_file():
        parser.error(f"--npz {args.npz}: no such file")
    if args.raw and (not Path(args.raw).is_dir() or missing_raw_files(Path(args.raw))):
        parser.error(f"--raw {args.raw}: not a folder holding {', '.join(RAW_FILES)} (.gz accepted)")
    base = merge(config["base"], {"data": {"path": str(Path(args.npz).resolve())}}) if args.npz else config["base"]
    jobs = plan(config, settings, args.seeds, methods, forced)
    if args.upstream_only:
        jobs = [job for job in jobs if job["method"] == UPSTREAM]
    command = "python -m benchmarks.quality " + " ".join(sys.argv[1:] if argv is None else argv)
    if args.sweep_file:
        written = write_sweep_file(Path(args.sweep_file), jobs, base, Path(args.sweep_file).stem)
        print(f"wrote {written} ({len(jobs)} experiments): debias sweep --file {written} --launcher slurm "
              "--dvc-remote PATH (docs/cluster.md)")
        return 0
    if args.from_csv:
        rows = read_rows(args.from_csv)
        settings = [s for s in settings if any(r["setting"] == s for r in rows)]
        write_results(Path(args.out), rows, markdown(rows, config, settings, methods), f"Command: `{command}`")
        return 0

    workdir = Path(args.workdir).resolve() if args.workdir else Path(tempfile.mkdtemp(prefix="debias-quality-"))
    started = time.time()
    if not args.collect_only:
        if open_workdir(parser, workdir, base) and args.raw:
            link_raw_files(workdir, Path(args.raw))
        deadline = started + 60 * args.max_minutes if args.max_minutes else float("inf")
        unfinished = run_queue(workdir, jobs, args.jobs, stage_env(args.threads, workdir), deadline)
    wall = time.time() - started
    unfinished = [] if args.collect_only else unfinished
    seconds, span, evaluated = stage_runs(workdir, args.tracking_uri)
    rows = add_warnings(rows_of(jobs, shown_experiments(workdir), seconds, evaluated),
                        stage_warnings(workdir, args.tracking_uri))
    if not rows:
        print("[quality] no results", file=sys.stderr)
        return 1
    import torch

    total_stage_s = sum(r["experiment_seconds"] or 0 for r in rows)
    commit = run(["git", "rev-parse", "--short", "HEAD~1"], cwd=workdir).strip()  # HEAD: the base params
    header = (f"Command: `{command}` (pipeline code at commit {commit})\n\nMachine: {os.cpu_count()} CPUs ({platform.processor() or platform.machine()}), "
              f"torch {torch.__version__}, {args.jobs} queue workers x {args.threads} thread(s). "
              + ("" if args.collect_only else f"Benchmark wall time: {wall / 60:.1f} min; ")
              + f"first stage run's start to last one's end: {span / 60:.1f} min; stage runs' wall time summed "
              f"over all experiments: {total_stage_s / 60:.1f} min; {len(rows)} result rows, {len(jobs)} experiments"
              + (f", {len(unfinished)} unfinished at the time limit." if unfinished else "."))
    text = markdown(rows, config, settings, methods)
    return finish(Path(args.out), rows, text, header, workdir, keep=bool(args.workdir) or args.collect_only)


if __name__ == "__main__":
    sys.exit(main())
