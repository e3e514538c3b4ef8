"""The WCL paper's Table 3 (Adult, COMPAS: accuracy and equalized-odds violation) through the pipeline itself.

For every setting (adult, compas) x seed x method of ``benchmarks/tabular.yaml`` this queues ``dvc exp run -S ...``
in a scratch clone and runs the queue with ``dvc queue start -j JOBS``, exactly as ``benchmarks/quality.py`` does
(its plan, queue and collection helpers are imported from it): per (setting, seed) the shared upstream (download ->
inject_bias -> train_erm -> infer_groups) first, then the methods, which reuse it from DVC's run-cache. The seed
draws the random 70/15/15 split (5 seeds: the paper's 5 repetitions). Rows: the ERM baseline (the upstream's ERM),
each stage-2 method (its selected model's test accuracy and fairness block, stage2_train.json) and the derived
Eq. Odds row (the ERM encoder's probe after equalized-odds post-processing, probe.json). Written as per-run CSV
and a Markdown table of mean +- sample std over seeds beside the paper's numbers.

The original files are read in place through ``data.path`` (``--data-dir``/<source>/: adult.data, adult.test;
compas-scores-two-years.csv), so the benchmark runs offline:

    python -m benchmarks.tabular --data-dir ../shared/datasets --settings compas --seeds 0 1 2 3 4 --jobs 2

``--workdir`` keeps the clone and resumes it; ``--collect-only`` rebuilds the tables from an existing workdir.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent

from benchmarks import dvc_queue, pages
from debias.core.trees import merge

FILES = {"adult": ("adult.data", "adult.test"), "compas": ("compas-scores-two-years.csv",)}
METRICS = ("avg", "worst_group")
FAIRNESS = ("equalized_odds_difference", "demographic_parity_difference")


def with_data_paths(config: dict, data_dir: Path) -> dict:
    """The config with each setting's ``data.path`` pointing at ``data_dir/<source>`` (checked to hold its files)."""
    config = merge(config, {})
    for setting, overrides in config["settings"].items():
        source = overrides["data"]["source"]
        folder = (data_dir / source).resolve()
        missing = [name for name in FILES[source] if not (folder / name).is_file()]
        if missing:
            raise FileNotFoundError(f"{folder} lacks {missing}: --data-dir must hold {source}/ with the original files")
        overrides["data"]["path"] = str(folder)
    return config


def result_of(metrics: dict, job: dict, derived: dict | None = None) -> dict:
    """A row's test results from the headline keys ``dvc exp show`` reports (:mod:`debias.core.headline`): the upstream's
    ERM (``erm_*``), a method's stage-2 model (``s2_*``), or a derived row's post-processed ERM probe
    (``probe_erm_eo_*``); ``{avg, worst_group, equalized_odds_difference, demographic_parity_difference}``."""
    if derived is not None:
        prefix = "probe_erm_eo"
    else:
        prefix = "erm" if job["method"] == dvc_queue.UPSTREAM else "s2"
    found = {"avg": metrics.get(f"{prefix}_avg"), "worst_group": metrics.get(f"{prefix}_worst"),
             "equalized_odds_difference": metrics.get(f"{prefix}_eod"),
             "demographic_parity_difference": metrics.get(f"{prefix}_dpd")}
    return {} if found["avg"] is None else found


def rows_of(jobs: list[dict], shown: dict[str, dict], seconds: dict[str, dict[str, float]], config: dict,
            warnings: dict[str, dict[str, list[str]]] | None = None) -> list[dict]:
    """One row per (setting, seed, method) with a result: accuracies, EOd, DP difference, training seconds, and the
    warning codes (``;``-joined) of the stage that produced its numbers (``warnings``: :func:`dvc_queue.stage_warnings`)."""
    warnings = warnings or {}
    rows = []
    by_name = {job["name"]: job for job in jobs}
    for job in jobs:
        got = shown.get(job["name"])
        entries = []
        if job["method"] == dvc_queue.UPSTREAM:
            entries.append(("erm", got, None, "train_erm"))
        else:
            entries.append((job["method"], got, None, "train_contrastive"))
        for label, spec in (config.get("derived") or {}).items():
            if spec["experiment"] == job["method"]:
                entries.append((label, got, spec, "linear_probe"))
        for method, found, derived, stage in entries:
            test = result_of(found["metrics"], job, derived) if found else {}
            if not test:
                continue  # queued, failed or stopped at the time limit
            val_avg = None if derived else found["metrics"].get("s2_val_avg")
            rows.append({"setting": job["setting"], "seed": job["seed"], "method": method,
                         **{f"test_{k}": test.get(k) for k in METRICS},
                         **{f"test_{k}": test.get(k) for k in FAIRNESS},
                         "val_avg": val_avg,
                         "train_seconds": seconds.get(job["name"], {}).get(stage),
                         "experiment_seconds": sum(seconds.get(job["name"], {}).values()) or None,
                         "experiment": job["name"], "chosen": None,
                         "warnings": ";".join(warnings.get(job["name"], {}).get(stage, []))})
    assert all(row["experiment"] in by_name for row in rows)
    return rows + grid_rows(rows, config)


