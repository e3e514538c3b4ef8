"""SupCon, eps-SupCon, eps-SupInfoNCE and the released contrastive term against their float64 references."""

from __future__ import annotations

import math

import pytest
import torch

from debias import losses as L
from tests.losses.reference import (
    LAYOUTS,
    RELEASED_CASES,
    Y7,
    check_permutation_invariant,
    check_stable_at_low_temperature,
    gc_inputs,
    random_batch,
    ref_eps_supcon,
    ref_eps_supinfonce,
    ref_released_contrastive,
    ref_supcon,
    unit,
)


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("tau", [0.05, 0.1, 1.0])
def test_supcon_matches_reference(layout, tau):
    y = torch.tensor(LAYOUTS[layout])
    z = unit(len(y), 5, seed=len(y) + int(100 * tau))
    ref = ref_supcon(z, y.tolist(), tau)
    got = L.supcon(z, y, tau)
    if ref is None:
        assert got.item() == 0.0
    else:
        assert got.item() == pytest.approx(ref, rel=1e-10, abs=1e-10)


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("eps", [0.0, 0.25, 1.0, 3.0])
def test_eps_supcon_matches_reference(layout, eps):
    y = torch.tensor(LAYOUTS[layout])
    z = unit(len(y), 4, seed=3 + len(y))
    ref = ref_eps_supcon(z, y.tolist(), eps, 0.1)
    got = L.eps_supcon(z, y, eps, 0.1)
    assert got.item() == pytest.approx(0.0 if ref is None else ref, rel=1e-10, abs=1e-10)


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("eps", [0.0, 0.25, 1.0, 3.0])
@pytest.mark.parametrize("tau", [0.07, 0.5])
def test_eps_supinfonce_matches_reference(layout, eps, tau):
    y = torch.tensor(LAYOUTS[layout])
    z = unit(len(y), 4, seed=7 + len(y))
    ref = ref_eps_supinfonce(z, y.tolist(), eps, tau)
    got = L.eps_supinfonce(z, y, eps, tau)
    assert got.item() == pytest.approx(0.0 if ref is None else ref, rel=1e-10, abs=1e-10)


@pytest.mark.parametrize("seed", range(6))
def test_random_batches_match_references(seed):
    z, y, _, eps, tau = random_batch(seed)
    yl = y.tolist()
    for got, ref in (
        (L.supcon(z, y, tau), ref_supcon(z, yl, tau)),
        (L.eps_supcon(z, y, eps, tau), ref_eps_supcon(z, yl, eps, tau)),
        (L.eps_supinfonce(z, y, eps, tau), ref_eps_supinfonce(z, yl, eps, tau)),
    ):
        assert got.item() == pytest.approx(0.0 if ref is None else ref, rel=1e-9, abs=1e-10)


def test_eps_supinfonce_without_negatives_is_minus_eps():
    z = unit(5, 3, seed=1)
    y = torch.zeros(5, dtype=torch.long)
    assert L.eps_supinfonce(z, y, 0.7, 0.1).item() == pytest.approx(-0.7)


def test_eps_supcon_at_zero_equals_supcon():
    y = torch.tensor(LAYOUTS["mixed"])
    z = unit(len(y), 6, seed=11)
    # the eps > 0 code path evaluated at a negligible epsilon agrees too
    assert L.eps_supcon(z, y, 0.0, 0.1).item() == L.supcon(z, y, 0.1).item()
    assert L.eps_supcon(z, y, 1e-12, 0.1).item() == pytest.approx(L.supcon(z, y, 0.1).item(), rel=1e-9)


def test_eps_supinfonce_decreases_with_eps():
    y = torch.tensor(LAYOUTS["two_big"])
    z = unit(len(y), 8, seed=5)
    values = [L.eps_supinfonce(z, y, eps, 0.1).item() for eps in (0.0, 0.1, 0.5, 1.0, 2.0, 5.0)]
    assert all(a > b for a, b in zip(values, values[1:]))


def test_no_positive_anchor_gives_zero_with_grad():
    z = unit(5, 3, seed=2).requires_grad_()
    y = torch.arange(5)
    for fn in (
        lambda: L.supcon(z, y, 0.1),
        lambda: L.eps_supcon(z, y, 0.5, 0.1),
        lambda: L.eps_supinfonce(z, y, 0.5, 0.1),
    ):
        out = fn()
        assert out.item() == 0.0 and out.requires_grad
        out.backward()
        assert torch.equal(z.grad, torch.zeros_like(z))
        z.grad = None
    single = unit(1, 3, seed=2).requires_grad_()
    assert L.supcon(single, torch.tensor([0]), 0.1).item() == 0.0


def test_anchors_without_positive_are_left_out_of_the_mean():
    # anchors 4 and 5 are singletons: the loss is the mean over anchors 0..3 only
    y = torch.tensor([0, 0, 1, 1, 2, 3])
    z = unit(6, 4, seed=9)
    full = L.supcon(z, y, 0.2).item()
    s = (z @ z.T) / 0.2
    s.fill_diagonal_(-math.inf)
    lse_rows = torch.logsumexp(s, 1)
    per = [lse_rows[i] - s[i, j] for i, j in ((0, 1), (1, 0), (2, 3), (3, 2))]
    assert full == pytest.approx(float(sum(per) / 4), rel=1e-12)


