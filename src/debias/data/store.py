"""Biased split files: uint8 images ``[N,3,H,W]`` with class, bias attribute, group and alignment.

``g = y * n_attrs + a``; ``aligned`` is true where ``a`` equals the attribute correlated
with ``y``. Raw splits (before bias) hold grey or RGB images and labels only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from debias.data.sources import RawSplit, RawSplits
from debias.io import CorruptFileError, load_torch, save_torch

SPLIT_KEYS = ("x", "y", "a", "g", "aligned", "n_classes", "n_attrs")


@dataclass
class BiasedSplit:
    """One split of a biased dataset, held in memory as tensors."""

    x: torch.Tensor  # uint8 [N, 3, H, W]
    y: torch.Tensor  # int64 [N] class
    a: torch.Tensor  # int64 [N] bias attribute
    aligned: torch.Tensor  # bool [N]
    n_classes: int
    n_attrs: int

    @property
    def g(self) -> torch.Tensor:
        """Group index ``y * n_attrs + a``."""
        return self.y * self.n_attrs + self.a

    @property
    def n_groups(self) -> int:
        return self.n_classes * self.n_attrs

    def __len__(self) -> int:
        return int(self.y.numel())

    def group_counts(self) -> torch.Tensor:
        """Counts per (class, attribute): int64 ``[n_classes, n_attrs]``."""
        return torch.bincount(self.g, minlength=self.n_groups).reshape(self.n_classes, self.n_attrs)

    def subset(self, index: torch.Tensor) -> "BiasedSplit":
        return BiasedSplit(self.x[index], self.y[index], self.a[index], self.aligned[index], self.n_classes, self.n_attrs)


def save_split(path: str | Path, split: BiasedSplit) -> None:
    save_torch(
        path,
        {
            "x": split.x, "y": split.y, "a": split.a, "g": split.g, "aligned": split.aligned,
            "n_classes": split.n_classes, "n_attrs": split.n_attrs,
        },
        kind="biased-split",
    )


def load_split(path: str | Path) -> BiasedSplit:
    """Load a biased split file and check its tensors agree with each other."""
    payload = load_torch(path, "biased-split", SPLIT_KEYS)
    split = BiasedSplit(
        payload["x"], payload["y"], payload["a"], payload["aligned"], int(payload["n_classes"]), int(payload["n_attrs"])
    )
    n = len(split)
    if split.x.dtype != torch.uint8 or split.x.ndim != 4 or split.x.shape[0] != n:
        raise CorruptFileError(f"{path}: x must be uint8 [N,3,H,W] with N = {n}, found {tuple(split.x.shape)} {split.x.dtype}")
    if not torch.equal(payload["g"], split.g):
        raise CorruptFileError(f"{path}: stored groups disagree with y * n_attrs + a; rerun inject_bias")
    if n == 0:
        raise CorruptFileError(f"{path} holds an empty split; rerun inject_bias with more data")
    return split


def load_splits(directory: str | Path, names: tuple[str, ...] = ("train", "val", "test")) -> dict[str, BiasedSplit]:
    directory = Path(directory)
    return {name: load_split(directory / f"{name}.pt") for name in names}


def save_raw_splits(path: str | Path, splits: RawSplits) -> None:
    payload = {}
    for name, split in splits.items():
        payload[name] = {"x": torch.from_numpy(np.ascontiguousarray(split.x)), "y": torch.from_numpy(split.y)}
        if split.a is not None:
            payload[name]["a"] = torch.from_numpy(split.a)
    save_torch(path, payload, kind="raw-splits")


def load_raw_splits(path: str | Path) -> RawSplits:
    payload = load_torch(path, "raw-splits", ("train", "val", "test"))
    return {
        name: RawSplit(v["x"].numpy(), v["y"].numpy(), v["a"].numpy() if "a" in v else None)
        for name, v in payload.items()
    }
