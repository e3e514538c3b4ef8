"""Inferred bias labels and groups of the training split, one method per ``groups.method``.

Methods live in :data:`METHODS` (name -> function); every one returns a :class:`GroupInference`:

- ``pred``    (CNC Sec. 4) label = argmax of the ERM logits; minority = label != y;
              group = y * C + label.
- ``cluster`` (CNC App. D.2.3) UMAP of the ERM embeddings z (seeded), then KMeans or GMM:
    * ``per_class = 1``: C clusters over all points, matched one-to-one to the classes by the
      Hungarian algorithm on the cluster x class table (maximum agreement with y);
      label = matched class; minority = label != y; group = y * C + label.
    * ``per_class = k > 1`` (GEORGE-style): k clusters within each class's points (on the one
      UMAP of all points), numbered by size: rank 0 = the class's largest cluster = the inferred
      majority, label = own class c. A smaller cluster (rank r > 0) gets the label
      ``argmax_{c' != c} mean_{n in cluster} softmax(logits_n)[c']`` - the class ERM mistakes its
      points for most, i.e. the bias value they share with that class's majority, which keeps
      labels comparable across classes (CNC's sampler pairs "same label, other class").
      minority = label != y (= rank > 0); group = y * k + rank.
- ``true``    (oracle) label = the true bias attribute a; minority = ~aligned; group = y * A + a.
- ``soft``    (FairKL paper App. B.2.4) soft bias scores from a bias-capturing model instead of hard labels:
              the ERM model (trained on the biased data, it captures the bias) gives every point the
              scores ``softmax(logits / groups.soft.temperature)`` over the C bias labels of ``pred`` (a
              class's colour is the bias label ERM maps it to); FairKL then weights a pair's membership of
              the same-bias sets by ``p_i . p_j`` instead of ``1[b_i = b_j]``. label, group and minority as
              ``pred`` (the scores' argmax), for the methods that need hard labels.

The table's optional columns ``bias_score_0 .. bias_score_{K-1}`` hold soft bias scores (``soft`` only).
UMAP is imported through :func:`import_umap`, which turns on numba's on-disk cache so a fresh
process reuses compiled code. Results are stored as a parquet table (:func:`save_groups`,
:func:`load_groups`) plus the UMAP coordinates (:func:`save_embedding`) for the report's figures.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from debias import health, progress
from debias.data.store import BiasedSplit
from debias.errors import NEEDS_BIAS_LABELS
from debias.embedding import exact_knn, import_umap, umap_fit  # noqa: F401  (re-exported)
from debias.groups.matching import group_quality, hungarian_map
from debias.io import CorruptFileError, atomic_path, load_torch, save_torch
from debias.metrics import inferred_group_accuracies
from debias.params import GroupsParams
from debias.paths import GROUPS_DIR, GROUPS_METRICS, GROUPS_TABLE, UMAP_TRAIN  # noqa: F401  (re-exported)

GROUP_COLUMNS = ("index", "y", "inferred_label", "inferred_group", "minority")



@dataclass
class GroupInference:
    """Inferred bias label, group and minority flag per training point (row n = split index n)."""

    inferred_label: torch.Tensor  # int64 [N] bias label, comparable across classes
    inferred_group: torch.Tensor  # int64 [N] (class, label or within-class cluster), see the module docstring
    minority: torch.Tensor  # bool [N] inferred bias-conflicting
    embedding2d: torch.Tensor | None = None  # float [N, umap_components] UMAP coordinates (cluster only)
    timings: dict[str, float] = field(default_factory=dict)  # seconds per step
    y: torch.Tensor | None = None  # int64 [N] class, filled by infer_groups and load_groups
    bias_scores: torch.Tensor | None = None  # float32 [N, K] soft bias scores, rows sum to 1 (soft only)

    def __len__(self) -> int:
        return int(self.inferred_label.numel())


# ---------------------------------------------------------------- clustering

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


# ---------------------------------------------------------------- methods

def _timed(timings: dict[str, float], key: str, start: float) -> float:
    now = time.perf_counter()
    timings[key] = round(now - start, 4)
    return now


def infer_pred(train: BiasedSplit, z: torch.Tensor, logits: torch.Tensor, params: GroupsParams, seed: int) -> GroupInference:
    """label = argmax logits; minority = label != y; group = y * C + label."""
    label = logits.argmax(1).long()
    return GroupInference(label, train.y * train.n_classes + label, label != train.y)


def infer_true(train: BiasedSplit, z: torch.Tensor, logits: torch.Tensor, params: GroupsParams, seed: int) -> GroupInference:
    """label = a (oracle); minority = ~aligned; group = y * A + a."""
    return GroupInference(train.a.clone(), train.g.clone(), ~train.aligned.bool())


def infer_cluster(train: BiasedSplit, z: torch.Tensor, logits: torch.Tensor, params: GroupsParams, seed: int) -> GroupInference:
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


def infer_soft(train: BiasedSplit, z: torch.Tensor, logits: torch.Tensor, params: GroupsParams, seed: int) -> GroupInference:
    """Soft bias scores softmax(logits / T) of the bias-capturing ERM model; hard label, group, minority as pred."""
    scores = torch.softmax(logits.double() / params.soft.temperature, dim=1).float()
    hard = infer_pred(train, z, logits, params, seed)
    hard.bias_scores = scores
    return hard


InferenceFn = Callable[[BiasedSplit, torch.Tensor, torch.Tensor, GroupsParams, int], GroupInference]
METHODS: dict[str, InferenceFn] = {"pred": infer_pred, "cluster": infer_cluster, "true": infer_true, "soft": infer_soft}
SCORE_PREFIX = "bias_score_"


def infer_groups(method: str, train: BiasedSplit, z: torch.Tensor, logits: torch.Tensor, params: GroupsParams,
                 seed: int) -> GroupInference:
    """Run ``METHODS[method]`` on the training split with its ERM embeddings ``z`` [N,D] and ``logits`` [N,C]."""
    if method not in METHODS:
        raise ValueError(f"groups.method = '{method}' unknown; allowed: {', '.join(METHODS)}")
    n = len(train)
    if len(z) != n or len(logits) != n:
        raise ValueError(f"ERM embeddings hold {len(z)} rows and logits {len(logits)}, the training split {n}: "
                         "they come from another split; rerun train_erm")
    if logits.ndim != 2 or logits.shape[1] != train.n_classes:
        raise ValueError(f"ERM logits have shape {tuple(logits.shape)}, expected [N, {train.n_classes}]; rerun train_erm")
    start = time.perf_counter()
    result = METHODS[method](train, z.detach().cpu(), logits.detach().cpu().float(), params, seed)
    result.timings["total_s"] = round(time.perf_counter() - start, 4)
    result.y = train.y.clone()
    return result


# ---------------------------------------------------------------- reporting

# What group_quality measures against the true attribute; without bias labels each reads NEEDS_BIAS_LABELS.
QUALITY_KEYS = ("matched_accuracy", "nmi", "ari", "minority_recall", "minority_precision", "n_true_conflicting",
                "n_found_conflicting", "true_conflicting_per_class")


def label_free_quality(inference: GroupInference, train: BiasedSplit, erm_pred: torch.Tensor | None) -> dict:
    """What the inferred groups show without the true attribute: their sizes, the inferred minority per class, and
    ``inferred_groups``: per (class, inferred label) cell its n and, with ``erm_pred`` (ERM's training predictions),
    ERM's ``correct`` count and ``accuracy`` there (:func:`~debias.metrics.inferred_group_accuracies`; the report
    adds the Wilson interval at ``report.confidence``). Every key of :data:`QUALITY_KEYS` reads NEEDS_BIAS_LABELS."""
    y, minority = train.y.cpu(), inference.minority.cpu().bool()
    label = inference.inferred_label.cpu().long()
    rows = inferred_group_accuracies(erm_pred if erm_pred is not None else y, y, label, None)
    if erm_pred is None:  # sizes only
        rows = [{"y": row["y"], "group": row["group"], "n": row["n"]} for row in rows]
    return {"n": len(y), "n_inferred_minority": int(minority.sum()),
            "inferred_minority_per_class": torch.bincount(y[minority], minlength=train.n_classes).tolist(),
            **dict.fromkeys(QUALITY_KEYS, NEEDS_BIAS_LABELS), "inferred_groups": rows}


def groups_report(method: str, inference: GroupInference, train: BiasedSplit, erm_pred: torch.Tensor | None = None) -> dict:
    """The metrics file: method, :func:`group_quality` vs the true attribute (without bias labels:
    :func:`label_free_quality`) and the ``warnings`` of :func:`group_warnings` (no wall-clock time: a metrics file
    must be identical across identical runs; timings go to their own file)."""
    if not train.has_attribute:
        return {"method": method, **label_free_quality(inference, train, erm_pred), "warnings": []}
    quality = group_quality(inference.inferred_label, inference.minority, train.a, train.aligned, train.y, train.n_classes)
    if inference.bias_scores is not None:  # soft: how peaked the scores are (1: hard labels)
        quality["bias_score_mean_max"] = float(inference.bias_scores.max(1).values.mean())
    return {"method": method, **quality, "warnings": group_warnings(method, quality)}


# Inferred minorities that find less than this fraction of the true bias-conflicting points, or hold less than this
# fraction of them, give a weak-groups warning: methods that read the inferred labels then mostly see noise.
WEAK_GROUPS = 0.5


def group_warnings(method: str, quality: dict) -> list[str]:
    """A ``weak-groups`` warning when the inferred minority misses most bias-conflicting points or is mostly others
    (measured against the true attribute, which only this check and the metrics read)."""
    if method == "true":
        return []
    recall, precision = quality.get("minority_recall"), quality.get("minority_precision")
    weak = [f"{name} {value:.2f}" for name, value in (("recall", recall), ("precision", precision))
            if value is not None and value < WEAK_GROUPS]
    if not weak:
        return []
    return [health.warning("weak-groups", f"groups.method = {method}: the inferred minority has {' and '.join(weak)} "
                                          f"against the true bias-conflicting points (below {WEAK_GROUPS}); stage-2 "
                                          "methods that read the inferred labels (FairKL, CNC, JTT) learn from noise")]


def report_scalars(report: dict, timings: dict[str, float] | None = None) -> dict[str, float]:
    """The report's numbers for MLflow: scalars as they are, timings as ``time/<step>``; lists and None dropped."""
    values: dict = {k: float(v) for k, v in report.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    values.update({k: v for k, v in report.items() if v == NEEDS_BIAS_LABELS})  # named by the run's tag, not dropped
    values.update({f"time/{k}": float(v) for k, v in (timings or {}).items()})
    return values


# ---------------------------------------------------------------- storage

def save_groups(path: str | Path, inference: GroupInference) -> None:
    """Write the parquet table (index, y, inferred_label, inferred_group, minority), atomically."""
    if inference.y is None:
        raise ValueError("save_groups: the inference carries no classes y (use infer_groups)")
    table = pd.DataFrame({
        "index": np.arange(len(inference), dtype=np.int64),
        "y": inference.y.numpy().astype(np.int64),
        "inferred_label": inference.inferred_label.numpy().astype(np.int64),
        "inferred_group": inference.inferred_group.numpy().astype(np.int64),
        "minority": inference.minority.numpy().astype(bool),
    })
    if inference.bias_scores is not None:
        for k, column in enumerate(inference.bias_scores.float().numpy().T):
            table[f"{SCORE_PREFIX}{k}"] = column
    with atomic_path(path) as tmp:
        table.to_parquet(tmp, engine="pyarrow", index=False)


def _column(table: pd.DataFrame, name: str, dtype: type, path: Path) -> torch.Tensor:
    try:
        return torch.from_numpy(table[name].to_numpy(dtype=dtype).copy())
    except (TypeError, ValueError) as exc:
        raise CorruptFileError(f"{path}: column '{name}' is not {dtype.__name__} ({exc}); rerun infer_groups") from None


def load_groups(path: str | Path, y: torch.Tensor | None = None) -> GroupInference:
    """Read a table written by :func:`save_groups` (rows in split order); with ``y``, check it is the same split."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: run the stage that writes it first (dvc repro infer_groups)")
    try:
        table = pd.read_parquet(path, engine="pyarrow")
    except Exception as exc:
        raise CorruptFileError(f"{path} cannot be read as parquet ({type(exc).__name__}: {str(exc)[:200]}); "
                               "it is truncated or foreign: delete it and rerun infer_groups") from None
    missing = [name for name in GROUP_COLUMNS if name not in table.columns]
    if missing:
        raise CorruptFileError(f"{path} lacks the columns {missing} (found {list(table.columns)}); it was written "
                               "by another version or tool: rerun infer_groups (dvc repro infer_groups)")
    if table[list(GROUP_COLUMNS)].isna().to_numpy().any():
        raise CorruptFileError(f"{path} holds missing values; rerun infer_groups")
    table = table.sort_values("index", kind="stable")
    index = _column(table, "index", np.int64, path)
    if not torch.equal(index, torch.arange(len(index))):
        raise CorruptFileError(f"{path}: column 'index' must hold 0 .. N-1 once each; rerun infer_groups")
    stored_y = _column(table, "y", np.int64, path)
    if y is not None and (len(y) != len(stored_y) or not torch.equal(stored_y, y.detach().cpu().long())):
        raise CorruptFileError(f"{path} was written for another training split ({len(stored_y)} rows, this split "
                               f"{len(y)} or other classes); rerun infer_groups")
    score_columns = sorted((c for c in table.columns if str(c).startswith(SCORE_PREFIX)),
                           key=lambda c: int(str(c).removeprefix(SCORE_PREFIX)))
    scores = None
    if score_columns:
        scores = torch.stack([_column(table, c, np.float32, path) for c in score_columns], dim=1)
        if not bool(torch.isfinite(scores).all()) or bool((scores < 0).any()):
            raise CorruptFileError(f"{path}: the bias scores hold negative or non-finite values; rerun infer_groups")
    return GroupInference(
        inferred_label=_column(table, "inferred_label", np.int64, path),
        inferred_group=_column(table, "inferred_group", np.int64, path),
        minority=_column(table, "minority", bool, path),
        y=stored_y,
        bias_scores=scores,
    )


def save_embedding(path: str | Path, inference: GroupInference) -> None:
    """Write the UMAP coordinates (``coords`` float [N, d], ``index`` [N]); an empty [0, 2] when there are none."""
    if inference.embedding2d is None:
        coords, index = torch.zeros(0, 2), torch.zeros(0, dtype=torch.long)
    else:
        coords, index = inference.embedding2d.float(), torch.arange(len(inference.embedding2d))
    save_torch(path, {"coords": coords, "index": index}, kind="umap")


def load_embedding(path: str | Path) -> dict[str, torch.Tensor]:
    """``{"coords": float [N, d], "index": int64 [N]}`` written by :func:`save_embedding` (N = 0: no embedding)."""
    return load_torch(path, "umap", ("coords", "index"))
