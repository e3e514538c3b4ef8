"""What the report reads: every stage's outputs under the workspace root (:class:`ReportInputs`; a missing file is
listed, not fatal) and what they say about the run (its stage-2 method and label)."""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from debias.core import paths
from debias.core.errors import NEEDS_BIAS_LABELS
from debias.core.io import load_json, load_torch
from debias.params import Params
from debias.report.document import Text

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
    "groups_summary": paths.GROUPS_SUMMARY,
}
CURVE_INPUTS: dict[str, Path] = {"erm": paths.PLOTS / "erm_curves.csv", "stage2": paths.PLOTS / "stage2_curves.csv"}
MODELS = ("erm", "stage2")
STAGE_ORDER = ("download", "inject_bias", "train_erm", "infer_groups", "train_contrastive", "linear_probe",
               "evaluate", "report")


def umap_test_path(model: str) -> Path:
    """The evaluate stage's UMAP payload of ``model``'s test representations."""
    return paths.EVALUATE_DIR / f"umap_{model}_test.pt"


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
    """A per-epoch CSV (header row, numbers) as ``{column: values}``; blank cells become NaN. A column that reads
    ``needs bias labels`` (data without bias labels) holds no curve and is left out: the figure draws none for it."""
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    columns: dict[str, list[float]] = {}
    unlabelled = {key for row in rows for key, value in row.items() if value == NEEDS_BIAS_LABELS}
    for row in rows:
        for key, value in row.items():
            if key not in unlabelled:
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
    """Read every input under ``root`` that exists; a corrupt file raises (CorruptFileError), a missing one is listed.
    Run by hand, so is one that does not match dvc.lock (:func:`debias.core.headline.lock_mismatches`: never read; the
    warnings say why, :func:`debias.core.headline.mismatch_warnings`); under DVC the inputs are the stage's deps as
    DVC saw them, and neither dvc.lock nor any other file is read (:func:`debias.core.headline.checks_lock`)."""
    from debias.core.headline import checks_lock, lock_mismatches

    mismatched = ({Path(name) for name in lock_mismatches(root, [*JSON_INPUTS.values(), *CURVE_INPUTS.values()])}
                  if checks_lock() else set())
    missing: list[Path] = []
    loaded: dict[str, Any] = {}
    for name, rel in JSON_INPUTS.items():
        if (root / rel).exists() and rel not in mismatched:
            loaded[name] = load_json(root / rel)
        else:
            missing.append(rel)
    curves = {}
    for model, rel in CURVE_INPUTS.items():
        if (root / rel).exists() and rel not in mismatched:
            curves[model] = read_curves(root / rel)
        else:
            missing.append(rel)
    umaps = {}
    for model in MODELS:
        rel = umap_test_path(model)
        if (root / rel).exists():
            umaps[model] = load_torch(root / rel, "umap", ("coords", "y"))  # "a" absent without bias labels
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


def trained_entry(document: dict[str, Any] | None, model: str) -> dict[str, Any] | None:
    entry = (document or {}).get(model)
    return entry if entry and entry.get("trained") else None


def stage2_method(inputs: ReportInputs, params: Params) -> str | None:
    """The stage-2 method that produced the outputs (from them), None when stage 2 has not run."""
    for name in ("stage2", "stage2_info"):
        if inputs.get(name) and inputs.get(name).get("method"):
            return inputs.get(name)["method"]
    probe = (inputs.get("probe") or {}).get("stage2") or {}
    return probe.get("method") if probe.get("trained") else None


def fairkl_weight(method: str | None, params: Params) -> float:
    """The FairKL weight that applied to ``method`` (0 for methods without the regulariser)."""
    from debias.training.methods.registry import discover

    spec = discover().get(method or "")
    return spec.fairkl_weight(params) if spec is not None and spec.fairkl_weight is not None else 0.0


def stage2_label(method: str | None, params: Params) -> str:
    """'stage 2 (cnc)', with the FairKL weight and variant where the method used it."""
    if method is None:
        return "stage 2"
    weight = fairkl_weight(method, params)
    extra = f" + FairKL λ={weight:g} ({params.loss.fairkl.variant})" if weight > 0 else ""
    return f"stage 2 ({method}{extra})"
