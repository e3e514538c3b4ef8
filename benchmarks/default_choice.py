"""Which stage-2 objective the default should be: candidates x seeds x colour palettes x both digit protocols, pooled.

Every cell (protocol, palette, seed) is a workspace (a clone of the committed tree) whose upstream stages run once
(``dvc repro infer_groups``: mnist10k's 10k real digits, 5,999 training images, the bias at 0.96, ERM, the default's
cluster groups); then every candidate trains stage 2 in that workspace with its ``benchmarks/stage2_epochs.py`` (the
stage's method, per-epoch validation and test, 30 epochs) and its per-epoch history is kept, so every selection rule
is replayed on the same training run (:func:`debias.training.selection.picks_by_rule`).

    python benchmarks/default_choice.py --npz PATH/mnist10k.npz --workdir SCRATCH --seeds 0 1 2 --jobs 2

The criterion is the **test unbiased accuracy** (the mean over the (class, colour) groups of the uniformly coloured
test split: every one of its 2,500 images counts) at the epoch the selection rule keeps, pooled over the cells and
compared by **paired** differences to the best candidate (same cell: same data, same ERM, same groups), with the
95 % t-interval of the mean difference. Test worst-group accuracy is shown beside it but does not rank: its worst
group holds 11-30 test images, so one seed moves it by tens of points.

Rows already in ``OUT.csv`` are kept (an interrupted run resumes); ``OUT.md`` is rewritten from the whole CSV.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import csv
import datetime as dt
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import scipy.stats
import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "src"))

from debias.core.trees import merge  # noqa: E402
from debias.training.selection import describe_selection, picks_by_rule  # noqa: E402

# The upstream recipe of benchmarks/quality.yaml (10k digits, ERM 5 epochs) with the default's cluster groups.
BASE: dict[str, Any] = {
    "data": {"source": "npz", "val_fraction": 0.15, "test_fraction": 0.25},
    "model": {"name": "lenet5"},
    "erm": {"optimizer": "sgd", "lr": 0.01, "momentum": 0.9, "weight_decay": 0.0005, "batch_size": 32, "epochs": 5,
            "selection": "last", "augment_shift": 2},
    "groups": {"method": "cluster"},
}
PROTOCOLS: dict[str, dict[str, Any]] = {
    "cmnist": {"bias": {"protocol": "foreground", "foreground": {"p_corr": 0.96}}},
    "bmnist": {"bias": {"protocol": "background", "background": {"rho": 0.96}}},
}
# paper: the papers' palettes (params.yaml's); other: colours no default was tuned on (CMNIST*: matplotlib hsv at
# 0.1, 0.3, ..., 0.9 instead of 0, 0.2, ..., 0.8; Biased-MNIST: matplotlib's tab10).
PALETTES: dict[str, dict[str, Any]] = {
    "paper": {},
    "other": {"bias": {
        "foreground": {"colours": [[255, 153, 0], [102, 255, 0], [0, 255, 255], [51, 0, 255], [255, 0, 153]]},
        "background": {"colours": [[31, 119, 180], [255, 127, 14], [44, 160, 44], [214, 39, 40], [148, 103, 189],
                                   [140, 86, 75], [227, 119, 194], [127, 127, 127], [188, 189, 34], [23, 190, 207]]}}},
}
# Stage 2 as params.yaml runs it (Adam 1e-3, wd 1e-5, batch 256, 30 epochs, no shift, tau 0.1, eps 0.5), only the
# objective changing; every candidate sets every loss key it depends on.
CANDIDATES: dict[str, dict[str, Any]] = {
    "released_a003_l05": {"loss.fairkl.variant": "released", "loss.alpha": 0.03, "loss.fairkl.weight": 0.5},
    "released_a1_l05": {"loss.fairkl.variant": "released", "loss.alpha": 1.0, "loss.fairkl.weight": 0.5},
    "kl_a1_l05": {"loss.fairkl.variant": "kl", "loss.alpha": 1.0, "loss.fairkl.weight": 0.5},
    "kl_a1_l075": {"loss.fairkl.variant": "kl", "loss.alpha": 1.0, "loss.fairkl.weight": 0.75},
    "eps_supinfonce": {"loss.fairkl.variant": "kl", "loss.alpha": 1.0, "loss.fairkl.weight": 0.0},
    "cnc": {"stage2.method": "cnc"},
}
STAGE2 = {"stage2.method": "eps_supinfonce", "stage2.epochs": 30, "stage2.selection": "best_worst_group",
          "loss.epsilon": 0.5, "loss.temperature": 0.1}
SIMPLICITY = ["eps_supinfonce", "kl_a1_l05", "kl_a1_l075", "released_a003_l05", "released_a1_l05", "cnc"]
RULES = ("best_worst_group", "best_unbiased", "last")
FIELDS = ["protocol", "palette", "seed", "candidate", "rule", "epoch", "degenerate", "val_worst", "val_unbiased",
          "test_avg", "test_unbiased", "test_worst", "test_worst_n", "seconds"]
FULL_COMMAND = "python benchmarks/default_choice.py --npz mnist10k.npz --workdir SCRATCH --seeds 0 1 2 --jobs 2"


def cell_params(protocol: str, palette: str, seed: int, npz: Path) -> dict[str, Any]:
    """The params.yaml overrides of one cell."""
    tree = merge(merge(merge(BASE, PROTOCOLS[protocol]), PALETTES[palette]), {"seed": seed})
    return merge(tree, {"data": {"path": str(npz)}})


def prepare(workdir: Path, protocol: str, palette: str, seed: int, npz: Path, threads: int) -> Path:
    """A clone with the cell's params and its upstream stages run (reused when its groups are there)."""
    path = workdir / f"{protocol}-{palette}-s{seed}"
    if (path / "data/groups").exists():
        return path
    if not path.exists():
        subprocess.run(["git", "clone", "-q", str(ROOT), str(path)], check=True)
    params_file = path / "params.yaml"
    params = merge(yaml.safe_load(params_file.read_text()), cell_params(protocol, palette, seed, npz))
    params_file.write_text(yaml.safe_dump(params, sort_keys=False, width=1000))
    env = {**os.environ, "DEBIAS_THREADS": str(threads), "DEBIAS_TRACKING": "off", "PYTHONPATH": str(path / "src")}
    log = (workdir / f"{path.name}.upstream.log").open("w")
    subprocess.run(["dvc", "repro", "infer_groups"], cwd=path, env=env, check=True, stdout=log, stderr=subprocess.STDOUT)
    return path


