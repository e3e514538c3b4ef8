"""DCL (Chuang et al. 2020) and HCL (Robinson et al. 2021), WCL's comparison rows: the ``dcl`` and ``hcl``
declarations; their training is ``train.py``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from debias.params import MIN_TEMPERATURE, Section
from debias.training.methods.registry import register_method
from debias.training.methods.selfsup import VIEWS_NOTE

if TYPE_CHECKING:
    from debias.core.resources import StepPlan
    from debias.params import Params


class DCLParams(Section):
    """Debiased contrastive loss (Chuang et al. 2020), WCL paper's comparison row."""

    temperature: float = Field(0.5, ge=MIN_TEMPERATURE, le=10, description="t (WCL paper Sec. 6.1: 0.5 for all methods)")
    tau_plus: float | None = Field(None, ge=0, lt=1, description="class prior tau+; null: 1 / number of classes "
                                   "(DCL's tau+ = p(same class) under uniform classes; WCL paper / DCL: 0.1 on "
                                   "CIFAR-10)")
    projection_dim: int = Field(128, ge=0, le=8192, description="output width of the projection head the loss is "
                                "computed on (Linear-BN-ReLU-Linear as stage2.wcl's; DCL / HCL code: 128); 0: none")



class HCLParams(DCLParams):
    """Hard-negative contrastive loss (Robinson et al. 2021), WCL paper's comparison row."""

    beta: float = Field(1.0, ge=0, le=100, description="hardness beta (WCL paper Sec. 6.1: 1)")


DCL_SOURCES: dict[str, str] = {
    "projection_dim": "code: DCL's code: a 128-d projection head (default 128)",
    "temperature": "paper: WCL Sec. 6.1: t for all methods (default 0.5)",
    "tau_plus": "ours: 1 / number of classes (default null), DCL's tau+ as the class probability under uniform "
                "classes; not measured. It equals WCL Sec. 6.1's 0.1 on CIFAR-10 only: WCL sets 0.05 on CIFAR-100 "
                "and 0.3 on CelebA / Waterbirds, per dataset",
}
HCL_SOURCES: dict[str, str] = {
    "projection_dim": "code: HCL's code: a 128-d projection head (default 128)",
    "temperature": "paper: WCL Sec. 6.1: t for all methods (default 0.5)",
    "tau_plus": "ours: 1 / number of classes (default null), DCL's tau+ as the class probability under uniform "
                "classes; not measured. It equals WCL Sec. 6.1's 0.1 on CIFAR-10 only: WCL sets 0.05 on CIFAR-100 "
                "and 0.3 on CelebA / Waterbirds, per dataset",
    "beta": "paper: WCL Sec. 6.1: beta for HCL (default 1)",
}


def memory_plan(params: Params, n_train: int) -> StepPlan:
    """Two views of the batch through one encoder, a 2B x 2B similarity matrix."""
    from debias.core.resources import StepPlan

    return StepPlan("stage2.batch_size", params.stage2.batch_size, forwards=2, max_value=n_train, pairwise=12)


DCL, HCL = "dcl", "hcl"
register_method(DCL, f"{__name__}.train:dcl_method", display="DCL",
                temperature=lambda p: ("stage2.dcl.temperature", p.stage2.dcl.temperature),
                section="dcl", params=DCLParams, sources=DCL_SOURCES, reads=("stage2.tabular_view.",),
                memory_plan=memory_plan, capture_note=VIEWS_NOTE)
register_method(HCL, f"{__name__}.train:hcl_method", display="HCL",
                temperature=lambda p: ("stage2.hcl.temperature", p.stage2.hcl.temperature),
                section="hcl", params=HCLParams, sources=HCL_SOURCES, reads=("stage2.tabular_view.",),
                memory_plan=memory_plan, capture_note=VIEWS_NOTE)
