"""When requests are sent under a request rate, and the load that was actually achieved.

By default the schedule is LMDeploy's `profile_restful_api.py` (`get_request`): the first request
goes out at t0, and after each send the client waits a gap drawn from numpy's global legacy
generator (`np.random.exponential(1 / rate)`), which its main() seeds with `--seed` before sampling
the dataset. So n requests have n - 1 gaps, and the same flags offer the same schedule in both
tools. `datasets.Sample.arrival_rng` is that generator as LMDeploy leaves it after sampling.

Burstiness is vLLM's `bench serve`: gamma gaps with shape = burstiness and scale = 1 / (rate *
burstiness), so the mean gap is 1/rate whatever the burstiness; 1 is a Poisson process (numpy's
legacy gamma of shape 1 is its exponential, draw for draw), below 1 the sends come in bursts, above
1 they are more regular, and infinity is a constant rate. An infinite rate sends everything at t0.

`exact_rate` rescales the drawn gaps so they add up to exactly (n - 1) / rate, as vLLM does (a
Poisson process conditioned on its count): every seed then offers exactly the requested rate and
differs only in how the sends bunch up. Without it a short run's drawn rate differs from the one
asked (63 gaps at rate 1 took 54.2 s with seed 1), which is why the report shows the achieved rate.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..config import check_values
from ..errors import ConfigError


def send_offsets(
    n: int,
    request_rate: float,
    burstiness: float = 1.0,
    seed: int | np.random.RandomState = 0,
    exact_rate: bool = False,
) -> np.ndarray:
    """Seconds after t0 at which each of `n` requests is sent (non-decreasing, the first at 0).

    `seed`: an int, or a legacy `RandomState` in the state to draw from (a copy draws: it is not
    advanced, so a repeated run offers the same schedule).
    """
    if n < 0:
        raise ConfigError(f"The number of requests must be 0 or more, not {n}.")
    check_values(request_rate=request_rate, burstiness=burstiness)
    if n == 0:
        return np.zeros(0)
    if math.isinf(request_rate):
        return np.zeros(n)
    if math.isinf(burstiness):
        gaps = np.full(n - 1, 1.0 / request_rate)
    else:
        rng = copy.deepcopy(seed) if isinstance(seed, np.random.RandomState) else np.random.RandomState(seed)
        gaps = rng.gamma(shape=burstiness, scale=1.0 / (request_rate * burstiness), size=n - 1)
        total = gaps.sum()
        if exact_rate and total > 0:
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


def in_flight_over_time(
    starts: Sequence[float] | np.ndarray, ends: Sequence[float] | np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
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
