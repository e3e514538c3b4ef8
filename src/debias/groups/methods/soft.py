"""``soft`` (after FairKL App. B.2.4): soft bias scores from a bias-capturing model instead of hard labels.

The ERM model (trained on the biased data, it captures the bias) gives every point the scores
``softmax(logits / groups.soft.temperature)`` over the C bias labels of ``pred`` (a class's colour is the bias label
ERM maps it to); FairKL then weights a pair's membership of the same-bias sets by ``p_i . p_j`` instead of
``1[b_i = b_j]``. label, group and minority as ``pred`` (the scores' argmax), for the methods that need hard labels.
The groups table keeps the scores in its columns ``bias_score_0 .. bias_score_{C-1}``.
"""

from __future__ import annotations

from pydantic import Field

from debias.groups.methods.pred import infer_pred, transfer_pred
from debias.groups.registry import GroupInference, register_group_method
from debias.params.base import Section


class SoftParams(Section):
    """Soft bias scores (FairKL paper App. B.2.4): softmax of the bias-capturing (ERM) model's logits / temperature."""

    temperature: float = Field(1.0, gt=0, le=1000, description="softmax temperature of the ERM logits (1: its softmax; "
                                                               "higher: softer scores)")


SOURCES: dict[str, str] = {
    "temperature": "ours: the bias-capturing ERM model's own softmax (default 1; not tuned). The soft scores and their "
                   "product p_i . p_j as pair weights are ours, after FairKL App. B.2.4, which weights pairs by the "
                   "similarity of a bias-capturing model's (BagNet18) features instead",
}


def infer_soft(train, z, logits, params, seed: int) -> GroupInference:
    """Soft bias scores softmax(logits / T) of the bias-capturing ERM model; hard label, group, minority as pred."""
    scores = (logits.double() / params.soft.temperature).softmax(dim=1).float()
    hard = infer_pred(train, z, logits, params, seed)
    hard.bias_scores = scores
    return hard


register_group_method("soft", infer_soft, display="soft ERM bias scores", section="soft", params=SoftParams,
                      sources=SOURCES, transfer=transfer_pred)
