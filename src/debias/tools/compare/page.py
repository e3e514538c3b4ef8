"""``debias compare``'s page: the headline card, the tables, the per-group heatmaps and validation curves of the runs
compared and every warning, as a self-contained HTML page and markdown, into a folder it owns (its manifest)."""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd

from debias.core import paths
from debias.core.errors import NEEDS_BIAS_LABELS
from debias.core.headline import LABELS, warning_code
from debias.core.io import atomic_path
from debias.metrics import GroupAccuracy
from debias.params import ReportParams
from debias.report import card, figures
from debias.tools.compare.collect import CURVE_FILES, GROUP_FILES, Experiment
from debias.metrics.paired import ALPHA
from debias.tools.compare.data import (DECIDE_POINTS, METRICS, STEP_SHOWN, Comparison, MetricVerdict, data_family,
                                       evidence_of_best, fmt, fmt_mean_std, group_label, metric_present, numeric,
                                       rank_metric)
from debias.report.document import Block, Figure, Section, Table, Text, render_html, render_markdown
from debias.report.sections.base import worst_cell
from debias.report.sections.headline import card_blocks
from debias.tools.compare.terminal import (LEGEND, POWER_WORDS, decide_parts, describe_without_results,
                                           difference_lines, next_text, other_commits_text, p_text, seeds_text,
                                           step_phrase, terminal_text)

MAX_FIGURE_RUNS = 8  # runs drawn in the per-group and curve figures
# The page holds wide tables: a wider column, and cells that do not wrap ("85.4 ± 3.6" stays on one line).
PAGE_STYLE = "main { max-width: 1500px; } td, th { white-space: nowrap; }"


def worst_groups(experiment: Experiment, confidence: float) -> dict[str, GroupAccuracy | None]:
    """ERM's and stage 2's worst test group of ``experiment`` (None where its per-group file is missing)."""
    train_counts = card.train_group_counts(experiment.read_json(paths.BIAS_SUMMARY))
    return {model: card.model_summary(model, None, (experiment.read_json(GROUP_FILES[model]) or {}).get("test"),
                                      confidence, train_counts).worst_group for model in GROUP_FILES}


def _distinct(values: list[str]) -> str:
    """The values joined, or one of them with '(every run)' when they all agree."""
    return f"{values[0]} (every run)" if len(values) > 1 and len(set(values)) == 1 else "; ".join(values) or "n/a"


