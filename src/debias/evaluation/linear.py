"""Linear-classifier helpers every probe variant shares: seeded stratified halves, logistic regression, its
predictions, the accuracy report of a split and the choice of ``C`` (below probe.py, logistic.py, dfr.py,
postprocess.py and representation.py, importing none of them)."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import StandardScaler

from debias.data.store import BiasedSplit
from debias.metrics import accuracy_report, fairness_report


def stratified_halves(labels: torch.Tensor, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two disjoint sorted index sets, each holding half of every label (odd counts: a seeded coin picks the side)."""
    labels = labels.long().cpu()
    generator = torch.Generator().manual_seed(seed)
    n = int(labels.numel())
    shuffled = torch.randperm(n, generator=generator)
    order = shuffled[torch.argsort(labels[shuffled], stable=True)]
    sorted_labels = labels[order]
    counts = torch.bincount(sorted_labels)
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.arange(n) - starts[sorted_labels]
    coin = torch.randint(0, 2, (int(counts.numel()),), generator=generator)
    first = (rank + coin[sorted_labels]) % 2 == 0
    return order[first].sort().values, order[~first].sort().values


def fit_logistic(features: torch.Tensor, labels: torch.Tensor, c: float, max_iter: int, standardize: bool,
                 seed: int) -> Pipeline:
    """Multinomial logistic regression (lbfgs, L2, inverse strength ``c``), after an optional StandardScaler."""
    steps: list[Any] = [StandardScaler()] if standardize else []
    steps.append(LogisticRegression(C=c, max_iter=max_iter, random_state=seed))
    model = make_pipeline(*steps)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(features.double().numpy(), labels.long().numpy())
    return model


def predict_labels(model: Pipeline, features: torch.Tensor) -> torch.Tensor:
    """Arg-max class of a fitted classifier, int64 ``[N]``."""
    return torch.from_numpy(np.asarray(model.predict(features.double().numpy()), dtype=np.int64))


def predict_proba(model: Pipeline, features: torch.Tensor) -> np.ndarray:
    """p(label | z) of a fitted classifier, ``[N, K]`` over ``model.classes_``."""
    return model.predict_proba(features.double().numpy())


def split_report(split: BiasedSplit, pred: torch.Tensor, index: torch.Tensor | None = None,
                 fairness: bool = True) -> dict:
    """:func:`accuracy_report` of ``pred`` on ``split`` (or on its rows ``index``, ``pred`` given for those rows),
    plus (``fairness`` and a binary task) the ``fairness`` block."""
    y, a, aligned = split.y, split.a, split.aligned
    if index is not None:  # a and aligned are None without bias labels
        y, a, aligned = y[index], None if a is None else a[index], None if aligned is None else aligned[index]
    report = accuracy_report(pred, y, a, aligned, split.n_classes, split.n_attrs)
    if fairness and split.n_classes == 2:  # binary tasks: equalized odds and friends beside the accuracies
        fairness = fairness_report(pred, y, a, split.n_classes)
        report["fairness"] = {k: v for k, v in fairness.items() if k != "reason" or v is not None}  # why not computed
    return report


def select_c(scores: list[dict[str, float | str]]) -> int:
    """Index of the best entry: highest ``worst_group``, then highest ``avg``, then the earliest. Without bias labels
    (``worst_group`` is the needs-bias-labels marker) highest ``worst_class`` instead: the label-free rule
    SubpopBench (Yang et al., ICML 2023) finds usable when attributes are unknown."""
    key = "worst_class" if any(isinstance(row["worst_group"], str) for row in scores) else "worst_group"
    return max(range(len(scores)), key=lambda i: (scores[i][key], scores[i]["avg"], -i))
