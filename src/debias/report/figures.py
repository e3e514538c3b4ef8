"""Figures written as static PNGs (they render offline, in the report and in MLflow).

Every function draws one figure from plain inputs (lists, tensors) and writes it atomically with
:func:`save_figure`; none reads pipeline files, so each is testable on its own. torch is imported only by
the functions that need it (``debias compare`` draws without it, seconds faster to start).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from debias.core.errors import NEEDS_BIAS_LABELS  # noqa: E402
from debias.core.io import atomic_path  # noqa: E402

if TYPE_CHECKING:
    import torch

    from debias.data.store import BiasedSplit


def save_figure(fig: "plt.Figure", path: str | Path, dpi: int = 110) -> None:
    """Write ``fig`` to ``path`` as PNG (atomically) and close it."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=dpi, bbox_inches="tight", format="png")
    plt.close(fig)


STRIP_GAP = 0.2  # the blank between two images of a row, in image widths (matplotlib's default ``wspace``)


def strip_cell_left(slot: int, width: int, gap: float = STRIP_GAP) -> int:
    """The first pixel column of cell ``slot`` in an :func:`image_strip` of images ``width`` pixels wide."""
    return slot * (width + round(gap * width))


def image_strip(cells: dict[int, np.ndarray], slots: int, height: int, width: int,
                gap: float = STRIP_GAP) -> np.ndarray:
    """A row of ``slots`` equal cells as one RGBA image (one ``imshow`` and one axes per row, not one per image):
    ``cells[k]`` (a uint8 [height, width, 3] image) in cell k from :func:`strip_cell_left`, the empty cells and the
    gaps between cells transparent."""
    left = [strip_cell_left(k, width, gap) for k in range(slots)]
    strip = np.zeros((height, left[-1] + width, 4), dtype=np.uint8)
    for slot, image in cells.items():
        strip[:, left[slot] : left[slot] + width, :3] = image
        strip[:, left[slot] : left[slot] + width, 3] = 255
    return strip


def strip_axes(rows: int, figsize: tuple[float, float]) -> tuple["plt.Figure", list["plt.Axes"]]:
    """A figure of ``rows`` axes, one per image strip, without ticks or frame."""
    fig, axes = plt.subplots(rows, 1, figsize=figsize, squeeze=False)
    for ax in axes[:, 0]:
        ax.set_xticks([])
        ax.set_yticks([])
        for spine in ax.spines.values():
            spine.set_visible(False)
    return fig, list(axes[:, 0])