def headline_section(comparison: Comparison, worst: dict[str, dict[str, GroupAccuracy | None]], confidence: float,
                     min_n: int) -> Section:
    """The page's card: ERM against stage 2 for the best group (mean ± std over its seeds), each seed's worst group
    named with its n and interval, the warning count with a link, and what to look at next."""
    c = comparison
    best = c.groups.iloc[0]
    names = str(best["experiments"]).split(", ")
    members = [e for e in c.experiments if e.name in names]
    seeds = int(best["seeds"])

    def mean(key: str) -> str:
        if f"{key}_mean" not in best or pd.isna(best[f"{key}_mean"]):
            return "n/a"
        return fmt_mean_std(best[f"{key}_mean"], best[f"{key}_std"], True, " ± ")

    def per_run(model: str, text: Any) -> str:
        found = [worst[e.name].get(model) for e in members]
        return _distinct([text(g) if g is not None else "n/a" for g in found])

    level = f"{100 * confidence:g} %"
    models = (("erm", "erm"), ("stage2", "s2"))
    rows = [
        ["average %", *(mean(f"{short}_avg") for _, short in models)],
        ["unbiased %", *(mean(f"{short}_unbiased") for _, short in models)],
        ["worst-group %", *(mean(f"{short}_worst") for _, short in models)],
        ["worst group (class y, attribute a)", *(per_run(m, card.group_name) for m, _ in models)],
        ["its test images n", *(per_run(m, lambda g: f"{g.n}" + (f" (< {min_n})" if g.n < min_n else "")) for m, _ in models)],
        [f"its {level} interval (Wilson)", *(per_run(m, lambda g: card.interval_text(g.low, g.high)) for m, _ in models)],
    ]
    label = group_label(best, c.group_params) if c.group_params else "every experiment"
    seeds_text = f"{seeds} seed{'s' if seeds != 1 else ''}"
    rank = rank_metric(c.frame)
    rank_label = LABELS.get(rank, rank) if rank else "a ranked metric"
    # "best" only where there is something to rank it against: two groups or more with the rank metric
    shown_best = c.ranked > 1 and evidence_of_best(c.differences, data_family(best, c.group_params))
    headers = [f"{'best' if shown_best else 'highest mean'}: {label} ({seeds_text})" if c.ranked > 1
               else f"{label} ({seeds_text})", "ERM", "stage 2"]
    found = [(f"{e.name}/{stage}", m) for e in c.experiments for stage, ms in e.warnings.items() for m in ms]
    mine = [w for w in found if w[0].split("/")[0] in names]
    chosen = [worst[e.name].get("stage2") or worst[e.name].get("erm") for e in members]
    smallest = min((g for g in chosen if g is not None), key=lambda g: g.n, default=None)
    number = {key: (None if f"{key}_mean" not in best else best[f"{key}_mean"] if isinstance(best[f"{key}_mean"], str)
                    else None if pd.isna(best[f"{key}_mean"]) else float(best[f"{key}_mean"]))  # str: needs bias labels
              for key in ("erm_worst", "s2_worst")}
    facts = card.Facts(mine, number["erm_worst"], number["s2_worst"], smallest, min_n, confidence, seeds)
    standing = (f"ranked first of {c.ranked} groups by {rank_label}" if c.ranked > 1 else
                f"the only group with {rank_label}: nothing to rank it against")
    caption = (f"Test split, {standing}: mean ± sample std over its seeds; the worst group and its Wilson interval "
               f"per run ({', '.join(names)}).")
    return Section("Headline", card_blocks(headers, rows, card.warnings_line(found), card.next_step(facts), caption),
                   card=True)


def _table(frame: pd.DataFrame, params: list[str], grouped: bool, extra: dict[str, str] | None = None,
           extra_header: str = "") -> Table:
    """The grouped or per-experiment table; ``extra``: one more cell per experiment name (per-experiment only)."""
    metrics = [m for m in METRICS if metric_present(frame, m.key, "_mean" if grouped else "")]
    headers = (params if grouped else ["experiment", *params]) or ["group"]
    headers = [*headers, *(["seeds"] if grouped else []), *(f"{m.group} {m.label}" for m in metrics),
               *([extra_header] if extra is not None else []), "warnings"]
    rows = []
    for _, row in frame.iterrows():
        cells = [str(row[k]) for k in ([] if grouped else ["experiment"]) + params] or ["all"]
        if grouped:
            cells.append(str(row["seeds"]))
            cells += [fmt_mean_std(row[f"{m.key}_mean"], row[f"{m.key}_std"], m.percent, " ± ") for m in metrics]
        else:
            cells += [fmt(row[m.key], m.percent) for m in metrics]
        if extra is not None:
            cells.append(extra.get(row["experiment"], "–"))
        cells.append(str(row["warnings"]) if row["warnings"] else "")
        rows.append(cells)
    return Table(headers, rows)


def verdict_cell(v: MetricVerdict) -> str:
    """The verdict, short, for the page's table: 'not distinguishable' with what the seeds detect, 'undecided' with
    the seeds that would decide it (the terminal says the same in full: :func:`verdict_phrase`)."""
    if v.verdict == "not distinguishable" and v.spread:
        return f"not distinguishable: {v.pairs} seeds detect ≥ {v.detectable:.1f} points"
    if v.verdict == "undecided" and v.spread:
        return f"undecided: {decide_parts(v)[0]} would decide it"
    if v.verdict == "within":
        return f"within ±{v.margin:g} ({p_text(v.tost_p)})" + (" and differs from 0" if v.paired.excludes_zero else "")
    short = {"unpaired": "unpaired (fewer than 2 seeds in common)", "too few seeds": f"no verdict: {v.pairs} seeds",
             "evidence": "evidence of a difference", "differs": "differs"}
    return short.get(v.verdict, f"{v.verdict} (no spread: an interval without width)")


