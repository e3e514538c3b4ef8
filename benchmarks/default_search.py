"""The default stage 2, chosen on validation by a rule written before the runs, judged per regime, reported on images
the choice never saw.

The protocol (:data:`PROTOCOL`, printed at the top of the results file with the commit of this file that ran it):

1. **Screen** every candidate (:func:`candidates`: CNC's schedules x group source x short pools x ε, and the released
   FairKL objective) on a few validation cells of each regime (:data:`SCREEN_CELLS`).
2. **Carry** the top :data:`CARRY_TOP` eligible candidates (pooled over the regimes, each regime weighted equally),
   each regime's best eligible one, and the reference rows (the previous default, the best eligible CNC on ERM
   predictions, the best eligible CNC of the ``q3m16`` schedule on clusters, FairKL).
3. **Size** the confirmation per regime from the screen's paired sd of the carried candidates' validation unbiased
   accuracy: enough cells to detect a :data:`DETECT`-point difference and to show equivalence within
   ±:data:`MARGIN` (TOST, true difference 0), each at 80 % power, between :data:`FLOOR` and :data:`CAP` cells.
4. **Confirm** the carried candidates on fresh validation cells (other seeds) and **decide on their validation
   numbers only** (:func:`decide`): per regime, the winner by mean validation unbiased accuracy; a candidate holds a
   regime when it is its winner or shown equivalent to it (TOST within ±:data:`MARGIN`, α 0.05), and is shown worse
   (95 % paired interval below 0) than no carried candidate there, on validation unbiased or worst-group accuracy.
   The default is the cheapest (summed stage-2 CPU seconds over the confirmation cells) candidate that holds every
   regime. If none does, the page says so and names the candidate holding the bundled digits and most other
   regimes. Eligible: stage-2 CPU seconds summed over a regime's cells at most :data:`COST_BUDGET` times FairKL's,
   in every regime; nothing else gates.
5. **Report** the carried candidates on held-out cells: the other half of mnist10k (disjoint images, palettes the
   choice never saw, Biased-MNIST at 0.98 too) and other seeds of the bundled digits, test numbers per regime with
   intervals clustered by cell (one paired difference per cell).
6. **Extend** (step 7 of the printed protocol, :data:`EXTENSION_PROTOCOL`, written after the steps above ran and
   before its own runs): where the default is neither a regime's winner nor shown equivalent to it, and shown worse
   than no one, the two meet again on fresh validation cells sized for the equivalence test (:func:`extension_plan`,
   :func:`decide_extension`); step 8 (:data:`REPORT_PROTOCOL`, report only) runs the other carried candidates that
   were ahead of the default there on the same cells (:func:`report_only`).

    python benchmarks/default_search.py --npz PATH/mnist10k.npz --workdir SCRATCH --jobs 2

Every run is keyed by its data file, the code and params.yaml at ``--rev``, the torch threads and the run's params;
rows of ``OUT.csv`` under another key are not reused (counted as stale). Each row records the threads, runs at once,
commit and data it was made with, and the header is read from the rows. ``--collect-only`` rewrites ``OUT.md`` from
the CSV; ``--phase screen`` / ``confirm`` stops after that phase; ``--phase extension`` runs steps 7 and 8 alone on the
confirmation rows the CSV holds (made at their own commit), leaving every other row as it is.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime as dt
import itertools
import math
import shlex
import statistics
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import cells  # noqa: E402
from cells import BenchmarkError, Cell, digits_cell  # noqa: E402

from debias.metrics.paired import Paired, detectable_difference, paired, seeds_needed, tost  # noqa: E402
from debias.training.selection import describe_selection, picks_by_rule  # noqa: E402

# CNC's own settings (CNC App. D.2.4; params.yaml's), the same in every candidate.
CNC_COMMON: dict[str, Any] = {
    "stage2.method": "cnc", "stage2.selection": "best_unbiased", "stage2.lr_milestones": [],
    "stage2.optimizer": "adam", "stage2.lr": 0.001, "stage2.weight_decay": 0.0001, "stage2.epochs": 3,
    "stage2.augment_shift": 2, "stage2.cnc.accumulation": 1, "stage2.cnc.head_gradient": "step",
    "stage2.cnc.encoder_mode": "train", "stage2.cnc.temperature": 0.05, "stage2.cnc.contrastive_weight": 0.75,
    "stage2.cnc.two_sided": True, "stage2.cnc.init": "scratch", "stage2.cnc.skip_empty_classes": True,
    "stage2.cnc.forward_chunk": 8,
}
# Schedules: Adam 1e-3 for 3 epochs (CNC App. D.2.4's epochs), each over a share of the anchors, with pools of M = N
# images. The three see the same images per run (anchor share x (1 + 2 (M + N)) is constant): q3 in batches of 129,
# q3m16 twice the steps in batches of 65, q3m8 four times the steps in batches of 33.
SCHEDULES: dict[str, dict[str, Any]] = {
    "q3": {"stage2.cnc.anchor_fraction": 0.25, "stage2.cnc.num_positives": 32, "stage2.cnc.num_negatives": 32},
    "q3m16": {"stage2.cnc.anchor_fraction": 0.5, "stage2.cnc.num_positives": 16, "stage2.cnc.num_negatives": 16},
    "q3m8": {"stage2.cnc.anchor_fraction": 1.0, "stage2.cnc.num_positives": 8, "stage2.cnc.num_negatives": 8},
}
EPSILONS = (0.0, 0.5)  # CNC's loss without a margin, and with the released FairKL objective's (FairKL Table 6)
POOLS = ("replace", "shrink")
PREVIOUS = "cnc-q3-cluster-shrink-e0"  # the default this search was run against
# The released FairKL objective (FairKL Table 6 at rho 0.99: alpha 0.03, lambda 0.5, eps 0.5; tau 0.1), on clusters.
FAIRKL = "fairkl-released"
FAIRKL_SETS: dict[str, Any] = {
    "stage2.method": "eps_supinfonce", "stage2.selection": "best_unbiased", "stage2.optimizer": "adam",
    "stage2.lr": 0.001, "stage2.weight_decay": 0.00001, "stage2.batch_size": 256, "stage2.epochs": 30,
    "stage2.lr_milestones": [], "stage2.augment_shift": 0, "loss.temperature": 0.1, "loss.epsilon": 0.5,
    "loss.alpha": 0.03, "loss.fairkl.variant": "released", "loss.fairkl.weight": 0.5, "loss.fairkl.sampler": "shuffle",
}

REGIMES = ("digits", "cmnist", "bmnist")  # decided separately
COST_BUDGET = 2.0  # stage-2 CPU seconds summed over a regime's cells, over FairKL's on the same cells
CARRY_TOP = 3
DETECT = 2.0  # points of validation unbiased accuracy the confirmation must detect at 80 % power
MARGIN = 1.0  # points: the equivalence margin (TOST)
FLOOR = {"digits": 10, "cmnist": 8, "bmnist": 8}
CAP = {"digits": 40, "cmnist": 20, "bmnist": 20}
RULES = ("best_unbiased", "best_worst_group", "last")
RANKED_RULE = "best_unbiased"
DIGITS_SCREEN, CONFIRM_SEED, HELDOUT_SEED = 4, 10, 100
EXTENSION_SEED = 200  # the extension's fresh validation cells: seeds from here on
EXTENSION_CAP = 100  # cells at most, a regime

SCREEN_CELLS = ([digits_cell(s) for s in range(DIGITS_SCREEN)]
                + [Cell("mnist10k-A", p, "paper", s) for p in cells.PROTOCOLS for s in (0, 1)])


def confirm_cells(sizes: dict[str, int]) -> list[Cell]:
    """The confirmation's validation cells: seeds from :data:`CONFIRM_SEED` on, ``sizes[regime]`` of each regime, on
    the bundled digits and half A of mnist10k with the papers' palettes."""
    return ([digits_cell(CONFIRM_SEED + i) for i in range(sizes.get("digits", 0))]
            + [Cell("mnist10k-A", p, "paper", CONFIRM_SEED + i) for p in cells.PROTOCOLS for i in range(sizes.get(p, 0))])


