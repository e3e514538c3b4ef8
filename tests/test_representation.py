"""Representation metrics against slow references written straight from the papers' formulas.

Alignment loss: CNC Eq. 2-3 as Python loops over every cross-group pair (float64). Distance
statistics: a loop over unordered pairs i < j. Mutual information (CNC Eq. 16): ~0 for features
independent of the label, ~H(Y) for separable ones, deterministic with the seed.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from debias.data.store import BiasedSplit
from debias.evaluation.probe import FrozenEncoder
from debias.evaluation.representation import (DISTANCE_KINDS, alignment_loss, distance_statistics, evaluate_encoders,
                                              group_pair_distance_sums, label_entropy, mutual_information,
                                              representation_metrics, umap_embedding)
from debias.models import build_model
from debias.params import EvaluateParams, UMAPParams


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny tensors: one torch thread (two threads on a shared 2-core machine run up to 10x slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def random_set(n: int, d: int, n_classes: int, n_attrs: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, d, generator=g) * 3 + 1
    y = torch.randint(0, n_classes, (n,), generator=g)
    a = torch.randint(0, n_attrs, (n,), generator=g)
    return z, y, a


def reference_alignment(z: torch.Tensor, y: torch.Tensor, a: torch.Tensor, n_classes: int, n_attrs: int) -> list:
    """Eq. 2-3 literally: per class, max over present group pairs of the mean cross-pair L2 distance."""
    z = z.double()
    out = []
    for label in range(n_classes):
        groups = {attr: [i for i in range(len(y)) if y[i] == label and a[i] == attr] for attr in range(n_attrs)}
        groups = {k: v for k, v in groups.items() if v}
        if len(groups) < 2:
            out.append(None)
            continue
        best = -math.inf
        for g1, g2 in itertools.permutations(groups, 2):
            total = sum(float(torch.linalg.vector_norm(z[i] - z[j])) for i in groups[g1] for j in groups[g2])
            best = max(best, total / (len(groups[g1]) * len(groups[g2])))
        out.append(best)
    return out


def reference_distances(z: torch.Tensor, y: torch.Tensor, a: torch.Tensor) -> dict:
    u = torch.nn.functional.normalize(z.double(), dim=1)
    values: dict[str, list[float]] = {kind: [] for kind in DISTANCE_KINDS}
    for i in range(len(u)):
        for j in range(i + 1, len(u)):
            kind = ("pos" if y[i] == y[j] else "neg") + ("_aligned" if a[i] == a[j] else "_conflicting")
            values[kind].append(float(((u[i] - u[j]) ** 2).sum()))
    return {k: (float(np.mean(v)), float(np.std(v)), len(v)) if v else (None, None, 0) for k, v in values.items()}


@pytest.mark.parametrize("seed,n,n_classes,n_attrs", [(0, 40, 3, 3), (1, 57, 2, 4), (2, 25, 4, 2)])
def test_alignment_matches_loop_reference(seed: int, n: int, n_classes: int, n_attrs: int) -> None:
    z, y, a = random_set(n, 6, n_classes, n_attrs, seed)
    expected = reference_alignment(z, y, a, n_classes, n_attrs)
    for block in (5, 16, 1000):
        got = alignment_loss(z, y, a, n_classes, n_attrs, block_size=block)
        for value, ref in zip(got["alignment_per_class"], expected):
            assert (value is None) == (ref is None)
            if ref is not None:
                assert value == pytest.approx(ref, rel=1e-10)
        present = [v for v in expected if v is not None]
        assert got["alignment_loss"] == pytest.approx(float(np.mean(present)), rel=1e-10)


def test_alignment_blocks_agree_and_worst_pair() -> None:
    z, y, a = random_set(300, 10, 3, 3, seed=7)
    one = alignment_loss(z, y, a, 3, 3, block_size=4096)
    tiled = alignment_loss(z, y, a, 3, 3, block_size=17)
    assert np.allclose(one["alignment_per_class"], tiled["alignment_per_class"], rtol=1e-12)
    assert one["alignment_worst_pair"] == tiled["alignment_worst_pair"]
    sums = group_pair_distance_sums(z, a, 3, 17)
    assert torch.allclose(sums, sums.T, rtol=1e-12)
    assert torch.allclose(sums, group_pair_distance_sums(z, a, 3, 5000), rtol=1e-12)


def test_alignment_normalized_rows() -> None:
    z, y, a = random_set(30, 5, 2, 3, seed=3)
    unit = torch.nn.functional.normalize(z.double(), dim=1)
    expected = reference_alignment(unit, y, a, 2, 3)
    got = alignment_loss(z, y, a, 2, 3, block_size=8, normalize=True)
    assert got["alignment_per_class"] == pytest.approx(expected, rel=1e-10)


def test_alignment_skips_classes_with_one_group() -> None:
    z = torch.randn(12, 4, generator=torch.Generator().manual_seed(0))
    y = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2])
    a = torch.tensor([0, 1, 0, 2, 1, 1, 1, 1, 0, 0, 1, 1])  # class 1 has a single group; class 3 is empty
    got = alignment_loss(z, y, a, 4, 3, block_size=16)
    assert got["alignment_skipped_classes"] == [1, 3]
    assert got["alignment_per_class"][1] is None and got["alignment_per_class"][3] is None
    assert got["alignment_worst_pair"][1] is None
    assert got["alignment_loss"] == pytest.approx(np.mean([got["alignment_per_class"][0], got["alignment_per_class"][2]]))
    assert got["alignment_worst_pair"][2] == [0, 1]
    assert alignment_loss(z, torch.zeros(12, dtype=torch.long), torch.zeros(12, dtype=torch.long), 1, 1)["alignment_loss"] is None


def test_alignment_zero_for_identical_groups() -> None:
    base = torch.randn(5, 3, generator=torch.Generator().manual_seed(1))
    z = torch.cat([base, base])
    y = torch.zeros(10, dtype=torch.long)
    a = torch.tensor([0] * 5 + [1] * 5)
    z2 = torch.cat([base, base + torch.tensor([3.0, 4.0, 0.0])])  # shifted by a length-5 vector
    assert alignment_loss(z, y, a, 1, 2)["alignment_loss"] > 0  # pairs of different points still count
    shifted = alignment_loss(z2, y, a, 1, 2)["alignment_loss"]
    assert shifted > alignment_loss(z, y, a, 1, 2)["alignment_loss"]
    collapsed = alignment_loss(torch.ones(10, 3), y, a, 1, 2)
    assert collapsed["alignment_loss"] == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("seed,block", [(0, 7), (1, 16), (2, 1000)])
def test_distance_statistics_match_loop_reference(seed: int, block: int) -> None:
    z, y, a = random_set(45, 5, 3, 3, seed)
    z[3] = 0.0  # an all-zero (dead ReLU) row stays the zero vector after normalisation
    expected = reference_distances(z, y, a)
    got = distance_statistics(z, y, a, block_size=block)
    for kind in DISTANCE_KINDS:
        mean, std, n = expected[kind]
        assert got[kind]["n_pairs"] == n
        assert got[kind]["mean"] == pytest.approx(mean, rel=1e-10)
        assert got[kind]["std"] == pytest.approx(std, rel=1e-8)
    assert sum(got[kind]["n_pairs"] for kind in DISTANCE_KINDS) == 45 * 44 // 2


def test_distance_statistics_empty_kind() -> None:
    z, y, _ = random_set(20, 4, 2, 1, seed=0)
    got = distance_statistics(z, y, torch.zeros(20, dtype=torch.long), block_size=16)
    assert got["pos_conflicting"] == {"mean": None, "std": None, "n_pairs": 0}
    assert got["neg_conflicting"]["n_pairs"] == 0 and got["pos_aligned"]["n_pairs"] > 0


def test_mutual_information_independent_is_near_zero() -> None:
    g = torch.Generator().manual_seed(0)
    z = torch.randn(3000, 8, generator=g)
    y = torch.randint(0, 5, (3000,), generator=g)
    value = mutual_information(z, y, seed=0)
    assert 0.0 <= value < 0.05


def separable(n: int, n_classes: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, n_classes, (n,), generator=g)
    centres = torch.eye(n_classes, 8) * 20.0
    return centres[labels] + 0.3 * torch.randn(n, 8, generator=g), labels


def test_mutual_information_separable_reaches_entropy() -> None:
    z, y = separable(2000, 5, seed=1)
    h = label_entropy(y)
    assert h == pytest.approx(math.log(5), rel=0.02)
    value = mutual_information(z, y, seed=0)
    assert value == pytest.approx(h, rel=0.05)
    assert value <= h + 0.01


def test_mutual_information_of_attribute_and_determinism() -> None:
    z, a = separable(1500, 3, seed=2)
    y = torch.randint(0, 4, (1500,), generator=torch.Generator().manual_seed(9))
    metrics = representation_metrics(z, y, a, 4, 3, EvaluateParams(block_size=256), seed=3)
    assert metrics["mi_a"] == pytest.approx(metrics["h_a"], rel=0.05)
    assert 0.0 <= metrics["mi_y"] < 0.05
    again = representation_metrics(z, y, a, 4, 3, EvaluateParams(block_size=256), seed=3)
    assert again == metrics
    assert mutual_information(z, a, seed=4) != metrics["mi_a"]  # another seed, another half
    assert mutual_information(z, torch.zeros(1500, dtype=torch.long), seed=0) == 0.0


def fake_embedder(features: np.ndarray, params: UMAPParams, seed: int) -> np.ndarray:
    """First two coordinates: stands in for UMAP (whose import takes tens of seconds)."""
    return features[:, :2]


def test_umap_embedding_subset_is_seeded() -> None:
    z, y, a = random_set(50, 4, 2, 2, seed=0)
    out = umap_embedding(z, y, a, UMAPParams(max_points=20), seed=5, embedder=fake_embedder)
    assert out["coords"].shape == (20, 2) and out["coords"].dtype == torch.float32
    assert torch.equal(out["index"], out["index"].sort().values) and out["index"].unique().numel() == 20
    assert torch.equal(out["y"], y[out["index"]]) and torch.equal(out["a"], a[out["index"]])
    assert torch.allclose(out["coords"], z[out["index"], :2])
    assert torch.equal(umap_embedding(z, y, a, UMAPParams(max_points=20), 5, fake_embedder)["index"], out["index"])
    assert umap_embedding(z, y, a, UMAPParams(max_points=100), 5, fake_embedder)["index"].numel() == 50


def tiny_split(n: int, seed: int, n_classes: int = 5, n_attrs: int = 5) -> BiasedSplit:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, n_classes, (n,), generator=g)
    a = torch.randint(0, n_attrs, (n,), generator=g)
    x = torch.randint(0, 256, (n, 3, 28, 28), generator=g, dtype=torch.uint8)
    return BiasedSplit(x, y, a, a == y, n_classes, n_attrs)


def test_evaluate_encoders_on_tiny_lenet() -> None:
    torch.manual_seed(0)
    network = build_model("lenet5", 5, 28)
    splits = {"test": tiny_split(120, 1), "val": tiny_split(80, 2)}
    encoders = {"erm": FrozenEncoder(network, "erm"), "stage2": FrozenEncoder(None, "none", note="not trained")}
    params = EvaluateParams(block_size=32, umap=UMAPParams(max_points=50))
    metrics, umaps = evaluate_encoders(encoders, splits, params, seed=0, device=torch.device("cpu"),
                                       embedder=fake_embedder)
    assert metrics["stage2"] == {"trained": False, "note": "not trained"}
    erm = metrics["erm"]
    assert erm["trained"] is True and erm["method"] == "erm"
    for split in ("test", "val"):
        report = erm[split]
        for key in ("alignment_loss", "alignment_per_class", "alignment_worst_pair", "alignment_skipped_classes",
                    "mi_y", "mi_a", "h_y", "h_a", "n", "distances"):
            assert key in report
        assert len(report["alignment_per_class"]) == 5
        assert set(report["distances"]) == set(DISTANCE_KINDS)
        assert report["mi_y"] >= 0 and report["mi_a"] >= 0
    assert erm["test"]["n"] == 120
    assert set(umaps) == {("erm", "test")}
    assert umaps[("erm", "test")]["coords"].shape == (50, 2)
