"""Group inference: Hungarian matching, quality metrics by hand, each method's contract, clustering of
well-separated blobs (with and without UMAP), over-clustering labels, the stored table and the stage body."""

from __future__ import annotations

import importlib.util
import math

import numpy as np
import pandas as pd
import pytest
import torch

from debias.data.store import BiasedSplit, save_split
from debias.groups import (GROUP_COLUMNS, METHODS, GroupInference, group_quality, groups_report, hungarian_map,
                           hungarian_match, infer_groups, load_embedding, load_groups, matched_accuracy, relabel,
                           report_scalars, save_embedding, save_groups)
from debias.groups.inference import (cluster_points, exact_knn, label_within_class_clusters,
                                     match_clusters_to_classes, size_ranks, within_class_ranks)
from debias.core.io import CorruptFileError, save_torch
from debias.harness.tracking import StageRun
from debias.schema import GroupsParams, Params
from debias.groups.methods.cluster import ClusterParams
from tests.conftest import REPO

N_CLASSES = 5


def make_split(y: torch.Tensor, a: torch.Tensor, n_attrs: int = N_CLASSES) -> BiasedSplit:
    """A split with 1x1 images (group inference never looks at pixels); aligned = (a == y)."""
    x = torch.zeros(len(y), 3, 1, 1, dtype=torch.uint8)
    return BiasedSplit(x, y.long(), a.long(), a == y, int(y.max()) + 1, n_attrs)


def blobs(n_per_class: int = 60, dim: int = 8, classes: int = N_CLASSES, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Well-separated Gaussian blobs: centres 20 apart on the axes, unit noise; returns ``(points, y)``."""
    generator = torch.Generator().manual_seed(seed)
    y = torch.arange(classes).repeat_interleave(n_per_class)
    centres = 20.0 * torch.eye(classes, dim)
    return centres[y] + torch.randn(len(y), dim, generator=generator), y


def two_blobs_per_class(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per class a big (40) and a small (15) sub-blob; ``(points, y, small)`` with small marking the small ones."""
    generator = torch.Generator().manual_seed(seed)
    sizes = torch.tensor([40, 15] * N_CLASSES)
    sub = torch.arange(2 * N_CLASSES).repeat_interleave(sizes)
    centres = 25.0 * torch.eye(2 * N_CLASSES, 2 * N_CLASSES)
    points = centres[sub] + torch.randn(len(sub), 2 * N_CLASSES, generator=generator)
    return points, sub // 2, sub % 2 == 1


# ------------------------------------------------------------------ matching

def test_hungarian_match_recovers_a_permutation() -> None:
    generator = torch.Generator().manual_seed(1)
    target = torch.randint(0, 7, (500,), generator=generator)
    permutation = torch.randperm(7, generator=generator)
    pred = permutation[target]
    assert hungarian_match(pred, target) == {int(permutation[i]): i for i in range(7)}
    assert matched_accuracy(pred, target) == 1.0
    assert torch.equal(relabel(pred, hungarian_match(pred, target)), target)


def test_matched_accuracy_on_a_hand_computed_table() -> None:
    # contingency pred x target: [[1,2,0],[2,0,0],[0,1,3]]: best 0->1, 1->0, 2->2 = 2+2+3 of 9
    pred = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2])
    target = torch.tensor([1, 1, 0, 0, 0, 2, 2, 2, 1])
    assert hungarian_match(pred, target) == {0: 1, 1: 0, 2: 2}
    assert matched_accuracy(pred, target) == pytest.approx(7 / 9)


def test_matching_with_different_numbers_of_labels() -> None:
    # more inferred labels than targets: one stays unmatched and counts as wrong
    assert matched_accuracy(torch.tensor([0, 1, 2, 2]), torch.tensor([0, 0, 1, 1])) == pytest.approx(3 / 4)
    assert len(hungarian_match(torch.tensor([0, 1, 2, 2]), torch.tensor([0, 0, 1, 1]))) == 2
    # fewer: one inferred label for three targets matches the largest
    assert matched_accuracy(torch.tensor([4, 4, 4, 4]), torch.tensor([0, 0, 1, 2])) == pytest.approx(2 / 4)
    assert hungarian_match(torch.tensor([4, 4, 4, 4]), torch.tensor([0, 0, 1, 2])) == {4: 0}
    # arbitrary label values
    assert hungarian_match(torch.tensor([-3, 10, 10]), torch.tensor([7, 2, 2])) == {-3: 7, 10: 2}


