"""The default search's results page: the protocol as printed, each phase's tables and the decision, rendered from
the CSV's rows alone (``--collect-only`` gives the same page as the run that wrote them)."""

from __future__ import annotations

import datetime as dt
import math
import statistics

from benchmarks import cells
from benchmarks.cells import Cell
from benchmarks.default_search.protocol import (CAP, CNC_COMMON, DETECT, EPSILONS, EXTENSION_PROTOCOL, FAIRKL, FLOOR,
                                                HELDOUT_REGIMES, MARGIN, PROTOCOL, RANKED_RULE, REGIMES,
                                                REPORT_PROTOCOL, RULES, SCHEDULES, Candidate, Decision, Extension,
                                                Sizing, Table, carried, cost_ratios, decide, decide_extension,
                                                differences, eligible, extension_plan, mean_of, pooled_mean,
                                                one_row_per_run, regime_of, sizes, table, validation_only)
from debias.metrics.paired import Paired, detectable_difference, paired, tost


FULL_COMMAND = "python -m benchmarks.default_search --npz mnist10k.npz --workdir SCRATCH --jobs 2"


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


# Where the protocol is written: this package's protocol.py, and the single script that held it before.
PROTOCOL_FILES = ("benchmarks/default_search/protocol.py", "benchmarks/default_search.py")


def protocol_commit(rev: str) -> str:
    """The commit that last changed the protocol at ``rev`` (the protocol the runs followed), or '' outside git."""
    try:
        return cells.git("log", "-1", "--format=%h %cs", rev, "--", *PROTOCOL_FILES)
    except Exception:  # noqa: BLE001 (a copy outside the repository: said as unknown)
        return ""


def introduced(text: str) -> str:
    """The commit that first put ``text`` into the protocol (a protocol step's own commit), or 'unknown'."""
    try:
        found = cells.git("log", "--reverse", "--format=%h %cs", "-S", text, "--", *PROTOCOL_FILES)
    except Exception:  # noqa: BLE001 (a copy outside the repository: said as unknown)
        return "unknown"
    return found.splitlines()[0] if found else "unknown"


def protocol_file(revs: set[str]) -> str:
    """The file that held the protocol at ``revs``: the script it was before the package where any rev has that
    script, else the package's protocol.py (also for revs git does not know)."""
    for rev in sorted(revs):
        try:
            cells.git("cat-file", "-e", f"{rev}:{PROTOCOL_FILES[1]}")
            return PROTOCOL_FILES[1]
        except Exception:  # noqa: BLE001 (no such file at rev, an unknown rev, or no git)
            continue
    return PROTOCOL_FILES[0]


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
    """The results page of ``rows``; refused (:func:`one_row_per_run`) when a run has more than one row."""
    one_row_per_run(rows)
    names = carried(rows, all_candidates)
    section, decision = decision_section(rows, names)
    ran = {row["candidate"] for row in rows if row["phase"] == "extension"}
    step_8 = decision is not None and bool(decision.default) and any(
        ran & set(e.others) for e in extension_plan(decision, validation_only(rows, "confirm")[0]))
    lines = ["# The default stage 2: a rule written before the runs, decided on validation per regime, reported on "
             "held-out images", "",
             f"- Command (SCRATCH: any empty folder; mnist10k.npz from the datasets folder): `{FULL_COMMAND}`; this file "
             f"was last written by `{command}` on {dt.date.today().isoformat()}",
             f"- Protocol: {protocol_file({row['rev'] for row in rows if row['phase'] != 'extension'})} at commit "
             f"{commit or 'unknown'} (below, as the script "
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