def decide_cell(v: MetricVerdict) -> str:
    """'about 512 seeds (equivalence; a difference: about 470 seeds)': the seeds that decide, which test needs them."""
    if v.pairs < 2 or not v.spread:
        return "–"
    count, which = v.seeds_to_decide
    other = seeds_text(v.seeds_differ if which == "within" else v.seeds_within)
    return (f"{seeds_text(count)} (equivalence; a difference: {other})" if which == "within" else
            f"{seeds_text(count)} (a difference; equivalence: {other})")


def differences_table(c: Comparison) -> Table:
    """One row per group and judged metric against the top group of its data: the difference of the means, the
    difference paired by seed with its 95 % interval and verdict, what these seeds detect, the seeds that would
    decide ±margin (and which test needs them), what one image moves a small worst group by, Welch's p."""
    decide = f"±{c.margin:g}" if c.margin is not None else f"±{DECIDE_POINTS:g}"
    rows = []
    for d in c.differences:
        for v in d.verdicts:
            step = "" if step_phrase(v) is None else f"{card.points_text(v.step)} points (n = {v.worst_n})"
            rows.append([d.group, d.best, LABELS.get(v.metric, v.metric),
                         "–" if math.isnan(v.difference) else f"{v.difference:+.1f}",
                         "–" if v.pairs < 2 else f"{v.paired.mean:+.1f} [{v.paired.low:+.1f}, {v.paired.high:+.1f}]",
                         verdict_cell(v), f"{v.detectable:.1f}" if v.spread else "–", decide_cell(v), step,
                         "–" if v.p is None else f"{v.p:.3f}", f"{v.n[0]} vs {v.n[1]}"])
    equivalence = (f" With --margin {c.margin:g}: within ±{c.margin:g} when both one-sided tests pass at alpha "
                   f"{ALPHA:g}, differs when the interval excludes 0, else undecided." if c.margin is not None else "")
    return Table(["group", "against", "metric", "difference of the means (points)",
                  "paired by seed: mean [95 % interval]", "verdict", "detectable difference (points)",
                  f"seeds to decide {decide} points", "one test image moves the worst group by", "Welch p", "seeds"],
                 rows,
                 caption="Each group against the top group of its data, on worst-group and unbiased accuracy. The "
                         "difference paired by seed is evidence when its 95 % interval (3 seeds or more) has a width "
                         "and excludes 0, else the two are not distinguishable at these seeds. Detectable difference: "
                         f"the smallest true difference these seeds find with {POWER_WORDS}, from the observed sd of "
                         f"the paired differences. Seeds to decide {decide} points: the larger of the seeds two "
                         f"one-sided tests need to show equivalence within {decide} at a true difference of 0 and "
                         "those the t-test needs to find that difference, both at 80 % power, for the same sd. A "
                         "worst group of few test images moves by a whole image at a time (shown where one image is "
                         f"more than {STEP_SHOWN:g} points).{equivalence} Welch's two-sided t-test over seeds beside it.")


