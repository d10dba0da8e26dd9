"""The steady-state window of a run and its time slices: pure functions over the per-request table.

A run's whole-run figures (LMDeploy's) run from the first request sent to the last answer, ramp-up and drain
included. The steady window is the part of the run where the load was the one asked for:

- it starts when the requests in flight first reach their target: a closed loop's concurrency (at most the number
  of requests); an open loop's (a request rate, a trace) mean in flight between its first and last send, where
  its arrivals keep it on average (Little's law). `--warmup-seconds` starts it at that time instead;
- it ends at the last request sent: an open loop gets no more arrivals after it (where they thin out before, as
  in a trace's quiet end, `--cooldown-seconds` cuts them). A closed loop holds its target until the first request
  ends after its last send (in a batch, every request is sent at once and waits for a slot, so that is when the
  queue has emptied). `--cooldown-seconds` ends it that long before the run's end.

Over the window: requests sent in it give the latencies (TTFT, TPOT, E2E); tokens whose tick falls in it give the
output throughput; completed requests that ended in it give the request throughput. `time_slices` gives the same
per slice of a run. The catalog's steady-window metrics are formulas over `WindowFacts` (measure/catalog.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..config.catalog import AT_ONCE
from ..load.arrivals import in_flight_over_time
from ..states import RequestStatus

# The settings that place the steady window and cut the time slices: every engine command's flags.
WINDOW_SETTINGS = ("window_warmup_s", "window_cooldown_s", "time_slice_s")


@dataclass(frozen=True)
class SteadyLoad:
    """What a run's steady window is measured against: the in-flight count a closed loop holds (None: an open
    loop, whose target is its mean), the user's warm-up and cool-down (None: found from the in-flight count), and
    the length of its time slices (None: no slices)."""

    target_in_flight: int | None = None
    warmup_s: float | None = None
    cooldown_s: float | None = None
    slice_s: float | None = None


def steady_load(config) -> SteadyLoad:
    """The steady load a run of `config` (a RunConfig) asked for."""
    load = config.load
    return SteadyLoad(
        target_in_flight=load.concurrency if load.load_pattern in AT_ONCE else None,  # a closed loop's
        warmup_s=load.window_warmup_s,
        cooldown_s=load.window_cooldown_s,
        slice_s=load.time_slice_s,
    )


@dataclass(frozen=True)
class Window:
    """[start_s, end_s], seconds from the run's start."""

    start_s: float
    end_s: float

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    def holds(self, times_s: np.ndarray) -> np.ndarray:
        """Which of these times fall in the window, both ends included (NaN: none)."""
        return (times_s >= self.start_s) & (times_s <= self.end_s)


@dataclass(frozen=True)
class WindowFacts:
    """What the requests did within a window: the catalog's steady-window formulas read these."""

    window: Window
    sent: int  # requests sent in the window
    ended: int  # completed requests that ended in it
    output_tokens: int  # output tokens of completed requests whose tick fell in it
    ttft_s: np.ndarray  # of the completed requests sent in it (empty when the run did not stream)
    tpot_s: np.ndarray
    e2e_s: np.ndarray


def request_spans(table: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Each request's send and end (seconds from the run's start; NaN where it was not sent, or did not end): the
    client's own times where it recorded them (sent_s, ended_s), else its first and last tick."""
    if "sent_s" in table:
        return _floats(table, "sent_s"), _floats(table, "ended_s")
    return _floats(table, "start_s"), _floats(table, "finish_s")


def steady_window(sends: np.ndarray, ends: np.ndarray, duration_s: float, load: SteadyLoad) -> Window | None:
    """The window in which the load was steady (module docstring); None where the run had none (nothing sent, or a
    warm-up and cool-down that leave nothing)."""
    sent = ~np.isnan(sends)
    if not sent.any() or not duration_s > 0:
        return None
    sends = sends[sent]
    ends = np.where(np.isnan(ends[sent]), duration_s, ends[sent])  # a request that never ended was in flight to the end
    times, counts = in_flight_over_time(sends, ends)
    last_send = float(sends.max())
    closed = load.target_in_flight is not None
    target: float = (
        min(load.target_in_flight, sends.size)
        if load.target_in_flight is not None
        else _mean_in_flight(times, counts, sends.min(), last_send)
    )
    reached = times[counts >= target]
    start = load.warmup_s if load.warmup_s is not None else float(reached[0]) if reached.size else math.nan
    if load.cooldown_s is not None:
        end = duration_s - load.cooldown_s
    elif closed:  # the first fall below the target once nothing is left to send (an end at the last send, which
        # took that end's slot, is no fall)
        fall = (times > last_send) & (counts < target)
        end = float(times[fall][0]) if fall.any() else duration_s
    else:  # an open loop: no arrival after it (a quiet tail, such as a trace's, is cut by --cooldown-seconds)
        end = last_send
    return Window(start, end) if end > start else None


def _mean_in_flight(times: np.ndarray, counts: np.ndarray, first: float, last: float) -> float:
    """The time-weighted mean of the in-flight step function over [first, last]; at one instant, its count there."""
    if not last > first:
        return float(counts[times <= first][-1])
    edges = np.clip(np.append(times, last), first, last)
    return float(np.sum(counts * np.diff(edges)) / (last - first))


@dataclass(frozen=True)
class RequestTimes:
    """A run's requests on its clock (seconds from its start), read once from its per-request table for the window
    and every slice: sends and ends (request_spans), which completed, their latencies, and when each output tick of
    a completed request came with how many tokens."""

    sends: np.ndarray
    ends: np.ndarray
    ok: np.ndarray
    ttft_s: np.ndarray
    tpot_s: np.ndarray
    e2e_s: np.ndarray
    tick_s: np.ndarray
    tick_tokens: np.ndarray


