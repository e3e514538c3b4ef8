"""Paired differences over seeds (or cells): the interval, what they could detect, and equivalence.

For ``n`` paired differences ``d_i = a_i - b_i`` with mean ``m`` and sample sd ``s``:

- interval: ``m ± t_{0.975, n-1} s / sqrt(n)`` (Student t);
- detectable difference: the smallest true ``|δ|`` a two-sided paired t-test at ``alpha`` rejects with probability
  ``power`` (the root in ``δ / s`` of statsmodels' ``TTestPower`` power, found by scipy's ``brentq``);
- equivalence within ``±D`` (two one-sided tests, TOST): ``m - t_{1-alpha, n-1} s/sqrt(n) > -D`` and
  ``m + t_{1-alpha, n-1} s/sqrt(n) < D`` (statsmodels' ``DescrStatsW.ttost_mean``), i.e. the ``1 - 2 alpha``
  interval lies inside ``(-D, D)``;
- seeds needed: the smallest ``n`` at which the t-test detects ``δ`` (or TOST shows ``±D`` for a true difference of
  0) with probability ``power``, for the observed ``s``.
- repeated looks (more seeds added until a verdict): at each of ``K`` looks planned in advance, both tests at
  ``alpha / K`` (Bonferroni), so the chance of a false verdict of either kind over all looks stays at most ``alpha``.

Every function takes plain floats (points or fractions alike) and returns NaN where the data cannot say (fewer than
two differences, or no spread at all). Where seeds are not paired (two groups of a comparison), :func:`welch`: the
two-sided Welch t-test.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

ALPHA = 0.05  # two-sided level of every interval and test
POWER = 0.8  # the power at which a detectable difference is stated
MAX_SEEDS = 10_000  # seeds_needed's search bound: beyond it the answer is "more than this"
MIN_VERDICT_PAIRS = 3  # the project's rule: a verdict (differs, within) rests on >= 3 seeds (debias compare's too)


@dataclass(frozen=True)
class Paired:
    """``n`` paired differences: their mean, sample sd and 95 % t-interval (NaN bounds with fewer than 2)."""

    n: int
    mean: float
    sd: float
    low: float
    high: float

    @property
    def excludes_zero(self) -> bool:
        """A difference shown: the interval has a width and holds no 0 (never from fewer than 2 differences)."""
        return not math.isnan(self.low) and self.high - self.low > 1e-9 and (self.low > 0 or self.high < 0)


def paired(differences: list[float], alpha: float = ALPHA) -> Paired:
    """Mean, sd and the two-sided ``1 - alpha`` t-interval of ``differences`` (NaN ones dropped)."""
    from scipy.stats import t as student_t

    values = [d for d in differences if not math.isnan(d)]
    n = len(values)
    if n == 0:
        return Paired(0, math.nan, math.nan, math.nan, math.nan)
    mean = math.fsum(values) / n
    if n < 2:
        return Paired(n, mean, math.nan, math.nan, math.nan)
    sd = math.sqrt(math.fsum((d - mean) ** 2 for d in values) / (n - 1))
    half = float(student_t.ppf(1 - alpha / 2, n - 1)) * sd / math.sqrt(n)
    return Paired(n, mean, sd, mean - half, mean + half)


def detectable_difference(sd: float, n: int, power: float = POWER, alpha: float = ALPHA) -> float:
    """The smallest true mean difference a two-sided paired t-test over ``n`` differences of sd ``sd`` detects at
    level ``alpha`` with probability ``power`` (NaN for n < 2 or sd NaN; 0 for sd 0)."""
    if n < 2 or math.isnan(sd):
        return math.nan
    if sd == 0:
        return 0.0
    from scipy.optimize import brentq

    def short(effect: float) -> float:  # power at a true difference of ``effect`` sds, less the power asked for
        return t_test_power(effect, 1.0, n, alpha) - power

    from scipy.stats import norm

    # Twice the normal approximation's root, (z_{1-alpha/2} + z_power) / sqrt(n), brackets it for n >= 3 and keeps the
    # noncentrality small enough that scipy's noncentral t does not fail (which costs a quadrature per call)
    high = 2.0 * float(norm.ppf(1 - alpha / 2) + norm.ppf(power)) / math.sqrt(n)
    while short(high) < 0:  # the power grows with the effect from alpha at 0: bracket the one root above 0
        high *= 2.0
    # statsmodels' TTestPower.solve_power is not used: at some n (73, 87 at 80 %) it returns an array, at 73 the
    # negative root
    return brentq(short, 0.0, high, xtol=1e-12) * sd


def t_test_power(delta: float, sd: float, n: int, alpha: float = ALPHA) -> float:
    """Probability that a two-sided paired t-test over ``n`` differences of sd ``sd`` rejects when the true mean
    difference is ``delta`` (statsmodels' ``TTestPower``)."""
    if n < 2 or math.isnan(sd) or sd <= 0:
        return math.nan
    from scipy.stats import t as student_t
    from statsmodels.stats.power import TTestPower

    effect = abs(delta) / sd
    found = float(TTestPower().power(effect_size=effect, nobs=n, alpha=alpha, alternative="two-sided"))
    if math.isnan(found):  # scipy's noncentral t fails at some points (df 1, noncentrality 11 to 17): integrate
        df, shift = n - 1, effect * math.sqrt(n)
        critical = float(student_t.ppf(1 - alpha / 2, df))
        found = noncentral_t_sf(critical, df, shift) + 1.0 - noncentral_t_sf(-critical, df, shift)
    return found


def noncentral_t_sf(x: float, df: int, shift: float) -> float:
    """``P(T > x)`` for ``T = (Z + shift) / sqrt(V / df)``, ``Z`` standard normal, ``V`` chi-square with ``df``:
    ``∫ Φ(shift - x sqrt(v / df)) χ²_df(v) dv`` by quadrature (where scipy's ``nct`` returns NaN)."""
    from scipy.integrate import quad
    from scipy.special import gammaln, ndtr, xlogy

    # Φ as scipy.special.ndtr and the χ² density as exp((df/2 - 1) log v - v/2 - log Γ(df/2) - df log(2) / 2), the
    # formulas scipy.stats' norm.cdf and chi2.pdf evaluate, called directly: without the distributions' generic
    # argument checks, which cost far more than the formulas at each of the quadrature's hundreds of points
    log_scale = float(gammaln(df / 2.0)) + math.log(2.0) * df / 2.0

    def integrand(v: float) -> float:
        return float(ndtr(shift - x * math.sqrt(v / df))) * math.exp(float(xlogy(df / 2.0 - 1.0, v)) - v / 2.0
                                                                         - log_scale)

    value, _ = quad(integrand, 0.0, math.inf, limit=200)
    return min(1.0, max(0.0, value))


def tost(differences: list[float], margin: float, alpha: float = ALPHA) -> float:
    """The p-value of the two one-sided tests that the true mean difference lies within ``(-margin, margin)``
    (statsmodels' ``DescrStatsW.ttost_mean``): equivalence is shown when it is below ``alpha``. NaN with fewer than
    two differences."""
    values = [d for d in differences if not math.isnan(d)]
    if len(values) < 2 or margin <= 0:
        return math.nan
    if max(values) - min(values) == 0:  # no spread: the t statistics are infinite, the verdict is the mean's
        return 0.0 if abs(values[0]) < margin else 1.0
    import numpy as np
    from statsmodels.stats.weightstats import DescrStatsW

    p_value, _, _ = DescrStatsW(np.asarray(values, dtype=float)).ttost_mean(-margin, margin)
    return float(p_value)


def tost_power(margin: float, sd: float, n: int, true_difference: float = 0.0, alpha: float = ALPHA) -> float:
    """Probability that TOST within ``±margin`` shows equivalence over ``n`` differences of sd ``sd`` when the true
    mean difference is ``true_difference``: both one-sided t statistics beyond ``t_{1-alpha, n-1}``, from the
    noncentral t as ``P(lower) + P(upper) - 1`` (bounded below by 0). That leaves out the chance that both tests
    fail together (a large sample sd), so it is a lower bound of the exact power: close to it where the power is
    high (the region :func:`seeds_needed` searches; 0.817 against 0.828 at ±2, sd 1, n 4), well below it at few
    seeds (0.42 against 0.56 at n 3; tests/test_paired.py), so the seeds it asks for are never too few."""
    if n < 2 or math.isnan(sd) or sd <= 0 or margin <= 0:
        return math.nan
    from scipy.stats import nct
    from scipy.stats import t as student_t

    df, se = n - 1, sd / math.sqrt(n)
    critical = float(student_t.ppf(1 - alpha, df))
    # lower test: (m + D) / se > c; upper test: (m - D) / se < -c; m ~ se * t-like with noncentrality (δ ± D) / se
    above_lower = float(nct.sf(critical, df, (true_difference + margin) / se))
    below_upper = float(nct.cdf(-critical, df, (true_difference - margin) / se))
    if math.isnan(above_lower):  # scipy's noncentral t fails at some points: integrate
        above_lower = noncentral_t_sf(critical, df, (true_difference + margin) / se)
    if math.isnan(below_upper):
        below_upper = 1.0 - noncentral_t_sf(-critical, df, (true_difference - margin) / se)
    return max(0.0, above_lower + below_upper - 1.0)


def seeds_needed(sd: float, delta: float | None = None, margin: float | None = None, power: float = POWER,
                 alpha: float = ALPHA) -> int | None:
    """The smallest ``n >= 2`` at which a paired t-test detects a true difference ``delta``, or (with ``margin``) TOST
    shows equivalence within ``±margin`` for a true difference of 0, with probability ``power``, for differences of
    sd ``sd``. None when sd is unknown or no ``n`` up to :data:`MAX_SEEDS` reaches it."""
    if math.isnan(sd) or (delta is None) == (margin is None):
        return None
    if sd == 0:
        return 2

    def reaches(n: int) -> bool:
        got = t_test_power(delta, sd, n, alpha) if delta is not None else tost_power(margin, sd, n, 0.0, alpha)
        return got >= power

    # power grows with n: double until it is reached (never far past it, where the noncentral t's tail is accurate),
    # then bisect for the first n that reaches it
    high = 2
    while not reaches(high):
        if high >= MAX_SEEDS:
            return None
        high = min(2 * high, MAX_SEEDS)
    low = max(2, high // 2)
    while low < high:
        middle = (low + high) // 2
        if reaches(middle):
            high = middle
        else:
            low = middle + 1
    return low


# --------------------------------------------------------------------------- repeated looks (group-sequential)


def look_level(looks: int, alpha: float = ALPHA) -> float:
    """The level each test gets at each of ``looks`` planned looks: ``alpha / looks`` (Bonferroni). A false verdict of
    one kind over the whole sequence needs a false rejection at some look, so its probability is at most the sum of
    the looks' levels, ``alpha``, whatever the dependence between looks and whenever the sequence stops."""
    if looks < 1:
        raise ValueError(f"looks = {looks}; allowed: a whole number >= 1 (the looks planned before the first)")
    return alpha / looks


def sequential_verdicts(mean: Any, sd: Any, n: Any, margin: float, level: float) -> tuple[Any, Any]:
    """``(differs, within)`` for paired differences summarised by ``mean``, sample ``sd`` and count ``n`` (numbers
    or numpy arrays of them), each test at ``level``: differs when ``|mean| / (sd/sqrt(n)) > t_{1-level/2, n-1}``
    (the two-sided paired t-test); within ``±margin`` when ``(mean + margin)/se > t_{1-level, n-1}`` and
    ``(mean - margin)/se < -t_{1-level, n-1}`` (TOST). No spread (sd 0): never differs, within when ``|mean| <
    margin`` (as :func:`tost`); fewer than :data:`MIN_VERDICT_PAIRS` differences or a NaN: neither."""
    import numpy as np
    from scipy.stats import t as student_t

    mean, sd, n = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (mean, sd, n)))
    usable = (n >= MIN_VERDICT_PAIRS) & np.isfinite(mean) & np.isfinite(sd)
    df = np.where(usable, n - 1, 1.0)
    se = np.where(usable & (sd > 0), sd / np.sqrt(np.where(usable, n, 1.0)), 1.0)
    two_sided = student_t.ppf(1 - level / 2, df)
    one_sided = student_t.ppf(1 - level, df)
    spread = usable & (sd > 0)
    differs = spread & (np.abs(mean) / se > two_sided)
    within = np.where(spread, ((mean + margin) / se > one_sided) & ((mean - margin) / se < -one_sided),
                      usable & (np.abs(mean) < margin))
    return differs, within & (margin > 0)


