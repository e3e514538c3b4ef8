"""DFR (Kirichenko, Izmailov, Wilson 2022), ``probe.method: dfr``: last-layer retraining on group-balanced
validation data, DFR^Val_Tr as its released code runs it; the declaration (its ``probe.dfr`` section with the
source of each default), the code is ``fit.py``."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from debias.evaluation.variants import register_probe
from debias.params.base import Section
from debias.params.probe import _positive_distinct


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


SOURCES: dict[str, str] = {
    "c_grid": "code: DFR dfr_evaluate_spurious.py C_OPTIONS",
    "penalty": "code: DFR dfr_evaluate_spurious.py: L1 (liblinear)",
    "retrains": "code: DFR dfr_evaluate_spurious.py: 20 balanced subsets, weights averaged (default 20)",
}


def val_splits(params: Any) -> tuple[str, ...]:
    """The biased splits DFR reads: it fits and selects on validation only, whatever ``probe.train_split``."""
    return ("val", "test")


register_probe("dfr", val_splits, fit=f"{__name__}.fit:dfr_probe", display="DFR", section="dfr", params=DFRParams,
               sources=SOURCES, reads=("probe.max_iter", "probe.standardize"), needs_attribute=True)
