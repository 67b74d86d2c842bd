"""The F distribution, for the extra-sum-of-squares test of :mod:`.fit` (no scipy needed).

:func:`f_critical` is the upper quantile the test compares against, found by bisection on the
CDF; the CDF is the regularized incomplete beta function, evaluated by its continued fraction.
Pure arithmetic, no numpy.
"""

from __future__ import annotations

import functools
import math


@functools.lru_cache(maxsize=256)
def f_critical(dfn: int, dfd: float, significance: float) -> float:
    """The upper ``significance`` quantile of the F distribution, by bisection on its CDF."""
    low, high = 0.0, 1.0
    while f_cdf(high, dfn, dfd) < 1 - significance:
        high *= 2
    for _ in range(100):
        middle = (low + high) / 2
        if f_cdf(middle, dfn, dfd) < 1 - significance:
            low = middle
        else:
            high = middle
    return high


def f_cdf(value: float, dfn: float, dfd: float) -> float:
    return incomplete_beta(dfn / 2, dfd / 2, dfn * value / (dfn * value + dfd))


def incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), by its continued fraction (Lentz)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    if x > (a + 1) / (a + b + 2):
        return 1.0 - incomplete_beta(b, a, 1 - x)
    log_front = a * math.log(x) + b * math.log1p(-x) - math.log(a)
    log_front -= math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    result = d
    for m in range(1, 300):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            result *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return math.exp(log_front) * result


__all__ = ["f_cdf", "f_critical", "incomplete_beta"]
