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
GROUP_COLUMNS = ("n", "mean", "std", "min", "max", "ci_low", "ci_high")
# Below this many runs a 95% t-interval is no use: with 2, t(0.975, 1) = 12.7 makes it 9 standard deviations wide.
MIN_INTERVAL_RUNS = 3
TOO_FEW_FOR_INTERVAL = f"too few runs for a 95% interval (it needs {MIN_INTERVAL_RUNS}): the range of the runs"
UNBOUNDED = (-math.inf, math.inf)


@dataclass(frozen=True)
class Summary:
    """Repeats of one metric: `std` is the sample standard deviation (ddof=1) and the coefficient of
    variation (std / mean) are NaN below two values, the confidence interval below `MIN_INTERVAL_RUNS`
    (then `minimum` and `maximum`, the range of the runs, are what is known of the spread)."""

    n: int
    mean: float
    std: float
    ci_low: float
    ci_high: float
    cv: float
    minimum: float = math.nan
    maximum: float = math.nan


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


def describe(
    values: Sequence[float] | np.ndarray | pd.Series,
    confidence: float = CONFIDENCE,
    bounds: tuple[float, float] = UNBOUNDED,
) -> Summary:
    """Mean, sample std, range and the Student-t confidence interval of the mean, cut at `bounds` (the
    quantity's physical range: a throughput's interval never goes below 0); non-finite values are ignored."""
    x = _finite(values)
    n = int(x.size)
    if n == 0:
        return Summary(0, math.nan, math.nan, math.nan, math.nan, math.nan)
    mean, minimum, maximum = float(x.mean()), float(x.min()), float(x.max())
    if n == 1:
        return Summary(1, mean, math.nan, math.nan, math.nan, math.nan, minimum, maximum)
    std = float(x.std(ddof=1))
    cv = std / abs(mean) if mean != 0 else math.nan
    if n < MIN_INTERVAL_RUNS:
        return Summary(n, mean, std, math.nan, math.nan, cv, minimum, maximum)
    half_width = _half_width(std, n, confidence)
    low, high = bounds
    return Summary(n, mean, std, max(mean - half_width, low), min(mean + half_width, high), cv, minimum, maximum)


def relative_margin_of_error(values: Sequence[float] | np.ndarray | pd.Series, confidence: float = CONFIDENCE) -> float:
    """The half-width of the Student-t interval of the mean, divided by the mean's magnitude (GuideLLM's margin of
    error: 0.05 is +/-5%); NaN below `MIN_INTERVAL_RUNS` finite values, where no interval is drawn, and for a mean of
    0, which no relative margin describes. Identical values have a margin of 0. Non-finite values are ignored."""
    x = _finite(values)
    if x.size < MIN_INTERVAL_RUNS:
        return math.nan
    mean = float(x.mean())
    if mean == 0:
        return math.nan
    return _half_width(float(x.std(ddof=1)), int(x.size), confidence) / abs(mean)


def _half_width(std: float, n: int, confidence: float) -> float:
    """The half-width of the Student-t interval of a mean of `n` values with sample std `std`."""
    return t_quantile(0.5 + confidence / 2, n - 1) * std / math.sqrt(n)


def compare(
    a_values: Sequence[float] | np.ndarray | pd.Series,
    b_values: Sequence[float] | np.ndarray | pd.Series,
    confidence: float = CONFIDENCE,
) -> Comparison:
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
    return Comparison(
        a,
        b,
        difference,
        relative,
        p_value < 1 - confidence,
        WELCH,
        p_value,
        difference - half_width,
        difference + half_width,
        df,
    )


@dataclass(frozen=True)
class Ratio:
    """Mean of B over mean of A on paired values, with its bootstrap interval; NaN where fewer than 2 pairs."""

    value: float
    low: float
    high: float
    n: int


_PICKS_PER_BLOCK = 1_000_000


