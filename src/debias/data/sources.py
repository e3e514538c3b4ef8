"""Data sources behind a registry: each returns grey (or RGB) uint8 images and labels per split.

``digits``  scikit-learn's bundled 8x8 handwritten digits, resized (offline; the default).
``mnist``   torchvision's MNIST, downloaded into ``data/raw/mnist`` (offline when the raw
            idx files are already there); validation carved from the official train split.
``npz``     a local ``.npz`` with ``x`` uint8 ``[N,H,W]`` or ``[N,H,W,3]``, ``y`` int and
            optionally ``a`` int (a bias attribute, for ``bias.protocol: given``).

Every source's splits are made here, with a fixed seed: digits and npz stratified by class.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from debias.params import DataParams

SPLITS = ("train", "val", "test")


class DataSourceError(RuntimeError):
    """A data source cannot provide its data; the message says which parameter to change."""


@dataclass
class RawSplit:
    """Images ``x`` uint8 ``[N,H,W]`` (grey) or ``[N,H,W,3]`` (RGB), labels ``y`` int64, optional attribute ``a``."""

    x: np.ndarray
    y: np.ndarray
    a: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.y)

    def take(self, index: np.ndarray) -> "RawSplit":
        return RawSplit(self.x[index], self.y[index], None if self.a is None else self.a[index])


RawSplits = dict[str, RawSplit]
SourceFn = Callable[[DataParams, Path, int], RawSplits]
SOURCES: dict[str, SourceFn] = {}


def register_source(name: str) -> Callable[[SourceFn], SourceFn]:
    def decorate(fn: SourceFn) -> SourceFn:
        SOURCES[name] = fn
        return fn

    return decorate


# --------------------------------------------------------------------------- helpers


def resize_images(x: np.ndarray, size: int) -> np.ndarray:
    """Bilinear (antialiased) resize of uint8 ``[N,H,W]`` or ``[N,H,W,3]`` to ``size`` x ``size``."""
    if x.shape[1] == size and x.shape[2] == size:
        return x
    t = torch.from_numpy(np.ascontiguousarray(x)).float()
    rgb = t.ndim == 4
    t = t.permute(0, 3, 1, 2) if rgb else t.unsqueeze(1)
    t = F.interpolate(t, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
    t = t.round().clamp_(0, 255).to(torch.uint8)
    t = t.permute(0, 2, 3, 1) if rgb else t.squeeze(1)
    return t.contiguous().numpy()


def stratified_split(y: np.ndarray, val_fraction: float, test_fraction: float, seed: int) -> dict[str, np.ndarray]:
    """Indices per split, the same fractions within every class, shuffled with ``seed``."""
    rng = np.random.default_rng(seed)
    parts: dict[str, list[np.ndarray]] = {name: [] for name in SPLITS}
    for label in np.unique(y):
        members = rng.permutation(np.flatnonzero(y == label))
        n_test = int(round(len(members) * test_fraction))
        n_val = int(round(len(members) * val_fraction))
        parts["test"].append(members[:n_test])
        parts["val"].append(members[n_test : n_test + n_val])
        parts["train"].append(members[n_test + n_val :])
    return {name: np.sort(np.concatenate(idx)) for name, idx in parts.items()}


def split_by_index(data: RawSplit, params: DataParams, seed: int) -> RawSplits:
    index = stratified_split(data.y, params.val_fraction, params.test_fraction, seed)
    return {name: data.take(idx) for name, idx in index.items()}


def cap_splits(splits: RawSplits, cap: int | None, seed: int) -> RawSplits:
    """Keep at most ``cap`` images per split (a seeded random subset, order preserved)."""
    if cap is None:
        return splits
    rng = np.random.default_rng(seed)
    out: RawSplits = {}
    for name, split in splits.items():
        if len(split) > cap:
            split = split.take(np.sort(rng.choice(len(split), cap, replace=False)))
        out[name] = split
    return out


# --------------------------------------------------------------------------- sources


@register_source("digits")
def digits_source(params: DataParams, raw_dir: Path, seed: int) -> RawSplits:
    """scikit-learn's 1,797 8x8 digits (grey 0..16), scaled to 0..255 and resized."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = np.round(bunch.images * (255.0 / 16.0)).astype(np.uint8)
    data = RawSplit(resize_images(x, params.image_size), bunch.target.astype(np.int64))
    return split_by_index(data, params, seed)


