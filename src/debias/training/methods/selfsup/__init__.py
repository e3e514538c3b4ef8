"""Difficulty-weighted contrastive learning: the ``wcl`` declaration; its training is ``train.py``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from debias.params import MIN_TEMPERATURE, Section
from debias.training.methods.registry import register_method

if TYPE_CHECKING:
    from debias.core.resources import StepPlan
    from debias.params import Params

# Why the two-view methods (wcl here; dcl, hcl) declare no capturable step (stage2.speed.step: cuda_graph)
VIEWS_NOTE = ("SimCLR's views draw each image's crop, colour and grayscale parameters on the host inside the augmentation "
              "(debias.data.augment.simclr_view), interleaved with the device work; the step is not split into host "
              "draws and device work")


class WCLParams(Section):
    """Difficulty-weighted contrastive learning (Sec. 5.2) with a jointly trained triplet encoder."""

    temperature: float = Field(0.5, ge=MIN_TEMPERATURE, le=10, description="t of the weighted InfoNCE (Sec. 6: 0.5 for all methods)")
    tau_plus: float | None = Field(None, ge=0, lt=1, description="class prior of the debiased-negative correction; "
                                   "null: 1 / number of classes (DCL's tau+ = p(same class) under uniform classes; "
                                   "WCL Sec. 6: 0.1 CIFAR-10, 0.05 CIFAR-100, 0.3 CelebA / Waterbirds); 0: off")
    projection_dim: int = Field(128, ge=0, le=8192, description="output width of the projection head the loss is computed "
                                "on (Linear-BN-ReLU-Linear, hidden = the encoder's width; DCL / HCL code: 128); 0: no head")
    crop_min_scale: float = Field(0.2, gt=0, le=1, description="view: random resized crop of area U(crop_min_scale, 1)")
    colour_strength: float = Field(1.0, ge=0, le=2.5, description="view: SimCLR colour distortion strength s (brightness, "
                                   "contrast, saturation 0.8 s, hue 0.2 s, at most 0.5; SimCLR: 1 on ImageNet, 0.5 on CIFAR)")
    jitter_p: float = Field(0.8, ge=0, le=1, description="view: probability of the colour distortion")
    grayscale_p: float = Field(0.2, ge=0, le=1, description="view: probability of grayscale")
    triplet_weight: float = Field(1.0, ge=0, le=100, description="weight of the biased encoder's triplet loss")


SOURCES: dict[str, str] = {
    "temperature": "paper: WCL Sec. 6.1: t for all methods (default 0.5)",
    "tau_plus": "ours: 1 / number of classes (default null), DCL's tau+ as the class probability under uniform "
                "classes; not measured. It equals WCL Sec. 6.1's 0.1 on CIFAR-10 only: WCL sets 0.05 on CIFAR-100 "
                "and 0.3 on CelebA / Waterbirds, per dataset",
    "projection_dim": "code: DCL / HCL code: a 128-d projection head (default 128)",
    "crop_min_scale": "code: MoCo v2's random resized crop scale (0.2, 1) (default 0.2; SimCLR's ImageNet setting: "
                      "0.08)",
    "colour_strength": "ours: SimCLR's ImageNet strength s = 1 (default 1), not measured: chosen over its CIFAR s = "
                       "0.5 (DCL's code) on the argument of the params.yaml comment (colour is the bias, and 0.5 "
                       "leaves enough of it to tell CMNIST* images apart); no run compares them",
    "jitter_p": "paper: SimCLR: colour distortion with probability 0.8 (default 0.8)",
    "grayscale_p": "paper: SimCLR: grayscale with probability 0.2 (default 0.2)",
    "triplet_weight": "paper: WCL Sec. 5.2: L = L_tri + L_wcl, an unweighted sum (default 1)",
}


def memory_plan(params: Params, n_train: int) -> StepPlan:
    """Two views through two encoders (and their heads), 2B x 2B similarity and weight matrices."""
    from debias.core.resources import StepPlan

    return StepPlan("stage2.batch_size", params.stage2.batch_size, forwards=4, max_value=n_train, pairwise=12)


register_method("wcl", f"{__name__}.train:wcl_method", display="WCL",
                temperature=lambda p: ("stage2.wcl.temperature", p.stage2.wcl.temperature),
                section="wcl", params=WCLParams, sources=SOURCES, reads=("stage2.tabular_view.",),
                memory_plan=memory_plan, capture_note=VIEWS_NOTE)
