"""Invariants of the CNC two-sided batch sampler over thousands of draws."""

from __future__ import annotations

import pytest
import torch

from debias.training.methods.cnc.sampling import CNCBatch, CNCBatchSampler


def make_data(n: int = 3000, classes: int = 4, p_major: float = 0.9, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, classes, (n,), generator=g)
    other = (y + torch.randint(1, classes, (n,), generator=g)) % classes
    inferred = torch.where(torch.rand(n, generator=g) < p_major, y, other)
    return y, inferred


def rows_distinct(idx: torch.Tensor) -> torch.Tensor:
    """Per row: True when all entries differ."""
    s = idx.sort(dim=1).values
    return (s[:, 1:] != s[:, :-1]).all(dim=1)


def check_invariants(b: CNCBatch, y: torch.Tensor, g: torch.Tensor) -> None:
    c = y[b.anchors[:, :1]]  # [k, 1] class of the seed anchor
    assert (y[b.anchors] == c).all(), "anchors share the seed's class"
    assert (g[b.anchors] == y[b.anchors]).all(), "anchors' inferred label == class"
    assert (y[b.positives] == c).all(), "positives share the anchor's class"
    assert (g[b.positives] != c).all(), "positives do not share the anchor's inferred label"
    assert (y[b.negatives] != c).all(), "negatives differ in class"
    assert (g[b.negatives] == c).all(), "negatives share the anchor's inferred label"
    if b.negatives2 is not None:
        p1 = b.positives[:, :1]
        assert (y[b.negatives2] != y[p1]).all(), "second-side negatives differ from p1's class"
        assert (g[b.negatives2] == g[p1]).all(), "second-side negatives share p1's inferred label"


def test_invariants_over_thousands_of_draws():
    y, g = make_data()
    s = CNCBatchSampler(y, g, num_anchors=8, num_negatives=6, seed=1)
    many = s.sample_many(3000)
    assert many.anchors.shape == (3000, 8) and many.negatives2.shape == (3000, 6)
    check_invariants(many, y, g)
    singles = [s.sample() for _ in range(200)]
    stacked = CNCBatch(*(torch.stack([getattr(b, f) for b in singles]) for f in
                         ("anchors", "positives", "negatives", "negatives2")))
    check_invariants(stacked, y, g)
    # pools are large: no draw with replacement, all groups distinct within a batch
    rep = s.report()
    assert all(v == 0 for c in rep["classes"].values() for v in c["draws_with_replacement"].values())
    for t in (many.anchors, many.positives, many.negatives, many.negatives2):
        assert rows_distinct(t).all()
    # every class seeds batches, roughly in proportion to its anchor pool
    counts = torch.bincount(y[many.anchors[:, 0]], minlength=4).float() / 3000
    pools = torch.tensor([rep["classes"][c]["anchor_pool"] for c in range(4)]).float()
    assert torch.allclose(counts, pools / pools.sum(), atol=0.05)
    assert rep["batches_drawn"] == 3200


def test_one_sided_has_no_second_negatives():
    y, g = make_data(n=500)
    s = CNCBatchSampler(y, g, 4, 4, two_sided=False)
    b = s.sample()
    assert b.negatives2 is None and b.anchors.shape == (4,) and b.negatives.shape == (4,)
    assert s.sample_many(5).unbind()[0].negatives2 is None


def test_same_seed_same_batches_different_seed_different():
    y, g = make_data(n=800)
    a = CNCBatchSampler(y, g, 4, 3, seed=7).sample_many(50)
    b = CNCBatchSampler(y, g, 4, 3, seed=7).sample_many(50)
    c = CNCBatchSampler(y, g, 4, 3, seed=8).sample_many(50)
    for f in ("anchors", "positives", "negatives", "negatives2"):
        assert torch.equal(getattr(a, f), getattr(b, f))
    assert not torch.equal(a.positives, c.positives)


def test_state_dict_resume_gives_identical_continuation_mid_epoch():
    y, g = make_data(n=800)
    ref = CNCBatchSampler(y, g, 4, 3, batches_per_epoch=7, seed=3)
    it = iter(ref)
    for _ in range(3):
        next(it)
    state = ref.state_dict()
    rest = list(it)  # 4 more batches end the epoch
    next_epoch = list(ref)
    assert len(rest) == 4 and len(next_epoch) == 7

    resumed = CNCBatchSampler(y, g, 4, 3, batches_per_epoch=7, seed=999)
    resumed.load_state_dict(state)
    rest2 = list(resumed)
    next_epoch2 = list(resumed)
    for x1, x2 in zip(rest + next_epoch, rest2 + next_epoch2, strict=True):
        assert torch.equal(x1.anchors, x2.anchors) and torch.equal(x1.negatives2, x2.negatives2)
        assert torch.equal(x1.positives, x2.positives) and torch.equal(x1.negatives, x2.negatives)
    assert resumed.report() == ref.report()


def test_state_from_other_data_is_rejected():
    y, g = make_data(n=800)
    s = CNCBatchSampler(y, g, 4, 3)
    other = CNCBatchSampler(y, g, 5, 3)
    with pytest.raises(ValueError, match="other data or settings"):
        other.load_state_dict(s.state_dict())


