"""The clustering of ``groups.method: cluster`` (declared in :mod:`debias.groups.methods.cluster`, whose docstring
states the method): UMAP of the ERM embeddings, then KMeans or GMM over all points or within each class."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from debias.data.store import BiasedSplit
from debias.groups.embedding import import_umap, umap_fit
from debias.groups.matching import hungarian_map
from debias.groups.registry import GroupInference
from debias.harness import progress


def _kmeans(points: np.ndarray, k: int, n_init: int, seed: int) -> np.ndarray:
    from sklearn.cluster import KMeans

    return KMeans(n_clusters=k, n_init=n_init, random_state=seed).fit_predict(points)


def _gmm(points: np.ndarray, k: int, n_init: int, seed: int) -> np.ndarray:
    from sklearn.mixture import GaussianMixture

    return GaussianMixture(n_components=k, n_init=n_init, random_state=seed).fit(points).predict(points)


ClusterFn = Callable[[np.ndarray, int, int, int], np.ndarray]
CLUSTERERS: dict[str, ClusterFn] = {"kmeans": _kmeans, "gmm": _gmm}


def cluster_points(points: torch.Tensor, k: int, algorithm: str, n_init: int, seed: int) -> torch.Tensor:
    """Cluster ids in ``0 .. k-1`` (int64 [N]) from ``CLUSTERERS[algorithm]``, seeded."""
    if algorithm not in CLUSTERERS:
        raise ValueError(f"clustering algorithm '{algorithm}' unknown; allowed: {', '.join(CLUSTERERS)}")
    ids = CLUSTERERS[algorithm](points.detach().cpu().double().numpy(), k, n_init, seed)
    return torch.as_tensor(ids, dtype=torch.long)


def match_clusters_to_classes(cluster: torch.Tensor, y: torch.Tensor, n_classes: int) -> torch.Tensor:
    """label_n = m(cluster_n), m the one-to-one cluster -> class map maximising #{n : m(cluster_n) = y_n}."""
    return hungarian_map(cluster, y, n_classes, n_classes)[cluster]


def size_ranks(cluster: torch.Tensor, k: int) -> torch.Tensor:
    """Rank of each cluster id ``0 .. k-1`` by size, largest first (ties: lower id first): int64 [k]."""
    order = torch.argsort(-torch.bincount(cluster, minlength=k), stable=True)
    ranks = torch.empty(k, dtype=torch.long)
    ranks[order] = torch.arange(k)
    return ranks


def within_class_ranks(points: torch.Tensor, y: torch.Tensor, n_classes: int, k: int, algorithm: str,
                       n_init: int, seed: int) -> torch.Tensor:
    """Each class's points in min(k, n_c) clusters; per point the size rank of its cluster (0 = largest): int64 [N]."""
    rank = torch.zeros(len(y), dtype=torch.long)
    for label in range(n_classes):
        members = torch.nonzero(y == label).flatten()
        k_class = min(k, len(members))
        if k_class <= 1:
            continue
        cluster = cluster_points(points[members], k_class, algorithm, n_init, seed)
        rank[members] = size_ranks(cluster, k_class)[cluster]
    return rank


def label_within_class_clusters(rank: torch.Tensor, y: torch.Tensor, logits: torch.Tensor, k: int) -> torch.Tensor:
    """Rank 0 -> own class y; rank r > 0 -> argmax_{c != y} of the mean ERM softmax over cluster (y, r): int64 [N]."""
    n_classes = logits.shape[1]
    group = y * k + rank
    sums = torch.zeros(n_classes * k, n_classes, dtype=torch.float64).index_add_(0, group, logits.double().softmax(1))
    own = torch.arange(n_classes * k) // k
    sums[torch.arange(n_classes * k), own] = -torch.inf  # the argmax of the mean equals that of the sum
    foreign = sums.argmax(1) if n_classes > 1 else own
    per_group = torch.where(torch.arange(n_classes * k) % k == 0, own, foreign)
    return per_group[group]



# ---------------------------------------------------------------- the method

def _timed(timings: dict[str, float], key: str, start: float) -> float:
    now = time.perf_counter()
    timings[key] = round(now - start, 4)
    return now


def infer_cluster(train: BiasedSplit, z: torch.Tensor, logits: torch.Tensor, params: Any, seed: int) -> GroupInference:
    """UMAP of z, then C clusters matched to classes (per_class 1) or k clusters per class (per_class k)."""
    cluster_params = params.cluster
    timings: dict[str, float] = {}
    start = time.perf_counter()
    import_umap()
    start = _timed(timings, "umap_import_s", start)
    if len(z) < 3:
        raise ValueError(f"groups.method=cluster needs at least 3 training points for UMAP, found {len(z)}")
    with progress.step("infer_groups", f"UMAP of {len(z)} training points"):
        embedding = umap_fit(z, cluster_params.umap_components, cluster_params.umap_neighbors,
                             cluster_params.umap_min_dist, seed)
    start = _timed(timings, "umap_fit_s", start)
    k = cluster_params.per_class
    if k == 1:
        cluster = cluster_points(embedding, train.n_classes, cluster_params.algorithm, cluster_params.n_init, seed)
        label = match_clusters_to_classes(cluster, train.y, train.n_classes)
        group = train.y * train.n_classes + label
    else:
        rank = within_class_ranks(embedding, train.y, train.n_classes, k, cluster_params.algorithm,
                                  cluster_params.n_init, seed)
        label = label_within_class_clusters(rank, train.y, logits, k)
        group = train.y * k + rank
    _timed(timings, "cluster_s", start)
    return GroupInference(label, group, label != train.y, embedding, timings)
