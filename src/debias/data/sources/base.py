"""The source registry and what every source shares: :class:`RawSplit`, split helpers, :func:`load_source`.

A source is a function ``(DataParams, raw_dir, seed) -> {"train", "val", "test"}`` registered under
its ``data.source`` name with :func:`register_source`; each family lives in its own module of this
package (``mnist``: digits, MNIST, npz; ``tabular``: adult, compas) and :mod:`debias.data.sources`
imports them all.

The modality lives in the data: a split's ``x`` is either uint8 images (``image``) or float32
feature vectors ``[N, F]`` (``tabular``, with optional ``feature_names``); :data:`RAW_LAYOUTS`
says what each modality allows and :func:`raw_modality` tells them apart.
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


# What ``x`` of a raw split may be, per modality (the store's checks quote these).
RAW_LAYOUTS = {"image": "uint8 images [N,H,W] or [N,H,W,3]", "tabular": "float32 features [N,F] (finite)"}


def raw_modality(x: np.ndarray) -> str | None:
    """'image' for uint8 ``[N,H,W]`` / ``[N,H,W,3]``, 'tabular' for float32 ``[N,F]``, else None."""
    if x.dtype == np.uint8 and (x.ndim == 3 or (x.ndim == 4 and x.shape[-1] == 3)):
        return "image"
    if x.dtype == np.float32 and x.ndim == 2:
        return "tabular"
    return None


@dataclass
class RawSplit:
    """``x`` uint8 images ``[N,H,W]`` / ``[N,H,W,3]`` or float32 features ``[N,F]``; labels ``y`` int64;
    optional attribute ``a`` int64; optional ``feature_names`` (one per feature column)."""

    x: np.ndarray
    y: np.ndarray
    a: np.ndarray | None = None
    feature_names: tuple[str, ...] | None = None

    def __len__(self) -> int:
        return len(self.y)

    @property
    def modality(self) -> str:
        """'image' or 'tabular' (see :data:`RAW_LAYOUTS`); anything else is a ValueError."""
        modality = raw_modality(self.x)
        if modality is None:
            raise ValueError(f"x is {self.x.dtype} {self.x.shape}; allowed: {' or '.join(RAW_LAYOUTS.values())}")
        return modality

    def take(self, index: np.ndarray) -> "RawSplit":
        return RawSplit(self.x[index], self.y[index], None if self.a is None else self.a[index], self.feature_names)


RawSplits = dict[str, RawSplit]
SourceFn = Callable[[DataParams, Path, int], RawSplits]
SOURCES: dict[str, SourceFn] = {}
# The bias protocol each source's data calls for (``bias.protocol: auto`` resolves through it):
# ``foreground`` for grey digits, ``given`` where the data carries its own bias attribute.
SOURCE_PROTOCOLS: dict[str, str] = {}


def register_source(name: str, protocol: str = "foreground") -> Callable[[SourceFn], SourceFn]:
    """Register ``fn`` as ``data.source = name``; ``protocol`` is the bias protocol its data calls for."""
    def decorate(fn: SourceFn) -> SourceFn:
        SOURCES[name] = fn
        SOURCE_PROTOCOLS[name] = protocol
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


def random_split(n: int, val_fraction: float, test_fraction: float, seed: int) -> dict[str, np.ndarray]:
    """Indices per split from one seeded permutation of ``range(n)`` (not stratified), each sorted."""
    order = np.random.default_rng(seed).permutation(n)
    n_test, n_val = int(round(n * test_fraction)), int(round(n * val_fraction))
    parts = {"test": order[:n_test], "val": order[n_test : n_test + n_val], "train": order[n_test + n_val :]}
    return {name: np.sort(parts[name]) for name in SPLITS}


def split_by_index(data: RawSplit, params: DataParams, seed: int) -> RawSplits:
    index = stratified_split(data.y, params.val_fraction, params.test_fraction, seed)
    return {name: data.take(idx) for name, idx in index.items()}


def cap_splits(splits: RawSplits, cap: int | None, seed: int) -> RawSplits:
    """Keep at most ``cap`` images (rows) per split (a seeded random subset, order preserved)."""
    if cap is None:
        return splits
    rng = np.random.default_rng(seed)
    out: RawSplits = {}
    for name, split in splits.items():
        if len(split) > cap:
            split = split.take(np.sort(rng.choice(len(split), cap, replace=False)))
        out[name] = split
    return out


def load_source(params: DataParams, raw_dir: Path, seed: int) -> RawSplits:
    """Run the registered source named by ``data.source``, then check every split is usable."""
    if params.source not in SOURCES:
        raise DataSourceError(f"data.source = '{params.source}' is unknown; allowed: {sorted(SOURCES)}")
    splits = cap_splits(SOURCES[params.source](params, raw_dir, seed), params.max_per_split, seed)
    for name in SPLITS:
        if name not in splits or len(splits[name]) == 0:
            raise DataSourceError(
                f"split '{name}' is empty for data.source = '{params.source}'; "
                "raise data.val_fraction / data.test_fraction (adult, compas: data.tabular.val_fraction / "
                "test_fraction) or provide more data"
            )
    return splits
