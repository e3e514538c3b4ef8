"""Supervised contrastive learning and FairKL: the ``supcon``, ``eps_supcon`` and ``eps_supinfonce`` declarations
(their params are the top-level ``loss`` section, :class:`debias.params.LossParams`); training is ``train.py``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from debias.training.methods.registry import LossTerm, register_method

if TYPE_CHECKING:
    from debias.core.resources import StepPlan
    from debias.params import Params

SUPCON, EPS_SUPCON, EPS_SUPINFONCE = "supcon", "eps_supcon", "eps_supinfonce"
METHODS = {SUPCON: "SupCon", EPS_SUPCON: "ε-SupCon", EPS_SUPINFONCE: "ε-SupInfoNCE"}  # name -> display name
# The released code's classes (debias.losses.released_contrastive's form): EpsilonSupCon for eps_supcon (and supcon,
# epsilon 0), EpsilonSupInfoNCE otherwise.
RELEASED_FORM = {SUPCON: "supcon", EPS_SUPCON: "supcon", EPS_SUPINFONCE: "supinfonce"}


def epsilon(params: Params, method: str) -> float:
    """The epsilon margin ``method`` uses: eps_supcon has its own (FairKL Table 6), supcon none (0), the others
    loss.epsilon."""
    return {EPS_SUPCON: params.loss.eps_supcon.epsilon, SUPCON: 0.0}.get(method, params.loss.epsilon)


def margin_key(method: str) -> str | None:
    """The param of ``method``'s epsilon margin (:func:`epsilon`), None for supcon (no margin)."""
    return {EPS_SUPCON: "loss.eps_supcon.epsilon", SUPCON: None}.get(method, "loss.epsilon")


def fairkl_weight(params: Params, method: str) -> float:
    """lambda of FairKL with ``method``: eps_supcon has its own (FairKL Table 6), the others loss.fairkl.weight."""
    return params.loss.eps_supcon.fairkl_weight if method == EPS_SUPCON else params.loss.fairkl.weight


def _memory_plan(method: str):
    def plan(params: Params, n_train: int) -> StepPlan:
        """B x B similarity matrices of the contrastive loss, and FairKL's distances when it is on."""
        from debias.core.resources import StepPlan

        pairwise = 8 + (8 if fairkl_weight(params, method) > 0 else 0)
        return StepPlan("stage2.batch_size", params.stage2.batch_size, max_value=n_train, pairwise=pairwise)

    return plan


# FairKL's params besides its weight: no other term reads them (train.py: batches() draws shuffled batches, and no
# variance is floored, without FairKL; loss.fairkl.variant also composes the contrastive term, so it is not among them)
FAIRKL_READS = ("loss.fairkl.sampler", "loss.fairkl.minority_per_batch", "loss.fairkl.variance_floor")


def loss_terms(method: str) -> tuple[LossTerm, ...]:
    """alpha * L_con (alpha^2 under the released objective with FairKL) + lambda * FairKL: the contrastive term alone
    reads the margin and the temperature (the released FairKL its own 1.0), FairKL alone :data:`FAIRKL_READS`."""
    margin = tuple(filter(None, [margin_key(method)]))
    return (LossTerm("contrastive", lambda p: p.loss.alpha, "loss.alpha", reads=(*margin, "loss.temperature")),
            LossTerm("FairKL", lambda p: fairkl_weight(p, method),
                     "loss.eps_supcon.fairkl_weight" if method == EPS_SUPCON else "loss.fairkl.weight",
                     reads=FAIRKL_READS))


for _name, _display in METHODS.items():
    # No projection head: the FairKL authors' encoder then ends in Tanh (a ReLU layer keeps every z/|z| in the
    # positive orthant, so no two samples can be pushed more than 90 degrees apart).
    register_method(_name, f"{__name__}.train:contrastive_method", display=_display,
                    temperature=lambda p: ("loss.temperature", p.loss.temperature), feature_activation="tanh",
                    reads=("loss.",), memory_plan=_memory_plan(_name), capturable=True,
                    fairkl_weight=lambda p, method=_name: fairkl_weight(p, method), loss_terms=loss_terms(_name),
                    epsilon_key=margin_key(_name))
