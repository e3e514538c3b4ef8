"""Fairness of binary tasks (tabular data: ``a`` is the sensitive attribute), :func:`fairness_report`,
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
"""

from __future__ import annotations

import torch

from debias.core.errors import NEEDS_BIAS_LABELS

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