def test_hungarian_map_matches_every_label_of_a_square_table() -> None:
    # label 2 never occurs on either side but still gets the class left over
    lookup = hungarian_map(torch.tensor([1, 1, 0]), torch.tensor([0, 0, 1]), 3, 3)
    assert lookup.tolist() == [1, 0, 2]
    assert relabel(torch.tensor([0, 5]), {0: 9}).tolist() == [9, -1]


def test_group_quality_on_a_perfect_relabelling() -> None:
    y = torch.tensor([0, 0, 0, 1, 1, 1])
    a = torch.tensor([0, 0, 1, 1, 1, 0])
    aligned = a == y
    quality = group_quality((a + 3) % 2 + 7, ~aligned, a, aligned, y)
    assert quality["matched_accuracy"] == 1.0
    assert quality["nmi"] == pytest.approx(1.0) and quality["ari"] == pytest.approx(1.0)
    assert quality["minority_recall"] == 1.0 and quality["minority_precision"] == 1.0
    assert quality["inferred_minority_per_class"] == [1, 1]


def test_group_quality_recall_and_precision_by_hand() -> None:
    y = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    aligned = torch.tensor([True, True, False, False, True, True, True, False])  # conflicting: 2, 3, 7
    minority = torch.tensor([False, True, True, False, False, False, True, True])  # inferred: 1, 2, 6, 7
    quality = group_quality(torch.zeros(8, dtype=torch.long), minority, y, aligned, y, n_classes=3)
    assert quality["minority_recall"] == pytest.approx(2 / 3)  # found 2 and 7 of {2, 3, 7}
    assert quality["minority_precision"] == pytest.approx(2 / 4)
    assert quality["inferred_minority_per_class"] == [2, 2, 0]
    assert quality["true_conflicting_per_class"] == [2, 1, 0]
    assert quality["n_found_conflicting"] == 2
    nothing = group_quality(y, torch.zeros(8, dtype=torch.bool), y, torch.ones(8, dtype=torch.bool), y)
    assert nothing["minority_recall"] is None and nothing["minority_precision"] is None


# ------------------------------------------------------------------ pred and true

def test_registry_holds_the_params_methods() -> None:
    assert set(METHODS) == {"pred", "cluster", "true", "soft"}
    assert set(METHODS) == set(GroupsParams.model_fields["method"].annotation.__args__)


def test_pred_is_the_erm_argmax() -> None:
    generator = torch.Generator().manual_seed(0)
    y = torch.arange(N_CLASSES).repeat(8)
    logits = torch.randn(len(y), N_CLASSES, generator=generator)
    train = make_split(y, y)
    result = infer_groups("pred", train, torch.zeros(len(y), 4), logits, GroupsParams(), seed=0)
    assert torch.equal(result.inferred_label, logits.argmax(1))
    assert torch.equal(result.minority, logits.argmax(1) != y)
    assert torch.equal(result.inferred_group, y * N_CLASSES + logits.argmax(1))
    assert torch.equal(result.y, y) and result.embedding2d is None and "total_s" in result.timings


def test_true_is_the_bias_attribute() -> None:
    y = torch.tensor([0, 0, 1, 1, 2, 2])
    a = torch.tensor([0, 2, 1, 1, 0, 2])
    train = make_split(y, a, n_attrs=3)
    result = infer_groups("true", train, torch.zeros(6, 2), torch.zeros(6, 3), GroupsParams(method="true"), seed=0)
    assert torch.equal(result.inferred_label, a)
    assert torch.equal(result.minority, ~train.aligned)
    assert torch.equal(result.inferred_group, train.g)


