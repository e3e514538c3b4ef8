"""CNC's contrastive loss (single, batched, two-sided; with and without the ε margin) against its float64 reference."""

from __future__ import annotations

import math

import pytest
import torch

from debias import losses as L
from debias.losses._common import _logsumexp
from debias.losses.cnc import _cnc_batched
from tests.losses.reference import (
    DT,
    check_stable_at_low_temperature,
    gc_inputs,
    ref_cnc,
    unit,
)


@pytest.mark.parametrize("a_count,p_count,n_count", [(1, 1, 0), (1, 4, 6), (3, 5, 2), (4, 1, 7)])
@pytest.mark.parametrize("tau", [0.05, 0.5])
@pytest.mark.parametrize("eps", [0.0, 0.25, 1.0])
def test_cnc_matches_reference(a_count, p_count, n_count, tau, eps):
    z = unit(a_count + p_count + n_count, 6, seed=a_count * 10 + p_count)
    a, p, n = z[:a_count], z[a_count : a_count + p_count], z[a_count + p_count :]
    ref = ref_cnc(list(a), list(p), list(n), tau, eps)
    assert L.cnc_contrastive(a, p, n, tau, eps).item() == pytest.approx(ref, rel=1e-10)
    if a_count == 1:
        assert L.cnc_contrastive(a[0], p, n, tau, eps).item() == pytest.approx(ref, rel=1e-10)


def _cnc_before_epsilon(anchor, positives, negatives, temperature):
    """CNC's loss as the library computed it before it took a margin (the same helpers, the same operations)."""
    a, p, n = _cnc_batched(anchor, positives, negatives)
    a = a / temperature
    s_pos = torch.bmm(a, p.transpose(1, 2))
    s_neg = torch.bmm(a, n.transpose(1, 2))
    lse = _logsumexp(torch.cat([s_pos, s_neg], dim=2), dim=2)
    return (lse - s_pos.mean(dim=2)).mean()


def test_epsilon_zero_is_cncs_loss_bit_for_bit_value_and_gradient():
    z = unit(4 * 16, 8, seed=3, dtype=torch.float32).reshape(4, 16, 8).requires_grad_()
    new = L.cnc_contrastive(z[:, 0], z[:, 1:9], z[:, 9:], 0.05, 0.0)
    (g_new,) = torch.autograd.grad(new, z)
    old = _cnc_before_epsilon(z[:, 0], z[:, 1:9], z[:, 9:], 0.05)
    (g_old,) = torch.autograd.grad(old, z)
    assert torch.equal(new, old) and torch.equal(g_new, g_old)
    assert torch.equal(L.cnc_contrastive(z[:, 0], z[:, 1:9], z[:, 9:], 0.05), new)  # the default is 0


def test_epsilon_lowers_the_positives_weight_in_the_denominator():
    """At ``s_ap = s_an = 0`` (orthogonal rows) the loss is ``log(P e^-eps + N)``: ε = 0.25 with P = N = 32 moves it
    from log 64 to log(32 e^-0.25 + 32), -2.8 %; a larger ε lowers it further and never raises it."""
    d = 64 + 1
    basis = torch.eye(d, dtype=DT)
    a, p, n = basis[0], basis[1:33], basis[33:65]
    values = [L.cnc_contrastive(a, p, n, 0.05, eps).item() for eps in (0.0, 0.25, 0.5, 1.0)]
    assert values[0] == pytest.approx(math.log(64), rel=1e-12)
    assert values[1] == pytest.approx(math.log(32 * math.exp(-0.25) + 32), rel=1e-12)
    assert values == sorted(values, reverse=True) and values[1] < 0.99 * values[0]


def test_epsilon_must_not_be_negative():
    z = unit(6, 3, seed=0)
    with pytest.raises(ValueError, match="epsilon must be >= 0, got -0.1"):
        L.cnc_contrastive(z[0], z[1:3], z[3:], 0.05, -0.1)


def test_cnc_batched_equals_mean_of_single_batches():
    k, m, n_neg, d = 4, 3, 5, 6
    z = unit(k * (2 * m + 2 * n_neg), d, seed=1).reshape(k, 2 * m + 2 * n_neg, d)
    anchors, positives = z[:, :m], z[:, m : 2 * m]
    negatives, negatives2 = z[:, 2 * m : 2 * m + n_neg], z[:, 2 * m + n_neg :]
    batched = L.cnc_contrastive(anchors, positives, negatives, 0.05)
    single = sum(L.cnc_contrastive(anchors[i], positives[i], negatives[i], 0.05) for i in range(k)) / k
    assert batched.item() == pytest.approx(single.item(), rel=1e-12)
    for eps in (0.0, 0.5):
        two = L.cnc_two_sided(anchors, positives, negatives, negatives2, 0.05, eps)
        ref = sum(
            ref_cnc([anchors[i, 0]], list(positives[i]), list(negatives[i]), 0.05, eps)
            + ref_cnc([positives[i, 0]], list(anchors[i]), list(negatives2[i]), 0.05, eps)
            for i in range(k)
        ) / k
        assert two.item() == pytest.approx(ref, rel=1e-10)
    one = L.cnc_two_sided(anchors[0], positives[0], negatives[0], None, 0.05)
    assert one.item() == pytest.approx(ref_cnc([anchors[0, 0]], list(positives[0]), list(negatives[0]), 0.05))


def test_cnc_floor_is_log_m_per_side():
    # identical anchor/positives, orthogonal negatives: loss -> log(P)
    d = 8
    a = torch.zeros(d, dtype=DT)
    a[0] = 1
    p = a.repeat(4, 1)
    n = torch.eye(d, dtype=DT)[1:5]
    assert L.cnc_contrastive(a, p, n, 0.05).item() == pytest.approx(math.log(4), abs=1e-6)


def test_cnc_rejects_an_empty_positive_set():
    a = unit(4, 3, seed=0)
    with pytest.raises(ValueError):
        L.cnc_contrastive(a[0], a[:0], a[1:], 0.1)


GRADCHECK = {
    "cnc": lambda z: L.cnc_contrastive(z[:2], z[2:4], z[4:], 0.1),
    "cnc_two_sided": lambda z: L.cnc_two_sided(z[:2], z[2:4], z[4:6], z[5:], 0.1),
    "cnc_eps": lambda z: L.cnc_contrastive(z[:2], z[2:4], z[4:], 0.1, 0.5),
    "cnc_two_sided_eps": lambda z: L.cnc_two_sided(z[:2], z[2:4], z[4:6], z[5:], 0.1, 0.5),
}


@pytest.mark.parametrize("name", list(GRADCHECK))
def test_gradcheck(name):
    assert torch.autograd.gradcheck(GRADCHECK[name], (gc_inputs(),), eps=1e-6, atol=1e-5)


STABILITY = {
    "cnc": lambda z, y, b: L.cnc_two_sided(z[:8], z[8:16], z[16:24], z[24:32], 0.05),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", list(STABILITY))
def test_stable_at_low_temperature_with_near_identical_rows(name, dtype):
    check_stable_at_low_temperature(STABILITY[name], name, dtype)
