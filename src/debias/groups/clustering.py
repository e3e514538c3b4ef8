"""The clustering of ``groups.method: cluster`` (declared in :mod:`debias.groups.methods.cluster`, whose docstring
states the method): UMAP of the ERM embeddings, then KMeans or GMM over all points or within each class."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from debias.core import progress
from debias.data.store import BiasedSplit
from debias.groups.embedding import import_umap, umap_fit
from debias.groups.matching import hungarian_map
from debias.groups.registry import GroupInference


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


# --------------------------------------------------------------------------- the validation split

def nearest_group_vote(val_z: torch.Tensor, val_y: torch.Tensor, train_z: torch.Tensor, train_y: torch.Tensor,
                       train_group: torch.Tensor, k: int, block: int = 1024) -> torch.Tensor:
    """Per validation point, the group most frequent among its ``k`` nearest training points (Euclidean) of the same
    class (all training points where its class has none); ties: the lower group id. int64 [M]."""
    out = torch.empty(len(val_z), dtype=torch.long)
    n_ids = int(train_group.max()) + 1 if len(train_group) else 1
    for label in val_y.unique().tolist():
        rows = torch.nonzero(val_y == label).flatten()
        pool = torch.nonzero(train_y == label).flatten()
        if len(pool) == 0:
            pool = torch.arange(len(train_y))
        candidates, groups = train_z[pool].double(), train_group[pool]
        kk = min(k, len(pool))
        for start in range(0, len(rows), block):
            chunk = rows[start : start + block]
            distances = torch.cdist(val_z[chunk].double(), candidates)
            nearest = torch.topk(distances, kk, dim=1, largest=False).indices  # [b, kk]
            votes = torch.zeros(len(chunk), n_ids, dtype=torch.long)
            votes.scatter_add_(1, groups[nearest], torch.ones_like(nearest))
            out[chunk] = votes.argmax(1)  # argmax returns the first maximum: the lower group id on a tie
    return out


def transfer_cluster(val: BiasedSplit, val_z: torch.Tensor, val_logits: torch.Tensor, train_z: torch.Tensor,
                     train_inference: GroupInference, params: GroupsParams) -> GroupInference:
    """``per_class = 1`` (clusters over all points, matched to classes): label = the majority inferred label of the
    nearest training points of any class in z, group = y * C + label. ``per_class = k > 1`` (clusters within each
    class): the majority inferred group of the nearest training points of the point's own class."""
    assert train_inference.y is not None
    k = params.cluster.umap_neighbors
    if params.cluster.per_class == 1:
        anywhere_val, anywhere_train = torch.zeros_like(val.y), torch.zeros_like(train_inference.y)
        label = nearest_group_vote(val_z, anywhere_val, train_z, anywhere_train, train_inference.inferred_label, k)
        return GroupInference(label, val.y * val.n_classes + label, label != val.y, y=val.y.clone())
    group = nearest_group_vote(val_z, val.y, train_z, train_inference.y, train_inference.inferred_group, k)
    return _from_groups(val, group, train_inference)

def _from_groups(val: BiasedSplit, group: torch.Tensor, train_inference: GroupInference) -> GroupInference:
    """A validation inference from its groups: labels as the training groups', minority = label != y."""
    labels = train_inference.labels_by_group()
    label = torch.tensor([labels.get(int(g), -1) for g in group.tolist()], dtype=torch.long)
    label = torch.where(label < 0, val.y, label)
    return GroupInference(label, group, label != val.y, y=val.y.clone())
