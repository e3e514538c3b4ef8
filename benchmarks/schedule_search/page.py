"""The schedule study's results page, rendered from its CSV (``--collect-only`` gives the same page as the run)."""

from __future__ import annotations

import datetime as dt
import math
import statistics
from collections import Counter

from benchmarks import cells
from benchmarks.cells import cell_of, regime_of
from benchmarks.schedule_search.rule import (BASE, CANDIDATES, DETECT, REGIMES, RULE, cells_needed, decide,
                                             difference, kept_rows, shown_below)
from debias.metrics.paired import Paired, paired

RULE_FILE = "benchmarks/schedule_search/rule.py"
FULL_COMMAND = "python -m benchmarks.schedule_search --npz mnist10k.npz --workdir SCRATCH --jobs 2"
EPOCH_COLUMNS = ("val_unbiased", "val_aligned", "val_conflicting", "val_worst", "train_ce", "train_contrastive",
                 "val_spread")
ACCURACIES = ("val_unbiased", "val_aligned", "val_conflicting", "val_worst")  # shown in points


def rule_commit() -> str:
    """The commit that first wrote the rule (before the runs), or 'unknown' outside git."""
    try:
        found = cells.git("log", "--reverse", "--format=%h %cs", "--", RULE_FILE)
    except Exception:  # noqa: BLE001 (a copy outside the repository: said as unknown)
        return "unknown"
    return found.splitlines()[0] if found else "unknown"


def fmt(found: Paired, signed: bool = True) -> str:
    return cells.fmt_interval((found.mean, found.low, found.high), signed=signed)


def runs(rows: list[dict[str, str]], phase: str, regime: str, candidate: str) -> dict:
    """``{cell: [epoch rows in order]}`` of one candidate's runs of ``phase`` in ``regime``."""
    found: dict = {}
    for row in rows:
        if row["phase"] == phase and row["regime"] == regime and row["candidate"] == candidate:
            found.setdefault(cell_of(row), []).append(row)
    return {cell: sorted(epochs, key=lambda r: int(r["epoch"])) for cell, epochs in found.items()}


def epochs_section(rows: list[dict[str, str]]) -> list[str]:
    """Per regime, candidate and epoch: the validation runs' means, and how often the epoch was kept."""
    lines = ["| regime | candidate | epoch | cells | kept in | " + " | ".join(EPOCH_COLUMNS) + " |",
             "|---|---|---|---|---|" + "---|" * len(EPOCH_COLUMNS)]
    for regime in REGIMES:
        for candidate in CANDIDATES:
            found = runs(rows, "validation", regime, candidate)
            for epoch in sorted({int(r["epoch"]) for epochs in found.values() for r in epochs}):
                at = [r for epochs in found.values() for r in epochs if int(r["epoch"]) == epoch]
                shown = [f"{100 * statistics.mean(float(r[c]) for r in at):.1f}" if c in ACCURACIES else
                         f"{statistics.mean(float(r[c]) for r in at):.3f}" for c in EPOCH_COLUMNS]
                lines.append(f"| {regime} | {candidate} | {epoch + 1} | {len(at)} | "
                             f"{sum(r['kept'] == '1' for r in at)} | " + " | ".join(shown) + " |")
    return lines


def decline(rows: list[dict[str, str]], regime: str, candidate: str, column: str) -> Paired:
    """The last epoch minus the first, per validation cell (points)."""
    return paired([100 * (float(epochs[-1][column]) - float(epochs[0][column]))
                   for epochs in runs(rows, "validation", regime, candidate).values() if len(epochs) > 1])


def behind_kept(rows: list[dict[str, str]], regime: str, candidate: str) -> Paired:
    """The last epoch minus the kept one, per validation cell (points of unbiased accuracy): never above 0, since
    the kept epoch is the best of the run's epochs on this number; what the default search reported as the decline."""
    return paired([100 * (float(epochs[-1]["val_unbiased"]) - float(next(r for r in epochs if r["kept"] == "1")
                                                                      ["val_unbiased"]))
                   for epochs in runs(rows, "validation", regime, candidate).values() if len(epochs) > 1])


