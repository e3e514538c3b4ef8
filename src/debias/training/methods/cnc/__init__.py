"""Correct-N-Contrast (CNC, Zhang et al. 2022): the ``cnc`` method's declaration; its training is ``train.py``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field, field_validator

from debias.params import MIN_TEMPERATURE, Section
from debias.training.methods.registry import LossTerm, register_method

if TYPE_CHECKING:
    from debias.core.resources import StepPlan
    from debias.params import Params


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
    contrastive_weight: float = Field(0.75, ge=0, lt=1, description="lambda: lambda * contrastive + (1 - lambda) * CE")
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
                               "short pools drawn with replacement, with a cnc-small-pools note) | shrink (the "
                               "released contrastive_supervised_loader.py's adjust_num_pos_neg_: M and N cut to the "
                               "smallest pool, for every batch)")
    @field_validator("contrastive_weight", mode="before")
    @classmethod
    def _head_trains(cls, value: object) -> object:
        if isinstance(value, (int, float)) and value == 1:
            raise ValueError("the classifier head's cross-entropy weight 1 - lambda is then 0: the head gets no gradient "
                             "and every accuracy (the epoch selection's too) is an untrained head's")
        return value

    head_gradient: Literal["step", "epoch_sum"] = Field(
        "step", description="the classifier head's gradient at each optimiser step: step (CNC Alg. 3: this step's "
                            "batches, like the encoder's) | epoch_sum (the released train_supervised_contrast.py, "
                            "whose classifier optimiser is zeroed once per epoch: each step applies the sum of the "
                            "epoch's head gradients so far)")


SOURCES: dict[str, str] = {
    "num_positives": "paper: CNC App. D.2.4 (CMNIST*): M = 32 (schema default 32); params.yaml 8 (ours: the q3m8 "
                     "schedule chosen on validation, measured in benchmarks/results/default_search.md)",
    "num_negatives": "paper: CNC App. D.2.4 (CMNIST*): N = 32 (schema default 32); params.yaml 8 (ours: the q3m8 "
                     "schedule chosen on validation, measured in benchmarks/results/default_search.md)",
    "two_sided": "paper: CNC App. B.3 / Alg. 3: two-sided batches (default true)",
    "temperature": "paper: CNC App. D.2.4: CMNIST*, CelebA (default 0.05)",
    "anchor_fraction": "paper: CNC Alg. 3 (default 1: every anchor once per epoch; params.yaml 1.0 with 3 epochs and "
                       "pools of 8, the q3m8 schedule chosen on validation, measured in "
                       "benchmarks/results/default_search.md)",
    "accumulation": "paper: CNC App. D.2.4 (schema default 32); params.yaml 1 (ours: the default schedule measured in "
                    "benchmarks/results/default_search.md; the paper's whole schedule, SGD with 32 batches per step, "
                    "measured 46.2 [20.4, 72.0] points of validation unbiased accuracy on clusters, row "
                    "`cnc-paper-cluster-replace-e0` of benchmarks/results/default_search_d1b5879.md; accumulation "
                    "alone was not varied)",
    "contrastive_weight": "paper: CNC App. D.2.4: lambda (default 0.75)",
    "init": "paper: CNC App. D.2.4: a new model (scratch)",
    "forward_chunk": "ours: 8 batches per forward pass (default 8; speed and memory; no effect on results without "
                     "BatchNorm or with encoder_mode eval; with BatchNorm in train mode the chunk's batches share "
                     "batch statistics)",
    "encoder_mode": "ours: train (default train: a freshly initialised encoder has no running statistics worth "
                    "freezing); the released train_supervised_contrast.py (train_epoch: encoder.eval()) keeps eval, "
                    "which the cnc-* presets set",
    "short_pools": "code: shrink is the released code's adjust_num_pos_neg_ (M and N cut to the smallest pool); "
                   "schema default and params.yaml replace (ours: keeps App. D.2.4's M and N, draws short pools with "
                   "replacement and warns; shrink against replace measured -1.0 [-2.2, +0.3] points of validation "
                   "unbiased accuracy, row `pools` of benchmarks/results/default_search.md)",
    "head_gradient": "paper: CNC Alg. 3 (default step: one gradient per step for the whole model); epoch_sum is the "
                     "released train_supervised_contrast.py (train_epoch zeroes optim_c once per epoch, and per step "
                     "only when --replicate > 50; its README's commands pass --replicate 42), which the cnc-* presets set",
    "skip_empty_classes": "paper: CNC Alg. 3 needs a positive per class (schema default false: fail); params.yaml "
                          "true (ours: ERM fits ~1k digits with no error in some classes)",
}


def memory_plan(params: Params, n_train: int) -> StepPlan:
    """A forward pass of ``forward_chunk`` contrastive batches of 2M + 2N images (one-sided: 2M + N)."""
    from debias.core.resources import StepPlan

    cnc = params.stage2.cnc
    per_batch = 2 * cnc.num_positives + (2 if cnc.two_sided else 1) * cnc.num_negatives
    return StepPlan("stage2.cnc.forward_chunk", cnc.forward_chunk, images_per_unit=per_batch,
                    max_value=min(cnc.accumulation, cnc.forward_chunk),
                    hint=f" (one contrastive batch is {per_batch} images): lower stage2.cnc.num_positives "
                         f"({cnc.num_positives}) and stage2.cnc.num_negatives ({cnc.num_negatives})")


# lambda * contrastive + (1 - lambda) * CE (train.py): only the contrastive term reads the margin and the temperature;
# the CE term reads nothing the contrastive one does not (the batches the sampler draws, the head).
LOSS_TERMS = (LossTerm("contrastive", lambda p: p.stage2.cnc.contrastive_weight, "stage2.cnc.contrastive_weight",
                       reads=("loss.epsilon", "stage2.cnc.temperature")),
              LossTerm("cross-entropy", lambda p: 1 - p.stage2.cnc.contrastive_weight, "stage2.cnc.contrastive_weight"))

register_method("cnc", f"{__name__}.train:cnc_method", display="CNC", schema_default=True, head_trained=True,
                temperature=lambda p: ("stage2.cnc.temperature", p.stage2.cnc.temperature),
                section="cnc", params=CNCParams, sources=SOURCES, memory_plan=memory_plan, epsilon_key="loss.epsilon",
                reads_batch_size=False, loss_terms=LOSS_TERMS,
                memory_advice=("stage2.cnc.forward_chunk", "stage2.cnc.num_positives", "stage2.cnc.num_negatives"),
                needs_erm_weights=lambda p: p.stage2.cnc.init == "erm",
                capture_note="a step's stage2.cnc.accumulation contrastive batches are drawn by the host-side sampler and "
                             "forwarded in a Python loop of stage2.cnc.forward_chunk passes, with the epoch_sum head "
                             "gradient kept across steps; the step is not split into host draws and device work")
