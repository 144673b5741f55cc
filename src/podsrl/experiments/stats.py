"""Small statistics for comparisons over seeds: exact Student-t quantiles and mean +- 95% CI.

No scipy: the t distribution's CDF is the regularized incomplete beta function, evaluated
by its continued fraction (modified Lentz), and the quantile is found by bisection. Tested
against published t tables (tests/test_stats.py).
"""

from __future__ import annotations

import math
import statistics


def _beta_continued_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of I_x(a, b), converging for x < (a + 1) / (a + b + 2)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    fraction = d
    for k in range(1, 1000):
        for numerator in (k * (b - k) * x / ((a + 2 * k - 1) * (a + 2 * k)),  # even step
                          -(a + k) * (a + b + k) * x / ((a + 2 * k) * (a + 2 * k + 1))):  # odd step
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            fraction *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return fraction


def regularized_incomplete_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b) for a, b > 0 and 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                 + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_continued_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_continued_fraction(b, a, 1.0 - x) / b


def t_cdf(t: float, dof: float) -> float:
    """P(T <= t) for Student's t with ``dof`` degrees of freedom."""
    tail = 0.5 * regularized_incomplete_beta(dof / 2.0, 0.5, dof / (dof + t * t))  # P(T > |t|)
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, dof: float) -> float:
    """The p-quantile of Student's t with ``dof`` > 0 degrees of freedom (0 < p < 1)."""
    if not 0.0 < p < 1.0 or dof <= 0:
        raise ValueError(f"t_quantile needs 0 < p < 1 and dof > 0, got p={p}, dof={dof}")
    if p < 0.5:
        return -t_quantile(1.0 - p, dof)
    low, high = 0.0, 1.0
    while t_cdf(high, dof) < p:  # bracket the quantile
        high *= 2.0
    for _ in range(200):  # bisection to float precision
        middle = 0.5 * (low + high)
        if t_cdf(middle, dof) < p:
            low = middle
        else:
            high = middle
        if high - low <= 1e-14 * max(1.0, high):
            break
    return 0.5 * (low + high)


def mean_ci(values: list[float], confidence: float = 0.95) -> tuple[float, float]:
    """Mean and the half-width of its two-sided t confidence interval (nan with one value)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, float("nan")
    if not all(math.isfinite(v) for v in values):
        return mean, float("nan")
    quantile = t_quantile(0.5 + confidence / 2.0, len(values) - 1)
    return mean, quantile * statistics.stdev(values) / math.sqrt(len(values))
