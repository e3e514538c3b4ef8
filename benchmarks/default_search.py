"""The default stage 2, chosen on every axis that moves its numbers: validation cells pick, held-out cells report.

Axes (CNC, the default method): the group source (clusters of the ERM features, ERM predictions), the schedule
(:data:`SCHEDULES`: the shipped one, the cnc-cmnist preset's, and schedules cut to about twice FairKL's stage-2
cost), short pools (``replace``, ``shrink``) and the ε margin of CNC's loss (:data:`EPSILONS`). The three cut
schedules run the whole factorial; the two full-cost schedules run at ε 0 with ``replace`` on both group sources
(they are over the cost budget, so they are measured, not chosen). The released FairKL objective on the same clusters
is the reference row.

1. **Selection** (:data:`SELECT_CELLS`: mnist10k CMNIST* 0.96 and Biased-MNIST 0.96 with the papers' palettes,
   seeds 0 and 1, and the bundled digits at seeds 0 and 1): every candidate trains; candidates are ranked by
   **validation** unbiased accuracy at the epoch ``best_unbiased`` keeps, pooled over the cells, paired by cell.
   Eligible: stage 2's CPU time at most :data:`COST_BUDGET` times FairKL's (paired median over the cells).
2. **Held-out** (:data:`HELDOUT_CELLS`: seeds 3, 4, 5 of both protocols with both palettes, and of the digits):
   the finalists (:func:`finalists`), the shipped default and FairKL train; the report is **test** unbiased and
   worst-group accuracy with 95 % intervals of the seed-paired differences. The default is the held-out winner or
   the simplest eligible finalist whose paired intervals hold 0 on both numbers.

    python benchmarks/default_search.py --npz PATH/mnist10k.npz --workdir SCRATCH --jobs 2

Every run is keyed by the data file's SHA-256, the code and params.yaml at the commit the cells were cloned from,
and the run's params; rows of ``OUT.csv`` with another key are not reused (they are reported as stale). ``OUT.md`` is
rewritten from the CSV; ``--collect-only`` only does that. ``--phase select`` stops after the selection.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime as dt
import json
import math
import platform
import shlex
import statistics
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import cells  # noqa: E402
from cells import BenchmarkError, Cell, digits_cell  # noqa: E402

from debias.training.selection import describe_selection, picks_by_rule  # noqa: E402

# CNC's own settings (CNC App. D.2.4; params.yaml's), the same in every candidate.
CNC_COMMON: dict[str, Any] = {
    "stage2.method": "cnc", "stage2.selection": "best_unbiased", "stage2.lr_milestones": [],
    "stage2.cnc.temperature": 0.05, "stage2.cnc.contrastive_weight": 0.75, "stage2.cnc.two_sided": True,
    "stage2.cnc.init": "scratch", "stage2.cnc.skip_empty_classes": True, "stage2.cnc.forward_chunk": 8,
}
# Schedules: optimiser, epochs, the share of anchors per epoch, pool sizes, shift; contrastive batches per run on 5,999
# training images (~5.4k anchors) in the comment.
SCHEDULES: dict[str, dict[str, Any]] = {
    # params.yaml's before this search: 30 x 0.1 of the anchors (~16k batches of 128 images), validated 30 times
    "shipped": {"stage2.optimizer": "adam", "stage2.lr": 0.001, "stage2.weight_decay": 0.00001, "stage2.epochs": 30,
                "stage2.augment_shift": 0, "stage2.cnc.anchor_fraction": 0.1, "stage2.cnc.accumulation": 1,
                "stage2.cnc.num_positives": 32, "stage2.cnc.num_negatives": 32, "stage2.cnc.head_gradient": "step",
                "stage2.cnc.encoder_mode": "train"},
    # the cnc-cmnist preset (CNC App. D.2.4 + the released code): SGD, 3 epochs of every anchor, 32 batches a step
    "paper": {"stage2.optimizer": "sgd", "stage2.lr": 0.001, "stage2.momentum": 0.9, "stage2.weight_decay": 0.0001,
              "stage2.epochs": 3, "stage2.augment_shift": 2, "stage2.cnc.anchor_fraction": 1.0,
              "stage2.cnc.accumulation": 32, "stage2.cnc.num_positives": 32, "stage2.cnc.num_negatives": 32,
              "stage2.cnc.head_gradient": "epoch_sum", "stage2.cnc.encoder_mode": "eval"},
    # benchmarks/quality.yaml's CNC: Adam, 3 epochs of a quarter of the anchors (~4k batches), 2 px shift
    "q3": {"stage2.optimizer": "adam", "stage2.lr": 0.001, "stage2.weight_decay": 0.0001, "stage2.epochs": 3,
           "stage2.augment_shift": 2, "stage2.cnc.anchor_fraction": 0.25, "stage2.cnc.accumulation": 1,
           "stage2.cnc.num_positives": 32, "stage2.cnc.num_negatives": 32, "stage2.cnc.head_gradient": "step",
           "stage2.cnc.encoder_mode": "train"},
    # q3 with pools of 16 (M = N = 16, batches of 64 images) over half the anchors: the same images per run
    "q3m16": {"stage2.optimizer": "adam", "stage2.lr": 0.001, "stage2.weight_decay": 0.0001, "stage2.epochs": 3,
              "stage2.augment_shift": 2, "stage2.cnc.anchor_fraction": 0.5, "stage2.cnc.accumulation": 1,
              "stage2.cnc.num_positives": 16, "stage2.cnc.num_negatives": 16, "stage2.cnc.head_gradient": "step",
              "stage2.cnc.encoder_mode": "train"},
    # the shipped schedule cut to a quarter of its batches (30 x 0.025 of the anchors, ~4k), still validated 30 times
    "s30": {"stage2.optimizer": "adam", "stage2.lr": 0.001, "stage2.weight_decay": 0.00001, "stage2.epochs": 30,
            "stage2.augment_shift": 0, "stage2.cnc.anchor_fraction": 0.025, "stage2.cnc.accumulation": 1,
            "stage2.cnc.num_positives": 32, "stage2.cnc.num_negatives": 32, "stage2.cnc.head_gradient": "step",
            "stage2.cnc.encoder_mode": "train"},
}
FULL_COST = ("shipped", "paper")  # measured at eps 0 / replace only
EPSILONS = (0.0, 0.25, 1.0)
POOLS = ("replace", "shrink")
SHIPPED = "cnc-shipped-cluster-replace-e0"  # the default before this search
# The released FairKL objective (FairKL Table 6 at rho 0.99: alpha 0.03, lambda 0.5, eps 0.5; tau 0.1) as
# benchmarks/results/default_choice.md ran it, on the same clusters.
FAIRKL = "fairkl-released"
FAIRKL_SETS: dict[str, Any] = {
    "stage2.method": "eps_supinfonce", "stage2.selection": "best_unbiased", "stage2.optimizer": "adam",
    "stage2.lr": 0.001, "stage2.weight_decay": 0.00001, "stage2.batch_size": 256, "stage2.epochs": 30,
    "stage2.lr_milestones": [], "stage2.augment_shift": 0, "loss.temperature": 0.1, "loss.epsilon": 0.5,
    "loss.alpha": 0.03, "loss.fairkl.variant": "released", "loss.fairkl.weight": 0.5, "loss.fairkl.sampler": "shuffle",
}
COST_BUDGET = 2.0  # stage-2 CPU time over FairKL's, paired median over the cells
SELECT_CELLS = ([Cell("mnist10k", p, "paper", s) for s in (0, 1) for p in cells.PROTOCOLS]
                + [digits_cell(s) for s in (0, 1)])
HELDOUT_CELLS = ([Cell("mnist10k", p, c, s) for s in (3, 4, 5) for p in cells.PROTOCOLS for c in cells.PALETTES]
                 + [digits_cell(s) for s in (3, 4, 5)])
RULES = ("best_unbiased", "best_worst_group", "last")
RANKED_RULE = "best_unbiased"
FIELDS = ["phase", "data", "protocol", "palette", "seed", "candidate", "rule", "epoch", "degenerate", "val_unbiased",
          "val_worst", "test_avg", "test_unbiased", "test_worst", "test_worst_n", "cpu_seconds", "wall_seconds", "key"]
FULL_COMMAND = "python benchmarks/default_search.py --npz mnist10k.npz --workdir SCRATCH --jobs 2"


@dataclass(frozen=True)
class Candidate:
    name: str
    sets: dict[str, Any]
    group_source: str
    schedule: str = ""
    pools: str = ""
    epsilon: float = math.nan

    @property
    def departures(self) -> int:
        """How many axes differ from the default before this search (shipped schedule, clusters, replace, ε 0): the
        simplicity order's first key."""
        if self.name == FAIRKL:
            return 99
        return sum((self.schedule != "shipped", self.group_source != "cluster", self.pools != "replace",
                    self.epsilon != 0))