# Held out: the bundled digits at 10 other seeds; half B of mnist10k with the palettes no choice saw, and Biased-MNIST
# at rho 0.98 as a fourth regime never chosen on.
HELDOUT_CELLS = ([digits_cell(HELDOUT_SEED + i) for i in range(10)]
                 + [Cell("mnist10k-B", p, palette, HELDOUT_SEED + i) for p in cells.PROTOCOLS
                    for palette in ("other", "fresh") for i in range(4)]
                 + [Cell("mnist10k-B", "bmnist", palette, HELDOUT_SEED + i, 0.98) for palette in ("other", "fresh")
                    for i in range(3)])
HELDOUT_REGIMES = ("digits", "cmnist", "bmnist", "bmnist0.98")

PROTOCOL = f"""1. Screen every candidate on {len(SCREEN_CELLS)} validation cells: the bundled digits (seeds 0-{DIGITS_SCREEN - 1}), half A of mnist10k under CMNIST* 0.96 and Biased-MNIST 0.96 (papers' palettes, seeds 0 and 1).
2. Carry the top {CARRY_TOP} eligible candidates by validation unbiased accuracy (the mean of the regimes' means), each regime's best eligible one, and the references: the previous default ({PREVIOUS}), the best eligible CNC on ERM predictions, the best eligible q3m16 schedule on clusters, the released FairKL objective.
3. Size the confirmation of each regime from the screen: the pooled paired sd s of the carried candidates' validation unbiased accuracy; n = the cells that detect a {DETECT:g}-point difference (two-sided paired t, α 0.05) and show equivalence within ±{MARGIN:g} point for a true difference of 0 (TOST, α 0.05), each at 80 % power; n between a floor and a cap per regime ({', '.join(f'{r} {FLOOR[r]}-{CAP[r]}' for r in REGIMES)}).
4. Confirm on fresh validation cells (seeds {CONFIRM_SEED} on). Decide on their validation numbers only: per regime, the winner is the candidate with the highest mean validation unbiased accuracy; a candidate holds a regime when it is the winner or shown equivalent to it (TOST within ±{MARGIN:g} point, α 0.05), and is shown worse (95 % paired interval below 0) than no carried candidate on validation unbiased or worst-group accuracy. The default is the cheapest candidate (stage-2 CPU seconds summed over the confirmation cells) that holds every regime; if none does, the page says so and names the candidate holding the bundled digits and the most other regimes (ties: the higher mean of the regime means).
5. Eligible: stage-2 CPU seconds summed over each regime's cells at most {COST_BUDGET:g} times FairKL's on the same cells, in every regime. Nothing else gates; a warning a candidate carries is reported with what was measured.
6. Report every carried candidate on held-out cells: half B of mnist10k (images the choice never saw; palettes other and fresh; Biased-MNIST at 0.98 too) and the bundled digits at seeds {HELDOUT_SEED}-{HELDOUT_SEED + 9}; test numbers per regime, each difference paired by cell (one difference per cell: intervals clustered by cell), with the difference its cells could detect."""

EXTENSION_PROTOCOL = f"""7. Extension, written after steps 1-6 ran and before its own runs. For each regime where the default of step 4 is neither the winner nor shown equivalent to it, and is shown worse than no carried candidate, run the default and that regime's winner on fresh validation cells of the regime's data (half A of mnist10k or the bundled digits, seeds {EXTENSION_SEED} on): as many cells as show equivalence within ±{MARGIN:g} point at 80 % power for a true difference of 0 (TOST, α 0.05), given the two's paired sd of validation unbiased accuracy over the confirmation cells; at most {EXTENSION_CAP}. The verdict reads the extension's cells alone (the confirmation's cells decided that it runs) and their validation numbers only, by step 4's rule for the two: the default holds the regime when its mean validation unbiased accuracy is the higher or it is shown equivalent (TOST within ±{MARGIN:g} point, α 0.05), and it is shown worse (95 % paired interval below 0) on neither validation unbiased nor worst-group accuracy. If it then holds every regime, it is a default that holds every regime; if not, the page names the regime no single setting holds, with the interval."""
REPORT_PROTOCOL = """8. Report only, written after step 7 ran and before its own runs: on step 7's cells, every other carried candidate whose mean validation unbiased accuracy on that regime's confirmation cells is above the default's, each against the default, paired by cell, on validation unbiased and worst-group accuracy, with the difference the cells detect. It changes no verdict: it says whether the default trails any of them on cells that can tell."""

FIELDS = ["phase", "regime", "data", "protocol", "strength", "palette", "seed", "candidate", "rule", "epoch",
          "degenerate", "val_unbiased", "val_worst", "test_avg", "test_unbiased", "test_worst", "test_worst_n",
          "cpu_seconds", "wall_seconds", "threads", "jobs", "rev", "data_sha", "date", "key"]
TEST_FIELDS = ("test_avg", "test_unbiased", "test_worst", "test_worst_n")  # read by the report, never by decide()
FULL_COMMAND = "python benchmarks/default_search.py --npz mnist10k.npz --workdir SCRATCH --jobs 2"


@dataclass(frozen=True)
class Candidate:
    name: str
    sets: dict[str, Any]
    group_source: str
    schedule: str = ""
    pools: str = ""
    epsilon: float = math.nan


def cnc_candidate(schedule: str, group_source: str, pools: str, epsilon: float) -> Candidate:
    name = f"cnc-{schedule}-{group_source}-{pools}-e{epsilon:g}"
    sets = {**CNC_COMMON, **SCHEDULES[schedule], "stage2.cnc.short_pools": pools, "loss.epsilon": epsilon}
    return Candidate(name, sets, group_source, schedule, pools, epsilon)


def candidates() -> dict[str, Candidate]:
    """Every candidate, by name: CNC's factorial (schedule x group source x pools x ε) and FairKL."""
    found = [cnc_candidate(schedule, groups, pools, eps) for schedule in SCHEDULES for groups in cells.GROUP_SOURCES
             for pools in POOLS for eps in EPSILONS]
    found.append(Candidate(FAIRKL, FAIRKL_SETS, "cluster"))
    return {c.name: c for c in found}


def regime_of(cell: Cell) -> str:
    if cell.data == "digits":
        return "digits"
    return cell.protocol + ("" if cell.strength == cells.STRENGTH else f"{cell.strength:g}")


# --------------------------------------------------------------------------- results


