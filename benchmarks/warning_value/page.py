"""The warning-value results page: every code of :data:`debias.core.health.CODES` with its measurement and verdict,
rendered from the study's CSVs and the default search's (``--collect-only`` gives the same page as the run)."""

from __future__ import annotations

import datetime as dt
import math
from pathlib import Path

from benchmarks import cells
from benchmarks.warning_value.rule import (DEFAULT, GUARDS, MARGIN, RULE, RULE_KEPT, Measure, cell_of,
                                           heldout_cells, measure, read_csv, regime_of, verdict)
from debias.core import health
from debias.metrics.paired import Paired, welch

SEARCH_PHASES = ("heldout", "confirm", "extension")  # the default search's phases whose test numbers are read here
RULE_FILE = "benchmarks/warning_value/rule.py"
# The runs behind a complete page (SCRATCH: any empty folder; mnist10k.npz from the datasets folder): the cells, then
# the pipeline count at the commit whose warnings it counts.
FULL_COMMANDS = ("python -m benchmarks.warning_value --npz mnist10k.npz --workdir SCRATCH --jobs 2",
                 "python -m benchmarks.warning_value --workdir SCRATCH --jobs 2 --confirm",
                 "python -m benchmarks.warning_value --workdir SCRATCH --jobs 2 --pipeline")


# What changed in the rule after its runs began, said on the page (the comparisons themselves did not change).
AMENDED = ("its words amended at commit 59e0818, after the first-epoch comparison was computed and while the digits "
           "runs ran: the code split off degenerate-selection's "
           "first-epoch case, first-epoch-kept, is named as the code that comparison judges, and degenerate-selection's "
           "remaining case (a validation number 0 at every epoch) is counted among the guards; the confirmation of "
           "cnc-small-pools added at commit 476af33 and its stopping time at f5de531, after the first cells' results "
           "and before the confirmation's own; the amendment (a code measured on cells that detect 2 points, with no "
           "loss shown, is a note) added on 2026-12-02 after the confirmation's results, by the acceptance the study "
           "answers")


def rule_commit() -> str:
    """The commit that first wrote the rule (before the runs), or 'unknown' outside git."""
    try:
        found = cells.git("log", "--reverse", "--format=%h %cs", "--", RULE_FILE)
    except Exception:  # noqa: BLE001 (a copy outside the repository: said as unknown)
        return "unknown"
    return found.splitlines()[0] if found else "unknown"


def fmt(found: Paired) -> str:
    return cells.fmt_interval((found.mean, found.low, found.high), signed=True)


def points(rows: list[dict[str, str]], key: str) -> dict[tuple, float]:
    return {(row["phase"], cell_of(row)): 100 * float(row[key]) for row in rows}


def pool_differences(rows: list[dict[str, str]], fired_only: bool) -> tuple[list[float], list[float], int]:
    """replace minus shrink per cell (test unbiased, test worst-group; points) where both ran, on the cells where
    the warning fired (``fired_only``) or on all; and the number of cells it fired on."""
    warned = [r for r in rows if r["setting"] == "replace"]
    other = {(r["phase"], cell_of(r)): r for r in rows if r["setting"] == "shrink"}
    du, dw, fired = [], [], 0
    for row in warned:
        match = other.get((row["phase"], cell_of(row)))
        if match is None:
            continue
        fired += int(row["short_pools"]) > 0
        if fired_only and int(row["short_pools"]) == 0:
            continue
        du.append(100 * (float(row["test_unbiased"]) - float(match["test_unbiased"])))
        dw.append(100 * (float(row["test_worst"]) - float(match["test_worst"])))
    return du, dw, fired


def degenerate_differences(search: list[dict[str, str]], regime: str | None) -> tuple[list[float], list[float]]:
    """The default's degenerate ``best_unbiased`` picks (each the first of its epochs: :func:`first_epoch_only`)
    minus the same run's ``last`` epoch (test unbiased,
    worst-group; points), over :data:`SEARCH_PHASES` (``regime`` None: every regime)."""
    kept = {(r["phase"], r["key"]): r for r in search if r["candidate"] == DEFAULT and r["rule"] == RULE_KEPT
            and r["phase"] in SEARCH_PHASES and (regime is None or r["regime"] == regime)}
    last = {(r["phase"], r["key"]): r for r in search if r["candidate"] == DEFAULT and r["rule"] == "last"}
    first_epoch_only(list(kept.values()))
    du, dw = [], []
    for ident, row in kept.items():
        if row["degenerate"] == "1" and ident in last:
            du.append(100 * (float(row["test_unbiased"]) - float(last[ident]["test_unbiased"])))
            dw.append(100 * (float(row["test_worst"]) - float(last[ident]["test_worst"])))
    return du, dw


