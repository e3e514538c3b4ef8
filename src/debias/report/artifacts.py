"""The report's files beside the page, drawn from its inputs: the figures (PNGs under ``reports/figures/``; a
placeholder where an input is missing) and the per-group accuracy CSVs for ``dvc plots``."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from debias.core import paths
from debias.core.errors import NEEDS_BIAS_LABELS
from debias.core.io import atomic_path
from debias.metrics import group_accuracies, wilson_interval
from debias.params import Params
from debias.report import figures
from debias.report.card import train_group_counts
from debias.report.inputs import MODELS, ReportInputs

FIGURES_DIR = paths.SAMPLE_GRID.parent
FIGURE_FILES: dict[str, Path] = {
    "per_group": FIGURES_DIR / "per_group_accuracy.png",
    "umap": FIGURES_DIR / "umap_test.png",
    "curves": FIGURES_DIR / "training_curves.png",
    "groups_umap": FIGURES_DIR / "group_inference_umap.png",
    "discovered": FIGURES_DIR / "discovered_groups.png",
}
PER_GROUP_CSV: dict[str, Path] = {"erm": paths.PLOTS / "per_group_erm.csv", "stage2": paths.PLOTS / "per_group_stage2.csv"}
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


def per_class_rows(per_class: list[float | None], counts: list[int], confidence: float) -> list[dict[str, Any]]:
    """The per-group CSV's rows for data without bias labels: one per non-empty class, its attribute cell saying
    that it needs bias labels (the group of a class and an attribute cannot be formed)."""
    rows = []
    for label, (value, n) in enumerate(zip(per_class, counts)):
        if value is None or not n:
            continue
        low, high = wilson_interval(round(value * n), n, confidence)
        rows.append({"group": f"y={label}", "class": label, "attribute": NEEDS_BIAS_LABELS, "n": n,
                     "accuracy": round(float(value), 6), "low": round(low, 6), "high": round(high, 6)})
    return rows


def write_csv(path: Path, rows: list[dict[str, Any]], columns: tuple[str, ...]) -> None:
    """Write ``rows`` as CSV with a header (header only for no rows), atomically."""
    with atomic_path(path) as tmp, open(tmp, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(columns))
        writer.writeheader()
        writer.writerows(rows)


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
    unlabelled = any(isinstance(table, str) for _, table, _ in panels)  # data without bias labels
    if unlabelled:
        figures.placeholder(root / FIGURE_FILES["per_group"], f"accuracy per (class y, bias attribute a): "
                                                               f"{NEEDS_BIAS_LABELS}", dpi)
    elif panels:
        figures.per_group_heatmaps(panels, root / FIGURE_FILES["per_group"], train_group_counts(inputs.get("summary")), dpi)
    else:
        figures.placeholder(root / FIGURE_FILES["per_group"], "no per-group accuracy (erm_groups.json missing)", dpi)
    drawn["per_group"] = bool(panels) and not unlabelled

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
    drawn["discovered"] = draw_discovered(inputs, root, dpi)
    return drawn


def draw_discovered(inputs: ReportInputs, root: Path, dpi: int) -> bool:
    """The montage of the discovered groups (:mod:`debias.report.montage`) from infer_groups' summary and the
    training images; a placeholder saying why where either is missing or the data are not images."""
    from debias.report.montage import draw_discovered_groups

    path = root / FIGURE_FILES["discovered"]
    summary = inputs.get("groups_summary")
    images = root / paths.BIASED / "train.pt"
    why = None
    if not summary or not summary.get("groups"):
        why = f"no inferred groups ({paths.GROUPS_SUMMARY} not found)"
    elif not images.exists():
        why = f"no training images ({paths.BIASED / 'train.pt'} not found)"
    if why is None:
        from debias.data.store import load_split

        x = load_split(images).x
        if x.ndim != 4:
            why = "the data are feature vectors, not images"
        else:
            draw_discovered_groups(x, summary["groups"], path, dpi)
            return True
    figures.placeholder(path, why, dpi)
    return False


def write_per_group_csvs(inputs: ReportInputs, root: Path, confidence: float) -> list[Path]:
    """``reports/plots/per_group_{erm,stage2}.csv`` (test split) for ``dvc plots``; header only when missing."""
    written = []
    for model, name in (("erm", "erm_groups"), ("stage2", "stage2_groups")):
        test = (inputs.get(name) or {}).get("test") or {}
        if isinstance(test.get("per_group"), str) and test.get("per_class"):  # no bias labels: per class
            rows = per_class_rows(test["per_class"], test["class_counts"], confidence)
        else:
            rows = per_group_rows(test["per_group"], test.get("group_counts"), confidence) if test.get("per_group") else []
        write_csv(root / PER_GROUP_CSV[model], rows, PER_GROUP_COLUMNS)
        written.append(root / PER_GROUP_CSV[model])
    return written
