"""FairKL (kl, mean, released; hard and soft bias) and the released objective against their float64 references."""

from __future__ import annotations

import pytest
import torch

from debias import losses as L
from tests.losses.reference import (
    DT,
    LAYOUTS,
    RELEASED_CASES,
    Y7,
    check_permutation_invariant,
    check_stable_at_low_temperature,
    gc_inputs,
    hard_same,
    random_batch,
    ref_fairkl,
    ref_fairkl_moments,
    ref_fairkl_released,
    ref_released_objective,
    soft_same,
    unit,
)


FAIRKL_CASES = {
    "mixed": (LAYOUTS["mixed"], [0, 1, 0, 0, 1, 1, 0, 1, 1, 0, 0, 1]),
    "three_bias": ([0, 0, 0, 1, 1, 1, 2, 2, 2, 0], [0, 1, 2, 0, 1, 2, 0, 1, 2, 1]),
    "no_pos_conflict": ([0, 0, 1, 1, 2, 2], [0, 0, 1, 1, 0, 1]),  # 1 positive-conflicting pair
    "all_aligned": ([0, 0, 1, 1], [0, 0, 0, 0]),  # no conflicting pair at all
    "all_same_class": ([3] * 7, [0, 0, 0, 1, 1, 1, 1]),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(FAIRKL_CASES))
@pytest.mark.parametrize("variant", ["kl", "mean"])
def test_fairkl_matches_reference(case, variant):
    y, bias = FAIRKL_CASES[case]
    z = unit(len(y), 4, seed=len(y) * 3)
    ref = ref_fairkl(z, y, hard_same(bias), variant)
    got = L.fairkl(z, torch.tensor(y), torch.tensor(bias), variant)
    assert got.item() == pytest.approx(ref, rel=1e-9, abs=1e-12)

@pytest.mark.parametrize("seed", range(6))
def test_fairkl_random_batches_match_references(seed):
    z, y, bias, _, _ = random_batch(seed)
    yl = y.tolist()
    for variant in ("kl", "mean"):
        ref = ref_fairkl(z, yl, hard_same(bias.tolist()), variant)
        assert L.fairkl(z, y, bias, variant).item() == pytest.approx(ref, rel=1e-8, abs=1e-10)


