"""Tests of debias.losses against slow references written straight from the papers' formulas.

References loop over anchors and pairs in float64 Python; the library must agree with them
on random batches of varied sizes and label layouts, keep the stated identities, pass
gradcheck, and stay finite in float32 / bfloat16 at tau = 0.05 with near-identical rows.
"""

from __future__ import annotations

import math

import pytest
import torch

from debias import losses as L

DT = torch.float64

# label layouts: singleton classes, all-same class, all-singletons, mixed
LAYOUTS = {
    "mixed": [0, 0, 1, 1, 1, 2, 3, 3, 0, 1, 2, 2],
    "singletons_mixed": [0, 1, 1, 2, 3, 3, 3, 4],
    "all_same": [5, 5, 5, 5, 5, 5],
    "two_big": [0, 1] * 7,
    "one_pair": [0, 0, 1, 2, 3],
    "all_singletons": [0, 1, 2, 3, 4],
}


def unit(b: int, d: int, seed: int, dtype: torch.dtype = DT) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.nn.functional.normalize(torch.randn(b, d, generator=g, dtype=DT), dim=1).to(dtype)


def near_identical(b: int, d: int, seed: int, dtype: torch.dtype, noise: float = 1e-3) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(1, d, generator=g)
    z = base + noise * torch.randn(b, d, generator=g)
    return torch.nn.functional.normalize(z, dim=1).to(dtype)


def lse(xs: list[float]) -> float:
    m = max(xs)
    if m == -math.inf:
        return -math.inf
    return m + math.log(sum(math.exp(x - m) for x in xs))


def sim(z: torch.Tensor, i: int, j: int, tau: float) -> float:
    return float(z[i].double() @ z[j].double()) / tau


def mean_or_none(per_anchor: list[float]) -> float | None:
    return sum(per_anchor) / len(per_anchor) if per_anchor else None


# --------------------------------------------------------------------------- references


def ref_supcon(z, y, tau):
    b, out = len(y), []
    for i in range(b):
        pos = [j for j in range(b) if j != i and y[j] == y[i]]
        if not pos:
            continue
        den = lse([sim(z, i, a, tau) for a in range(b) if a != i])
        out.append(sum(-(sim(z, i, p, tau) - den) for p in pos) / len(pos))
    return mean_or_none(out)


def ref_eps_supcon(z, y, eps, tau):
    b, out = len(y), []
    for i in range(b):
        pos = [j for j in range(b) if j != i and y[j] == y[i]]
        neg = [j for j in range(b) if y[j] != y[i]]
        if not pos:
            continue
        den = lse([sim(z, i, p, tau) - eps for p in pos] + [sim(z, i, n, tau) for n in neg])
        out.append(sum(-(sim(z, i, p, tau) - den) for p in pos) / len(pos))
    return mean_or_none(out)


def ref_eps_supinfonce(z, y, eps, tau):
    b, out = len(y), []
    for i in range(b):
        pos = [j for j in range(b) if j != i and y[j] == y[i]]
        neg = [j for j in range(b) if y[j] != y[i]]
        if not pos:
            continue
        terms = []
        for p in pos:
            den = lse([sim(z, i, p, tau) - eps] + [sim(z, i, n, tau) for n in neg])
            terms.append(-(sim(z, i, p, tau) - den))
        out.append(sum(terms) / len(terms))
    return mean_or_none(out)


def ref_fairkl_moments(z, y, w_same):
    """Moments over unordered pairs; w_same[i][j] = prob. of same bias (0/1 for hard labels)."""
    b = len(y)
    acc = {name: [] for name in L.FAIRKL_SETS}
    for i in range(b):
        for j in range(i + 1, b):
            d = float(((z[i].double() - z[j].double()) ** 2).sum())
            ws = w_same[i][j]
            side = "pos" if y[i] == y[j] else "neg"
            acc[f"{side}_aligned"].append((ws, d))
            acc[f"{side}_conflicting"].append((1 - ws, d))
    out = {}
    for name, pairs in acc.items():
        n = sum(w for w, _ in pairs)
        mu = sum(w * d for w, d in pairs) / n if n > 0 else 0.0
        var = sum(w * (d - mu) ** 2 for w, d in pairs) / n if n > 0 else 0.0
        out[name] = (n, mu, var)
    return out


