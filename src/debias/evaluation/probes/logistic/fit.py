"""The logistic probe's fit (declared in :mod:`debias.evaluation.probes.logistic`): multinomial logistic regression
per ``C`` of ``probe.c_grid`` on ``probe.train_split`` (or the first stratified half of validation), ``C`` chosen on
validation (see :mod:`debias.evaluation.probe`)."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from sklearn.pipeline import Pipeline

from debias.core import progress
from debias.data.store import BiasedSplit
from debias.evaluation.linear import fit_logistic, predict_labels, select_c, split_report, stratified_halves
from debias.params import ProbeBase


def logistic_probe(features: Mapping[str, torch.Tensor], splits: Mapping[str, BiasedSplit], params: ProbeBase,
                   seed: int) -> tuple[dict, Pipeline, torch.Tensor]:
    """The logistic probe's report, the chosen classifier and the validation indices that chose it."""
    val = splits["val"]
    if params.train_split == "train":
        fit_x, fit_y = features["train"], splits["train"].y
        select_index = torch.arange(len(val))
    else:
        fit_index, select_index = stratified_halves(val.g if val.has_attribute else val.y, seed)  # per class without a
        fit_x, fit_y = features["val"][fit_index], val.y[fit_index]
    select_x = features["val"][select_index]
    if int(torch.unique(fit_y).numel()) < 2:
        raise ValueError(f"linear probe: the {params.train_split} features to fit hold fewer than 2 classes")
    models, scores = [], []
    for index, c in enumerate(params.c_grid):
        model = fit_logistic(fit_x, fit_y, c, params.max_iter, params.standardize, seed)
        report = split_report(val, predict_labels(model, select_x), select_index, fairness=False)
        models.append(model)
        scores.append({"c": float(c), "worst_group": report["worst_group"], "avg": report["avg"],
                       "unbiased": report["unbiased"], **({"worst_class": report["worst_class"]}
                                                          if "worst_class" in report else {})})
        progress.advance("linear probe: C grid", index + 1, len(params.c_grid), unit="C")
    best = select_c(scores)
    chosen = models[best]
    return {
        "c": float(params.c_grid[best]),
        "train_split": params.train_split,
        "n_fit": int(fit_y.numel()),
        "n_select": int(select_index.numel()),
        "val_scores": scores,
        "test": split_report(splits["test"], predict_labels(chosen, features["test"])),
        "val": split_report(val, predict_labels(chosen, select_x), select_index),
    }, chosen, select_index