def train(path: Path, candidate: str, threads: int) -> tuple[list[dict[str, float]], float]:
    """Stage 2 of one candidate in a prepared cell: its per-epoch history and its wall time."""
    history_file = path / f"history-{candidate}.json"
    if history_file.exists():
        stored = json.loads(history_file.read_text())
        return stored["history"], stored["seconds"]
    sets = {**STAGE2, **CANDIDATES[candidate]}
    command = [sys.executable, str(path / "benchmarks/stage2_epochs.py"), str(path), "--threads", str(threads),
               "--history", str(history_file.with_suffix(".tmp"))]
    for key, value in sets.items():
        command += ["-S", f"{key}={value}"]
    started = dt.datetime.now()
    log = path / f"stage2-{candidate}.log"
    with log.open("w") as handle:
        subprocess.run(command, check=True, stdout=handle, stderr=subprocess.STDOUT,
                       env={**os.environ, "DEBIAS_THREADS": str(threads), "PYTHONPATH": str(path / "src")})
    seconds = (dt.datetime.now() - started).total_seconds()
    history = json.loads(history_file.with_suffix(".tmp").read_text())
    history_file.write_text(json.dumps({"history": history, "seconds": seconds}))
    return history, seconds


def rows_for(protocol: str, palette: str, seed: int, candidate: str, history: list[dict[str, float]],
             seconds: float) -> list[dict[str, Any]]:
    """One row per selection rule: the epoch it keeps on ``history`` and that epoch's numbers."""
    picks = picks_by_rule(history)
    rows = []
    for rule in RULES:
        epoch = picks[rule]
        kept = next(row for row in history if int(row["epoch"]) == epoch)
        block = describe_selection(history, epoch, rule)
        rows.append({"protocol": protocol, "palette": palette, "seed": seed, "candidate": candidate, "rule": rule,
                     "epoch": epoch, "degenerate": int(bool(block["degenerate"])),
                     "val_worst": round(kept["val/worst_group"], 4), "val_unbiased": round(kept["val/unbiased"], 4),
                     "test_avg": round(kept["test/avg"], 4), "test_unbiased": round(kept["test/unbiased"], 4),
                     "test_worst": round(kept["test/worst_group"], 4),
                     "test_worst_n": int(kept.get("test/worst_group_n", 0) or 0), "seconds": round(seconds, 1)})
    return rows


