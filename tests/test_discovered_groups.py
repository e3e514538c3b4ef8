"""The validation split's inferred groups (same fitted inference as the training split's) and the summary of the
discovered groups the report's montage shows: every example belongs to the group it is listed under."""

from __future__ import annotations

import pytest
import torch

from debias.data.store import BiasedSplit
from debias.groups import GroupInference
from debias.groups.clustering import nearest_group_vote
from debias.groups.discovered import group_summary, infer_val_groups, pick_examples
from debias.schema import GroupsParams


def split(y: list[int], a: list[int] | None = None, n_classes: int = 2, n_attrs: int = 2) -> BiasedSplit:
    yt = torch.tensor(y)
    at = torch.tensor(a) if a is not None else yt.clone()
    return BiasedSplit(torch.zeros(len(y), 3, 4, 4, dtype=torch.uint8), yt, at, at == yt, n_classes, n_attrs)


def test_pred_labels_validation_with_erms_argmax_as_it_labels_training() -> None:
    val = split([0, 0, 1, 1])
    logits = torch.tensor([[2.0, 0.0], [0.0, 2.0], [0.0, 2.0], [2.0, 0.0]])
    out = infer_val_groups("pred", val, torch.zeros(4, 3), logits, torch.zeros(1, 3),
                           GroupInference(torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long),
                                          torch.zeros(1, dtype=torch.bool), y=torch.zeros(1, dtype=torch.long)),
                           GroupsParams())
    assert out.inferred_label.tolist() == [0, 1, 1, 0]
    assert out.inferred_group.tolist() == [0, 1, 3, 2]  # y * C + label
    assert out.minority.tolist() == [False, True, False, True]


def test_true_labels_validation_with_its_attribute() -> None:
    val = split([0, 1, 1], [1, 1, 0])
    out = infer_val_groups("true", val, torch.zeros(3, 2), torch.zeros(3, 2), torch.zeros(1, 2),
                           GroupInference(*(torch.zeros(1, dtype=t) for t in (torch.long, torch.long, torch.bool))),
                           GroupsParams(method="true"))
    assert out.inferred_group.tolist() == [1, 3, 2] and out.minority.tolist() == [True, False, True]


def test_a_validation_point_takes_the_majority_group_of_its_nearest_same_class_training_points() -> None:
    # class 0: group 0 around x=0, group 1 around x=10; class 1: group 3 everywhere (x = 0 .. 4)
    train_z = torch.tensor([[0.0], [0.5], [1.0], [10.0], [10.5], [11.0], [0.2], [1.0], [2.0], [3.0], [4.0]])
    train_y = torch.tensor([0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1])
    train_group = torch.tensor([0, 0, 0, 1, 1, 1, 3, 3, 3, 3, 3])
    val_z = torch.tensor([[0.4], [9.0], [10.2], [0.3]])
    val_y = torch.tensor([0, 0, 0, 1])  # the last sits among class 0's group 0, but is class 1: group 3
    assert nearest_group_vote(val_z, val_y, train_z, train_y, train_group, k=3).tolist() == [0, 1, 1, 3]
    # a tie (k = 2 at 5.0: one neighbour of each group) goes to the lower group id
    tie_z = torch.tensor([[0.0], [10.0]])
    assert nearest_group_vote(torch.tensor([[5.0]]), torch.tensor([0]), tie_z, torch.tensor([0, 0]),
                              torch.tensor([1, 0]), k=2).tolist() == [0]


def test_one_cluster_per_class_transfers_the_label_its_neighbours_of_any_class_carry() -> None:
    # the clusters span classes: a class-1 validation point among class-0 training points of bias label 0 gets label 0
    train = split([0, 0, 0, 1, 1, 1])
    inference = GroupInference(torch.tensor([0, 0, 0, 1, 1, 1]), torch.tensor([0, 0, 0, 3, 3, 3]),
                               torch.zeros(6, dtype=torch.bool), y=train.y.clone())
    train_z = torch.tensor([[0.0], [0.1], [0.2], [9.0], [9.1], [9.2]])
    val = split([1, 1, 0])
    out = infer_val_groups("cluster", val, torch.tensor([[0.05], [9.05], [9.1]]), torch.zeros(3, 2), train_z,
                           inference, GroupsParams(method="cluster", cluster={"umap_neighbors": 3}))
    assert out.inferred_label.tolist() == [0, 1, 1] and out.inferred_group.tolist() == [2, 3, 1]
    assert out.minority.tolist() == [True, False, True]


