"""Costs that must grow no faster than the data (issue 16): the k-NN graph behind UMAP, pairwise metrics, figures."""

from __future__ import annotations

from math import ceil

import numpy as np
import pytest
import torch

from debias.groups import embedding


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


@pytest.mark.slow
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


def test_exact_knn_works_in_row_blocks_never_n_by_n(monkeypatch) -> None:
    shapes = []
    cdist = torch.cdist
    monkeypatch.setattr(torch, "cdist", lambda a, b: shapes.append((len(a), len(b))) or cdist(a, b))
    index, _ = embedding.exact_knn(_blobs(300), 5, block=64)
    assert max(rows for rows, _ in shapes) == 64 and len(shapes) == 5  # ceil(300 / 64) blocks of 64 x 300
    assert (index[:, 0] == np.arange(300)).all()


def test_pairwise_metrics_use_bounded_tiles_and_a_bounded_subset(monkeypatch) -> None:
    from debias.evaluation import representation
    from debias.params import EvaluateParams

    tiles = []
    squared = representation._squared_distances
    monkeypatch.setattr(representation, "_squared_distances",
                        lambda r, c, rs, cs: tiles.append((len(r), len(c))) or squared(r, c, rs, cs))
    rng = np.random.default_rng(0)
    n = 2000
    y = torch.from_numpy(rng.integers(0, 3, n))
    a = torch.where(torch.from_numpy(rng.random(n) < 0.95), y, torch.from_numpy(rng.integers(0, 3, n)))
    z = _blobs(n, dim=8) + 3 * torch.nn.functional.one_hot(a, 8).float()
    full = representation.representation_metrics(z, y, a, 3, 3, EvaluateParams(block_size=256, max_pair_points=None, mi_max_iter=30), 0)
    assert max(max(t) for t in tiles) <= 256 and "pair_points" not in full
    tiles.clear()
    cut = representation.representation_metrics(z, y, a, 3, 3, EvaluateParams(block_size=256, max_pair_points=400, mi_max_iter=30), 0)
    assert 400 <= cut["pair_points"] <= 400 + 9 and cut["n"] == n
    # the tiles cover about 400^2 / 2 pairs (per metric) instead of 2000^2 / 2
    assert sum(r * c for r, c in tiles) < 2 * 410 * 410 * 2
    assert cut["mi_y"] == full["mi_y"]  # Î uses every row
    assert abs(cut["alignment_loss"] - full["alignment_loss"]) < 0.1 * full["alignment_loss"]
    for kind in ("pos_aligned", "neg_conflicting"):
        assert abs(cut["distances"][kind]["mean"] - full["distances"][kind]["mean"]) < 0.05


def test_pair_subset_keeps_every_group_its_share() -> None:
    from debias.evaluation.representation import pair_subset

    groups = torch.cat([torch.zeros(5000), torch.ones(40), torch.full((1,), 2)]).long()
    assert pair_subset(groups, 6000, seed=0) is None and pair_subset(groups, None, seed=0) is None
    index = pair_subset(groups, 1000, seed=0)
    assert torch.equal(index, pair_subset(groups, 1000, seed=0)) and not torch.equal(index, pair_subset(groups, 1000, 1))
    assert torch.equal(torch.bincount(groups[index]), torch.tensor([ceil(5000 * 1000 / 5041), ceil(40 * 1000 / 5041), 1]))
    assert torch.equal(index, index.unique())  # sorted, distinct


def test_figures_draw_a_bounded_subset_with_every_minority_point(tmp_path) -> None:
    from debias.report import figures

    minority = torch.zeros(50_000, dtype=torch.bool)
    minority[::500] = True
    index = figures.figure_subset(50_000, 1000, seed=0, keep=minority)
    assert len(index) == 1000 and bool(minority[index].sum() == 100) and torch.equal(index, index.unique())
    assert torch.equal(figures.figure_subset(10, 1000), torch.arange(10))
    coords = torch.randn(50_000, 2)
    figures.inferred_group_umap(coords, torch.randint(0, 5, (50_000,)), minority, tmp_path / "g.png", dpi=50,
                                max_points=2000)
    assert (tmp_path / "g.png").stat().st_size > 0


def _load_scale_benchmark():
    from benchmarks import scale
    from tests.conftest import REPO

    return scale, REPO


def test_scale_benchmark_fits_growth_exponents_and_plans_valid_params() -> None:
    import yaml

    from debias.schema import validate

    from debias.core.trees import merge as merge_trees

    scale, repo = _load_scale_benchmark()
    assert abs(scale.growth_exponent([6000, 18000, 54000], [2.0, 6.0, 18.0]) - 1.0) < 1e-9
    assert abs(scale.growth_exponent([6000, 18000], [1.0, 9.0]) - 2.0) < 1e-9
    assert scale.growth_exponent([6000], [1.0]) is None and scale.growth_exponent([1, 2], [None, 3.0]) is None
    config = yaml.safe_load((repo / "benchmarks" / "scale.yaml").read_text())
    params = yaml.safe_load((repo / "params.yaml").read_text())
    for size in config["sizes"]:
        for method in config["methods"]:
            for quick in (False, True):
                checked = validate(merge_trees(params, scale.size_params(config, size, method, quick)))
                assert checked.data.max_train == size and checked.data.source == "fashion_mnist"
                assert checked.bias.protocol == "foreground" and checked.groups.method == "cluster"
    assert validate(merge_trees(params, scale.size_params(config, 6000, "fairkl", True))).loss.fairkl.weight > 0