def request_times(table: pd.DataFrame) -> RequestTimes:
    """The RequestTimes of a per-request table (Profiler.request_table's)."""
    sends, ends = request_spans(table)
    ok = table["status"].to_numpy(dtype=object) == RequestStatus.SUCCESS
    tick_s, tick_tokens = _output_ticks(table, ok)
    return RequestTimes(
        sends,
        ends,
        ok,
        _floats(table, "ttft_s"),
        _floats(table, "tpot_s"),
        _floats(table, "e2e_s"),
        tick_s,
        tick_tokens,
    )


def window_facts(requests: RequestTimes, window: Window, stream_output: bool) -> WindowFacts:
    """What the requests did within `window`, both its ends included."""
    sent = window.holds(requests.sends)
    inside = requests.ok & sent
    return WindowFacts(
        window=window,
        sent=int(np.count_nonzero(sent)),
        ended=int(np.count_nonzero(requests.ok & window.holds(requests.ends))),
        output_tokens=int(requests.tick_tokens[window.holds(requests.tick_s)].sum()),
        ttft_s=_defined(requests.ttft_s[inside]) if stream_output else np.array([]),
        tpot_s=_defined(requests.tpot_s[inside]),
        e2e_s=_defined(requests.e2e_s[inside]),
    )


def _output_ticks(table: pd.DataFrame, selected: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """When the selected requests' output ticks came and with how many tokens: tick k of a request (k >= 1) comes
    its TTFT and its first k - 1 gaps after its first tick. A table without its ticks (stored before they were)
    puts every token at the request's end."""
    starts = _floats(table, "start_s")
    if "tokens_per_tick" not in table or "itl_s" not in table:
        return (starts + _floats(table, "e2e_s"))[selected], table["output_len"].to_numpy(dtype=np.int64)[selected]
    steps = [_array(cell, np.int64) for cell in table["tokens_per_tick"].to_numpy(dtype=object)[selected]]
    gaps = [_array(cell, np.float64) for cell in table["itl_s"].to_numpy(dtype=object)[selected]]
    n_steps = np.fromiter(map(len, steps), dtype=np.int64, count=len(steps))
    n_gaps = np.fromiter(map(len, gaps), dtype=np.int64, count=len(gaps))
    # A request of two ticks or more has one gap fewer than its token steps; one of fewer ticks has no output tick.
    timed = np.flatnonzero((n_steps > 0) & (n_steps == n_gaps + 1))
    if not timed.size:
        return np.array([]), np.array([], dtype=np.int64)
    lengths = n_steps[timed]
    # Each request's gaps behind a 0, summed along: its ticks' times after its first output tick.
    flat = np.concatenate([gaps[i] for i in timed.tolist()])
    firsts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    offsets = np.cumsum(np.insert(flat, np.concatenate(([0], np.cumsum(lengths - 1)[:-1])), 0.0))
    offsets -= np.repeat(offsets[firsts], lengths)
    first_tick = (starts + _floats(table, "ttft_s"))[selected][timed]
    return np.repeat(first_tick, lengths) + offsets, np.concatenate([steps[i] for i in timed.tolist()])


def steady_facts(
    requests: RequestTimes, duration_s: float, stream_output: bool, load: SteadyLoad
) -> WindowFacts | None:
    """The steady window's facts of a run (None where it had no window)."""
    window = steady_window(requests.sends, requests.ends, duration_s, load)
    return None if window is None else window_facts(requests, window, stream_output)


MAX_TIME_SLICES = 1000  # a run's slices kept: a line each in the CLI, a part of one history cell


@dataclass(frozen=True)
class TimeSlice:
    """One slice of a run: the requests sent in it, the output tokens whose tick fell in it, and the mean TTFT of
    the completed requests sent in it (NaN where none, or the run did not stream)."""

    window: Window
    sent: int
    output_tokens: int
    mean_ttft_s: float


def time_slices(requests: RequestTimes, duration_s: float, slice_s: float, stream_output: bool) -> list[TimeSlice]:
    """The run cut into slices of `slice_s` seconds from its start, the last one shorter and holding the run's end;
    at most the first MAX_TIME_SLICES."""
    if not (duration_s > 0 and slice_s > 0):
        return []
    count = min(math.ceil(duration_s / slice_s), MAX_TIME_SLICES)

    def per_slice(times: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
        index = np.floor(times / slice_s)
        index = np.where(times == duration_s, count - 1, index)  # the run's last instant: the last slice's
        kept = (index >= 0) & (index < count)
        chosen = None if weights is None else weights[kept]
        return np.bincount(index[kept].astype(np.int64), weights=chosen, minlength=count)[:count]

    sent = per_slice(requests.sends)
    tokens = per_slice(requests.tick_s, requests.tick_tokens.astype(np.float64))
    timed = requests.ok & ~np.isnan(requests.ttft_s) & stream_output
    with np.errstate(divide="ignore", invalid="ignore"):
        mean_ttft = per_slice(requests.sends[timed], requests.ttft_s[timed]) / per_slice(requests.sends[timed])
    return [
        TimeSlice(
            Window(k * slice_s, min((k + 1) * slice_s, duration_s)), int(sent[k]), int(tokens[k]), float(mean_ttft[k])
        )
        for k in range(count)
    ]


def _array(cell, dtype) -> np.ndarray:
    return np.asarray([] if cell is None else cell, dtype=dtype)


def _floats(table: pd.DataFrame, column: str) -> np.ndarray:
    # A table without the column (one built from an import's or an old run's rows) has no times: NaN, so no window.
    if column not in table:
        return np.full(len(table), np.nan)
    return table[column].to_numpy(dtype=np.float64)


def _defined(values: np.ndarray) -> np.ndarray:
    return values[~np.isnan(values)]