def swing(rows: list[dict[str, str]], regime: str, candidate: str) -> Paired:
    """Per validation cell, the mean size of the change in unbiased accuracy from one epoch to the next (points)."""
    return paired([100 * statistics.mean(abs(float(b["val_unbiased"]) - float(a["val_unbiased"]))
                                         for a, b in zip(epochs, epochs[1:]))
                   for epochs in runs(rows, "validation", regime, candidate).values() if len(epochs) > 1])


def decline_section(rows: list[dict[str, str]]) -> list[str]:
    lines = ["| regime | candidate | cells | unbiased | bias-aligned | bias-conflicting | worst-group | "
             "unbiased, last minus kept | unbiased, size of each epoch's change |",
             "|---|---|---|---|---|---|---|---|---|"]
    for regime in REGIMES:
        for candidate in CANDIDATES:
            found = [decline(rows, regime, candidate, c) for c in ACCURACIES]
            if found[0].n:
                lines.append(f"| {regime} | {candidate} | {found[0].n} | " + " | ".join(fmt(f) for f in found)
                             + f" | {fmt(behind_kept(rows, regime, candidate))} | "
                               f"{fmt(swing(rows, regime, candidate), signed=False)} |")
    return lines


def explanation(rows: list[dict[str, str]]) -> list[str]:
    """Rule 3's reading per regime, with the descriptive columns beside it: where the change from the first epoch to
    the last falls, and how much of the last epoch's gap to the kept one the epochs' swings leave to the selection."""
    out = []
    for regime in REGIMES:
        base = decline(rows, regime, BASE, "val_unbiased")
        if base.n < 2:
            continue
        aligned, conflicting = (decline(rows, regime, BASE, c) for c in ("val_aligned", "val_conflicting"))
        others = [c for c in CANDIDATES if c != BASE and decline(rows, regime, c, "val_unbiased").n > 1]
        swings = "; ".join(f"`{c}` {fmt(swing(rows, regime, c), signed=False)} and {fmt(behind_kept(rows, regime, c))}"
                           for c in others)
        if shown_below(base):
            removed = [c for c in others if not shown_below(decline(rows, regime, c, "val_unbiased"))]
            verdict = (f"a decline, removed by {', '.join(f'`{c}`' for c in removed)}: the steps at the full "
                       "learning rate after the first epoch" if removed else
                       "a decline every candidate shows: the training itself")
        else:
            verdict = "no decline shown"
        out.append(f"- {regime}: `{BASE}`'s last epoch minus its first {fmt(base)} points unbiased ({verdict}); "
                   f"bias-aligned {fmt(aligned)}, bias-conflicting {fmt(conflicting)}. Its epochs swing by "
                   f"{fmt(swing(rows, regime, BASE), signed=False)} points each and its last trails the kept one by "
                   f"{fmt(behind_kept(rows, regime, BASE))} (the selection's pick of the best of them); the same for "
                   f"{swings}.")
    return out or ["- No regime has two or more validation cells yet."]


def cpu_ratio(rows: list[dict[str, str]], phase: str, regime: str, candidate: str) -> str:
    """Stage-2 CPU seconds summed over the regime's cells, over the base's on the same cells."""
    pairs = [v for k, v in kept_rows(rows, phase).items() if regime_of(k) == regime and BASE in v and candidate in v]
    base = sum(float(v[BASE]["cpu_seconds"]) for v in pairs)
    return f"{sum(float(v[candidate]['cpu_seconds']) for v in pairs) / base:.2f}" if base else "–"


