"""The ``evaluate`` section: representation metrics and UMAP."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from debias.params.base import Section


class UMAPParams(Section):
    neighbors: int = Field(15, ge=2, le=1000)
    min_dist: float = Field(0.1, ge=0, le=1)
    max_points: int = Field(2000, ge=10, description="points embedded per split (a seeded subset)")


class EvaluateParams(Section):
    splits: list[Literal["train", "val", "test"]] = Field(default_factory=lambda: ["test", "val"], min_length=1)
    normalize_alignment: bool = Field(False, description="alignment loss on L2-normalised rows (CNC uses raw outputs)")
    block_size: int = Field(2048, ge=16, description="rows per block of pairwise distances (memory bound)")
    max_pair_points: int | None = Field(
        20000, ge=2, description="pairwise metrics (alignment loss, distance statistics) of a split with more rows use "
                                 "a seeded subset of about this many, stratified by group (time bound); null: all rows")
    umap: UMAPParams = Field(default_factory=UMAPParams)
    mi_max_iter: int = Field(1000, ge=10, description="iterations of the logistic regression behind the MI estimate")
    mi_c: float = Field(1.0, gt=0, le=1e6, description="inverse L2 strength C of the MI estimator's logistic regression "
                        "p(y|z) (CNC App. D.2.1 fits sklearn's default, C = 1)")