def rows_for(phase: str, cell: Cell, candidate: str, result: cells.RunResult, made: dict[str, str]) -> list[dict[str, Any]]:
    """One row per selection rule: the epoch it keeps on the run's history and that epoch's numbers, with what the
    run was made with (``made``: threads, jobs, rev, data_sha)."""
    picks = picks_by_rule(result.history)
    rows = []
    for rule in RULES:
        epoch = picks[rule]
        kept = next(row for row in result.history if int(row["epoch"]) == epoch)
        block = describe_selection(result.history, epoch, rule)
        rows.append({"phase": phase, "regime": regime_of(cell), "data": cell.data, "protocol": cell.protocol,
                     "strength": f"{cell.strength:g}", "palette": cell.palette, "seed": cell.seed,
                     "candidate": candidate, "rule": rule, "epoch": epoch,
                     "degenerate": int(bool(block["degenerate"])), "val_unbiased": round(kept["val/unbiased"], 4),
                     "val_worst": round(kept["val/worst_group"], 4), "test_avg": round(kept["test/avg"], 4),
                     "test_unbiased": round(kept["test/unbiased"], 4), "test_worst": round(kept["test/worst_group"], 4),
                     "test_worst_n": int(kept.get("test/worst_group_n", 0) or 0),
                     "cpu_seconds": round(result.cpu_seconds, 1), "wall_seconds": round(result.wall_seconds, 1),
                     **made, "date": result.date or dt.date.today().isoformat(), "key": result.key})
    return rows


def cell_of(row: dict[str, str]) -> Cell:
    return Cell(row["data"], row["protocol"], row["palette"], int(row["seed"]), float(row["strength"]))


Table = dict[str, dict[str, dict[Cell, float]]]  # regime -> candidate -> cell -> value


def table(rows: list[dict[str, str]], phases: tuple[str, ...], metric: str, rule: str = RANKED_RULE) -> Table:
    """``regime -> candidate -> cell -> metric`` (points for accuracies, seconds for costs) of ``phases`` under
    ``rule``."""
    out: Table = {}
    scale = 1.0 if metric.endswith("seconds") else 100.0
    for row in rows:
        if row["phase"] in phases and row["rule"] == rule:
            out.setdefault(row["regime"], {}).setdefault(row["candidate"], {})[cell_of(row)] = scale * float(row[metric])
    return out


def differences(per_cell: dict[str, dict[Cell, float]], a: str, b: str) -> list[float]:
    """``a - b`` on every cell both have: one difference per cell."""
    shared = sorted(set(per_cell.get(a, {})) & set(per_cell.get(b, {})))
    return [per_cell[a][c] - per_cell[b][c] for c in shared]


def mean_of(per_cell: dict[str, dict[Cell, float]], name: str) -> float:
    found = per_cell.get(name, {})
    return statistics.fmean(found.values()) if found else math.nan


def cost_ratios(cpu: Table, name: str) -> dict[str, float]:
    """Per regime: the candidate's stage-2 CPU seconds summed over the cells it shares with FairKL, over FairKL's."""
    ratios = {}
    for regime, per_cell in cpu.items():
        shared = set(per_cell.get(name, {})) & set(per_cell.get(FAIRKL, {}))
        if shared:
            ratios[regime] = sum(per_cell[name][c] for c in shared) / sum(per_cell[FAIRKL][c] for c in shared)
    return ratios


def eligible(cpu: Table, name: str) -> bool:
    """At most :data:`COST_BUDGET` times FairKL's summed CPU seconds in every regime it ran in."""
    ratios = cost_ratios(cpu, name)
    return bool(ratios) and all(r <= COST_BUDGET for r in ratios.values())


def complete(per_regime: Table, name: str, chosen: list[Cell]) -> bool:
    """Whether ``name`` has a number on every cell of ``chosen``."""
    have = {cell for per_cell in per_regime.values() for cell in per_cell.get(name, {})}
    return set(chosen) <= have


def pooled_mean(per_regime: Table, name: str) -> float:
    """The mean of the regimes' means (each regime weighted equally)."""
    means = [mean_of(per_cell, name) for per_cell in per_regime.values()]
    return statistics.fmean(means) if means and not any(math.isnan(m) for m in means) else math.nan


# --------------------------------------------------------------------------- the protocol's steps


def carried(rows: list[dict[str, str]], all_candidates: dict[str, Candidate]) -> list[str]:
    """Step 2: the top :data:`CARRY_TOP` eligible candidates pooled over the regimes, each regime's best eligible one,
    then the references (the previous default, the best eligible CNC on predictions, the best eligible q3m16 on
    clusters, FairKL). Reads the screen's validation numbers and costs only."""
    val_u = table(rows, ("screen",), "val_unbiased")
    cpu = table(rows, ("screen",), "cpu_seconds")
    ready = [n for n in all_candidates if complete(val_u, n, SCREEN_CELLS)]
    contenders = sorted((n for n in ready if eligible(cpu, n)), key=lambda n: (-pooled_mean(val_u, n), n))
    if not contenders:
        return []
    chosen = contenders[:CARRY_TOP]
    for regime in REGIMES:
        chosen.append(max(contenders, key=lambda n: (mean_of(val_u.get(regime, {}), n), n)))
    cnc = [n for n in contenders if all_candidates[n].schedule]
    pred = next((n for n in cnc if all_candidates[n].group_source == "pred"), None)
    q3m16 = next((n for n in cnc if all_candidates[n].schedule == "q3m16" and all_candidates[n].group_source == "cluster"),
                 None)
    references = [n for n in (PREVIOUS, pred, q3m16, FAIRKL) if n is not None and n in ready]
    return list(dict.fromkeys(chosen + references))


@dataclass(frozen=True)
class Sizing:
    sd: float
    detect: int | None  # cells to detect DETECT points at 80 % power
    equivalence: int | None  # cells for TOST within ±MARGIN at 80 % power (true difference 0)
    cells: int  # what the confirmation runs: the larger, between FLOOR and CAP


def pooled_sd(per_cell: dict[str, dict[Cell, float]], names: list[str]) -> float:
    """sqrt of the mean over the pairs of ``names`` of the variance of their per-cell differences."""
    variances = []
    for a, b in itertools.combinations(names, 2):
        found = paired(differences(per_cell, a, b))
        if not math.isnan(found.sd):
            variances.append(found.sd ** 2)
    return math.sqrt(statistics.fmean(variances)) if variances else math.nan


def sizes(rows: list[dict[str, str]], names: list[str]) -> dict[str, Sizing]:
    """Step 3: each regime's confirmation cells from the screen's pooled paired sd of the carried candidates."""
    val_u = table(rows, ("screen",), "val_unbiased")
    out = {}
    for regime in REGIMES:
        sd = pooled_sd(val_u.get(regime, {}), names)
        detect, equivalence = seeds_needed(sd, delta=DETECT), seeds_needed(sd, margin=MARGIN)
        wanted = max((n for n in (detect, equivalence) if n is not None), default=CAP[regime])
        if detect is None or equivalence is None:
            wanted = CAP[regime]
        out[regime] = Sizing(sd, detect, equivalence, min(CAP[regime], max(FLOOR[regime], wanted)))
    return out


@dataclass
class Decision:
    contenders: list[str]
    winners: dict[str, str]
    holds: dict[str, dict[str, str]]  # candidate -> regime -> "winner" | "equivalent (p ...)" | "" (not held)
    worse: dict[str, list[str]]  # candidate -> "regime: metric below other" (shown worse)
    cost: dict[str, float]  # summed confirmation CPU seconds
    default: str
    held_everywhere: bool
    notes: list[str] = field(default_factory=list)