def cnc_candidate(schedule: str, group_source: str, pools: str, epsilon: float) -> Candidate:
    name = f"cnc-{schedule}-{group_source}-{pools}-e{epsilon:g}"
    sets = {**CNC_COMMON, **SCHEDULES[schedule], "stage2.cnc.short_pools": pools, "loss.epsilon": epsilon}
    return Candidate(name, sets, group_source, schedule, pools, epsilon)


def candidates() -> dict[str, Candidate]:
    """Every candidate of the search, by name: the factorial of the cut schedules, the full-cost schedules at ε 0
    with ``replace`` on both group sources, and FairKL."""
    found = [cnc_candidate(schedule, groups, pools, eps) for schedule in SCHEDULES for groups in cells.GROUP_SOURCES
             for pools in POOLS for eps in EPSILONS
             if schedule not in FULL_COST or (pools == "replace" and eps == 0)]
    found.append(Candidate(FAIRKL, FAIRKL_SETS, "cluster"))
    return {c.name: c for c in found}


# --------------------------------------------------------------------------- results


def rows_for(phase: str, cell: Cell, candidate: str, result: cells.RunResult) -> list[dict[str, Any]]:
    """One row per selection rule: the epoch it keeps on the run's history and that epoch's numbers."""
    picks = picks_by_rule(result.history)
    rows = []
    for rule in RULES:
        epoch = picks[rule]
        kept = next(row for row in result.history if int(row["epoch"]) == epoch)
        block = describe_selection(result.history, epoch, rule)
        rows.append({"phase": phase, "data": cell.data, "protocol": cell.protocol, "palette": cell.palette,
                     "seed": cell.seed, "candidate": candidate, "rule": rule, "epoch": epoch,
                     "degenerate": int(bool(block["degenerate"])), "val_unbiased": round(kept["val/unbiased"], 4),
                     "val_worst": round(kept["val/worst_group"], 4), "test_avg": round(kept["test/avg"], 4),
                     "test_unbiased": round(kept["test/unbiased"], 4), "test_worst": round(kept["test/worst_group"], 4),
                     "test_worst_n": int(kept.get("test/worst_group_n", 0) or 0),
                     "cpu_seconds": round(result.cpu_seconds, 1), "wall_seconds": round(result.wall_seconds, 1),
                     "key": result.key})
    return rows


