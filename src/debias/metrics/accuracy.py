"""Accuracy by group and friends: the one definition every stage uses.

For predictions ``pred`` of classes ``y`` with bias attribute ``a`` (group ``g = y*A + a``):
- ``avg``          sample-weighted accuracy, mean(pred == y);
- ``per_group``    accuracy of each (class, attribute) cell, None where the cell is empty;
- ``worst_group``  min over groups present in the split;
- ``unbiased``     mean over groups present (each group weighted equally);
- ``aligned`` / ``conflicting``  accuracy over bias-aligned / bias-conflicting samples.
Empty groups are skipped explicitly and listed under ``empty_groups``, never counted as 0.

Fairness of binary tasks (tabular data: ``a`` is the sensitive attribute), :func:`fairness_report`,
computed by fairlearn (``fairlearn.metrics``) with its definitions, positive label 1:
- ``equalized_odds_difference``  fairlearn's ``equalized_odds_difference`` (``agg='worst_case'``): the
  larger of the between-group ranges of TPR ``P(h=1 | A=a, Y=1)`` and of FPR ``P(h=1 | A=a, Y=0)``
  (Hardt et al.'s equalized odds; the WCL paper's EOd, Table 3);
- ``equalized_odds_mean``  the same with ``agg='mean'``: the mean of the two ranges (half the
  |dTPR| + |dFPR| sum some papers report);
- ``demographic_parity_difference``  fairlearn's: the range of the selection rate ``P(h=1 | A=a)``;
- ``accuracy_difference``  the range of the accuracy ``P(h=Y | A=a)`` (``MetricFrame.difference``):
  the condition the WCL paper writes for EOd, P(Y_hat = Y | A=0) = P(Y_hat = Y | A=1), read literally;
- ``per_group``  per attribute value: n, positives, negatives, TPR, FPR, selection rate, accuracy.
fairlearn counts the TPR of a group without positives (FPR: without negatives) as 0; ``notes``
names such groups. Multiclass tasks, and splits holding fewer than two values of ``a`` (a difference over one
group would read 0, "perfectly fair"), get every value None and a ``reason``.

Without bias labels (``a`` None, ``bias.protocol: none``) :func:`accuracy_report` computes what needs no attribute,
``avg``, ``per_class`` with ``class_counts`` and ``worst_class`` (min over classes present), and writes
:data:`~debias.core.errors.NEEDS_BIAS_LABELS` in place of every key of :data:`ATTRIBUTE_KEYS` (never 0, NaN or a
dropped key); :func:`inferred_group_accuracies` gives the accuracy of each inferred group with its n and interval.

Uncertainty, :func:`group_accuracies`: each group's accuracy k/n with its Wilson score interval (scipy's
``binomtest(...).proportion_ci(method='wilson')``) at the report's confidence level.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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


# --------------------------------------------------------------------------- fairness (binary tasks)

FAIRNESS_KEYS = ("equalized_odds_difference", "equalized_odds_mean", "demographic_parity_difference",
                 "accuracy_difference")


def fairness_report(pred: torch.Tensor, y: torch.Tensor, a: torch.Tensor | None, n_classes: int) -> dict:
    """Equalized-odds and demographic-parity differences and per-group rates (fairlearn) for a binary task.

    ``n_classes`` other than 2: every value None, with the ``reason``. ``a`` None (no bias labels): every value
    :data:`NEEDS_BIAS_LABELS`, with the reason."""
    if a is None:
        return {**dict.fromkeys(FAIRNESS_KEYS, NEEDS_BIAS_LABELS), "per_group": NEEDS_BIAS_LABELS, "notes": [],
                "reason": f"fairness metrics compare the values of the sensitive attribute a: {NEEDS_BIAS_LABELS}"}
    if n_classes != 2:
        return {**dict.fromkeys(FAIRNESS_KEYS), "per_group": None, "notes": [],
                "reason": f"fairness metrics need a binary task (positive label 1); this one has {n_classes} classes"}
    from fairlearn.metrics import (MetricFrame, count, demographic_parity_difference, equalized_odds_difference,
                                   false_positive_rate, selection_rate, true_positive_rate)
    from sklearn.metrics import accuracy_score

    pred, y, a = (t.detach().cpu().numpy() for t in (pred, y, a))
    if len(y) == 0:
        raise ValueError("fairness_report: the split holds no samples")
    values = sorted(set(a.tolist()))
    if len(values) < 2:
        return {**dict.fromkeys(FAIRNESS_KEYS), "per_group": None, "notes": [],
                "reason": f"fairness differences need two or more values of the sensitive attribute a; this split holds "
                          f"only a = {values}: not computed (a difference over one group is not 0)"}
    frame = MetricFrame(metrics={"tpr": true_positive_rate, "fpr": false_positive_rate, "selection_rate": selection_rate,
                                 "accuracy": accuracy_score, "n": count},
                        y_true=y, y_pred=pred, sensitive_features=a)
    per_group, notes = {}, []
    for attr, row in frame.by_group.iterrows():
        members = a == attr
        positives, negatives = int((y[members] == 1).sum()), int((y[members] == 0).sum())
        per_group[str(attr)] = {"n": int(row["n"]), "positives": positives, "negatives": negatives,
                                **{key: float(row[key]) for key in ("tpr", "fpr", "selection_rate", "accuracy")}}
        notes += [f"a={attr} has no {kind}: fairlearn counts its {rate} as 0"
                  for kind, rate, total in (("positives", "TPR", positives), ("negatives", "FPR", negatives)) if total == 0]
    return {
        "equalized_odds_difference": float(equalized_odds_difference(y, pred, sensitive_features=a)),
        "equalized_odds_mean": float(equalized_odds_difference(y, pred, sensitive_features=a, agg="mean")),
        "demographic_parity_difference": float(demographic_parity_difference(y, pred, sensitive_features=a)),
        "accuracy_difference": float(frame.difference()["accuracy"]),
        "per_group": per_group,
        "notes": notes,
        "reason": None,
    }


def fairness_scalars(report: dict, prefix: str = "") -> dict[str, float]:
    """The scalar fairness differences of a report (None dropped), keys prefixed for logging."""
    return {f"{prefix}{key}": report[key] for key in FAIRNESS_KEYS if report.get(key) is not None}


# --------------------------------------------------------------------------- uncertainty of group accuracies


def wilson_interval(successes: int, n: int, confidence: float) -> tuple[float, float]:
    """Wilson score interval of the proportion ``successes / n`` at ``confidence`` (scipy's
    ``binomtest(k, n).proportion_ci(method='wilson')``); ``n`` must be positive."""
    from scipy.stats import binomtest

    if n <= 0 or not 0 <= successes <= n:
        raise ValueError(f"wilson_interval: need 0 <= successes <= n and n > 0, got {successes} of {n}")
    interval = binomtest(int(successes), int(n)).proportion_ci(confidence_level=confidence, method="wilson")
    return float(interval.low), float(interval.high)


@dataclass(frozen=True)
class GroupAccuracy:
    """Test accuracy of one (class y, attribute a) group with its count and ``confidence`` interval."""

    y: int
    a: int
    accuracy: float
    n: int
    low: float
    high: float

    @property
    def correct(self) -> int:
        return round(self.accuracy * self.n)


def group_accuracies(per_group: list[list[float | None]], counts: list[list[int]], confidence: float) -> list[GroupAccuracy]:
    """Every non-empty group of a per-group table (``accuracy_report``'s ``per_group`` and ``group_counts``) with
    its Wilson interval; the correct count is ``round(accuracy * n)``, exact for the stored float64 ratios."""
    found = []
    for y, (row, count_row) in enumerate(zip(per_group, counts)):
        for a, (value, n) in enumerate(zip(row, count_row)):
            if value is None or not n:
                continue
            low, high = wilson_interval(round(float(value) * int(n)), int(n), confidence)
            found.append(GroupAccuracy(y, a, float(value), int(n), low, high))
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
