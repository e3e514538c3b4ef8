"""Accuracy by group and friends: the one definition every stage uses.

For predictions ``pred`` of classes ``y`` with bias attribute ``a`` (group ``g = y*A + a``):
- ``avg``          sample-weighted accuracy, mean(pred == y);
- ``per_group``    accuracy of each (class, attribute) cell, None where the cell is empty;
- ``worst_group``  min over groups present in the split;
- ``unbiased``     mean over groups present (each group weighted equally);
- ``aligned`` / ``conflicting``  accuracy over bias-aligned / bias-conflicting samples.
Empty groups are skipped explicitly and listed under ``empty_groups``, never counted as 0.
"""

from __future__ import annotations

import math

import torch


def group_accuracy(pred: torch.Tensor, y: torch.Tensor, g: torch.Tensor, n_groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(correct count, sample count) per group, float64 ``[n_groups]``."""
    correct = (pred == y).double()
    hits = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, g, correct)
    counts = torch.bincount(g, minlength=n_groups).double()
    return hits, counts


def accuracy_report(pred: torch.Tensor, y: torch.Tensor, a: torch.Tensor, aligned: torch.Tensor,
                    n_classes: int, n_attrs: int) -> dict:
    """Average, unbiased, worst-group, aligned and conflicting accuracy plus the per-group table."""
    pred, y, a, aligned = (t.detach().cpu() for t in (pred, y, a, aligned))
    if y.numel() == 0:
        raise ValueError("accuracy_report: the split holds no samples")
    g = y * n_attrs + a
    hits, counts = group_accuracy(pred, y, g, n_classes * n_attrs)
    present = counts > 0
    per_group = torch.where(present, hits / counts.clamp(min=1), torch.full_like(hits, math.nan))
    correct = (pred == y).double()

    def mean_or_none(mask: torch.Tensor) -> float | None:
        return float(correct[mask].mean()) if bool(mask.any()) else None

    table = per_group.reshape(n_classes, n_attrs)
    return {
        "avg": float(correct.mean()),
        "unbiased": float(per_group[present].mean()),
        "worst_group": float(per_group[present].min()),
        "aligned": mean_or_none(aligned.bool()),
        "conflicting": mean_or_none(~aligned.bool()),
        "n": int(y.numel()),
        "per_group": [[None if math.isnan(v) else float(v) for v in row] for row in table.tolist()],
        "group_counts": counts.reshape(n_classes, n_attrs).long().tolist(),
        "empty_groups": [[int(i // n_attrs), int(i % n_attrs)] for i in torch.nonzero(~present).flatten().tolist()],
    }


SCALAR_KEYS = ("avg", "unbiased", "worst_group", "aligned", "conflicting")


def scalars(report: dict, prefix: str = "") -> dict[str, float]:
    """The scalar accuracies of a report (None dropped), keys prefixed for logging."""
    return {f"{prefix}{key}": report[key] for key in SCALAR_KEYS if report.get(key) is not None}
