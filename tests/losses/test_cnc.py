"""CNC's contrastive loss (single, batched, two-sided) against its float64 reference."""

from __future__ import annotations

import math

import pytest
import torch

from debias import losses as L
from tests.losses.reference import (
    DT,
    check_stable_at_low_temperature,
    gc_inputs,
    ref_cnc,
    unit,
)


@pytest.mark.parametrize("a_count,p_count,n_count", [(1, 1, 0), (1, 4, 6), (3, 5, 2), (4, 1, 7)])
@pytest.mark.parametrize("tau", [0.05, 0.5])
def test_cnc_matches_reference(a_count, p_count, n_count, tau):
    z = unit(a_count + p_count + n_count, 6, seed=a_count * 10 + p_count)
    a, p, n = z[:a_count], z[a_count : a_count + p_count], z[a_count + p_count :]
    ref = ref_cnc(list(a), list(p), list(n), tau)
    assert L.cnc_contrastive(a, p, n, tau).item() == pytest.approx(ref, rel=1e-10)
    if a_count == 1:
        assert L.cnc_contrastive(a[0], p, n, tau).item() == pytest.approx(ref, rel=1e-10)


def test_cnc_batched_equals_mean_of_single_batches():
    k, m, n_neg, d = 4, 3, 5, 6
    z = unit(k * (2 * m + 2 * n_neg), d, seed=1).reshape(k, 2 * m + 2 * n_neg, d)
    anchors, positives = z[:, :m], z[:, m : 2 * m]
    negatives, negatives2 = z[:, 2 * m : 2 * m + n_neg], z[:, 2 * m + n_neg :]
    batched = L.cnc_contrastive(anchors, positives, negatives, 0.05)
    single = sum(L.cnc_contrastive(anchors[i], positives[i], negatives[i], 0.05) for i in range(k)) / k
    assert batched.item() == pytest.approx(single.item(), rel=1e-12)
    two = L.cnc_two_sided(anchors, positives, negatives, negatives2, 0.05)
    ref = sum(
        ref_cnc([anchors[i, 0]], list(positives[i]), list(negatives[i]), 0.05)
        + ref_cnc([positives[i, 0]], list(anchors[i]), list(negatives2[i]), 0.05)
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
