"""Metrics, defined once and used by every stage.

``accuracy``     accuracy by group and class, worst-group, unbiased, aligned and conflicting (:func:`accuracy_report`);
``fairness``     equalized-odds and demographic-parity differences of binary tasks (:func:`fairness_report`);
``uncertainty``  Wilson intervals of group accuracies (:func:`group_accuracies`, :func:`inferred_group_accuracies`).
"""

from __future__ import annotations

import importlib
from typing import Any

# The names below are imported from their modules on first use: ``debias compare`` and ``debias sweep`` import
# :mod:`debias.metrics.paired` (scipy and statsmodels only), which must not import torch through this package.
_LAZY = {name: "accuracy" for name in ("ATTRIBUTE_KEYS", "LABEL_FREE_SCALAR_KEYS", "PAIR_KINDS", "SCALAR_KEYS",
                                       "accuracy_report", "class_accuracies", "group_accuracy", "needs_bias_labels",
                                       "scalars", "shown")}
_LAZY.update({name: "fairness" for name in ("FAIRNESS_KEYS", "fairness_report", "fairness_scalars")})
_LAZY.update({name: "uncertainty" for name in ("GroupAccuracy", "group_accuracies", "inferred_group_accuracies",
                                               "wilson_interval", "worst_group_of")})

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    """``from debias.metrics import accuracy_report``: the name from its module, imported on first use."""
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
