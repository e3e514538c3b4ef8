"""Repeated looks at a paired comparison (``debias sweep --until-decided``): the Bonferroni level per planned look,
the verdicts against statsmodels' and scipy's own tests, and a simulation of sequential sweeps showing the false
"differs" and false "within ±D" rates stay at α or below, where looking without the correction exceeds it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from debias.metrics.paired import ALPHA, look_level, paired, sequential_look, sequential_verdicts, tost

LOOKS = (3, 6, 9, 12)  # seeds at each look: the finished 3-seed sweep, then batches of 3 up to 12
SWEEPS = 4000  # simulated sweeps per scenario
SD = 1.0  # sd of one seed's paired difference (points)
MARGIN = 1.0  # ±D


def test_each_look_gets_alpha_over_the_planned_looks_and_a_bad_plan_is_refused() -> None:
    assert look_level(4) == pytest.approx(ALPHA / 4) and look_level(1, 0.1) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="looks = 0; allowed: a whole number >= 1"):
        look_level(0)


def test_the_verdicts_are_the_paired_interval_and_tost_at_the_looks_level() -> None:
    """Against the independent computations: the two-sided interval at 1 - level (scipy's t) excludes 0 exactly
    when 'differs', statsmodels' TOST p-value is below the level exactly when 'within'."""
    rng = np.random.default_rng(7)
    seen = {"differs": 0, "within": 0}
    for _ in range(300):
        n = int(rng.integers(2, 12))
        values = list(rng.normal(rng.uniform(-2, 2), rng.uniform(0.2, 2), n))
        level = look_level(int(rng.integers(1, 6)))
        look = sequential_look(values, MARGIN, round(ALPHA / level))
        if n < 3:  # below the project's 3 seeds no verdict, as debias compare gives none
            assert not look.decided
            continue
        assert look.differs == paired(values, level).excludes_zero
        assert look.within == (tost(values, MARGIN, level) < level)
        seen["differs"] += look.differs
        seen["within"] += look.within
    assert min(seen.values()) > 20  # both verdicts occur: the comparison above is not vacuous
    # no spread: never 'differs' (no interval), 'within' by the mean alone, as tost() says; one value: neither
    assert (sequential_look([0.5, 0.5, 0.5], MARGIN, 2).differs, sequential_look([0.5] * 3, MARGIN, 2).within) == (False, True)
    assert not sequential_look([3.0] * 3, MARGIN, 2).within
    assert not sequential_look([0.1], MARGIN, 1).decided and not sequential_look([0.1, math.nan], MARGIN, 1).decided


def test_two_seeds_decide_nothing_however_clear_as_compare_gives_no_verdict_below_three() -> None:
    """A look at 2 seeds whose paired t-test and TOST alone would decide (a wide difference, a tight one) is
    undecided: --until-decided must not stop where debias compare says "too few seeds"."""
    clear, tight = [9.0, 9.5], [0.01, 0.02]
    assert paired(clear, ALPHA).excludes_zero and tost(tight, MARGIN, ALPHA) < ALPHA  # each test alone decides
    assert not sequential_look(clear, MARGIN, 1).decided and not sequential_look(tight, MARGIN, 1).decided
    assert sequential_look(clear + [9.2], MARGIN, 1).differs and sequential_look(tight + [0.015], MARGIN, 1).within


def false_verdict_rate(true_difference: float, verdict: str, looks: int) -> float:
    """Simulate :data:`SWEEPS` sequential sweeps: normal paired differences (mean ``true_difference``, sd
    :data:`SD`), a look at each of :data:`LOOKS` seeds with both tests at ``look_level(looks)``, stopping at the
    first decided look; the share that ended with ``verdict`` ('differs' or 'within')."""
    rng = np.random.default_rng(20261127)
    draws = rng.normal(true_difference, SD, size=(SWEEPS, max(LOOKS)))
    level = look_level(looks)
    open_ = np.ones(SWEEPS, dtype=bool)
    ended = np.zeros(SWEEPS, dtype=bool)
    for n in LOOKS:
        seen = draws[:, :n]
        differs, within = sequential_verdicts(seen.mean(axis=1), seen.std(axis=1, ddof=1), n, MARGIN, level)
        ended |= open_ & (differs if verdict == "differs" else within)
        open_ &= ~(differs | within)
    return float(ended.mean())


def bound() -> float:
    """α plus three standard errors of a rate of α estimated from :data:`SWEEPS` sweeps."""
    return ALPHA + 3 * math.sqrt(ALPHA * (1 - ALPHA) / SWEEPS)


def test_repeated_looks_keep_the_false_differs_rate_at_alpha_under_no_difference() -> None:
    corrected = false_verdict_rate(0.0, "differs", len(LOOKS))
    assert corrected <= bound(), corrected
    naive = false_verdict_rate(0.0, "differs", 1)  # every look at the full alpha: what the correction prevents
    assert naive > bound(), naive


@pytest.mark.parametrize("true_difference", [MARGIN, -MARGIN])
def test_repeated_looks_keep_the_false_within_margin_rate_at_alpha_on_the_margin(true_difference: float) -> None:
    corrected = false_verdict_rate(true_difference, "within", len(LOOKS))
    assert corrected <= bound(), corrected
    naive = false_verdict_rate(true_difference, "within", 1)
    assert naive > bound(), naive
