"""The lab's statistics, shared by every question: means that skip missing values, the compact
numbers saved runs keep, and the paired statistics (Student's t interval, the exact sign test)."""

import math
from typing import List


def compact(x):
    """A float to 5 significant digits (what the tables print, and some); NaN as None."""
    if isinstance(x, float):
        return None if math.isnan(x) else float(f"{x:.5g}")
    return x


def number(x) -> float:
    """A stored value as a number: None (a NaN, compacted) back to NaN, which prints as nan."""
    return float("nan") if x is None else x


def mean_of(values: List) -> float:
    values = [v for v in values if v is not None]  # None: no such rollout in that batch
    return sum(values) / len(values) if values else float("nan")


def mean_std(values: List[float]) -> tuple:
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1) if len(values) > 1 else 0.0
    return mean, math.sqrt(var)



def t_quantile(p: float, df: int) -> float:
    """Student's t quantile: the x with P(T <= x) = p for T with df degrees of freedom, by
    bisection on the CDF, which is 1/2 + the density integrated from 0 to x (Simpson's rule)."""
    if not (0.5 <= p < 1 and df >= 1):
        raise ValueError(f"t_quantile needs 0.5 <= p < 1 and df >= 1, got p={p}, df={df}")
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)

    def cdf(x, n=2000):
        h = x / n
        f = [math.exp(log_c - (df + 1) / 2 * math.log1p((i * h) ** 2 / df)) for i in range(n + 1)]
        return 0.5 + h / 3 * (f[0] + f[-1] + 4 * sum(f[1:-1:2]) + 2 * sum(f[2:-1:2]))
    low, high = 0.0, 1.0
    while cdf(high) < p:
        high *= 2
    for _ in range(50):
        mid = (low + high) / 2
        low, high = (mid, high) if cdf(mid) < p else (low, mid)
    return (low + high) / 2


def sign_test_p(plus: int, minus: int) -> float:
    """The exact two-sided sign test: under "no effect" each seed's difference is + or - with
    probability 1/2 (ties dropped), so P = 2 P(Binomial(n, 1/2) <= the smaller count), at most 1."""
    n, k = plus + minus, min(plus, minus)
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n) if n else 1.0


def paired_stats(diffs: List[float], digits: int = 6) -> dict:
    """Per-seed differences -> their mean, its 95 % t-interval, the sign counts and the sign
    test's p. A difference that rounds to 0 at `digits` decimals, as the table prints it, is a
    tie: the compact copies keep 5 significant digits, so two equal sums of truncated answers
    can differ in the 8th decimal. One seed gives no interval (nan)."""
    n = len(diffs)
    mean, sd = mean_std(diffs)
    half = t_quantile(0.975, n - 1) * sd / math.sqrt(n) if n > 1 else float("nan")
    signs = [round(d, digits) for d in diffs]
    plus, minus = sum(d > 0 for d in signs), sum(d < 0 for d in signs)
    return dict(n=n, mean=mean, low=mean - half, high=mean + half, plus=plus, minus=minus,
                zero=n - plus - minus, p=sign_test_p(plus, minus))
