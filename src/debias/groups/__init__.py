"""Group inference: bias labels of the training split from the ERM model or the truth (``groups.method``).

The methods are the modules of :mod:`debias.groups.methods`, found by :mod:`debias.groups.registry`;
:mod:`debias.groups.inference` runs them and stores the table; :mod:`debias.groups.matching` holds Hungarian
matching and the quality of inferred labels. The names below are imported from their modules on first use (the
params schema imports the registry, which must not import pandas or torch).
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {name: "inference" for name in (
    "GROUP_COLUMNS", "GROUPS_METRICS", "GROUPS_TABLE", "UMAP_TRAIN", "GroupInference", "groups_report",
    "import_umap", "infer_groups", "load_embedding", "load_groups", "report_scalars", "save_embedding", "save_groups")}
_LAZY.update({name: "matching" for name in ("group_quality", "hungarian_map", "hungarian_match", "matched_accuracy",
                                            "relabel")})

__all__ = sorted([*_LAZY, "METHODS"])


def __getattr__(name: str) -> Any:
    """``from debias.groups import infer_groups``: the name from its module, imported on first use; ``METHODS``: every
    registered method, the declarations imported first (:func:`debias.groups.registry.discover`)."""
    if name == "METHODS":
        return importlib.import_module(f"{__name__}.registry").discover()
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
