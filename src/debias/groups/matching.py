"""Matching inferred labels to reference labels, and the quality of inferred bias labels.

- ``contingency``       counts ``C[i, j] = #{n : pred_n = p_i, target_n = t_j}`` over the labels present;
- ``hungarian_match``   the one-to-one map pred label -> target label maximising ``sum C[i, map(i)]``
                        (scipy's ``linear_sum_assignment``; rectangular tables allowed: with more
                        pred than target labels the surplus pred labels stay unmatched, and vice versa);
- ``matched_accuracy``  ``max over one-to-one maps of sum C[i, map(i)] / N`` (unmatched labels count as wrong);
- ``group_quality``     inferred vs true bias attribute: matched accuracy, NMI, ARI, recall and
                        precision of the true bias-conflicting points, per-class minority counts.
"""

from __future__ import annotations

import numpy as np
import torch

from debias.core.lazy import lazy_callable

# Imported on first use: train_contrastive imports this package for load_groups and never matches (scikit-learn
# and scipy cost ~1.7 CPU s of its start-up).
linear_sum_assignment = lazy_callable("scipy.optimize", "linear_sum_assignment")
adjusted_rand_score = lazy_callable("sklearn.metrics", "adjusted_rand_score")
normalized_mutual_info_score = lazy_callable("sklearn.metrics", "normalized_mutual_info_score")


def _as_long(values: torch.Tensor | np.ndarray) -> torch.Tensor:
    return torch.as_tensor(values).detach().cpu().long().flatten()


def contingency(pred: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(C [P, T] int64, pred label values [P], target label values [T])`` over the labels present."""
    pred, target = _as_long(pred), _as_long(target)
    if pred.numel() != target.numel():
        raise ValueError(f"contingency: {pred.numel()} predicted labels but {target.numel()} targets")
    pred_values, pred_index = torch.unique(pred, return_inverse=True)
    target_values, target_index = torch.unique(target, return_inverse=True)
    flat = pred_index * len(target_values) + target_index
    table = torch.bincount(flat, minlength=len(pred_values) * len(target_values))
    return table.reshape(len(pred_values), len(target_values)), pred_values, target_values


def dense_contingency(pred: torch.Tensor, target: torch.Tensor, n_pred: int, n_target: int) -> torch.Tensor:
    """``C [n_pred, n_target]`` with ``C[i, j] = #{n : pred_n = i, target_n = j}`` for labels ``0 .. n-1``."""
    pred, target = _as_long(pred), _as_long(target)
    if pred.numel() and (int(pred.min()) < 0 or int(pred.max()) >= n_pred or int(target.min()) < 0 or int(target.max()) >= n_target):
        raise ValueError(f"dense_contingency: labels must lie in [0, {n_pred}) and [0, {n_target})")
    return torch.bincount(pred * n_target + target, minlength=n_pred * n_target).reshape(n_pred, n_target)


def hungarian_map(pred: torch.Tensor, target: torch.Tensor, n_pred: int, n_target: int) -> torch.Tensor:
    """Lookup ``m [n_pred]``: ``m[i]`` = target matched one-to-one to pred label ``i`` (max agreement), -1 if none.

    Every label ``0 .. n-1`` takes part, present or not, so with ``n_pred <= n_target`` every pred label is matched.
    """
    rows, cols = _assignment(dense_contingency(pred, target, n_pred, n_target))
    lookup = torch.full((n_pred,), -1, dtype=torch.long)
    lookup[torch.as_tensor(rows, dtype=torch.long)] = torch.as_tensor(cols, dtype=torch.long)
    return lookup


def _assignment(table: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Rows and columns of the one-to-one assignment maximising the summed counts."""
    return linear_sum_assignment(table.numpy(), maximize=True)


def hungarian_match(pred_labels: torch.Tensor, target_labels: torch.Tensor) -> dict[int, int]:
    """``{pred label: target label}`` one-to-one, maximising the number of samples where they agree."""
    table, pred_values, target_values = contingency(pred_labels, target_labels)
    rows, cols = _assignment(table)
    return {int(pred_values[r]): int(target_values[c]) for r, c in zip(rows, cols)}


def relabel(labels: torch.Tensor, mapping: dict[int, int], missing: int = -1) -> torch.Tensor:
    """``mapping[label]`` for every label (``missing`` where the label is not in the mapping)."""
    labels = _as_long(labels)
    if labels.numel() == 0:
        return labels.clone()
    keys = torch.tensor(sorted(mapping), dtype=torch.long)
    values = torch.tensor([mapping[int(k)] for k in keys], dtype=torch.long)
    if keys.numel() == 0:
        return torch.full_like(labels, missing)
    position = torch.searchsorted(keys, labels).clamp(max=len(keys) - 1)
    return torch.where(keys[position] == labels, values[position], torch.full_like(labels, missing))


def matched_accuracy(pred: torch.Tensor, target: torch.Tensor) -> float:
    """Fraction of samples whose label agrees with ``target`` after the best one-to-one relabelling."""
    table, _, _ = contingency(pred, target)
    if table.sum() == 0:
        raise ValueError("matched_accuracy: no samples")
    rows, cols = _assignment(table)
    return float(table[rows, cols].sum()) / float(table.sum())


def _ratio(numerator: int, denominator: int) -> float | None:
    return numerator / denominator if denominator > 0 else None


def group_quality(inferred_label: torch.Tensor, minority: torch.Tensor, a: torch.Tensor, aligned: torch.Tensor,
                  y: torch.Tensor, n_classes: int | None = None) -> dict:
    """Agreement of inferred bias labels with the true attribute ``a`` and of ``minority`` with ``~aligned``.

    ``minority_recall`` = |inferred minority ∩ conflicting| / |conflicting|,
    ``minority_precision`` = |inferred minority ∩ conflicting| / |inferred minority| (None when a
    denominator is 0); per-class lists are indexed by class ``0 .. n_classes-1``.
    """
    inferred_label, a, y = _as_long(inferred_label), _as_long(a), _as_long(y)
    minority, conflicting = _as_long(minority).bool(), ~_as_long(aligned).bool()
    if not (inferred_label.numel() == minority.numel() == a.numel() == conflicting.numel() == y.numel()):
        raise ValueError("group_quality: inferred_label, minority, a, aligned and y must have the same length")
    if y.numel() == 0:
        raise ValueError("group_quality: no samples")
    n_classes = int(y.max()) + 1 if n_classes is None else n_classes
    found = minority & conflicting
    return {
        "matched_accuracy": matched_accuracy(inferred_label, a),
        "nmi": float(normalized_mutual_info_score(a.numpy(), inferred_label.numpy())),
        "ari": float(adjusted_rand_score(a.numpy(), inferred_label.numpy())),
        "minority_recall": _ratio(int(found.sum()), int(conflicting.sum())),
        "minority_precision": _ratio(int(found.sum()), int(minority.sum())),
        "n": int(y.numel()),
        "n_inferred_minority": int(minority.sum()),
        "n_true_conflicting": int(conflicting.sum()),
        "n_found_conflicting": int(found.sum()),
        "inferred_minority_per_class": torch.bincount(y[minority], minlength=n_classes).tolist(),
        "true_conflicting_per_class": torch.bincount(y[conflicting], minlength=n_classes).tolist(),
    }