def ref_fairkl(z, y, w_same, variant, floor=1e-6):
    m = ref_fairkl_moments(z, y, w_same)
    total = 0.0
    for side in ("pos", "neg"):
        na, mua, va = m[f"{side}_aligned"]
        nc, muc, vc = m[f"{side}_conflicting"]
        if na < 2 or nc < 2:
            continue
        if variant == "mean":
            total += (mua - muc) ** 2
        else:
            va, vc = max(va, floor), max(vc, floor)
            total += 0.5 * ((va + (mua - muc) ** 2) / vc - math.log(va / vc) - 1)
    return total


def ref_fairkl_released(z, y, w_same, tau, kld, include_self):
    b = len(y)
    mats = {name: [[0.0] * b for _ in range(b)] for name in L.FAIRKL_SETS}
    masks = {name: [[0.0] * b for _ in range(b)] for name in L.FAIRKL_SETS}
    for i in range(b):
        for j in range(b):
            if i == j and not include_self:
                continue
            s = sim(z, i, j, tau)
            side = "pos" if y[i] == y[j] else "neg"
            for name, w in ((f"{side}_aligned", w_same[i][j]), (f"{side}_conflicting", 1 - w_same[i][j])):
                masks[name][i][j] = w
                mats[name][i][j] = s * w
    mu, sd = {}, {}
    for name in L.FAIRKL_SETS:
        flat = [v for row in mats[name] for v in row]
        cnt = sum(v for row in masks[name] for v in row)
        mu[name] = sum(flat) / max(cnt, 1)
        mean = sum(flat) / len(flat)
        sd[name] = math.sqrt(sum((v - mean) ** 2 for v in flat) / (len(flat) - 1))
    pa, pc, na, nc = L.FAIRKL_SETS
    mu_loss = (mu[pc] - mu[pa]) ** 2 + (mu[na] - mu[nc]) ** 2
    sd_loss = (sd[pa] - sd[pc]) ** 2 + (sd[na] - sd[nc]) ** 2
    return mu_loss + kld * sd_loss - mu[pc] + mu[na]


def ref_released_contrastive(z, y, eps, tau, form, *, tau_factor=True, guard=1e-6, all_anchors=True):
    """The released EpsilonSupInfoNCE / EpsilonSupCon forward_out, one loop per anchor and pair (float64).

    logits l_ij = s_ij - max_j s_ij (self included); supinfonce: u_ip = e^-eps e^l_ip + sum_n e^l_in;
    supcon: u_i = sum_{p'} e^-eps e^l_ip' + sum_n e^l_in; log_prob_ip = l_ip - log(u + 1e-6);
    loss = -(tau / 0.07) mean_i [sum_p log_prob_ip / max(|P(i)|, 1)] over all anchors.
    The keyword flags switch one ingredient off (to show that each matters)."""
    b = len(y)
    omega = math.exp(-eps)
    per_anchor = []
    for i in range(b):
        row = [sim(z, i, j, tau) for j in range(b)]
        m = max(row)
        lg = [v - m for v in row]
        pos = [j for j in range(b) if j != i and y[j] == y[i]]
        neg = [j for j in range(b) if y[j] != y[i]]
        neg_sum = sum(math.exp(lg[n]) for n in neg)
        total = 0.0
        for p in pos:
            if form == "supinfonce":
                u = omega * math.exp(lg[p]) + neg_sum
            else:
                u = sum(omega * math.exp(lg[q]) for q in pos) + neg_sum
            total += lg[p] - math.log(u + guard)
        if pos or all_anchors:
            per_anchor.append(-total / max(len(pos), 1))
    factor = tau / 0.07 if tau_factor else 1.0
    return factor * sum(per_anchor) / len(per_anchor)