def first_epoch_only(rows: list[dict[str, str]]) -> None:
    """Refuse a degenerate ``best_unbiased`` pick that is not the first epoch: such a pick would be the other case
    (a validation number 0 at every epoch), which ``degenerate-selection`` names, not ``first-epoch-kept``."""
    other = [row["key"] for row in rows if row["degenerate"] == "1" and row["epoch"] != "0"]
    if other:
        raise cells.BenchmarkError(f"{len(other)} degenerate picks not of the first epoch, e.g. run {other[0]}")


def warned_vs_unwarned(search: list[dict[str, str]], regime: str) -> str:
    """Secondary: the default's first-epoch runs against its other runs of the regime (Welch, test unbiased)."""
    rows = [r for r in search if r["candidate"] == DEFAULT and r["rule"] == RULE_KEPT and r["phase"] in SEARCH_PHASES
            and r["regime"] == regime]
    warned = [100 * float(r["test_unbiased"]) for r in rows if r["degenerate"] == "1"]
    others = [100 * float(r["test_unbiased"]) for r in rows if r["degenerate"] != "1"]
    p_value = welch(warned, others)
    if not warned or not others:
        return f"{len(warned)} warned, {len(others)} not"
    mean = lambda values: sum(values) / len(values)  # noqa: E731
    shown = "–" if p_value is None else f"{p_value:.3f}"
    return (f"{len(warned)} first-epoch runs {mean(warned):.1f} against {len(others)} others {mean(others):.1f} "
            f"(difference {mean(warned) - mean(others):+.1f}, Welch p {shown})")


def measured_row(code: str, how: str, found: Measure | None, reason: str = "") -> str:
    kind, words = verdict(code, found, reason)
    if found is None or found.unbiased.n == 0:
        return f"| `{code}` | {how} | 0 | – | – | – | – | {words} |"
    p_value = "–" if math.isnan(found.p_equivalent) else f"{found.p_equivalent:.3f}"
    detect = "–" if math.isnan(found.detectable) else f"{found.detectable:.1f}"
    return (f"| `{code}` | {how} | {found.unbiased.n} | {fmt(found.unbiased)} | {fmt(found.worst)} | {detect} | "
            f"{p_value} | {words} |")


# The codes a cell run's history shows (benchmarks.warning_value.runner.stage2_codes); the others come from the
# pipeline runs alone.
CELL_CODES = ("cnc-small-pools", "degenerate-selection", "first-epoch-kept", "fragile-selection", "unstable-training",
              "collapsed-representation")


def fired_text(code: str, rows: list[dict[str, str]], pipeline: list[dict[str, str]]) -> str:
    """How often ``code`` fired: on the default's cell runs (the codes their histories show) and in the pipeline
    runs (every stage's warnings and notes)."""
    found = []
    if code in CELL_CODES:
        runs = [row for row in rows if row["setting"] == "replace"]
        found.append(f"{sum(code in row['codes'].split(';') for row in runs)} of {len(runs)} default cell runs")
    if pipeline:
        hits = sum(any(m.split(":")[0] == code for m in f"{r['warnings']} | {r['notes']}".split(" | ")) for r in pipeline)
        found.append(f"{hits} of {len(pipeline)} `dvc repro` runs")
    return "fired on " + " and ".join(found) if found else "not looked for here"


REASONS = {
    "fragile-selection": "no setting avoids it on the same cell (the lead is the validation data's)",
    "mixed-environment": "it needs a run resumed under other settings",
    "unread-param": "it needs a changed param the run does not read",
    "negligible-param": "it needs a changed param that weighs under 1 % of the loss",
    "fairkl-starved": "the default (CNC) has no FairKL term",
    "weak-groups": "no setting avoids it on the same cell without changing the groups every method reads",
    "collapsed-representation": "no setting avoids it on the same cell",
    "chance-level": "no setting avoids it on the same cell",
    "unstable-training": "no setting avoids it on the same cell",
    "degenerate-selection": f"`{RULE_KEPT}`'s validation number is never 0 at every epoch in these runs",
}


def confirm_span(checked: list[dict[str, str]]) -> str:
    seeds = [int(r["seed"]) for r in checked]
    return f"{min(seeds)}-{max(seeds)}" if seeds else "none"


