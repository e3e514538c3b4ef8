"""Evaluation of frozen encoders: linear probes (probe.py, its variants under probes/ behind variants.py's registries,
their shared helpers in linear.py) and representation metrics (representation.py).

The names below are imported from their modules on first use (the params schema imports the variants' registry,
which must not import torch or scikit-learn)."""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {"select_c": "linear", "stratified_halves": "linear"}
_LAZY.update({name: "probe" for name in ("FrozenEncoder", "flat_scalars", "head_is_trained", "load_encoders",
                                         "probe_encoder", "probe_encoders", "probe_report", "split_tables")})
_LAZY.update({name: "representation" for name in ("alignment_loss", "distance_statistics", "evaluate_encoders",
                                                  "mutual_information", "representation_metrics", "umap_embedding")})

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    """``from debias.evaluation import probe_report``: the name from its module, imported on first use."""
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