def ref_released_objective(z, y, bias, alpha, lam, eps, tau, form, *, alpha_twice=True, tau_factor=True,
                           include_self=True, linear=True):
    """main_infonce.py's criterion: alpha * (alpha * infonce) + lam * fairkl(z, y, b, 1.0, kld=1); alpha * infonce
    when lam == 0.  ``linear=False`` drops fairkl's two linear terms (to show that they matter)."""
    con = ref_released_contrastive(z, y, eps, tau, form, tau_factor=tau_factor)
    if lam == 0:
        return alpha * con
    same = hard_same(bias)
    reg = ref_fairkl_released(z, y, same, 1.0, 1.0, include_self)
    if not linear:
        reg -= ref_fairkl_released_linear(z, y, same, include_self)
    return (alpha * alpha if alpha_twice else alpha) * con + lam * reg


def ref_fairkl_released_linear(z, y, w_same, include_self):
    """The two linear terms of the released fairkl, ``- mu(pos, conflicting) + mu(neg, aligned)``."""
    b = len(y)
    sums = {"pc": 0.0, "na": 0.0}
    counts = {"pc": 0.0, "na": 0.0}
    for i in range(b):
        for j in range(b):
            if i == j and not include_self:
                continue
            s = sim(z, i, j, 1.0)
            if y[i] == y[j]:
                sums["pc"] += s * (1 - w_same[i][j])
                counts["pc"] += 1 - w_same[i][j]
            else:
                sums["na"] += s * w_same[i][j]
                counts["na"] += w_same[i][j]
    return -sums["pc"] / max(counts["pc"], 1) + sums["na"] / max(counts["na"], 1)


def ref_cnc(anchors, pos, neg, tau):
    out = []
    for a in anchors:
        sp = [float(a @ p) / tau for p in pos]
        sn = [float(a @ n) / tau for n in neg]
        den = lse(sp + sn)
        out.append(sum(-(x - den) for x in sp) / len(sp))
    return sum(out) / len(out)


def ref_triplet(a, p, tau_plus, negatives=None):
    b, out = a.shape[0], []
    for i in range(b):
        dp = float(((a[i] - p[i]) ** 2).sum())
        if negatives is None:
            dn = sum(float(((a[i] - a[j]) ** 2).sum()) for j in range(b) if j != i) / (b - 1)
        else:
            dn = sum(float(((a[i] - n) ** 2).sum()) for n in negatives) / len(negatives)
        if tau_plus > 0:
            dn = (dn - tau_plus * dp) / (1 - tau_plus)
        out.append(dp - dn)
    return sum(out) / b


def ref_two_view(z1, z2, tau, tau_plus, w=None, beta=None):
    """Two-view NT-Xent / DCL / WCL / HCL straight from the formulas, looping over views and pairs.

    Torch float64 scalars, so autograd through the loops gives the reference gradient.
    View k of Z = [z1; z2] has positive k +- B and the other N = 2B - 2 views as negatives;
    w[k][j] weights negative j (WCL); beta gives HCL's importance weights e^{beta s} / mean.
    """
    zs = torch.cat([z1, z2])
    m = zs.shape[0]
    b, n = m // 2, m - 2
    out = []
    for k in range(m):
        p = (k + b) % m
        e_pos = torch.exp(zs[k] @ zs[p] / tau)
        negs = [j for j in range(m) if j not in (k, p)]
        e_neg = [torch.exp(zs[k] @ zs[j] / tau) for j in negs]
        if beta is not None:
            imp = [torch.exp(beta * (zs[k] @ zs[j]) / tau) for j in negs]
            mean_imp = sum(imp) / n
            g = sum(v / mean_imp * e for v, e in zip(imp, e_neg))
        else:
            g = sum((1.0 if w is None else float(w[k][j])) * e for j, e in zip(negs, e_neg))
        if tau_plus > 0:
            g = torch.clamp_min((g - tau_plus * n * e_pos) / (1 - tau_plus), n * math.exp(-1 / tau))
        out.append(-torch.log(e_pos / (e_pos + g)))
    return sum(out) / m


