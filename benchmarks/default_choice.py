"""Which stage-2 objective the default should be: candidates x seeds x colour palettes x both digit protocols, pooled.

Every cell (protocol, palette, seed) is a workspace (a clone of the committed tree) whose upstream stages run once
(``dvc repro infer_groups``: mnist10k's 10k real digits, 5,999 training images, the bias at 0.96, ERM, the default's
cluster groups); then every candidate trains stage 2 in that workspace with its ``benchmarks/stage2_epochs.py`` (the
stage's method, per-epoch validation and test, 30 epochs) and its per-epoch history is kept, so every selection rule
is replayed on the same training run (:func:`debias.training.selection.picks_by_rule`).

    python -m benchmarks.default_choice --npz PATH/mnist10k.npz --workdir SCRATCH --seeds 0 1 2 --jobs 2

The criterion is the **test unbiased accuracy** (the mean over the (class, colour) groups of the uniformly coloured
test split: every one of its 2,501 images counts) at the epoch the selection rule keeps, pooled over the cells and
compared by **paired** differences to the best candidate (same cell: same data, same ERM, same groups), with the
95 % t-interval of the mean difference. Test worst-group accuracy is shown beside it but does not rank: one cell's
worst group holds 17-115 test images, so one seed moves it by tens of points.

Every run is keyed by the data file's SHA-256, the code and params.yaml of the commit the cells were cloned from and
its own params (benchmarks/cells.py): rows of ``OUT.csv`` with that key are kept (an interrupted run resumes), rows of
other inputs never count as done. ``OUT.md`` is rewritten from the CSV with the threads and jobs the runs used;
``--collect-only`` only does that (a CSV of this script's earlier layout, without keys, is rendered as it is).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime as dt
import math
import statistics
import sys
import threading
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

from benchmarks import cells
from benchmarks.cells import BenchmarkError, Cell


# Stage 2 as the runs of this table made it (Adam 1e-3, wd 1e-5, batch 256, 30 epochs, no shift, tau 0.1, eps 0.5),
# only the objective changing. Every setting a candidate's loss or schedule reads is pinned here, so a candidate means
# the same whatever params.yaml's defaults become.
STAGE2: dict[str, Any] = {
    "stage2.method": "eps_supinfonce", "stage2.optimizer": "adam", "stage2.lr": 0.001, "stage2.weight_decay": 0.00001,
    "stage2.batch_size": 256, "stage2.epochs": 30, "stage2.lr_milestones": [], "stage2.augment_shift": 0,
    "stage2.selection": "best_worst_group", "loss.epsilon": 0.5, "loss.temperature": 0.1,
    "loss.fairkl.sampler": "shuffle",
}
CANDIDATES: dict[str, dict[str, Any]] = {
    "released_a003_l05": {"loss.fairkl.variant": "released", "loss.alpha": 0.03, "loss.fairkl.weight": 0.5},
    "released_a1_l05": {"loss.fairkl.variant": "released", "loss.alpha": 1.0, "loss.fairkl.weight": 0.5},
    "kl_a1_l05": {"loss.fairkl.variant": "kl", "loss.alpha": 1.0, "loss.fairkl.weight": 0.5},
    "kl_a1_l075": {"loss.fairkl.variant": "kl", "loss.alpha": 1.0, "loss.fairkl.weight": 0.75},
    "eps_supinfonce": {"loss.fairkl.variant": "kl", "loss.alpha": 1.0, "loss.fairkl.weight": 0.0},
    # CNC as the table's runs trained it: 30 epochs of a tenth of the anchors, pools of 32 drawn with replacement when
    # short, no margin (CNC read no epsilon then: pinned to 0, not STAGE2's 0.5)
    "cnc": {"stage2.method": "cnc", "loss.epsilon": 0.0, "stage2.cnc.num_positives": 32,
            "stage2.cnc.num_negatives": 32, "stage2.cnc.two_sided": True, "stage2.cnc.temperature": 0.05,
            "stage2.cnc.anchor_fraction": 0.1, "stage2.cnc.accumulation": 1, "stage2.cnc.contrastive_weight": 0.75,
            "stage2.cnc.init": "scratch", "stage2.cnc.skip_empty_classes": True, "stage2.cnc.short_pools": "replace",
            "stage2.cnc.encoder_mode": "train", "stage2.cnc.head_gradient": "step"},
}
REFERENCE = "released_a003_l05"  # the released FairKL objective: every table shows the differences to it
SIMPLICITY = ["eps_supinfonce", "kl_a1_l05", "kl_a1_l075", "released_a003_l05", "released_a1_l05", "cnc"]
RULES = ("best_worst_group", "best_unbiased", "last")
FIELDS = ["protocol", "palette", "seed", "candidate", "rule", "epoch", "degenerate", "val_worst", "val_unbiased",
          "test_avg", "test_unbiased", "test_worst", "test_worst_n", "cpu_seconds", "wall_seconds", *cells.MADE_WITH,
          "date", "key"]
# Earlier layouts of this script's results (rendered by --collect-only, never resumed from): before runs were keyed,
# and before rows recorded what they were made with
LEGACY_FIELDS = [[*FIELDS[:13], "seconds"], [*FIELDS[:15], "date", "key"]]
FULL_COMMAND = "python -m benchmarks.default_choice --npz mnist10k.npz --workdir SCRATCH --seeds 0 1 2 --jobs 2"


def run_cells(seeds: list[int], protocols: list[str], palettes: list[str]) -> list[Cell]:
    return [Cell("mnist10k", p, c, s) for s in seeds for p in protocols for c in palettes]


def candidate_sets(candidate: str) -> dict[str, Any]:
    """The stage-2 params of ``candidate`` (dotted keys), on the cluster groups (the objective is the only change)."""
    return {**STAGE2, **CANDIDATES[candidate]}


def rows_for(cell: Cell, candidate: str, result: cells.RunResult, made: dict[str, str]) -> list[dict[str, Any]]:
    """One row per selection rule (:func:`cells.kept_numbers`), with what the run was made with (``made``: threads,
    jobs, rev, data_sha)."""
    return [{"protocol": cell.protocol, "palette": cell.palette, "seed": cell.seed, "candidate": candidate,
             **cells.kept_numbers(result, rule), **made, "date": result.date, "key": result.key} for rule in RULES]
interval = cells.interval


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


def choice(rows: list[dict[str, str]], rule: str) -> str | None:
    """The winner on pooled test unbiased accuracy, or the simplest candidate (:data:`SIMPLICITY`) not shown worse
    than it: with every cell the winner has, and paired intervals holding 0 on test unbiased **and** test worst-group
    accuracy (paired over the cells, a worst-group loss can be shown though one cell's worst group cannot); None
    without rows."""
    ranked = ranking(rows, rule)
    if not ranked:
        return None
    best = ranked[0]
    inside = [r["candidate"] for r in ranked if r["cells"] >= best["cells"] and all(
        holds_zero_or_better(paired(rows, rule, metric, r["candidate"], best["candidate"]))
        for metric in ("test_unbiased", "test_worst"))]
    return min(inside, key=lambda c: SIMPLICITY.index(c))


def cost_table(rows: list[dict[str, str]], candidates: list[str], reference: str) -> list[str]:
    """Stage 2's CPU time per candidate (seconds of its process, user + system: the work, whatever else ran; median
    and range over its cells) and, paired by cell, ``reference``'s time over the candidate's (median, range). Rows of
    the earlier layout carry wall seconds only (two runs sharing 2 cores under a varying load): said so."""
    cpu = "cpu_seconds" in rows[0]
    seconds = {(r["protocol"], r["palette"], r["seed"], r["candidate"]): float(r["cpu_seconds" if cpu else "seconds"])
               for r in rows}
    what = "CPU seconds of its process (1 torch thread)" if cpu else "wall seconds (two runs at once, a varying load)"
    lines = [f"## Stage-2 cost: {what}", "",
             f"| candidate | seconds, median | seconds, range | {reference}'s time over this one's, paired: median [range] |",
             "|---|---|---|---|"]
    for c in candidates:
        own = {k[:3]: v for k, v in seconds.items() if k[3] == c}
        if not own:
            continue
        ratios = [seconds[(*cell, reference)] / v for cell, v in own.items() if (*cell, reference) in seconds and v]
        shown = f"{statistics.median(ratios):.2f} [{min(ratios):.2f}, {max(ratios):.2f}]" if ratios else "–"
        lines.append(f"| {c} | {statistics.median(own.values()):.0f} | {min(own.values()):.0f}–{max(own.values()):.0f}"
                     f" | {shown} |")
    return lines + [""]


def run_dates(rows: list[dict[str, str]]) -> str:
    """The dates the rows' runs were made (first to last), or that the rows predate dated results."""
    dates = sorted({r["date"] for r in rows if r.get("date")})
    if not dates:
        return "made before results were dated (git log of this file dates them)"
    return dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}"


