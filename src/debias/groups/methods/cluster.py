"""``cluster`` (CNC App. D.2.3): UMAP of the ERM embeddings z (seeded), then KMeans or GMM.

* ``per_class = 1``: C clusters over all points, matched one-to-one to the classes by the Hungarian algorithm on
  the cluster x class table (maximum agreement with y); label = matched class; minority = label != y;
  group = y * C + label.
* ``per_class = k > 1`` (GEORGE-style): k clusters within each class's points (on the one UMAP of all points),
  numbered by size: rank 0 = the class's largest cluster = the inferred majority, label = own class c. A smaller
  cluster (rank r > 0) gets the label ``argmax_{c' != c} mean_{n in cluster} softmax(logits_n)[c']`` - the class
  ERM mistakes its points for most, i.e. the bias value they share with that class's majority, which keeps labels
  comparable across classes (CNC's sampler pairs "same label, other class"). minority = label != y (= rank > 0);
  group = y * k + rank.

The declaration; the clustering runs in :mod:`debias.groups.clustering` (imported when the method runs).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from debias.groups.registry import register_group_method
from debias.params.base import Section


class ClusterParams(Section):
    """CNC App. D.2.3: UMAP of ERM features, then KMeans/GMM, clusters matched to classes."""

    algorithm: Literal["kmeans", "gmm"] = "kmeans"
    umap_components: int = Field(2, ge=1, le=64)
    umap_neighbors: int = Field(15, ge=2, le=1000)
    umap_min_dist: float = Field(0.1, ge=0, le=1)
    per_class: int = Field(1, ge=1, le=100, description="1: one cluster per class (CNC); k > 1: k clusters within each class (GEORGE-style)")
    n_init: int = Field(10, ge=1, le=100)


SOURCES: dict[str, str] = {
    "algorithm": "paper: CNC App. D.2.3 (UMAP then K-means or GMM; K-means)",
    "umap_components": "paper: CNC App. D.2.3: 2 UMAP components (default 2)",
    "umap_neighbors": "code: umap-learn's own n_neighbors (default 15; CNC / GEORGE use umap-learn's)",
    "umap_min_dist": "code: umap-learn's own min_dist (default 0.1)",
    "per_class": "paper: CNC App. D.2.3: C clusters for C classes (default 1: one per class)",
    "n_init": "code: scikit-learn KMeans' n_init before 1.4 (default 10)",
}

register_group_method("cluster", "debias.groups.clustering:infer_cluster", display="ERM feature clusters",
                      section="cluster", params=ClusterParams, sources=SOURCES,
                      transfer="debias.groups.clustering:transfer_cluster")
