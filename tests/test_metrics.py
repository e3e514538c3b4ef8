"""Accuracy metrics against hand-computed cases."""

from __future__ import annotations

import math

import pytest
import torch

from debias.metrics import (GroupAccuracy, accuracy_report, group_accuracies, scalars, wilson_interval,
                            worst_group_of)


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


def wilson_by_hand(k: int, n: int, confidence: float) -> tuple[float, float]:
    """Wilson (1927) score interval straight from the formula, float64:
    (p + z²/2n ± z sqrt(p(1-p)/n + z²/4n²)) / (1 + z²/n), z the (1+confidence)/2 normal quantile."""
    from statistics import NormalDist

    z = NormalDist().inv_cdf((1 + confidence) / 2)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


@pytest.mark.parametrize("k, n", [(0, 1), (5, 13), (0, 20), (20, 20), (1, 29), (81, 263), (9970, 10000)])
@pytest.mark.parametrize("confidence", [0.9, 0.95, 0.99])
def test_wilson_interval_matches_the_formula(k: int, n: int, confidence: float) -> None:
    low, high = wilson_interval(k, n, confidence)
    ref_low, ref_high = wilson_by_hand(k, n, confidence)
    assert low == pytest.approx(max(ref_low, 0.0), abs=1e-12) and high == pytest.approx(min(ref_high, 1.0), abs=1e-12)
    assert 0 <= low <= k / n <= high <= 1


def test_wilson_interval_matches_published_values() -> None:
    """Newcombe (1998), Stat. Med. 17:857, Table II, method 3 (score interval without continuity correction)."""
    published = {(81, 263): (0.2553, 0.3662), (15, 148): (0.0624, 0.1605), (0, 20): (0.0, 0.1611),
                 (1, 29): (0.0061, 0.1718)}
    for (k, n), (low, high) in published.items():
        assert tuple(round(v, 4) for v in wilson_interval(k, n, 0.95)) == (low, high), (k, n)


@pytest.mark.parametrize("n", [1, 2, 7, 13, 29, 50, 263, 10000])
def test_wilson_interval_is_scipys_binomtest_interval(n: int) -> None:
    """The closed form is scipy's ``binomtest(k, n).proportion_ci(method='wilson')`` at every k and level (that call
    also runs the exact test, whose p-value the interval does not use)."""
    from scipy.stats import binomtest

    for k in sorted({0, 1, n // 3, n // 2, n - 1, n}):
        for confidence in (0.8, 0.9, 0.95, 0.99):
            ci = binomtest(k, n).proportion_ci(confidence_level=confidence, method="wilson")
            assert wilson_interval(k, n, confidence) == pytest.approx((ci.low, ci.high), rel=1e-12, abs=1e-15), (k, n)


def test_wilson_interval_refuses_impossible_counts() -> None:
    for k, n in ((1, 0), (-1, 5), (6, 5)):
        with pytest.raises(ValueError, match="wilson_interval"):
            wilson_interval(k, n, 0.95)
    for confidence in (0.0, 1.0, 95.0, float("nan")):
        with pytest.raises(ValueError, match="confidence = .*strictly between 0 and 1"):
            wilson_interval(3, 5, confidence)


def test_group_accuracies_skip_empty_groups_and_recover_the_counts() -> None:
    y = torch.tensor([0, 0, 0, 1, 1, 1, 1])
    a = torch.tensor([0, 0, 1, 1, 1, 1, 1])  # (1, 0) is empty
    pred = torch.tensor([0, 1, 0, 1, 0, 1, 1])
    report = accuracy_report(pred, y, a, a == y, n_classes=2, n_attrs=2)
    groups = group_accuracies(report["per_group"], report["group_counts"], 0.95)
    assert [(g.y, g.a, g.n, g.correct) for g in groups] == [(0, 0, 2, 1), (0, 1, 1, 1), (1, 1, 4, 3)]
    assert (groups[2].low, groups[2].high) == wilson_interval(3, 4, 0.95)
    worst = worst_group_of(groups)
    assert (worst.y, worst.a, worst.accuracy) == (0, 0, 0.5) and worst.accuracy == report["worst_group"]
    tie = [GroupAccuracy(0, 0, 0.5, 4, 0, 1), GroupAccuracy(0, 1, 0.5, 40, 0, 1)]
    assert worst_group_of(tie).n == 40  # a tie goes to the better-supported low accuracy
    assert worst_group_of([]) is None
