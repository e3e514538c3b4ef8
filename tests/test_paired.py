"""debias.metrics.paired against computations that share none of its code: scipy's one-sample t-test for the interval
and the two one-sided tests, the noncentral t's power written out directly, Owen's exact TOST power (a numerical
integral over the sample sd) and Monte Carlo simulations with a fixed seed, whose tolerances come from their own
standard error (never from a run on one machine)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, optimize, stats

from debias.metrics import paired as pm

REPLICATES = 20_000  # Monte Carlo draws per case: a standard error of at most 0.0036 on a probability
Z = 4.5  # standard errors allowed: a correct implementation fails one case in ~150,000 draws of the seed


def direct_power(delta: float, sd: float, n: int, alpha: float = 0.05) -> float:
    """Two-sided one-sample t-test power from the noncentral t: P(T > c) + P(T < -c), T ~ t'(n-1, delta sqrt(n)/sd)."""
    c = stats.t.ppf(1 - alpha / 2, n - 1)
    shift = abs(delta) * math.sqrt(n) / sd
    below = float(stats.nct.cdf(-c, n - 1, shift))
    if math.isnan(below) and stats.nct.cdf(c, n - 1, shift) < 1e-12:  # scipy's far tail: less than P(T < c), ~0
        below = 0.0
    return float(stats.nct.sf(c, n - 1, shift)) + below


def exact_tost_power(margin: float, sd: float, n: int, true_difference: float = 0.0, alpha: float = 0.05) -> float:
    """TOST's exact power (Owen): the mean m ~ N(delta, sd^2/n) is independent of the sample variance
    s^2 ~ sd^2 chi2(n-1)/(n-1); both tests pass when |m| < margin - t_{1-alpha} s/sqrt(n). Integrated over s^2."""
    df, se = n - 1, sd / math.sqrt(n)
    c = stats.t.ppf(1 - alpha, df)

    def inside(q: float) -> float:
        half = margin - c * se * math.sqrt(q / df)
        if half <= 0:
            return 0.0
        window = stats.norm.cdf((half - true_difference) / se) - stats.norm.cdf((-half - true_difference) / se)
        return float(window * stats.chi2.pdf(q, df))

    upper = df * (margin / (c * se)) ** 2  # beyond it the window is empty
    low, high = stats.chi2.ppf(1e-12, df), min(upper, stats.chi2.ppf(1 - 1e-12, df))
    return integrate.quad(inside, low, high, limit=400, epsabs=1e-11)[0] if high > low else 0.0