def decide(val_u: Table, val_w: Table, cpu: Table, names: list[str]) -> Decision:
    """Step 4 on the confirmation's validation numbers (``val_u``, ``val_w``: regime -> candidate -> cell, points) and
    CPU seconds only: the per-regime winners, what each contender holds, and the default (see :data:`PROTOCOL`)."""
    regimes = [r for r in REGIMES if r in val_u]
    contenders = [n for n in names if eligible(cpu, n) and all(val_u[r].get(n) for r in regimes)]
    if not contenders or not regimes:
        return Decision(contenders, {}, {}, {}, {}, "", False, ["no contender has every regime's cells yet"])
    winners = {r: max(contenders, key=lambda n: (mean_of(val_u[r], n), n)) for r in regimes}
    holds: dict[str, dict[str, str]] = {}
    worse: dict[str, list[str]] = {}
    for name in contenders:
        holds[name], worse[name] = {}, []
        for regime in regimes:
            below = [f"{regime}: {metric} below {other}" for other in names if other != name
                     for metric, per_cell in (("unbiased", val_u[regime]), ("worst-group", val_w.get(regime, {})))
                     if (shown := paired(differences(per_cell, name, other))).excludes_zero and shown.high < 0]
            worse[name] += below
            if below:
                holds[name][regime] = ""
            elif name == winners[regime]:
                holds[name][regime] = "winner"
            else:
                p_value = tost(differences(val_u[regime], name, winners[regime]), MARGIN)
                holds[name][regime] = f"equivalent (p {p_value:.3f})" if p_value < 0.05 else ""
    cost = {n: sum(sum(per_cell.get(n, {}).values()) for per_cell in cpu.values()) for n in contenders}
    qualifying = [n for n in contenders if all(holds[n][r] for r in regimes)]
    if qualifying:
        default = min(qualifying, key=lambda n: (cost[n], n))
        return Decision(contenders, winners, holds, worse, cost, default, True)
    fallback = [n for n in contenders if holds[n].get("digits")] or contenders
    default = max(fallback, key=lambda n: (sum(bool(holds[n][r]) for r in regimes), pooled_mean(val_u, n), n))
    missing = [r for r in regimes if not holds[default][r]]
    note = (f"no candidate holds every regime; {default} holds the bundled digits and the most others (not: "
            f"{', '.join(missing)})")
    return Decision(contenders, winners, holds, worse, cost, default, False, [note])


def validation_only(rows: list[dict[str, str]], phase: str) -> tuple[Table, Table, Table]:
    """The confirmation's inputs to :func:`decide`: validation unbiased, validation worst-group, CPU seconds. The
    rows passed on carry no test column, so nothing downstream can read one."""
    blind = [{k: v for k, v in row.items() if k not in TEST_FIELDS} for row in rows if row["phase"] == phase]
    return (table(blind, (phase,), "val_unbiased"), table(blind, (phase,), "val_worst"),
            table(blind, (phase,), "cpu_seconds"))


def validation_cell(regime: str, seed: int) -> Cell:
    """A validation cell of ``regime`` (the bundled digits, or half A of mnist10k with the papers' palette)."""
    return digits_cell(seed) if regime == "digits" else Cell("mnist10k-A", regime, "paper", seed)


@dataclass(frozen=True)
class Extension:
    regime: str
    default: str
    rival: str  # the regime's winner on the confirmation
    sd: float  # the two's paired sd of validation unbiased accuracy over the confirmation cells (points)
    cells: int
    others: tuple[str, ...] = ()  # step 8, report only: carried candidates ahead of the default on the confirmation

    def chosen(self) -> list[Cell]:
        return [validation_cell(self.regime, EXTENSION_SEED + i) for i in range(self.cells)]


def extension_plan(decision: Decision, val_u: Table) -> list[Extension]:
    """Step 7's runs: each regime the default neither wins nor is shown equivalent in, while shown worse than no one
    there; cells for TOST within ±MARGIN at 80 % power from the confirmation's paired sd, at most EXTENSION_CAP."""
    plan = []
    default = decision.default
    for regime, winner in decision.winners.items():
        shown_worse = any(w.startswith(f"{regime}:") for w in decision.worse.get(default, []))
        if not default or decision.holds[default][regime] or shown_worse:
            continue
        sd = paired(differences(val_u[regime], default, winner)).sd
        wanted = seeds_needed(sd, margin=MARGIN)
        ahead = tuple(n for n in decision.contenders if n not in (default, winner)
                      and mean_of(val_u[regime], n) > mean_of(val_u[regime], default))
        plan.append(Extension(regime, default, winner, sd, min(EXTENSION_CAP, wanted or EXTENSION_CAP), ahead))
    return plan


@dataclass(frozen=True)
class Verdict:
    unbiased: Paired  # default - rival, validation unbiased, one difference per extension cell
    worst: Paired  # the same for validation worst-group accuracy
    p_equivalent: float  # TOST within ±MARGIN
    holds: str  # "winner" | "equivalent (p ...)" | "" (not held)
    shown_worse: list[str]


def decide_extension(val_u: Table, val_w: Table, extension: Extension) -> Verdict:
    """Step 7's verdict on the extension's validation numbers only (``val_u``, ``val_w`` from
    :func:`validation_only` of the extension's rows): step 4's rule for the default and the regime's winner."""
    per_u, per_w = val_u.get(extension.regime, {}), val_w.get(extension.regime, {})
    du = paired(differences(per_u, extension.default, extension.rival))
    dw = paired(differences(per_w, extension.default, extension.rival))
    p_value = tost(differences(per_u, extension.default, extension.rival), MARGIN)
    worse = [metric for metric, found in (("unbiased", du), ("worst-group", dw))
             if found.excludes_zero and found.high < 0]
    if du.n < extension.cells or worse:
        held = ""
    elif du.mean >= 0:
        held = "winner"
    else:
        held = f"equivalent (p {p_value:.3f})" if p_value < 0.05 else ""
    return Verdict(du, dw, p_value, held, worse)


# --------------------------------------------------------------------------- report


def fmt(found: Paired, signed: bool = True) -> str:
    return cells.fmt_interval((found.mean, found.low, found.high), signed)


def fmt_mean(values: list[float]) -> str:
    return cells.fmt_interval(cells.interval(values))


def p_shown(p_value: float) -> str:
    """A p-value in three decimals, "< 0.001" below 0.0005, "—" when there is none."""
    return "—" if math.isnan(p_value) else "< 0.001" if p_value < 0.0005 else f"{p_value:.3f}"


def detectable(found: Paired) -> str:
    value = detectable_difference(found.sd, found.n)
    return "–" if math.isnan(value) else f"{value:.1f}"


def describe(candidate: Candidate) -> str:
    if candidate.name == FAIRKL:
        return "eps-SupInfoNCE + FairKL, released objective (alpha 0.03, lambda 0.5, eps 0.5, tau 0.1), 30 epochs, clusters"
    return (f"CNC, schedule {candidate.schedule}, groups {candidate.group_source}, pools {candidate.pools}, "
            f"eps {candidate.epsilon:g}")


def protocol_commit(rev: str) -> str:
    """The commit that last changed this file at ``rev`` (the protocol the runs followed), or '' outside git."""
    try:
        return cells.git("log", "-1", "--format=%h %cs", rev, "--", "benchmarks/default_search.py")
    except Exception:  # noqa: BLE001 (a copy outside the repository: said as unknown)
        return ""