@pytest.mark.parametrize(
    "fn",
    [
        lambda z, y, b: L.supcon(z, y, 0.1),
        lambda z, y, b: L.eps_supcon(z, y, 0.4, 0.1),
        lambda z, y, b: L.eps_supinfonce(z, y, 0.4, 0.1),
    ],
    ids=["supcon", "eps_supcon", "eps_supinfonce"],
)
def test_invariant_to_batch_permutation(fn):
    check_permutation_invariant(fn)


def test_supcon_rejects_labels_of_another_batch_size():
    a = unit(4, 3, seed=0)
    with pytest.raises(ValueError):
        L.supcon(a, torch.tensor([0, 1]), 0.1)


@pytest.mark.parametrize("case", list(RELEASED_CASES))
@pytest.mark.parametrize("form", ["supinfonce", "supcon"])
@pytest.mark.parametrize("eps, tau", [(0.5, 0.1), (0.0, 0.1), (0.25, 0.5)])
def test_released_contrastive_matches_the_released_code(case, form, eps, tau):
    y, _ = RELEASED_CASES[case]
    z = unit(len(y), 5, seed=len(y) + 40)
    ref = ref_released_contrastive(z, y, eps, tau, form)
    assert L.released_contrastive(z, torch.tensor(y), eps, tau, form).item() == pytest.approx(ref, rel=1e-10,
                                                                                               abs=1e-12)


def test_released_contrastive_is_the_papers_loss_times_tau_over_0_07_up_to_its_guard_and_anchor_mean():
    y, _ = RELEASED_CASES["mixed"]
    z = unit(len(y), 5, seed=3)
    for form, paper in (("supinfonce", L.eps_supinfonce), ("supcon", L.eps_supcon)):
        unguarded = ref_released_contrastive(z, y, 0.5, 0.1, form, guard=0.0)
        assert unguarded == pytest.approx(0.1 / 0.07 * paper(z, torch.tensor(y), 0.5, 0.1).item(), rel=1e-10)
        # the guard 1e-6 is added to the max-shifted denominator: it changes the value
        assert abs(L.released_contrastive(z, torch.tensor(y), 0.5, 0.1, form).item() - unguarded) > 1e-6
    y, _ = RELEASED_CASES["singletons"]  # anchors without a positive count 0 in the released mean
    z = unit(len(y), 5, seed=3)
    got = L.released_contrastive(z, torch.tensor(y), 0.5, 0.1)
    assert got.item() == pytest.approx(ref_released_contrastive(z, y, 0.5, 0.1, "supinfonce"), rel=1e-10)
    assert got.item() != pytest.approx(ref_released_contrastive(z, y, 0.5, 0.1, "supinfonce", all_anchors=False),
                                       rel=1e-3)


def test_released_contrastive_rejects_an_unknown_form():
    with pytest.raises(ValueError, match="unknown released form 'nce'"):
        L.released_contrastive(unit(4, 3, seed=0), torch.tensor([0, 0, 1, 1]), 0.5, 0.1, "nce")


def test_low_precision_agrees_with_float64():
    y = torch.tensor(LAYOUTS["mixed"])
    z = unit(len(y), 8, seed=4)
    ref = L.supcon(z, y, 0.05).item()
    assert L.supcon(z.float(), y, 0.05).item() == pytest.approx(ref, rel=1e-5)
    assert L.supcon(z.bfloat16(), y, 0.05).item() == pytest.approx(ref, rel=5e-2)
    assert L.supcon(z.bfloat16(), y, 0.05).dtype == torch.float32


GRADCHECK = {
    "supcon": lambda z: L.supcon(z, Y7, 0.2),
    "eps_supcon": lambda z: L.eps_supcon(z, Y7, 0.5, 0.2),
    "eps_supinfonce": lambda z: L.eps_supinfonce(z, Y7, 0.5, 0.2),
    "released_supinfonce": lambda z: L.released_contrastive(z, Y7, 0.5, 0.2),
    "released_supcon": lambda z: L.released_contrastive(z, Y7, 0.5, 0.2, "supcon"),
}


@pytest.mark.parametrize("name", list(GRADCHECK))
def test_gradcheck(name):
    assert torch.autograd.gradcheck(GRADCHECK[name], (gc_inputs(),), eps=1e-6, atol=1e-5)


STABILITY = {
    "supcon": lambda z, y, b: L.supcon(z, y, 0.05),
    "eps_supcon": lambda z, y, b: L.eps_supcon(z, y, 0.5, 0.05),
    "eps_supinfonce": lambda z, y, b: L.eps_supinfonce(z, y, 0.5, 0.05),
    "released_supinfonce": lambda z, y, b: L.released_contrastive(z, y, 0.5, 0.05),
    "released_supcon": lambda z, y, b: L.released_contrastive(z, y, 0.5, 0.05, "supcon"),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", list(STABILITY))
def test_stable_at_low_temperature_with_near_identical_rows(name, dtype):
    check_stable_at_low_temperature(STABILITY[name], name, dtype)