def test_clusters_within_classes_transfer_the_group_of_same_class_neighbours() -> None:
    train = split([0, 0, 0, 0])
    inference = GroupInference(torch.tensor([0, 0, 1, 1]), torch.tensor([0, 0, 1, 1]),
                               torch.tensor([False, False, True, True]), y=train.y.clone())
    val = split([0, 0])
    out = infer_val_groups("cluster", val, torch.tensor([[0.0], [9.0]]), torch.zeros(2, 2),
                           torch.tensor([[0.0], [0.1], [9.0], [9.1]]), inference,
                           GroupsParams(method="cluster", cluster={"umap_neighbors": 2, "per_class": 2}))
    assert out.inferred_group.tolist() == [0, 1] and out.inferred_label.tolist() == [0, 1]
    assert out.minority.tolist() == [False, True]
    with pytest.raises(ValueError, match="another split; rerun train_erm"):
        infer_val_groups("pred", val, torch.zeros(3, 1), torch.zeros(2, 2), torch.zeros(4, 1), inference,
                         GroupsParams())


def test_every_example_belongs_to_the_class_and_group_it_is_listed_under() -> None:
    generator = torch.Generator().manual_seed(3)
    y = torch.randint(0, 3, (200,), generator=generator)
    group = y * 3 + torch.randint(0, 3, (200,), generator=generator)
    picked = pick_examples(y, group, 8, seed=5)
    assert set(picked) == {(int(c), int(g)) for c, g in zip(y.tolist(), group.tolist())}
    for (label, g), indices in picked.items():
        members = int(((y == label) & (group == g)).sum())
        assert len(indices) == min(8, members) and len(set(indices)) == len(indices)
        assert all(int(y[i]) == label and int(group[i]) == g for i in indices)
    assert pick_examples(y, group, 8, seed=5) == picked  # the same images every run
    assert pick_examples(y, group, 8, seed=6) != picked


def test_the_summary_counts_each_group_its_erm_accuracy_and_attribute_share() -> None:
    # class 0: group 0 = {0, 1, 2} (a = 0, 0, 1; ERM right on 0, 1), group 1 = {3} (a = 1; ERM wrong)
    # class 1: group 3 = {4, 5} (a = 1, 1; ERM right on 4)
    train = split([0, 0, 0, 0, 1, 1], [0, 0, 1, 1, 1, 1])
    inference = GroupInference(torch.tensor([0, 0, 0, 1, 1, 1]), torch.tensor([0, 0, 0, 1, 3, 3]),
                               torch.tensor([False, False, False, True, False, False]), y=train.y.clone())
    logits = torch.tensor([[1.0, 0], [1, 0], [0, 1], [0, 1], [0, 1], [1, 0]])
    rows = group_summary(inference, train, logits, seed=0, per_group=2)
    assert [(r["class"], r["group"], r["n"], r["erm_correct"]) for r in rows] == [(0, 0, 3, 2), (0, 1, 1, 0),
                                                                                 (1, 3, 2, 1)]
    assert rows[0]["erm_accuracy"] == pytest.approx(2 / 3, abs=1e-12)
    assert rows[0]["attribute_share"] == pytest.approx({"0": 2 / 3, "1": 1 / 3}, abs=1e-12)
    assert rows[1]["attribute_share"] == {"1": 1.0} and rows[1]["inferred_label"] == 1
    assert set(rows[0]["examples"]) <= {0, 1, 2} and len(rows[0]["examples"]) == 2 and rows[1]["examples"] == [3]
    unlabelled = split([0, 0, 0, 0, 1, 1], [-1] * 6)  # no bias attribute: the share is omitted, not 0
    assert all(r["attribute_share"] is None for r in group_summary(inference, unlabelled, logits, seed=0))