def introduced(text: str) -> str:
    """The commit that first put ``text`` into this file (a protocol step's own commit), or 'unknown'."""
    try:
        found = cells.git("log", "--reverse", "--format=%h %cs", "-S", text, "--", "benchmarks/default_search.py")
    except Exception:  # noqa: BLE001 (a copy outside the repository: said as unknown)
        return "unknown"
    return found.splitlines()[0] if found else "unknown"


def commits_of(rows: list[dict[str, str]], base: bool) -> str:
    """The protocol commit(s) the rows of steps 1-6 (``base``) or of steps 7-8 were made under, one per code commit."""
    revs = sorted({row["rev"] for row in rows if (row["phase"] != "extension") == base})
    return " / ".join(protocol_commit(rev) or rev for rev in revs)


def screen_section(rows: list[dict[str, str]], all_candidates: dict[str, Candidate], names: list[str]) -> list[str]:
    val_u, cpu = table(rows, ("screen",), "val_unbiased"), table(rows, ("screen",), "cpu_seconds")
    ranked = sorted((n for n in all_candidates if any(n in per_cell for per_cell in val_u.values())),
                    key=lambda n: (-(pooled_mean(val_u, n) if not math.isnan(pooled_mean(val_u, n)) else -1e9), n))
    lines = ["## 1. Screen (validation numbers)", "",
             "Validation unbiased accuracy at the epoch `best_unbiased` keeps, per regime (mean [95 % interval] over "
             "its cells); cost: stage-2 CPU seconds summed over the regime's cells over FairKL's.", "",
             "| candidate | pooled | " + " | ".join(f"{r} val unbiased | {r} cost" for r in REGIMES)
             + " | eligible | carried |", "|---|---|" + "---|---|" * len(REGIMES) + "---|---|"]
    for name in ranked:
        ratios = cost_ratios(cpu, name)
        parts = []
        for regime in REGIMES:
            found = list(val_u.get(regime, {}).get(name, {}).values())
            parts += [fmt_mean(found) if found else "–",
                      f"{ratios[regime]:.2f}" if regime in ratios else "–"]
        pooled = pooled_mean(val_u, name)
        lines.append(f"| {name} | {'–' if math.isnan(pooled) else f'{pooled:.1f}'} | " + " | ".join(parts)
                     + f" | {'yes' if eligible(cpu, name) else 'no'} | {'yes' if name in names else ''} |")
    lines += ["", "Carried to the confirmation: " + (", ".join(f"**{n}**" for n in names) or "none yet") + ".", ""]
    return lines + axis_effects(rows, all_candidates)


def axis_effects(rows: list[dict[str, str]], all_candidates: dict[str, Candidate]) -> list[str]:
    """Each axis's effect on the screen's validation unbiased accuracy, clustered by cell: per cell, the mean over
    the CNC twins differing only in that axis; the interval over cells."""
    val_u = table(rows, ("screen",), "val_unbiased")
    per_cell_values: dict[Cell, dict[str, float]] = {}
    for per_cell in val_u.values():
        for name, found in per_cell.items():
            for cell, value in found.items():
                per_cell_values.setdefault(cell, {})[name] = value
    axes = {"groups": ("group_source", "cluster"), "pools": ("pools", "replace"), "eps": ("epsilon", 0.0),
            "schedule": ("schedule", "q3")}
    factorial = {n: c for n, c in all_candidates.items() if c.schedule}
    lines = ["### Each axis (screen, validation unbiased, clustered by cell)", "",
             "| axis | level | against | Δ [95 % interval over cells] | cells | twins per cell |", "|---|---|---|---|---|---|"]
    for axis, (attribute, reference) in axes.items():
        levels = sorted({getattr(c, attribute) for c in factorial.values()} - {reference}, key=str)
        for level in levels:
            per_cell_mean, twins = [], 0
            for cell, found in sorted(per_cell_values.items()):
                diffs = []
                for name, c in factorial.items():
                    if getattr(c, attribute) != level or name not in found:
                        continue
                    twin = next((m for m, d in factorial.items() if getattr(d, attribute) == reference and all(
                        getattr(d, a) == getattr(c, a) for a, _ in axes.values() if a != attribute)), None)
                    if twin in found:
                        diffs.append(found[name] - found[twin])
                if diffs:
                    per_cell_mean.append(statistics.fmean(diffs))
                    twins = max(twins, len(diffs))
            if per_cell_mean:
                shown = (f"{level:g}", f"{reference:g}") if isinstance(level, float) else (level, reference)
                lines.append(f"| {axis} | {shown[0]} | {shown[1]} | {fmt(paired(per_cell_mean))} | "
                             f"{len(per_cell_mean)} | {twins} |")
    return lines + [""]


def sizing_section(found: dict[str, Sizing]) -> list[str]:
    lines = ["## 2. Confirmation size (from the screen)", "",
             f"Pooled paired sd of the carried candidates' validation unbiased accuracy; cells to detect {DETECT:g} "
             f"points and to show ±{MARGIN:g} (TOST), each at 80 % power, α 0.05; run: the larger, between the floor "
             "and the cap.", "", "| regime | paired sd (points) | cells to detect 2 points | cells for ±1 equivalence "
             "| floor | cap | cells run |", "|---|---|---|---|---|---|---|"]
    for regime, sizing in found.items():
        lines.append(f"| {regime} | {sizing.sd:.2f} | {sizing.detect or '> 10,000'} | "
                     f"{sizing.equivalence or '> 10,000'} | {FLOOR[regime]} | {CAP[regime]} | {sizing.cells} |")
    return lines + [""]


def decision_section(rows: list[dict[str, str]], names: list[str]) -> tuple[list[str], Decision | None]:
    val_u, val_w, cpu = validation_only(rows, "confirm")
    if not val_u:
        return [], None
    decision = decide(val_u, val_w, cpu, names)
    lines = ["## 3. Confirmation and decision (validation numbers only)", "",
             "Per regime: validation unbiased and worst-group accuracy (mean [95 % interval] over the cells); Δ: paired "
             "by cell against the regime's winner, with the difference the cells could detect (80 % power) and the "
             f"TOST p-value for ±{MARGIN:g} point; holds: the winner, or shown equivalent to it.", ""]
    for regime in [r for r in REGIMES if r in val_u]:
        winner = decision.winners.get(regime, "")
        lines += [f"### {regime} ({max((len(v) for v in val_u[regime].values()), default=0)} cells; winner: "
                  f"{winner or '–'})", "",
                  "| candidate | val unbiased | Δ vs winner | detectable | TOST p (±1) | val worst-group | Δ worst-group vs "
                  "winner | cost over FairKL | holds |", "|---|---|---|---|---|---|---|---|---|"]
        for name in sorted(val_u[regime], key=lambda n: (-mean_of(val_u[regime], n), n)):
            du = paired(differences(val_u[regime], name, winner)) if winner else Paired(0, *[math.nan] * 4)
            dw = paired(differences(val_w.get(regime, {}), name, winner)) if winner else du
            p_value = tost(differences(val_u[regime], name, winner), MARGIN) if winner and name != winner else math.nan
            ratio = cost_ratios({regime: cpu.get(regime, {})}, name).get(regime, math.nan)
            held = decision.holds.get(name, {}).get(regime, "–" if name not in decision.contenders else "")
            lines.append(
                f"| {name} | {fmt_mean(list(val_u[regime][name].values()))} | "
                f"{'—' if name == winner else fmt(du)} | {'—' if name == winner else detectable(du)} | "
                f"{'—' if math.isnan(p_value) else f'{p_value:.3f}'} | "
                f"{fmt_mean(list(val_w.get(regime, {}).get(name, {}).values()))} | {'—' if name == winner else fmt(dw)} | "
                f"{ratio:.2f} | {held or 'no'} |")
        lines.append("")
    if decision.default:
        lines += ["### Decision", "",
                  "| candidate | " + " | ".join(decision.winners) + " | shown worse than | confirmation CPU s |",
                  "|---|" + "---|" * len(decision.winners) + "---|---|"]
        for name in decision.contenders:
            lines.append(f"| {name} | " + " | ".join(decision.holds[name][r] or "no" for r in decision.winners)
                         + f" | {'; '.join(decision.worse[name]) or 'none'} | {decision.cost[name]:.0f} |")
        verdict = ("holds every regime; the cheapest that does" if decision.held_everywhere else decision.notes[0])
        lines += ["", f"**The default: {decision.default}** ({verdict}). `decide()` reads the confirmation rows with "
                  "their test columns removed (tests/test_default_search.py checks that test numbers cannot change "
                  "it).", ""]
    return lines, decision