def cell_of(row: dict[str, str]) -> Cell:
    return Cell(row["data"], row["protocol"], row["palette"], int(row["seed"]))


def values(rows: list[dict[str, str]], phase: str, metric: str, rule: str = RANKED_RULE) -> dict[str, dict[Cell, float]]:
    """``candidate -> cell -> metric`` (points for accuracies) of ``phase`` under ``rule``."""
    out: dict[str, dict[Cell, float]] = {}
    scale = 1.0 if metric.endswith("seconds") else 100.0
    for row in rows:
        if row["phase"] == phase and row["rule"] == rule:
            out.setdefault(row["candidate"], {})[cell_of(row)] = scale * float(row[metric])
    return out


def paired(table: dict[str, dict[Cell, float]], a: str, b: str) -> tuple[float, float, float]:
    """Mean of ``a - b`` over the cells both have, with its 95 % t-interval."""
    shared = sorted(set(table.get(a, {})) & set(table.get(b, {})))
    return cells.interval([table[a][c] - table[b][c] for c in shared])


def cost_ratio(rows: list[dict[str, str]], phase: str, candidate: str) -> float:
    """Median over the cells of the candidate's stage-2 CPU seconds over FairKL's on the same cell (NaN: none)."""
    cpu = values(rows, phase, "cpu_seconds")
    ratios = [cpu[candidate][c] / cpu[FAIRKL][c] for c in cpu.get(candidate, {}) if c in cpu.get(FAIRKL, {})]
    return statistics.median(ratios) if ratios else math.nan


def not_worse(table_u: dict[str, dict[Cell, float]], table_w: dict[str, dict[Cell, float]], a: str, b: str) -> bool:
    """``a`` is not shown worse than ``b``: the paired intervals of unbiased and worst-group accuracy hold 0 (or the
    mean difference is >= 0)."""
    for table in (table_u, table_w):
        mean, low, high = paired(table, a, b)
        if math.isnan(mean) or (mean < 0 and cells.excludes_zero((mean, low, high))):
            return False
    return True


def ranking(rows: list[dict[str, str]], phase: str, metric: str) -> list[tuple[str, float]]:
    """Candidates by their mean ``metric`` over the cells of ``phase`` that every ranked candidate has."""
    table = values(rows, phase, metric)
    return sorted(((c, statistics.fmean(v.values())) for c, v in table.items()), key=lambda item: -item[1])