def test_an_epoch_is_one_batch_per_anchor_as_algorithm_3():
    """CNC Alg. 3: every anchor (inferred-majority point) seeds exactly one two-sided batch per epoch, in a new
    order each epoch; anchor_fraction (the released code's target_sample_ratio) seeds from a fresh random subset."""
    y, g = make_data(n=1000)
    s = CNCBatchSampler(y, g, 8, 4)
    anchors = torch.nonzero(g == y).flatten()
    assert len(s) == len(anchors)
    first = torch.stack([batch.anchors[0] for batch in s])
    assert torch.equal(first.sort().values, anchors)  # each anchor seeds one batch
    second = s.sample_many(len(s)).anchors[:, 0]  # the next epoch, drawn at once
    assert torch.equal(second.sort().values, anchors) and not torch.equal(second, first)
    part = CNCBatchSampler(y, g, 8, 4, anchor_fraction=0.25)
    assert len(part) == round(0.25 * len(anchors))
    seeds = [torch.stack([batch.anchors[0] for batch in part]) for _ in range(2)]
    assert all(len(set(epoch.tolist())) == len(part) for epoch in seeds)  # distinct within an epoch
    assert set(seeds[0].tolist()) != set(seeds[1].tolist())  # a fresh subset each epoch
    assert len(CNCBatchSampler(y, g, 8, 4, batches_per_epoch=3)) == 3
    tiny_y = torch.tensor([0, 0, 1, 1])
    tiny_g = torch.tensor([0, 1, 1, 0])
    assert len(CNCBatchSampler(tiny_y, tiny_g, 8, 4)) == 2  # two anchors (points 0 and 2)
    assert len(CNCBatchSampler(tiny_y, tiny_g, 8, 4, anchor_fraction=0.01)) == 1  # at least one batch


def test_replacement_only_when_pool_too_small():
    # class 0: 3 positives (< M = 5); class 1's negatives (y = 0, g = 1): 3 (< N = 4);
    # every other pool is large enough
    y = torch.tensor([0] * 40 + [1] * 40)
    g = torch.tensor([0] * 37 + [1] * 3 + [1] * 30 + [0] * 10)
    s = CNCBatchSampler(y, g, num_anchors=5, num_negatives=4, seed=0)
    b = s.sample_many(400)
    check_invariants(b, y, g)
    c0 = y[b.anchors[:, 0]] == 0
    rep = s.report()
    r0, r1 = rep["classes"][0]["draws_with_replacement"], rep["classes"][1]["draws_with_replacement"]
    n0, n1 = int(c0.sum()), int((~c0).sum())
    assert r0 == {"anchors": 0, "positives": n0, "negatives": 0, "negatives2": 0}
    assert r1 == {"anchors": 0, "positives": 0, "negatives": n1, "negatives2": 0}
    assert rows_distinct(b.positives[~c0]).all() and rows_distinct(b.negatives[c0]).all()
    assert rows_distinct(b.anchors).all()  # anchor pools (37, 30) >= M: seed never repeated
    assert not rows_distinct(b.positives[c0]).all()  # 3 points for 5 slots
    assert any("positive pool 3 < M = 5" in msg for msg in rep["short_pools"])


def test_small_anchor_pool_draws_with_replacement():
    y = torch.tensor([0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1])
    g = torch.tensor([0, 0, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0])  # class 0 has 2 anchors < M = 3
    s = CNCBatchSampler(y, g, num_anchors=3, num_negatives=2, seed=0)
    b = s.sample_many(200)
    check_invariants(b, y, g)
    rep = s.report()
    c0 = int((y[b.anchors[:, 0]] == 0).sum())
    assert rep["classes"][0]["draws_with_replacement"]["anchors"] == c0 > 0
    assert rep["classes"][1]["draws_with_replacement"]["anchors"] == 0


def test_empty_negative_pool_falls_back_and_is_reported():
    # nobody outside class 0 is inferred as 0: side-1 negatives of class 0 fall back
    y = torch.tensor([0] * 10 + [1] * 10 + [2] * 10)
    g = torch.tensor([0] * 8 + [1, 2] + [1] * 8 + [2, 2] + [2] * 9 + [1])
    s = CNCBatchSampler(y, g, 3, 2, seed=0)
    b = s.sample_many(300)
    c0 = y[b.anchors[:, 0]] == 0
    assert (y[b.negatives[c0]] != 0).all()
    rep = s.report()
    assert rep["classes"][0]["fallback_draws"]["negatives"] == int(c0.sum()) > 0
    assert any("class 0: no negatives with y != 0 and inferred == 0" in m for m in rep["empty_pools"])
    rest = CNCBatch(b.anchors[~c0], b.positives[~c0], b.negatives[~c0], b.negatives2[~c0])
    check_invariants(rest, y, g)


def test_class_without_positives_raises_clear_error_or_is_skipped():
    y = torch.tensor([0, 0, 0, 1, 1, 1, 3, 3, 3])
    g = torch.tensor([0, 0, 1, 1, 1, 0, 3, 3, 3])  # class 3: every point inferred as 3
    with pytest.raises(ValueError, match="class 3 has no training points whose inferred label differs from 3"):
        CNCBatchSampler(y, g, 2, 2)
    s = CNCBatchSampler(y, g, 2, 2, skip_empty_classes=True)
    b = s.sample_many(300)
    assert (y[b.anchors[:, 0]] != 3).all()
    rep = s.report()
    assert rep["skipped_classes"] == [3]
    assert "check groups.method or lower bias" in rep["classes"][3]["skipped"]


def test_bad_arguments():
    y, g = make_data(n=100)
    with pytest.raises(ValueError):
        CNCBatchSampler(y, g[:50], 2, 2)
    with pytest.raises(ValueError):
        CNCBatchSampler(y, g, 0, 2)
    with pytest.raises(ValueError):
        CNCBatchSampler(y.float(), g, 2, 2)
    with pytest.raises(ValueError):
        CNCBatchSampler(torch.zeros(10, dtype=torch.long), torch.zeros(10, dtype=torch.long), 2, 2)