def simulate(delta: float, sd: float, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Means and sample sds of REPLICATES draws of n normal differences."""
    draws = np.random.default_rng(seed).normal(delta, sd, size=(REPLICATES, n))
    return draws.mean(axis=1), draws.std(axis=1, ddof=1)


def tolerance(p: float) -> float:
    return Z * math.sqrt(max(p * (1 - p), 1e-4) / REPLICATES)


def test_the_interval_is_scipys_one_sample_t_interval() -> None:
    differences = [-20.0, -19.0, -21.0, -17.5, -23.25]
    found = pm.paired(differences)
    expected = stats.ttest_1samp(differences, 0.0).confidence_interval(0.95)
    assert (found.n, found.mean, found.sd) == (5, pytest.approx(np.mean(differences)),
                                               pytest.approx(np.std(differences, ddof=1)))
    assert (found.low, found.high) == (pytest.approx(expected.low, rel=1e-12), pytest.approx(expected.high, rel=1e-12))
    assert found.excludes_zero
    assert pm.paired([1.0, float("nan"), 3.0]).n == 2  # a NaN is dropped, not a difference
    one = pm.paired([4.0])
    assert one.n == 1 and one.mean == 4.0 and math.isnan(one.low) and not one.excludes_zero
    assert not pm.paired([2.0, 2.0, 2.0]).excludes_zero  # no width: no evidence


@pytest.mark.parametrize("delta, sd, n", [(2.0, 3.0, 5), (0.5, 1.0, 20), (14.8, 15.4, 3), (1.0, 4.0, 60)])
def test_t_test_power_is_the_noncentral_t_written_out(delta: float, sd: float, n: int) -> None:
    assert pm.t_test_power(delta, sd, n) == pytest.approx(direct_power(delta, sd, n), rel=1e-8, abs=1e-12)
    assert pm.t_test_power(-delta, sd, n) == pm.t_test_power(delta, sd, n)  # two-sided


@pytest.mark.parametrize("delta, sd, n, seed", [(2.0, 3.0, 5, 11), (1.0, 2.0, 12, 12), (0.0, 1.0, 6, 13),
                                                (15.0, 15.4, 3, 14)])
def test_t_test_power_is_what_a_simulated_t_test_rejects(delta: float, sd: float, n: int, seed: int) -> None:
    means, sds = simulate(delta, sd, n, seed)
    rejected = np.abs(means / (sds / math.sqrt(n))) > stats.t.ppf(0.975, n - 1)
    predicted = pm.t_test_power(delta, sd, n)
    assert abs(rejected.mean() - predicted) <= tolerance(predicted), (rejected.mean(), predicted)
    if delta == 0:
        assert predicted == pytest.approx(0.05)  # no difference: the test's level


@pytest.mark.parametrize("sd, n", [(15.4, 3), (5.6, 3), (1.0, 10), (2.5, 40)])
def test_the_detectable_difference_is_where_the_power_reaches_80_percent(sd: float, n: int) -> None:
    found = pm.detectable_difference(sd, n)
    root = optimize.brentq(lambda d: direct_power(d, sd, n) - 0.8, 1e-9, 10 * sd)  # n >= 3: below 10 sd
    assert found == pytest.approx(root, rel=1e-6)
    assert pm.detectable_difference(2 * sd, n) == pytest.approx(2 * found, rel=1e-9)  # in units of the sd
    assert math.isnan(pm.detectable_difference(sd, 1)) and math.isnan(pm.detectable_difference(float("nan"), n))


@pytest.mark.parametrize("x, df, shift", [(12.7, 1, 5.0), (-12.7, 1, 5.0), (2.0, 3, 1.5), (-2.0, 9, -0.5), (4.3, 2, 9.0)])
def test_the_integrated_noncentral_t_tail_is_scipys_where_scipys_answers(x: float, df: int, shift: float) -> None:
    assert pm.noncentral_t_sf(x, df, shift) == pytest.approx(float(stats.nct.sf(x, df, shift)), abs=1e-9)


def test_the_power_has_no_hole_where_scipys_noncentral_t_fails() -> None:
    """At 2 seeds scipy's nct returns NaN for effects of 8 and 11 to 17 sds: the power still rises smoothly there."""
    found = [pm.t_test_power(effect, 1.0, 2) for effect in np.arange(4.0, 20.0, 0.25)]
    assert not any(math.isnan(value) for value in found)
    assert all(0 < later - earlier < 0.05 for earlier, later in zip(found, found[1:]))


def test_the_detectable_difference_is_the_positive_root_at_every_seed_count() -> None:
    """At every n from 2 to 200 (statsmodels' own solver returns an array at 73 and 87, the negative root at 73): a
    positive number where the power is 80 %, shrinking as seeds are added."""
    found = [pm.detectable_difference(1.0, n) for n in range(2, 201)]
    assert all(isinstance(value, float) and value > 0 for value in found)
    assert all(later < earlier for earlier, later in zip(found, found[1:]))
    for n in (2, 73, 87, 200):
        assert pm.t_test_power(found[n - 2], 1.0, n) == pytest.approx(0.8, abs=1e-9)


@pytest.mark.parametrize("differences, margin", [([0.5, -0.3, 0.1, 0.4], 2.0), ([1.5, 2.5, 1.0], 2.0),
                                                 ([-14.0, 20.0, -50.0], 2.0), ([0.2, 0.1, -0.1, 0.0, 0.3], 0.5)])
def test_tost_is_two_one_sided_scipy_t_tests(differences: list[float], margin: float) -> None:
    lower = stats.ttest_1samp(differences, -margin, alternative="greater").pvalue
    upper = stats.ttest_1samp(differences, margin, alternative="less").pvalue
    assert pm.tost(differences, margin) == pytest.approx(max(lower, upper), rel=1e-9)
    assert math.isnan(pm.tost([1.0], margin)) and pm.tost([1.0, 1.0], 2.0) == 0.0 and pm.tost([3.0, 3.0], 2.0) == 1.0


@pytest.mark.parametrize("margin, sd, n, true_difference", [(2.0, 3.0, 21, 0.0), (2.0, 5.56, 68, 0.0),
                                                            (2.0, 2.0, 11, 0.5), (1.0, 1.0, 12, 0.0)])
def test_tost_power_is_owens_exact_power_and_what_a_simulated_tost_shows(margin: float, sd: float, n: int,
                                                                        true_difference: float) -> None:
    """Where the power is high (the region :func:`seeds_needed` looks for), tost_power is the exact power; the exact
    integral itself is checked against a simulation of the two one-sided tests."""
    exact = exact_tost_power(margin, sd, n, true_difference)
    means, sds = simulate(true_difference, sd, n, seed=n)
    se, c = sds / math.sqrt(n), stats.t.ppf(0.95, n - 1)
    shown = ((means + margin) / se > c) & ((means - margin) / se < -c)
    assert abs(shown.mean() - exact) <= tolerance(exact), (shown.mean(), exact)
    assert pm.tost_power(margin, sd, n, true_difference) == pytest.approx(exact, abs=1e-3)


@pytest.mark.parametrize("margin, sd, n", [(2.0, 1.0, 3), (2.0, 3.0, 5), (1.0, 1.0, 2), (2.0, 4.0, 10),
                                           (2.0, 1.0, 4)])
def test_tost_power_never_claims_more_than_the_exact_power(margin: float, sd: float, n: int) -> None:
    """At few seeds both tests may fail together, a chance the noncentral-t form leaves out: it is then below the
    exact power, never above it, so the seeds it asks for are never too few."""
    exact = exact_tost_power(margin, sd, n)
    means, sds = simulate(0.0, sd, n, seed=100 + n)
    se, c = sds / math.sqrt(n), stats.t.ppf(0.95, n - 1)
    shown = (((means + margin) / se > c) & ((means - margin) / se < -c)).mean()
    assert abs(shown - exact) <= tolerance(exact), (shown, exact)
    assert pm.tost_power(margin, sd, n) <= exact + 1e-9


@pytest.mark.parametrize("sd", [1.5, 3.0, 5.56, 15.4])
def test_seeds_needed_is_the_first_count_that_reaches_80_percent(sd: float) -> None:
    differ = pm.seeds_needed(sd, delta=2.0)
    assert direct_power(2.0, sd, differ) >= 0.8 > direct_power(2.0, sd, differ - 1)
    within = pm.seeds_needed(sd, margin=2.0)
    assert pm.tost_power(2.0, sd, within) >= 0.8 > pm.tost_power(2.0, sd, within - 1)
    assert exact_tost_power(2.0, sd, within) >= 0.8  # never fewer seeds than the exact power needs
    assert pm.seeds_needed(float("nan"), delta=2.0) is None and pm.seeds_needed(0.0, margin=2.0) == 2
    assert pm.seeds_needed(sd) is None and pm.seeds_needed(sd, delta=2.0, margin=2.0) is None  # one question at a time


@pytest.mark.parametrize("x, df, shift", [(12.7, 1, 14.0), (-12.7, 1, 14.0), (2.0, 1, 8.0), (2.9, 2, 17.0),
                                          (-2.0, 9, -0.5), (1.7, 30, 25.0)])
def test_the_integrated_noncentral_t_tail_is_the_quadrature_of_scipys_normal_and_chi2(x: float, df: int,
                                                                                       shift: float) -> None:
    """The integrand evaluated through scipy.special is the one scipy.stats' norm.cdf and chi2.pdf give, also where
    scipy's nct fails (df 1 and 2, noncentrality 8 to 17): the same quadrature of the same integrand."""
    from scipy.integrate import quad

    reference, _ = quad(lambda v: stats.norm.cdf(shift - x * math.sqrt(v / df)) * stats.chi2.pdf(v, df), 0.0, math.inf,
                        limit=200)
    assert pm.noncentral_t_sf(x, df, shift) == pytest.approx(min(1.0, max(0.0, reference)), rel=1e-12, abs=1e-15)