def eligible(rows: list[dict[str, str]], phase: str, name: str, pools: dict[str, dict[str, int]] | None = None) -> bool:
    """A candidate the default may be: not the reference, at most :data:`COST_BUDGET` times FairKL's CPU time, and
    (where ``pools`` says, :func:`short_pools`) drawing no pool with replacement on the bundled digits: a shipped
    default must not carry ``cnc-small-pools``."""
    return (name != FAIRKL and cost_ratio(rows, phase, name) <= COST_BUDGET
            and not any((pools or {}).get(name, {}).values()))


def short_pools(workdir: Path, all_candidates: dict[str, Candidate]) -> dict[str, dict[str, int]]:
    """Per CNC candidate and digits selection cell, how many sampling pools its sampler draws with replacement
    (``cnc-small-pools``), from the cell's training split and groups table as the stage builds its sampler."""
    import yaml

    from debias.core.trees import merge, unflatten
    from debias.data.store import load_split
    from debias.groups import load_groups
    from debias.schema import validate
    from debias.training.methods.cnc.train import cnc_sampler

    found: dict[str, dict[str, int]] = {}
    for cell in (c for c in SELECT_CELLS if c.data == "digits"):
        root = workdir / cell.name
        base = yaml.safe_load((root / "params.yaml").read_text())
        train = load_split(root / "data/biased/train.pt")
        for name, candidate in all_candidates.items():
            if not candidate.schedule:
                continue
            tree = merge(merge(base, {"seed": cell.seed}), unflatten(candidate.sets))
            groups = load_groups(root / f"groups-{candidate.group_source}.parquet", y=train.y)
            sampler = cnc_sampler(train, groups.inferred_label, validate(tree))
            found.setdefault(name, {})[cell.name] = len(sampler.report()["short_pools"])
    return found


def simplest(names: list[str], all_candidates: dict[str, Candidate], rows: list[dict[str, str]], phase: str) -> str:
    """The simplest of ``names``: fewest departures from the previous default, then the lowest cost."""
    return min(names, key=lambda n: (all_candidates[n].departures, cost_ratio(rows, phase, n), n))


def finalists(rows: list[dict[str, str]], all_candidates: dict[str, Candidate],
              pools: dict[str, dict[str, int]] | None = None) -> list[str]:
    """From the selection's validation numbers: the best eligible candidate; the simplest eligible one not shown worse
    than it; the best eligible one on the other side of ε = 0 and of the group source, and the best one's twins at
    the other ε values (so the held-out cells ask whether the margin and the group source matter); then, as
    references, the best CNC candidate of all (what the eligibility rules cost, if anything), the shipped default and
    FairKL."""
    val_u, val_w = values(rows, "select", "val_unbiased"), values(rows, "select", "val_worst")
    ranked = [name for name, _ in ranking(rows, "select", "val_unbiased")
              if eligible(rows, "select", name, pools) and len(val_u[name]) == len(SELECT_CELLS)]
    if not ranked:
        return []
    best = ranked[0]
    inside = [name for name in ranked if not_worse(val_u, val_w, name, best)]
    chosen = [best, simplest(inside, all_candidates, rows, "select")]
    top = all_candidates[best]
    for differs in (lambda c: (c.epsilon == 0) != (top.epsilon == 0), lambda c: c.group_source != top.group_source):
        other = next((name for name in ranked if differs(all_candidates[name])), None)
        if other is not None:
            chosen.append(other)
    # the best one's twins on the ε axis (the same schedule, groups and pools): what the margin does, alone
    chosen += [name for name in ranked if all_candidates[name].epsilon != top.epsilon and all(
        getattr(all_candidates[name], axis) == getattr(top, axis) for axis in ("schedule", "group_source", "pools"))]
    overall = next((name for name, _ in ranking(rows, "select", "val_unbiased")
                    if name != FAIRKL and len(val_u[name]) == len(SELECT_CELLS)), None)
    return list(dict.fromkeys(chosen + [n for n in (overall, SHIPPED, FAIRKL) if n is not None]))


