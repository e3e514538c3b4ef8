"""The ``loss`` section: the contrastive objectives and FairKL."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from debias.params.base import MIN_TEMPERATURE, Section


class FairKLParams(Section):
    weight: float = Field(0.0, ge=0, le=1000, description="lambda of the FairKL term (0: off)")
    variant: Literal["kl", "mean", "released"] = Field(
        "kl", description="kl: the paper's Eq. 10 (Gaussian KL of the pair-set distances) with alpha * L_con; mean: "
                          "Eq. 9; released: the objective of the authors' released code (main_infonce.py, losses.py), "
                          "alpha^2 * (tau / 0.07) * L_con + weight * (moment matching on similarities + two linear "
                          "terms), the code that produced the paper's tables (docs/methods.md)")
    variance_floor: float = Field(1e-6, gt=0, le=1, description="variances of the pair-set distances are floored at this "
                                  "(squared-distance units, 0..16) so the Gaussian KL (Eq. 10) stays finite")
    sampler: Literal["shuffle", "stratified"] = Field(
        "shuffle", description="shuffle: plain shuffled batches (the paper); stratified: every batch holds "
                               "minority_per_batch inferred-minority points, so FairKL's four pair sets are never empty "
                               "(an extension, not in the paper)")
    minority_per_batch: int = Field(16, ge=1, le=65536, description="stratified: inferred-minority points per batch")


class EpsSupConParams(Section):
    """eps-SupCon's own margin and FairKL weight (FairKL paper Table 6 tunes them apart from eps-SupInfoNCE's)."""

    epsilon: float = Field(0.0, ge=0, le=100, description="epsilon of eps-SupCon (logit units); FairKL paper Table 6: "
                           "0.25 / 0 / 0.5 / 0 at rho 0.999 / 0.997 / 0.995 / 0.99 (default: rho 0.99's)")
    fairkl_weight: float = Field(0.0, ge=0, le=1000, description="lambda of FairKL with eps-SupCon (used instead of "
                                 "loss.fairkl.weight); FairKL paper Table 6: 0.75 / 0.5 / 0.5 / 0.5 at rho 0.999 / "
                                 "0.997 / 0.995 / 0.99; 0: off (the default, as loss.fairkl.weight's)")


class LossParams(Section):
    """The supervised contrastive losses (supcon, eps_supcon, eps_supinfonce) and FairKL; CNC reads the margin
    ``epsilon`` only, and CNC and WCL keep their own temperature in stage2.cnc / stage2.wcl."""

    temperature: float = Field(0.1, ge=MIN_TEMPERATURE, le=10, description="tau of the supcon family (SupCon and FairKL "
                               "papers: 0.1); s_ij = z_i . z_j / tau (>= MIN_TEMPERATURE: float32)")
    epsilon: float = Field(0.0, ge=0, le=100, description="epsilon margin (logit units, after division by tau) of "
                           "eps-SupInfoNCE and of CNC's loss (eps-SupCon's form there); 0: none, CNC's own loss; FairKL "
                           "paper Table 6: 0.5 for eps-SupInfoNCE at every rho")
    alpha: float = Field(1.0, ge=0, le=1000, description="weight of the contrastive term (FairKL paper Eq. 11 / "
                         "Table 6: 0.03; with fairkl.variant released the code applies it twice, alpha^2)")
    fairkl: FairKLParams = Field(default_factory=FairKLParams)
    eps_supcon: EpsSupConParams = Field(default_factory=EpsSupConParams)