def interval(values: list[float]) -> tuple[float, float, float]:
    """Mean and the 95 % t-interval of the mean (points)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, math.nan, math.nan
    half = float(scipy.stats.t.ppf(0.975, len(values) - 1)) * statistics.stdev(values) / math.sqrt(len(values))
    return mean, mean - half, mean + half


def ranking(rows: list[dict[str, str]], rule: str, metric: str = "test_unbiased") -> list[dict[str, Any]]:
    """Candidates by their pooled mean of ``metric`` under ``rule``, each with the paired difference to the best (the
    cells both have) and its 95 % interval; ``inside``: the interval holds 0 (not distinguishable from the best)."""
    by: dict[str, dict[tuple[str, str, str], float]] = {}
    for row in rows:
        if row["rule"] == rule:
            by.setdefault(row["candidate"], {})[(row["protocol"], row["palette"], row["seed"])] = 100 * float(row[metric])
    means = {c: statistics.fmean(v.values()) for c, v in by.items()}
    order = sorted(means, key=lambda c: -means[c])
    if not order:
        return []
    best = order[0]
    out = []
    for candidate in order:
        cells = sorted(set(by[candidate]) & set(by[best]))
        diffs = [by[candidate][c] - by[best][c] for c in cells]
        mean, low, high = interval(diffs) if candidate != best else (0.0, math.nan, math.nan)
        out.append({"candidate": candidate, "cells": len(by[candidate]), "mean": means[candidate],
                    "ci": interval(list(by[candidate].values())), "diff": mean, "low": low, "high": high,
                    "inside": candidate == best or (low <= 0 <= high)})
    return out


def fmt_ci(ci: tuple[float, float, float]) -> str:
    """``mean [low, high]`` of an accuracy in points, the interval clipped to [0, 100]."""
    mean, low, high = ci
    return f"{mean:.1f}" if math.isnan(low) else f"{mean:.1f} [{max(low, 0.0):.1f}, {min(high, 100.0):.1f}]"


def paired(rows: list[dict[str, str]], rule: str, metric: str, a: str, b: str) -> tuple[float, float, float]:
    """Mean of ``a - b`` in points over the cells both candidates have under ``rule``, with its 95 % t-interval."""
    values: dict[str, dict[tuple[str, str, str], float]] = {a: {}, b: {}}
    for row in rows:
        if row["rule"] == rule and row["candidate"] in values:
            values[row["candidate"]][(row["protocol"], row["palette"], row["seed"])] = 100 * float(row[metric])
    cells = sorted(set(values[a]) & set(values[b]))
    return interval([values[a][c] - values[b][c] for c in cells])


def rule_paired(rows: list[dict[str, str]], candidate: str, metric: str) -> tuple[float, float, float]:
    """``metric`` under best_unbiased minus under best_worst_group for ``candidate`` (the same runs, two picks),
    in points over its cells, with the 95 % t-interval."""
    by: dict[str, dict[tuple[str, str, str], float]] = {"best_unbiased": {}, "best_worst_group": {}}
    for row in rows:
        if row["candidate"] == candidate and row["rule"] in by:
            by[row["rule"]][(row["protocol"], row["palette"], row["seed"])] = 100 * float(row[metric])
    cells = sorted(set(by["best_unbiased"]) & set(by["best_worst_group"]))
    return interval([by["best_unbiased"][c] - by["best_worst_group"][c] for c in cells])


def holds_zero_or_better(diff: tuple[float, float, float]) -> bool:
    mean, low, high = diff
    return mean >= 0 or (not math.isnan(low) and low <= 0 <= high)


def choice(rows: list[dict[str, str]], rule: str) -> str:
    """The winner on pooled test unbiased accuracy, or the simplest candidate (:data:`SIMPLICITY`) not shown worse
    than it: with every cell the winner has, and paired intervals holding 0 on test unbiased **and** test worst-group
    accuracy (paired over the cells, a worst-group loss can be shown though one cell's worst group cannot)."""
    ranked = ranking(rows, rule)
    best = ranked[0]
    inside = [r["candidate"] for r in ranked if r["cells"] >= best["cells"] and all(
        holds_zero_or_better(paired(rows, rule, metric, r["candidate"], best["candidate"]))
        for metric in ("test_unbiased", "test_worst"))]
    return min(inside, key=lambda c: SIMPLICITY.index(c))


def current_default(root: Path = ROOT) -> str | None:
    """The candidate whose settings params.yaml holds now (its objective: stage2.method and the loss keys the
    candidates set), None when it is none of them."""
    params = yaml.safe_load((root / "params.yaml").read_text())

    def value(key: str) -> Any:
        node: Any = params
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        return node

    method = value("stage2.method")
    for name, sets in CANDIDATES.items():
        wanted = {"stage2.method": STAGE2["stage2.method"], **sets}
        if wanted["stage2.method"] == method and (method == "cnc" or all(
                value(key) == wanted_value for key, wanted_value in sets.items())):
            return name
    return None


def cost_table(rows: list[dict[str, str]], candidates: list[str], reference: str) -> list[str]:
    """Stage 2's wall time per candidate (seconds: median and range over its cells) and, paired by cell, ``reference``'s
    time over the candidate's (median, range; a rough cost: two runs shared the 2 cores and the machine's load varied)."""
    seconds = {(r["protocol"], r["palette"], r["seed"], r["candidate"]): float(r["seconds"]) for r in rows}
    lines = ["## Stage-2 wall time (two runs at once on 2 cores, under a varying load: a rough cost)", "",
             f"| candidate | seconds, median | seconds, range | {reference}'s time over this one's, paired: median [range] |",
             "|---|---|---|---|"]
    for c in candidates:
        own = {k[:3]: v for k, v in seconds.items() if k[3] == c}
        ratios = [seconds[(*cell, reference)] / v for cell, v in own.items() if (*cell, reference) in seconds]
        lines.append(f"| {c} | {statistics.median(own.values()):.0f} | {min(own.values()):.0f}–{max(own.values()):.0f}"
                     f" | {statistics.median(ratios):.2f} [{min(ratios):.2f}, {max(ratios):.2f}] |")
    return lines + [""]


def table(rows: list[dict[str, str]], command: str) -> str:
    """The Markdown results: the ranking per rule (test unbiased and worst-group, pooled), the degenerate selections,
    and every cell."""
    cells = sorted({(r["protocol"], r["palette"], r["seed"]) for r in rows})
    lines = ["# Stage 2's default objective: candidates x seeds x palettes x protocols", "",
             f"- Command (SCRATCH: any empty folder; mnist10k.npz from the datasets folder): `{FULL_COMMAND}` (it "
             f"resumes from this CSV; this file was last written by `{command}`)",
             f"- Date: {dt.date.today().isoformat()}; {platform.machine()} CPU, 1 torch thread per run, 2 runs at once",
             f"- Cells: {len(cells)} (protocol x palette x seed): CMNIST* p_corr 0.96 and Biased-MNIST rho 0.96 on "
             "mnist10k (5,999 training images), each with the papers' palette and another; the default's cluster "
             "groups; ERM 5 epochs; stage 2 as params.yaml (30 epochs), only the objective changing.",
             "- Criterion: test unbiased accuracy (every test image counts) at the kept epoch, pooled over the cells; "
             "`paired Δ` is the mean difference to the best candidate over the same cells (points) with its 95 % "
             "t-interval. Worst-group ranks nothing (one cell's worst group holds 17-119 test images), but a "
             "candidate whose paired worst-group interval excludes 0 is shown worse and is not chosen.",
             f"- Simplicity order (the tie-break): {', '.join(SIMPLICITY)}.", ""]
    counts = {c: len({(r["protocol"], r["palette"], r["seed"]) for r in rows if r["candidate"] == c})
              for c in dict.fromkeys(r["candidate"] for r in rows)}
    partial = {c: n for c, n in counts.items() if n < len(cells)}
    if partial:
        lines[-1:-1] = [f"- Not every cell ran for: {', '.join(f'{c} ({n} of {len(cells)})' for c, n in partial.items())}."
                        " Its mean is over its own cells; every paired Δ is over the cells both candidates have."]
    for rule in RULES:
        ranked = ranking(rows, rule)
        if not ranked:
            continue
        worst = {r["candidate"]: r for r in ranking(rows, rule, "test_worst")}
        degenerate = {c: sum(int(r["degenerate"]) for r in rows if r["rule"] == rule and r["candidate"] == c)
                      for c in worst}
        best = ranked[0]["candidate"]
        # where the top candidate ran on fewer cells, the differences to the best with every cell are shown too, and
        # the differences to params.yaml's current default where it is another candidate
        full = next((r["candidate"] for r in ranked if r["cells"] == len(cells)), best)
        refs = list(dict.fromkeys(c for c in (best, full, current_default()) if c is not None))
        header = "".join(f" paired Δ to {ref} | paired Δ worst-group to {ref} |" for ref in refs)
        lines += [f"## Selection rule `{rule}`", "", "| candidate | cells | test unbiased (95 % CI) | test worst-group "
                  f"(95 % CI) |{header} degenerate selections |", "|---|---|---|---|" + "---|---|" * len(refs) + "---|"]
        for r in ranked:
            c = r["candidate"]
            deltas = ["best" if c == ref else "{:+.1f} [{:+.1f}, {:+.1f}]".format(*paired(rows, rule, m, c, ref))
                      for ref in refs for m in ("test_unbiased", "test_worst")]
            lines.append(f"| {c} | {r['cells']} | {fmt_ci(r['ci'])} | {fmt_ci(worst[c]['ci'])} | "
                         + " | ".join(deltas) + f" | {degenerate[c]} of {r['cells']} |")
        lines += ["", f"Chosen under `{rule}` (the winner, or the simplest candidate not shown worse on either "
                  f"number): **{choice(rows, rule)}**.", ""]
    candidates = [c for c in SIMPLICITY if any(r["candidate"] == c for r in rows)]
    lines += cost_table(rows, candidates, choice(rows, "best_unbiased"))
    lines += ["## Selection rules compared: best_unbiased against best_worst_group, the same runs", "",
              "| candidate | paired Δ test unbiased | paired Δ test worst-group | degenerate selections "
              "(best_worst_group → best_unbiased) |", "|---|---|---|---|"]
    for c in candidates:
        deltas = ["{:+.1f} [{:+.1f}, {:+.1f}]".format(*rule_paired(rows, c, m)) for m in ("test_unbiased", "test_worst")]
        counts = [sum(int(r["degenerate"]) for r in rows if r["rule"] == rule and r["candidate"] == c)
                  for rule in ("best_worst_group", "best_unbiased")]
        lines.append(f"| {c} | {deltas[0]} | {deltas[1]} | {counts[0]} → {counts[1]} |")
    totals = [sum(int(r["degenerate"]) for r in rows if r["rule"] == rule) for rule in ("best_worst_group", "best_unbiased")]
    runs = len({(r["protocol"], r["palette"], r["seed"], r["candidate"]) for r in rows})
    lines += ["", f"Degenerate selections in all {runs} runs: {totals[0]} under best_worst_group, {totals[1]} under "
              "best_unbiased.", ""]
    lines += ["## Every run (test unbiased / worst-group %, epoch kept; rule best_worst_group | best_unbiased)", "",
              "| cell | " + " | ".join(sorted({r["candidate"] for r in rows})) + " |",
              "|---|" + "---|" * len({r["candidate"] for r in rows})]
    for cell in cells:
        out = []
        for candidate in sorted({r["candidate"] for r in rows}):
            shown = []
            for rule in ("best_worst_group", "best_unbiased"):
                match = [r for r in rows if (r["protocol"], r["palette"], r["seed"]) == cell
                         and r["candidate"] == candidate and r["rule"] == rule]
                shown += [f"{100 * float(match[0]['test_unbiased']):.1f} / {100 * float(match[0]['test_worst']):.1f} "
                          f"({match[0]['epoch']})" if match else "–"]
            out.append(" \\| ".join(shown))
        lines.append(f"| {cell[0]} {cell[1]} s{cell[2]} | " + " | ".join(out) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--npz", type=Path, required=True, help="mnist10k.npz (x uint8 [N, 28, 28], y)")
    parser.add_argument("--workdir", type=Path, required=True, help="scratch folder for the per-cell workspaces")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--protocols", nargs="+", default=list(PROTOCOLS), choices=list(PROTOCOLS))
    parser.add_argument("--palettes", nargs="+", default=list(PALETTES), choices=list(PALETTES))
    parser.add_argument("--candidates", nargs="+", default=list(CANDIDATES), choices=list(CANDIDATES))
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run")
    parser.add_argument("--jobs", type=int, default=2, help="runs at once")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/default_choice")
    parser.add_argument("--collect-only", action="store_true", help="rewrite OUT.md from OUT.csv")
    args = parser.parse_args(argv)
    given = sys.argv[1:] if argv is None else argv
    shown = ["SCRATCH" if i and given[i - 1] == "--workdir" else "mnist10k.npz" if i and given[i - 1] == "--npz"
             else a for i, a in enumerate(given)]
    command = "python benchmarks/default_choice.py " + " ".join(map(shlex.quote, shown))
    csv_path, md_path = args.out.with_suffix(".csv"), args.out.with_suffix(".md")
    rows: list[dict[str, str]] = list(csv.DictReader(csv_path.open())) if csv_path.exists() else []
    if not args.collect_only:
        workdir, npz = args.workdir.resolve(), args.npz.resolve()
        workdir.mkdir(parents=True, exist_ok=True)
        done = {(r["protocol"], r["palette"], r["seed"], r["candidate"]) for r in rows}
        cells = [(p, c, s) for s in args.seeds for p in args.protocols for c in args.palettes]
        lock = threading.Lock()

        def run_one(task: tuple[tuple[str, str, int], str]) -> None:
            (protocol, palette, seed), candidate = task
            path = prepare(workdir, protocol, palette, seed, npz, args.threads)
            history, seconds = train(path, candidate, args.threads)
            new = rows_for(protocol, palette, seed, candidate, history, seconds)
            with lock:
                rows.extend({k: str(v) for k, v in row.items()} for row in new)
                with csv_path.open("w", newline="") as handle:
                    writer = csv.DictWriter(handle, FIELDS)
                    writer.writeheader()
                    writer.writerows(rows)
                kept = new[0]
                print(f"{protocol} {palette} s{seed} {candidate}: test unbiased {kept['test_unbiased']}, "
                      f"worst {kept['test_worst']} (epoch {kept['epoch']}), {seconds:.0f} s", flush=True)

        # candidate-major: every cell of one candidate before the next, so an interrupted run leaves whole rows
        tasks = [(cell, candidate) for candidate in args.candidates for cell in cells
                 if (cell[0], cell[1], str(cell[2]), candidate) not in done]
        with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
            needed = sorted({cell for cell, _ in tasks}, key=cells.index)  # a finished cell's upstream is not rerun
            for future in [pool.submit(prepare, workdir, *cell, npz, args.threads) for cell in needed]:
                future.result()  # the upstreams first, two at once
            for future in [pool.submit(run_one, task) for task in tasks]:
                future.result()
    md_path.write_text(table(rows, command))
    print(md_path.read_text())


if __name__ == "__main__":
    main()
