"""The run's report: ``reports/report.md`` and a self-contained ``reports/report.html`` from every stage's outputs.

:func:`build_report` reads the files the upstream stages wrote (metrics JSON, curves CSV, run records,
UMAP payloads), draws the figures as PNGs under ``reports/figures/``, writes the per-group accuracy
CSVs for ``dvc plots`` and renders one document twice: markdown (images by relative path) and HTML
(images as base64 data URIs, inline CSS, no external reference: it opens from disk, offline).
A missing input never fails the build: its section says which file is missing and the rest is built.
The document is a list of :class:`Section` of plain blocks, so both renderers share one content.
"""

from __future__ import annotations

import base64
import csv
import html
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from debias import paths
from debias.applicability import RunContext
from debias.headline import local_selection, local_warnings, warning_code
from debias.metrics import GroupAccuracy, group_accuracies
from debias.io import atomic_path, load_json, load_torch
from debias.params import Params
from debias.report import card, figures, params_table
from debias.report.card import pct
from debias.report.paper import Comparison, compare, method_key, settings_for, strength_of
from debias.tracking import git_commit

REPORT_MD = Path("reports/report.md")
REPORT_HTML = Path("reports/report.html")
FIGURES_DIR = paths.SAMPLE_GRID.parent
FIGURE_FILES: dict[str, Path] = {
    "per_group": FIGURES_DIR / "per_group_accuracy.png",
    "umap": FIGURES_DIR / "umap_test.png",
    "curves": FIGURES_DIR / "training_curves.png",
    "groups_umap": FIGURES_DIR / "group_inference_umap.png",
}
PER_GROUP_CSV: dict[str, Path] = {"erm": paths.PLOTS / "per_group_erm.csv", "stage2": paths.PLOTS / "per_group_stage2.csv"}

JSON_INPUTS: dict[str, Path] = {
    "summary": paths.BIAS_SUMMARY,
    "erm": paths.METRICS / "erm.json",
    "erm_groups": paths.METRICS / "erm_groups.json",
    "stage2": paths.METRICS / "stage2_train.json",
    "stage2_groups": paths.METRICS / "stage2_train_groups.json",
    "stage2_info": paths.METRICS / "stage2_train_info.json",
    "probe": paths.METRICS / "probe.json",
    "representation": paths.METRICS / "representation.json",
    "groups": paths.GROUPS_METRICS,
}
CURVE_INPUTS: dict[str, Path] = {"erm": paths.PLOTS / "erm_curves.csv", "stage2": paths.PLOTS / "stage2_curves.csv"}
MODELS = ("erm", "stage2")


def umap_test_path(model: str) -> Path:
    """The evaluate stage's UMAP payload of ``model``'s test representations."""
    return paths.EVALUATE_DIR / f"umap_{model}_test.pt"


# In the order a reader needs them: the headline card, what to distrust, the results, how they came about, then
# the data, provenance and params.
SECTIONS = ("Headline", "Warnings", "Results", "Per-group accuracy", "Training curves", "Representations",
            "Group inference", "Comparison with the papers", "Dataset", "Provenance", "Params")
STAGE_ORDER = ("download", "inject_bias", "train_erm", "infer_groups", "train_contrastive", "linear_probe",
               "evaluate", "report")
FAIRKL_METHODS = frozenset({"supcon", "eps_supcon", "eps_supinfonce"})  # the stage-2 methods that add FairKL
ACCURACY_KEYS = ("avg", "unbiased", "worst_group", "aligned", "conflicting")
RESULT_HEADERS = ("", "average %", "unbiased %", "worst-group %", "worst group: y, a, n, interval", "aligned %",
                  "conflicting %", "alignment loss", "Î(Y;Z)", "Î(A;Z)")
METRIC_NAMES = {"avg": "average", "unbiased": "unbiased", "worst_group": "worst-group"}


# --------------------------------------------------------------------------- document model


@dataclass(frozen=True)
class Text:
    """A paragraph; ``note`` marks what is missing or caveated. Backticks mark code."""

    text: str
    note: bool = False
    lead: bool = False  # the line a reader should act on (bold)


@dataclass(frozen=True)
class Heading:
    """A sub-heading inside a section."""

    text: str


@dataclass(frozen=True)
class Table:
    """A table of preformatted cells."""

    headers: list[str]
    rows: list[list[str]]
    caption: str | None = None
    numeric: bool = True  # right-align cells that read as numbers
    same_rows: str | None = None  # what the rows are ("epochs"): when every row but its first cell is the same, one line


@dataclass(frozen=True)
class Figure:
    """A PNG under the report root, with a caption."""

    path: Path
    caption: str


@dataclass(frozen=True)
class Columns:
    """Blocks shown side by side in HTML, one after another in markdown."""

    blocks: list[Block]


Block = Text | Heading | Table | Figure | Columns


@dataclass
class Section:
    """A titled part of the report (a heading in md, a <section> in HTML)."""

    title: str
    blocks: list[Block] = field(default_factory=list)
    card: bool = False  # the headline card: above the table of contents, boxed


def anchor(title: str) -> str:
    """The HTML id of a section title: lower case, runs of other characters as '-'."""
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


# --------------------------------------------------------------------------- formatting