def differences_section(rows: list[dict[str, str]], phase: str, split: str) -> list[str]:
    regimes = sorted({r["regime"] for r in rows if r["phase"] == phase},
                     key=lambda r: (REGIMES.index(r) if r in REGIMES else len(REGIMES), r))
    lines = ["| regime | candidate | cells | Δ unbiased | Δ worst-group | detectable | CPU over base |",
             "|---|---|---|---|---|---|---|"]
    for regime in regimes:
        for candidate in CANDIDATES:
            if candidate == BASE:
                continue
            found = difference(rows, phase, regime, candidate, split)
            detectable = "–" if math.isnan(found.detectable) else f"{found.detectable:.1f}"
            lines.append(f"| {regime} | {candidate} | {found.unbiased.n} | {fmt(found.unbiased)} | {fmt(found.worst)} "
                         f"| {detectable} | {cpu_ratio(rows, phase, regime, candidate)} |")
    return lines


def markdown(rows: list[dict[str, str]], search: list[dict[str, str]], command: str) -> str:
    """The results page of the study's rows (``search``: the default search's, which size the cells)."""
    sizes = cells_needed(search)
    winner, verdicts = decide(rows, sizes)
    done = Counter(regime_of(k) for k, v in kept_rows(rows, "validation").items() if set(CANDIDATES) <= set(v))
    heldout = Counter(regime_of(k) for k, v in kept_rows(rows, "heldout").items() if set(CANDIDATES) <= set(v))
    first_kept = [r for r in rows if r["phase"] == "validation" and r["candidate"] == BASE and r["kept"] == "1"]
    lines = [
        "# Stage 2's later epochs: where the decline is, and whether a schedule stops it", "",
        f"- Command: `{FULL_COMMAND}`; this file was last written by `{command}` on {dt.date.today().isoformat()}",
        f"- Rule: {RULE_FILE} at commit {rule_commit()}, written before the runs (below)",
        f"- Rows made with: {cells.made_with(rows)}",
        "- Cells with every candidate finished: validation "
        + ", ".join(f"{r} {done[r]} of {sizes[r]}" for r in REGIMES)
        + "; held-out " + (", ".join(f"{r} {n}" for r, n in sorted(heldout.items())) or "none")
        + ". Accuracy in points; the epoch `best_unbiased` keeps.", "",
        "## Rule", "", RULE, "",
        "## Where the decline is: every epoch of the validation runs", "",
        "Means over the regime's validation cells (accuracy in points; losses and the spread as they are); kept in: "
        "the runs whose kept epoch it is.", "",
        *epochs_section(rows), "",
        "The last epoch minus the first, paired by cell (points, mean [95 % interval]), validation; the last "
        "two columns (added after the runs began, descriptive: no verdict reads them) are the last epoch minus the "
        "kept "
        "one, the measure the default search reported as the decline, which the selection makes 0 or below on every "
        "run, and the mean size of the change from one epoch to the next (how far the epochs swing, up or down):", "",
        *decline_section(rows), "",
        *explanation(rows), "",
        "## Decision: the kept epoch on validation, against `constant`", "",
        f"Δ: the candidate minus `{BASE}` on the same cell (points); detectable: the Δ unbiased its cells detect at "
        f"80 % power (the rule sized them for {DETECT:g}).", "",
        *differences_section(rows, "validation", "val"), "",
        *(f"- `{c}`: {v}" for c, v in verdicts.items()), "",
        f"**Default: `{winner}`**" + (" (params.yaml's stage 2 stays)." if winner == BASE else "."),
        "" if winner != BASE or not first_kept else
        "The first epoch kept is what it is: `" + BASE + "` kept its first epoch in " + ", ".join(
            f"{sum(r['epoch'] == '0' for r in first_kept if r['regime'] == regime)} of "
            f"{sum(r['regime'] == regime for r in first_kept)} {regime}" for regime in REGIMES)
        + " validation runs here.", "",
        "## Held-out: the kept epoch on test images the choice never saw (report only)", "",
        *differences_section(rows, "heldout", "test"),
    ]
    return "\n".join(lines) + "\n"
