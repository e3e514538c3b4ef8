"""The schedule study's candidates, cells and rule (written before its runs), and the verdicts its rows give. Reads
rows, writes nothing."""

from __future__ import annotations

import csv
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.cells import Cell, cell_of, digits_cell, regime_of
from debias.metrics.paired import Paired, detectable_difference, paired, seeds_needed

RESULTS = Path(__file__).resolve().parent.parent / "results"
SEARCH = RESULTS / "default_search.csv"  # the default search's rows: the paired sd that sizes the cells
BASE = "constant"  # params.yaml's stage 2, as shipped
# Each candidate: the params.yaml keys it sets over the cell's (params.yaml's stage 2 everywhere else).
CANDIDATES: dict[str, dict[str, Any]] = {
    BASE: {},
    "decay": {"stage2.lr_milestones": [1, 2], "stage2.lr_gamma": 0.1},  # Adam 1e-3, 1e-4, 1e-5 over the 3 epochs
    "half": {"stage2.cnc.anchor_fraction": 0.5},  # each epoch over half the anchors: half the steps
}
KEPT_RULE = "best_unbiased"  # params.yaml's stage2.selection
REGIMES = ("digits", "cmnist", "bmnist")  # decided separately
DETECT = 2.0  # points of validation unbiased accuracy the cells detect at 80 % power
FLOOR = 8  # cells per regime at least
# The paired sd that sizes each regime: the default against the q3m16 schedule (half the steps of each epoch's
# batches, also on clusters) on the default search's confirmation cells, validation unbiased accuracy at the kept epoch.
SIZING = ("cnc-q3m8-cluster-replace-e0", "cnc-q3m16-cluster-replace-e0")
VALIDATION_SEED = 300  # fresh cells: the default search used seeds 0-1, 10-49 and 200-299 on half A and the digits
HELDOUT_SEED = 400
HELDOUT: tuple[Cell, ...] = (
    *(digits_cell(HELDOUT_SEED + i) for i in range(6)),
    *(Cell("mnist10k-B", protocol, palette, seed) for protocol in ("cmnist", "bmnist")
      for palette, seed in (("other", HELDOUT_SEED), ("fresh", HELDOUT_SEED), ("fresh", HELDOUT_SEED + 1))),
    *(Cell("mnist10k-B", "bmnist", palette, HELDOUT_SEED, 0.98) for palette in ("paper", "other", "fresh")),
)
STOP = "18:05 UTC on 2026-12-02"  # the clock that stops the runs (what this session allows), never their results

FIELDS = ["phase", "regime", "data", "protocol", "strength", "palette", "seed", "candidate", "epoch", "kept",
          "val_unbiased", "val_worst", "val_aligned", "val_conflicting", "test_unbiased", "test_worst", "train_ce",
          "train_contrastive", "val_spread", "cpu_seconds", "threads", "jobs", "rev", "data_sha", "date", "key"]

RULE = f"""Written before the runs.
1. Candidates: `{BASE}` (params.yaml's stage 2: Adam at 1e-3 for its 3 epochs), `decay` (the learning rate x0.1 after each epoch: 1e-3, 1e-4, 1e-5) and `half` (each epoch over half the anchors: half the steps, M and N unchanged). Every run keeps the epoch `{KEPT_RULE}` picks on validation, as the stage does. Weight averaging is not a stage-2 option and is not tried.
2. Validation cells, fresh (seeds {VALIDATION_SEED} on): the bundled digits, and half A of mnist10k under CMNIST* 0.96 and Biased-MNIST 0.96 (the papers' palettes). Cells per regime: as many as detect a {DETECT:g}-point difference of validation unbiased accuracy (two-sided paired t, α 0.05, 80 % power) at the paired sd of `{SIZING[0]}` against `{SIZING[1]}` on the default search's confirmation cells of that regime, at least {FLOOR}.
3. The explanation reads every epoch of the validation runs: per regime and candidate, the last epoch minus the first (paired by cell, 95 % interval) of validation unbiased, bias-aligned and bias-conflicting accuracy, and the epochs' training losses and feature spread. A decline that `decay` or `half` removes (their last-minus-first interval not below 0 where `{BASE}`'s is) is attributed to the steps taken at the full learning rate after the first epoch; one that every candidate shows, to the training itself. Whether it falls on the bias-conflicting or the bias-aligned images says whether the later epochs relearn the bias or lose accuracy on every image.
4. Decision, on the kept epochs' validation numbers only, each candidate against `{BASE}` paired by cell: a candidate becomes the default when its Δ validation unbiased accuracy is shown better (95 % interval above 0) in at least one regime and it is shown worse (the interval of Δ unbiased or of Δ worst-group entirely below 0) in none, every regime's cells complete. Where two qualify, the one with the higher mean of its regimes' mean Δ unbiased. Otherwise `{BASE}` stays, and the page states the first epoch kept for what it is.
5. Held-out report, changing no verdict: half B of mnist10k (CMNIST* and Biased-MNIST 0.96 in the other and fresh palettes, Biased-MNIST 0.98 in all three) and the bundled digits at seeds {HELDOUT_SEED}-{HELDOUT_SEED + 5}: test unbiased and worst-group accuracy at the kept epoch, each candidate against `{BASE}` paired by cell, with the difference the cells detect.
6. The runs go validation first (the regimes in turn), then the held-out cells; they are stopped by the clock ({STOP}), never by their results. A regime whose validation cells did not all finish decides nothing (rule 4 then keeps `{BASE}`)."""


