"""Triplet, NT-Xent, DCL, HCL and WCL (weights and full objective) against their float64 references."""

from __future__ import annotations

import math

import pytest
import torch

from debias import losses as L
from tests.losses.reference import (
    DT,
    check_stable_at_low_temperature,
    gc_inputs,
    lse,
    near_identical,
    ref_triplet,
    ref_triplet_2view,
    ref_two_view,
    ref_wcl_weights,
    unit,
)


@pytest.mark.parametrize("b", [2, 3, 9])
@pytest.mark.parametrize("tau_plus", [0.0, 0.1, 0.3])
def test_triplet_matches_reference(b, tau_plus):
    a, p = unit(b, 5, seed=b), unit(b, 5, seed=b + 50)
    ref = ref_triplet(a, p, tau_plus)
    assert L.triplet(a, p, tau_plus=tau_plus).item() == pytest.approx(ref, rel=1e-10, abs=1e-12)
    pool = unit(b + 2, 5, seed=b + 99)
    ref_pool = ref_triplet(a, p, tau_plus, negatives=list(pool))
    assert L.triplet(a, p, pool, tau_plus).item() == pytest.approx(ref_pool, rel=1e-10, abs=1e-12)


def test_relative_difficulty():
    dd = torch.tensor([[0.0, 1.0, 2.0], [4.0, 0.0, 1.0]], requires_grad=True)
    db = torch.tensor([[0.0, 2.0, 1.0], [1.0, 0.0, 2.0]], requires_grad=True)
    w = L.relative_difficulty(dd, db)
    ndd, ndb = dd.detach() / 4, db.detach() / 2
    expected = 1 + ndd / (ndd + ndb)
    expected[0, 0] = expected[1, 1] = 1.5  # 0 / 0
    assert torch.allclose(w, expected)
    assert not w.requires_grad
    assert ((w >= 1) & (w <= 2)).all()
    assert L.relative_difficulty(torch.zeros(3), torch.zeros(3)).tolist() == [1.5] * 3


def test_relative_difficulty_normalises_over_the_mask_only():
    dd = torch.tensor([[9.0, 1.0, 2.0], [4.0, 9.0, 1.0]])
    db = torch.tensor([[9.0, 2.0, 1.0], [1.0, 9.0, 2.0]])
    mask = torch.tensor([[False, True, True], [True, False, True]])
    w = L.relative_difficulty(dd, db, mask)
    ndd, ndb = dd / 4, db / 2  # maxima over the masked entries: 4 and 2, not 9
    assert torch.allclose(w[mask], (1 + ndd / (ndd + ndb))[mask])


def test_two_view_negatives_are_every_other_view_but_the_positive():
    for b in (2, 3, 5):
        neg = L.two_view_negatives(b)
        assert neg.shape == (2 * b, 2 * b) and neg.sum(1).tolist() == [2 * b - 2] * (2 * b)
        for k in range(2 * b):
            assert not neg[k, k] and not neg[k, (k + b) % (2 * b)]


# Tolerances: the library and the loop references both run in float64 but sum in different
# orders and in log space (lse, log1mexp) vs directly; each step rounds at ~1e-16 relative,
# a loss of O(1-10) from at most 2B = 16 terms of size <= e^{1/τ} = e^{10} stays within
# ~1e-13 relative, so rel = 1e-9 is loose yet catches any formula slip (>= 1e-4).
TWO_VIEW_CASES = [(b, tau, tp) for b in (2, 3, 8) for tau in (0.1, 0.5) for tp in (0.0, 0.1, 0.6)]