def sample_grid(split: BiasedSplit, path: str | Path, per_group: int = 3, seed: int = 0) -> None:
    """Rows = classes, column blocks = bias attributes, ``per_group`` random images per cell (blank if empty).
    Without bias labels: one block of ``2 * per_group`` images per class, titled as needing them. Each row is one
    :func:`image_strip`."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    labelled = split.has_attribute
    blocks, per_block = (split.n_attrs, per_group) if labelled else (1, 2 * per_group)
    rows, cols = split.n_classes, blocks * per_block
    height, width = split.x.shape[-2:]
    fig, axes = strip_axes(rows, (0.55 * cols + 1, 0.55 * rows + 0.6))
    g = split.g if labelled else split.y  # without an attribute: a block per class
    for label in range(split.n_classes):
        cells = {}
        for attr in range(blocks):
            members = torch.nonzero(g == (label * split.n_attrs + attr if labelled else label)).flatten()
            chosen = members[torch.randperm(len(members), generator=generator)[:per_block]]
            for k, index in enumerate(chosen.tolist()):
                cells[attr * per_block + k] = split.x[index].permute(1, 2, 0).numpy()
        axes[label].imshow(image_strip(cells, cols, height, width))
        axes[label].set_ylabel(f"y={label}", rotation=0, labelpad=14, fontsize=8)
    for attr in range(blocks):
        axes[0].text(strip_cell_left(attr * per_block, width) - 0.5, 1.04,
                     f"a={attr}" if labelled else f"a: {NEEDS_BIAS_LABELS}", fontsize=8, ha="left", va="bottom",
                     transform=axes[0].get_xaxis_transform())
    fig.suptitle("samples per (class y, bias attribute a)" if labelled else "samples per class y (no bias attribute)",
                 fontsize=9)
    save_figure(fig, path)


def feature_summary(split: BiasedSplit, path: str | Path, seed: int = 0, top: int = 24) -> None:
    """Feature vectors have no picture: each feature's mean per (class y, bias attribute a) group, standardised
    over the split (0 = the split's mean, ±1 = one standard deviation), for the ``top`` features whose group
    means differ most; rows are the groups with their sizes, columns the features (named when the data names
    them). What the bias attribute changes in the features shows as columns whose colour flips with a."""
    import torch

    x = split.x.float()
    std = x.std(0).clamp_min(1e-8)
    z = (x - x.mean(0)) / std
    groups = [(label, attr) for label in range(split.n_classes) for attr in range(split.n_attrs)]
    present = [(label, attr) for label, attr in groups if bool(((split.y == label) & (split.a == attr)).any())]
    means = torch.stack([z[(split.y == label) & (split.a == attr)].mean(0) for label, attr in present])
    spread = means.max(0).values - means.min(0).values
    order = torch.argsort(spread, descending=True)[: min(top, x.shape[1])]
    names = split.feature_names or tuple(f"feature {i}" for i in range(x.shape[1]))
    shown = means[:, order].numpy()
    labels = [_shorten(names[i], 28) for i in order.tolist()]
    counts = split.group_counts()
    rows = [f"y={label} a={attr} (n={int(counts[label, attr])})" for label, attr in present]
    fig, ax = plt.subplots(figsize=(0.34 * len(labels) + 2.6, 0.36 * len(rows) + 2.4))
    limit = max(1.0, float(np.abs(shown).max()))
    image = ax.imshow(shown, cmap="RdBu_r", vmin=-limit, vmax=limit, aspect="auto")
    ax.set_xticks(range(len(labels)), labels, rotation=60, ha="right", fontsize=8)
    ax.set_yticks(range(len(rows)), rows, fontsize=8)
    ax.set_title(f"feature means per (class y, bias attribute a), standardised: the {len(labels)} of "
                 f"{x.shape[1]} features that differ most across groups", fontsize=9, loc="left")
    bar = fig.colorbar(image, ax=ax, fraction=0.03, pad=0.02)
    bar.ax.tick_params(labelsize=8)
    bar.set_label("group mean (standard deviations)", fontsize=8)
    save_figure(fig, path)


def _shorten(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def compact_label(text: str) -> str:
    """A group label with each dotted key cut to its last part (``stage2.cnc.temperature=0.05`` ->
    ``temperature=0.05``): cut at a width, long keys would leave labels that share one prefix and nothing else."""
    import re

    return re.sub(r"(?<![\w.])[A-Za-z_][\w]*(?:\.[A-Za-z_][\w]*)+=", lambda m: m.group(0).rsplit(".", 1)[1], text)


# --------------------------------------------------------------------------- report figures

AccuracyTable = list[list[float | None]]  # [class][attribute]; None where the group is empty


def placeholder(path: str | Path, message: str, dpi: int = 110) -> None:
    """A small PNG that says why a figure could not be drawn (so every declared output exists)."""
    fig, ax = plt.subplots(figsize=(4.0, 0.8))
    ax.axis("off")
    ax.text(0.5, 0.5, message, ha="center", va="center", fontsize=8, wrap=True)
    save_figure(fig, path, dpi=dpi)


def _category_colours(n: int) -> list:
    """n distinguishable colours: tab10 up to 10, tab20 up to 20, then evenly spaced hues."""
    if n <= 10:
        return [plt.get_cmap("tab10")(i) for i in range(n)]
    if n <= 20:
        return [plt.get_cmap("tab20")(i) for i in range(n)]
    return [plt.get_cmap("hsv")(i / n) for i in range(n)]


def _bare(ax: plt.Axes) -> None:
    ax.set_xticks([])
    ax.set_yticks([])


def per_group_heatmaps(panels: list[tuple[str, AccuracyTable, list[list[int]] | None]], path: str | Path,
                       train_counts: list[list[int]] | None = None, dpi: int = 110) -> None:
    """Accuracy per (class row, attribute column), one panel per (title, table, counts); empty cells hatched, not 0.

    ``train_counts``: the training split's images per group: each row's most frequent attribute is boxed in red
    (the bias-aligned group of the class), and a group with no training image is crossed out and labelled so (its
    accuracy is of a combination the model never saw).
    """
    aligned_attribute = [max(range(len(row)), key=row.__getitem__) for row in train_counts] if train_counts else None
    n_rows = max(len(table) for _, table, _ in panels)
    n_cols = max(len(table[0]) for _, table, _ in panels)
    cell = 0.42 if n_cols <= 6 else 0.36
    panel_in = cell * n_cols + 0.9
    fig, axes = plt.subplots(1, len(panels), figsize=(len(panels) * panel_in + 0.6, cell * n_rows + 1.0),
                             squeeze=False)
    cmap = plt.get_cmap("viridis").with_extremes(bad="white")
    image = None
    for ax, (title, table, counts) in zip(axes[0], panels):
        values = np.array([[np.nan if v is None else float(v) for v in row] for row in table])
        image = ax.imshow(np.ma.masked_invalid(values), cmap=cmap, vmin=0.0, vmax=1.0, aspect="equal")
        for (r, c), value in np.ndenumerate(values):
            if np.isnan(value):
                ax.add_patch(plt.Rectangle((c - 0.5, r - 0.5), 1, 1, fill=False, hatch="///", edgecolor="0.6", lw=0))
                continue
            label = f"{100 * value:.0f}"
            if counts is not None and n_cols <= 6:
                label += f"\nn={counts[r][c]}"
            if train_counts is not None and r < len(train_counts) and c < len(train_counts[r]) and not train_counts[r][c]:
                ax.plot([c - 0.45, c + 0.45], [r - 0.45, r + 0.45], color="orange", lw=1.0)
                ax.plot([c - 0.45, c + 0.45], [r + 0.45, r - 0.45], color="orange", lw=1.0)
                label += "\nno train" if n_cols <= 6 else ""
            ax.text(c, r, label, ha="center", va="center", fontsize=6 if n_cols <= 6 else 5,
                    color="black" if value > 0.6 else "white")
        if aligned_attribute is not None:
            for r, c in enumerate(aligned_attribute[: values.shape[0]]):
                ax.add_patch(plt.Rectangle((c - 0.5, r - 0.5), 1, 1, fill=False, edgecolor="red", lw=1.2))
        ax.set_xticks(range(values.shape[1]))
        ax.set_yticks(range(values.shape[0]))
        ax.tick_params(labelsize=7, length=0)
        ax.set_xlabel("bias attribute a", fontsize=8)
        ax.set_ylabel("class y", fontsize=8)
        ax.set_title(wrap_title(title, panel_in - 0.5), fontsize=TITLE_FONT)
    if image is not None:
        bar = fig.colorbar(image, ax=list(axes[0]), fraction=0.025, pad=0.02)
        bar.ax.tick_params(labelsize=7)
        bar.set_label("test accuracy", fontsize=8)
    save_figure(fig, path, dpi=dpi)


LEGEND_FONT = 8  # legends and tick labels: readable at the report's width
TITLE_FONT = 9
CHAR_EM = 0.55  # mean width of a DejaVu Sans character, in ems (for wrapping titles to their panel)


def wrap_title(text: str, width_in: float, fontsize: float = TITLE_FONT) -> str:
    """``text`` wrapped to lines that fit ``width_in`` inches at ``fontsize`` points (titles of side-by-side panels
    otherwise run into each other)."""
    import textwrap

    return "\n".join(textwrap.wrap(text, max(8, int(width_in * 72 / (CHAR_EM * fontsize))))) or text


def _scatter_by(ax: plt.Axes, coords: torch.Tensor, labels: torch.Tensor, name: str, legend: bool,
                colours: list | None = None) -> None:
    """Scatter coloured by ``labels`` (``colours[value]`` when given, e.g. the bias protocol's own colours)."""
    n = int(labels.max()) + 1 if labels.numel() else 0
    colours = colours if colours is not None and len(colours) >= n else _category_colours(max(n, 1))
    for value in range(n):
        mask = labels == value
        if bool(mask.any()):
            ax.scatter(coords[mask, 0], coords[mask, 1], s=5, color=colours[value], label=f"{name}={value}",
                       linewidths=0, alpha=0.85, rasterized=True)
    if legend and 0 < n <= 12:
        ax.legend(fontsize=LEGEND_FONT, markerscale=3, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False,
                  handletextpad=0.2, borderaxespad=0.2)


def rgb_colours(colours: list[list[int]] | None) -> list[tuple[float, float, float]] | None:
    """0..255 RGB triples (a bias protocol's palette) as matplotlib colours."""
    return None if not colours else [tuple(channel / 255 for channel in colour[:3]) for colour in colours]


def umap_grid(columns: list[tuple[str, dict[str, torch.Tensor]]], path: str | Path, dpi: int = 110,
              attribute_colours: list[list[int]] | None = None) -> None:
    """UMAP scatter: one column per (title, payload with coords [n,2], y, a); rows coloured by class, by bias attribute.

    ``attribute_colours`` (0..255 RGB, one per attribute value): the colours the bias protocol paints, so the
    bottom row shows an attribute in the colour the images have; else tab10."""
    panel_in = 3.3
    fig, axes = plt.subplots(2, len(columns), figsize=(panel_in * len(columns) + 1.2, 5.8), squeeze=False)
    for col, (title, payload) in enumerate(columns):
        index = figure_subset(len(payload["coords"]), FIGURE_MAX_POINTS)  # evaluate.umap.max_points may be large
        coords = payload["coords"][index].float()
        for row, (key, name) in enumerate((("y", "y"), ("a", "a"))):
            ax = axes[row, col]
            if key not in payload:  # no bias labels: say so where the attribute's colours would be
                ax.text(0.5, 0.5, f"bias attribute a:\n{NEEDS_BIAS_LABELS}", ha="center", va="center", fontsize=9,
                        transform=ax.transAxes)
                _bare(ax)
                continue
            _scatter_by(ax, coords, payload[key][index].long(), name, legend=col == len(columns) - 1,
                        colours=rgb_colours(attribute_colours) if key == "a" else None)
            _bare(ax)
            if col == 0:  # what a row shows, once, beside it; the model once, above its column (titles never meet)
                ax.set_ylabel(f"coloured by {'class y' if key == 'y' else 'bias attribute a'}", fontsize=9)
        axes[0, col].set_title(wrap_title(title, panel_in), fontsize=TITLE_FONT)
    fig.tight_layout()
    save_figure(fig, path, dpi=dpi)


def training_curves(curves: dict[str, dict[str, list[float]]], selected: dict[str, int | None], path: str | Path,
                    dpi: int = 110) -> None:
    """Training loss and validation worst-group (solid) / average (dashed) accuracy per epoch, one line per model.

    ``curves[model]`` maps CSV columns (``epoch``, ``train/loss``, ``val/worst_group``, ``val/avg``) to values;
    ``selected[model]`` marks the kept epoch.
    """
    from matplotlib.lines import Line2D

    fig, (loss_ax, acc_ax) = plt.subplots(1, 2, figsize=(9.0, 3.2))
    colours = _category_colours(max(len(curves), 1))
    for colour, (model, columns) in zip(colours, curves.items()):
        epochs = columns.get("epoch", [])
        if "train/loss" in columns:
            loss_ax.plot(epochs, columns["train/loss"], color=colour, marker=".", label=model)
        for key, style in (("val/worst_group", "-"), ("val/avg", "--")):
            if key in columns:
                acc_ax.plot(epochs, columns[key], style, color=colour, marker="." if style == "-" else None)
        if selected.get(model) is not None:
            for ax in (loss_ax, acc_ax):
                ax.axvline(selected[model], color=colour, lw=0.8, ls=":")
    loss_ax.set_title("training loss", fontsize=9)
    acc_ax.set_title("validation accuracy", fontsize=9)
    acc_ax.set_ylim(-0.02, 1.02)
    for ax in (loss_ax, acc_ax):
        ax.set_xlabel("epoch", fontsize=8)
        ax.tick_params(labelsize=LEGEND_FONT)
        ax.grid(alpha=0.3)
    # One legend below both panels (inside an axis it covers the curves): the models' colours, then the line styles.
    handles = [Line2D([], [], color=colour, marker=".", label=model) for colour, model in zip(colours, curves)]
    handles += [Line2D([], [], color="0.3", ls=ls, label=label) for ls, label in
                (("-", "worst-group (validation)"), ("--", "average (validation)"), (":", "kept epoch"))]
    fig.tight_layout()
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=min(len(handles), 3),
               fontsize=LEGEND_FONT, frameon=False)
    save_figure(fig, path, dpi=dpi)


# Points one scatter figure draws at most: a 3-inch panel at 110 dpi has ~10^5 pixels, so more points only
# overplot while drawing time and PNG size keep growing with N (54k training points at paper scale).
FIGURE_MAX_POINTS = 10_000


def figure_subset(n: int, max_points: int, seed: int = 0, keep: torch.Tensor | None = None) -> torch.Tensor:
    """Sorted indices of at most ``max_points`` of ``n`` points: every ``keep`` point first (a seeded subset of
    them if they alone are too many), then a seeded random subset of the others; all ``n`` when they fit."""
    import torch

    if n <= max_points:
        return torch.arange(n)
    generator = torch.Generator().manual_seed(seed)
    keep = torch.zeros(n, dtype=torch.bool) if keep is None else keep.bool()
    chosen = torch.nonzero(keep).flatten()
    chosen = chosen[torch.randperm(len(chosen), generator=generator)[:max_points]]
    others = torch.nonzero(~keep).flatten()
    others = others[torch.randperm(len(others), generator=generator)[: max_points - len(chosen)]]
    return torch.cat([chosen, others]).sort().values


def inferred_group_umap(coords: torch.Tensor, inferred_group: torch.Tensor, minority: torch.Tensor,
                        path: str | Path, dpi: int = 110, max_points: int = FIGURE_MAX_POINTS) -> None:
    """UMAP of the training features: coloured by inferred group, and inferred minority (x) against majority.

    Above ``max_points`` points the figure draws a seeded subset (:func:`figure_subset`) holding every inferred
    minority point it can, and says so in its titles."""
    index = figure_subset(len(coords), max_points, keep=minority)
    shown = "" if len(index) == len(coords) else f" ({len(index):,} of {len(coords):,} points)"
    coords, inferred_group, minority = coords[index], inferred_group[index], minority[index]
    fig, (group_ax, minority_ax) = plt.subplots(1, 2, figsize=(7.4, 3.1))
    coords = coords.float()
    _scatter_by(group_ax, coords, inferred_group.long(), "group", legend=True)
    group_ax.set_title(f"coloured by inferred group{shown}", fontsize=8)
    majority = ~minority.bool()
    minority_ax.scatter(coords[majority, 0], coords[majority, 1], s=4, color="0.7", linewidths=0,
                        label="inferred majority", rasterized=True)
    minority_ax.scatter(coords[~majority, 0], coords[~majority, 1], s=14, color="crimson", marker="x",
                        linewidths=0.8, label="inferred minority")
    minority_ax.legend(fontsize=LEGEND_FONT, markerscale=1.5, frameon=False)
    minority_ax.set_title(f"inferred minority points{shown}", fontsize=8)
    for ax in (group_ax, minority_ax):
        _bare(ax)
    fig.tight_layout()
    save_figure(fig, path, dpi=dpi)


# --------------------------------------------------------------------------- comparison page figures


def group_summary(points: dict[str, dict[str, list[float]]], keys: list[str], labels: dict[str, str],
                  path: str | Path, dpi: int = 100) -> None:
    """One panel per metric ``keys`` (fractions): per group (rows, best first) the mean ± sample std over its seeds
    as a bar with an error line, and each seed as a dot."""
    groups = list(points)
    fig, axes = plt.subplots(1, len(keys), figsize=(3.3 * len(keys) + 2.2, 0.42 * len(groups) + 1.3),
                             sharey=True, squeeze=False)
    for ax, key in zip(axes[0], keys):
        for row, group in enumerate(groups):
            values = np.array([v for v in points[group].get(key, []) if v is not None and not np.isnan(v)]) * 100
            if not len(values):
                continue
            mean = values.mean()
            std = values.std(ddof=1) if len(values) > 1 else 0.0
            ax.barh(row, mean, color="#9ecae1", height=0.6)
            ax.errorbar(mean, row, xerr=std, color="#08519c", capsize=3, lw=1.2)
            ax.scatter(values, np.full(len(values), row), s=14, color="black", zorder=3)
        ax.set_title(labels.get(key, key), fontsize=9)
        ax.set_xlim(0, 100)
        ax.tick_params(labelsize=LEGEND_FONT)
        ax.grid(axis="x", alpha=0.3)
        ax.set_xlabel("test accuracy (%)", fontsize=8)
    axes[0, 0].set_yticks(range(len(groups)), [_shorten(compact_label(g), 40) for g in groups], fontsize=LEGEND_FONT)
    axes[0, 0].invert_yaxis()
    fig.tight_layout()
    save_figure(fig, path, dpi=dpi)


def run_curves(curves: dict[str, dict[str, dict[str, list[float]]]], path: str | Path, dpi: int = 100) -> None:
    """Validation accuracy per epoch, one panel per model (``curves[title][run] = CSV columns``): worst-group
    solid, average dashed, one colour per run, the same colour for a run in every panel."""
    runs = list(dict.fromkeys(run for by_run in curves.values() for run in by_run))
    colours = dict(zip(runs, _category_colours(max(len(runs), 1))))
    panels = [(title, by_run) for title, by_run in curves.items() if by_run]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels) + 1.8, 3.3), squeeze=False)
    for ax, (title, by_run) in zip(axes[0], panels):
        for run, columns in by_run.items():
            epochs = columns.get("epoch", [])
            worst = "val/worst_group" in columns  # absent without bias labels: the dashed line carries the label
            if worst:
                ax.plot(epochs, columns["val/worst_group"], "-", marker=".", color=colours[run], label=run)
            if "val/avg" in columns:
                ax.plot(epochs, columns["val/avg"], "--", color=colours[run], label=None if worst else run)
        ax.set_title(f"{title}: validation accuracy (solid: worst-group, dashed: average)", fontsize=9)
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel("epoch", fontsize=8)
        ax.tick_params(labelsize=LEGEND_FONT)
        ax.grid(alpha=0.3)
    axes[0, -1].legend(fontsize=LEGEND_FONT, frameon=False, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    save_figure(fig, path, dpi=dpi)