def worst_images(rows: list[dict[str, str]]) -> str:
    """The range of the kept epochs' worst-group test image counts over the rows ('–' when none is recorded)."""
    counts = sorted({int(r["test_worst_n"]) for r in rows if r.get("test_worst_n", "0") not in ("", "0")})
    return f"{counts[0]}-{counts[-1]}" if counts else "–"


def table(rows: list[dict[str, str]], command: str) -> str:
    """The Markdown results: the ranking per rule (test unbiased and worst-group, pooled), the degenerate selections,
    and every cell."""
    cell_keys = sorted({(r["protocol"], r["palette"], r["seed"]) for r in rows})
    lines = ["# Stage 2's default objective: candidates x seeds x palettes x protocols", "",
             f"- Command (SCRATCH: any empty folder; mnist10k.npz from the datasets folder): `{FULL_COMMAND}` (it "
             f"resumes from this CSV; this file was last written by `{command}`)",
             f"- Runs: {run_dates(rows)}; written {dt.date.today().isoformat()}; rows made with: {cells.made_with(rows)}",
             f"- Cells: {len(cell_keys)} (protocol x palette x seed): CMNIST* p_corr 0.96 and Biased-MNIST rho 0.96 on "
             "mnist10k (5,999 training images), each with the papers' palette and another; the default's cluster "
             "groups; ERM 5 epochs; stage 2 as params.yaml (30 epochs), only the objective changing.",
             "- Criterion: test unbiased accuracy (every test image counts) at the kept epoch, pooled over the cells; "
             "`paired Δ` is the mean difference to the best candidate over the same cells (points) with its 95 % "
             f"t-interval. Worst-group ranks nothing (one cell's worst group holds {worst_images(rows)} test images), but a "
             "candidate whose paired worst-group interval excludes 0 is shown worse and is not chosen.",
             f"- Simplicity order (the tie-break): {', '.join(SIMPLICITY)}.", ""]
    counts = {c: len({(r["protocol"], r["palette"], r["seed"]) for r in rows if r["candidate"] == c})
              for c in dict.fromkeys(r["candidate"] for r in rows)}
    partial = {c: n for c, n in counts.items() if n < len(cell_keys)}
    if partial:
        lines[-1:-1] = [f"- Not every cell ran for: {', '.join(f'{c} ({n} of {len(cell_keys)})' for c, n in partial.items())}."
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
        # the differences to the released FairKL objective (the reference of the supcon family)
        full = next((r["candidate"] for r in ranked if r["cells"] == len(cell_keys)), best)
        refs = list(dict.fromkeys(c for c in (best, full, REFERENCE) if any(r["candidate"] == c for r in ranked)))
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
    reference = choice(rows, "best_unbiased")
    if reference is not None:
        lines += cost_table(rows, candidates, reference)
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
    for cell in cell_keys:
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--npz", type=Path, help="mnist10k.npz (x uint8 [N, 28, 28], y)")
    cells.add_cell_arguments(parser)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--protocols", nargs="+", default=list(cells.PROTOCOLS), choices=list(cells.PROTOCOLS))
    parser.add_argument("--palettes", nargs="+", default=list(cells.PALETTES), choices=list(cells.PALETTES))
    parser.add_argument("--candidates", nargs="+", default=list(CANDIDATES), choices=list(CANDIDATES))
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/default_choice")
    parser.add_argument("--collect-only", action="store_true", help="rewrite OUT.md from OUT.csv")
    args = parser.parse_args(argv)
    command = cells.shown_command("default_choice", sys.argv[1:] if argv is None else argv)
    csv_path, md_path = args.out.with_suffix(".csv"), args.out.with_suffix(".md")
    try:
        if args.collect_only:
            rows = cells.read_results(csv_path, FIELDS, "--collect-only", legacy=LEGACY_FIELDS)
            cells.write_text(md_path, table(rows, command))
        else:
            if args.workdir is None:
                raise BenchmarkError("--workdir is required (a scratch folder for the cells' workspaces)")
            chosen = run_cells(args.seeds, args.protocols, args.palettes)
            cells.check_inputs(args.npz, chosen, args.jobs, args.threads)
            rev = cells.git("rev-parse", args.rev)
            rows = run(args, chosen, rev, csv_path)
            cells.write_text(md_path, table(rows, command))
    except BenchmarkError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(md_path.read_text())
    return 0


def run(args: argparse.Namespace, chosen: list[Cell], rev: str, csv_path: Path) -> list[dict[str, str]]:
    """Every (cell, candidate) run not already in the CSV under its key; the rows of this run's inputs."""
    npz = args.npz.resolve()
    data_key = cells.file_sha256(npz)
    workdir = args.workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)

    made = {"threads": str(args.threads), "jobs": str(args.jobs), "rev": rev[:12], "data_sha": data_key[:16]}

    def expected_key(cell: Cell, candidate: str) -> str:
        ws = cells.Workspace(cell, workdir / cell.name, cells.workspace_key(cell, npz, rev, args.threads, data_key))
        return cells.run_key(ws, "cluster", candidate_sets(candidate))

    keys = {(cell, c): expected_key(cell, c) for cell in chosen for c in args.candidates}
    stored = cells.read_rows(csv_path, FIELDS, legacy=LEGACY_FIELDS)
    rows = [r for r in stored if r.get("key") in set(keys.values())]
    if len(rows) < len(stored):  # an earlier layout's, or another data file's, code's or params' rows
        print(f"note: {len(stored) - len(rows)} row(s) of {csv_path} are of other inputs: replaced by this run's",
              file=sys.stderr)
    done = {r["key"] for r in rows}
    lock = threading.Lock()
    workspaces: dict[Cell, cells.Workspace] = {}

    def workspace(cell: Cell) -> cells.Workspace:
        with lock:
            if cell in workspaces:
                return workspaces[cell]
        made = cells.prepare(workdir, cell, npz, rev, args.threads, data_key)
        with lock:
            workspaces[cell] = made
        return made

    def run_one(cell: Cell, candidate: str) -> None:
        result = cells.train(workspace(cell), candidate, candidate_sets(candidate), "cluster", args.threads)
        new = rows_for(cell, candidate, result, made)
        with lock:
            rows.extend({k: str(v) for k, v in row.items()} for row in new)
            cells.write_rows(csv_path, FIELDS, rows)
            kept = new[0]
            print(f"{cell.name} {candidate}: test unbiased {kept['test_unbiased']}, worst {kept['test_worst']} "
                  f"(epoch {kept['epoch']}), {result.cpu_seconds:.0f} CPU s", flush=True)

    # candidate-major: every cell of one candidate before the next, so an interrupted run leaves whole rows
    tasks = [(cell, c) for c in args.candidates for cell in chosen if keys[(cell, c)] not in done]
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        try:
            for future in [pool.submit(workspace, cell) for cell in sorted({cell for cell, _ in tasks})]:
                future.result()  # the upstreams first
            for future in [pool.submit(run_one, cell, c) for cell, c in tasks]:
                future.result()
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    return rows


if __name__ == "__main__":
    sys.exit(main())