def page_sections(comparison: Comparison, figure_paths: dict[str, list[Path]], chosen: list[Experiment],
                  confidence: float = ReportParams().confidence, min_n: int = ReportParams().min_group_n) -> list[Section]:
    """The page: headline card, summary, warnings, grouped table, per-experiment table, per-group heatmaps,
    validation curves. ``confidence``, ``min_n``: the Wilson intervals' level and the small-group mark."""
    c = comparison
    worst = {e.name: worst_groups(e, confidence) for e in c.experiments}
    summary: list[Block] = [Text(
        f"{len(c.experiments)} experiments from {c.source}{' (' + c.filters + ')' if c.filters else ''}, compared "
        f"{dt.datetime.now().isoformat(timespec='seconds')}. Params that differ: "
        + (", ".join(f"`{k}`" for k in c.params) or "none") + ". Test split; accuracies in %.")]
    summary += [Text(line.strip()) for line in difference_lines(c)[:1]]
    if c.differences:
        summary.append(differences_table(c))
    following = next_text(c)
    if following:
        summary.append(Text("Next" + following[len("next"):] + "."))
    if c.without_results:
        summary.append(Text(f"Not finished or without results (not compared): {describe_without_results(c.without_results)}.",
                            note=True))
    elsewhere = other_commits_text(c)
    if elsewhere:
        summary.append(Text(elsewhere[0].upper() + elsewhere[1:] + ".", note=True))
    summary += [Text(note[0].upper() + note[1:] + ".", note=True) for note in c.notes]

    warnings: list[Block] = []
    rows = [[e.name, stage, warning_code(m), m] for e in c.experiments for stage, ms in e.warnings.items() for m in ms]
    if rows:
        warnings.append(Text(f"{len(rows)} warnings in {len({r[0] for r in rows})} experiments.", note=True))
        warnings.append(Table(["experiment", "stage", "warning", "message"], rows, numeric=False))
    else:
        warnings.append(Text("None: no stage of these experiments reported a warning."))

    grouped = [Text(f"Grouped by {', '.join(f'`{k}`' for k in c.group_params) or 'nothing'} (every differing param "
                    "but the seed): mean ± sample standard deviation over the seeds, best first."), _table(c.groups, c.group_params, True)]
    if figure_paths.get("groups"):
        grouped.append(Figure(figure_paths["groups"][0], "Stage-2 test accuracy per group: mean ± std (bars) and each "
                              "seed (dots)."))
    worst_cells = {name: worst_cell(w.get("stage2") or w.get("erm"), min_n) for name, w in worst.items()}
    per_experiment: list[Block] = [_table(c.frame, c.params, False, worst_cells, "worst group: y, a · n · interval"),
                                   Text(f"{LEGEND}; worst group: stage 2's (ERM's where stage 2 did not run) worst test "
                                        f"group, its n and {100 * confidence:g} % Wilson interval")]
    names = ", ".join(e.name for e in chosen)
    heatmaps: list[Block] = [Figure(path, f"Test accuracy (%) per (class y, bias attribute a) of the stage-2 model "
                                    f"(ERM where stage 2 did not run); hatched: no test image; red box: the bias-aligned "
                                    f"attribute of each class; a cross: no training image (of the first experiment's "
                                    f"data).") for path in figure_paths.get("per_group", [])]
    curves: list[Block] = [Figure(path, "Validation accuracy per epoch: worst-group (solid) and average (dashed), "
                                  "one colour per experiment; ERM left, stage 2 right.") for path in figure_paths.get("curves", [])]
    missing = figure_paths.get("missing", [])
    if len(chosen) < len(c.experiments):
        heatmaps.insert(0, Text(f"The {len(chosen)} experiments drawn: {names} (of {len(c.experiments)}; choose "
                                "with --method, --param, --last).", note=True))
    unlabelled = figure_paths.get("unlabelled", [])
    if unlabelled:
        heatmaps.append(Text(f"Per-group accuracy (class y, bias attribute a) of {', '.join(map(str, unlabelled))}: "
                             f"{NEEDS_BIAS_LABELS} (the data has none; its report shows accuracy per class and per "
                             "inferred group).", note=True))
    for blocks, what in ((heatmaps, "per-group accuracy"), (curves, "validation curves")):
        if not any(isinstance(b, Figure) for b in blocks) and not (unlabelled and blocks is heatmaps):
            blocks.append(Text(f"No {what} to draw (the files were not found for these experiments).", note=True))
    if missing:
        curves.append(Text("Not found: " + "; ".join(missing) + ".", note=True))
    return [headline_section(c, worst, confidence, min_n), Section("Summary", summary), Section("Warnings", warnings),
            Section("Grouped by everything but the seed", grouped),
            Section("Experiments", per_experiment), Section("Per-group accuracy", heatmaps),
            Section("Validation curves", curves)]