def test_infer_groups_rejects_bad_inputs() -> None:
    y = torch.arange(3)
    train = make_split(y, y)
    with pytest.raises(ValueError, match="allowed: pred, cluster, soft, true"):
        infer_groups("kmeans", train, torch.zeros(3, 2), torch.zeros(3, 3), GroupsParams(), 0)
    with pytest.raises(ValueError, match="rerun train_erm"):
        infer_groups("pred", train, torch.zeros(4, 2), torch.zeros(4, 3), GroupsParams(), 0)
    with pytest.raises(ValueError, match=r"expected \[N, 3\]"):
        infer_groups("pred", train, torch.zeros(3, 2), torch.zeros(3, 5), GroupsParams(), 0)


# ------------------------------------------------------------------ clustering without UMAP

@pytest.mark.parametrize("algorithm", ["kmeans", "gmm"])
def test_clusters_matched_to_classes_recover_blobs(algorithm: str) -> None:
    points, y = blobs()
    cluster = cluster_points(points, N_CLASSES, algorithm, n_init=3, seed=0)
    label = match_clusters_to_classes(cluster, y, N_CLASSES)
    assert torch.equal(label, y)
    # a relabelled copy is matched back exactly
    assert torch.equal(match_clusters_to_classes((cluster + 2) % N_CLASSES, y, N_CLASSES), y)


def test_size_ranks_put_the_largest_cluster_first() -> None:
    assert size_ranks(torch.tensor([2, 2, 2, 0, 1, 1]), 4).tolist() == [2, 1, 0, 3]  # ties: lower id first


@pytest.mark.parametrize("algorithm", ["kmeans", "gmm"])
def test_over_clustering_finds_the_small_sub_blob_of_each_class(algorithm: str) -> None:
    points, y, small = two_blobs_per_class()
    rank = within_class_ranks(points, y, N_CLASSES, 2, algorithm, n_init=3, seed=0)
    assert torch.equal(rank, small.long())  # the big sub-blob is rank 0 in every class
    # ERM is right on every point but, on the small sub-blob of class c, second-most confident in c + 1
    logits = 5.0 * torch.nn.functional.one_hot(y, N_CLASSES).float()
    logits[small, (y[small] + 1) % N_CLASSES] = 3.0
    label = label_within_class_clusters(rank, y, logits, 2)
    assert torch.equal(label, torch.where(small, (y + 1) % N_CLASSES, y))


def test_over_clustering_keeps_tiny_classes_whole() -> None:
    points, y = torch.randn(7, 2), torch.tensor([0, 0, 0, 0, 0, 0, 1])
    rank = within_class_ranks(points, y, 3, 4, "kmeans", n_init=1, seed=0)
    assert rank[6] == 0 and set(rank[:6].tolist()) <= set(range(4))


# ------------------------------------------------------------------ cluster with UMAP (imports umap: seconds with the numba cache)

def test_exact_knn_lists_each_point_first_then_its_nearest() -> None:
    points = torch.randn(70, 5, generator=torch.Generator().manual_seed(2))
    points[1] = points[0]  # a duplicate: each of the two still lists itself first
    index, distance = exact_knn(points, 6, block=16)
    full = torch.cdist(points.double(), points.double())
    assert index[:, 0].tolist() == list(range(70)) and np.allclose(distance[:, 0], 0, atol=1e-6)
    assert index[0, 1] == 1 and index[1, 1] == 0
    expected = torch.sort(full, dim=1).values[:, :6].numpy()
    assert np.allclose(distance, expected, atol=1e-5)


UMAP_ON_BLOBS = pytest.mark.filterwarnings("ignore:Graph is not fully connected")  # separate blobs: expected