def grid_rows(rows: list[dict], config: dict) -> list[dict]:
    """Per (setting, seed) and grid of ``config['grids']``: a copy of the candidate row with the best validation
    accuracy (ties: the earlier candidate), named after the grid, with the chosen experiment's method in ``chosen``."""
    chosen = []
    for grid, candidates in (config.get("grids") or {}).items():
        for key in sorted({(r["setting"], r["seed"]) for r in rows}):
            found = [r for c in candidates for r in rows if (r["setting"], r["seed"]) == key and r["method"] == c
                     and r["val_avg"] is not None]
            if found:
                best = max(found, key=lambda r: (r["val_avg"], -candidates.index(r["method"])))
                chosen.append({**best, "method": grid, "chosen": best["method"]})
    return chosen


def markdown(rows: list[dict], config: dict, settings: list[str], methods: list[str]) -> str:
    """Mean ± sample std over seeds per (setting, method): accuracy and worst-group in %, EOd and DP difference."""
    labels = config.get("labels", {})
    order = ["erm", *(config.get("derived") or {}), *(config.get("grids") or {}), *methods]
    lines = ["| setting | method | test accuracy % | EOd | DP difference | test worst-group % | train s | seeds | "
             "paper: accuracy % / EOd |", "|---|---|---|---|---|---|---:|---:|---|"]
    for setting in settings:
        paper = config.get("paper", {}).get(setting, {})
        for method in order:
            group = [r for r in rows if r["setting"] == setting and r["method"] == method]
            if not group:
                continue
            seconds = [r["train_seconds"] for r in group if r["train_seconds"] is not None]
            cells = [pages.mean_std([r["test_avg"] for r in group], 100),
                     pages.mean_std([r["test_equalized_odds_difference"] for r in group], digits=3),
                     pages.mean_std([r["test_demographic_parity_difference"] for r in group], digits=3),
                     pages.mean_std([r["test_worst_group"] for r in group], 100),
                     f"{sum(seconds) / len(seconds):.0f}" if seconds else "–", str(len(group)), paper.get(method, "")]
            picks = sorted({r["chosen"] for r in group if r.get("chosen")})
            note = (" — chosen: " + ", ".join(f"{labels.get(c, c)} ×{sum(r['chosen'] == c for r in group)}" for c in picks)
                    if picks else "")
            lines.append(f"| {setting} | {labels.get(method, method)}{note}{pages.warning_flag(group)} | "
                         + " | ".join(cells) + " |")
    return "\n".join(lines + ["", *pages.warning_notes(rows), "", "Paper: WCL paper (difficulty-based sampling "
                              "for debiased contrastive learning), "
                              "Table 3, 5 random 70/15/15 splits, MLP; EOd = equalized-odds violation (lower is better)."])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", required=True, help="folder holding adult/ and compas/ with the original files")
    parser.add_argument("--config", default=str(HERE / "tabular.yaml"))
    dvc_queue.add_queue_arguments(parser, seeds=[0, 1, 2, 3, 4])
    parser.add_argument("--out", default=str(HERE / "results" / "tabular"))
    args = parser.parse_args(argv)

    config = yaml.safe_load(Path(args.config).read_text())
    settings, methods, forced = dvc_queue.checked_selection(parser, config, args)
    try:
        config = with_data_paths(config, Path(args.data_dir))
    except FileNotFoundError as exc:
        parser.error(str(exc))
    jobs = dvc_queue.plan(config, settings, args.seeds, methods, forced)
    command = "python -m benchmarks.tabular " + " ".join(sys.argv[1:] if argv is None else argv)

    workdir = Path(args.workdir).resolve() if args.workdir else Path(tempfile.mkdtemp(prefix="debias-tabular-"))
    started = time.time()
    unfinished: list[str] = []
    if not args.collect_only:
        dvc_queue.open_workdir(parser, workdir, config["base"])
        deadline = started + 60 * args.max_minutes if args.max_minutes else float("inf")
        unfinished = dvc_queue.run_queue(workdir, jobs, args.jobs, dvc_queue.stage_env(args.threads, workdir), deadline)
    wall = time.time() - started
    seconds, span, _ = dvc_queue.stage_runs(workdir)
    rows = rows_of(jobs, dvc_queue.shown_experiments(workdir), seconds, config, dvc_queue.stage_warnings(workdir))
    if not rows:
        print("[tabular] no results", file=sys.stderr)
        return 1
    import torch

    commit = dvc_queue.run(["git", "rev-parse", "--short", "HEAD~1"], cwd=workdir).strip()  # HEAD: the base params
    header = (f"Command: `{command}` (pipeline code at commit {commit})\n\nMachine: {os.cpu_count()} CPUs "
              f"({platform.processor() or platform.machine()}), torch {torch.__version__}, {args.jobs} queue workers x "
              f"{args.threads} thread(s). " + ("" if args.collect_only else f"Benchmark wall time: {wall / 60:.1f} min; ")
              + f"first stage run's start to last one's end: {span / 60:.1f} min; {len(rows)} result rows, "
              f"{len(jobs)} experiments" + (f", {len(unfinished)} unfinished." if unfinished else "."))
    text = markdown(rows, config, settings, methods)
    return dvc_queue.finish(Path(args.out), rows, text, header, workdir, keep=bool(args.workdir) or args.collect_only)


if __name__ == "__main__":
    sys.exit(main())
