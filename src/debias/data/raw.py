"""What a raw split is (:class:`RawSplit`), shared by the sources that make raw splits and the stages that read them.

The modality lives in the data: a split's ``x`` is either uint8 images (``image``) or float32 feature vectors
``[N, F]`` (``tabular``, with optional ``feature_names``); :data:`RAW_LAYOUTS` says what each modality allows and
:func:`raw_modality` tells them apart. Kept apart from :mod:`debias.data.sources` so that the stages downstream of
``download`` (the store, the bias protocols) import no source: a change to a source reruns ``download`` alone, and
what follows reruns only if download's outputs change.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SPLITS = ("train", "val", "test")


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