@pytest.mark.slow
@UMAP_ON_BLOBS
@pytest.mark.parametrize("algorithm", ["kmeans", "gmm"])
def test_cluster_method_recovers_blobs_through_umap(algorithm: str) -> None:
    points, y = blobs()
    train = make_split(y, y)
    params = GroupsParams(method="cluster", cluster=ClusterParams(algorithm=algorithm, n_init=3))
    logits = torch.zeros(len(y), N_CLASSES)
    first = infer_groups("cluster", train, points, logits, params, seed=3)
    assert matched_accuracy(first.inferred_label, y) == 1.0
    assert torch.equal(first.inferred_label, y) and not first.minority.any()
    assert first.embedding2d.shape == (len(y), 2)
    assert {"umap_import_s", "umap_fit_s", "cluster_s", "total_s"} <= set(first.timings)
    again = infer_groups("cluster", train, points, logits, params, seed=3)
    assert torch.equal(again.embedding2d, first.embedding2d)
    assert torch.equal(again.inferred_group, first.inferred_group)


@pytest.mark.slow
@UMAP_ON_BLOBS
def test_cluster_method_over_clusters_within_each_class() -> None:
    points, y, _ = two_blobs_per_class()
    train = make_split(y, y)
    params = GroupsParams(method="cluster", cluster=ClusterParams(per_class=3, n_init=2))
    logits = torch.randn(len(y), N_CLASSES, generator=torch.Generator().manual_seed(0))
    result = infer_groups("cluster", train, points, logits, params, seed=0)
    groups_per_class = [torch.unique(result.inferred_group[y == c]) for c in range(N_CLASSES)]
    assert all(torch.equal(g, c * 3 + torch.arange(3)) for c, g in enumerate(groups_per_class))
    assert torch.equal(result.minority, result.inferred_group % 3 > 0)
    assert torch.equal(result.minority, result.inferred_label != y)


# ------------------------------------------------------------------ storage

def inference_example() -> GroupInference:
    y = torch.tensor([0, 0, 1, 1, 2])
    label = torch.tensor([0, 2, 1, 0, 2])
    return GroupInference(label, y * 3 + label, label != y, torch.randn(5, 2), {"total_s": 0.1}, y=y)


def test_load_groups_round_trip(tmp_path) -> None:
    inference = inference_example()
    save_groups(tmp_path / "train.parquet", inference)
    loaded = load_groups(tmp_path / "train.parquet", y=inference.y)
    for name in ("inferred_label", "inferred_group", "minority", "y"):
        assert torch.equal(getattr(loaded, name), getattr(inference, name)), name
    assert loaded.minority.dtype == torch.bool and loaded.inferred_label.dtype == torch.long
    assert list(pd.read_parquet(tmp_path / "train.parquet").columns) == list(GROUP_COLUMNS)
    assert not list(tmp_path.glob(".*.tmp"))  # written atomically, no leftovers


def test_load_groups_sorts_rows_by_index(tmp_path) -> None:
    inference = inference_example()
    save_groups(tmp_path / "t.parquet", inference)
    pd.read_parquet(tmp_path / "t.parquet").iloc[::-1].to_parquet(tmp_path / "t.parquet", index=False)
    assert torch.equal(load_groups(tmp_path / "t.parquet").inferred_label, inference.inferred_label)


def test_load_groups_says_what_is_wrong(tmp_path) -> None:
    inference = inference_example()
    save_groups(tmp_path / "t.parquet", inference)
    pd.read_parquet(tmp_path / "t.parquet").drop(columns=["minority"]).to_parquet(tmp_path / "t.parquet")
    with pytest.raises(CorruptFileError, match=r"lacks the columns \['minority'\].*rerun infer_groups"):
        load_groups(tmp_path / "t.parquet")
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 truncated")
    with pytest.raises(CorruptFileError, match="cannot be read as parquet"):
        load_groups(tmp_path / "bad.parquet")
    with pytest.raises(FileNotFoundError, match="dvc repro infer_groups"):
        load_groups(tmp_path / "missing.parquet")
    save_groups(tmp_path / "ok.parquet", inference)
    with pytest.raises(CorruptFileError, match="another training split"):
        load_groups(tmp_path / "ok.parquet", y=torch.tensor([0, 0, 1, 1, 1]))


def test_embedding_file_always_exists(tmp_path) -> None:
    inference = inference_example()
    save_embedding(tmp_path / "u.pt", inference)
    assert torch.equal(load_embedding(tmp_path / "u.pt")["coords"], inference.embedding2d)
    inference.embedding2d = None
    save_embedding(tmp_path / "u.pt", inference)
    stored = load_embedding(tmp_path / "u.pt")
    assert stored["coords"].shape == (0, 2) and stored["index"].numel() == 0


