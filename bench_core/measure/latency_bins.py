"""A live run's latencies folded into fixed log-spaced bins: constant memory, and a constant-size snapshot.

A live snapshot used to carry every TTFT and ITL value seen so far, so each one published by the engine
process grew with the run (640,000 ITL values at 5,000 requests of 128 tokens, pickled four times a
second). Bins of fixed edges keep what the live view draws and tabulates (histogram, count, mean, std,
min, max, percentiles) at a fixed size whatever the run's length.

Each bin is `GROWTH` (1%) wider than the one below, from `LOWEST_S` to `HIGHEST_S`, with one bin below and
one above for what falls outside. Count, mean, std, min and max are exact (running sums); a percentile
is read from the bins and is within one bin's width, 1% of its value, of numpy's exact one. The ended
view recomputes everything exactly from the per-request table.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .metrics import Distribution

LOWEST_S = 1e-5
HIGHEST_S = 1e4
GROWTH = 1.01
_INNER_BINS = math.ceil(math.log(HIGHEST_S / LOWEST_S) / math.log(GROWTH))
# Edges of every bin: [0, LOWEST_S), the log-spaced ones, then [last edge, inf).
EDGES_S = np.concatenate([[0.0], LOWEST_S * GROWTH ** np.arange(_INNER_BINS + 1), [np.inf]])
N_BINS = EDGES_S.size - 1


def bin_of(values_s: np.ndarray) -> np.ndarray:
    """The bin index of each value (finite, non-negative)."""
    with np.errstate(divide="ignore"):
        inner = np.floor(np.log(values_s / LOWEST_S) / math.log(GROWTH)).astype(np.int64) + 1
    return np.clip(inner, 0, N_BINS - 1, out=inner)


@dataclass(frozen=True)
class BinnedLatencies:
    """One latency metric's values so far, as bin counts (aligned with EDGES_S) and running sums."""

    counts: np.ndarray
    count: int
    total_s: float
    total_squares: float
    min_s: float
    max_s: float

    @classmethod
    def of(cls, values_s: Sequence[float] | np.ndarray) -> BinnedLatencies:
        bins = LatencyBins()
        bins.add(np.asarray(values_s, dtype=np.float64))
        return bins.frozen()

    def distribution(self, percentiles: Sequence[float]) -> Distribution:
        """The same statistics as metrics.distribution; percentiles within 1% (see the module docstring)."""
        if self.count == 0:
            nan = math.nan
            return Distribution(0, nan, nan, nan, nan, tuple(nan for _ in percentiles))
        mean = self.total_s / self.count
        std = math.sqrt(max(self.total_squares / self.count - mean * mean, 0.0))
        return Distribution(
            self.count, mean, std, self.min_s, self.max_s, tuple(self._percentile(q) for q in percentiles)
        )

    def _percentile(self, q: float) -> float:
        # As numpy's linear method: percentile q lies at rank (n - 1) q / 100 of the sorted values, between
        # the two values whose ranks surround it; each of those is read from its bin.
        rank = (self.count - 1) * q / 100.0
        cumulative = np.cumsum(self.counts)
        below, above = math.floor(rank), math.ceil(rank)
        low_value = self._value_at(below, cumulative)
        high_value = low_value if above == below else self._value_at(above, cumulative)
        return low_value + (rank - below) * (high_value - low_value)

    def _value_at(self, rank: int, cumulative: np.ndarray) -> float:
        """The value of this rank in sorted order, taking a bin's values as spread evenly across it."""
        b = int(np.searchsorted(cumulative, rank, side="right"))
        before = cumulative[b] - self.counts[b]
        low, high = max(EDGES_S[b], self.min_s), min(EDGES_S[b + 1], self.max_s)
        value = low + (high - low) * (rank - before + 0.5) / self.counts[b]
        return float(min(max(value, self.min_s), self.max_s))

    def bin_centres_s(self) -> np.ndarray:
        """The middle of each bin that holds values, kept within [min, max], aligned with `nonzero_counts`."""
        held = np.flatnonzero(self.counts)
        centres = (EDGES_S[held] + np.minimum(EDGES_S[held + 1], self.max_s)) / 2
        return np.clip(centres, self.min_s, self.max_s)

    def nonzero_counts(self) -> np.ndarray:
        return self.counts[self.counts > 0]


class LatencyBins:
    """The accumulator: add values as they come, take a frozen `BinnedLatencies` when asked."""

    def __init__(self) -> None:
        self._counts = np.zeros(N_BINS, dtype=np.int64)
        self._count = 0
        self._total = 0.0
        self._total_squares = 0.0
        self._min = math.inf
        self._max = -math.inf

    def add(self, values_s: np.ndarray) -> None:
        values_s = values_s[np.isfinite(values_s)]
        if values_s.size == 0:
            return
        self._counts += np.bincount(bin_of(values_s), minlength=N_BINS)
        self._count += int(values_s.size)
        self._total += float(values_s.sum())
        self._total_squares += float(np.dot(values_s, values_s))
        self._min = min(self._min, float(values_s.min()))
        self._max = max(self._max, float(values_s.max()))

    def frozen(self) -> BinnedLatencies:
        counts = self._counts.copy()
        counts.flags.writeable = False
        return BinnedLatencies(counts, self._count, self._total, self._total_squares, self._min, self._max)
