"""DFR, Deep Feature Reweighting (Kirichenko, Izmailov, Wilson 2022, "Last Layer Re-Training is Sufficient for
Robustness to Spurious Correlations"): a linear classifier on the frozen encoder's features, retrained on
group-balanced held-out data (declared in :mod:`debias.evaluation.probes.dfr`) in the linear_probe stage; the
variant is DFR^Val_Tr as the authors' ``dfr_evaluate_spurious.py`` runs it (``balance_dfr_val`` and
``notrain_dfr_val`` on):

1. tuning: the validation split is cut into two halves (here: seeded and stratified by group,
   :func:`debias.evaluation.linear.stratified_halves`; the code: a random half); on a group-balanced subset
   of the first half (:func:`balanced_subset`: every group present drawn down to the smallest group's size)
   one logistic regression per ``C`` of ``probe.dfr.c_grid`` (``penalty``: L1, liblinear, as the code), scored
   by worst-group accuracy on the second half; the best wins (ties: higher average, then earlier entry);
2. final: ``probe.dfr.retrains`` (20) logistic regressions with that ``C``, each on a fresh group-balanced subset
   of the whole validation split, their weights and intercepts averaged into one linear classifier.

Features are standardised (``probe.standardize``) with the statistics of the data each step fits on (the first
half for tuning, the whole validation split for the final fit; the code uses the training split's, which this
variant otherwise never reads). Validation group labels are used, as by every method's model selection here.
The report's ``val`` accuracies are the tuning classifier's on the second half (the points that chose ``C``);
``test`` is the averaged classifier's.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import StandardScaler

from debias.core import progress
from debias.data.store import BiasedSplit
from debias.evaluation.linear import predict_labels, select_c, split_report, stratified_halves
from debias.params import ProbeBase


def balanced_subset(groups: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Sorted indices of a group-balanced subset: every group present keeps ``min_g n_g`` of its points, drawn
    uniformly without replacement (DFR's balancing); absent groups are ignored."""
    groups = groups.long().cpu()
    present = torch.unique(groups)
    members = [torch.nonzero(groups == g).flatten() for g in present.tolist()]
    size = min(len(m) for m in members)
    chosen = [m[torch.randperm(len(m), generator=generator)[:size]] for m in members]
    return torch.cat(chosen).sort().values


def fit_sparse_logistic(features: torch.Tensor, labels: torch.Tensor, c: float, penalty: str, max_iter: int,
                        standardize: bool, seed: int) -> Pipeline:
    """DFR's classifier: ``LogisticRegression(penalty, C=c, solver='liblinear')`` after an optional StandardScaler
    (the penalty as ``l1_ratio`` 1 or 0: scikit-learn 1.8 deprecates ``penalty``). DFR's tasks are binary; for
    more classes liblinear is refused by scikit-learn >= 1.8, so the same penalty is fitted multinomially with
    ``saga`` (the only other solver with an L1 penalty)."""
    steps: list[Any] = [StandardScaler()] if standardize else []
    solver = "liblinear" if int(torch.unique(labels).numel()) <= 2 else "saga"
    steps.append(LogisticRegression(C=c, l1_ratio=1.0 if penalty == "l1" else 0.0, solver=solver,
                                    max_iter=max_iter, random_state=seed))
    model = make_pipeline(*steps)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(features.double().numpy(), labels.long().numpy())
    return model


def averaged(heads: list[LogisticRegression], scaler: StandardScaler | None) -> Pipeline:
    """One classifier, ``scaler`` then the mean of ``heads``' weights and intercepts (DFR's averaging)."""
    head = copy.deepcopy(heads[-1])
    head.coef_ = np.mean([h.coef_ for h in heads], axis=0)
    head.intercept_ = np.mean([h.intercept_ for h in heads], axis=0)
    return make_pipeline(*([scaler] if scaler is not None else []), head)


def dfr_probe(features: Mapping[str, torch.Tensor], splits: Mapping[str, BiasedSplit], params: ProbeBase,
              seed: int) -> tuple[dict, Pipeline, torch.Tensor]:
    """Tune ``C`` on validation halves, refit on balanced subsets of all of validation; ``(report, classifier,
    selection indices into val)``. The report has the keys of the logistic probe's plus ``method``, ``retrains``
    and ``n_balanced`` (size of each final balanced subset)."""
    dfr = params.dfr
    val = splits["val"]
    val_z = features["val"]
    generator = torch.Generator().manual_seed(seed)
    fit_half, select_index = stratified_halves(val.g, seed)
    tune_index = fit_half[balanced_subset(val.g[fit_half], generator)]
    if int(torch.unique(val.y[tune_index]).numel()) < 2:
        raise ValueError("DFR: the balanced validation subset holds fewer than 2 classes")
    models, scores = [], []
    for index, c in enumerate(dfr.c_grid):
        model = fit_sparse_logistic(val_z[tune_index], val.y[tune_index], c, dfr.penalty, params.max_iter,
                                    params.standardize, seed)
        report = split_report(val, predict_labels(model, val_z[select_index]), select_index, fairness=False)
        models.append(model)
        scores.append({"c": float(c), "worst_group": report["worst_group"], "avg": report["avg"],
                       "unbiased": report["unbiased"]})
        progress.advance("DFR: C grid", index + 1, len(dfr.c_grid), unit="C")
    best = select_c(scores)
    c = float(dfr.c_grid[best])
    scaler = StandardScaler().fit(val_z.double().numpy()) if params.standardize else None
    standardised = torch.from_numpy(scaler.transform(val_z.double().numpy())) if scaler is not None else val_z
    retrained, n_balanced = [], 0
    for retrain in range(dfr.retrains):
        subset = balanced_subset(val.g, generator)
        n_balanced = len(subset)
        retrained.append(fit_sparse_logistic(standardised[subset], val.y[subset], c, dfr.penalty, params.max_iter,
                                             False, seed))
        progress.advance("DFR: retrains", retrain + 1, dfr.retrains, unit="fit")
    final = averaged([model[-1] for model in retrained], scaler)
    report = {
        "method": "dfr",
        "c": c,
        "train_split": "val",
        "n_fit": int(len(tune_index)),
        "n_select": int(select_index.numel()),
        "val_scores": scores,
        "retrains": dfr.retrains,
        "n_balanced": int(n_balanced),
        "test": split_report(splits["test"], predict_labels(final, features["test"])),
        "val": split_report(val, predict_labels(models[best], val_z[select_index]), select_index),
    }
    return report, final, select_index