@pytest.mark.parametrize("b,tau,tau_plus", TWO_VIEW_CASES)
def test_two_view_losses_match_references(b, tau, tau_plus):
    z1, z2 = unit(b, 4, seed=b * 3), unit(b, 4, seed=b * 3 + 1)
    w = 1 + torch.rand(2 * b, 2 * b, generator=torch.Generator().manual_seed(b), dtype=DT)
    cases = [
        (L.nt_xent(z1, z2, tau, tau_plus), ref_two_view(z1, z2, tau, tau_plus)),
        (L.weighted_infonce_2view(z1, z2, w, tau, tau_plus), ref_two_view(z1, z2, tau, tau_plus, w=w.tolist())),
        (L.hcl(z1, z2, tau, tau_plus, 1.0), ref_two_view(z1, z2, tau, tau_plus, beta=1.0)),
        (L.hcl(z1, z2, tau, tau_plus, 0.5), ref_two_view(z1, z2, tau, tau_plus, beta=0.5)),
    ]
    if tau_plus > 0:
        cases.append((L.dcl(z1, z2, tau, tau_plus), ref_two_view(z1, z2, tau, tau_plus)))
    for got, ref in cases:
        assert got.item() == pytest.approx(ref.item(), rel=1e-9)


@pytest.mark.parametrize("tau_plus", [0.0, 0.1])
def test_two_view_losses_in_float32_agree_with_float64_references(tau_plus):
    # float32 rounds z and s at ~6e-8 relative; s = z.z/τ at τ = 0.5 has absolute error
    # ~1e-7 and the loss (an lse over 14 terms minus s+) inherits a few times that, so
    # rel = 1e-5 on a loss of O(1) leaves two orders of margin.
    z1, z2 = unit(8, 6, seed=40), unit(8, 6, seed=41)
    w = 1 + torch.rand(16, 16, generator=torch.Generator().manual_seed(0), dtype=DT)
    f1, f2 = z1.float(), z2.float()
    for got, ref in (
        (L.nt_xent(f1, f2, 0.5, tau_plus), ref_two_view(z1, z2, 0.5, tau_plus)),
        (L.weighted_infonce_2view(f1, f2, w.float(), 0.5, tau_plus), ref_two_view(z1, z2, 0.5, tau_plus, w=w.tolist())),
        (L.hcl(f1, f2, 0.5, tau_plus, 1.0), ref_two_view(z1, z2, 0.5, tau_plus, beta=1.0)),
        (L.triplet_2view(f1, f2, tau_plus), ref_triplet_2view(z1, z2, tau_plus)),
    ):
        assert got.dtype == torch.float32
        assert got.item() == pytest.approx(ref.item(), rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("tau_plus", [0.0, 0.1, 0.6])
def test_two_view_gradients_match_the_references(tau_plus):
    # autograd through the loop references (float64) vs the library's vectorised backward
    b = 4
    w = 1 + torch.rand(2 * b, 2 * b, generator=torch.Generator().manual_seed(1), dtype=DT)
    pairs = [
        (lambda a, p: L.nt_xent(a, p, 0.5, tau_plus), lambda a, p: ref_two_view(a, p, 0.5, tau_plus)),
        (lambda a, p: L.weighted_infonce_2view(a, p, w, 0.5, tau_plus),
         lambda a, p: ref_two_view(a, p, 0.5, tau_plus, w=w.tolist())),
        (lambda a, p: L.hcl(a, p, 0.5, tau_plus, 1.0), lambda a, p: ref_two_view(a, p, 0.5, tau_plus, beta=1.0)),
        (lambda a, p: L.triplet_2view(a, p, tau_plus), lambda a, p: ref_triplet_2view(a, p, tau_plus)),
    ]
    for ours, ref in pairs:
        grads = []
        for fn in (ours, ref):
            a, p = unit(b, 3, seed=7).requires_grad_(), unit(b, 3, seed=8).requires_grad_()
            grads.append(torch.autograd.grad(fn(a, p), [a, p]))
        for g_ours, g_ref in zip(*grads):
            assert torch.allclose(g_ours, g_ref, rtol=1e-9, atol=1e-12)


def test_nt_xent_without_debiasing_is_simclr_cross_entropy():
    # independent form: softmax cross-entropy over each view's row of logits (self
    # excluded) with the other view of its image as the target class
    for b in (2, 6):
        z1, z2 = unit(b, 5, seed=b), unit(b, 5, seed=b + 10)
        zs = torch.cat([z1, z2])
        logits = (zs @ zs.T / 0.5).fill_diagonal_(-math.inf)
        target = (torch.arange(2 * b) + b) % (2 * b)
        expected = torch.nn.functional.cross_entropy(logits, target).item()
        assert L.nt_xent(z1, z2, 0.5).item() == pytest.approx(expected, rel=1e-12)
        assert L.dcl(z1, z2, 0.5, 0.0).item() == pytest.approx(expected, rel=1e-12)
        assert L.hcl(z1, z2, 0.5, 0.0, 0.0).item() == pytest.approx(expected, rel=1e-12)
        ones = torch.ones(2 * b, 2 * b, dtype=DT)
        assert L.weighted_infonce_2view(z1, z2, ones, 0.5, 0.0).item() == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("tau_plus", [0.0, 0.1, 0.5])
def test_hcl_at_beta_zero_is_dcl(tau_plus):
    z1, z2 = unit(6, 4, seed=1), unit(6, 4, seed=2)
    assert L.hcl(z1, z2, 0.5, tau_plus, 0.0).item() == pytest.approx(L.dcl(z1, z2, 0.5, tau_plus).item(), rel=1e-12)
    # beta > 0 up-weights the hard negatives, so the estimate of the negative term grows
    assert L.hcl(z1, z2, 0.5, tau_plus, 1.0).item() > L.dcl(z1, z2, 0.5, tau_plus).item()


def test_two_view_losses_are_symmetric_in_the_views():
    z1, z2 = unit(5, 4, seed=3), unit(5, 4, seed=4)
    w = 1 + torch.rand(10, 10, generator=torch.Generator().manual_seed(3), dtype=DT)
    swap = torch.cat([torch.arange(5, 10), torch.arange(5)])
    w_swapped = w[swap][:, swap]  # the same pairs, in the swapped stacking order
    for fn in (lambda a, p: L.dcl(a, p, 0.5, 0.1), lambda a, p: L.hcl(a, p, 0.5, 0.1), L.triplet_2view):
        assert fn(z1, z2).item() == pytest.approx(fn(z2, z1).item(), rel=1e-12)
    assert L.weighted_infonce_2view(z1, z2, w, 0.5, 0.1).item() == pytest.approx(
        L.weighted_infonce_2view(z2, z1, w_swapped, 0.5, 0.1).item(), rel=1e-12
    )


def test_dcl_floor_is_active_and_matches_closed_form():
    # identical views and tau_plus large: the debiased sum goes negative, so
    # g = N e^{-1/τ} and every view's loss is -log(e^{1/τ} / (e^{1/τ} + N e^{-1/τ}))
    z = unit(4, 3, seed=5)
    n = 6
    expected = -math.log(math.exp(2) / (math.exp(2) + n * math.exp(-2)))
    assert ref_two_view(z, z, 0.5, 0.9).item() == pytest.approx(expected, rel=1e-12)
    for got in (L.dcl(z, z, 0.5, 0.9), L.hcl(z, z, 0.5, 0.9, 1.0), L.nt_xent(z, z, 0.5, 0.9, torch.ones(8, 8))):
        assert got.item() == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("b", [2, 3, 7])
@pytest.mark.parametrize("tau_plus", [0.0, 0.2])
def test_triplet_2view_matches_reference(b, tau_plus):
    z1, z2 = unit(b, 5, seed=b), unit(b, 5, seed=b + 50)
    ref = ref_triplet_2view(z1, z2, tau_plus).item()
    assert L.triplet_2view(z1, z2, tau_plus).item() == pytest.approx(ref, rel=1e-10, abs=1e-12)


@pytest.mark.parametrize("b", [2, 5])
def test_wcl_weights_match_reference(b):
    zs = [unit(b, 4, seed=b + i) for i in range(4)]
    w = L.wcl_weights(*(z.clone().requires_grad_() for z in zs))
    assert w.shape == (2 * b, 2 * b) and not w.requires_grad
    assert torch.allclose(w, torch.tensor(ref_wcl_weights(*zs), dtype=DT), rtol=1e-12, atol=1e-12)
    assert ((w >= 1) & (w <= 2)).all()
    # swapping the encoders' roles maps w - 1 to 1 - (w - 1) on the negative pairs
    neg = L.two_view_negatives(b)
    w_swapped = L.wcl_weights(zs[2], zs[3], zs[0], zs[1])
    assert torch.allclose((w - 1)[neg], (2 - w_swapped)[neg], rtol=1e-12)
    # antipodal positives are the farthest pairs: the maximum is still over negatives only
    far = L.wcl_weights(zs[0], -zs[0], zs[2], -zs[2])
    assert torch.allclose(far, torch.tensor(ref_wcl_weights(zs[0], -zs[0], zs[2], -zs[2]), dtype=DT), rtol=1e-12)


def test_wcl_loss_composition_and_gradient_routing():
    zd_a, zd_p = unit(6, 4, seed=1).requires_grad_(), unit(6, 4, seed=2).requires_grad_()
    zb_a, zb_p = unit(6, 4, seed=3).requires_grad_(), unit(6, 4, seed=4).requires_grad_()
    total, l_wcl, l_tri = L.wcl_loss(zd_a, zd_p, zb_a, zb_p, 0.5, 0.1, return_parts=True)
    w_ref = ref_wcl_weights(zd_a.detach(), zd_p.detach(), zb_a.detach(), zb_p.detach())
    assert l_wcl.item() == pytest.approx(ref_two_view(zd_a.detach(), zd_p.detach(), 0.5, 0.1, w=w_ref).item(), rel=1e-9)
    assert l_tri.item() == pytest.approx(ref_triplet_2view(zb_a.detach(), zb_p.detach(), 0.1).item(), rel=1e-9)
    assert total.item() == pytest.approx(l_wcl.item() + l_tri.item())
    # w carries no gradient: E_d's gradient is the weighted loss's at a constant w, and no
    # gradient crosses between the encoders
    gd = torch.autograd.grad(l_wcl, [zb_a, zb_p], allow_unused=True, retain_graph=True)
    assert all(g is None for g in gd)
    gb = torch.autograd.grad(l_tri, [zd_a, zd_p], allow_unused=True, retain_graph=True)
    assert all(g is None for g in gb)
    w = L.wcl_weights(zd_a, zd_p, zb_a, zb_p)
    g_total = torch.autograd.grad(total, [zd_a, zd_p, zb_a, zb_p])
    g_parts = torch.autograd.grad(
        L.weighted_infonce_2view(zd_a, zd_p, w, 0.5, 0.1) + L.triplet_2view(zb_a, zb_p, 0.1), [zd_a, zd_p, zb_a, zb_p]
    )
    for a, b in zip(g_total, g_parts):
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_two_view_losses_finite_at_extreme_logits(dtype):
    # τ = 1e-3 puts |s| up to 1000 (e^{1000} overflows float64), duplicated and antipodal
    # views; the log-space evaluation must stay finite, with finite gradients
    base = near_identical(16, 8, seed=2, dtype=torch.float32)
    for z1, z2 in ((base[:8], base[8:]), (base[:8], -base[:8]), (base[:8], base[:8])):
        for fn in (
            lambda a, p: L.nt_xent(a, p, 1e-3),
            lambda a, p: L.dcl(a, p, 1e-3, 0.1),
            lambda a, p: L.hcl(a, p, 1e-3, 0.1, 4.0),
            lambda a, p: L.weighted_infonce_2view(a, p, torch.full((16, 16), 2.0), 1e-3, 0.3),
            lambda a, p: L.wcl_loss(a, p, p, a, 1e-3, 0.1),
        ):
            a, p = z1.to(dtype).requires_grad_(), z2.to(dtype).requires_grad_()
            out = fn(a, p)
            out.backward()
            assert torch.isfinite(out) and torch.isfinite(a.grad.float()).all() and torch.isfinite(p.grad.float()).all()


def test_pair_view_losses_reject_bad_input():
    a = unit(4, 3, seed=0)
    with pytest.raises(ValueError):
        L.triplet(a[:1], a[:1])
    with pytest.raises(ValueError):
        L.triplet(a, a, a[:0])
    with pytest.raises(ValueError):
        L.nt_xent(a, a[:3])
    with pytest.raises(ValueError):
        L.nt_xent(a[:1], a[:1])  # B = 1 has no negative
    with pytest.raises(ValueError):
        L.dcl(a, a, tau_plus=1.0)
    with pytest.raises(ValueError):
        L.weighted_infonce_2view(a, a, torch.ones(4, 4))  # must be [2B, 2B]
    with pytest.raises(ValueError):
        L.triplet_2view(a[:1], a[:1])


W6 = 1 + torch.rand(6, 6, generator=torch.Generator().manual_seed(2), dtype=DT)


GRADCHECK = {
    "triplet": lambda z: L.triplet(z[:3], z[3:6]),
    "triplet_debiased": lambda z: L.triplet(z[:3], z[3:6], tau_plus=0.2),
    "triplet_pool": lambda z: L.triplet(z[:3], z[3:6], z[4:], 0.2),
    "nt_xent": lambda z: L.nt_xent(z[:3], z[3:6], 0.5),
    "weighted_infonce_2view": lambda z: L.weighted_infonce_2view(z[:3], z[3:6], W6, 0.5, 0.0),
    "weighted_infonce_2view_debiased": lambda z: L.weighted_infonce_2view(z[:3], z[3:6], W6, 0.5, 0.1),
    "dcl": lambda z: L.dcl(z[:3], z[3:6], 0.5, 0.1),
    "hcl": lambda z: L.hcl(z[:3], z[3:6], 0.5, 0.1, 1.0),
    "triplet_2view": lambda z: L.triplet_2view(z[:3], z[3:6], 0.2),
    # w is detached by design (it depends on every view of both encoders), so wcl_loss's
    # gradient is checked against its parts' in test_wcl_loss_composition_and_gradient_routing
}


@pytest.mark.parametrize("name", list(GRADCHECK))
def test_gradcheck(name):
    assert torch.autograd.gradcheck(GRADCHECK[name], (gc_inputs(),), eps=1e-6, atol=1e-5)


STABILITY = {
    "triplet": lambda z, y, b: L.triplet(z[:32], z[32:], tau_plus=0.1),
    "nt_xent": lambda z, y, b: L.nt_xent(z[:32], z[32:], 0.05),
    "weighted_infonce_2view": lambda z, y, b: L.weighted_infonce_2view(z[:32], z[32:], 1 + (y[:, None] == y).float(),
                                                                       0.05, 0.1),
    "dcl": lambda z, y, b: L.dcl(z[:32], z[32:], 0.05, 0.1),
    "hcl": lambda z, y, b: L.hcl(z[:32], z[32:], 0.05, 0.1, 1.0),
    "triplet_2view": lambda z, y, b: L.triplet_2view(z[:32], z[32:], 0.1),
    "wcl_loss": lambda z, y, b: L.wcl_loss(z[:32], z[32:], z[32:], z[:32], 0.05, 0.1),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", list(STABILITY))
def test_stable_at_low_temperature_with_near_identical_rows(name, dtype):
    check_stable_at_low_temperature(STABILITY[name], name, dtype)