def draw(comparison: Comparison, out: Path, dpi: int = 100) -> tuple[dict[str, list[Path]], list[Experiment]]:
    """The page's figures under ``out/figures``; returns their paths (relative to ``out``) and the runs drawn."""
    chosen = comparison.experiments[:MAX_FIGURE_RUNS]
    drawn: dict[str, list] = {"groups": [], "per_group": [], "curves": [], "missing": [], "unlabelled": []}
    folder = out / "figures"
    folder.mkdir(parents=True, exist_ok=True)
    rank = rank_metric(comparison.frame)
    if rank is not None:
        prefix = rank.split("_")[0]
        points = {}
        for _, row in comparison.groups.iterrows():
            label = group_label(row, comparison.group_params)
            mask = pd.Series(True, index=comparison.frame.index)
            for key in comparison.group_params:
                mask &= comparison.frame[key] == row[key]
            values = numeric(comparison.frame)  # the needs-bias-labels marker is no point to draw
            points[label] = {f"{prefix}_{k}": values.loc[mask, f"{prefix}_{k}"].tolist()
                             for k in ("avg", "unbiased", "worst")}
        path = folder / "groups.png"
        figures.group_summary(points, [f"{prefix}_worst", f"{prefix}_unbiased", f"{prefix}_avg"],
                              {k: LABELS[k] for k in LABELS}, path, dpi)
        drawn["groups"].append(path.relative_to(out))
    panels, train_counts = [], None
    curves: dict[str, dict[str, dict[str, list[float]]]] = {"ERM": {}, "stage 2": {}}
    for experiment in chosen:
        table = None
        for model in ("stage2", "erm"):
            groups = experiment.read_json(GROUP_FILES[model]) or {}
            if (groups.get("test") or {}).get("per_group"):
                table = groups["test"]
                break
        if table is not None and isinstance(table["per_group"], str):  # data without bias labels: no group table
            drawn["unlabelled"].append(experiment.name)
        elif table is not None:
            panels.append((experiment.name, table["per_group"], table.get("group_counts")))
        else:
            drawn["missing"].append(f"per-group accuracy of {experiment.name}")
        if train_counts is None:
            train_counts = card.train_group_counts(experiment.read_json(paths.BIAS_SUMMARY))
        for model, title in (("erm", "ERM"), ("stage2", "stage 2")):
            columns = experiment.read_curves(CURVE_FILES[model])
            if columns:
                curves[title][experiment.name] = columns
    shapes = {(len(t), len(t[0]) if t else 0) for _, t, _ in panels}
    for i in range(0, len(panels), 4):
        path = folder / f"per_group_{i // 4 + 1}.png"
        figures.per_group_heatmaps(panels[i : i + 4], path, train_counts if len(shapes) == 1 else None, dpi)
        drawn["per_group"].append(path.relative_to(out))
    if any(curves.values()):
        path = folder / "curves.png"
        figures.run_curves(curves, path, dpi)
        drawn["curves"].append(path.relative_to(out))
    return drawn, chosen


MANIFEST = ".debias-compare.json"  # in the --out folder: the files compare wrote there, the only ones it replaces
PAGE_FILES = ("index.html", "compare.md", "experiments.csv", "groups.csv", "table.txt")
FIGURE_FILES = ("figures/groups.png", "figures/curves.png",
                *(f"figures/per_group_{i + 1}.png" for i in range(math.ceil(MAX_FIGURE_RUNS / 4))))


def default_out(root: Path) -> Path:
    return root / "reports" / "compare"


