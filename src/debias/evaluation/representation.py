"""Representation metrics of frozen encoders: alignment loss, mutual information, distance statistics, UMAP.

- Alignment loss (CNC Eq. 2-3): for groups g = (y, a), g' = (y, a'), a != a', of one class,
  L(g, g') = 1/(|G||G'|) sum_{x in G} sum_{x' in G'} ||f(x) - f(x')||_2 on the raw encoder outputs
  (L2-normalised rows with ``normalize_alignment``); per class the max over pairs of present groups;
  the reported loss is the mean over classes with at least 2 present groups (the others are listed).
- Mutual information (CNC App. D.2.1 Eq. 16): p(y|z) from multinomial logistic regression fitted on a
  seeded stratified half, Î(Y;Z) = mean_z sum_y p(y|z) log(p(y|z) / p(y)) in nats over the other half,
  with p(y) = the mean of p(y|z) over that half, so Î is a mean KL divergence and Î >= 0 always
  (the label frequencies would make it negative when the classifier is miscalibrated). Same for A.
- Distance statistics (what FairKL, Eq. 9-11, matches): squared L2 distances ||u_i - u_j||^2 in [0, 4]
  between L2-normalised rows u, over unordered pairs {i, j}, i != j, split by
  positive (same y) / negative (different y) x aligned (same a) / conflicting (different a);
  mean and population std (ddof 0) per kind, exact, from float64 sums and sums of squares.
Pairwise quantities are computed in ``block_size`` x ``block_size`` tiles (float64): memory is
bounded by the tile, never N x N. Their time grows as N^2, so a split with more than
``max_pair_points`` rows is first cut to a seeded subset stratified by group (:func:`pair_subset`;
an unbiased estimate of every per-group mean), and the metrics record ``pair_points``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from scipy.special import xlogy

from debias.core import progress
from debias.core.errors import NEEDS_BIAS_LABELS
from debias.data.store import BiasedSplit
from debias.evaluation.linear import fit_logistic, predict_proba, stratified_halves
from debias.evaluation.probe import FEATURE_BATCH, FrozenEncoder, encode
from debias.groups.embedding import umap_fit
from debias.metrics import PAIR_KINDS
from debias.params import EvaluateParams, UMAPParams

DISTANCE_KINDS = PAIR_KINDS  # the kinds FairKL matches (debias.losses.FAIRKL_SETS is the same tuple)
UMAP_SPLITS = ("test",)

Embedder = Callable[[np.ndarray, UMAPParams, int], np.ndarray]


# --------------------------------------------------------------------------- pairwise tiles


def _blocks(n: int, block_size: int) -> list[tuple[int, int]]:
    return [(start, min(start + block_size, n)) for start in range(0, n, block_size)]


def _squared_distances(rows: torch.Tensor, cols: torch.Tensor, rows_sq: torch.Tensor, cols_sq: torch.Tensor) -> torch.Tensor:
    """||r_i - c_j||^2 = |r_i|^2 + |c_j|^2 - 2 r_i.c_j, float64, clamped at 0 (rounding)."""
    return (rows_sq[:, None] + cols_sq[None, :] - 2.0 * rows @ cols.T).clamp_min_(0.0)


def group_pair_distance_sums(z: torch.Tensor, groups: torch.Tensor, n_groups: int, block_size: int) -> torch.Tensor:
    """S[g, g'] = sum over ordered pairs (i in g, j in g') of ||z_i - z_j||_2, float64 ``[n_groups, n_groups]``.

    Rows are centred first (distances are translation-invariant; smaller norms, less cancellation).
    """
    z = z.double()
    z = z - z.mean(0, keepdim=True)
    squared = (z * z).sum(1)
    onehot = F.one_hot(groups.long(), n_groups).double()
    sums = torch.zeros(n_groups, n_groups, dtype=torch.float64)
    blocks = _blocks(len(z), block_size)
    for bi, (r0, r1) in enumerate(blocks):
        for c0, c1 in blocks[bi:]:
            distances = _squared_distances(z[r0:r1], z[c0:c1], squared[r0:r1], squared[c0:c1]).sqrt_()
            if r0 == c0:
                distances.fill_diagonal_(0.0)
            tile = onehot[r0:r1].T @ distances @ onehot[c0:c1]
            sums += tile if r0 == c0 else tile + tile.T
    return sums


# --------------------------------------------------------------------------- alignment loss


def alignment_loss(z: torch.Tensor, y: torch.Tensor, a: torch.Tensor, n_classes: int, n_attrs: int,
                   block_size: int = 2048, normalize: bool = False) -> dict[str, Any]:
    """CNC Eq. 2-3: per class max over pairs of present groups of the mean cross-group L2 distance; mean over classes.

    Returns ``{alignment_loss, alignment_per_class [n_classes] (None: skipped), alignment_worst_pair
    [n_classes] ([a, a'], a < a', or None), alignment_skipped_classes}``; a class with < 2 present groups is skipped.
    """
    if normalize:
        z = F.normalize(z.double(), dim=1)
    per_class: list[float | None] = []
    worst_pair: list[list[int] | None] = []
    skipped: list[int] = []
    for label in range(n_classes):
        members = torch.nonzero(y == label).flatten()
        attrs = a[members]
        counts = torch.bincount(attrs, minlength=n_attrs).double()
        present = counts > 0
        if int(present.sum()) < 2:
            per_class.append(None)
            worst_pair.append(None)
            skipped.append(label)
            continue
        sums = group_pair_distance_sums(z[members], attrs, n_attrs, block_size)
        means = sums / torch.outer(counts, counts).clamp_min(1.0)
        valid = torch.outer(present, present) & ~torch.eye(n_attrs, dtype=torch.bool)
        means = torch.where(valid, means, torch.full_like(means, -torch.inf))
        best = int(means.argmax())
        per_class.append(float(means.flatten()[best]))
        worst_pair.append(sorted([best // n_attrs, best % n_attrs]))
    values = [v for v in per_class if v is not None]
    return {
        "alignment_loss": float(np.mean(values)) if values else None,
        "alignment_per_class": per_class,
        "alignment_worst_pair": worst_pair,
        "alignment_skipped_classes": skipped,
    }


# --------------------------------------------------------------------------- mutual information


def mutual_information(z: torch.Tensor, labels: torch.Tensor, seed: int, max_iter: int = 1000,
                       c: float = 1.0) -> float:
    """CNC Eq. 16 in nats: mean over the held-out half of KL(p(.|z) || mean p(.|z)), p from a logistic fit on the other half.

    p(label|z): multinomial logistic regression (standardised features, L2 with inverse strength ``c``)
    fitted on a seeded half stratified by label. Labels seen only in the held-out half get p = 0.
    0.0 when the fitting half holds a single label.
    """
    fit_index, held_index = stratified_halves(labels, seed)
    if int(torch.unique(labels[fit_index]).numel()) < 2 or held_index.numel() == 0:
        return 0.0
    model = fit_logistic(z[fit_index], labels[fit_index], c, max_iter, True, seed)
    probs = predict_proba(model, z[held_index])
    marginal = probs.mean(0, keepdims=True)
    return float(np.mean(np.sum(xlogy(probs, probs) - xlogy(probs, marginal), axis=1)))


def label_entropy(labels: torch.Tensor) -> float:
    """H of the empirical label frequencies in nats (the ceiling of Î for a calibrated classifier)."""
    freq = torch.bincount(labels.long()).double()
    freq = freq[freq > 0] / freq.sum()
    return float(-(freq * freq.log()).sum())


# --------------------------------------------------------------------------- distance statistics


def distance_statistics(z: torch.Tensor, y: torch.Tensor, a: torch.Tensor, block_size: int = 2048) -> dict[str, dict]:
    """Mean and population std of ||u_i - u_j||^2 (u = z / |z|) per pair kind over unordered pairs i != j.

    Kinds: pos_aligned (same y, same a), pos_conflicting (same y, other a), neg_aligned (other y, same a),
    neg_conflicting (other y, other a). Returns ``{kind: {mean, std, n_pairs}}`` (None for an empty kind).
    """
    u = F.normalize(z.double(), dim=1)
    squared = (u * u).sum(1)
    y, a = y.long(), a.long()
    count = torch.zeros(5, dtype=torch.float64)
    total = torch.zeros(5, dtype=torch.float64)
    total_sq = torch.zeros(5, dtype=torch.float64)
    blocks = _blocks(len(u), block_size)
    for bi, (r0, r1) in enumerate(blocks):
        for c0, c1 in blocks[bi:]:
            distances = _squared_distances(u[r0:r1], u[c0:c1], squared[r0:r1], squared[c0:c1])
            other_y = (y[r0:r1, None] != y[None, c0:c1]).long()
            other_a = (a[r0:r1, None] != a[None, c0:c1]).long()
            kind = 2 * other_y + other_a
            if r0 == c0:  # each unordered pair once: keep j > i inside a diagonal tile
                kind = torch.where(torch.ones_like(kind, dtype=torch.bool).triu(1), kind, torch.full_like(kind, 4))
            kind, distances = kind.flatten(), distances.flatten()
            count += torch.bincount(kind, minlength=5).double()
            total += torch.bincount(kind, weights=distances, minlength=5)
            total_sq += torch.bincount(kind, weights=distances * distances, minlength=5)
    stats: dict[str, dict] = {}
    for index, name in enumerate(DISTANCE_KINDS):
        n = float(count[index])
        if n == 0:
            stats[name] = {"mean": None, "std": None, "n_pairs": 0}
            continue
        mean = float(total[index]) / n
        variance = max(float(total_sq[index]) / n - mean * mean, 0.0)
        stats[name] = {"mean": mean, "std": variance ** 0.5, "n_pairs": int(n)}
    return stats


# --------------------------------------------------------------------------- one split, one encoder


def pair_subset(groups: torch.Tensor, max_points: int | None, seed: int) -> torch.Tensor | None:
    """Sorted indices of a seeded subset of about ``max_points`` rows, every group keeping its share (rounded up, so
    no present group vanishes: at most ``max_points`` + number of groups rows); None when all rows fit."""
    n = int(groups.numel())
    if max_points is None or n <= max_points:
        return None
    groups = groups.long().cpu()
    generator = torch.Generator().manual_seed(seed)
    keys = torch.rand(n, generator=generator)
    order = torch.argsort(keys)
    order = order[torch.argsort(groups[order], stable=True)]  # by group, random within a group
    counts = torch.bincount(groups)
    keep = torch.ceil(counts.double() * (max_points / n)).long()
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.arange(n) - starts[groups[order]]
    return order[rank < keep[groups[order]]].sort().values


# The representation metrics that read the bias attribute; without bias labels each reads NEEDS_BIAS_LABELS.
ATTRIBUTE_METRICS = ("alignment_loss", "alignment_per_class", "alignment_worst_pair", "alignment_skipped_classes",
                     "mi_a", "h_a", "distances")


def representation_metrics(z: torch.Tensor, y: torch.Tensor, a: torch.Tensor | None, n_classes: int, n_attrs: int,
                           params: EvaluateParams, seed: int) -> dict[str, Any]:
    """Alignment loss, Î(Y;Z), Î(A;Z) (with the label entropies H(Y), H(A)) and distance statistics of one split.

    The pairwise metrics (alignment loss, distance statistics) use :func:`pair_subset` of the split when it has
    more than ``params.max_pair_points`` rows (``pair_points`` then says how many); Î uses every row. ``a`` None
    (no bias labels): Î(Y;Z) and H(Y) only, each of :data:`ATTRIBUTE_METRICS` reads NEEDS_BIAS_LABELS.
    """
    if a is None:
        return {"mi_y": mutual_information(z, y, seed, params.mi_max_iter, params.mi_c), "h_y": label_entropy(y),
                "n": int(y.numel()), **dict.fromkeys(ATTRIBUTE_METRICS, NEEDS_BIAS_LABELS)}
    subset = pair_subset(y.long() * n_attrs + a.long(), params.max_pair_points, seed)
    zp, yp, ap = (z, y, a) if subset is None else (z[subset], y[subset], a[subset])
    metrics = alignment_loss(zp, yp, ap, n_classes, n_attrs, params.block_size, params.normalize_alignment)
    metrics.update({
        "mi_y": mutual_information(z, y, seed, params.mi_max_iter, params.mi_c),
        "mi_a": mutual_information(z, a, seed, params.mi_max_iter, params.mi_c),
        "h_y": label_entropy(y),
        "h_a": label_entropy(a),
        "n": int(y.numel()),
        "distances": distance_statistics(zp, yp, ap, params.block_size),
    })
    if subset is not None:
        metrics["pair_points"] = int(subset.numel())
    return metrics


# --------------------------------------------------------------------------- UMAP


def umap_2d(features: np.ndarray, params: UMAPParams, seed: int) -> np.ndarray:
    """Seeded (hence single-threaded) 2-D UMAP of ``features`` (see :func:`debias.groups.embedding.umap_fit`)."""
    return umap_fit(torch.as_tensor(features), 2, params.neighbors, params.min_dist, seed).numpy()


def umap_embedding(z: torch.Tensor, y: torch.Tensor, a: torch.Tensor | None, params: UMAPParams, seed: int,
                   embedder: Embedder = umap_2d) -> dict[str, torch.Tensor]:
    """2-D embedding of a seeded subset of up to ``params.max_points`` rows: ``{coords [n,2], index [n], y, a}``
    (no ``a`` without bias labels)."""
    generator = torch.Generator().manual_seed(seed)
    index = torch.randperm(len(z), generator=generator)[: params.max_points].sort().values
    coords = embedder(z[index].double().numpy(), params, seed)
    payload = {"coords": torch.as_tensor(np.asarray(coords), dtype=torch.float32), "index": index,
               "y": y[index].clone()}
    if a is not None:
        payload["a"] = a[index].clone()
    return payload


# --------------------------------------------------------------------------- stage level


def evaluate_encoders(encoders: Mapping[str, FrozenEncoder], splits: Mapping[str, BiasedSplit], params: EvaluateParams,
                      seed: int, device: torch.device, umap_splits: tuple[str, ...] = UMAP_SPLITS,
                      embedder: Embedder = umap_2d, batch_size: int = FEATURE_BATCH
                      ) -> tuple[dict[str, dict], dict[tuple[str, str], dict[str, torch.Tensor]]]:
    """Representation metrics of every trained encoder on ``params.splits``, then UMAP of ``umap_splits``.

    Returns ``(metrics, umaps)``: ``metrics[encoder] = {trained, method, <split>: representation_metrics}``
    or ``{trained: False, note}``; ``umaps[(encoder, split)]`` are :func:`umap_embedding` payloads. All
    features are computed before any UMAP runs (numba threads slow torch down in the same process).
    """
    metrics: dict[str, dict] = {}
    features: dict[tuple[str, str], torch.Tensor] = {}
    for name, encoder in encoders.items():
        if not encoder.trained:
            metrics[name] = {"trained": False, "note": encoder.note}
            continue
        metrics[name] = {"trained": True, "method": encoder.method}
        for split_name in params.splits:
            split = splits[split_name]
            with progress.step("evaluate", f"representation metrics of {name} on {split_name} ({len(split)} rows)"):
                z, _ = encode(encoder.network, split.x, device, batch_size)
                features[(name, split_name)] = z
                metrics[name][split_name] = representation_metrics(z, split.y, split.a, split.n_classes,
                                                                   split.n_attrs, params, seed)
    umaps = {}
    for (name, split_name), z in features.items():
        if split_name in umap_splits:
            split = splits[split_name]
            with progress.step("evaluate", f"UMAP of {name} on {split_name} ({min(len(z), params.umap.max_points)} "
                                           "points)"):
                umaps[(name, split_name)] = umap_embedding(z, split.y, split.a, params.umap, seed, embedder)
    return metrics, umaps