@register_source("mnist")
def mnist_source(params: DataParams, raw_dir: Path, seed: int) -> RawSplits:
    """torchvision MNIST into ``raw_dir``; validation = a seeded subset of the official train split."""
    from torchvision.datasets import MNIST

    root = raw_dir / "mnist"
    try:
        train = MNIST(str(root), train=True, download=True)
        test = MNIST(str(root), train=False, download=True)
    except Exception as exc:  # URLError, HTTPError, checksum failures, ...
        raise DataSourceError(
            f"data.source=mnist: MNIST could not be downloaded into {root} ({type(exc).__name__}: {exc}). "
            f"Without network, put the four official idx files (train-images-idx3-ubyte.gz, ..., or uncompressed) into {root}/MNIST/raw/, "
            "or use data.source=npz with data.path pointing at a local .npz (x uint8 [N,H,W], y int)."
        ) from None
    x_train, y_train = train.data.numpy(), train.targets.numpy().astype(np.int64)
    if params.mnist_val_size >= len(y_train):
        raise DataSourceError(
            f"data.mnist_val_size = {params.mnist_val_size} must be smaller than the {len(y_train)} training images"
        )
    order = np.random.default_rng(seed).permutation(len(y_train))
    val_idx, train_idx = np.sort(order[: params.mnist_val_size]), np.sort(order[params.mnist_val_size :])
    full = RawSplit(resize_images(x_train, params.image_size), y_train)
    return {
        "train": full.take(train_idx),
        "val": full.take(val_idx),
        "test": RawSplit(resize_images(test.data.numpy(), params.image_size), test.targets.numpy().astype(np.int64)),
    }


def read_npz(path: Path) -> RawSplit:
    """Load and check a bring-your-own ``.npz``: ``x`` uint8 [N,H,W] or [N,H,W,3], ``y`` int >= 0, optional ``a``."""
    if not path.exists():
        raise DataSourceError(f"data.path = '{path}' does not exist; point data.path at a local .npz with arrays x and y")
    try:
        archive = np.load(path, allow_pickle=False)
        arrays = {key: archive[key] for key in archive.files}
    except Exception as exc:
        raise DataSourceError(f"data.path = '{path}' is not a readable .npz ({type(exc).__name__}: {exc})") from None
    missing = [key for key in ("x", "y") if key not in arrays]
    if missing:
        raise DataSourceError(f"data.path = '{path}' lacks array(s) {missing}; it holds {sorted(arrays)} (need x and y)")
    x, y, a = arrays["x"], arrays["y"], arrays.get("a")
    if x.dtype != np.uint8:
        if np.issubdtype(x.dtype, np.floating) and np.isnan(x).any():
            raise DataSourceError(f"data.path = '{path}': x holds NaN values; x must be uint8 images in 0..255")
        raise DataSourceError(f"data.path = '{path}': x has dtype {x.dtype}; allowed: uint8 images in 0..255")
    if not (x.ndim == 3 or (x.ndim == 4 and x.shape[-1] == 3)):
        raise DataSourceError(f"data.path = '{path}': x has shape {x.shape}; allowed: [N,H,W] or [N,H,W,3]")
    if x.shape[1] != x.shape[2]:
        raise DataSourceError(f"data.path = '{path}': images are {x.shape[1]}x{x.shape[2]}; allowed: square images")
    for name, labels in (("y", y), ("a", a)):
        if labels is None:
            continue
        if labels.ndim != 1 or len(labels) != len(x):
            raise DataSourceError(f"data.path = '{path}': {name} has shape {labels.shape}; need [{len(x)}] (one per image)")
        if not np.issubdtype(labels.dtype, np.integer):
            raise DataSourceError(f"data.path = '{path}': {name} has dtype {labels.dtype}; allowed: integers")
        if labels.min(initial=0) < 0:
            raise DataSourceError(f"data.path = '{path}': {name} holds negative values (min {labels.min()}); allowed: 0, 1, ...")
    if len(x) == 0:
        raise DataSourceError(f"data.path = '{path}' holds no images")
    return RawSplit(x, y.astype(np.int64), None if a is None else a.astype(np.int64))


@register_source("npz")
def npz_source(params: DataParams, raw_dir: Path, seed: int) -> RawSplits:
    """A local .npz, split stratified by class."""
    assert params.path is not None  # the schema requires it for this source
    data = read_npz(Path(params.path))
    data = RawSplit(resize_images(data.x, params.image_size), data.y, data.a)
    return split_by_index(data, params, seed)


def load_source(params: DataParams, raw_dir: Path, seed: int) -> RawSplits:
    """Run the registered source named by ``data.source``, then check every split is usable."""
    if params.source not in SOURCES:
        raise DataSourceError(f"data.source = '{params.source}' is unknown; allowed: {sorted(SOURCES)}")
    splits = cap_splits(SOURCES[params.source](params, raw_dir, seed), params.max_per_split, seed)
    for name in SPLITS:
        if name not in splits or len(splits[name]) == 0:
            raise DataSourceError(
                f"split '{name}' is empty for data.source = '{params.source}'; "
                "raise data.val_fraction / data.test_fraction or provide more images"
            )
    return splits
