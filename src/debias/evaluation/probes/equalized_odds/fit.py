"""Equalized-odds post-processing (Hardt, Price, Srebro 2016, "Equality of Opportunity in Supervised Learning"; the
WCL paper's "Eq. Odds" row of Table 3) of a fitted probe, for binary tasks (declared in
:mod:`debias.evaluation.probes.equalized_odds`).

fairlearn's :class:`fairlearn.postprocessing.ThresholdOptimizer` (``constraints='equalized_odds'``, objective
accuracy, ``prefit=True`` on the probe's ``predict_proba``) chooses, per value of the sensitive attribute ``a``, a
randomised threshold on the probe's score of class 1 such that true- and false-positive rates are equal across the
groups and accuracy is highest; it is fitted on the probe's selection data (the validation split, or its second
half when the probe fitted on the first) with their labels and attributes, and applied to the test split with the
test attributes (it needs ``a`` at prediction time, as Hardt et al.'s method does). Its randomisation is seeded.
The report keeps the probe's own test accuracies and fairness (``probe.test``) and adds the post-processed ones.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from debias.data.store import BiasedSplit
from debias.evaluation.linear import split_report


def equalized_odds_fit(model: Any, x: torch.Tensor, y: torch.Tensor, a: torch.Tensor) -> Any:
    """A fitted ThresholdOptimizer (equalized odds, accuracy) around the fitted binary classifier ``model``."""
    from fairlearn.postprocessing import ThresholdOptimizer

    optimiser = ThresholdOptimizer(estimator=model, constraints="equalized_odds", objective="accuracy_score",
                                   prefit=True, predict_method="predict_proba")
    optimiser.fit(x.double().numpy(), y.long().numpy(), sensitive_features=a.long().numpy())
    return optimiser


def equalized_odds_predict(optimiser: Any, x: torch.Tensor, a: torch.Tensor, seed: int) -> torch.Tensor:
    """Post-processed predictions (int64 ``[N]``), the randomised thresholds drawn with ``seed``."""
    pred = optimiser.predict(x.double().numpy(), sensitive_features=a.long().numpy(), random_state=seed)
    return torch.from_numpy(np.asarray(pred, dtype=np.int64))


def equalized_odds_report(model: Any, features: dict[str, torch.Tensor], splits: dict[str, BiasedSplit],
                          select_index: torch.Tensor, seed: int) -> dict:
    """``{constraint, fit_split, n_fit, test}`` (``test``: the post-processed accuracy report with its fairness block),
    or ``{note}`` for a task that is not binary."""
    val, test = splits["val"], splits["test"]
    if val.n_classes != 2:
        return {"note": f"equalized-odds post-processing needs a binary task; this one has {val.n_classes} classes"}
    optimiser = equalized_odds_fit(model, features["val"][select_index], val.y[select_index], val.a[select_index])
    pred = equalized_odds_predict(optimiser, features["test"], test.a, seed)
    return {"constraint": "equalized_odds", "fit_split": "val", "n_fit": int(select_index.numel()),
            "test": split_report(test, pred)}
