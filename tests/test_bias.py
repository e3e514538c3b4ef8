"""Bias protocols: exact colours, pixel rules, counts, realised correlation and determinism."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from debias.data.bias import BiasProtocolError, background_colour_indices, inject_bias, summarise
from debias.data.sources import RawSplit
from debias.params import BACKGROUND_COLOURS, FOREGROUND_COLOURS, BiasParams
from tests.conftest import tiny_grey_digits


def _splits(x: np.ndarray, y: np.ndarray, a: np.ndarray | None = None) -> dict[str, RawSplit]:
    third = len(y) // 3
    order = np.random.default_rng(0).permutation(len(y))
    parts = {"train": order[: 2 * third], "val": order[2 * third : 2 * third + third // 2],
             "test": order[2 * third + third // 2 :]}
    return {k: RawSplit(x[i], y[i], None if a is None else a[i]) for k, i in parts.items()}


def test_paper_colours_are_the_defaults() -> None:
    params = BiasParams()
    assert params.foreground.colours == [(255, 0, 0), (208, 255, 0), (0, 255, 92), (0, 116, 255), (184, 0, 255)]
    assert params.background.colours[3] == (225, 225, 0) and params.background.colours[9] == (128, 128, 128)
    assert params.foreground.p_corr == 0.995 and params.foreground.stroke_threshold == 120
    assert params.foreground.class_digits == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]


def test_foreground_pixel_rule_is_exact() -> None:
    x, y = tiny_grey_digits(n_per_class=30)
    biased = inject_bias(_splits(x, y), BiasParams(protocol="foreground"), seed=0)
    raw = _splits(x, y)
    for name, split in biased.items():
        grey = torch.from_numpy(raw[name].x)
        palette = torch.tensor(FOREGROUND_COLOURS, dtype=torch.uint8)
        strong = grey >= 120
        expected = torch.where(strong[:, None], palette[split.a][:, :, None, None], grey[:, None].expand(-1, 3, -1, -1))
        assert torch.equal(split.x, expected)
        assert torch.equal(split.y, torch.from_numpy(raw[name].y // 2))  # digit pairs -> 5 classes
        assert split.n_classes == 5 and split.n_attrs == 5
        assert torch.equal(split.g, split.y * 5 + split.a)
        assert torch.equal(split.aligned, split.a == split.y)


def test_foreground_correlation_on_real_mnist(mnist10k) -> None:
    params = BiasParams(protocol="foreground")
    params.foreground.p_corr = 0.96
    splits = _splits(mnist10k["x"], mnist10k["y"])
    biased = inject_bias(splits, params, seed=0)
    summary = summarise(biased, params)
    assert abs(summary["splits"]["train"]["realised_correlation"] - 0.96) < 0.01
    # val/test uniform over the five colours: ~20 % aligned, every colour used about equally
    for name in ("val", "test"):
        assert abs(summary["splits"][name]["realised_correlation"] - 0.2) < 0.04
        shares = torch.bincount(biased[name].a, minlength=5).float() / len(biased[name])
        assert (shares - 0.2).abs().max() < 0.04
    # conflicting training colours are spread over the other four
    train = biased["train"]
    off = train.group_counts().clone()
    off.fill_diagonal_(0)
    assert (off.sum(1) > 0).all()


def test_background_counts_follow_the_code_rule() -> None:
    y = np.repeat(np.arange(10), 100)
    colour = background_colour_indices(y, 0.95, 10, np.random.default_rng(0))
    for label in range(10):
        members = colour[y == label]
        assert (members == label).sum() == 95  # floor(100 * 0.95)
        others = np.bincount(members[members != label], minlength=10)
        # rest of 5 cut into chunks of ceil(5 / 9) = 1: the first five other colours get one each
        assert others.sum() == 5 and others.max() == 1
        assert list(np.flatnonzero(others)) == [c for c in range(10) if c != label][:5]


def test_background_pixel_rule_and_uniform_test() -> None:
    x, y = tiny_grey_digits(n_per_class=60)
    params = BiasParams(protocol="background")
    raw = _splits(x, y)
    biased = inject_bias(raw, params, seed=0)
    palette = torch.tensor(BACKGROUND_COLOURS, dtype=torch.uint8)
    for name, split in biased.items():
        grey = torch.from_numpy(raw[name].x)
        expected = torch.where((grey == 0)[:, None], palette[split.a][:, :, None, None], torch.tensor(255, dtype=torch.uint8))
        assert torch.equal(split.x, expected)
    summary = summarise(biased, params)
    assert summary["splits"]["test"]["realised_correlation"] < 0.25


def test_protocols_are_deterministic_per_seed() -> None:
    x, y = tiny_grey_digits(n_per_class=40)  # enough that every class reaches val and test under either protocol
    for protocol in ("foreground", "background"):
        params = BiasParams(protocol=protocol)
        params.foreground.p_corr, params.background.rho = 0.7, 0.7
        first = inject_bias(_splits(x, y), params, seed=5)
        second = inject_bias(_splits(x, y), params, seed=5)
        third = inject_bias(_splits(x, y), params, seed=6)
        assert all(torch.equal(first[k].x, second[k].x) for k in first)
        assert not torch.equal(first["train"].a, third["train"].a)


def test_background_needs_a_colour_per_class() -> None:
    x, y = tiny_grey_digits(n_per_class=5, classes=12)
    params = BiasParams(protocol="background")
    with pytest.raises(BiasProtocolError, match="10 colours .* for 12 classes"):
        inject_bias(_splits(x, y), params, seed=0)


def test_foreground_digits_must_exist() -> None:
    x, y = tiny_grey_digits(n_per_class=5, classes=6)
    with pytest.raises(BiasProtocolError, match=r"labels \[6, 7, 8, 9\]"):
        inject_bias(_splits(x, y), BiasParams(protocol="foreground"), seed=0)


def test_given_protocol_uses_the_sources_attribute() -> None:
    x, y = tiny_grey_digits(n_per_class=20, classes=2)
    a = np.where(np.random.default_rng(0).random(len(y)) < 0.9, y, 1 - y)
    biased = inject_bias(_splits(x, y, a), BiasParams(protocol="given"), seed=0)
    train = biased["train"]
    assert train.n_attrs == 2 and train.x.shape[1] == 3
    assert torch.equal(train.aligned, train.a == train.y)
    with pytest.raises(BiasProtocolError, match="needs a bias attribute"):
        inject_bias(_splits(x, y), BiasParams(protocol="given"), seed=0)