@pytest.mark.parametrize("case", ["mixed", "three_bias", "all_same_class"])
@pytest.mark.parametrize("variant", ["kl", "mean"])
def test_fairkl_soft_bias_matches_weighted_reference(case, variant):
    y, bias = FAIRKL_CASES[case]
    g = torch.Generator().manual_seed(4)
    p = torch.softmax(2 * torch.randn(len(y), 3, generator=g, dtype=DT), dim=1)
    z = unit(len(y), 4, seed=8)
    ref = ref_fairkl(z, y, soft_same(p), variant)
    got = L.fairkl(z, torch.tensor(y), p, variant)
    assert got.item() == pytest.approx(ref, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("case", list(FAIRKL_CASES))
@pytest.mark.parametrize("variant", ["kl", "mean", "released"])
def test_fairkl_soft_one_hot_equals_hard_exactly(case, variant):
    y, bias = FAIRKL_CASES[case]
    z = unit(len(y), 4, seed=12, dtype=torch.float32)
    hard = torch.tensor(bias)
    one_hot = torch.nn.functional.one_hot(hard, 3).float()
    a = L.fairkl(z, torch.tensor(y), hard, variant)
    b = L.fairkl(z, torch.tensor(y), one_hot, variant)
    assert torch.equal(a, b)


@pytest.mark.parametrize("case", ["mixed", "three_bias", "no_pos_conflict"])
@pytest.mark.parametrize("include_self", [False, True])
def test_fairkl_released_matches_reference(case, include_self):
    y, bias = FAIRKL_CASES[case]
    z = unit(len(y), 4, seed=31)
    ref = ref_fairkl_released(z, y, hard_same(bias), 1.0, 1.0, include_self)
    got = L.fairkl(z, torch.tensor(y), torch.tensor(bias), "released", released_include_self=include_self)
    assert got.item() == pytest.approx(ref, rel=1e-9, abs=1e-12)
    ref2 = ref_fairkl_released(z, y, hard_same(bias), 0.1, 0.0, include_self)
    got2 = L.fairkl(
        z, torch.tensor(y), torch.tensor(bias), "released",
        released_temperature=0.1, released_kld=0.0, released_include_self=include_self,
    )
    assert got2.item() == pytest.approx(ref2, rel=1e-9, abs=1e-12)


def test_fairkl_zero_for_equal_moments_and_positive_otherwise():
    # orthonormal rows (a rotated simplex): every pair has d = 2, so aligned and
    # conflicting sets have identical moments on both sides
    y = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    bias = torch.tensor([0, 0, 1, 1, 0, 0, 1, 1])
    q, _ = torch.linalg.qr(torch.randn(8, 8, generator=torch.Generator().manual_seed(1), dtype=DT))
    for variant in ("kl", "mean"):
        assert L.fairkl(q, y, bias, variant).item() == pytest.approx(0.0, abs=1e-9)
    # bias-aligned samples pulled together: both variants see the bias
    z = q.clone()
    z[1] = torch.nn.functional.normalize(q[0] + 0.3 * q[1], dim=0)
    z[5] = torch.nn.functional.normalize(q[4] + 0.3 * q[5], dim=0)
    for variant in ("kl", "mean"):
        assert L.fairkl(z, y, bias, variant).item() > 1e-3


def test_fairkl_small_sets_zero_their_side_and_report():
    y, bias = FAIRKL_CASES["no_pos_conflict"]
    z = unit(len(y), 4, seed=2)
    rep = L.fairkl_report(z, torch.tensor(y), torch.tensor(bias))
    assert rep["pos_conflicting"]["pairs"] == 1.0  # class 2's pair only
    assert rep["pos_aligned"]["pairs"] == 2.0
    assert rep["small_sets"] == ["pos_conflicting"]
    assert rep["kl_pos"] == 0.0
    ref = ref_fairkl_moments(z, y, hard_same(bias))
    for name in L.FAIRKL_SETS:
        n, mu, var = ref[name]
        assert rep[name]["pairs"] == pytest.approx(n)
        if n > 0:
            assert rep[name]["mean"] == pytest.approx(mu) and rep[name]["var"] == pytest.approx(var)
    total = L.fairkl(z, torch.tensor(y), torch.tensor(bias)).item()
    assert total == pytest.approx(rep["kl_pos"] + rep["kl_neg"], rel=1e-9)


def test_fairkl_finite_with_zero_variance_sets():
    # one positive-aligned pair -> variance 0: the floor keeps the KL finite
    y = torch.tensor([0, 0, 0, 0, 1, 1])
    bias = torch.tensor([0, 0, 1, 1, 0, 1])
    z = unit(6, 4, seed=3).requires_grad_()
    out = L.fairkl(z, y, bias)
    out.backward()
    assert torch.isfinite(out) and torch.isfinite(z.grad).all()


def test_fairkl_rejects_bad_bias():
    z = unit(4, 3, seed=0)
    with pytest.raises(ValueError):
        L.fairkl(z, torch.tensor([0, 0, 1, 1]), torch.rand(4))
    with pytest.raises(ValueError):
        L.fairkl(z, torch.tensor([0, 0, 1, 1]), torch.tensor([0, 1]))
    with pytest.raises(ValueError):
        L.fairkl(z, torch.tensor([0, 0, 1, 1]), torch.tensor([0, 1, 0, 1]), "variance")


@pytest.mark.parametrize(
    "fn",
    [
        lambda z, y, b: L.fairkl(z, y, b),
        lambda z, y, b: L.fairkl(z, y, b, "mean"),
        lambda z, y, b: L.fairkl(z, y, b, "released"),
    ],
    ids=["fairkl_kl", "fairkl_mean", "fairkl_released"],
)
def test_invariant_to_batch_permutation(fn):
    check_permutation_invariant(fn)


@pytest.mark.parametrize("case", ["mixed", "three_bias"])
def test_released_objective_reference_depends_on_each_ingredient_of_the_code(case):
    """alpha^2, tau / 0.07, self-pairs and the linear terms each change the released objective: a library that
    dropped any of them would miss the reference (the library's pieces are checked against it above and in
    test_methods.py's composition test)."""
    y, bias = RELEASED_CASES[case]
    z = unit(len(y), 5, seed=17)
    full = ref_released_objective(z, y, bias, 0.3, 0.75, 0.5, 0.1, "supinfonce")
    for flag in ("alpha_twice", "tau_factor", "include_self", "linear"):
        assert ref_released_objective(z, y, bias, 0.3, 0.75, 0.5, 0.1, "supinfonce", **{flag: False}) != \
            pytest.approx(full, rel=1e-3), flag
    got = (0.3 ** 2 * L.released_contrastive(z, torch.tensor(y), 0.5, 0.1)
           + 0.75 * L.fairkl(z, torch.tensor(y), torch.tensor(bias), "released"))
    assert got.item() == pytest.approx(full, rel=1e-10)


def test_fairkl_released_counts_self_pairs_by_default():
    y, bias = RELEASED_CASES["mixed"]
    z = unit(len(y), 4, seed=5)
    got = L.fairkl(z, torch.tensor(y), torch.tensor(bias), "released")
    assert got.item() == pytest.approx(ref_fairkl_released(z, y, hard_same(bias), 1.0, 1.0, True), rel=1e-10)
    assert got.item() != pytest.approx(ref_fairkl_released(z, y, hard_same(bias), 1.0, 1.0, False), rel=1e-3)


B7 = torch.tensor([0, 1, 0, 1, 1, 0, 0])
P7 = torch.softmax(torch.randn(7, 2, generator=torch.Generator().manual_seed(1), dtype=DT), 1)


GRADCHECK = {
    "fairkl_kl": lambda z: L.fairkl(z, Y7, B7),
    "fairkl_mean": lambda z: L.fairkl(z, Y7, B7, "mean"),
    "fairkl_soft": lambda z: L.fairkl(z, Y7, P7),
    "fairkl_released": lambda z: L.fairkl(z, Y7, B7, "released"),
}


@pytest.mark.parametrize("name", list(GRADCHECK))
def test_gradcheck(name):
    assert torch.autograd.gradcheck(GRADCHECK[name], (gc_inputs(),), eps=1e-6, atol=1e-5)


STABILITY = {
    "fairkl_kl": lambda z, y, b: L.fairkl(z, y, b),
    "fairkl_mean": lambda z, y, b: L.fairkl(z, y, b, "mean"),
    "fairkl_released": lambda z, y, b: L.fairkl(z, y, b, "released", released_temperature=0.05),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", list(STABILITY))
def test_stable_at_low_temperature_with_near_identical_rows(name, dtype):
    check_stable_at_low_temperature(STABILITY[name], name, dtype)