@dataclass(frozen=True)
class Difference:
    """One candidate against ``BASE`` in one regime: per-cell paired differences (points)."""

    unbiased: Paired
    worst: Paired
    detectable: float


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def sizing_sd(search: list[dict[str, str]], regime: str) -> float:
    """The paired sd (points) of :data:`SIZING`'s validation unbiased accuracy on the default search's confirmation
    cells of ``regime``."""
    found: dict[Cell, dict[str, float]] = {}
    for row in search:
        if row["phase"] == "confirm" and row["regime"] == regime and row["rule"] == KEPT_RULE \
                and row["candidate"] in SIZING:
            found.setdefault(cell_of(row), {})[row["candidate"]] = 100 * float(row["val_unbiased"])
    differences = [v[SIZING[1]] - v[SIZING[0]] for v in found.values() if len(v) == 2]
    return statistics.stdev(differences) if len(differences) > 1 else math.nan


def cells_needed(search: list[dict[str, str]]) -> dict[str, int]:
    """Validation cells per regime (rule 2)."""
    return {regime: max(FLOOR, seeds_needed(sizing_sd(search, regime), delta=DETECT) or FLOOR) for regime in REGIMES}


def validation_cells(sizes: dict[str, int]) -> list[Cell]:
    """The validation cells, the regimes in turn (each regime's first cell, then each one's second, ...)."""
    def cell(regime: str, i: int) -> Cell:
        seed = VALIDATION_SEED + i
        return digits_cell(seed) if regime == "digits" else Cell("mnist10k-A", regime, "paper", seed)
    return [cell(regime, i) for i in range(max(sizes.values())) for regime in REGIMES if i < sizes[regime]]


def heldout_cells() -> list[Cell]:
    """The held-out cells, the regimes in turn."""
    position: dict[str, int] = {}
    ranked = []
    for cell in HELDOUT:
        position[regime_of(cell)] = position.get(regime_of(cell), 0) + 1
        ranked.append((position[regime_of(cell)], regime_of(cell), cell))
    return [cell for *_, cell in sorted(ranked, key=lambda item: item[:2])]


def kept_rows(rows: list[dict[str, str]], phase: str) -> dict[Cell, dict[str, dict[str, str]]]:
    """``{cell: {candidate: kept epoch's row}}`` of ``phase``."""
    found: dict[Cell, dict[str, dict[str, str]]] = {}
    for row in rows:
        if row["phase"] == phase and row["kept"] == "1":
            found.setdefault(cell_of(row), {})[row["candidate"]] = row
    return found


def difference(rows: list[dict[str, str]], phase: str, regime: str, candidate: str,
               split: str = "val") -> Difference:
    """``candidate`` minus :data:`BASE` at the kept epochs of ``phase``'s cells of ``regime`` (points)."""
    by_cell = [v for k, v in kept_rows(rows, phase).items() if regime_of(k) == regime
               and BASE in v and candidate in v]
    du = [100 * (float(v[candidate][f"{split}_unbiased"]) - float(v[BASE][f"{split}_unbiased"])) for v in by_cell]
    dw = [100 * (float(v[candidate][f"{split}_worst"]) - float(v[BASE][f"{split}_worst"])) for v in by_cell]
    found = paired(du)
    return Difference(found, paired(dw), detectable_difference(found.sd, found.n) if found.n > 1 else math.nan)


def shown_below(found: Paired) -> bool:
    return found.n > 1 and not math.isnan(found.high) and found.high < 0


def shown_above(found: Paired) -> bool:
    return found.n > 1 and not math.isnan(found.low) and found.low > 0


def decide(rows: list[dict[str, str]], sizes: dict[str, int]) -> tuple[str, dict[str, str]]:
    """Rule 4: the default's candidate and each challenger's verdict in words."""
    complete = {regime: sum(1 for k, v in kept_rows(rows, "validation").items() if regime_of(k) == regime
                            and set(CANDIDATES) <= set(v)) >= sizes[regime] for regime in REGIMES}
    verdicts, qualified = {}, {}
    for candidate in CANDIDATES:
        if candidate == BASE:
            continue
        found = {regime: difference(rows, "validation", regime, candidate) for regime in REGIMES}
        better = [r for r, d in found.items() if shown_above(d.unbiased)]
        worse = [r for r, d in found.items() if shown_below(d.unbiased) or shown_below(d.worst)]
        missing = [r for r, done in complete.items() if not done]
        if missing:
            verdicts[candidate] = f"undecided: the validation cells of {', '.join(missing)} did not all finish"
        elif worse:
            verdicts[candidate] = f"stays out: shown worse in {', '.join(worse)}" + (
                f" (shown better in {', '.join(better)})" if better else "")
        elif better:
            qualified[candidate] = statistics.mean(d.unbiased.mean for d in found.values())
            verdicts[candidate] = f"qualifies: shown better in {', '.join(better)}, shown worse in none"
        else:
            verdicts[candidate] = "stays out: shown better in no regime (and worse in none)"
    winner = max(qualified, key=qualified.get) if qualified else BASE
    return winner, verdicts
