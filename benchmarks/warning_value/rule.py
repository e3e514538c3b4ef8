"""The warning-value study's settings, cells and rule (written before its runs), and the verdict it gives a code from
the paired differences its cells measured. Reads rows, writes nothing."""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import cells
from benchmarks.cells import Cell
from benchmarks.cells import cell_of, regime_of  # noqa: F401 (page.py reads them here)
from debias.metrics.paired import Paired, detectable_difference, paired, tost

RESULTS = Path(__file__).resolve().parent.parent / "results"
SEARCH = RESULTS / "default_search.csv"  # the default search's rows: its held-out cells and the selection rules
DIGITS_SEEDS = tuple(range(20))  # the seeds of a user's `dvc repro` of the bundled default with `seed` set
# The confirmation's seeds of the bundled digits (cells none of the first runs used): at the first cells' paired sd
# (about 2.8 points on the digits) about 70 cells where the code fires, half of these at its first rate, let TOST
# within ±1 pass when the true difference is under about 0.4 points.
CONFIRM_SEEDS = tuple(range(20, 160))
RULE_KEPT = "best_unbiased"  # the default's selection rule (params.yaml's stage2.selection)
DEFAULT = "cnc-q3m8-cluster-replace-e0"  # params.yaml's stage 2, as the default search names it
MARGIN = 1.0  # points: the equivalence margin (TOST, α 0.05)
# Points of Δ unbiased that cells must detect (80 % power) for "no loss shown" to count as measured: the project's
# standard for a decision (cells enough to detect 2 points); used by the amendment below.
DETECT = 2.0


@dataclass(frozen=True)
class Setting:
    """A stage-2 setting run on each cell: its name, the params.yaml keys it sets over the cell's, its groups."""

    name: str
    sets: dict[str, Any]
    group_source: str = "cluster"


WARNED = Setting("default-replace", {"stage2.cnc.short_pools": "replace"})  # params.yaml's: short pools with replacement
AVOIDING = Setting("default-shrink", {"stage2.cnc.short_pools": "shrink"})  # M and N cut to the smallest pool

# Checks that guard correctness: they stay warnings whatever their frequency or measured difference.
GUARDS: dict[str, str] = {
    "degenerate-selection": "a validation number of 0 at every epoch leaves the selection nothing to choose by",
    "collapsed-representation": "a collapsed representation is a failed model, whatever it scores",
    "chance-level": "a model at chance learned nothing: its numbers are no method's",
    "unstable-training": "a spiking or diverging loss makes the kept epoch an accident of the curve",
    "mixed-environment": "a run resumed under other settings is none of them: its numbers compare with nothing",
    "unread-param": "a change the run does not read has no effect: the comparison it was made for is void",
    "negligible-param": "a change that weighs under 1 % of the loss changes almost nothing: the comparison is void",
    "weak-groups": "inferred groups that miss most bias-conflicting points feed the methods noise",
    "fairkl-starved": "FairKL missing from most batches: the method the run names did not run",
}

RULE = f"""Written before the runs. Δ: the warned run minus the matched run without the warning, paired by cell (one difference per cell), test accuracy in points, 95 % t-interval.
- A code whose presence is shown equivalent (TOST within ±{MARGIN:g} point of test unbiased accuracy, α 0.05) or shown better (95 % interval of Δ unbiased above 0), with worst-group not shown worse (its 95 % interval not entirely below 0), becomes a **note**: a line in the report's details, not in the warnings list, compare's `!` count, the headline or MLflow's warnings tag.
- A code that predicts a loss (95 % interval of Δ unbiased or of Δ worst-group entirely below 0) stays a **warning**, and its text says by how much.
- Otherwise (neither shown equivalent nor a loss shown, or no cells to measure it on) it stays a **warning**, and says so.
- Amended after the confirmation's results, by the acceptance of the work this study answers (written before this rule: "a warning that remains has a measured loss behind it") and the project's standard (a warning earns its place by a measured loss; one that predicts none is a note): the clause above keeps a warning only where the cells cannot tell. A code measured on cells that detect {DETECT:g} points or less of Δ unbiased (80 % power), with no loss shown, becomes a **note**, and its words say that equivalence within ±{MARGIN:g} is not shown; a code whose cells detect more than {DETECT:g} points, or that has none, stays a **warning**.
- A check that guards correctness ({', '.join(f'`{c}`' for c in GUARDS)}) stays a warning whatever its measured difference or frequency.
- `cnc-small-pools` is judged on the cells where it fired, params.yaml's stage 2 (`short_pools: replace`) against `short_pools: shrink` (on the other cells the two draw the same batches: Δ is 0 by construction); `first-epoch-kept` (the first of several epochs kept: a degenerate pick of `{RULE_KEPT}`, whose validation number is never 0 at every epoch) on the default's runs where `{RULE_KEPT}` made a degenerate pick, against the same run's `last` epoch (the model trained in full).
- Confirmation of `cnc-small-pools`, written after the first cells had decided nothing for it (16 fired cells, TOST p 0.128) and before its runs: the bundled digits at seeds {CONFIRM_SEEDS[0]}-{CONFIRM_SEEDS[-1]} (phase `confirm`), each seed's upstream run once, both settings run where the default's sampler finds a short pool (elsewhere Δ is 0 by construction). The code's verdict is decided by the rule above on the confirmation's fired cells alone; the first cells, seen already, are reported beside it and not pooled into it. It measures the bundled digits: the held-out regimes keep their first few cells. The seeds run in order and the run is stopped by the clock (at 09:20 UTC on 2026-12-02, what its session allows), never by its results: the verdict is on the fired cells whose both settings had finished by then."""