def decision(rows: list[dict[str, str]], names: list[str], all_candidates: dict[str, Candidate],
             pools: dict[str, dict[str, int]] | None = None) -> tuple[str, str]:
    """(held-out winner by test unbiased accuracy among the eligible finalists, the default: the winner or the
    simplest eligible finalist not shown worse on test unbiased and worst-group accuracy)."""
    test_u, test_w = values(rows, "heldout", "test_unbiased"), values(rows, "heldout", "test_worst")
    pool = [n for n in names if n in test_u and len(test_u[n]) == len(HELDOUT_CELLS) and eligible(rows, "select", n, pools)]
    if not pool:
        return "", ""
    winner = max(pool, key=lambda n: statistics.fmean(test_u[n].values()))
    inside = [n for n in pool if not_worse(test_u, test_w, n, winner)]
    return winner, simplest(inside, all_candidates, rows, "select")


# --------------------------------------------------------------------------- report


def describe(candidate: Candidate) -> str:
    if candidate.name == FAIRKL:
        return "eps-SupInfoNCE + FairKL, released objective (alpha 0.03, lambda 0.5, eps 0.5, tau 0.1), 30 epochs, clusters"
    return (f"CNC, schedule {candidate.schedule}, groups {candidate.group_source}, pools {candidate.pools}, "
            f"eps {candidate.epsilon:g}")


def short_text(pools: dict[str, dict[str, int]] | None, name: str) -> str:
    """The counts of pools drawn with replacement on the digits cells, '–' where not computed (FairKL has none)."""
    found = (pools or {}).get(name)
    return " / ".join(str(n) for _, n in sorted(found.items())) if found else "–"


def cell_list(chosen: list[Cell]) -> str:
    return ", ".join(cell.name for cell in chosen)


