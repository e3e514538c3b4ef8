"""The logistic probe (``probe.method: logistic``): multinomial logistic regression per ``C`` of ``probe.c_grid`` on
``probe.train_split`` (or the first stratified half of validation), ``C`` chosen on validation; the code is
``fit.py`` (see :mod:`debias.evaluation.probe`)."""

from __future__ import annotations

from typing import Any

from debias.evaluation.variants import register_probe


def train_splits(params: Any) -> tuple[str, ...]:
    """The biased splits the logistic probe reads (``train`` only when it fits there)."""
    return ("train", "val", "test") if params.train_split == "train" else ("val", "test")


register_probe("logistic", train_splits, fit=f"{__name__}.fit:logistic_probe", display="logistic probe",
               schema_default=True, reads=("probe.train_split", "probe.c_grid", "probe.max_iter", "probe.standardize"))
