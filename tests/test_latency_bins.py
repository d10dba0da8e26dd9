"""A live run's latencies in fixed bins: exact count/mean/std/min/max, percentiles within 1%, constant size."""

import pickle

import numpy as np
import pytest

from bench_core.measure import metrics
from bench_core.measure.latency_bins import GROWTH, N_BINS, BinnedLatencies, LatencyBins
from bench_core.measure.profiler import Profiler

PERCENTILES = [1, 25, 50, 75, 90, 95, 99, 99.9]


@pytest.mark.parametrize(
    "values",
    [
        np.random.default_rng(0).lognormal(-4.0, 1.0, 50_000),  # ITL-like, milliseconds with a long tail
        np.random.default_rng(1).exponential(2.0, 300),  # TTFT-like, seconds
        np.array([0.25]),
        np.array([0.1, 0.1, 0.1]),
        np.array([3e-6, 0.5, 2e4]),  # below and above the log-spaced range
    ],
    ids=["lognormal", "exponential", "one", "ties", "outside-the-range"],
)
def test_statistics_match_numpys_exact_ones(values):
    exact = metrics.distribution(values, PERCENTILES)
    binned = BinnedLatencies.of(values).distribution(PERCENTILES)
    assert (binned.count, binned.min, binned.max) == (exact.count, exact.min, exact.max)
    assert binned.mean == pytest.approx(exact.mean, rel=1e-9)
    assert binned.std == pytest.approx(exact.std, rel=1e-6, abs=1e-12)
    inside = (values.min() >= 1e-5) and (values.max() <= 1e4)
    for q, ours, theirs in zip(PERCENTILES, binned.percentiles, exact.percentiles):
        if inside:
            assert ours == pytest.approx(theirs, rel=GROWTH - 1), f"p{q}"
        assert exact.min <= ours <= exact.max


def test_values_added_in_parts_give_what_they_give_at_once():
    values = np.random.default_rng(2).lognormal(-3.0, 0.5, 10_000)
    bins = LatencyBins()
    for part in np.array_split(values, 7):
        bins.add(part)
    parts, whole = bins.frozen(), BinnedLatencies.of(values)
    assert np.array_equal(parts.counts, whole.counts)
    assert (parts.count, parts.min_s, parts.max_s) == (whole.count, whole.min_s, whole.max_s)
    assert parts.total_s == pytest.approx(whole.total_s)


def test_no_values_give_nan_statistics_and_undefined_values_are_left_out():
    empty = BinnedLatencies.of([]).distribution([50])
    assert empty.count == 0 and np.isnan(empty.mean) and np.isnan(empty.percentiles[0])
    assert BinnedLatencies.of([0.1, np.nan, np.inf]).count == 1


def test_a_live_snapshot_has_the_same_size_at_any_number_of_requests():
    """What the engine process publishes four times a second must not grow with the run's requests."""

    def snapshot_bytes(n_requests: int) -> int:
        prof = Profiler(True, [50, 99])
        prof.start(0.0)
        rng = np.random.default_rng(n_requests)
        for _ in range(n_requests):
            sess = prof.new_session(8, 64)
            for n, t in enumerate(np.cumsum(rng.exponential(0.02, 65))):
                sess.tick_at(n, float(t) % 5.0 + n * 1e-6)
            sess.finish(sess.SUCCESS, timestamp=5.0)
        prof.finish(5.0)
        snap = prof.live_snapshot()
        assert snap.itl.count == n_requests * 63
        return len(pickle.dumps(snap))

    small, large = snapshot_bytes(10), snapshot_bytes(2_000)
    assert large == pytest.approx(small, rel=0.05)
    assert large < 3 * 8 * N_BINS  # two histograms and the time series: tens of kB, not 126,000 values
