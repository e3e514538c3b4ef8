"""Figures written as static PNGs (they render offline, in the report and in MLflow)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from debias.data.store import BiasedSplit  # noqa: E402
from debias.io import atomic_path  # noqa: E402


def save_figure(fig: "plt.Figure", path: str | Path, dpi: int = 110) -> None:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=dpi, bbox_inches="tight", format="png")
    plt.close(fig)


def sample_grid(split: BiasedSplit, path: str | Path, per_group: int = 3, seed: int = 0) -> None:
    """Rows = classes, column blocks = bias attributes, ``per_group`` random images per cell (blank if empty)."""
    generator = torch.Generator().manual_seed(seed)
    rows, cols = split.n_classes, split.n_attrs * per_group
    fig, axes = plt.subplots(rows, cols, figsize=(0.55 * cols + 1, 0.55 * rows + 0.6), squeeze=False)
    for ax in axes.flat:
        ax.set_xticks([])
        ax.set_yticks([])
        for spine in ax.spines.values():
            spine.set_visible(False)
    g = split.g
    for label in range(split.n_classes):
        for attr in range(split.n_attrs):
            members = torch.nonzero(g == label * split.n_attrs + attr).flatten()
            chosen = members[torch.randperm(len(members), generator=generator)[:per_group]]
            for k, index in enumerate(chosen.tolist()):
                axes[label, attr * per_group + k].imshow(split.x[index].permute(1, 2, 0).numpy())
        axes[label, 0].set_ylabel(f"y={label}", rotation=0, labelpad=14, fontsize=8)
    for attr in range(split.n_attrs):
        axes[0, attr * per_group].set_title(f"a={attr}", fontsize=8, loc="left")
    fig.suptitle("samples per (class y, bias attribute a)", fontsize=9)
    save_figure(fig, path)
