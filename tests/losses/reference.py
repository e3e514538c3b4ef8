"""Slow float64 references written straight from the papers' formulas, and the inputs the loss tests share.

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


def ref_cnc(anchors, pos, neg, tau, eps=0.0):
    """CNC Eq. 15 with eps-SupCon's margin (FairKL Eq. 5 without its additive eps), term by term:
    -(1/P) sum_p log( e^{s_ap} / (sum_p' e^{s_ap' - eps} + sum_n e^{s_an}) )."""
    out = []
    for a in anchors:
        sp = [float(a @ p) / tau for p in pos]
        sn = [float(a @ n) / tau for n in neg]
        den = math.log(sum(math.exp(x - eps) for x in sp) + sum(math.exp(x) for x in sn))
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


def random_batch(seed: int):
    """A random labelled batch ``(z, y, bias, eps, tau)``: 2..25 rows, 1..5 classes, two bias values."""
    g = torch.Generator().manual_seed(seed)
    b = int(torch.randint(2, 26, (1,), generator=g))
    k = int(torch.randint(1, 6, (1,), generator=g))
    y = torch.randint(0, k, (b,), generator=g)
    bias = torch.randint(0, 2, (b,), generator=g)
    eps = float(torch.rand(1, generator=g)) * 2
    tau = [0.05, 0.1, 0.3, 1.0][seed % 4]
    z = unit(b, int(torch.randint(2, 9, (1,), generator=g)), seed=seed)
    return z, y, bias, eps, tau


def gc_inputs():
    g = torch.Generator().manual_seed(0)
    z = torch.nn.functional.normalize(torch.randn(7, 3, generator=g, dtype=DT), dim=1)
    return z.requires_grad_()


RELEASED_CASES = {
    "mixed": (LAYOUTS["mixed"], [0, 1, 0, 0, 1, 1, 0, 1, 1, 0, 0, 1]),
    "three_bias": ([0, 0, 0, 1, 1, 1, 2, 2, 2, 0], [0, 1, 2, 0, 1, 2, 0, 1, 2, 1]),
    "singletons": (LAYOUTS["singletons_mixed"], [0, 1, 0, 1, 0, 1, 1, 0]),  # class 0 and 2 anchors: no positive
    "all_same": (LAYOUTS["all_same"], [0, 0, 1, 1, 0, 1]),  # no negative at all
}


Y7 = torch.tensor([0, 0, 1, 1, 1, 2, 0])


def check_permutation_invariant(fn) -> None:
    """``fn(z, y, b)`` is unchanged when the batch is permuted."""
    y = torch.tensor(LAYOUTS["mixed"])
    b = torch.tensor([0, 1, 0, 0, 1, 1, 0, 1, 1, 0, 0, 1])
    z = unit(len(y), 5, seed=21)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    assert fn(z[perm], y[perm], b[perm]).item() == pytest.approx(fn(z, y, b).item(), rel=1e-10)


def check_stable_at_low_temperature(fn, name: str, dtype: torch.dtype) -> None:
    """``fn(z, y, b)`` and its gradient are finite at near-identical, duplicated and antipodal rows."""
    z = near_identical(64, 16, seed=0, dtype=dtype).requires_grad_()
    y = torch.arange(64) % 4
    b = torch.arange(64) // 32
    out = fn(z, y, b)
    out.backward()
    assert torch.isfinite(out), name
    assert z.grad is not None and torch.isfinite(z.grad.float()).all(), name
    # and far apart: exactly-duplicated rows and antipodal rows
    z2 = torch.cat([z.detach()[:32], -z.detach()[:32]]).requires_grad_()
    out2 = fn(z2, y, b)
    out2.backward()
    assert torch.isfinite(out2) and torch.isfinite(z2.grad.float()).all(), name