FIELDS = ["phase", "regime", "data", "protocol", "strength", "palette", "seed", "setting", "candidate", "rule",
          "epoch", "degenerate", "fragile", "short_pools", "codes", "val_unbiased", "test_unbiased", "test_worst",
          "cpu_seconds", "threads", "jobs", "rev", "data_sha", "date", "key"]
PIPELINE_FIELDS = ["seed", "warnings", "notes", "rev", "date"]
CONFIRM_FIELDS = ["seed", "short_pools", "rev", "date"]  # the confirmation's pool check, one row per seed


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def heldout_cells(search: Path) -> list[Cell]:
    """The default search's held-out cells on mnist10k (its rows of phase ``heldout`` for the default; the bundled
    digits are the seeds of :data:`DIGITS_SEEDS`), in its order."""
    found = [cell_of(row) for row in read_csv(search) if row["phase"] == "heldout" and row["candidate"] == DEFAULT
             and row["rule"] == RULE_KEPT and row["data"] != "digits"]
    return list(dict.fromkeys(found))


@dataclass(frozen=True)
class Measure:
    """One code's measurement: Δ unbiased and Δ worst-group (points, warned minus matched, one per cell)."""

    unbiased: Paired
    worst: Paired
    p_equivalent: float  # TOST within ±MARGIN on Δ unbiased
    detectable: float  # points of Δ unbiased the cells detect at 80 % power (two-sided paired t, α 0.05)


def measure(unbiased: list[float], worst: list[float]) -> Measure:
    """The paired summaries of per-cell differences (points)."""
    found = paired(unbiased)
    return Measure(found, paired(worst), tost(unbiased, MARGIN) if len(unbiased) > 1 else math.nan,
                   detectable_difference(found.sd, found.n) if found.n > 1 else math.nan)


def shown_below(found: Paired) -> bool:
    """A 95 % interval entirely below 0 (a loss shown); never from fewer than 2 differences."""
    return found.n > 1 and not math.isnan(found.high) and found.high < 0


def verdict(code: str, found: Measure | None, reason: str = "") -> tuple[str, str]:
    """``(kind, words)`` for ``code`` by :data:`RULE`: kind ``note`` or ``warning``; ``words`` say why (the measured
    loss, the reason it cannot be measured, or the guard it is)."""
    if code in GUARDS:
        return "warning", f"correctness guard: stays a warning ({GUARDS[code]})"
    if found is None or found.unbiased.n < 2:
        return "warning", f"warning, cannot be measured here: {reason}"
    u, w = found.unbiased, found.worst
    if shown_below(u) or shown_below(w):
        lost = [f"{name} {m.mean:+.1f} [{m.low:+.1f}, {m.high:+.1f}] points" for name, m in
                (("unbiased", u), ("worst-group", w)) if shown_below(m)]
        return "warning", "warning with its measured loss: " + "; ".join(lost)
    equivalent = found.p_equivalent < 0.05
    better = u.low > 0
    if equivalent or better:
        return "note", ("note: shown equivalent within ±1 point (TOST p "
                        f"{found.p_equivalent:.3f})" if equivalent else "note: shown better") + \
            ", worst-group not shown worse"
    if found.detectable <= DETECT:
        return "note", (f"note: no loss shown on cells that detect {found.detectable:.1f} points (the amendment); "
                        f"equivalence within ±{MARGIN:g} not shown (TOST p {found.p_equivalent:.3f})")
    return "warning", (f"warning: neither shown equivalent (TOST p {found.p_equivalent:.3f}) nor a loss shown; "
                       f"the cells detect {found.detectable:.1f} points, more than {DETECT:g}")