def num(value: float | None, digits: int = 3) -> str:
    """A float with ``digits`` decimals, 'n/a' for None/NaN."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:.{digits}f}"


def show(value: Any, width: int = 70) -> str:
    """A param value as written in params.yaml (JSON for lists and null), cut to ``width`` characters."""
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= width else text[: width - 1] + "…"


# --------------------------------------------------------------------------- inputs


@dataclass
class ReportInputs:
    """Everything the report reads; ``None`` where a file is missing (listed in ``missing``)."""

    json: dict[str, Any]
    curves: dict[str, dict[str, list[float]]]
    runs: dict[str, dict[str, Any]]
    umaps: dict[str, dict[str, Any]]
    train_umap: dict[str, Any] | None
    train_umap_note: str | None
    sample_grid: Path | None
    missing: list[Path]

    def get(self, name: str) -> Any:
        return self.json.get(name)


def read_curves(path: Path) -> dict[str, list[float]]:
    """A per-epoch CSV (header row, numbers) as ``{column: values}``; blank cells become NaN."""
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    columns: dict[str, list[float]] = {}
    for row in rows:
        for key, value in row.items():
            columns.setdefault(key, []).append(float(value) if value not in ("", None) else math.nan)
    return columns


def read_run_records(folder: Path) -> dict[str, dict[str, Any]]:
    """The stages' run records ``reports/runs/<stage>.json``, in pipeline order then by name; other files there
    (e.g. infer_groups' step timings) are not run records and are left out."""
    records = {p.stem: load_json(p) for p in folder.glob("*.json")} if folder.is_dir() else {}
    records = {stage: r for stage, r in records.items() if isinstance(r, dict) and r.get("stage", stage) == stage
               and "run_id" in r}
    rank = {stage: i for i, stage in enumerate(STAGE_ORDER)}
    return dict(sorted(records.items(), key=lambda item: (rank.get(item[0], len(rank)), item[0])))


def read_train_umap(root: Path) -> tuple[dict[str, Any] | None, str | None]:
    """The groups stage's UMAP of the training features joined with its inferred groups, or (None, why not)."""
    if not (root / paths.UMAP_TRAIN).exists():
        return None, f"`{paths.UMAP_TRAIN}` not found"
    payload = load_torch(root / paths.UMAP_TRAIN, "umap", ("coords", "index"))
    if payload["coords"].shape[0] == 0:
        return None, "the groups stage embedded no training features (only `groups.method: cluster` runs UMAP)"
    if not (root / paths.GROUPS_TABLE).exists():
        return None, f"`{paths.GROUPS_TABLE}` not found"
    import pandas as pd

    table = pd.read_parquet(root / paths.GROUPS_TABLE).set_index("index")
    rows = table.loc[payload["index"].numpy()]
    import torch

    return {"coords": payload["coords"][:, :2], "inferred_group": torch.tensor(rows["inferred_group"].to_numpy()),
            "minority": torch.tensor(rows["minority"].to_numpy())}, None


def load_inputs(root: Path) -> ReportInputs:
    """Read every input under ``root`` that exists; a corrupt file raises (CorruptFileError), a missing one is listed."""
    missing: list[Path] = []
    loaded: dict[str, Any] = {}
    for name, rel in JSON_INPUTS.items():
        if (root / rel).exists():
            loaded[name] = load_json(root / rel)
        else:
            missing.append(rel)
    curves = {}
    for model, rel in CURVE_INPUTS.items():
        if (root / rel).exists():
            curves[model] = read_curves(root / rel)
        else:
            missing.append(rel)
    umaps = {}
    for model in MODELS:
        rel = umap_test_path(model)
        if (root / rel).exists():
            umaps[model] = load_torch(root / rel, "umap", ("coords", "y", "a"))
        else:
            missing.append(rel)
    train_umap, train_umap_note = read_train_umap(root)
    grid = root / paths.SAMPLE_GRID
    if not grid.exists():
        missing.append(paths.SAMPLE_GRID)
    return ReportInputs(loaded, curves, read_run_records(root / paths.RUNS), umaps, train_umap, train_umap_note,
                        grid if grid.exists() else None, missing)


def missing_note(rel: Path, what: str) -> Text:
    """The note a section shows for a missing input."""
    return Text(f"Missing: `{rel}` not found, so {what}. Run the stage that writes it (`dvc repro`).", note=True)


# --------------------------------------------------------------------------- content helpers


def dvc_experiment(records: dict[str, dict[str, Any]]) -> str:
    """``$DVC_EXP_NAME`` when set, else the experiment names in the run records, else a workspace run."""
    if os.environ.get("DVC_EXP_NAME"):
        return os.environ["DVC_EXP_NAME"]
    names = sorted({r["dvc_experiment"] for r in records.values() if r.get("dvc_experiment")})
    return ", ".join(names) if names else "none (a workspace run, not `dvc exp run`)"


def stage2_method(inputs: ReportInputs, params: Params) -> str | None:
    """The stage-2 method that produced the outputs (from them), None when stage 2 has not run."""
    for name in ("stage2", "stage2_info"):
        if inputs.get(name) and inputs.get(name).get("method"):
            return inputs.get(name)["method"]
    probe = (inputs.get("probe") or {}).get("stage2") or {}
    return probe.get("method") if probe.get("trained") else None


def fairkl_weight(method: str | None, params: Params) -> float:
    """The FairKL weight that applied to ``method`` (0 for methods without the regulariser)."""
    return params.loss.fairkl_weight_for(method) if method in FAIRKL_METHODS else 0.0


def stage2_label(method: str | None, params: Params) -> str:
    """'stage 2 (cnc)', with the FairKL weight and variant where the method used it."""
    if method is None:
        return "stage 2"
    weight = fairkl_weight(method, params)
    extra = f" + FairKL λ={weight:g} ({params.loss.fairkl.variant})" if weight > 0 else ""
    return f"stage 2 ({method}{extra})"


@dataclass(frozen=True)
class ResultRow:
    """One row of the results table: test accuracies and the encoder's representation metrics."""

    label: str
    model: str
    accuracy: dict[str, Any] | None
    representation: dict[str, Any] | None
    note: str | None = None


def _trained_entry(document: dict[str, Any] | None, model: str) -> dict[str, Any] | None:
    entry = (document or {}).get(model)
    return entry if entry and entry.get("trained") else None


def result_rows(inputs: ReportInputs, labels: dict[str, str]) -> list[ResultRow]:
    """ERM, stage 2 and the two linear probes on the test split; probes share their encoder's representation."""
    rows = []
    for model in MODELS:
        rep_entry = _trained_entry(inputs.get("representation"), model)
        representation = (rep_entry or {}).get("test")
        metrics = inputs.get(model)
        accuracy = (metrics or {}).get("test")
        note = None if accuracy else f"`{JSON_INPUTS[model]}` not found"
        rows.append(ResultRow(labels[model], model, accuracy, representation, note))
    for model in MODELS:
        probe_entry = _trained_entry(inputs.get("probe"), model)
        representation = ((_trained_entry(inputs.get("representation"), model) or {}).get("test"))
        accuracy = ((probe_entry or {}).get("probe") or {}).get("test")
        if inputs.get("probe") is None:
            note = f"`{JSON_INPUTS['probe']}` not found"
        else:
            note = None if accuracy else ((inputs.get("probe").get(model) or {}).get("note") or "not trained")
        rows.append(ResultRow(f"{'ERM' if model == 'erm' else 'stage-2'} linear probe", model, accuracy,
                              representation, note))
    return rows


def worst_cell(group: GroupAccuracy | None, min_n: int) -> str:
    """'y=3, a=1 · n = 13 (< 30) · [17.7, 64.5]', or '–' without a per-group table."""
    if group is None:
        return "–"
    flag = f" (< {min_n})" if group.n < min_n else ""
    return f"{card.group_name(group)} · n = {group.n}{flag} · {card.interval_text(group.low, group.high)}"


def result_cells(row: ResultRow, worst: GroupAccuracy | None = None, min_n: int = 0) -> list[str]:
    """The formatted cells of a results row (n/a where a value is missing); ``worst``: its worst test group."""
    accuracy = row.accuracy or {}
    representation = row.representation or {}
    return [row.label, *(pct(accuracy.get(k)) for k in ACCURACY_KEYS[:3]), worst_cell(worst, min_n),
            *(pct(accuracy.get(k)) for k in ACCURACY_KEYS[3:]), num(representation.get("alignment_loss")),
            num(representation.get("mi_y")), num(representation.get("mi_a"))]


def aligned_attributes(summary: dict[str, Any] | None) -> list[int] | None:
    """Per class, the attribute most frequent in training (the bias-aligned one), None without a summary."""
    counts = (((summary or {}).get("splits") or {}).get("train") or {}).get("group_counts")
    if not counts:
        return None
    return [max(range(len(row)), key=row.__getitem__) for row in counts]


PER_GROUP_COLUMNS = ("group", "class", "attribute", "n", "accuracy", "low", "high")


def per_group_rows(table: list[list[float | None]], counts: list[list[int]] | None,
                   confidence: float) -> list[dict[str, Any]]:
    """Long format of a per-group accuracy table for ``dvc plots``: non-empty groups only (empty is blank, not 0),
    with the Wilson interval (``low``, ``high``) where the counts are known."""
    intervals = {(g.y, g.a): g for g in group_accuracies(table, counts, confidence)} if counts else {}
    rows = []
    for label, row in enumerate(table):
        for attr, value in enumerate(row):
            if value is None:
                continue
            g = intervals.get((label, attr))
            rows.append({"group": f"y={label} a={attr}", "class": label, "attribute": attr,
                         "n": counts[label][attr] if counts else "", "accuracy": round(float(value), 6),
                         "low": round(g.low, 6) if g else "", "high": round(g.high, 6) if g else ""})
    return rows


def write_csv(path: Path, rows: list[dict[str, Any]], columns: tuple[str, ...]) -> None:
    """Write ``rows`` as CSV with a header (header only for no rows), atomically."""
    with atomic_path(path) as tmp, open(tmp, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(columns))
        writer.writeheader()
        writer.writerows(rows)


# --------------------------------------------------------------------------- sections


def model_summaries(inputs: ReportInputs, labels: dict[str, str], confidence: float) -> dict[str, card.ModelSummary]:
    """ERM's and stage 2's test results with their per-group intervals (missing files give empty summaries)."""
    return {model: card.model_summary(labels[model], (inputs.get(model) or {}).get("test"),
                                      (inputs.get(f"{model}_groups") or {}).get("test"), confidence) for model in MODELS}


def headline_facts(summaries: dict[str, card.ModelSummary], by_stage: dict[str, list[str]], params: Params) -> card.Facts:
    """What the next-step rules of one run look at."""
    chosen = summaries["stage2"] if summaries["stage2"].worst_group else summaries["erm"]
    return card.Facts([(stage, m) for stage, ms in by_stage.items() for m in ms], summaries["erm"].worst,
                      summaries["stage2"].worst, chosen.worst_group, params.report.min_group_n, params.report.confidence)


def card_blocks(headers: list[str], rows: list[list[str]], warnings: str, next_line: str, caption: str) -> list[Block]:
    """The card: its table, the warnings line and the next-step line (shared with ``debias compare``'s page)."""
    return [Table(headers, rows, caption=caption, numeric=False), Text(warnings, note=warnings != "No warnings."),
            Text(f"Next: {next_line}", lead=True)]


def headline_section(summaries: dict[str, card.ModelSummary], root: Path, params: Params) -> Section:
    """ERM against stage 2 on the test split, the warnings, and what to look at next."""
    by_stage = local_warnings(root)
    headers, rows = card.card_table([summaries["erm"], summaries["stage2"]], params.report.min_group_n,
                                    params.report.confidence)
    found = [(stage, m) for stage, ms in by_stage.items() for m in ms]
    caption = (f"Test split; one run (seed {params.seed}). Intervals: Wilson score at {100 * params.report.confidence:g} % "
               "from the group's n. The worst group is the (class, attribute) cell with the lowest test accuracy.")
    return Section("Headline", card_blocks(headers, rows, card.warnings_line(found),
                                           card.next_step(headline_facts(summaries, by_stage, params)), caption),
                   card=True)


def warnings_section(root: Path) -> Section:
    """Every stage's warnings (``"warnings"`` in its metrics files), first in the report; and how each training
    stage chose its model (``"selection"``) where the stage recorded it."""
    by_stage = local_warnings(root)
    selection = local_selection(root)
    blocks: list[Block] = []
    total = sum(len(messages) for messages in by_stage.values())
    if total:
        blocks.append(Text(f"{total} warning{'s' if total > 1 else ''} from {len(by_stage)} stage"
                           f"{'s' if len(by_stage) > 1 else ''}: read them before the results.", note=True))
        blocks.append(Table(["stage", "warning", "message"],
                            [[stage, warning_code(m), m] for stage, messages in by_stage.items() for m in messages],
                            numeric=False))
    else:
        blocks.append(Text("None: no stage reported a warning."))
    if selection:
        rows = [[stage, str(s.get("rule", "")), str(s.get("selected_epoch", "")),
                 "yes" if s.get("degenerate") else "no", str(s.get("reason") or "")] for stage, s in selection.items()]
        blocks.append(Table(["stage", "selection rule", "selected epoch", "degenerate", "reason"], rows,
                            caption="How each training stage chose the epoch it kept (validation split).", numeric=False))
    return Section("Warnings", blocks)


def provenance_section(inputs: ReportInputs, params: Params, root: Path, run_id: str | None) -> Section:
    """Git commit, DVC experiment, MLflow run id and wall time per stage."""
    records = inputs.runs
    uris = sorted({r["tracking_uri"] for r in records.values() if r.get("tracking_uri")})
    blocks: list[Block] = [Table(["", ""], [
        ["git commit", git_commit(root) or "unknown (not a git repository)"],
        ["DVC experiment", dvc_experiment(records)],
        ["MLflow tracking URI", ", ".join(uris) or "none (tracking was off)"],
        ["MLflow pipeline (parent) run", ", ".join(sorted({r["parent_run_id"] for r in records.values()
                                                           if r.get("parent_run_id")})) or "none"],
    ])]
    blocks.append(Heading("Stages"))
    rows = [[stage, r.get("run_id") or "not logged", r.get("params_hash") or "", r.get("dvc_experiment") or "",
             num(r.get("wall_time_s"), 1)] for stage, r in records.items() if stage != "report"]
    total = sum(r.get("wall_time_s") or 0.0 for stage, r in records.items() if stage != "report")
    rows.append(["report (this run)", run_id or "not logged", "", os.environ.get("DVC_EXP_NAME", ""), "…"])
    blocks.append(Table(["stage", "MLflow run id", "params hash", "DVC experiment", "wall time (s)"], rows,
                        caption=f"From {paths.RUNS}/<stage>.json; total upstream wall time {total:.1f} s. A stage restored "
                                "from DVC's run-cache keeps the run id of the run that made its outputs."))
    if not records:
        blocks.append(Text(f"Missing: no run records in `{paths.RUNS}/`; stage run ids and times are unknown.", note=True))
    return Section("Provenance", blocks)


def run_context(inputs: ReportInputs, params: Params) -> RunContext:
    """The params and the protocol the run resolved (from the bias summary; None when it is missing)."""
    return RunContext(params, (inputs.get("summary") or {}).get("protocol"))


def _not_listed(keys: list[str]) -> list[Block]:
    if not keys:
        return []
    return [Text(f"Not listed: {len(keys)} param{'s' if len(keys) > 1 else ''} that do not apply to this run's source, "
                 f"protocol or methods ({', '.join(f'`{k}`' for k in keys[:6])}{', …' if len(keys) > 6 else ''}).")]


def params_section(inputs: ReportInputs, params: Params, root: Path) -> Section:
    """What this run changed against the committed params.yaml, and where the committed params depart from the
    papers' settings (the schema defaults) with params.yaml's reason; params that do not apply are left out."""
    context = run_context(inputs, params)
    blocks: list[Block] = [Heading("Changed by this run (against the committed params.yaml)")]
    text, source = params_table.committed_text(root)
    committed = None
    if text is None:
        blocks.append(Text(f"Not available: {source}, so this run's changes cannot be told from the committed "
                           "settings. Every applicable param that departs from the papers' settings is listed below.",
                           note=True))
    else:
        committed = params_table.committed_params(text)
        changed, skipped = params_table.differing(params, committed, context)
        if changed:
            blocks.append(Table(["param", "this run", "committed"],
                                [[f"`{c.key}`", show(c.value), show(c.base)] for c in changed],
                                caption=f"Against {source} (e.g. `dvc exp run -S` overrides).", numeric=False))
        else:
            blocks.append(Text(f"None: this run used the committed params.yaml ({source}) as it is."))
        blocks += _not_listed(skipped)
    blocks.append(Heading(f"Where the {'committed' if committed else 'run’s'} params depart from the papers"))
    departing, skipped = params_table.departures(committed or params, text or "", context)
    if departing:
        blocks.append(Table(["param", "committed" if committed else "this run", "papers (schema default)", "why (params.yaml)"],
                            [[f"`{c.key}`", show(c.value), show(c.base), c.reason or "no comment in params.yaml"]
                             for c in departing], numeric=False, caption=(
            "The schema's defaults in src/debias/params.py are the papers' settings; the reason is the comment "
            "params.yaml gives the param (or the comment above it in its section).")))
    else:
        blocks.append(Text("None: every applicable param has the papers' setting."))
    blocks += _not_listed(skipped)
    return Section("Params", blocks)


def dataset_section(inputs: ReportInputs, params: Params, root: Path) -> Section:
    """Split sizes and correlations, group counts per split and the sample grid."""
    summary = inputs.get("summary")
    blocks: list[Block] = []
    if summary is None:
        blocks.append(missing_note(paths.BIAS_SUMMARY, "the group counts are not shown"))
    else:
        target = summary.get("target_correlation", {})
        blocks.append(Text(f"Source `{params.data.source}`, bias protocol `{summary['protocol']}`. Realised correlation "
                           "is the fraction of bias-aligned images."))
        blocks.append(Table(
            ["split", "images", "classes × attributes", "bias-aligned", "bias-conflicting", "target correlation",
             "realised correlation", "empty groups"],
            [[name, str(s["n"]), f"{s['n_classes']} × {s['n_attrs']}", str(s["n_aligned"]), str(s["n_conflicting"]),
              num(target.get(name)), num(s["realised_correlation"]), str(s["empty_groups"])]
             for name, s in summary["splits"].items()]))
        blocks.append(Heading("Group counts per split (rows: class y, columns: bias attribute a)"))
        blocks.append(Columns([
            Table(["y \\ a", *(str(a) for a in range(s["n_attrs"]))],
                  [[str(label), *(str(c) for c in row)] for label, row in enumerate(s["group_counts"])], caption=name)
            for name, s in summary["splits"].items()]))
    if inputs.sample_grid is not None:
        tabular = (summary or {}).get("modality") == "tabular"
        blocks.append(Figure(paths.SAMPLE_GRID, (
            "Training features: each feature's mean per (class y, bias attribute a), standardised; the features whose "
            "group means differ most." if tabular else
            "Training images per (class y, bias attribute a); blank where a group is empty.")))
    else:
        blocks.append(missing_note(paths.SAMPLE_GRID, "the sample grid is not shown"))
    return Section("Dataset", blocks)


def results_section(rows: list[ResultRow], inputs: ReportInputs, summaries: dict[str, card.ModelSummary],
                    params: Params) -> Section:
    """The one results table (test split) and notes on what is missing or was skipped."""
    min_n = params.report.min_group_n
    cells = [result_cells(r, summaries[r.model].worst_group if not r.label.endswith("probe") else None, min_n)
             for r in rows]
    blocks: list[Block] = [Table(list(RESULT_HEADERS), cells, caption=(
        "Test split. Accuracies in percent: average (sample-weighted), unbiased (mean over groups), worst-group (min "
        f"over non-empty groups; its group, test images n and {100 * params.report.confidence:g} % Wilson interval), "
        "bias-aligned and bias-conflicting. Alignment loss (CNC Eq. 2–3) and mutual information "
        "Î (CNC Eq. 16, nats) of the encoder's test representations; each probe shares its encoder's."))]
    representation = _trained_entry(inputs.get("representation"), "erm") or {}
    test = representation.get("test") or {}
    if test:
        blocks.append(Text(f"For scale: H(Y) = {num(test.get('h_y'))} and H(A) = {num(test.get('h_a'))} nats on the test split."))
    for row in rows:
        if row.note:
            blocks.append(Text(f"{row.label}: {row.note}.", note=True))
    if inputs.get("representation") is None:
        blocks.append(missing_note(JSON_INPUTS["representation"], "the representation columns are n/a"))
    skipped = ((inputs.get("stage2_info") or {}).get("sampler") or {}).get("skipped_classes")
    if skipped:
        blocks.append(Text(f"Stage 2 skipped classes {skipped} as CNC anchors (no inferred minority point; "
                           f"see `{JSON_INPUTS['stage2_info']}`).", note=True))
    return Section("Results", blocks)


FAIRNESS_HEADERS = ("", "average %", "equalized-odds diff.", "equalized-odds mean", "demographic-parity diff.",
                    "accuracy diff.", "TPR / FPR per a")


def fairness_blocks(rows: list[ResultRow], inputs: ReportInputs) -> list[Block]:
    """The fairness block of binary tasks (test split): one row per results row that has it, plus each probe's
    equalized-odds post-processing; empty for tasks without it."""
    table = []
    for row in rows:
        fairness = (row.accuracy or {}).get("fairness")
        if not fairness:
            continue
        per_group = (((inputs.get(f"{row.model}_groups") or {}).get("test") or {}).get("fairness") or {}).get(
            "per_group") if not row.label.endswith("probe") else None
        rates = " · ".join(f"a={a}: {pct(g.get('tpr'))} / {pct(g.get('fpr'))}" for a, g in (per_group or {}).items())
        table.append(_fairness_cells(row.label, row.accuracy, rates or fairness.get("reason") or "–"))
        post = (((_trained_entry(inputs.get("probe"), row.model) or {}).get("probe") or {}).get("equalized_odds")
                or {}).get("test") if row.label.endswith("probe") else None
        if post and post.get("fairness"):
            table.append(_fairness_cells(f"{row.label} + equalized-odds post-processing", post, "–"))
    if not table:
        return []
    return [Heading("Fairness (binary task: sensitive attribute a)"), Table(list(FAIRNESS_HEADERS), table, caption=(
        "Test split, fairlearn's definitions: equalized-odds difference = the larger of the between-group ranges of "
        "TPR and FPR (Hardt et al.; the WCL paper's EOd, lower is better), its mean variant, demographic-parity "
        "difference (range of the selection rate) and the range of accuracy over a. TPR / FPR in percent."))]


def _fairness_cells(label: str, report: dict[str, Any], rates: str) -> list[str]:
    fairness = report["fairness"]
    return [label, pct(report.get("avg")), num(fairness.get("equalized_odds_difference")),
            num(fairness.get("equalized_odds_mean")), num(fairness.get("demographic_parity_difference")),
            num(fairness.get("accuracy_difference")), rates]


def interval_rows(summaries: dict[str, card.ModelSummary], min_n: int) -> list[list[str]]:
    """One row per non-empty test group: n and each model's accuracy with its interval; lowest stage-2 accuracy
    first (ERM's when stage 2 did not run); groups under ``min_n`` images are marked."""
    by_model = {m: {(g.y, g.a): g for g in s.groups} for m, s in summaries.items()}
    order = "stage2" if by_model["stage2"] else "erm"
    cells = sorted(by_model[order].values(), key=lambda g: (g.accuracy, g.y, g.a))

    def cell(group: GroupAccuracy | None) -> str:
        return "n/a" if group is None else f"{card.pct(group.accuracy)} {card.interval_text(group.low, group.high)}"

    return [[str(g.y), str(g.a), f"{g.n}" + (f" (< {min_n})" if g.n < min_n else ""),
             *(cell(by_model[m].get((g.y, g.a))) for m in MODELS)] for g in cells]


def per_group_section(inputs: ReportInputs, labels: dict[str, str], drawn: dict[str, bool],
                      summaries: dict[str, card.ModelSummary], params: Params) -> Section:
    """The per-group accuracy heatmaps of ERM and stage 2, and every group's accuracy with its interval and n."""
    blocks: list[Block] = []
    if drawn["per_group"]:
        blocks.append(Figure(FIGURE_FILES["per_group"], (
            "Test accuracy (%) per (class y, bias attribute a); hatched: no test image in the group (not 0); red box: "
            "the bias-aligned attribute of each class (most frequent in training). Also as CSV: "
            + ", ".join(str(p) for p in PER_GROUP_CSV.values()) + ".")))
    for model, name in (("erm", "erm_groups"), ("stage2", "stage2_groups")):
        if inputs.get(name) is None:
            blocks.append(missing_note(JSON_INPUTS[name], f"the {labels[model]} panel is not drawn"))
    rows = interval_rows(summaries, params.report.min_group_n)
    if rows:
        level = f"{100 * params.report.confidence:g} %"
        blocks.append(Table(["y", "a", "test images n", *(f"{labels[m]} % [{level}]" for m in MODELS)], rows, caption=(
            f"Every non-empty test group, lowest first: accuracy with its {level} Wilson interval; n under "
            f"{params.report.min_group_n} is marked. Also in the per-group CSVs (columns low, high).")))
    return Section("Per-group accuracy", blocks)


def representation_section(inputs: ReportInputs, labels: dict[str, str], drawn: dict[str, bool]) -> Section:
    """UMAP scatter plots and the representation metrics per encoder."""
    blocks: list[Block] = []
    if drawn["umap"]:
        blocks.append(Figure(FIGURE_FILES["umap"], "UMAP of the encoders' test representations (evaluate stage), "
                             "coloured by class (top) and by bias attribute (bottom, in the colours the bias protocol "
                             "paints where it has colours); ERM beside stage 2."))
    for model in MODELS:
        if model not in inputs.umaps:
            blocks.append(missing_note(umap_test_path(model), f"the {labels[model]} UMAP is not drawn"))
    rows = []
    for model in MODELS:
        test = (_trained_entry(inputs.get("representation"), model) or {}).get("test")
        if not test:
            continue
        distances = test.get("distances") or {}
        rows.append([labels[model], num(test.get("alignment_loss")), f"{num(test.get('mi_y'))} / {num(test.get('h_y'))}",
                     f"{num(test.get('mi_a'))} / {num(test.get('h_a'))}",
                     *(num((distances.get(kind) or {}).get("mean")) for kind in
                       ("pos_aligned", "pos_conflicting", "neg_aligned", "neg_conflicting"))])
    if rows:
        blocks.append(Table(["encoder", "alignment loss", "Î(Y;Z) / H(Y)", "Î(A;Z) / H(A)", "same y, same a",
                             "same y, other a", "other y, same a", "other y, other a"], rows, caption=(
            "Test split. Last four columns: mean squared distance between L2-normalised representations per pair "
            "kind; a bias-free encoder puts same-class pairs close whatever their attribute.")))
    elif inputs.get("representation") is None:
        blocks.append(missing_note(JSON_INPUTS["representation"], "no representation metrics are shown"))
    return Section("Representations", blocks)


def curves_section(inputs: ReportInputs, labels: dict[str, str], drawn: dict[str, bool]) -> Section:
    """Training curves of ERM and stage 2."""
    blocks: list[Block] = []
    if drawn["curves"]:
        blocks.append(Figure(FIGURE_FILES["curves"], "Training loss and validation worst-group (solid) and average "
                             "(dashed) accuracy per epoch; the dotted line marks the epoch each model kept."))
    for model, rel in CURVE_INPUTS.items():
        if model not in inputs.curves:
            blocks.append(missing_note(rel, f"the {labels[model]} curves are not drawn"))
    blocks.extend(fairkl_activity_blocks(inputs))
    return Section("Training curves", blocks)


FAIRKL_SET_NAMES = {"pos_aligned": "same y, same b", "pos_conflicting": "same y, other b",
                    "neg_aligned": "other y, same b", "neg_conflicting": "other y, other b"}


def fairkl_activity_blocks(inputs: ReportInputs) -> list[Block]:
    """FairKL's activity per epoch (stage2_train_info.json ``fairkl``): the share of steps each side was active and
    the mean pairs per batch in each of its four sets; nothing when stage 2 did not use FairKL."""
    activity = (inputs.get("stage2_info") or {}).get("fairkl")
    if not activity:
        return []
    epochs = activity["epochs"]
    explain = (f"FairKL activity (sampler `{activity['sampler']}`, batches of {activity['batch_size']}): a side (+: same "
               "class, −: different classes) contributes only in batches where both of its sets (same / other bias "
               "label b) hold at least two pairs")
    active = {(pct(e["pos_active"], 0), pct(e["neg_active"], 0)) for e in epochs}
    if len(epochs) > 1 and len(active) == 1:  # the activity never changes: one line, the pair counts summarised
        (pos, neg), = active

        def spread(name: str, label: str) -> str:
            values = [e["pairs"].get(name, 0) for e in epochs]
            return f"{label} {sum(values) / len(values):.1f} ({min(values):.1f}–{max(values):.1f})"

        pairs = ", ".join(spread(name, label) for name, label in FAIRKL_SET_NAMES.items())
        return [Text(f"{explain}. In every one of the {len(epochs)} epochs the + side was active in {pos} % and the "
                     f"− side in {neg} % of the steps; mean pairs per batch over the epochs (min–max): {pairs}.")]
    rows = [[str(e["epoch"]), pct(e["pos_active"], 0), pct(e["neg_active"], 0),
             *(f"{e['pairs'].get(name, 0):.1f}" for name in FAIRKL_SET_NAMES)] for e in epochs]
    return [Table(["epoch", "+ side active %", "− side active %", *FAIRKL_SET_NAMES.values()], rows, same_rows="epochs",
                  caption=f"{explain}; last four columns: mean pairs per batch.")]


def groups_section(inputs: ReportInputs, drawn: dict[str, bool]) -> Section:
    """Quality of the inferred groups and the UMAP of the training features when there is one."""
    groups = inputs.get("groups")
    blocks: list[Block] = []
    if groups is None:
        blocks.append(missing_note(JSON_INPUTS["groups"], "group-inference quality is not shown"))
    else:
        blocks.append(Table(["method", "matched accuracy %", "NMI", "ARI", "minority recall %", "minority precision %",
                             "inferred minority", "true bias-conflicting", "found"],
                            [[f"`{groups.get('method')}`", pct(groups.get("matched_accuracy")), num(groups.get("nmi")),
                              num(groups.get("ari")), pct(groups.get("minority_recall")),
                              pct(groups.get("minority_precision")), str(groups.get("n_inferred_minority", "n/a")),
                              str(groups.get("n_true_conflicting", "n/a")), str(groups.get("n_found_conflicting", "n/a"))]],
                            caption="Inferred bias labels of the training split against the true ones (matched accuracy "
                                    "after the best one-to-one matching); minority = inferred bias-conflicting."))
        inferred, true = groups.get("inferred_minority_per_class"), groups.get("true_conflicting_per_class")
        if inferred and true:
            blocks.append(Table(["class", *(str(c) for c in range(len(true)))],
                                [["inferred minority", *(str(v) for v in inferred)],
                                 ["true bias-conflicting", *(str(v) for v in true)]], caption="Per class"))
    if drawn["groups_umap"]:
        blocks.append(Figure(FIGURE_FILES["groups_umap"], "UMAP of the ERM training features used for group inference."))
    else:
        blocks.append(Text(f"No UMAP of the training features: {inputs.train_umap_note}.", note=True))
    return Section("Group inference", blocks)


def scale_rows(comparisons: list[Comparison], inputs: ReportInputs, params: Params,
               strength: float | None) -> list[list[str]]:
    """Paper scale against ours, one row per aspect (data, correlation, model, epochs, selection)."""
    splits = ((inputs.get("summary") or {}).get("splits")) or {}
    sizes = "/".join(f"{splits[s]['n']:,}" if s in splits else "?" for s in ("train", "val", "test"))
    realised = (splits.get("train") or {}).get("realised_correlation")
    settings = list({c.setting.key: c.setting for c in comparisons}.values())
    rows = []
    for setting in settings:
        paper_sizes = f"{setting.n_train:,}/{setting.n_val:,}/{setting.n_test:,}" if setting.n_val else \
            f"{setting.n_train:,}/none/{setting.n_test:,}"
        strengths = sorted({c.result.strength for c in comparisons if c.setting.key == setting.key}, reverse=True)
        train_n = (splits.get("train") or {}).get("n")
        share = f" ({100 * train_n / setting.n_train:.1f} % of the paper's training set)" if train_n else ""
        rows += [
            [setting.benchmark, "images (train/val/test)", f"{setting.source}: {paper_sizes}",
             f"{params.data.source}: {sizes}{share}"],
            [setting.benchmark, setting.strength_name, ", ".join(f"{s:g}" for s in strengths),
             f"{strength:g} (realised {num(realised)})" if strength is not None else "n/a"],
            [setting.benchmark, "model", setting.model, params.model.name],
            [setting.benchmark, "epochs", setting.epochs, f"ERM {params.erm.epochs}, stage 2 {params.stage2.epochs}"],
            [setting.benchmark, "model selection", setting.selection,
             f"ERM {params.erm.selection}, stage 2 {params.stage2.selection} (validation split)"],
            [setting.benchmark, "hardware / seeds", f"{setting.hardware}; mean over seeds", "this machine; one seed"],
        ]
    if any("fairkl" in c.result.matches[0] for c in comparisons if c.result.matches):
        rows.append(["", "FairKL bias labels", "true bias labels", f"`groups.method: {params.groups.method}`"])
    return rows


def paper_section(rows: list[ResultRow], inputs: ReportInputs, params: Params, labels: dict[str, str]) -> Section:
    """The papers' numbers beside ours where protocol and method match, with the scale difference; else why not."""
    if not params.report.paper_numbers:
        return Section("Comparison with the papers", [Text("Not shown: `report.paper_numbers` is false.")])
    protocol = (inputs.get("summary") or {}).get("protocol") or params.bias.protocol
    settings = settings_for(protocol)
    if not settings:
        return Section("Comparison with the papers", [Text(
            f"No paper number to compare with: the papers report the `foreground` (CMNIST*) and `background` "
            f"(Biased-MNIST) protocols, this run uses `{protocol}`.", note=True)])
    strength = strength_of(protocol, params.bias.foreground.p_corr, params.bias.background.rho)
    method = stage2_method(inputs, params)
    ours = {labels["erm"]: "erm"}
    if method is not None:
        ours[labels["stage2"]] = method_key(method, fairkl_weight(method, params))
    comparisons = compare(protocol, strength, ours)
    if not comparisons:
        return Section("Comparison with the papers", [Text(
            f"{', '.join(s.benchmark for s in settings)} ({protocol}) has no reported number for this run's methods "
            f"({', '.join(sorted(set(ours.values())))}).", note=True)])
    by_label = {r.label: r for r in rows}
    table_rows = []
    for c in comparisons:
        accuracy = by_label[c.our_row].accuracy or {}
        paper = f"{c.paper_value:.1f}" + (f" ± {c.paper_std:.1f}" if c.paper_std is not None else "")
        table_rows.append([c.setting.benchmark, c.result.method, f"{c.result.strength:g}", METRIC_NAMES[c.metric],
                           paper, c.our_row, pct(accuracy.get(c.metric))])
    blocks: list[Block] = [Table(["benchmark", "paper method", "strength", "metric", "paper %", "our row", "ours %"],
                                 table_rows, caption="; ".join(sorted({c.setting.paper for c in comparisons})))]
    if not all(c.same_strength for c in comparisons):
        strength_name = comparisons[0].setting.strength_name
        blocks.append(Text(f"Our {strength_name} = {strength:g} is not one the paper reports: its numbers are context, "
                           "not a like-for-like comparison.", note=True))
    blocks.append(Heading("Scale: the paper's run against ours"))
    blocks.append(Table(["benchmark", "", "paper", "ours"], scale_rows(comparisons, inputs, params, strength),
                        numeric=False))
    return Section("Comparison with the papers", blocks)


# --------------------------------------------------------------------------- figures


def protocol_colours(summary: dict[str, Any] | None, params: Params) -> list[list[int]] | None:
    """The colours the run's bias protocol paints attribute a with (foreground: strokes, background: backdrop),
    None for protocols without colours (corruption, given)."""
    protocol = (summary or {}).get("protocol")
    if protocol == "foreground":
        return [list(c) for c in params.bias.foreground.colours[: len(params.bias.foreground.class_digits)]]
    if protocol == "background":
        return [list(c) for c in params.bias.background.colours]
    return None


def draw_figures(inputs: ReportInputs, root: Path, labels: dict[str, str], dpi: int,
                 attribute_colours: list[list[int]] | None = None) -> dict[str, bool]:
    """Draw every report figure under ``root``; a placeholder PNG where inputs are missing. Returns name -> drawn.
    ``attribute_colours``: the bias protocol's colours, for the UMAP coloured by attribute."""
    drawn: dict[str, bool] = {}
    panels = [(labels[model], inputs.get(name)["test"]["per_group"], inputs.get(name)["test"].get("group_counts"))
              for model, name in (("erm", "erm_groups"), ("stage2", "stage2_groups"))
              if inputs.get(name) and "test" in inputs.get(name)]
    if panels:
        figures.per_group_heatmaps(panels, root / FIGURE_FILES["per_group"], aligned_attributes(inputs.get("summary")), dpi)
    else:
        figures.placeholder(root / FIGURE_FILES["per_group"], "no per-group accuracy (erm_groups.json missing)", dpi)
    drawn["per_group"] = bool(panels)

    columns = [(labels[m], inputs.umaps[m]) for m in MODELS if m in inputs.umaps and inputs.umaps[m]["coords"].shape[0]]
    if columns:
        figures.umap_grid(columns, root / FIGURE_FILES["umap"], dpi, attribute_colours=attribute_colours)
    else:
        figures.placeholder(root / FIGURE_FILES["umap"], "no UMAP of test representations (evaluate stage not run)", dpi)
    drawn["umap"] = bool(columns)

    curves = {labels[m]: inputs.curves[m] for m in MODELS if m in inputs.curves}
    selected = {labels[m]: (inputs.get(m) or {}).get("selected_epoch") for m in MODELS}
    if curves:
        figures.training_curves(curves, selected, root / FIGURE_FILES["curves"], dpi)
    else:
        figures.placeholder(root / FIGURE_FILES["curves"], "no training curves (training stages not run)", dpi)
    drawn["curves"] = bool(curves)

    train = inputs.train_umap
    if train is not None:
        figures.inferred_group_umap(train["coords"], train["inferred_group"], train["minority"],
                                    root / FIGURE_FILES["groups_umap"], dpi)
    else:
        figures.placeholder(root / FIGURE_FILES["groups_umap"], f"no UMAP of training features: {inputs.train_umap_note}", dpi)
    drawn["groups_umap"] = train is not None
    return drawn


def write_per_group_csvs(inputs: ReportInputs, root: Path, confidence: float) -> list[Path]:
    """``reports/plots/per_group_{erm,stage2}.csv`` (test split) for ``dvc plots``; header only when missing."""
    written = []
    for model, name in (("erm", "erm_groups"), ("stage2", "stage2_groups")):
        test = (inputs.get(name) or {}).get("test") or {}
        rows = per_group_rows(test["per_group"], test.get("group_counts"), confidence) if test.get("per_group") else []
        write_csv(root / PER_GROUP_CSV[model], rows, PER_GROUP_COLUMNS)
        written.append(root / PER_GROUP_CSV[model])
    return written


# --------------------------------------------------------------------------- rendering


def collapse_same_rows(table: Table) -> Block:
    """A :class:`Table` with ``same_rows`` whose rows all agree but in their first cell, as one line ('All 30 epochs
    (0–29): + side active % 100, …'); any other block unchanged."""
    if not table.same_rows or len(table.rows) < 2 or any(row[1:] != table.rows[0][1:] for row in table.rows):
        return table
    values = ", ".join(f"{h} {c}" for h, c in zip(table.headers[1:], table.rows[0][1:]))
    span = f"{table.rows[0][0]}–{table.rows[-1][0]}"
    caption = f" {table.caption}" if table.caption else ""
    return Text(f"All {len(table.rows)} {table.same_rows} ({span}) are the same: {values}.{caption}")


def alt_text(figure: Figure) -> str:
    """Short alternative text of a figure: its file name in words."""
    return figure.path.stem.replace("_", " ")


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _markdown_blocks(blocks: list[Block], md_dir: Path, root: Path) -> list[str]:
    lines: list[str] = []
    for block in blocks:
        block = collapse_same_rows(block) if isinstance(block, Table) else block
        if isinstance(block, Text):
            lines += [f"> **Note:** {block.text}" if block.note else f"**{block.text}**" if block.lead else block.text, ""]
        elif isinstance(block, Heading):
            lines += [f"### {block.text}", ""]
        elif isinstance(block, Table):
            if block.caption:
                lines += [f"*{block.caption}*", ""]
            lines.append("| " + " | ".join(_md_cell(h) for h in block.headers) + " |")
            lines.append("|" + "|".join("---" for _ in block.headers) + "|")
            lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in block.rows]
            lines.append("")
        elif isinstance(block, Figure):
            rel = os.path.relpath(root / block.path, md_dir)
            lines += [f"![{alt_text(block)}]({Path(rel).as_posix()})", "", f"*{block.caption}*", ""]
        elif isinstance(block, Columns):
            lines += _markdown_blocks(block.blocks, md_dir, root)
    return lines


