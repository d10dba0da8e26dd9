"""When requests are sent under a request rate, and the load that was actually achieved.

The arrival process follows vLLM's `bench serve`: gaps between sends are drawn from a gamma
distribution with shape = burstiness and scale = 1 / (rate * burstiness), so the mean gap is 1/rate
whatever the burstiness. Burstiness 1 is a Poisson process (exponential gaps); below 1 the sends
come in bursts, above 1 they are more regular, and infinity is a constant rate. An infinite rate
sends everything at t0 (LMDeploy's `profile_restful_api.py` default).

Two choices differ between the tools, so here they are spelled out:
- The first request goes out at t0, as in `profile_restful_api.py`. vLLM also draws a gap before
  the first send, which only adds idle time to the measured duration. So n requests have n - 1 gaps.
- The gaps are rescaled so they add up to exactly (n - 1) / rate, as vLLM rescales its delays: the
  schedule then offers exactly the requested rate for every seed, and seeds differ only in how the
  sends bunch up. "Achieved" below is therefore about the client: how late it sent, not the draw.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .errors import ConfigError


def send_offsets(n: int, request_rate: float, burstiness: float = 1.0, seed: int = 0) -> np.ndarray:
    """Seconds after t0 at which each of `n` requests is sent (non-decreasing, the first at 0)."""
    if n < 0:
        raise ConfigError(f"The number of requests must be 0 or more, not {n}.")
    if not request_rate > 0:
        raise ConfigError(f"The request rate must be above 0 requests/s (inf sends all at once), not {request_rate}.")
    if not burstiness > 0:
        raise ConfigError(f"Burstiness must be above 0 (1 is a Poisson process), not {burstiness}.")
    if n == 0:
        return np.zeros(0)
    if math.isinf(request_rate):
        return np.zeros(n)
    if math.isinf(burstiness):
        gaps = np.full(n - 1, 1.0 / request_rate)
    else:
        rng = np.random.default_rng(seed)
        gaps = rng.gamma(shape=burstiness, scale=1.0 / (request_rate * burstiness), size=n - 1)
        total = gaps.sum()
        if total > 0:
            gaps *= (n - 1) / request_rate / total
    return np.concatenate(([0.0], np.cumsum(gaps)))


def achieved_rate(send_times: Sequence[float] | np.ndarray) -> float:
    """Requests per second between the first and the last send: (n - 1) / span.

    Inf when everything went out at the same instant, NaN with fewer than two sends.
    """
    times = np.asarray(send_times, dtype=float)
    if times.size < 2:
        return math.nan
    span = float(times.max() - times.min())
    return math.inf if span == 0 else (times.size - 1) / span


def in_flight_over_time(starts: Sequence[float] | np.ndarray, ends: Sequence[float] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The number of requests in flight as a step function: `(times, counts)`.

    `counts[i]` holds from `times[i]` until `times[i + 1]`. A request is in flight over [start, end);
    when one ends at the instant another starts, the end counts first, so a client that keeps N in
    flight never shows N + 1.
    """
    starts, ends = np.asarray(starts, dtype=float), np.asarray(ends, dtype=float)
    times = np.concatenate((starts, ends))
    steps = np.concatenate((np.ones(starts.size, dtype=int), -np.ones(ends.size, dtype=int)))
    order = np.lexsort((steps, times))  # by time, then -1 before +1
    return times[order], np.cumsum(steps[order])


@dataclass(frozen=True)
class ArrivalReport:
    """The load asked for next to the load the client delivered (rates in requests/s, lags in s)."""

    requested_rate: float
    achieved_rate: float
    mean_send_lag_s: float  # sent minus scheduled: waiting for a max-concurrency slot, or a busy client
    max_send_lag_s: float
    peak_in_flight: int
    sent: int


def arrival_report(
    requested_rate: float,
    scheduled: Sequence[float] | np.ndarray,
    sent: Sequence[float] | np.ndarray,
    ended: Sequence[float] | np.ndarray,
) -> ArrivalReport:
    """Summarise the requests that were sent: `scheduled` and `sent` times on one clock, `ended` too."""
    scheduled, sent = np.asarray(scheduled, dtype=float), np.asarray(sent, dtype=float)
    lags = sent - scheduled
    _, counts = in_flight_over_time(sent, ended)
    return ArrivalReport(
        requested_rate=requested_rate,
        achieved_rate=achieved_rate(sent),
        mean_send_lag_s=float(lags.mean()) if lags.size else 0.0,
        max_send_lag_s=float(lags.max()) if lags.size else 0.0,
        peak_in_flight=int(counts.max()) if counts.size else 0,
        sent=int(sent.size),
    )
