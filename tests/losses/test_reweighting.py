"""LfF's generalised cross-entropy and weights, and GroupDRO's step and loss, against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from debias import losses as L
from tests.losses.reference import (
    DT,
    Y7,
    gc_inputs,
    ref_gce,
)


@pytest.mark.parametrize("q", [0.1, 0.7, 1.0])
def test_gce_matches_reference(q):
    logits = torch.randn(9, 4, generator=torch.Generator().manual_seed(0), dtype=DT) * 3
    y = torch.tensor([0, 1, 2, 3, 0, 1, 2, 3, 3])
    assert L.generalized_cross_entropy(logits, y, q).item() == pytest.approx(ref_gce(logits, y, q), rel=1e-12)
    per = L.generalized_cross_entropy(logits, y, q, reduction="none")
    assert per.shape == (9,) and per.mean().item() == pytest.approx(ref_gce(logits, y, q), rel=1e-12)
    # float32 vs float64: softmax and pow round at ~1e-7 relative
    assert L.generalized_cross_entropy(logits.float(), y, q).item() == pytest.approx(ref_gce(logits, y, q), rel=1e-5)


@pytest.mark.parametrize("q", [0.2, 0.7, 1.0])
def test_gce_gradient_is_p_y_to_the_q_times_the_ce_gradient(q):
    logits = (torch.randn(6, 5, generator=torch.Generator().manual_seed(1), dtype=DT) * 2).requires_grad_()
    y = torch.tensor([0, 4, 2, 2, 1, 3])
    (grad,) = torch.autograd.grad(L.generalized_cross_entropy(logits, y, q, reduction="none").sum(), logits)
    p = torch.softmax(logits.detach(), 1)
    onehot = torch.nn.functional.one_hot(y, 5).to(DT)
    expected = p.gather(1, y[:, None]) ** q * (p - onehot)
    assert torch.allclose(grad, expected, rtol=1e-10, atol=1e-14)


def test_gce_tends_to_cross_entropy_as_q_goes_to_zero():
    logits = torch.randn(8, 3, generator=torch.Generator().manual_seed(2), dtype=DT) * 2
    y = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    ce = torch.nn.functional.cross_entropy(logits, y).item()
    assert L.generalized_cross_entropy(logits, y, 0.0).item() == pytest.approx(ce, rel=1e-14)
    # (1 - p^q)/q = -log p - q (log p)^2 / 2 + O(q^2): the gap shrinks linearly in q
    log_p = torch.log_softmax(logits, 1).gather(1, y[:, None]).squeeze(1)
    for q in (1e-2, 1e-4, 1e-6):
        gap = ce - L.generalized_cross_entropy(logits, y, q).item()
        assert gap == pytest.approx(q * (log_p**2).mean().item() / 2, rel=10 * q)
    with pytest.raises(ValueError):
        L.generalized_cross_entropy(logits, y, 1.5)


def test_lff_weights():
    ce_b = torch.tensor([1.0, 3.0, 0.0, 0.0, 2.0], requires_grad=True)
    ce_d = torch.tensor([1.0, 1.0, 2.0, 0.0, 6.0])
    w = L.lff_weights(ce_b, ce_d)
    # 0 / 0 -> 0, as LfF's train.py: loss_b / (loss_b + loss_d + 1e-8) is 0 / 1e-8 there
    assert w.tolist() == [0.5, 0.75, 0.0, 0.0, 0.25]
    assert not w.requires_grad


def test_group_dro_weights_hand_computed():
    # η = ln 2 makes every factor e^{η a} = 2^a.  Training sizes n = (4, 1, 16) and C = 2
    # give adjustments 2/2 = 1, 2/1 = 2, 2/4 = 0.5; losses (0, 1, 1.5) -> a = (1, 3, 2).
    q = torch.tensor([0.5, 0.25, 0.25], dtype=DT)
    losses = torch.tensor([0.0, 1.0, 1.5], dtype=DT)
    n = torch.tensor([4.0, 1.0, 16.0], dtype=DT)
    new = L.group_dro_weights(q, losses, n, math.log(2), 2.0)
    # q 2^a = (0.5 * 2, 0.25 * 8, 0.25 * 4) = (1, 2, 1), sum 4
    assert new.tolist() == pytest.approx([0.25, 0.5, 0.25], rel=1e-12)
    # without adjustment: 2^(0, 1, 1.5) = (1, 2, 2 sqrt 2); q 2^L = (0.5, 0.5, sqrt 2 / 2)
    s2 = math.sqrt(2)
    total = 1 + s2 / 2
    assert L.group_dro_weights(q, losses, n, math.log(2)).tolist() == pytest.approx(
        [0.5 / total, 0.5 / total, s2 / 2 / total], rel=1e-12
    )
    # step size 0 leaves q unchanged
    assert torch.allclose(L.group_dro_weights(q, losses, n, 0.0, 2.0), q)


def test_group_dro_absent_groups_keep_their_weight():
    q = torch.tensor([0.5, 0.25, 0.25], dtype=DT)
    losses = torch.tensor([0.0, 123.0, 1.5], dtype=DT)  # group 1's value is ignored: it is absent
    n = torch.tensor([4.0, 1.0, 16.0], dtype=DT)
    present = torch.tensor([3, 0, 5])
    new = L.group_dro_weights(q, losses, n, math.log(2), 2.0, batch_counts=present)
    # a = (1, -, 2): q 2^a = (1, -, 1) over the present mass 0.75 -> (0.375, 0.25, 0.375)
    assert new.tolist() == pytest.approx([0.375, 0.25, 0.375], rel=1e-12)
    assert new.sum().item() == pytest.approx(1.0)
    # the same as the full update with the absent group's adjusted loss set to
    # log2(sum_P q 2^a / sum_P q) = log2(2 / 0.75)
    a = [1.0, math.log2(2 / 0.75), 2.0]
    full = [qi * 2**ai for qi, ai in zip(q.tolist(), a)]
    assert new.tolist() == pytest.approx([f / sum(full) for f in full], rel=1e-12)
    # no group in the batch: q unchanged
    none = L.group_dro_weights(q, losses, n, math.log(2), 2.0, batch_counts=torch.zeros(3))
    assert torch.equal(none, q)


def test_group_dro_loss_hand_computed():
    per_sample = torch.tensor([1.0, 3.0, 2.0, 4.0, 5.0], dtype=DT, requires_grad=True)
    groups = torch.tensor([0, 0, 1, 1, 1])
    q = torch.tensor([0.5, 0.25, 0.25], dtype=DT)
    means, counts = L.group_mean_losses(per_sample, groups, 3)
    assert means.tolist() == pytest.approx([2.0, 11 / 3, 0.0]) and counts.tolist() == [2, 3, 0]
    out = L.group_dro_loss(per_sample, groups, q)
    assert out.item() == pytest.approx(0.5 * 2 + 0.25 * 11 / 3)  # group 2 absent: adds 0
    (grad,) = torch.autograd.grad(out, per_sample)
    assert grad.tolist() == pytest.approx([0.25, 0.25, 0.25 / 3, 0.25 / 3, 0.25 / 3])  # q_g / n_g


Q3 = torch.tensor([0.5, 0.3, 0.2], dtype=DT)


GRADCHECK = {
    "gce": lambda z: L.generalized_cross_entropy(z, Y7 % 3, 0.7),
    "gce_q1": lambda z: L.generalized_cross_entropy(z, Y7 % 3, 1.0),
    "group_dro_loss": lambda z: L.group_dro_loss(z[:, 0] * z[:, 1], Y7, Q3),
}


@pytest.mark.parametrize("name", list(GRADCHECK))
def test_gradcheck(name):
    assert torch.autograd.gradcheck(GRADCHECK[name], (gc_inputs(),), eps=1e-6, atol=1e-5)