@dataclass(frozen=True)
class Look:
    """One look of a sequential comparison: the paired differences so far, the level of each test at this look
    (:func:`look_level`), the interval at ``1 - level`` and whether they differ or lie within ``±margin``."""

    paired: Paired
    margin: float
    level: float
    differs: bool
    within: bool

    @property
    def decided(self) -> bool:
        return self.differs or self.within


def sequential_look(differences: list[float], margin: float, looks: int, alpha: float = ALPHA) -> Look:
    """The verdict at one of ``looks`` planned looks over ``differences`` (NaN ones dropped), each test at
    :func:`look_level` (:func:`sequential_verdicts`)."""
    level = look_level(looks, alpha)
    summary = paired(differences, level)
    differs, within = sequential_verdicts(summary.mean, summary.sd, summary.n, margin, level)
    return Look(summary, margin, level, bool(differs), bool(within))


def welch(values_a: list[float], values_b: list[float]) -> float | None:
    """Two-sided Welch t-test p-value of two sets of seeds, None with fewer than two values in either."""
    a = [v for v in values_a if not math.isnan(v)]
    b = [v for v in values_b if not math.isnan(v)]
    if len(a) < 2 or len(b) < 2:
        return None
    from scipy.special import stdtr  # Student's t CDF (scipy.stats takes seconds to import)

    if max(a) == min(a) and max(b) == min(b):
        return 1.0 if a[0] == b[0] else 0.0
    mean_a, mean_b = sum(a) / len(a), sum(b) / len(b)
    var_a = sum((v - mean_a) ** 2 for v in a) / (len(a) - 1) / len(a)
    var_b = sum((v - mean_b) ** 2 for v in b) / (len(b) - 1) / len(b)
    t = (mean_a - mean_b) / math.sqrt(var_a + var_b)
    df = (var_a + var_b) ** 2 / (var_a ** 2 / (len(a) - 1) + var_b ** 2 / (len(b) - 1))  # Welch-Satterthwaite
    return float(2 * stdtr(df, -abs(t)))
