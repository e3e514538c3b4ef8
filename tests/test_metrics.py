"""Accuracy metrics against hand-computed cases."""

from __future__ import annotations

import math

import pytest
import torch

from debias.metrics import accuracy_report, scalars


def test_hand_computed_case() -> None:
    # 2 classes x 2 attributes; aligned = (a == y)
    y = torch.tensor([0, 0, 0, 0, 0, 1, 1, 1])
    a = torch.tensor([0, 0, 0, 1, 1, 1, 1, 0])
    pred = torch.tensor([0, 0, 1, 1, 0, 1, 1, 1])
    report = accuracy_report(pred, y, a, a == y, n_classes=2, n_attrs=2)
    # groups: (0,0): 2/3, (0,1): 1/2, (1,0): 1/1, (1,1): 2/2
    assert report["avg"] == pytest.approx(6 / 8)
    assert report["per_group"] == [[pytest.approx(2 / 3), 0.5], [1.0, 1.0]]
    assert report["worst_group"] == 0.5
    assert report["unbiased"] == pytest.approx((2 / 3 + 0.5 + 1 + 1) / 4)
    assert report["aligned"] == pytest.approx(4 / 5)  # (0,0) 2/3 and (1,1) 2/2
    assert report["conflicting"] == pytest.approx(2 / 3)
    assert report["group_counts"] == [[3, 2], [1, 2]]
    assert report["empty_groups"] == []


def test_empty_groups_are_skipped_explicitly() -> None:
    y = torch.tensor([0, 0, 1])
    a = torch.tensor([0, 0, 1])
    report = accuracy_report(torch.tensor([0, 1, 1]), y, a, a == y, 2, 2)
    assert report["empty_groups"] == [[0, 1], [1, 0]]
    assert report["per_group"][0][1] is None
    assert report["worst_group"] == 0.5  # min over the two present groups, not 0
    assert report["unbiased"] == pytest.approx(0.75)
    assert report["conflicting"] is None
    assert "conflicting" not in scalars(report)


def test_empty_split_is_an_error() -> None:
    empty = torch.tensor([], dtype=torch.long)
    with pytest.raises(ValueError, match="no samples"):
        accuracy_report(empty, empty, empty, empty.bool(), 2, 2)


def test_scalars_prefix() -> None:
    y = torch.tensor([0, 1])
    report = accuracy_report(y, y, y, torch.tensor([True, True]), 2, 2)
    assert scalars(report, "val/") == {"val/avg": 1.0, "val/unbiased": 1.0, "val/worst_group": 1.0, "val/aligned": 1.0}
    assert not any(isinstance(v, float) and math.isnan(v) for v in scalars(report).values())
