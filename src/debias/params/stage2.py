"""The ``stage2`` section: the stage-2 method, its optimiser and each method's own settings."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from debias.params.base import MIN_TEMPERATURE, Section
from debias.params.model import HeadInput
from debias.params.optim import OptimParams


class CNCParams(Section):
    """CNC App. B.3 / D.2.4: two-sided contrastive batches from inferred labels."""

    num_positives: int = Field(32, ge=1, le=4096, description="M: anchors and positives per side")
    num_negatives: int = Field(32, ge=1, le=4096, description="N: negatives per side")
    two_sided: bool = True
    temperature: float = Field(0.05, ge=MIN_TEMPERATURE, le=10, description="tau of CNC's loss (Eq. 15; App. D.2.4: 0.05 on CMNIST*)")
    anchor_fraction: float = Field(
        1.0, gt=0, le=1, description="fraction of the anchors (inferred-majority points) that seed a two-sided batch in "
                                     "one epoch, a fresh random subset each epoch; 1: Alg. 3 (one batch per anchor); the "
                                     "released code's target_sample_ratio")
    accumulation: int = Field(32, ge=1, le=1024, description="contrastive batches per optimiser step")
    contrastive_weight: float = Field(0.75, ge=0, le=1, description="lambda: lambda * contrastive + (1 - lambda) * CE")
    init: Literal["scratch", "erm"] = "scratch"
    forward_chunk: int = Field(8, ge=1, le=1024, description="contrastive batches per forward pass; >= accumulation: a "
                               "step's batches in one pass. The same gradient without BatchNorm; with BatchNorm the "
                               "batch statistics of the whole pass (1: per two-sided batch, ours; speed: docs/gpu.md)")
    skip_empty_classes: bool = Field(False, description="skip (and report) classes with no inferred minority point instead of failing")
    encoder_mode: Literal["train", "eval"] = Field(
        "train", description="the encoder's mode while stage 2 trains: train (ours: BatchNorm normalises with each "
                             "forward pass's statistics and updates its running ones) | eval (the released "
                             "train_supervised_contrast.py: BatchNorm on the initial weights' running statistics "
                             "throughout); no effect on encoders without BatchNorm (LeNet-5)")
    short_pools: Literal["replace", "shrink"] = Field(
        "replace", description="pools smaller than M or N: replace (ours: every batch keeps App. D.2.4's M and N, "
                               "short pools drawn with replacement, with a cnc-small-pools warning) | shrink (the "
                               "released contrastive_supervised_loader.py's adjust_num_pos_neg_: M and N cut to the "
                               "smallest pool, for every batch)")


class JTTParams(Section):
    upweight: int = Field(20, ge=1, le=10000,
                          description="JTT lambda_up: extra copies of each ERM training error per epoch (each appears "
                                      "1 + upweight times, as JTT's run_expt.py; JTT paper's grid 20 / 50 / 100 on "
                                      "Waterbirds and CelebA; CNC's CMNIST*: ~1100)")


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


class HeadParams(Section):
    """The linear head fitted on frozen features after every epoch for methods without a CE-trained head."""

    features: HeadInput = Field("raw", description="the head's input: raw (the encoder output z, as the linear probe "
                                "reads it) | unit (z / |z|, the released FairKL code's classifier: fc(normalize(feat)))")

    weight_decay: float = Field(1e-4, ge=0, le=100, description="L2 penalty weight_decay * |W|^2 added to the head's mean CE")
    max_iter: int = Field(100, ge=1, le=100000, description="L-BFGS iterations of the head fit")
    warm_start: bool = Field(True, description="start each epoch's fit from the previous epoch's head instead of zero "
                             "(ours: on the default data 17 % fewer L-BFGS iterations and the same selected epoch and "
                             "accuracies in 3 of 3 seeds, benchmarks/results/head_warm_start.md); false: from zero")
    tolerance: float = Field(1e-7, gt=0, le=1, description="stop once every gradient entry is below it (L-BFGS's "
                             "tolerance_grad; torch's default 1e-7)")


class LfFParams(Section):
    """Learning from Failure (Nam et al. 2020): GCE-trained biased model, relative-difficulty weighted debiased model."""

    q: float = Field(0.7, gt=0, le=1, description="GCE exponent of the biased model (LfF paper and CNC's CMNIST* runs: 0.7)")
    ema_alpha: float = Field(0.7, ge=0, lt=1, description="per-sample EMA of the losses in the weight (LfF code: 0.7)")


class GroupDROParams(Section):
    """Group DRO (Sagawa et al. 2020, Alg. 1) on the groups table's groups (true with groups.method: true)."""

    step_size: float = Field(0.01, gt=0, le=100, description="eta_q of the group-weight update (Sagawa et al.: 0.01)")
    adjustment: float = Field(0.0, ge=0, le=100, description="C of the group adjustment C / sqrt(n_g) (CNC's CMNIST*: 0)")
    balanced_sampling: bool = Field(True, description="draw batches group-balanced, with replacement (Alg. 1's uniform "
                                    "group draw; the authors' runs: --reweight_groups); false: plain shuffled epochs")


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


class TabularViewParams(Section):
    """SCARF views of feature vectors (Bahri et al. 2022) for the self-supervised methods (wcl, dcl, hcl)."""

    corruption_rate: float = Field(0.6, ge=0, le=1, description="share of each row's features replaced from the "
                                                               "marginals (SCARF: 0.6)")


class SpeedParams(Section):
    """Opt-in speed settings of stage 2's encoder (each off by default; measured effects: docs/gpu.md)."""

    autocast: Literal["none", "bf16"] = Field("none", description="bf16: the encoder's forward under bfloat16 autocast, "
                                              "its features cast back to float32 for the losses and the head (ours)")
    compile: bool = Field(False, description="torch.compile the encoder in place (ours; the first steps compile)")
    channels_last: bool = Field(False, description="convolution weights in channels-last memory format (ours)")


class Stage2Params(OptimParams):
    method: Literal["cnc", "supcon", "eps_supcon", "eps_supinfonce", "wcl", "jtt", "erm", "lff", "groupdro", "dcl",
                    "hcl"] = "cnc"
    head: HeadParams = Field(default_factory=HeadParams)
    speed: SpeedParams = Field(default_factory=SpeedParams)
    cnc: CNCParams = Field(default_factory=CNCParams)
    jtt: JTTParams = Field(default_factory=JTTParams)
    wcl: WCLParams = Field(default_factory=WCLParams)
    lff: LfFParams = Field(default_factory=LfFParams)
    groupdro: GroupDROParams = Field(default_factory=GroupDROParams)
    dcl: DCLParams = Field(default_factory=DCLParams)
    hcl: HCLParams = Field(default_factory=HCLParams)
    tabular_view: TabularViewParams = Field(default_factory=TabularViewParams)