def ref_triplet_2view(z1, z2, tau_plus):
    zs = torch.cat([z1, z2])
    m = zs.shape[0]
    out = []
    for k in range(m):
        p = (k + m // 2) % m
        dp = ((zs[k] - zs[p]) ** 2).sum()
        negs = [j for j in range(m) if j not in (k, p)]
        dn = sum(((zs[k] - zs[j]) ** 2).sum() for j in negs) / len(negs)
        if tau_plus > 0:
            dn = (dn - tau_plus * dp) / (1 - tau_plus)
        out.append(dp - dn)
    return sum(out) / m


def ref_wcl_weights(zd1, zd2, zb1, zb2):
    """w_kj = 1 + Dd~ / (Dd~ + Db~) over the (view, negative view) pairs; D~ = D / max over those pairs."""
    zd, zb = torch.cat([zd1, zd2]).tolist(), torch.cat([zb1, zb2]).tolist()
    m = len(zd)
    pairs = [(k, j) for k in range(m) for j in range(m) if j not in (k, (k + m // 2) % m)]
    dd = {kj: math.dist(zd[kj[0]], zd[kj[1]]) for kj in pairs}
    db = {kj: math.dist(zb[kj[0]], zb[kj[1]]) for kj in pairs}
    md, mb = max(dd.values()), max(db.values())
    w = [[1.0] * m for _ in range(m)]
    for kj in pairs:
        w[kj[0]][kj[1]] = 1 + (dd[kj] / md) / (dd[kj] / md + db[kj] / mb)
    return w


def ref_gce(logits, y, q):
    out = []
    for row, label in zip(logits.tolist(), y.tolist()):
        p = math.exp(row[label]) / sum(math.exp(v) for v in row)
        out.append((1 - p**q) / q)
    return sum(out) / len(out)


def hard_same(bias):
    return [[1.0 if bias[i] == bias[j] else 0.0 for j in range(len(bias))] for i in range(len(bias))]


def soft_same(p):
    return (p.double() @ p.double().T).tolist()


# --------------------------------------------------------------------------- SupCon family


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
    g = torch.Generator().manual_seed(seed)
    b = int(torch.randint(2, 26, (1,), generator=g))
    k = int(torch.randint(1, 6, (1,), generator=g))
    y = torch.randint(0, k, (b,), generator=g)
    bias = torch.randint(0, 2, (b,), generator=g)
    eps = float(torch.rand(1, generator=g)) * 2
    tau = [0.05, 0.1, 0.3, 1.0][seed % 4]
    z = unit(b, int(torch.randint(2, 9, (1,), generator=g)), seed=seed)
    yl = y.tolist()
    for got, ref in (
        (L.supcon(z, y, tau), ref_supcon(z, yl, tau)),
        (L.eps_supcon(z, y, eps, tau), ref_eps_supcon(z, yl, eps, tau)),
        (L.eps_supinfonce(z, y, eps, tau), ref_eps_supinfonce(z, yl, eps, tau)),
    ):
        assert got.item() == pytest.approx(0.0 if ref is None else ref, rel=1e-9, abs=1e-10)
    for variant in ("kl", "mean"):
        ref = ref_fairkl(z, yl, hard_same(bias.tolist()), variant)
        assert L.fairkl(z, y, bias, variant).item() == pytest.approx(ref, rel=1e-8, abs=1e-10)


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
        lambda z, y, b: L.fairkl(z, y, b),
        lambda z, y, b: L.fairkl(z, y, b, "mean"),
        lambda z, y, b: L.fairkl(z, y, b, "released"),
    ],
    ids=["supcon", "eps_supcon", "eps_supinfonce", "fairkl_kl", "fairkl_mean", "fairkl_released"],
)
def test_invariant_to_batch_permutation(fn):
    y = torch.tensor(LAYOUTS["mixed"])
    b = torch.tensor([0, 1, 0, 0, 1, 1, 0, 1, 1, 0, 0, 1])
    z = unit(len(y), 5, seed=21)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    assert fn(z[perm], y[perm], b[perm]).item() == pytest.approx(fn(z, y, b).item(), rel=1e-10)


# --------------------------------------------------------------------------- FairKL

FAIRKL_CASES = {
    "mixed": (LAYOUTS["mixed"], [0, 1, 0, 0, 1, 1, 0, 1, 1, 0, 0, 1]),
    "three_bias": ([0, 0, 0, 1, 1, 1, 2, 2, 2, 0], [0, 1, 2, 0, 1, 2, 0, 1, 2, 1]),
    "no_pos_conflict": ([0, 0, 1, 1, 2, 2], [0, 0, 1, 1, 0, 1]),  # 1 positive-conflicting pair
    "all_aligned": ([0, 0, 1, 1], [0, 0, 0, 0]),  # no conflicting pair at all
    "all_same_class": ([3] * 7, [0, 0, 0, 1, 1, 1, 1]),
}


@pytest.mark.parametrize("case", list(FAIRKL_CASES))
@pytest.mark.parametrize("variant", ["kl", "mean"])
def test_fairkl_matches_reference(case, variant):
    y, bias = FAIRKL_CASES[case]
    z = unit(len(y), 4, seed=len(y) * 3)
    ref = ref_fairkl(z, y, hard_same(bias), variant)
    got = L.fairkl(z, torch.tensor(y), torch.tensor(bias), variant)
    assert got.item() == pytest.approx(ref, rel=1e-9, abs=1e-12)


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


# --------------------------------------------------------------------------- CNC


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


# --------------------------------------------------------------------------- difficulty-based


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


# --------------------------------------------------------------------------- LfF and GroupDRO


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
    with pytest.raises(ValueError):
        L.supcon(a, torch.tensor([0, 1]), 0.1)
    with pytest.raises(ValueError):
        L.cnc_contrastive(a[0], a[:0], a[1:], 0.1)


# --------------------------------------------------------------------------- gradients


def _gc_inputs():
    g = torch.Generator().manual_seed(0)
    z = torch.nn.functional.normalize(torch.randn(7, 3, generator=g, dtype=DT), dim=1)
    return z.requires_grad_()


RELEASED_CASES = {
    "mixed": (LAYOUTS["mixed"], [0, 1, 0, 0, 1, 1, 0, 1, 1, 0, 0, 1]),
    "three_bias": ([0, 0, 0, 1, 1, 1, 2, 2, 2, 0], [0, 1, 2, 0, 1, 2, 0, 1, 2, 1]),
    "singletons": (LAYOUTS["singletons_mixed"], [0, 1, 0, 1, 0, 1, 1, 0]),  # class 0 and 2 anchors: no positive
    "all_same": (LAYOUTS["all_same"], [0, 0, 1, 1, 0, 1]),  # no negative at all
}


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


Y7 = torch.tensor([0, 0, 1, 1, 1, 2, 0])
B7 = torch.tensor([0, 1, 0, 1, 1, 0, 0])
P7 = torch.softmax(torch.randn(7, 2, generator=torch.Generator().manual_seed(1), dtype=DT), 1)
Q3 = torch.tensor([0.5, 0.3, 0.2], dtype=DT)
W6 = 1 + torch.rand(6, 6, generator=torch.Generator().manual_seed(2), dtype=DT)

GRADCHECK = {
    "supcon": lambda z: L.supcon(z, Y7, 0.2),
    "eps_supcon": lambda z: L.eps_supcon(z, Y7, 0.5, 0.2),
    "eps_supinfonce": lambda z: L.eps_supinfonce(z, Y7, 0.5, 0.2),
    "fairkl_kl": lambda z: L.fairkl(z, Y7, B7),
    "fairkl_mean": lambda z: L.fairkl(z, Y7, B7, "mean"),
    "fairkl_soft": lambda z: L.fairkl(z, Y7, P7),
    "fairkl_released": lambda z: L.fairkl(z, Y7, B7, "released"),
    "released_supinfonce": lambda z: L.released_contrastive(z, Y7, 0.5, 0.2),
    "released_supcon": lambda z: L.released_contrastive(z, Y7, 0.5, 0.2, "supcon"),
    "cnc": lambda z: L.cnc_contrastive(z[:2], z[2:4], z[4:], 0.1),
    "cnc_two_sided": lambda z: L.cnc_two_sided(z[:2], z[2:4], z[4:6], z[5:], 0.1),
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
    "gce": lambda z: L.generalized_cross_entropy(z, Y7 % 3, 0.7),
    "gce_q1": lambda z: L.generalized_cross_entropy(z, Y7 % 3, 1.0),
    "group_dro_loss": lambda z: L.group_dro_loss(z[:, 0] * z[:, 1], Y7, Q3),
}


@pytest.mark.parametrize("name", list(GRADCHECK))
def test_gradcheck(name):
    assert torch.autograd.gradcheck(GRADCHECK[name], (_gc_inputs(),), eps=1e-6, atol=1e-5)


# --------------------------------------------------------------------------- stability

STABILITY = {
    "supcon": lambda z, y, b: L.supcon(z, y, 0.05),
    "eps_supcon": lambda z, y, b: L.eps_supcon(z, y, 0.5, 0.05),
    "eps_supinfonce": lambda z, y, b: L.eps_supinfonce(z, y, 0.5, 0.05),
    "fairkl_kl": lambda z, y, b: L.fairkl(z, y, b),
    "fairkl_mean": lambda z, y, b: L.fairkl(z, y, b, "mean"),
    "fairkl_released": lambda z, y, b: L.fairkl(z, y, b, "released", released_temperature=0.05),
    "released_supinfonce": lambda z, y, b: L.released_contrastive(z, y, 0.5, 0.05),
    "released_supcon": lambda z, y, b: L.released_contrastive(z, y, 0.5, 0.05, "supcon"),
    "cnc": lambda z, y, b: L.cnc_two_sided(z[:8], z[8:16], z[16:24], z[24:32], 0.05),
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
    z = near_identical(64, 16, seed=0, dtype=dtype).requires_grad_()
    y = torch.arange(64) % 4
    b = torch.arange(64) // 32
    out = STABILITY[name](z, y, b)
    out.backward()
    assert torch.isfinite(out), name
    assert z.grad is not None and torch.isfinite(z.grad.float()).all(), name
    # and far apart: exactly-duplicated rows and antipodal rows
    z2 = torch.cat([z.detach()[:32], -z.detach()[:32]]).requires_grad_()
    out2 = STABILITY[name](z2, y, b)
    out2.backward()
    assert torch.isfinite(out2) and torch.isfinite(z2.grad.float()).all(), name


def test_low_precision_agrees_with_float64():
    y = torch.tensor(LAYOUTS["mixed"])
    z = unit(len(y), 8, seed=4)
    ref = L.supcon(z, y, 0.05).item()
    assert L.supcon(z.float(), y, 0.05).item() == pytest.approx(ref, rel=1e-5)
    assert L.supcon(z.bfloat16(), y, 0.05).item() == pytest.approx(ref, rel=5e-2)
    assert L.supcon(z.bfloat16(), y, 0.05).dtype == torch.float32
