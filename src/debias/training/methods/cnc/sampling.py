"""Correct-N-Contrast two-sided contrastive batch sampler (CNC App. B.3, Algorithm 3).

Roles, with ``y`` the class and ``g`` the inferred label (ERM prediction or matched cluster):

* anchors: points with ``g == y`` (inferred majority), all of the seed anchor's class ``c``;
* positives: ``y == c`` and ``g != c`` (same class, inferred minority);
* negatives: ``y != c`` and ``g == c`` (other classes that look like the anchor);
* second side (``two_sided``): the first positive ``p_1`` (inferred label ``g_1``) becomes the
  anchor, the M anchors are its positives, and its own negatives satisfy
  ``y != c`` and ``g == g_1``.

One epoch is Alg. 3's loop "for each anchor": every point of the anchor pool of all eligible
classes seeds one batch, in a fresh random order each epoch; ``anchor_fraction`` < 1 (the
released code's ``target_sample_ratio``) keeps a fresh random subset of that many anchors per
epoch.  A batch holds its seed anchor, M - 1 more anchors of its class (distinct from the
seed), M positives, N negatives and, two-sided, N second-side negatives.  Batches are explicit
index groups (``CNCBatch``) into the training set, never offsets into a flat batch.

Draws are without replacement whenever the pool holds enough points and with replacement
only when it is too small; an empty negative pool falls back to "any point of another
class".  Both are counted and exposed by ``report()``.  All randomness comes from one
seeded ``torch.Generator``; ``state_dict()`` / ``load_state_dict()`` resume a run exactly,
mid-epoch included.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

__all__ = ["CNCBatch", "CNCBatchSampler"]

_CHUNK_ELEMENTS = 1 << 22  # random keys drawn at once when sampling without replacement
_GROUPS = ("anchors", "positives", "negatives", "negatives2")


@dataclass(frozen=True)
class CNCBatch:
    """Index groups of one contrastive batch (``[M]`` / ``[N]``) or of k stacked ones (``[k, M]``).

    ``anchors[..., 0]`` is the seed anchor and ``positives[..., 0]`` the second side's
    anchor; ``negatives2`` is ``None`` for one-sided sampling.
    """

    anchors: Tensor
    positives: Tensor
    negatives: Tensor
    negatives2: Tensor | None

    def unbind(self) -> list[CNCBatch]:
        """Split a stacked batch ``[k, ...]`` into k single batches."""
        n2 = self.negatives2.unbind(0) if self.negatives2 is not None else [None] * len(self.anchors)
        return [
            CNCBatch(a, p, n, m)
            for a, p, n, m in zip(self.anchors.unbind(0), self.positives.unbind(0), self.negatives.unbind(0), n2)
        ]


def _as_labels(x: Any, name: str) -> Tensor:
    t = torch.as_tensor(x).detach().cpu()
    if t.dim() != 1 or t.is_floating_point() or t.is_complex():
        raise ValueError(f"{name} must be a 1-D integer tensor, got dtype {t.dtype} and shape {tuple(t.shape)}")
    return t.long()


def _checksum(t: Tensor) -> int:
    """Cheap order-sensitive fingerprint of a label vector (guards load_state_dict)."""
    weights = torch.arange(t.numel(), dtype=torch.long) % 1_000_003 + 1
    return int(((t + 7) * weights).sum())


class CNCBatchSampler:
    """Seeded sampler of CNC two-sided contrastive batches (see the module docstring).

    Args:
        y: class labels ``[n]`` of the training set.
        inferred: inferred labels ``[n]`` (same label space as ``y``).
        num_anchors: M, the number of anchors and of positives per batch.
        num_negatives: N, the number of negatives per side.
        two_sided: also draw the second side's negatives (``CNCBatch.negatives2``).
        batches_per_epoch: batches per epoch; default ``max(1, round(anchor_fraction * |anchor pool|))``
            (Alg. 3: one batch per anchor).  More than the pool cycles through further permutations.
        anchor_fraction: fraction of the anchor pool that seeds a batch per epoch (``batches_per_epoch``
            unset); 1 is Alg. 3, less the released code's ``target_sample_ratio``.
        seed: seed of the ``torch.Generator`` that drives every draw.
        skip_empty_classes: skip classes with no positive (no inferred-minority point) as
            seed classes and report them, instead of raising ``ValueError``.
    """

    def __init__(
        self,
        y: Tensor,
        inferred: Tensor,
        num_anchors: int,
        num_negatives: int,
        two_sided: bool = True,
        batches_per_epoch: int | None = None,
        seed: int = 0,
        skip_empty_classes: bool = False,
        anchor_fraction: float = 1.0,
    ) -> None:
        self._y = _as_labels(y, "y")
        self._inferred = _as_labels(inferred, "inferred")
        if self._y.shape != self._inferred.shape:
            raise ValueError(f"y and inferred differ in length: {self._y.numel()} vs {self._inferred.numel()}")
        if num_anchors < 1 or num_negatives < 1:
            raise ValueError(f"num_anchors and num_negatives must be >= 1, got {num_anchors}, {num_negatives}")
        if batches_per_epoch is not None and batches_per_epoch < 1:
            raise ValueError(f"batches_per_epoch must be >= 1, got {batches_per_epoch}")
        if not 0 < anchor_fraction <= 1:
            raise ValueError(f"anchor_fraction must be in (0, 1], got {anchor_fraction}")
        self.num_anchors = int(num_anchors)
        self.num_negatives = int(num_negatives)
        self.two_sided = bool(two_sided)
        self.seed = int(seed)
        self._build_pools(skip_empty_classes)
        self.anchor_fraction = float(anchor_fraction)
        self._batches_per_epoch = (
            int(batches_per_epoch) if batches_per_epoch is not None
            else max(1, round(self.anchor_fraction * self._seed_pool.numel()))
        )
        self._gen = torch.Generator().manual_seed(self.seed)
        self._epoch_pos = 0
        self._epoch_seeds: Tensor | None = None  # this epoch's seed anchors, in order (drawn at its first batch)
        self._batches_drawn = 0
        self._replacement = {c: dict.fromkeys(_GROUPS, 0) for c in self._eligible}
        self._fallback_draws = {c: {"negatives": 0, "negatives2": 0} for c in self._eligible}

    # ------------------------------------------------------------------ pools

    def _build_pools(self, skip_empty_classes: bool) -> None:
        y, g = self._y, self._inferred
        self._classes: list[int] = torch.unique(y).tolist()
        if len(self._classes) < 2:
            raise ValueError("CNC needs at least two classes (negatives come from other classes)")
        self._anchor_pool: dict[int, Tensor] = {}
        self._positive_pool: dict[int, Tensor] = {}
        self._skipped: dict[int, str] = {}
        for c in self._classes:
            self._anchor_pool[c] = torch.nonzero((y == c) & (g == c)).squeeze(1)
            self._positive_pool[c] = torch.nonzero((y == c) & (g != c)).squeeze(1)
            if self._anchor_pool[c].numel() == 0:
                self._skipped[c] = f"class {c} has no anchors (no point with inferred label {c})"
            elif self._positive_pool[c].numel() == 0:
                reason = (
                    f"class {c} has no training points whose inferred label differs from {c}; "
                    "CNC needs inferred minority points — check groups.method or lower bias"
                )
                if not skip_empty_classes:
                    raise ValueError(reason + " (or pass skip_empty_classes=True to skip the class)")
                self._skipped[c] = reason
        self._eligible: list[int] = [c for c in self._classes if c not in self._skipped]
        if not self._eligible:
            raise ValueError("no class can seed a CNC batch: " + "; ".join(self._skipped.values()))
        self._seed_pool = torch.cat([self._anchor_pool[c] for c in self._eligible])
        # position of each anchor point inside its class's anchor pool (-1 elsewhere)
        self._pos_in_anchor_pool = torch.full_like(y, -1)
        for c in self._eligible:
            pool = self._anchor_pool[c]
            self._pos_in_anchor_pool[pool] = torch.arange(pool.numel())
        # negatives: (class c, inferred label h) -> y != c and inferred == h, else y != c
        self._negative_pool: dict[tuple[int, int], Tensor] = {}
        self._negative_fallback: dict[tuple[int, int], bool] = {}
        for c in self._eligible:
            other = y != c
            labels = {c}
            if self.two_sided:
                labels |= set(torch.unique(g[self._positive_pool[c]]).tolist())
            for h in sorted(labels):
                pool = torch.nonzero(other & (g == h)).squeeze(1)
                self._negative_fallback[(c, h)] = pool.numel() == 0
                self._negative_pool[(c, h)] = pool if pool.numel() else torch.nonzero(other).squeeze(1)

    # ------------------------------------------------------------------ drawing

    def _draw(self, pool: Tensor, rows: int, k: int, exclude: Tensor | None = None) -> tuple[Tensor, bool]:
        """``[rows, k]`` indices from ``pool``: distinct per row if the pool allows, else with
        replacement.  ``exclude`` (positions in ``pool``, one per row) are never drawn
        while the pool minus them is large enough."""
        n = pool.numel()
        available = n - (1 if exclude is not None else 0)
        if available < k:
            pick = torch.randint(n, (rows, k), generator=self._gen)
            return pool[pick], True
        out = torch.empty(rows, k, dtype=torch.long)
        step = max(1, _CHUNK_ELEMENTS // n)
        for start in range(0, rows, step):  # loop over chunks of batches, not samples
            stop = min(rows, start + step)
            keys = torch.rand(stop - start, n, generator=self._gen)
            if exclude is not None:
                keys[torch.arange(stop - start), exclude[start:stop]] = -1.0
            out[start:stop] = keys.topk(k, dim=1, sorted=True).indices
        return pool[out], False

    def _draw_epoch_seeds(self) -> Tensor:
        """The seed anchors of one epoch: ``batches_per_epoch`` points of the pool in random order (a permutation,
        truncated, or several when the epoch is longer than the pool)."""
        n = self._seed_pool.numel()
        rounds = -(-self._batches_per_epoch // n)
        order = torch.cat([torch.randperm(n, generator=self._gen) for _ in range(rounds)])
        return self._seed_pool[order[: self._batches_per_epoch]]

    def _next_seeds(self, k: int) -> Tensor:
        """The next k seed anchors of the epoch order, starting a new epoch (a new order) where one ends."""
        parts = []
        while k > 0:
            if self._epoch_pos == 0 or self._epoch_seeds is None:
                self._epoch_seeds = self._draw_epoch_seeds()
            take = min(k, self._batches_per_epoch - self._epoch_pos)
            parts.append(self._epoch_seeds[self._epoch_pos : self._epoch_pos + take])
            self._epoch_pos += take
            k -= take
            if self._epoch_pos == self._batches_per_epoch:
                self._epoch_pos = 0
        return torch.cat(parts)

    def sample_many(self, k: int) -> CNCBatch:
        """Draw the epoch's next k batches at once, stacked: ``anchors [k, M]``, ``negatives [k, N]`` ...

        Vectorised per (class, inferred label) group; k single ``sample()`` calls take the same seed
        anchors (the other draws' stream differs, their distribution does not).
        """
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        m, n_neg = self.num_anchors, self.num_negatives
        seeds = self._next_seeds(k)
        cls = self._y[seeds]
        anchors = torch.empty(k, m, dtype=torch.long)
        anchors[:, 0] = seeds
        positives = torch.empty(k, m, dtype=torch.long)
        negatives = torch.empty(k, n_neg, dtype=torch.long)
        for c in torch.unique(cls).tolist():
            rows = torch.nonzero(cls == c).squeeze(1)
            r = rows.numel()
            if m > 1:
                excl = self._pos_in_anchor_pool[seeds[rows]]
                anchors[rows, 1:], repl = self._draw(self._anchor_pool[c], r, m - 1, exclude=excl)
                self._replacement[c]["anchors"] += r * repl
            positives[rows], repl = self._draw(self._positive_pool[c], r, m)
            self._replacement[c]["positives"] += r * repl
            negatives[rows], repl = self._draw(self._negative_pool[(c, c)], r, n_neg)
            self._replacement[c]["negatives"] += r * repl
            self._fallback_draws[c]["negatives"] += r * self._negative_fallback[(c, c)]
        negatives2 = None
        if self.two_sided:
            negatives2 = torch.empty(k, n_neg, dtype=torch.long)
            g1 = self._inferred[positives[:, 0]]
            for c, h in torch.unique(torch.stack([cls, g1], 1), dim=0).tolist():
                rows = torch.nonzero((cls == c) & (g1 == h)).squeeze(1)
                r = rows.numel()
                negatives2[rows], repl = self._draw(self._negative_pool[(c, h)], r, n_neg)
                self._replacement[c]["negatives2"] += r * repl
                self._fallback_draws[c]["negatives2"] += r * self._negative_fallback[(c, h)]
        self._batches_drawn += k
        return CNCBatch(anchors, positives, negatives, negatives2)

    def sample(self) -> CNCBatch:
        """Draw one batch: ``anchors [M]``, ``positives [M]``, ``negatives [N]``, ``negatives2 [N]``."""
        b = self.sample_many(1)
        return CNCBatch(
            b.anchors[0], b.positives[0], b.negatives[0],
            b.negatives2[0] if b.negatives2 is not None else None,
        )

    # ------------------------------------------------------------------ epochs

    def __len__(self) -> int:
        return self._batches_per_epoch

    def __iter__(self) -> Iterator[CNCBatch]:
        """Yield the rest of the current epoch (all ``len(self)`` batches from a fresh start).

        The epoch position is part of ``state_dict()``: a state saved between two batches
        resumes with exactly the next batch; after an epoch's last batch the position is
        already back at 0.
        """
        for _ in range(self._batches_per_epoch - self._epoch_pos):
            yield self.sample()

    # ------------------------------------------------------------------ state

    def _fingerprint(self) -> dict[str, int | bool]:
        return {
            "n": self._y.numel(),
            "y": _checksum(self._y),
            "inferred": _checksum(self._inferred),
            "num_anchors": self.num_anchors,
            "num_negatives": self.num_negatives,
            "two_sided": self.two_sided,
            "seed_pool": self._seed_pool.numel(),
            "batches_per_epoch": self._batches_per_epoch,
        }

    def state_dict(self) -> dict[str, Any]:
        """Generator state, epoch position and counters (resume with ``load_state_dict``)."""
        return {
            "generator": self._gen.get_state().clone(),
            "epoch_pos": self._epoch_pos,
            "epoch_seeds": self._epoch_seeds.clone() if self._epoch_pos and self._epoch_seeds is not None else None,
            "batches_drawn": self._batches_drawn,
            "replacement": {c: dict(v) for c, v in self._replacement.items()},
            "fallback_draws": {c: dict(v) for c, v in self._fallback_draws.items()},
            "fingerprint": self._fingerprint(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a ``state_dict()`` taken from a sampler over the same data and settings."""
        if state["fingerprint"] != self._fingerprint():
            raise ValueError(
                "CNC sampler state was saved for other data or settings: "
                f"{state['fingerprint']} != {self._fingerprint()}"
            )
        self._gen.set_state(state["generator"].clone())
        self._epoch_pos = int(state["epoch_pos"])
        seeds = state.get("epoch_seeds")
        self._epoch_seeds = seeds.clone() if seeds is not None else None
        self._batches_drawn = int(state["batches_drawn"])
        self._replacement = {c: dict(v) for c, v in state["replacement"].items()}
        self._fallback_draws = {c: dict(v) for c, v in state["fallback_draws"].items()}

    # ------------------------------------------------------------------ reporting

    def report(self) -> dict[str, Any]:
        """Pool sizes, short / empty pools and fallbacks, and draws with replacement per class.

        ``classes[c]``: ``anchor_pool``, ``positive_pool``, ``negative_pool`` (side 1),
        ``negatives2_pools`` (``{inferred label: size}``), ``skipped`` (reason or None),
        ``draws_with_replacement`` (batches per group) and ``fallback_draws`` (batches whose
        negatives came from the "any other class" fallback).  ``empty_pools`` and
        ``short_pools`` list the problems in words.
        """
        m, n_neg = self.num_anchors, self.num_negatives
        classes: dict[int, dict[str, Any]] = {}
        empty: list[str] = []
        short: list[str] = []
        for c in self._classes:
            entry: dict[str, Any] = {
                "anchor_pool": self._anchor_pool[c].numel(),
                "positive_pool": self._positive_pool[c].numel(),
                "skipped": self._skipped.get(c),
            }
            if c in self._eligible:
                entry["negative_pool"] = self._negative_pool[(c, c)].numel()
                entry["negatives2_pools"] = {
                    h: self._negative_pool[(c, h)].numel()
                    for (cc, h) in self._negative_pool if cc == c and h != c
                }
                entry["draws_with_replacement"] = dict(self._replacement[c])
                entry["fallback_draws"] = dict(self._fallback_draws[c])
                for (cc, h), fell_back in self._negative_fallback.items():
                    if cc == c and fell_back:
                        empty.append(
                            f"class {c}: no negatives with y != {c} and inferred == {h}; "
                            f"fell back to any point with y != {c}"
                        )
                if entry["anchor_pool"] < m:
                    short.append(f"class {c}: anchor pool {entry['anchor_pool']} < M = {m}")
                if entry["positive_pool"] < m:
                    short.append(f"class {c}: positive pool {entry['positive_pool']} < M = {m}")
                for (cc, h), pool in self._negative_pool.items():
                    if cc == c and pool.numel() < n_neg:
                        short.append(f"class {c}: negative pool (inferred {h}) {pool.numel()} < N = {n_neg}")
            else:
                empty.append(self._skipped[c])
            classes[c] = entry
        return {
            "num_anchors": m,
            "num_negatives": n_neg,
            "two_sided": self.two_sided,
            "batches_per_epoch": self._batches_per_epoch,
            "anchor_fraction": self.anchor_fraction,
            "batches_drawn": self._batches_drawn,
            "seed_pool": self._seed_pool.numel(),
            "classes": classes,
            "skipped_classes": sorted(self._skipped),
            "empty_pools": empty,
            "short_pools": short,
        }