def verdict_rows(rows: list[dict[str, str]], search: list[dict[str, str]], pipeline: list[dict[str, str]],
                 checked: list[dict[str, str]]) -> list[str]:
    """One table row per code of :data:`health.CODES`; ``cnc-small-pools`` judged on the confirmation's cells where
    there are any (``checked``: its pool check, one row per seed)."""
    out = []
    confirm = [r for r in rows if r["phase"] == "confirm"]
    du, dw, fired = pool_differences(confirm or rows, fired_only=True)
    paired_cells = len(pool_differences(rows, fired_only=False)[0])
    for code in health.CODES:
        if code == "cnc-small-pools" and confirm:
            how = (f"params.yaml's stage 2 (replace) minus `short_pools: shrink`, paired by cell, on the confirmation's "
                   f"{fired} fired cells alone (the bundled digits at seeds {confirm_span(checked)}, where it fired on "
                   f"{sum(int(r['short_pools']) > 0 for r in checked)} of {len(checked)} seeds; the first cells beside "
                   f"it, below); {fired_text(code, [r for r in rows if r['phase'] != 'confirm'], pipeline)}")
            out.append(measured_row(code, how, measure(du, dw) if du else None, "it fired on no cell"))
        elif code == "cnc-small-pools":
            how = (f"params.yaml's stage 2 (replace) minus `short_pools: shrink`, paired by cell, on the {fired} of "
                   f"{paired_cells} cells where it fired; {fired_text(code, rows, pipeline)}")
            out.append(measured_row(code, how, measure(du, dw) if du else None, "it fired on no cell"))
        elif code == "first-epoch-kept":
            u, w = degenerate_differences(search, None)
            how = (f"default_search.csv: the default's first-epoch `{RULE_KEPT}` picks minus the same run's `last` "
                   f"epoch, phases {', '.join(SEARCH_PHASES)}, every regime pooled; {fired_text(code, rows, pipeline)}")
            out.append(measured_row(code, how, measure(u, w) if u else None, "no degenerate pick"))
        else:
            seen = fired_text(code, rows, pipeline)
            out.append(measured_row(code, f"not measured: {seen}", None, REASONS.get(code, "no matched setting")))
    return out


def pools_section(rows: list[dict[str, str]]) -> list[str]:
    lines = ["| cells | regime | paired cells | fired on | Δ unbiased (fired cells) | Δ worst-group (fired cells) | "
             "Δ unbiased (every cell) |", "|---|---|---|---|---|---|---|"]
    groups = sorted({(r["phase"], r["regime"]) for r in rows})
    for phase, regime in [("all", "all"), *groups]:
        chosen = [r for r in rows if phase == "all" or (r["phase"], r["regime"]) == (phase, regime)]
        du, dw, fired = pool_differences(chosen, fired_only=True)
        every = pool_differences(chosen, fired_only=False)[0]
        if not every:
            continue
        lines.append(f"| {phase} | {regime} | {len(every)} | {fired} | {fmt(measure(du, dw).unbiased) if du else '–'} "
                     f"| {fmt(measure(du, dw).worst) if dw else '–'} | {fmt(measure(every, every).unbiased)} |")
    return lines


def degenerate_section(search: list[dict[str, str]]) -> list[str]:
    lines = ["| regime | first-epoch picks | Δ unbiased vs `last` | Δ worst-group vs `last` | TOST p (±1) | "
             "first-epoch runs vs others (secondary) |", "|---|---|---|---|---|---|"]
    regimes = sorted({r["regime"] for r in search if r["candidate"] == DEFAULT and r["phase"] in SEARCH_PHASES})
    for regime in regimes:
        u, w = degenerate_differences(search, regime)
        found = measure(u, w)
        p_value = "–" if math.isnan(found.p_equivalent) else f"{found.p_equivalent:.3f}"
        lines.append(f"| {regime} | {len(u)} | {fmt(found.unbiased)} | {fmt(found.worst)} | {p_value} | "
                     f"{warned_vs_unwarned(search, regime)} |")
    return lines


def pipeline_codes(row: dict[str, str]) -> list[str]:
    """The codes of a pipeline run's warnings and notes (as its clone's code filed them), in order."""
    return [m.split(":")[0].strip() for text in (row["warnings"], row["notes"]) if text != "none"
            for m in text.split(" | ")]


def pipeline_section(pipeline: list[dict[str, str]]) -> list[str]:
    """The pipeline runs: which carry a warning by :data:`debias.core.health.KINDS` (every code each run showed,
    whichever list its clone's code filed it in), and each run's codes."""
    if not pipeline:
        return ["Not run (`--pipeline`)."]
    warned = [r for r in pipeline if any(health.KINDS.get(c, "warning") == "warning" for c in pipeline_codes(r))]
    noted = [r for r in pipeline if any(health.KINDS.get(c) == "note" for c in pipeline_codes(r))]
    coded = [r for r in pipeline if pipeline_codes(r)]
    revs = " / ".join(sorted({r["rev"] for r in pipeline}))
    by_code: dict[str, int] = {}
    for row in pipeline:
        for code in dict.fromkeys(pipeline_codes(row)):
            by_code[code] = by_code.get(code, 0) + 1
    kinds = ", ".join(f"`{c}` ({health.KINDS.get(c, 'warning')}) in {n}" for c, n in sorted(by_code.items()))
    lines = [f"`dvc repro` of the bundled default at seeds {min(int(r['seed']) for r in pipeline)}-"
             f"{max(int(r['seed']) for r in pipeline)} (fresh clones at commit {revs}, MLflow off; every stage's "
             "warnings and notes, and the unread-param warnings the run records keep), each code filed by this "
             f"page's code's kinds: **{len(warned)} of {len(pipeline)} runs carry a warning**, {len(noted)} a note "
             f"({len(coded)} would carry a warning were every code one). "
             f"Codes: {kinds or 'none'}. Each run's messages: benchmarks/results/warning_value_pipeline.csv.", "",
             "| seed | codes |", "|---|---|"]
    lines += [f"| {r['seed']} | {', '.join(pipeline_codes(r)) or 'none'} |" for r in pipeline]
    return lines


