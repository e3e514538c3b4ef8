"""Costs that must grow no faster than the data (issue 16): the k-NN graph behind UMAP, pairwise metrics, figures."""

from __future__ import annotations

import numpy as np
import torch

from debias import embedding


def _blobs(n: int, dim: int = 16, centres: int = 8, seed: int = 0) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    middle = rng.normal(0, 4, (centres, dim))
    return torch.from_numpy(middle[rng.integers(0, centres, n)] + rng.normal(0, 1, (n, dim))).float()


def test_knn_graph_is_exact_up_to_the_limit_and_nn_descent_above(monkeypatch) -> None:
    calls = []
    monkeypatch.setattr(embedding, "exact_knn", lambda points, k: calls.append(("exact", len(points))) or (None, None))
    monkeypatch.setattr(embedding, "nndescent_knn", lambda points, k, seed: calls.append(("nnd", len(points))) or (None, None))
    embedding.knn_graph(torch.zeros(40, 3), 5, seed=0, exact_max=40)
    embedding.knn_graph(torch.zeros(41, 3), 5, seed=0, exact_max=40)
    embedding.knn_graph(torch.zeros(10, 3), 5, seed=0)
    assert calls == [("exact", 40), ("nnd", 41), ("exact", 10)]
    assert embedding.EXACT_KNN_MAX_POINTS >= 10_000  # every pipeline below that keeps its exact, unchanged graph


def test_nn_descent_graph_is_seeded_and_nearly_exact() -> None:
    points = _blobs(800)
    index, distance = embedding.nndescent_knn(points, 10, seed=3)
    again, _ = embedding.nndescent_knn(points, 10, seed=3)
    exact, exact_distance = embedding.exact_knn(points, 10)
    assert index.shape == (800, 10) and index.dtype == np.int64 and distance.dtype == np.float32
    assert np.array_equal(index, again)  # deterministic with the seed
    assert (index[:, 0] == np.arange(800)).all() and np.allclose(distance[:, 0], 0)  # itself first
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(index, exact)])
    assert recall > 0.95
