"""The arrival process (vLLM's gamma/Poisson gaps, first send at t0) and the load-achieved helpers."""

import math

import numpy as np
import pytest

from bench_core.errors import ConfigError
from bench_core.load.arrivals import achieved_rate, arrival_report, in_flight_over_time, send_offsets

MANY = 40_001  # 40,000 gaps: the sample CV^2 is then within a few percent of its expectation


def gaps(n: int, rate: float, burstiness: float, seed: int = 0) -> np.ndarray:
    return np.diff(send_offsets(n, rate, burstiness, seed))


def test_an_infinite_rate_sends_everything_at_t0():
    assert send_offsets(5, math.inf).tolist() == [0.0] * 5


def test_the_first_request_goes_out_at_t0_and_sends_never_go_back_in_time():
    offsets = send_offsets(100, 4.0, 0.5, seed=3)
    assert offsets[0] == 0.0
    assert np.all(np.diff(offsets) >= 0)
    assert send_offsets(0, 4.0).size == 0
    assert send_offsets(1, 4.0).tolist() == [0.0]


def test_poisson_gaps_average_one_over_the_rate_and_look_exponential():
    g = gaps(MANY, 5.0, 1.0)
    assert g.mean() == pytest.approx(1 / 5.0, rel=0.02)
    assert g.std() / g.mean() == pytest.approx(1.0, abs=0.03)  # exponential: CV 1
    assert np.mean(g < g.mean()) == pytest.approx(1 - math.exp(-1), abs=0.01)  # P(X < mean) of an exponential


@pytest.mark.parametrize("burstiness", [0.25, 4.0])
def test_burstiness_sets_the_spread_of_gaps_but_not_their_mean(burstiness):
    g = gaps(MANY, 5.0, burstiness)
    assert g.mean() == pytest.approx(0.2, rel=0.03)
    assert (g.std() / g.mean()) ** 2 == pytest.approx(1 / burstiness, rel=0.05)  # gamma shape k: CV^2 = 1/k


def test_lower_burstiness_bunches_requests_more():
    assert gaps(MANY, 5.0, 0.25).var() > gaps(MANY, 5.0, 1.0).var() > gaps(MANY, 5.0, 4.0).var()


def test_infinite_burstiness_is_a_constant_rate():
    assert np.allclose(gaps(6, 2.0, math.inf), 0.5)


def test_a_seed_gives_the_same_schedule_and_another_seed_another():
    assert np.array_equal(send_offsets(50, 3.0, seed=7), send_offsets(50, 3.0, seed=7))
    assert not np.array_equal(send_offsets(50, 3.0, seed=7), send_offsets(50, 3.0, seed=8))


@pytest.mark.parametrize(
    "n, rate, burstiness", [(-1, 1.0, 1.0), (3, 0.0, 1.0), (3, -2.0, 1.0), (3, math.nan, 1.0), (3, 1.0, 0.0)]
)
def test_impossible_arrival_settings_are_refused_with_a_clear_message(n, rate, burstiness):
    with pytest.raises(ConfigError, match="must be"):
        send_offsets(n, rate, burstiness)


def test_achieved_rate_counts_gaps_over_the_span_of_sends():
    assert achieved_rate([1.0, 1.5, 2.0, 3.0]) == pytest.approx(1.5)
    assert achieved_rate([2.0, 2.0]) == math.inf
    assert math.isnan(achieved_rate([2.0]))


def test_an_exact_rate_schedule_offers_exactly_the_requested_rate():
    assert achieved_rate(send_offsets(200, 7.5, 0.5, seed=1, exact_rate=True)) == pytest.approx(7.5)
    assert achieved_rate(send_offsets(200, 7.5, 0.5, seed=1)) != pytest.approx(7.5)  # a draw is only near it


def test_back_to_back_requests_are_never_counted_in_flight_together():
    times, counts = in_flight_over_time([0.0, 1.0, 2.0], [1.0, 2.0, 3.0])
    assert counts.max() == 1
    assert counts[-1] == 0
    assert np.all(np.diff(times) >= 0)


def test_overlapping_requests_show_in_the_in_flight_count():
    _, counts = in_flight_over_time([0.0, 0.5, 0.6], [1.0, 0.7, 2.0])
    assert counts.tolist() == [1, 2, 3, 2, 1, 0]


def test_the_arrival_report_puts_requested_next_to_achieved():
    report = arrival_report(10.0, scheduled=[0.0, 0.1, 0.2], sent=[0.0, 0.15, 0.2], ended=[0.3, 0.3, 0.3])
    assert report.requested_rate == 10.0
    assert report.achieved_rate == pytest.approx(10.0)
    assert report.mean_send_lag_s == pytest.approx(0.05 / 3)
    assert report.max_send_lag_s == pytest.approx(0.05)
    assert report.peak_in_flight == 3
    assert report.sent == 3
