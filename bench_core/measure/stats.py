"""Statistics over repeated runs: spread, confidence intervals, comparisons, Pareto fronts, SLO limits.

A benchmark measured once says nothing about how much it moves from run to run. Repeats of a sweep
point give a mean, a sample standard deviation and a Student-t confidence interval for any metric;
`compare` says whether two sets of runs differ by more than that spread (Welch's t-test, which does
not assume equal variances). scipy is not a dependency, so the Student t distribution is computed
here from the regularized incomplete beta function (the continued fraction of Numerical Recipes,
§6.4): exact to about 1e-12, for any degrees of freedom, fractional ones included (Welch's are).

Pure functions on numbers and frames: no I/O, no plotting.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

CONFIDENCE = 0.95
SIGNIFICANCE = 0.05
WELCH = "Welch's t-test"
TOO_FEW_RUNS = "too few runs (a spread needs at least 2 on each side)"
GROUP_COLUMNS = ("n", "mean", "std", "ci_low", "ci_high")


@dataclass(frozen=True)
class Summary:
    """Repeats of one metric: `std` is the sample standard deviation (ddof=1); the confidence
    interval and the coefficient of variation (std / mean) are NaN below two values."""

    n: int
    mean: float
    std: float
    ci_low: float
    ci_high: float
    cv: float


@dataclass(frozen=True)
class Comparison:
    """B against A: `difference` = mean(B) - mean(A), `relative` = difference / |mean(A)|.

    `significant` is True when Welch's two-sided p-value is below `SIGNIFICANCE` (the 95% interval
    of the difference then excludes 0), False when it is not, and None when either side has fewer
    than two runs, so there is no run-to-run spread to judge the difference against.
    """

    a: Summary
    b: Summary
    difference: float
    relative: float
    significant: bool | None
    method: str
    p_value: float
    ci_low: float
    ci_high: float
    df: float


def describe(values: Sequence[float] | np.ndarray | pd.Series, confidence: float = CONFIDENCE) -> Summary:
    """Mean, sample std and the Student-t confidence interval of the mean; non-finite values are ignored."""
    x = _finite(values)
    n = int(x.size)
    if n == 0:
        return Summary(0, math.nan, math.nan, math.nan, math.nan, math.nan)
    mean = float(x.mean())
    if n == 1:
        return Summary(1, mean, math.nan, math.nan, math.nan, math.nan)
    std = float(x.std(ddof=1))
    half_width = t_quantile(0.5 + confidence / 2, n - 1) * std / math.sqrt(n)
    cv = std / abs(mean) if mean != 0 else math.nan
    return Summary(n, mean, std, mean - half_width, mean + half_width, cv)


def compare(a_values: Sequence[float] | np.ndarray | pd.Series, b_values: Sequence[float] | np.ndarray | pd.Series,
            confidence: float = CONFIDENCE) -> Comparison:
    """Whether B's mean differs from A's by more than their run-to-run spread (Welch's t-test)."""
    a, b = describe(a_values, confidence), describe(b_values, confidence)
    difference = b.mean - a.mean
    relative = difference / abs(a.mean) if a.mean else math.nan
    if a.n < 2 or b.n < 2:
        nan = math.nan
        return Comparison(a, b, difference, relative, None, TOO_FEW_RUNS, nan, nan, nan, nan)
    va, vb = a.std**2 / a.n, b.std**2 / b.n
    se = math.sqrt(va + vb)
    if se == 0:  # identical repeats on both sides: any difference is beyond a spread of zero
        p_value = 0.0 if difference else 1.0
        df = float(a.n + b.n - 2)
        return Comparison(a, b, difference, relative, bool(difference), WELCH, p_value, difference, difference, df)
    df = (va + vb) ** 2 / (va**2 / (a.n - 1) + vb**2 / (b.n - 1))  # Welch-Satterthwaite
    p_value = 2 * t_sf(abs(difference) / se, df)
    half_width = t_quantile(0.5 + confidence / 2, df) * se
    return Comparison(a, b, difference, relative, p_value < 1 - confidence, WELCH, p_value,
                      difference - half_width, difference + half_width, df)


def group_repeats(runs: pd.DataFrame, keys: Sequence[str], metric: str, confidence: float = CONFIDENCE) -> pd.DataFrame:
    """One row per distinct combination of `keys` (a sweep point): the key values, then n, mean, std,
    ci_low and ci_high of `metric`, sorted by the keys. Runs without a value for `metric` (failed
    ones) do not count; a point with none left is dropped."""
    keys = list(keys)
    columns = [*keys, *GROUP_COLUMNS]
    if runs.empty or metric not in runs or any(key not in runs for key in keys):
        return pd.DataFrame(columns=columns)
    values = pd.to_numeric(runs[metric], errors="coerce")
    rows = []
    for key_values, part in values.groupby([runs[key] for key in keys], sort=True, dropna=False):
        summary = describe(part, confidence)
        if summary.n:
            rows.append([*key_values, summary.n, summary.mean, summary.std, summary.ci_low, summary.ci_high])
    return pd.DataFrame(rows, columns=columns)


def pareto_front(x: Sequence[float] | np.ndarray | pd.Series, y: Sequence[float] | np.ndarray | pd.Series,
                 x_larger_better: bool, y_larger_better: bool) -> np.ndarray:
    """True for each point that no other point dominates (at least as good on both axes, better on one).

    Equal points do not dominate each other, so both stay on the front; NaN points are never on it.
    """
    gx = np.asarray(x, dtype=np.float64) * (1 if x_larger_better else -1)
    gy = np.asarray(y, dtype=np.float64) * (1 if y_larger_better else -1)
    valid = np.isfinite(gx) & np.isfinite(gy)
    at_least_as_good = (gx[:, None] >= gx[None, :]) & (gy[:, None] >= gy[None, :])
    better_somewhere = (gx[:, None] > gx[None, :]) | (gy[:, None] > gy[None, :])
    dominated = (at_least_as_good & better_somewhere & valid[:, None]).any(axis=0)
    return valid & ~dominated


def highest_load_meeting(load: Sequence[float] | np.ndarray | pd.Series,
                         value: Sequence[float] | np.ndarray | pd.Series, target: float) -> float | None:
    """The highest load at which `value` (goodput or SLO attainment: larger is better) still reaches `target`.

    Repeats at the same load are averaged first. Walking up the loads, the limit lies between the
    last load that meets the target and the first that does not, where the straight line between
    the two crosses it; later loads that meet it again are noise past the limit. None when even the
    lowest load misses; the highest load measured when none misses.
    """
    loads = np.asarray(load, dtype=np.float64)
    values = np.asarray(value, dtype=np.float64)
    keep = np.isfinite(loads) & np.isfinite(values)
    if not keep.any():
        return None
    levels, where = np.unique(loads[keep], return_inverse=True)
    means = np.bincount(where, weights=values[keep]) / np.bincount(where)
    misses = np.flatnonzero(means < target)
    if misses.size == 0:
        return float(levels[-1])
    first_miss = misses[0]
    if first_miss == 0:
        return None
    lo, hi = first_miss - 1, first_miss
    fraction = (means[lo] - target) / (means[lo] - means[hi])
    return float(levels[lo] + fraction * (levels[hi] - levels[lo]))


# ---- Student t distribution ------------------------------------------------------------------

def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` degrees of freedom (df > 0, fractional allowed)."""
    tail = t_sf(abs(t), df)
    return 1 - tail if t >= 0 else tail


def t_sf(t: float, df: float) -> float:
    """P(T > t) for t >= 0: I_{df/(df+t²)}(df/2, 1/2) / 2, computed without cancellation in the tail."""
    return 0.5 * _regularized_incomplete_beta(df / 2, 0.5, df / (df + t * t))


def t_quantile(p: float, df: float) -> float:
    """The t with P(T <= t) = p, by bisection on `t_cdf` (monotone, so it always converges)."""
    if not 0 < p < 1:
        raise ValueError(f"a quantile needs 0 < p < 1, got {p}")
    if p < 0.5:
        return -t_quantile(1 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        lo, hi = hi, hi * 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-13 * hi:
            break
    return (lo + hi) / 2


def _regularized_incomplete_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b); the continued fraction converges fast for x < (a+1)/(a+b+2), else use the symmetry
    I_x(a, b) = 1 - I_{1-x}(b, a)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1) / (a + b + 2):
        return math.exp(log_front) * _beta_continued_fraction(a, b, x) / a
    return 1 - math.exp(log_front) * _beta_continued_fraction(b, a, 1 - x) / b


def _beta_continued_fraction(a: float, b: float, x: float) -> float:
    """The incomplete beta continued fraction by the modified Lentz method."""
    tiny, eps = 1e-300, 1e-15
    c, d = 1.0, 1 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    result = d
    for m in range(1, 500):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1 + numerator * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + numerator / c
            c = c if abs(c) > tiny else tiny
            result *= d * c
        if abs(d * c - 1) < eps:
            break
    return result


def _finite(values) -> np.ndarray:
    x = pd.to_numeric(pd.Series(values, dtype=object), errors="coerce").to_numpy(dtype=np.float64)
    return x[np.isfinite(x)]