def test_report_and_its_scalars() -> None:
    y = torch.tensor([0, 0, 1, 1])
    train = make_split(y, torch.tensor([0, 1, 1, 1]), n_attrs=2)
    inference = infer_groups("true", train, torch.zeros(4, 2), torch.zeros(4, 2), GroupsParams(method="true"), 0)
    report = groups_report("true", inference, train)
    assert report["method"] == "true" and report["matched_accuracy"] == 1.0
    assert report["inferred_minority_per_class"] == [1, 0]
    scalars = report_scalars(report, inference.timings)
    assert scalars["minority_recall"] == 1.0 and "time/total_s" in scalars and "timings" not in report
    assert all(isinstance(v, float) and math.isfinite(v) for v in scalars.values())


# ------------------------------------------------------------------ the stage body

def test_stage_writes_table_umap_file_and_metrics(tmp_path, monkeypatch) -> None:
    spec = importlib.util.spec_from_file_location("infer_groups_stage", REPO / "pipeline" / "infer_groups.py")
    stage = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stage)
    monkeypatch.chdir(tmp_path)
    y = torch.arange(N_CLASSES).repeat(6)
    a = torch.where(torch.arange(len(y)) % 6 == 0, (y + 1) % N_CLASSES, y)
    save_split("data/biased/train.pt", make_split(y, a))
    logits = torch.nn.functional.one_hot(a, N_CLASSES).float()  # ERM predicts the colour
    save_torch("data/erm/embeddings_train.pt", {"z": torch.randn(len(y), 84), "logits": logits}, kind="embeddings")
    save_split("data/biased/val.pt", make_split(y[:10], a[:10]))  # the validation split: labelled the same way
    save_torch("data/erm/embeddings_val.pt", {"z": torch.randn(10, 84), "logits": logits[:10]}, kind="embeddings")
    stage.run(Params(), StageRun(None, None))
    table = load_groups("data/groups/train.parquet", y=y)
    assert torch.equal(table.inferred_label, a) and torch.equal(table.minority, a != y)
    val = load_groups("data/groups/val.parquet", y=y[:10])
    assert torch.equal(val.inferred_label, a[:10]) and torch.equal(val.inferred_group, y[:10] * N_CLASSES + a[:10])
    assert load_embedding("data/groups/umap_train.pt")["coords"].shape == (0, 2)
    import json

    metrics = json.loads((tmp_path / "reports/metrics/groups.json").read_text())
    assert metrics["method"] == "pred" and metrics["minority_recall"] == 1.0 and metrics["minority_precision"] == 1.0
    assert metrics["inferred_minority_per_class"] == [1] * N_CLASSES
    assert "timings" not in metrics  # wall-clock time would make the metrics file differ between identical runs
    assert "total_s" in json.loads((tmp_path / "reports/runs/infer_groups_timings.json").read_text())
    assert np.isclose(metrics["nmi"], 1.0)
    summary = json.loads((tmp_path / "data/groups/summary.json").read_text())
    assert summary["method"] == "pred" and sum(row["n"] for row in summary["groups"]) == len(y)
    assert all(int(y[i]) == row["class"] and int(y[i] * N_CLASSES + a[i]) == row["group"]
               for row in summary["groups"] for i in row["examples"])


def test_weak_inferred_groups_are_named_in_a_warning() -> None:
    from debias.groups.inference import group_warnings

    assert group_warnings("cluster", {"minority_recall": 0.9, "minority_precision": 0.95}) == []
    (message,) = group_warnings("cluster", {"minority_recall": 0.14, "minority_precision": 0.76})
    assert message.startswith("weak-groups: ") and "recall 0.14" in message and "precision" not in message.split(";")[0]
    assert group_warnings("true", {"minority_recall": 0.0, "minority_precision": 0.0}) == []  # the oracle
    assert group_warnings("pred", {"minority_recall": None, "minority_precision": None}) == []  # nothing to compare