def extension_section(rows: list[dict[str, str]], decision: Decision) -> list[str]:
    """Step 7 on the page: each extended regime's pair on its fresh validation cells, and what the default holds."""
    confirm_u = validation_only(rows, "confirm")[0]
    plan = extension_plan(decision, confirm_u)
    if not plan:
        return []
    val_u, val_w, _ = validation_only(rows, "extension")
    lines = ["## 3b. Extension (fresh validation cells, validation numbers only)", "",
             "Where the default neither won nor was shown equivalent, the default and the regime's winner on fresh "
             "validation cells, sized from the two's paired sd over the confirmation cells; Δ: the default minus the "
             "winner, paired by cell.", "",
             "| regime | default | winner on the confirmation | paired sd (confirmation) | cells planned | cells run | "
             "default val unbiased | winner val unbiased | Δ unbiased | detectable | TOST p (±1) | Δ worst-group | "
             "holds |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    verdicts = {}
    for extension in plan:
        verdict = verdicts[extension.regime] = decide_extension(val_u, val_w, extension)
        per_u = val_u.get(extension.regime, {})
        p_value = p_shown(verdict.p_equivalent)
        lines.append(f"| {extension.regime} | {extension.default} | {extension.rival} | {extension.sd:.2f} | "
                     f"{extension.cells} | {verdict.unbiased.n} | "
                     f"{fmt_mean(list(per_u.get(extension.default, {}).values()))} | "
                     f"{fmt_mean(list(per_u.get(extension.rival, {}).values()))} | {fmt(verdict.unbiased)} | "
                     f"{detectable(verdict.unbiased)} | {p_value} | {fmt(verdict.worst)} | "
                     f"{verdict.holds or ('not yet: cells missing' if verdict.unbiased.n < extension.cells else 'no')} |")
    still = [e.regime for e in plan if not verdicts[e.regime].holds]
    missing = [r for r, held in decision.holds[decision.default].items() if not held]
    short = [e.regime for e in plan if verdicts[e.regime].unbiased.n < e.cells]
    if short:
        verdict = f"**The extension has not run all its cells yet ({', '.join(short)}): no verdict.**"
    elif not still and set(missing) <= set(verdicts):
        verdict = f"**After the extension, {decision.default} holds every regime.**"
    else:
        named = ", ".join(still) or ", ".join(r for r in missing if r not in verdicts)
        verdict = (f"**After the extension, no single setting holds every regime: {decision.default} does not hold "
                   f"{named}.**")
    return lines + ["", verdict, ""] + report_only(val_u, val_w, plan) + first_epochs(rows, "extension")


def report_only(val_u: Table, val_w: Table, plan: list[Extension]) -> list[str]:
    """Step 8 on the page: the default against each carried candidate that was ahead of it on the confirmation, on
    step 7's cells (validation numbers; no verdict reads them)."""
    pairs = [(e, other) for e in plan for other in e.others if val_u.get(e.regime, {}).get(other)]
    if not pairs:
        return []
    lines = ["Step 8 (report only): the default against the other carried candidates ahead of it on the confirmation, "
             "on the same fresh cells; Δ: the default minus the candidate, paired by cell.", "",
             "| regime | candidate | cells | candidate val unbiased | Δ unbiased | detectable | TOST p (±1) | "
             "Δ worst-group | detectable worst-group |", "|---|---|---|---|---|---|---|---|---|"]
    for extension, other in pairs:
        per_u, per_w = val_u[extension.regime], val_w.get(extension.regime, {})
        du = paired(differences(per_u, extension.default, other))
        dw = paired(differences(per_w, extension.default, other))
        p_value = tost(differences(per_u, extension.default, other), MARGIN)
        lines.append(f"| {extension.regime} | {other} | {du.n} | {fmt_mean(list(per_u[other].values()))} | {fmt(du)} | "
                     f"{detectable(du)} | {p_shown(p_value)} | {fmt(dw)} | "
                     f"{detectable(dw)} |")
    return lines + [""]


def first_epochs(rows: list[dict[str, str]], phase: str) -> list[str]:
    """How often ``best_unbiased`` kept the first of the 3 epochs (a ``degenerate-selection`` warning) in ``phase``,
    and the last epoch's validation unbiased accuracy against the kept one's, paired by run."""
    kept, last = table(rows, (phase,), "val_unbiased"), table(rows, (phase,), "val_unbiased", "last")
    lines = ["First epoch kept by `best_unbiased` (a `degenerate-selection` warning) and what the later epochs did: "
             "the last epoch's validation unbiased accuracy minus the kept epoch's, paired by run.", "",
             "| regime | candidate | first epoch kept | last − kept, val unbiased |", "|---|---|---|---|"]
    for regime, per_cell in kept.items():
        for name in sorted(per_cell):
            first = sum(int(r["degenerate"]) for r in rows if r["phase"] == phase and r["regime"] == regime
                        and r["candidate"] == name and r["rule"] == RANKED_RULE)
            found = paired([last[regime][name][c] - v for c, v in per_cell[name].items()
                            if c in last.get(regime, {}).get(name, {})])
            lines.append(f"| {regime} | {name} | {first} of {len(per_cell[name])} | {fmt(found)} |")
    return lines + [""]


def heldout_section(rows: list[dict[str, str]], names: list[str], default: str) -> list[str]:
    test_u, test_w = table(rows, ("heldout",), "test_unbiased"), table(rows, ("heldout",), "test_worst")
    cpu = table(rows, ("heldout",), "cpu_seconds")
    if not test_u or not default:
        return []
    lines = ["## 4. Held-out cells (test numbers, images and seeds the choice never saw)", "",
             f"Against the default ({default}): Δ paired by cell (one difference per cell), with the difference the "
             "cells could detect at 80 % power.", ""]
    for regime in [r for r in HELDOUT_REGIMES if r in test_u]:
        per_regime = test_u[regime]
        n_cells = max(len(v) for v in per_regime.values())
        lines += [f"### {regime} ({n_cells} cells)", "",
                  "| candidate | test unbiased | Δ unbiased vs default | detectable | test worst-group | Δ worst-group vs "
                  "default | detectable | cost over FairKL |", "|---|---|---|---|---|---|---|---|"]
        for name in sorted(per_regime, key=lambda n: (-mean_of(per_regime, n), n)):
            du = paired(differences(per_regime, name, default))
            dw = paired(differences(test_w[regime], name, default))
            ratio = cost_ratios({regime: cpu.get(regime, {})}, name).get(regime, math.nan)
            same = name == default
            lines.append(f"| {name} | {fmt_mean(list(per_regime[name].values()))} | {'—' if same else fmt(du)} | "
                         f"{'—' if same else detectable(du)} | {fmt_mean(list(test_w[regime][name].values()))} | "
                         f"{'—' if same else fmt(dw)} | {'—' if same else detectable(dw)} | {ratio:.2f} |")
        worse = [f"{name} ({metric})" for name in per_regime if name != default
                 for metric, per_cell in (("unbiased", per_regime), ("worst-group", test_w[regime]))
                 if (found := paired(differences(per_cell, default, name))).excludes_zero and found.high < 0]
        lines += ["", f"The default is shown worse than: {', '.join(worse) or 'none'}.", ""]
    return lines + fresh_check(rows, names, default)


def fresh_check(rows: list[dict[str, str]], names: list[str], default: str) -> list[str]:
    """The default against the best of the references on the fresh palette: CMNIST* 0.96 worst-group and Biased-MNIST
    0.98 unbiased (held-out seeds, half B)."""
    references = [n for n in names if n.startswith("cnc-") and "-pred-" in n][:1]
    references += [n for n in names if n.startswith("cnc-q3m16-cluster-")][:1] + [FAIRKL]
    lines = ["### Palettes no search saw (half B, the fresh palette)", "",
             "| regime | metric | the default | best reference | Δ [95 % interval over cells] | within 2 points |",
             "|---|---|---|---|---|---|"]
    for regime, metric in (("cmnist", "test_worst"), ("bmnist0.98", "test_unbiased")):
        per_cell = {n: {c: v for c, v in found.items() if c.palette == "fresh"}
                    for n, found in table(rows, ("heldout",), metric).get(regime, {}).items()}
        present = [n for n in references if per_cell.get(n)]
        if default not in per_cell or not present:
            continue
        best = max(present, key=lambda n: mean_of(per_cell, n))
        found = paired(differences(per_cell, default, best)) if best != default else Paired(0, 0.0, *[math.nan] * 3)
        lines.append(f"| {regime} | {metric.replace('test_', 'test ')} | {mean_of(per_cell, default):.1f} | {best} "
                     f"{mean_of(per_cell, best):.1f} | {fmt(found)} | {'yes' if found.mean >= -2 else 'no'} |")
    return lines + [""]


def rules_compared(rows: list[dict[str, str]], names: list[str]) -> list[str]:
    """The selection rules on the same held-out runs: ``best_worst_group`` and ``last`` against ``best_unbiased`` (the
    rule every candidate was judged by), paired by cell over every held-out regime, with each rule's degenerate
    selections."""
    lines = ["### Selection rules on the same held-out runs (test numbers, paired by cell)", "",
             "| candidate | rule | Δ test unbiased vs best_unbiased | Δ test worst-group vs best_unbiased | "
             "degenerate selections |", "|---|---|---|---|---|"]

    def flat(metric: str, rule: str) -> dict[str, dict[Cell, float]]:
        out: dict[str, dict[Cell, float]] = {}
        for per_regime in table(rows, ("heldout",), metric, rule).values():
            for name, found in per_regime.items():
                out.setdefault(name, {}).update(found)
        return out

    base_u, base_w = flat("test_unbiased", RANKED_RULE), flat("test_worst", RANKED_RULE)
    for name in names:
        for rule in RULES:
            other_u, other_w = flat("test_unbiased", rule), flat("test_worst", rule)
            du = paired([other_u[name][c] - base_u[name][c] for c in sorted(set(other_u.get(name, {})) & set(base_u.get(name, {})))])
            dw = paired([other_w[name][c] - base_w[name][c] for c in sorted(set(other_w.get(name, {})) & set(base_w.get(name, {})))])
            degenerate = sum(int(r["degenerate"]) for r in rows
                             if r["phase"] == "heldout" and r["candidate"] == name and r["rule"] == rule)
            shown = ("—", "—") if rule == RANKED_RULE else (fmt(du), fmt(dw))
            lines.append(f"| {name} | {rule} | {shown[0]} | {shown[1]} | {degenerate} of {du.n} |")
    return lines + [""]


def per_cell_table(rows: list[dict[str, str]], names: list[str]) -> list[str]:
    test_u, test_w = table(rows, ("heldout",), "test_unbiased"), table(rows, ("heldout",), "test_worst")
    chosen = sorted({cell for per_regime in test_u.values() for found in per_regime.values() for cell in found})
    lines = ["### Every held-out run (test unbiased / worst-group)", "", "| cell | " + " | ".join(names) + " |",
             "|---|" + "---|" * len(names)]
    for cell in chosen:
        regime = regime_of(cell)
        shown = [f"{test_u[regime][n][cell]:.1f} / {test_w[regime][n][cell]:.1f}"
                 if cell in test_u[regime].get(n, {}) else "–" for n in names]
        lines.append(f"| {cell.name} | " + " | ".join(shown) + " |")
    return lines + [""]


def markdown(rows: list[dict[str, str]], all_candidates: dict[str, Candidate], command: str,
             stale: int = 0, commit: str = "", extension_commit: str = "") -> str:
    names = carried(rows, all_candidates)
    section, decision = decision_section(rows, names)
    ran = {row["candidate"] for row in rows if row["phase"] == "extension"}
    step_8 = decision is not None and bool(decision.default) and any(
        ran & set(e.others) for e in extension_plan(decision, validation_only(rows, "confirm")[0]))
    lines = ["# The default stage 2: a rule written before the runs, decided on validation per regime, reported on "
             "held-out images", "",
             f"- Command (SCRATCH: any empty folder; mnist10k.npz from the datasets folder): `{FULL_COMMAND}`; this file "
             f"was last written by `{command}` on {dt.date.today().isoformat()}",
             f"- Protocol: benchmarks/default_search.py at commit {commit or 'unknown'} (below, as the script "
             "states it)" + (f"; step 7 at commit {extension_commit}, the commit its runs were made at"
                             if extension_commit else "")
             + (f"; step 8 at commit {introduced('REPORT_PROTOCOL = ')}, before its runs" if step_8 else ""),
             f"- Rows made with: {cells.made_with(rows)}",
             "- Data: the bundled digits as `dvc repro` runs them (1,078 training images, CMNIST* p_corr 0.9); mnist10k "
             "(10k real digits) split class by class into two disjoint halves of 5,000 images (benchmarks/cells.py, "
             "`write_halves`): half A is chosen on, half B reported on (~3,000 training images a cell, ERM 5 epochs: "
             "benchmarks/quality.yaml's upstream). Every run keeps the epoch `best_unbiased` picks on validation; "
             "numbers are points (%).", ""]
    if stale:
        lines += [f"- {stale} row(s) of the CSV were made from other data, code, threads or params and are not shown "
                  "(kept in the CSV until the run that replaces them).", ""]
    lines += ["## Protocol", "", PROTOCOL, EXTENSION_PROTOCOL, REPORT_PROTOCOL, "", "## Candidates", "",
              "| schedule | settings |", "|---|---|"]
    for name, sets in SCHEDULES.items():
        lines.append(f"| {name} | " + ", ".join(f"{k.removeprefix('stage2.')} {v}" for k, v in sets.items()) + " |")
    lines += ["", "Common to CNC: " + ", ".join(f"{k.removeprefix('stage2.')} {v}" for k, v in CNC_COMMON.items()
                                                   if k not in ("stage2.method", "stage2.selection")) + ".",
              "Axes: groups cluster / pred; pools replace / shrink; eps " + " / ".join(f"{e:g}" for e in EPSILONS)
              + f". Reference: {describe(all_candidates[FAIRKL])}.", ""]
    if any(row["phase"] == "screen" for row in rows):
        lines += screen_section(rows, all_candidates, names)
        lines += sizing_section(sizes(rows, names))
    lines += section
    if decision is not None and decision.default:
        lines += extension_section(rows, decision)
        lines += heldout_section(rows, names, decision.default)
        if any(row["phase"] == "heldout" for row in rows):
            lines += rules_compared(rows, names) + per_cell_table(rows, names)
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--npz", type=Path, help="mnist10k.npz (x uint8 [N, 28, 28], y)")
    parser.add_argument("--workdir", type=Path, help="scratch folder for the per-cell workspaces")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run")
    parser.add_argument("--jobs", type=int, default=2, help="runs at once")
    parser.add_argument("--rev", default="HEAD", help="the commit every cell is cloned at")
    parser.add_argument("--phase", choices=("screen", "confirm", "extension", "all"), default="all",
                        help="stop after screen or confirm; extension: run steps 7 and 8 alone on the CSV's confirmation")
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
            rows = cells.read_results(csv_path, FIELDS, "--collect-only")
            cells.write_text(md_path, markdown(rows, all_candidates, command, commit=commits_of(rows, base=True),
                                               extension_commit=commits_of(rows, base=False)))
            print(md_path.read_text())
            return 0
        if args.workdir is None:
            raise BenchmarkError("--workdir is required (a scratch folder for the cells' workspaces)")
        cells.check_inputs(args.npz, SCREEN_CELLS + HELDOUT_CELLS, args.jobs, args.threads)
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
    npz = args.npz.resolve()
    source_sha = cells.file_sha256(npz)
    workdir = args.workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    halves = cells.write_halves(npz, workdir)
    stored = cells.read_rows(csv_path, FIELDS)
    lock = threading.Lock()
    workspaces: dict[Cell, cells.Workspace] = {}
    made = {"threads": str(args.threads), "jobs": str(args.jobs), "rev": rev[:12], "data_sha": source_sha[:16]}
    commit = protocol_commit(rev)

    def npz_of(cell: Cell) -> tuple[Path | None, str]:
        if cell.half:
            return halves[cell.half], cells.key_of(source_sha, cell.half, cells.HALF_SEED)
        return (npz, source_sha) if cell.data == "mnist10k" else (None, "digits")

    def expected_key(cell: Cell, name: str) -> str:
        path, data_key = npz_of(cell)
        ws = cells.Workspace(cell, workdir / cell.name, cells.workspace_key(cell, path, rev, args.threads, data_key))
        return cells.run_key(ws, all_candidates[name].group_source, all_candidates[name].sets)

    rows: list[dict[str, str]] = []
    done: set[str] = set()

    def keep_valid(chosen: list[Cell]) -> int:
        """Rows of ``chosen`` cells under their expected keys join ``rows``; the count of the others (stale)."""
        valid = {expected_key(c, n) for c in chosen for n in all_candidates}
        for row in stored:
            if row["key"] in valid and row["key"] not in done:
                rows.extend(r for r in stored if r["key"] == row["key"])
                done.add(row["key"])
        return sum(1 for row in stored if row["key"] not in done)

    def workspace(cell: Cell) -> cells.Workspace:
        with lock:
            if cell in workspaces:
                return workspaces[cell]
        path, data_key = npz_of(cell)
        ready = cells.prepare(workdir, cell, path, rev, args.threads, data_key)
        with lock:
            workspaces[cell] = ready
        return ready

    def write(stale: int = 0) -> None:
        if args.phase == "extension":  # the earlier phases' rows stand as stored, made at their own commit
            shown = [row for row in stored_others() if row["phase"] != "extension"] + rows
            cells.write_text(md_path, markdown(shown, all_candidates, command, commit=commits_of(shown, base=True),
                                               extension_commit=commit))
        else:
            cells.write_text(md_path, markdown(rows, all_candidates, command, stale, commit, commit))

    def run_one(phase: str, cell: Cell, name: str) -> None:
        result = cells.train(workspace(cell), name, all_candidates[name].sets, all_candidates[name].group_source,
                             args.threads)
        new = rows_for(phase, cell, name, result, made)
        with lock:
            rows.extend({k: str(v) for k, v in row.items()} for row in new)
            done.add(result.key)
            cells.write_rows(csv_path, FIELDS, stored_others() + rows)
            print(f"{phase} {cell.name} {name}: val unbiased {new[0]['val_unbiased']}, "
                  f"{result.cpu_seconds:.0f} CPU s", flush=True)

    def stored_others() -> list[dict[str, str]]:
        return [row for row in stored if row["key"] not in done]

    def run_phase(phase: str, chosen: list[Cell], names: list[str]) -> None:
        stale = keep_valid(chosen)
        tasks = [(cell, name) for cell in chosen for name in names if expected_key(cell, name) not in done]
        print(f"{phase}: {len(tasks)} run(s) to do, {len(chosen) * len(names) - len(tasks)} kept", flush=True)
        with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
            try:
                for future in [pool.submit(workspace, cell) for cell in sorted({cell for cell, _ in tasks})]:
                    future.result()  # the upstreams first: no two threads prepare one cell
                for future in [pool.submit(run_one, phase, cell, name) for cell, name in tasks]:
                    future.result()
            except BaseException:
                pool.shutdown(wait=True, cancel_futures=True)  # a failed run stops the search: nothing more starts
                raise
        write(stale)

    def extend(earlier: list[dict[str, str]], names: list[str]) -> None:
        """Step 7 on the confirmation rows of ``earlier`` (validation columns only)."""
        val_u, val_w, cpu = validation_only(earlier, "confirm")
        decision = decide(val_u, val_w, cpu, names)
        for extension in extension_plan(decision, val_u):
            run_phase("extension", extension.chosen(), [extension.default, extension.rival, *extension.others])

    if args.phase == "extension":
        names = carried(stored, all_candidates)
        if not any(row["phase"] == "confirm" for row in stored):
            raise BenchmarkError(f"--phase extension reads the confirmation's rows, and {csv_path} has none")
        extend(stored, names)
        return
    run_phase("screen", SCREEN_CELLS, [FAIRKL] + [n for n in all_candidates if n != FAIRKL])
    names = carried(rows, all_candidates)
    if not names:
        raise BenchmarkError("no eligible candidate completed every screen cell: nothing to carry")
    if args.phase == "screen":
        return
    found = sizes(rows, names)
    run_phase("confirm", confirm_cells({r: s.cells for r, s in found.items()}), names)
    if args.phase == "confirm":
        return
    extend(rows, names)
    run_phase("heldout", HELDOUT_CELLS, names)


if __name__ == "__main__":
    sys.exit(main())