def written_before(out: Path) -> set[str]:
    """The files (relative to ``out``) the last comparison wrote into ``out``, from its manifest; empty without one."""
    try:
        listed = json.loads((out / MANIFEST).read_text(encoding="utf-8")).get("files", [])
    except (OSError, ValueError, AttributeError):
        return set()
    return {str(name) for name in listed if isinstance(name, str)}


def check_out(out: Path, own_folder: bool = False) -> set[str]:
    """Refuse (ValueError, one line) an ``out`` that is a file, cannot be written, or holds a file of the page's names
    that compare did not write (its manifest does not list it: a user's file, a pipeline report); return the files
    it may replace. ``own_folder``: the default ``reports/compare``, whose files are compare's (older versions wrote
    no manifest)."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file; allowed: a folder (new, or one debias compare wrote)")
    try:
        out.mkdir(parents=True, exist_ok=True)
        handle, probe = tempfile.mkstemp(prefix=".write-probe.", dir=out)
        os.close(handle)
        os.unlink(probe)
    except OSError as exc:
        raise ValueError(f"--out {out}: cannot write there ({exc.strerror}); choose a writable folder") from None
    owned = written_before(out) | (set(PAGE_FILES + FIGURE_FILES) if own_folder else set())
    foreign = [name for name in (*PAGE_FILES, *FIGURE_FILES) if (out / name).exists() and name not in owned]
    if foreign:
        raise ValueError(f"--out {out} holds {', '.join(foreign[:5])}{' and more' if len(foreign) > 5 else ''}, which "
                         f"debias compare did not write (its {MANIFEST} does not list them); it never replaces other "
                         "files: choose another folder (default: reports/compare)")
    return owned


def write_page(comparison: Comparison, out: Path, title: str = "debias: experiments compared",
               own_folder: bool = False, report: ReportParams | None = None) -> dict[str, Path]:
    """``out/index.html`` (self-contained), ``out/compare.md``, ``out/experiments.csv``, ``out/groups.csv`` and
    the figures, into a folder :func:`check_out` accepts; figures the last comparison there wrote and this one did
    not are removed (its manifest lists them), nothing else. Returns the written files by name. ``report``: the
    intervals' level and small-group mark (params.yaml's ``report`` section; the schema's defaults without one)."""
    owned = check_out(out, own_folder)
    report = report or ReportParams()
    figure_paths, chosen = draw(comparison, out)
    sections = page_sections(comparison, figure_paths, chosen, report.confidence, report.min_group_n)
    written = {"html": out / "index.html", "md": out / "compare.md", "experiments": out / "experiments.csv",
               "groups": out / "groups.csv", "text": out / "table.txt"}
    with atomic_path(written["html"]) as tmp:
        tmp.write_text(render_html(title, sections, out, PAGE_STYLE), encoding="utf-8")
    with atomic_path(written["md"]) as tmp:
        tmp.write_text(render_markdown(title, sections, out, out), encoding="utf-8")
    with atomic_path(written["experiments"]) as tmp:
        comparison.frame.to_csv(tmp, index=False)
    with atomic_path(written["groups"]) as tmp:
        comparison.groups.to_csv(tmp, index=False)
    with atomic_path(written["text"]) as tmp:
        tmp.write_text(terminal_text(comparison), encoding="utf-8")
    for paths in figure_paths.values():
        for i, path in enumerate(paths):
            if isinstance(path, Path):
                written[f"figure:{path.stem}"] = out / path
    names = sorted(str(path.relative_to(out)) for path in written.values())
    for stale in sorted(owned - set(names)):  # an older comparison's figures (fewer runs drawn now), and only those
        if stale in PAGE_FILES + FIGURE_FILES:
            (out / stale).unlink(missing_ok=True)
    with atomic_path(out / MANIFEST) as tmp:
        tmp.write_text(json.dumps({"written_by": "debias compare", "files": names}, indent=1), encoding="utf-8")
    return written