def render_markdown(title: str, sections: list[Section], md_dir: Path, root: Path) -> str:
    """The report as markdown; images by path relative to ``md_dir``."""
    lines = [f"# {title}", ""]
    for section in sections:
        lines += [f"## {section.title}", ""]
        lines += _markdown_blocks(section.blocks, md_dir, root)
    return "\n".join(lines).rstrip() + "\n"


_NUMERIC = re.compile(r"^(n/a|[-+]?[\d,.]+( ± [\d.]+)?( / [-+]?[\d.]+)?|…)$")


def _inline(text: str) -> str:
    """Escape ``text`` for HTML, turn `code` spans into <code> and in-page links ``[text](#id)`` into <a>."""
    escaped = re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))
    return re.sub(r"\[([^\]]+)\]\((#[a-z0-9-]*)\)", r'<a href="\2">\1</a>', escaped)


def data_uri(path: Path) -> str:
    """A PNG file as a ``data:image/png;base64`` URI."""
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def _html_blocks(blocks: list[Block], root: Path) -> list[str]:
    out: list[str] = []
    for block in blocks:
        block = collapse_same_rows(block) if isinstance(block, Table) else block
        if isinstance(block, Text):
            css = ' class="note"' if block.note else ' class="next"' if block.lead else ""
            out.append(f"<p{css}>{_inline(block.text)}</p>")
        elif isinstance(block, Heading):
            out.append(f"<h3>{_inline(block.text)}</h3>")
        elif isinstance(block, Table):
            out.append('<div class="table"><table>')
            if block.caption:
                out.append(f"<caption>{_inline(block.caption)}</caption>")
            if any(block.headers):
                out.append("<thead><tr>" + "".join(f"<th>{_inline(h)}</th>" for h in block.headers) + "</tr></thead>")
            out.append("<tbody>")
            for row in block.rows:
                cells = "".join(f'<td class="num">{_inline(c)}</td>' if block.numeric and _NUMERIC.match(c)
                                else f"<td>{_inline(c)}</td>"
                                for c in row)
                out.append(f"<tr>{cells}</tr>")
            out.append("</tbody></table></div>")
        elif isinstance(block, Figure):
            out.append(f'<figure><img src="{data_uri(root / block.path)}" alt="{html.escape(alt_text(block))}">'
                       f"<figcaption>{_inline(block.caption)}</figcaption></figure>")
        elif isinstance(block, Columns):
            out.append('<div class="columns">' + "".join(_html_blocks(block.blocks, root)) + "</div>")
    return out


