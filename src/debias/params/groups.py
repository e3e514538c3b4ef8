"""The ``groups`` section: how stage 1's groups are inferred."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from debias.params.base import Section


class ClusterParams(Section):
    """CNC App. D.2.3: UMAP of ERM features, then KMeans/GMM, clusters matched to classes."""

    algorithm: Literal["kmeans", "gmm"] = "kmeans"
    umap_components: int = Field(2, ge=1, le=64)
    umap_neighbors: int = Field(15, ge=2, le=1000)
    umap_min_dist: float = Field(0.1, ge=0, le=1)
    per_class: int = Field(1, ge=1, le=100, description="1: one cluster per class (CNC); k > 1: k clusters within each class (GEORGE-style)")
    n_init: int = Field(10, ge=1, le=100)


class SoftParams(Section):
    """Soft bias scores (FairKL paper App. B.2.4): softmax of the bias-capturing (ERM) model's logits / temperature."""

    temperature: float = Field(1.0, gt=0, le=1000, description="softmax temperature of the ERM logits (1: its softmax; "
                                                               "higher: softer scores)")


class GroupsParams(Section):
    method: Literal["pred", "cluster", "true", "soft"] = "pred"
    cluster: ClusterParams = Field(default_factory=ClusterParams)
    soft: SoftParams = Field(default_factory=SoftParams)

    @field_validator("method", mode="before")
    @classmethod
    def _yaml_true_is_the_oracle(cls, value: Any) -> Any:
        """YAML (and ``dvc exp run -S groups.method=true``) reads the word true as a boolean."""
        return "true" if value is True else value