def markdown(rows: list[dict[str, str]], all_candidates: dict[str, Candidate], command: str, meta: dict[str, str],
             pools: dict[str, dict[str, int]] | None = None) -> str:
    lines = ["# The default stage 2 chosen on every axis: validation cells pick, held-out cells report", "",
             f"- Command (SCRATCH: any empty folder; mnist10k.npz from the datasets folder): `{FULL_COMMAND}`; this file "
             f"was last written by `{command}` on {dt.date.today().isoformat()}",
             f"- Machine: {platform.machine()} CPU, {meta['threads']} torch thread(s) per run, {meta['jobs']} run(s) at "
             f"once; code and params.yaml of commit {meta['rev']}; mnist10k.npz SHA-256 {meta['data']}",
             f"- Selection cells ({len(SELECT_CELLS)}): {cell_list(SELECT_CELLS)}",
             f"- Held-out cells ({len(HELDOUT_CELLS)}): {cell_list(HELDOUT_CELLS)}",
             "- mnist10k: 10k real digits, 5,999 training images, ERM 5 epochs (benchmarks/quality.yaml's upstream); "
             "digits: params.yaml's pipeline as shipped (1,078 training images, CMNIST* p_corr 0.9). Every run keeps "
             f"the epoch `{RANKED_RULE}` picks on validation; numbers are points (%).",
             f"- Cost: stage 2's CPU seconds (user + system of its process, 1 thread) over FairKL's on the same cell, "
             f"median over the cells. Eligible for the default: at most {COST_BUDGET:g}, and no sampling pool drawn "
             "with replacement on the bundled digits (the shipped default must not carry `cnc-small-pools`).", ""]
    if meta.get("stale"):
        lines += [f"- {meta['stale']} row(s) of the CSV were computed from other data, code or params and are not "
                  "shown (kept in the CSV until the run that replaces them).", ""]
    lines += ["## Candidates", "", "| schedule | settings |", "|---|---|"]
    for name, sets in SCHEDULES.items():
        lines.append(f"| {name} | " + ", ".join(f"{k.removeprefix('stage2.')} {v}" for k, v in sets.items()) + " |")
    lines += ["", "Axes: groups cluster / pred; pools replace / shrink; eps " + " / ".join(f"{e:g}" for e in EPSILONS)
              + f"; the full-cost schedules ({', '.join(FULL_COST)}) at eps 0, replace only. Reference: {describe(all_candidates[FAIRKL])}.",
              ""]
    val_u, val_w = values(rows, "select", "val_unbiased"), values(rows, "select", "val_worst")
    test_u, test_w = values(rows, "select", "test_unbiased"), values(rows, "select", "test_worst")
    ranked = ranking(rows, "select", "val_unbiased")
    if ranked:
        picks = finalists(rows, all_candidates, pools)
        best = picks[0] if picks else ranked[0][0]
        lines += ["## 1. Selection: validation numbers", "",
                  f"Ranked by validation unbiased accuracy; paired Δ against the best eligible candidate ({best}); "
                  "test numbers of the same runs are shown but choose nothing.", "",
                  "| candidate | cells | val unbiased | paired Δ val unbiased | val worst-group | paired Δ val worst-group "
                  "| test unbiased | test worst-group | CPU s, median | cost over FairKL | pools with replacement "
                  "(digits s0, s1) | eligible |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        cpu = values(rows, "select", "cpu_seconds")
        for name, _ in ranked:
            ratio = cost_ratio(rows, "select", name)
            lines.append(
                f"| {name} | {len(val_u[name])} | {cells.fmt_interval(cells.interval(list(val_u[name].values())))} | "
                f"{'best' if name == best else cells.fmt_interval(paired(val_u, name, best), True)} | "
                f"{cells.fmt_interval(cells.interval(list(val_w[name].values())))} | "
                f"{'best' if name == best else cells.fmt_interval(paired(val_w, name, best), True)} | "
                f"{statistics.fmean(test_u[name].values()):.1f} | {statistics.fmean(test_w[name].values()):.1f} | "
                f"{statistics.median(cpu[name].values()):.0f} | {ratio:.2f} | "
                f"{short_text(pools, name)} | {'yes' if eligible(rows, 'select', name, pools) else 'no'} |")
        lines += ["", "Finalists for the held-out cells: " + (", ".join(f"**{n}**" for n in picks) or "none yet") + ".",
                  ""]
        lines += axis_effects(rows, all_candidates)
    held = values(rows, "heldout", "test_unbiased")
    if held:
        picks = finalists(rows, all_candidates, pools)
        winner, default = decision(rows, picks, all_candidates, pools)
        test_u, test_w = held, values(rows, "heldout", "test_worst")
        refs = [r for r in dict.fromkeys([default, SHIPPED, FAIRKL]) if r]
        lines += ["## 2. Held-out cells: test numbers", "",
                  "Paired Δ: the mean over the held-out cells of (row - reference), with the 95 % t-interval of the "
                  "seed-paired differences.", "",
                  "| candidate | cells | test unbiased | test worst-group | "
                  + " | ".join(f"Δ unbiased vs {r} | Δ worst-group vs {r}" for r in refs) + " | cost over FairKL |",
                  "|---|---|---|---|" + "---|---|" * len(refs) + "---|"]
        for name in sorted(held, key=lambda n: -statistics.fmean(held[n].values())):
            deltas = []
            for ref in refs:
                deltas += ["—", "—"] if name == ref else [cells.fmt_interval(paired(test_u, name, ref), True),
                                                          cells.fmt_interval(paired(test_w, name, ref), True)]
            lines.append(f"| {name} | {len(held[name])} | {cells.fmt_interval(cells.interval(list(held[name].values())))}"
                         f" | {cells.fmt_interval(cells.interval(list(test_w[name].values())))} | "
                         + " | ".join(deltas) + f" | {cost_ratio(rows, 'heldout', name):.2f} |")
        lines += ["", f"Held-out winner (test unbiased, eligible finalists): **{winner or 'not all cells yet'}**; the "
                  f"default (the winner or the simplest eligible finalist not shown worse on either number): "
                  f"**{default or 'not all cells yet'}**.", ""]
        lines += rules_compared(rows, list(held))
        lines += per_cell(rows, "heldout", list(held))
    return "\n".join(lines) + "\n"


def rules_compared(rows: list[dict[str, str]], names: list[str]) -> list[str]:
    """The selection rules on the same held-out runs: ``best_unbiased`` (the one ranked) against ``best_worst_group``
    and ``last``, paired by cell, with each rule's degenerate selections."""
    lines = ["### Selection rules on the same held-out runs (test numbers, paired by cell)", "",
             "| candidate | rule | Δ test unbiased vs best_unbiased | Δ test worst-group vs best_unbiased | "
             "degenerate selections |", "|---|---|---|---|---|"]
    base_u, base_w = values(rows, "heldout", "test_unbiased"), values(rows, "heldout", "test_worst")
    for name in names:
        for rule in RULES:
            other_u = values(rows, "heldout", "test_unbiased", rule)
            other_w = values(rows, "heldout", "test_worst", rule)
            cells_here = sorted(set(other_u.get(name, {})) & set(base_u.get(name, {})))
            du = cells.interval([other_u[name][c] - base_u[name][c] for c in cells_here])
            dw = cells.interval([other_w[name][c] - base_w[name][c] for c in cells_here])
            degenerate = sum(int(r["degenerate"]) for r in rows
                             if r["phase"] == "heldout" and r["candidate"] == name and r["rule"] == rule)
            shown = ("—", "—") if rule == RANKED_RULE else (cells.fmt_interval(du, True), cells.fmt_interval(dw, True))
            lines.append(f"| {name} | {rule} | {shown[0]} | {shown[1]} | {degenerate} of {len(cells_here)} |")
    return lines + [""]


def axis_effects(rows: list[dict[str, str]], all_candidates: dict[str, Candidate]) -> list[str]:
    """Each axis's effect on validation unbiased accuracy within the factorial: candidates differing only in that
    axis, paired over cells and over the other axes' levels."""
    val_u = values(rows, "select", "val_unbiased")
    factorial = {n: c for n, c in all_candidates.items() if c.schedule and c.schedule not in FULL_COST and n in val_u}
    axes = {"groups": ("group_source", "cluster"), "pools": ("pools", "replace"), "eps": ("epsilon", 0.0),
            "schedule": ("schedule", "s30")}
    lines = ["### Each axis within the cut schedules' factorial (validation unbiased, paired)", "",
             "| axis | level | against | paired Δ | pairs |", "|---|---|---|---|---|"]
    for axis, (field, reference) in axes.items():
        levels = sorted({getattr(c, field) for c in factorial.values()}, key=str)
        for level in levels:
            if level == reference:
                continue
            diffs = []
            for name, c in factorial.items():
                if getattr(c, field) != level:
                    continue
                twin = next((m for m, d in factorial.items() if getattr(d, field) == reference and all(
                    getattr(d, f) == getattr(c, f) for f, _ in axes.values() if f != field)), None)
                if twin is not None:
                    diffs += [val_u[name][cell] - val_u[twin][cell] for cell in val_u[name] if cell in val_u[twin]]
            if diffs:
                lines.append(f"| {axis} | {level:g} | {reference:g} |" if isinstance(level, float) else
                             f"| {axis} | {level} | {reference} |")
                lines[-1] += f" {cells.fmt_interval(cells.interval(diffs), True)} | {len(diffs)} |"
    return lines + [""]


def per_cell(rows: list[dict[str, str]], phase: str, names: list[str]) -> list[str]:
    test_u, test_w = values(rows, phase, "test_unbiased"), values(rows, phase, "test_worst")
    chosen = sorted({cell for name in names for cell in test_u[name]})
    lines = ["### Every held-out run (test unbiased / worst-group)", "", "| cell | " + " | ".join(names) + " |",
             "|---|" + "---|" * len(names)]
    for cell in chosen:
        lines.append(f"| {cell.name} | " + " | ".join(
            f"{test_u[n][cell]:.1f} / {test_w[n][cell]:.1f}" if cell in test_u[n] else "–" for n in names) + " |")
    return lines + [""]


# --------------------------------------------------------------------------- main


def pools_file(out: Path) -> Path:
    """OUT_pools.json: the short-pool counts of :func:`short_pools` (read by --collect-only)."""
    return out.with_name(out.name + "_pools.json")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--npz", type=Path, help="mnist10k.npz (x uint8 [N, 28, 28], y)")
    parser.add_argument("--workdir", type=Path, help="scratch folder for the per-cell workspaces")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run")
    parser.add_argument("--jobs", type=int, default=2, help="runs at once")
    parser.add_argument("--rev", default="HEAD", help="the commit every cell is cloned at")
    parser.add_argument("--phase", choices=("select", "all"), default="all")
    parser.add_argument("--out", type=Path, default=HERE / "results/default_search")
    parser.add_argument("--collect-only", action="store_true", help="rewrite OUT.md from OUT.csv")
    args = parser.parse_args(argv)
    given = sys.argv[1:] if argv is None else argv
    shown = ["SCRATCH" if i and given[i - 1] == "--workdir" else "mnist10k.npz" if i and given[i - 1] == "--npz"
             else a for i, a in enumerate(given)]
    command = "python benchmarks/default_search.py " + " ".join(map(shlex.quote, shown))
    csv_path, md_path = args.out.with_suffix(".csv"), args.out.with_suffix(".md")
    all_candidates = candidates()
    try:
        if args.collect_only:
            if not csv_path.exists():
                raise BenchmarkError(f"--collect-only: {csv_path} does not exist; run without --collect-only first")
            rows = cells.read_rows(csv_path, FIELDS)
            meta = {"threads": str(args.threads), "jobs": str(args.jobs), "rev": "(as the CSV's keys)", "data": "–"}
            pools_path = pools_file(args.out)
            pools = json.loads(pools_path.read_text()) if pools_path.exists() else None
            cells.write_text(md_path, markdown(rows, all_candidates, command, meta, pools))
            print(md_path.read_text())
            return 0
        if args.workdir is None:
            raise BenchmarkError("--workdir is required (a scratch folder for the cells' workspaces)")
        cells.check_inputs(args.npz, SELECT_CELLS + HELDOUT_CELLS, args.jobs, args.threads)
        rev = cells.git("rev-parse", args.rev)
        if cells.git("status", "--porcelain", "--untracked-files=no"):
            print(f"note: the working tree has uncommitted changes; the cells run commit {rev[:12]}", file=sys.stderr)
        run_search(args, rev, csv_path, md_path, command, all_candidates)
    except BenchmarkError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(md_path.read_text())
    return 0


def run_search(args: argparse.Namespace, rev: str, csv_path: Path, md_path: Path, command: str,
               all_candidates: dict[str, Candidate]) -> None:
    npz = args.npz.resolve() if args.npz else None
    data_key = cells.file_sha256(npz) if npz else "-"
    workdir = args.workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    stored = cells.read_rows(csv_path, FIELDS)
    lock = threading.Lock()
    workspaces: dict[Cell, cells.Workspace] = {}
    meta = {"threads": str(args.threads), "jobs": str(args.jobs), "rev": rev[:12], "data": data_key[:16]}

    def expected_key(cell: Cell, name: str) -> str:
        ws_key = cells.key_of(data_key if cell.data == "mnist10k" else "digits", cells.code_key(rev),
                              cell.overrides(npz), cells.GROUP_SOURCES)
        candidate = all_candidates[name]
        return cells.key_of(ws_key, candidate.group_source, candidate.sets)

    keys = {(c, n): expected_key(c, n) for c in set(SELECT_CELLS + HELDOUT_CELLS) for n in all_candidates}
    valid_keys = set(keys.values())
    rows = [r for r in stored if r["key"] in valid_keys]
    meta["stale"] = str(len(stored) - len(rows)) if len(stored) != len(rows) else ""
    done = {r["key"] for r in rows}

    def workspace(cell: Cell) -> cells.Workspace:
        with lock:
            if cell in workspaces:
                return workspaces[cell]
        made = cells.prepare(workdir, cell, npz, rev, args.threads, data_key)
        with lock:
            workspaces[cell] = made
        return made

    def run_one(phase: str, cell: Cell, name: str) -> None:
        result = cells.train(workspace(cell), name, all_candidates[name].sets, all_candidates[name].group_source,
                             args.threads)
        new = rows_for(phase, cell, name, result)
        with lock:
            rows.extend({k: str(v) for k, v in row.items()} for row in new)
            cells.write_rows(csv_path, FIELDS, rows)
            print(f"{phase} {cell.name} {name}: val unbiased {new[0]['val_unbiased']}, test unbiased "
                  f"{new[0]['test_unbiased']}, worst {new[0]['test_worst']} (epoch {new[0]['epoch']}), "
                  f"{result.cpu_seconds:.0f} CPU s", flush=True)

    def run_phase(phase: str, chosen_cells: list[Cell], names: list[str]) -> None:
        tasks = [(cell, name) for name in names for cell in chosen_cells if keys[(cell, name)] not in done]
        print(f"{phase}: {len(tasks)} run(s) to do, {len(chosen_cells) * len(names) - len(tasks)} kept", flush=True)
        with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
            try:
                needed = sorted({cell for cell, _ in tasks})
                for future in [pool.submit(workspace, cell) for cell in needed]:
                    future.result()  # the upstreams first
                for future in [pool.submit(run_one, phase, cell, name) for cell, name in tasks]:
                    future.result()
            except BaseException:
                pool.shutdown(wait=True, cancel_futures=True)  # a failed run stops the search: nothing more starts
                raise
        cells.write_text(md_path, markdown(rows, all_candidates, command, meta, pools))

    # FairKL first in each cell: every cost ratio needs it
    order = [FAIRKL] + [n for n in all_candidates if n != FAIRKL]
    pools: dict[str, dict[str, int]] = {}
    run_phase("select", SELECT_CELLS, order)
    pools.update(short_pools(workdir, all_candidates))
    cells.write_text(pools_file(args.out), json.dumps(pools, indent=1, sort_keys=True) + "\n")
    cells.write_text(md_path, markdown(rows, all_candidates, command, meta, pools))
    if args.phase == "select":
        return
    picks = finalists(rows, all_candidates, pools)
    if not picks:
        raise BenchmarkError("no eligible candidate completed every selection cell: nothing to hold out")
    run_phase("heldout", HELDOUT_CELLS, picks)


if __name__ == "__main__":
    sys.exit(main())
