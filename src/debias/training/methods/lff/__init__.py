"""Learning from Failure (Nam et al. 2020): the ``lff`` declaration; its training is ``train.py``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from debias.params import Section
from debias.training.methods.registry import register_method

if TYPE_CHECKING:
    from debias.core.resources import StepPlan
    from debias.params import Params


class LfFParams(Section):
    """Learning from Failure (Nam et al. 2020): GCE-trained biased model, relative-difficulty weighted debiased model."""

    q: float = Field(0.7, gt=0, le=1, description="GCE exponent of the biased model (LfF paper and CNC's CMNIST* runs: 0.7)")
    ema_alpha: float = Field(0.7, ge=0, lt=1, description="per-sample EMA of the losses in the weight (LfF code: 0.7)")


SOURCES: dict[str, str] = {
    "q": "paper: LfF: GCE q (default 0.7; CNC App. D.2.5's CMNIST* grid chose 0.7)",
    "ema_alpha": "code: LfF's code: EMA alpha (default 0.7)",
}


def memory_plan(params: Params, n_train: int) -> StepPlan:
    """The biased and the debiased model forward the same batch."""
    from debias.core.resources import StepPlan

    return StepPlan("stage2.batch_size", params.stage2.batch_size, forwards=2, max_value=n_train)


register_method("lff", f"{__name__}.train:lff_method", display="LfF", head_trained=True, section="lff",
                params=LfFParams, sources=SOURCES, memory_plan=memory_plan, capturable=True)
