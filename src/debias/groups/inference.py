"""Inferred bias labels and groups of the training split: :func:`infer_groups` runs the ``groups.method``, the
stored table and its quality report.

Each method is one module of :mod:`debias.groups.methods` that declares itself in the registry
(:mod:`debias.groups.registry`: :data:`METHODS`, name -> :class:`~debias.groups.registry.GroupMethodSpec`) and
states its rule in its docstring; every one returns a :class:`GroupInference`. The table's optional columns
``bias_score_0 .. bias_score_{K-1}`` hold soft bias scores (the methods that give them). UMAP is imported through
:func:`import_umap`, which turns on numba's on-disk cache so a fresh process reuses compiled code. Results are
stored as a parquet table (:func:`save_groups`, :func:`load_groups`) plus the UMAP coordinates
(:func:`save_embedding`) for the report's figures.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from debias.core import health
from debias.data.store import BiasedSplit
from debias.groups.clustering import (  # noqa: F401  (re-exported)
    CLUSTERERS, cluster_points, infer_cluster, label_within_class_clusters, match_clusters_to_classes, size_ranks,
    within_class_ranks
)
from debias.groups.embedding import exact_knn, import_umap, umap_fit  # noqa: F401  (re-exported)
from debias.groups.matching import group_quality, hungarian_map  # noqa: F401  (re-exported)
from debias.groups.registry import METHODS, GroupInference, group_method  # noqa: F401  (re-exported)
from debias.core.errors import NEEDS_BIAS_LABELS
from debias.core.io import CorruptFileError, atomic_path, load_torch, save_torch
from debias.metrics import inferred_group_accuracies
from debias.params import GroupsBase
from debias.core.paths import GROUPS_DIR, GROUPS_METRICS, GROUPS_TABLE, UMAP_TRAIN  # noqa: F401  (re-exported)

GROUP_COLUMNS = ("index", "y", "inferred_label", "inferred_group", "minority")


# ---------------------------------------------------------------- methods

SCORE_PREFIX = "bias_score_"


def infer_groups(method: str, train: BiasedSplit, z: torch.Tensor, logits: torch.Tensor, params: GroupsBase,
                 seed: int) -> GroupInference:
    """Run the registered method ``method`` (:func:`debias.groups.registry.group_method`) on the training split with
    its ERM embeddings ``z`` [N,D] and ``logits`` [N,C]."""
    spec = group_method(method)
    n = len(train)
    if len(z) != n or len(logits) != n:
        raise ValueError(f"ERM embeddings hold {len(z)} rows and logits {len(logits)}, the training split {n}: "
                         "they come from another split; rerun train_erm")
    if logits.ndim != 2 or logits.shape[1] != train.n_classes:
        raise ValueError(f"ERM logits have shape {tuple(logits.shape)}, expected [N, {train.n_classes}]; rerun train_erm")
    start = time.perf_counter()
    result = spec.infer_fn()(train, z.detach().cpu(), logits.detach().cpu().float(), params, seed)
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
    if group_method(method).needs_attribute:  # labels read from the true attribute are exact
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