def heldout_text(rows: list[dict[str, str]], search_path: Path) -> str:
    """Which of the default search's held-out mnist10k cells the rows hold both settings of (run each regime in turn,
    so a run stopped early holds each regime's first cells)."""
    done = {cell_of(r) for r in rows if r["phase"] == "heldout" and r["setting"] == "shrink"} & \
        {cell_of(r) for r in rows if r["phase"] == "heldout" and r["setting"] == "replace"}
    if not done:
        return ""
    regimes = ", ".join(f"{regime} {sum(regime_of(c) == regime for c in done)}"
                        for regime in sorted({regime_of(c) for c in done}))
    return (f"; {len(done)} of the default search's {len(heldout_cells(search_path))} held-out cells on half B of "
            f"mnist10k (run each regime in turn; {regimes})")


def markdown(rows: list[dict[str, str]], pipeline: list[dict[str, str]], search_path: Path, command: str,
             commit: str, checked: list[dict[str, str]] | None = None) -> str:
    """The results page of the study's rows, its pipeline count and the default search's CSV."""
    search = read_csv(search_path)
    checked = checked or []
    phases = sorted({r["phase"] for r in search if r["candidate"] == DEFAULT and r["phase"] in SEARCH_PHASES})
    lines = [
        "# Each warning's predictive value: do runs that carry it have worse test numbers?", "",
        f"- Command: `{FULL_COMMANDS[0]}`, then `{FULL_COMMANDS[1]}`, then `{FULL_COMMANDS[2]}`; this file was last written by `{command}` on "
        f"{dt.date.today().isoformat()}",
        f"- Rule: {RULE_FILE} at commit {commit}, written before the runs (below); {AMENDED}",
        f"- Rows made with: {cells.made_with(rows)}",
        f"- Data: the bundled digits at seeds {min(int(r['seed']) for r in rows if r['phase'] == 'digits')}-"
        f"{max(int(r['seed']) for r in rows if r['phase'] == 'digits')} (as `dvc repro` runs them with `seed` set)"
        + heldout_text(rows, search_path)
        + f"; benchmarks/results/default_search.csv, phases {', '.join(phases)}. Test accuracy in points; the epoch "
          f"`{RULE_KEPT}` keeps.", "",
        "## Rule", "", RULE, "",
        "## Every code", "",
        "Δ: the warned run minus the matched run without the warning (points, mean [95 % interval], one difference "
        f"per cell); detectable: the Δ unbiased the cells detect at 80 % power; TOST p: equivalence within ±{MARGIN:g}.",
        "",
        "| code | measured how | cells | Δ unbiased | Δ worst-group | detectable | TOST p (±1) | verdict |",
        "|---|---|---|---|---|---|---|---|",
        *verdict_rows(rows, search, pipeline, checked), "",
        "## `cnc-small-pools`: replace minus shrink, by cells", "",
        "Fired on: the cells where CNC's sampler found a pool smaller than M = N = 8 (the default draws it with "
        "replacement and warns; shrink cuts M and N to it). Phase `confirm`: the confirmation (digits seeds "
        f"{confirm_span(checked)}: both settings only on the seeds where a pool was short, on "
        f"{sum(int(r['short_pools']) > 0 for r in checked)} of {len(checked)} seeds checked; the code's verdict is on "
        "its cells alone; each seed's pool check: benchmarks/results/warning_value_confirm_pools.csv).", "",
        *pools_section(rows), "",
        "## `first-epoch-kept`: the kept first epoch minus the same run's last epoch, by regime", "",
        f"The default's runs in default_search.csv (phases {', '.join(phases)}), rule `{RULE_KEPT}`; secondary: test "
        "unbiased of the first-epoch runs against the regime's other runs (unpaired, Welch).", "",
        *degenerate_section(search), "",
        "## Warnings over the default's first runs", "",
        *pipeline_section(pipeline), "",
        "Guards (" + ", ".join(f"`{c}`" for c in GUARDS) + ") stay warnings whatever the counts above.",
    ]
    return "\n".join(lines) + "\n"
