"""Split files: raw splits (``download``) and biased splits (``inject_bias``), checked on save and load.

The modality lives in the data: ``x`` is either images or feature vectors, one code path for both.
- raw splits (one file, ``data/raw/splits.pt``): ``x`` uint8 ``[N,H,W]`` / ``[N,H,W,3]`` or float32
  ``[N,F]``, labels ``y``, optional attribute ``a`` and feature names; the file records which
  ``data.source`` produced it and the bias protocol that source registered (``bias.protocol: auto`` resolves
  through it, so inject_bias needs no source module).
- biased splits (``data/biased/{split}.pt``): ``x`` uint8 ``[N,3,H,W]`` (``image``) or float32 ``[N,F]``
  (``tabular``), class ``y``, bias attribute ``a``, group ``g = y * n_attrs + a`` and ``aligned``
  (``a`` equals the attribute correlated with ``y``), optional feature names. Without bias labels
  (``bias.protocol: none``) ``a``, ``g`` and ``aligned`` are stored as None and ``n_attrs`` is 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from debias.core.errors import NEEDS_BIAS_LABELS, NeedsBiasLabels
from debias.core.io import CorruptFileError, load_torch, save_torch
from debias.core.io import CorruptFileError, load_torch, save_torch
from debias.data.raw import RAW_LAYOUTS, SPLITS, RawSplit, RawSplits, raw_modality

SPLIT_KEYS = ("x", "y", "a", "g", "aligned", "n_classes", "n_attrs")
# What ``x`` of a biased split may be, per modality (the checks quote these).
BIASED_LAYOUTS = {"image": "uint8 images [N,3,H,W]", "tabular": "float32 features [N,F] (finite)"}


def biased_modality(x: torch.Tensor) -> str | None:
    """'image' for uint8 ``[N,3,H,W]``, 'tabular' for float32 ``[N,F]``, else None."""
    if x.dtype == torch.uint8 and x.ndim == 4 and x.shape[1] == 3:
        return "image"
    if x.dtype == torch.float32 and x.ndim == 2:
        return "tabular"
    return None


def check_x(x: torch.Tensor | np.ndarray, n: int, where: str | Path, layouts: dict[str, str]) -> str:
    """The modality of ``x`` (N rows, a layout of ``layouts``, finite features); else a CorruptFileError naming ``where``."""
    modality = raw_modality(x) if isinstance(x, np.ndarray) else biased_modality(x)
    allowed = " or ".join(layouts.values())
    if modality is None or x.shape[0] != n:
        raise CorruptFileError(f"{where}: x is {x.dtype} {tuple(x.shape)}; allowed: {allowed}, with N = {n} (one per label)")
    finite = np.isfinite(x).all() if isinstance(x, np.ndarray) else torch.isfinite(x).all()
    if modality == "tabular" and not bool(finite):
        raise CorruptFileError(f"{where}: x holds NaN or infinite features; allowed: {allowed}")
    return modality


@dataclass
class BiasedSplit:
    """One split of a biased dataset, held in memory as tensors.

    Data without bias labels (``bias.protocol: none``) has ``a`` and ``aligned`` None and ``n_attrs`` 0: there is
    no attribute, and :attr:`g`, :meth:`group_counts` raise :class:`~debias.core.errors.NeedsBiasLabels` rather than
    stand in a fake one (an all-zero attribute would make worst-group accuracy the average's twin, silently)."""

    x: torch.Tensor  # uint8 [N, 3, H, W] images or float32 [N, F] features
    y: torch.Tensor  # int64 [N] class
    a: torch.Tensor | None  # int64 [N] bias attribute; None: the data has no bias labels
    aligned: torch.Tensor | None  # bool [N]; None without bias labels
    n_classes: int
    n_attrs: int  # 0 without bias labels
    feature_names: tuple[str, ...] | None = None  # tabular: one name per feature column

    @property
    def has_attribute(self) -> bool:
        """Whether the split carries the true bias attribute ``a``."""
        return self.a is not None

    def attribute(self, what: str) -> torch.Tensor:
        """``a``, or a NeedsBiasLabels error saying that ``what`` needs it."""
        if self.a is None:
            raise NeedsBiasLabels(f"{what} {NEEDS_BIAS_LABELS}: the data has no bias attribute (bias.protocol = none, "
                                  "e.g. data.imagefolder.attribute_column: null)")
        return self.a

    @property
    def g(self) -> torch.Tensor:
        """Group index ``y * n_attrs + a`` (NeedsBiasLabels without an attribute)."""
        return self.y * self.n_attrs + self.attribute("the true group g = y * n_attrs + a")

    @property
    def n_groups(self) -> int:
        return self.n_classes * self.n_attrs

    @property
    def modality(self) -> str:
        """'image' (uint8 ``[N,3,H,W]``) or 'tabular' (float32 ``[N,F]``); anything else is a ValueError."""
        modality = biased_modality(self.x)
        if modality is None:
            raise ValueError(f"x is {self.x.dtype} {tuple(self.x.shape)}; allowed: {' or '.join(BIASED_LAYOUTS.values())}")
        return modality

    def __len__(self) -> int:
        return int(self.y.numel())

    def group_counts(self) -> torch.Tensor:
        """Counts per (class, attribute): int64 ``[n_classes, n_attrs]``."""
        return torch.bincount(self.g, minlength=self.n_groups).reshape(self.n_classes, self.n_attrs)

    def class_counts(self) -> torch.Tensor:
        """Counts per class: int64 ``[n_classes]`` (with or without an attribute)."""
        return torch.bincount(self.y, minlength=self.n_classes)

    def subset(self, index: torch.Tensor) -> "BiasedSplit":
        return BiasedSplit(self.x[index], self.y[index], None if self.a is None else self.a[index],
                           None if self.aligned is None else self.aligned[index], self.n_classes, self.n_attrs,
                           self.feature_names)


def _names_or_none(names: object, n_features: int | None, where: str | Path) -> tuple[str, ...] | None:
    """Stored feature names as a tuple; they must name every feature column."""
    if names is None:
        return None
    names = tuple(str(name) for name in names)  # type: ignore[union-attr]
    if n_features is None or len(names) != n_features:
        raise CorruptFileError(f"{where}: {len(names)} feature names for x with {n_features} feature columns; "
                               "allowed: one name per column of float32 features [N,F]")
    return names


def _n_features(x: torch.Tensor | np.ndarray) -> int | None:
    return int(x.shape[1]) if len(x.shape) == 2 else None


def save_split(path: str | Path, split: BiasedSplit) -> None:
    """Write a biased split after checking ``x`` is images or features with one row per label."""
    check_x(split.x, len(split), path, BIASED_LAYOUTS)
    _names_or_none(split.feature_names, _n_features(split.x), path)
    payload = {
        "x": split.x, "y": split.y, "a": split.a, "g": split.g if split.has_attribute else None, "aligned": split.aligned,
        "n_classes": split.n_classes, "n_attrs": split.n_attrs,
    }
    if split.feature_names is not None:
        payload["feature_names"] = list(split.feature_names)
    save_torch(path, payload, kind="biased-split")


def load_split(path: str | Path) -> BiasedSplit:
    """Load a biased split file and check its tensors agree with each other."""
    payload = load_torch(path, "biased-split", SPLIT_KEYS)
    split = BiasedSplit(
        payload["x"], payload["y"], payload["a"], payload["aligned"], int(payload["n_classes"]), int(payload["n_attrs"]),
        _names_or_none(payload.get("feature_names"), _n_features(payload["x"]), path),
    )
    n = len(split)
    check_x(split.x, n, path, BIASED_LAYOUTS)
    if (split.a is None) != (payload["g"] is None) or (split.a is None) != (split.aligned is None) or (
            split.a is None and split.n_attrs != 0):
        raise CorruptFileError(f"{path}: a, g and aligned must all be present or all be absent (no bias labels, "
                               "n_attrs 0); rerun inject_bias")
    if split.a is not None and not torch.equal(payload["g"], split.g):
        raise CorruptFileError(f"{path}: stored groups disagree with y * n_attrs + a; rerun inject_bias")
    if n == 0:
        raise CorruptFileError(f"{path} holds an empty split; rerun inject_bias with more data")
    return split


def load_splits(directory: str | Path, names: tuple[str, ...] = ("train", "val", "test")) -> dict[str, BiasedSplit]:
    directory = Path(directory)
    return {name: load_split(directory / f"{name}.pt") for name in names}


# --------------------------------------------------------------------------- raw splits


@dataclass
class RawData:
    """The raw splits, the ``data.source`` that produced them and the bias protocol that source registered
    (each None in files written before it was recorded)."""

    splits: RawSplits
    source: str | None
    protocol: str | None = None


def save_raw_splits(path: str | Path, splits: RawSplits, source: str | None = None,
                    protocol: str | None = None) -> None:
    """Write the raw splits (checked: images or features, one row per label), the source that made them and the
    bias protocol that source registered (``bias.protocol: auto`` resolves to it where the data has no attribute)."""
    payload: dict = {"source": source, "protocol": protocol}
    for name, split in splits.items():
        check_x(split.x, len(split), f"{path} (split '{name}')", RAW_LAYOUTS)
        _names_or_none(split.feature_names, _n_features(split.x), f"{path} (split '{name}')")
        payload[name] = {"x": torch.from_numpy(np.ascontiguousarray(split.x)), "y": torch.from_numpy(split.y)}
        if split.a is not None:
            payload[name]["a"] = torch.from_numpy(split.a)
        if split.feature_names is not None:
            payload[name]["feature_names"] = list(split.feature_names)
    save_torch(path, payload, kind="raw-splits")


def load_raw_data(path: str | Path) -> RawData:
    """The raw splits file, checked, with the source and its protocol recorded in it."""
    payload = load_torch(path, "raw-splits", SPLITS)
    splits: RawSplits = {}
    for name in SPLITS:
        stored = payload[name]
        x = stored["x"].numpy()
        where = f"{path} (split '{name}')"
        check_x(x, len(stored["y"]), where, RAW_LAYOUTS)
        splits[name] = RawSplit(x, stored["y"].numpy(), stored["a"].numpy() if "a" in stored else None,
                                _names_or_none(stored.get("feature_names"), _n_features(x), where))
    source, protocol = payload.get("source"), payload.get("protocol")
    return RawData(splits, None if source is None else str(source), None if protocol is None else str(protocol))


def load_raw_splits(path: str | Path) -> RawSplits:
    """The raw splits of :func:`load_raw_data`, without the source."""
    return load_raw_data(path).splits
