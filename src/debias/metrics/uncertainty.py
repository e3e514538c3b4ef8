"""Uncertainty of group accuracies, :func:`group_accuracies`: each group's accuracy k/n with its Wilson score interval
(:func:`wilson_interval`, scipy's ``binomtest(...).proportion_ci(method='wilson')``) at the report's confidence level.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # tensors only pass through: the module imports without torch (debias compare reads its tables)
    import torch


def wilson_interval(successes: int, n: int, confidence: float) -> tuple[float, float]:
    """Wilson score interval of the proportion ``p = k / n`` at ``confidence`` (Newcombe 1998, method 3):
    ``(2np + z² ± z sqrt(4np(1 - p) + z²)) / (2(n + z²))``, ``z`` the ``(1 + confidence) / 2`` normal quantile, the
    low end 0 at k = 0 and the high end 1 at k = n; ``n`` must be positive. scipy's
    ``binomtest(k, n).proportion_ci(method='wilson')`` evaluates the same expression in the same order, after an exact
    binomial test whose p-value this does not need (milliseconds a call, and a report or a comparison asks for
    hundreds)."""
    from scipy.special import ndtri

    if n <= 0 or not 0 <= successes <= n:
        raise ValueError(f"wilson_interval: need 0 <= successes <= n and n > 0, got {successes} of {n}")
    if not 0 < confidence < 1:
        raise ValueError(f"wilson_interval: confidence = {confidence}; allowed: a level strictly between 0 and 1")
    k, n = int(successes), int(n)
    p = k / n
    z = ndtri(0.5 + 0.5 * confidence)
    denom = 2 * (n + z**2)
    center = (2 * n * p + z**2) / denom
    delta = z / denom * math.sqrt(4 * n * p * (1 - p) + z**2)
    return 0.0 if k == 0 else float(center - delta), 1.0 if k == n else float(center + delta)


@dataclass(frozen=True)
class GroupAccuracy:
    """Test accuracy of one (class y, attribute a) group with its count and ``confidence`` interval."""

    y: int
    a: int
    accuracy: float
    n: int
    low: float
    high: float
    train_n: int | None = None  # the group's training images, where known (0: the model never saw the group)

    @property
    def correct(self) -> int:
        return round(self.accuracy * self.n)


def group_accuracies(per_group: list[list[float | None]], counts: list[list[int]], confidence: float,
                     train_counts: list[list[int]] | None = None) -> list[GroupAccuracy]:
    """Every non-empty group of a per-group table (``accuracy_report``'s ``per_group`` and ``group_counts``) with
    its Wilson interval; the correct count is ``round(accuracy * n)``, exact for the stored float64 ratios.
    ``train_counts``: the training split's group counts (the bias summary's), kept as each group's ``train_n``."""
    found = []
    for y, (row, count_row) in enumerate(zip(per_group, counts)):
        for a, (value, n) in enumerate(zip(row, count_row)):
            if value is None or not n:
                continue
            low, high = wilson_interval(round(float(value) * int(n)), int(n), confidence)
            train_n = None
            if train_counts is not None and y < len(train_counts) and a < len(train_counts[y]):
                train_n = int(train_counts[y][a])
            found.append(GroupAccuracy(y, a, float(value), int(n), low, high, train_n))
    return found


def inferred_group_accuracies(pred: torch.Tensor, y: torch.Tensor, inferred: torch.Tensor,
                              confidence: float | None) -> list[dict]:
    """Accuracy of each non-empty (class y, inferred group) cell with its n: ``{"y", "group", "n", "correct",
    "accuracy"}`` in (y, group) order, plus its Wilson interval ``low``, ``high`` at ``confidence`` (None: left to
    the reader, e.g. the report at ``report.confidence``). Needs no bias attribute: the groups are the inferred
    ones (``data/groups/train.parquet``'s ``inferred_label``)."""
    pred, y, inferred = (t.detach().cpu().long() for t in (pred, y, inferred))
    correct = pred == y
    rows = []
    for label, group in sorted(set(zip(y.tolist(), inferred.tolist()))):
        members = (y == label) & (inferred == group)
        n, k = int(members.sum()), int(correct[members].sum())
        row = {"y": label, "group": group, "n": n, "correct": k, "accuracy": k / n}
        if confidence is not None:
            row["low"], row["high"] = wilson_interval(k, n, confidence)
        rows.append(row)
    return rows


def worst_group_of(groups: list[GroupAccuracy]) -> GroupAccuracy | None:
    """The group with the lowest accuracy (ties: the larger n, the better-supported low value; then (y, a) order)."""
    return min(groups, key=lambda g: (g.accuracy, -g.n, g.y, g.a)) if groups else None