STYLE = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #222; margin: 0; background: #fafafa; }
main { max-width: 1100px; margin: 0 auto; padding: 1.5em 2em 4em; background: #fff; }
h1 { margin-top: 0; } h2 { border-bottom: 1px solid #ddd; padding-bottom: .2em; margin-top: 1.8em; }
h3 { margin: 1.2em 0 .4em; font-size: 1.02em; }
nav ol { columns: 2; margin: 0; } nav { background: #f3f5f8; padding: .6em 1em; border-radius: 4px; }
.table { overflow-x: auto; margin: .6em 0 1em; }
table { border-collapse: collapse; font-size: 13px; }
caption { caption-side: bottom; text-align: left; color: #555; font-size: 12px; padding-top: .3em; max-width: 900px; }
th, td { border: 1px solid #d8dbe0; padding: 3px 8px; vertical-align: top; }
th { background: #eef1f5; text-align: left; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
tbody tr:nth-child(even) { background: #fafbfc; }
code { background: #f1f1f1; padding: 0 3px; border-radius: 3px; font-size: 12px; }
.note { background: #fff6e0; border-left: 4px solid #e0a800; padding: .4em .8em; }
#warnings { border: 1px solid #e0a800; border-radius: 4px; padding: 0 1em .6em; margin-top: 1em; background: #fffdf5; }
#warnings h2 { border: 0; margin-top: .6em; }
.card { border: 2px solid #3b6ea8; border-radius: 6px; padding: 0 1em .6em; margin: 1em 0; background: #f5f9ff; }
.card h2 { border: 0; margin-top: .5em; } .card .table { margin-bottom: .4em; }
.next { font-weight: 600; }
figure { margin: 1em 0; } figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { color: #555; font-size: 12px; }
.columns { display: flex; flex-wrap: wrap; gap: 1.5em; align-items: flex-start; }
"""


def render_html(title: str, sections: list[Section], root: Path, style: str = "") -> str:
    """The report as one self-contained HTML page: inline CSS (``style`` added to it), images as data URIs, only
    in-page links."""
    toc = "".join(f'<li><a href="#{anchor(s.title)}">{html.escape(s.title)}</a></li>' for s in sections if not s.card)
    cards, body = [], []
    for section in sections:
        target = cards if section.card else body
        css = ' class="card"' if section.card else ""
        target.append(f'<section id="{anchor(section.title)}"{css}><h2>{html.escape(section.title)}</h2>')
        target += _html_blocks(section.blocks, root)
        target.append("</section>")
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f"<title>{html.escape(title)}</title>\n<style>{STYLE}{style}</style>\n</head>\n<body>\n<main>\n"
            f"<h1>{html.escape(title)}</h1>\n" + "".join(f"{line}\n" for line in cards)
            + f"<nav><ol>{toc}</ol></nav>\n" + "\n".join(body) + "\n</main>\n</body>\n</html>\n")


# --------------------------------------------------------------------------- entry


def report_sections(inputs: ReportInputs, params: Params, root: Path, run_id: str | None,
                    labels: dict[str, str], drawn: dict[str, bool]) -> list[Section]:
    """The report's sections, in :data:`SECTIONS` order."""
    rows = result_rows(inputs, labels)
    summaries = model_summaries(inputs, labels, params.report.confidence)
    results = results_section(rows, inputs, summaries, params)
    results.blocks.extend(fairness_blocks(rows, inputs))
    return [
        headline_section(summaries, root, params),
        warnings_section(root),
        results,
        per_group_section(inputs, labels, drawn, summaries, params),
        curves_section(inputs, labels, drawn),
        representation_section(inputs, labels, drawn),
        groups_section(inputs, drawn),
        paper_section(rows, inputs, params, labels),
        dataset_section(inputs, params, root),
        provenance_section(inputs, params, root, run_id),
        params_section(inputs, params, root),
    ]


def build_report(root: Path, params: Params, run_id: str | None = None) -> list[Path]:
    """Read the stage outputs under ``root``, write figures, per-group CSVs, report.md and report.html; return them."""
    root = Path(root)
    inputs = load_inputs(root)
    labels = {"erm": "ERM", "stage2": stage2_label(stage2_method(inputs, params), params)}
    drawn = draw_figures(inputs, root, labels, params.report.dpi, protocol_colours(inputs.get("summary"), params))
    written = [root / path for path in FIGURE_FILES.values()] + write_per_group_csvs(inputs, root, params.report.confidence)
    sections = report_sections(inputs, params, root, run_id, labels, drawn)
    md_path, html_path = root / REPORT_MD, root / REPORT_HTML
    with atomic_path(md_path) as tmp:
        tmp.write_text(render_markdown(params.report.title, sections, md_path.parent, root), encoding="utf-8")
    with atomic_path(html_path) as tmp:
        tmp.write_text(render_html(params.report.title, sections, root), encoding="utf-8")
    return [md_path, html_path, *written]
