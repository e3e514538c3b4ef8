"""The ``probe`` section: the linear probe and its variants (DFR, post-processing)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from debias.params.base import Section, show


def _positive_distinct(values: list[float]) -> list[float]:
    if any(v <= 0 for v in values):
        raise ValueError(f"every value must be > 0, got {show(values)}")
    if len(set(values)) != len(values):
        raise ValueError(f"values repeat in {show(values)}; allowed: distinct values")
    return values


class DFRParams(Section):
    """DFR (Kirichenko, Izmailov, Wilson 2022), DFR^Val_Tr as its released code (dfr_evaluate_spurious.py) runs it:
    L1 logistic regression (liblinear) on group-balanced subsets of the validation split."""

    c_grid: list[float] = Field(default_factory=lambda: [1.0, 0.7, 0.3, 0.1, 0.07, 0.03, 0.01], min_length=1,
                                description="inverse strengths tried (DFR's C_OPTIONS); the best worst-group of the other half wins")
    penalty: Literal["l1", "l2"] = Field("l1", description="DFR: l1")
    retrains: int = Field(20, ge=1, le=1000, description="balanced subsets of the whole validation split whose "
                                                         "weights are averaged (DFR: 20)")

    @field_validator("c_grid")
    @classmethod
    def _positive(cls, values: list[float]) -> list[float]:
        return _positive_distinct(values)


class ProbeParams(Section):
    train_split: Literal["train", "val"] = "train"
    c_grid: list[float] = Field(default_factory=lambda: [0.01, 0.1, 1.0, 10.0], min_length=1,
                                description="inverse L2 strengths tried; the best validation worst-group wins")
    max_iter: int = Field(1000, ge=10, le=100000)
    standardize: bool = True
    method: Literal["logistic", "dfr"] = Field("logistic", description="logistic: the probe above; dfr: last-layer "
                                               "retraining on group-balanced validation data (train_split ignored)")
    dfr: DFRParams = Field(default_factory=DFRParams)
    postprocess: Literal["none", "equalized_odds"] = Field(
        "none", description="equalized_odds: Hardt et al.'s post-processing of the probe (fairlearn ThresholdOptimizer, "
                            "fitted on the probe's selection data), binary tasks; reported beside the probe")

    @field_validator("c_grid")
    @classmethod
    def _positive(cls, values: list[float]) -> list[float]:
        return _positive_distinct(values)
