"""Confidence intervals for evaluation metrics.

Two estimators, one per kind of metric:

1. Rates (``success@k``, ``draw@k``): the Wilson score interval (Wilson 1927; Brown,
   Cai and DasGupta 2001, "Interval Estimation for a Binomial Proportion"). Unlike the
   normal ("Wald") interval it stays inside [0, 1] and keeps close to its nominal
   coverage at the small n and extreme rates (0/8 wins) an LLM evaluation produces.
2. Means of unbounded values (Kuhn chip payoffs, ``ev@k``): the Student-t interval
   ``mean +- t_{(1+level)/2, n-1} * s / sqrt(n)``. The t quantile is computed exactly
   for the integer degrees of freedom used here, by bisection on the closed-form t CDF
   of Abramowitz and Stegun 26.7.3-26.7.4, so no SciPy is needed.

Both treat the meta-episodes as independent draws, which holds when every task
instance is played once per agent (``rollouts=1``). Rollouts of the same task share a
deal and an opponent, so with ``rollouts > 1`` the intervals are somewhat too narrow.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from statistics import NormalDist
from typing import Any


@dataclass(frozen=True)
class Estimate:
    """A point estimate with its confidence interval.

    Attributes:
        mean: The estimate (``None`` when there was no sample).
        low: Lower end of the interval (``None`` when it is undefined: n = 0, or one
            value for a mean).
        high: Upper end of the interval (likewise).
        n: Sample size.
    """

    mean: float | None
    low: float | None
    high: float | None
    n: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Estimate:
        return cls(**data)


def _check_level(level: float) -> None:
    if not 0 < level < 1:
        raise ValueError(f"confidence level must be in (0, 1), got {level}; e.g. 0.95")


def normal_quantile(level: float) -> float:
    """Two-sided standard-normal quantile: 1.96 for ``level=0.95``."""
    _check_level(level)
    return NormalDist().inv_cdf(0.5 + level / 2)


def wilson_interval(successes: int, n: int, level: float = 0.95) -> Estimate:
    """Wilson score interval for a binomial rate ``successes / n``.

    Args:
        successes: Number of successes, ``0 <= successes <= n``.
        n: Number of trials.
        level: Two-sided confidence level.

    Returns:
        The rate and its interval; every field but ``n`` is ``None`` when ``n == 0``.

    Raises:
        ValueError: If ``successes`` is outside ``[0, n]`` or ``level`` outside (0, 1).
    """
    _check_level(level)
    if n < 0 or not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n, got successes={successes}, n={n}")
    if n == 0:
        return Estimate(None, None, None, 0)
    z = normal_quantile(level)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    # Clamp rounding noise: at p = 0 the lower end is exactly 0, at p = 1 the upper is 1.
    return Estimate(p, max(0.0, centre - half), min(1.0, centre + half), n)


def t_cdf_two_sided(t: float, df: int) -> float:
    """``P(|T| < t)`` for Student's t with integer ``df >= 1`` (A&S 26.7.3-26.7.4).

    With ``theta = atan(t / sqrt(df))`` and ``c = cos(theta)``, the probability is a
    finite series in ``c``: ``(2/pi) (theta + sin(theta) (c + 2/3 c^3 + ...))`` for odd
    ``df`` and ``sin(theta) (1 + 1/2 c^2 + 3/8 c^4 + ...)`` for even ``df``.
    """
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if t <= 0:
        return 0.0
    theta = math.atan(t / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    if df % 2 == 1:
        series, term = 0.0, math.cos(theta)
        for j in range(1, (df - 1) // 2 + 1):  # exponents 1, 3, ..., df - 2
            series += term
            term *= c2 * (2 * j) / (2 * j + 1)
        return 2 / math.pi * (theta + math.sin(theta) * series)
    series, term = 0.0, 1.0
    for j in range(1, df // 2 + 1):  # exponents 0, 2, ..., df - 2
        series += term
        term *= c2 * (2 * j - 1) / (2 * j)
    return math.sin(theta) * series


def t_quantile(level: float, df: int) -> float:
    """Two-sided Student-t quantile: ``t`` with ``P(|T| < t) = level`` (12.706 for
    ``level=0.95, df=1``; 2.228 for ``df=10``)."""
    _check_level(level)
    lo, hi = 0.0, 1.0
    while t_cdf_two_sided(hi, df) < level:
        hi *= 2
    for _ in range(200):  # bisection to machine precision
        mid = (lo + hi) / 2
        if mid in (lo, hi):
            break
        if t_cdf_two_sided(mid, df) < level:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def mean_interval(values: Sequence[float], level: float = 0.95) -> Estimate:
    """Student-t interval for the mean of ``values``.

    Returns:
        The sample mean and ``mean +- t * s / sqrt(n)``; the interval is ``None`` for a
        single value (no spread to estimate) and everything is ``None`` for none.
    """
    _check_level(level)
    n = len(values)
    if n == 0:
        return Estimate(None, None, None, 0)
    mean = math.fsum(values) / n
    if n == 1:
        return Estimate(mean, None, None, 1)
    var = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    half = t_quantile(level, n - 1) * math.sqrt(var / n)
    return Estimate(mean, mean - half, mean + half, n)


def bounded(est: Estimate, low: float | None, high: float | None, level: float = 0.95) -> Estimate:
    """``est`` with its interval kept inside ``[low, high]``, the range of one value.

    An interval of zero width (every value the same, or every stratum constant) claims a
    certainty that ``n`` draws cannot give; it becomes Wilson's interval for the share
    ``(mean - low) / (high - low)`` of ``n`` draws, mapped back to the range. Without
    bounds, or without an interval, ``est`` is returned as it is.
    """
    if est.mean is None or est.low is None or est.high is None or low is None or high is None:
        return est
    if high <= low:
        return est
    if est.high - est.low <= 1e-12 * max(1.0, abs(est.mean)):
        share = min(1.0, max(0.0, (est.mean - low) / (high - low)))
        w = wilson_interval(round(share * est.n), est.n, level)
        assert w.low is not None and w.high is not None
        return Estimate(est.mean, low + w.low * (high - low), low + w.high * (high - low), est.n)
    return Estimate(est.mean, max(low, est.low), min(high, est.high), est.n)


def stratified_mean(
    values: Sequence[float],
    strata: Sequence[str],
    weights: dict[str, float],
    level: float = 0.95,
    bounds: tuple[float | None, float | None] = (None, None),
) -> Estimate:
    """The stratified mean of ``values`` and its Student-t interval.

    Strata without values are left out and the others' weights renormalised (say, when
    an estimate is restricted to one seat). A stratum with one value has no spread of
    its own; it then borrows the pooled within-stratum variance. With ``bounds`` (the
    range of one value) the interval stays inside them, and one of zero width (every
    stratum constant) becomes Wilson's for the share of the range
    (:func:`~mage_rl.eval.stats.bounded`).
    """
    groups: dict[str, list[float]] = defaultdict(list)
    for value, key in zip(values, strata, strict=True):
        groups[key].append(float(value))
    n = sum(len(v) for v in groups.values())
    if n == 0:
        return Estimate(None, None, None, 0)
    total = sum(weights[k] for k in groups)
    means = {k: sum(v) / len(v) for k, v in groups.items()}
    dof = n - len(groups)
    pooled = (
        sum((x - means[k]) ** 2 for k, v in groups.items() for x in v) / dof if dof > 0 else 0.0
    )
    mean = sum(weights[k] / total * means[k] for k in groups)
    var = 0.0
    for k, v in groups.items():
        s2 = sum((x - means[k]) ** 2 for x in v) / (len(v) - 1) if len(v) > 1 else pooled
        var += (weights[k] / total) ** 2 * s2 / len(v)
    if dof <= 0:
        return Estimate(mean, None, None, n)
    half = t_quantile(level, dof) * math.sqrt(var)
    return bounded(Estimate(mean, mean - half, mean + half, n), *bounds, level=level)


def error_bar(estimate: dict[str, Any]) -> tuple[float, float]:
    """How far an interval reaches below and above its estimate, for ``yerr``.

    Never negative: rounding may put an end a hair on the wrong side of the mean (a Wilson
    interval of a rate of 1 ends at 0.9999999999999998), which matplotlib refuses. An
    estimate without an interval reaches nowhere.
    """
    mean, low, high = estimate["mean"], estimate.get("low"), estimate.get("high")
    below = mean - low if low is not None else 0.0
    above = high - mean if high is not None else 0.0
    return max(0.0, below), max(0.0, above)