def paired_ratio(
    a_values: Sequence[float] | np.ndarray,
    b_values: Sequence[float] | np.ndarray,
    confidence: float = CONFIDENCE,
    resamples: int = 2000,
    seed: int = 0,
) -> Ratio:
    """mean(B) / mean(A) over the pairs (a_i, b_i) both finite: the same request in two runs of the same prompts.
    The interval resamples the pairs (a percentile bootstrap), so that what the requests share, their lengths, cancels
    out of the ratio rather than widening it."""
    a, b = np.asarray(a_values, dtype=np.float64), np.asarray(b_values, dtype=np.float64)
    both = np.isfinite(a) & np.isfinite(b)
    a, b = a[both], b[both]
    if a.size < 2 or a.sum() == 0:
        return Ratio(math.nan, math.nan, math.nan, int(a.size))
    # Drawn in blocks of about a million picks: 2,000 resamples of a 5,000-request run at once held 80 MB per metric
    # on every rerun of the page that shows it. The generator's stream is the same, block by block.
    rng = np.random.default_rng(seed)
    block = max(1, _PICKS_PER_BLOCK // a.size)
    ratios = np.empty(resamples)
    for start in range(0, resamples, block):
        picks = rng.integers(0, a.size, size=(min(block, resamples - start), a.size))
        with np.errstate(divide="ignore", invalid="ignore"):
            ratios[start : start + len(picks)] = b[picks].sum(axis=1) / a[picks].sum(axis=1)
    tail = (1 - confidence) / 2 * 100
    low, high = np.nanpercentile(ratios, [tail, 100 - tail])
    return Ratio(float(b.sum() / a.sum()), float(low), float(high), int(a.size))


def group_repeats(
    runs: pd.DataFrame,
    keys: Sequence[str],
    metric: str,
    confidence: float = CONFIDENCE,
    bounds: tuple[float, float] = UNBOUNDED,
) -> pd.DataFrame:
    """One row per distinct combination of `keys` (a sweep point): the key values, then n, mean, std,
    min, max, ci_low and ci_high of `metric` (`describe`), sorted by the keys. Runs without a value for
    `metric` (failed ones) do not count; a point with none left is dropped."""
    keys = list(keys)
    columns = [*keys, *GROUP_COLUMNS]
    if runs.empty or metric not in runs or any(key not in runs for key in keys):
        return pd.DataFrame(columns=columns)
    values = pd.to_numeric(runs[metric], errors="coerce")
    rows = []
    for key_values, part in values.groupby([runs[key] for key in keys], sort=True, dropna=False):
        summary = describe(part, confidence, bounds)
        if summary.n:
            rows.append([*key_values, *group_values(summary)])
    return pd.DataFrame(rows, columns=columns)


def group_values(summary: Summary) -> list[float]:
    """A summary's values in `GROUP_COLUMNS` order."""
    return [summary.n, summary.mean, summary.std, summary.minimum, summary.maximum, summary.ci_low, summary.ci_high]


def pareto_front(
    x: Sequence[float] | np.ndarray | pd.Series,
    y: Sequence[float] | np.ndarray | pd.Series,
    x_larger_better: bool,
    y_larger_better: bool,
) -> np.ndarray:
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


# How the goodput chart marks its limit, said on the chart: with batched requests TTFT includes the queue, so
# attainment can rise with load, and stopping at the first load that misses would deny loads that meet the target.
LOAD_LIMIT_RULE = (
    "Marked: the highest load whose mean meets the target, interpolated towards the next load, which misses"
)


def highest_load_meeting(
    load: Sequence[float] | np.ndarray | pd.Series, value: Sequence[float] | np.ndarray | pd.Series, target: float
) -> float | None:
    """The highest load at which `value` (goodput or SLO attainment: larger is better) reaches `target`
    (`LOAD_LIMIT_RULE`).

    Repeats at the same load are averaged first. The highest load whose mean meets the target is the limit,
    moved on to where the straight line to the next load (which misses) crosses the target; lower loads that
    miss do not hide it (`loads_missing_below` names them). None when no load meets the target.
    """
    levels, means = _means_per_load(load, value)
    meets = np.flatnonzero(means >= target)
    if meets.size == 0:
        return None
    lo = meets[-1]
    if lo == levels.size - 1:
        return float(levels[lo])
    hi = lo + 1
    fraction = (means[lo] - target) / (means[lo] - means[hi])
    return float(levels[lo] + fraction * (levels[hi] - levels[lo]))


def loads_missing_below(
    load: Sequence[float] | np.ndarray | pd.Series,
    value: Sequence[float] | np.ndarray | pd.Series,
    target: float,
    limit: float,
) -> list[float]:
    """The loads under `limit` whose mean misses the target: where there are any, the value does not fall
    steadily with load, and the limit is not a load below which everything meets it."""
    levels, means = _means_per_load(load, value)
    return [float(level) for level, mean in zip(levels, means) if level < limit and mean < target]


def _means_per_load(load, value) -> tuple[np.ndarray, np.ndarray]:
    """The distinct finite loads, ascending, and the mean value at each."""
    loads = np.asarray(load, dtype=np.float64)
    values = np.asarray(value, dtype=np.float64)
    keep = np.isfinite(loads) & np.isfinite(values)
    if not keep.any():
        return np.array([]), np.array([])
    levels, where = np.unique(loads[keep], return_inverse=True)
    return levels, np.bincount(where, weights=values[keep]) / np.bincount(where)


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
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
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
