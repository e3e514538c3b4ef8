"""Accuracy by group and friends: the one definition every stage uses.

For predictions ``pred`` of classes ``y`` with bias attribute ``a`` (group ``g = y*A + a``):
- ``avg``          sample-weighted accuracy, mean(pred == y);
- ``per_group``    accuracy of each (class, attribute) cell, None where the cell is empty;
- ``worst_group``  min over groups present in the split;
- ``unbiased``     mean over groups present (each group weighted equally);
- ``aligned`` / ``conflicting``  accuracy over bias-aligned / bias-conflicting samples.
Empty groups are skipped explicitly and listed under ``empty_groups``, never counted as 0.

Without bias labels (``a`` None, ``bias.protocol: none``) :func:`accuracy_report` computes what needs no attribute,
``avg``, ``per_class`` with ``class_counts`` and ``worst_class`` (min over classes present), and writes
:data:`~debias.core.errors.NEEDS_BIAS_LABELS` in place of every key of :data:`ATTRIBUTE_KEYS` (never 0, NaN or a
dropped key); :func:`~debias.metrics.uncertainty.inferred_group_accuracies` gives the accuracy of each inferred group with its n and interval.
"""

from __future__ import annotations

import math

import torch

from debias.core.errors import NEEDS_BIAS_LABELS

# The four kinds of pairs (i, j) of a batch or split by class y and bias attribute/label b, in this order everywhere:
# FairKL's pair sets (debias.losses) and the representation's distance statistics (debias.evaluation).
PAIR_KINDS: tuple[str, str, str, str] = (
    "pos_aligned",  # same y, same b
    "pos_conflicting",  # same y, different b
    "neg_aligned",  # different y, same b
    "neg_conflicting",  # different y, different b
)


def group_accuracy(pred: torch.Tensor, y: torch.Tensor, g: torch.Tensor, n_groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(correct count, sample count) per group, float64 ``[n_groups]``."""
    correct = (pred == y).double()
    hits = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, g, correct)
    counts = torch.bincount(g, minlength=n_groups).double()
    return hits, counts


# The keys of an accuracy report that need the true attribute: without bias labels each reads NEEDS_BIAS_LABELS.
ATTRIBUTE_KEYS = ("unbiased", "worst_group", "aligned", "conflicting", "per_group", "group_counts", "empty_groups")


def class_accuracies(pred: torch.Tensor, y: torch.Tensor, n_classes: int) -> dict:
    """``per_class`` accuracy (None for a class with no sample), ``class_counts`` and ``worst_class`` (the
    minimum over the classes present): what needs no bias attribute."""
    pred, y = pred.detach().cpu(), y.detach().cpu()
    hits, counts = group_accuracy(pred, y, y, n_classes)
    per_class = [None if n == 0 else float(h / n) for h, n in zip(hits.tolist(), counts.tolist())]
    present = [value for value in per_class if value is not None]
    return {"per_class": per_class, "class_counts": counts.long().tolist(), "worst_class": min(present)}


def accuracy_report(pred: torch.Tensor, y: torch.Tensor, a: torch.Tensor | None, aligned: torch.Tensor | None,
                    n_classes: int, n_attrs: int) -> dict:
    """Average, unbiased, worst-group, aligned and conflicting accuracy plus the per-group table. ``a`` None (no
    bias labels): each key of :data:`ATTRIBUTE_KEYS` reads :data:`NEEDS_BIAS_LABELS`, and the per-class accuracies
    (:func:`class_accuracies`: ``per_class``, ``class_counts``, ``worst_class``) stand beside them."""
    if y.numel() == 0:
        raise ValueError("accuracy_report: the split holds no samples")
    if a is None or aligned is None:
        classes = class_accuracies(pred, y, n_classes)
        correct = (pred.detach().cpu() == y.detach().cpu()).double()
        return {"avg": float(correct.mean()), "n": int(y.numel()), "bias_labels": False, **classes,
                **dict.fromkeys(ATTRIBUTE_KEYS, NEEDS_BIAS_LABELS)}
    pred, y, a, aligned = (t.detach().cpu() for t in (pred, y, a, aligned))
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
# Without bias labels worst-class accuracy joins the scalars.
LABEL_FREE_SCALAR_KEYS = ("worst_class",)


def needs_bias_labels(value: object) -> bool:
    """Whether ``value`` is the :data:`NEEDS_BIAS_LABELS` marker of a number the data cannot give."""
    return isinstance(value, str) and value == NEEDS_BIAS_LABELS


def shown(value: float | str | None, spec: str = ".3f") -> str:
    """A number for a message, formatted by ``spec``; :data:`NEEDS_BIAS_LABELS` as itself, None as 'n/a'."""
    return "n/a" if value is None else value if isinstance(value, str) else format(value, spec)


def scalars(report: dict, prefix: str = "") -> dict[str, float | str]:
    """The scalar accuracies of a report (None dropped; :data:`NEEDS_BIAS_LABELS` kept, so the logger names
    it), keys prefixed for logging."""
    keys = SCALAR_KEYS + (LABEL_FREE_SCALAR_KEYS if needs_bias_labels(report.get("worst_group")) else ())
    return {f"{prefix}{key}": report[key] for key in keys if report.get(key) is not None}
