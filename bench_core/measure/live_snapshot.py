"""What a run looks like so far, for a page that polls while sessions tick in another thread.

The tracker is incremental: it keeps a cursor per session and reads only the ticks added since the
last snapshot, and drops a session from its scan list once it is finished and fully read, so a poll
costs about the work done since the previous one. Ticks are read by slicing each session's `ts`
and `ns` (lists while it runs, arrays once finished; a slice is an atomic copy under the GIL) up to
min(len(ts), len(ns)); the tick thread takes no lock. A lock guards the tracker's own state, so two
pollers are safe.

A request is in flight from its admission (`Session.admit`, when the profiler records admissions; else
its first tick, LMDeploy's convention) until it finishes or the run ends. Where the caller knows the
engine runs at most `max_in_flight` requests at once but cannot see which (LMDeploy's batch call takes
every request at t0 and admits them behind its own max_batch_size), the count is capped there.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from time import perf_counter

import numpy as np
import pandas as pd

from .latency_bins import BinnedLatencies, LatencyBins


@dataclass(frozen=True)
class LiveSnapshot:
    """Counts and series at one moment. Times are seconds since the profiler started.

    `time_s` holds the start of each `bin_s`-wide bin; `output_tokens_per_s` and `in_flight_over_time`
    (requests in flight at the end of each bin) are aligned with it. While running, only whole bins
    are listed. `ttft` and `itl` hold every value seen so far, of all requests (finished or not), in
    fixed bins: the snapshot's size grows with the run's duration (its bins of time), not its requests.
    """

    elapsed_s: float
    finished: bool
    total_requests: int
    completed: int
    failed: int  # finished without the requested tokens: failed or incomplete
    cancelled: int
    in_flight: int
    not_started: int
    output_tokens: int
    # Work done and asked for, in output tokens: an ended request counts as all its tokens done.
    tokens_done: int
    tokens_requested: int
    # What says how far the run is (measure.time_left): when its first output token came and when the latest
    # request to produce began to (seconds since the start; None: none yet, as in a batched prefill), how many
    # requests in flight have begun to produce, and the most tokens one of those still has to produce.
    first_output_s: float | None
    latest_first_token_s: float | None
    decoding: int
    longest_left: int
    bin_s: float
    time_s: np.ndarray
    output_tokens_per_s: np.ndarray
    in_flight_over_time: np.ndarray
    ttft: BinnedLatencies
    itl: BinnedLatencies
    # The hardware samples of the last TELEMETRY_WINDOW_S (telemetry.py's long table, time_s since the profiler
    # started): bounded, like the latency bins, however long the run. None where nothing samples the run.
    telemetry: pd.DataFrame | None = None
    # The server's own metrics over the whole run, one row per quantity and read (server_metrics.py's unified
    # series, time_s since the profiler started): at one read a second, a few rows a second. None: not read.
    server_metrics: pd.DataFrame | None = None


class _GrowingArray:
    """Per-bin totals of a series whose number of bins grows with the run."""

    def __init__(self) -> None:
        self._data = np.zeros(1024)
        self.size = 0

    def _reserve(self, size: int) -> None:
        if size > self._data.size:
            grown = np.zeros(max(size, 2 * self._data.size))
            grown[: self.size] = self._data[: self.size]
            self._data = grown

    def add_at(self, positions: np.ndarray, weights: np.ndarray) -> None:
        """Add weights into per-position totals (bins), growing the buffer to cover every position."""
        if positions.size == 0:
            return
        sums = np.bincount(positions, weights=weights)
        self._reserve(sums.size)
        self._data[: sums.size] += sums
        self.size = max(self.size, sums.size)

    def padded(self, length: int) -> np.ndarray:
        out = np.zeros(length)
        n = min(length, self.size)
        out[:n] = self._data[:n]
        return out


class LiveTracker:
    """Incremental reader of a profiler's sessions (see the module docstring)."""

    def __init__(self, bin_s: float = 0.5, records_admissions: bool = False, max_in_flight: int | None = None) -> None:
        if not bin_s > 0:
            raise ValueError("bin_s must be positive")
        self.bin_s = bin_s
        self.records_admissions = records_admissions
        self.max_in_flight = max_in_flight
        self._lock = threading.Lock()
        self._cursor: list[int] = []  # ticks read so far, per session
        self._admitted: list[bool] = []  # per session: counted in flight and not counted out yet
        self._scanning: list[int] = []  # sessions that may still tick or finish
        self._origin: float | None = None
        self._latest_tick = -math.inf
        self._producing: list[bool] = []  # per session: its first output token was read
        self._first_output = math.inf
        self._latest_first_token = -math.inf
        self._decoding = 0
        self._longest_left = 0
        self._started = 0
        self._finished_started = 0
        self._run_end_counted = False
        self._completed = 0
        self._failed = 0
        self._cancelled = 0
        self._output_tokens = 0
        self._tokens_requested = 0
        self._ended_tokens_output = 0  # output tokens of ended requests
        self._ended_tokens_requested = 0
        self._tokens_per_bin = _GrowingArray()
        self._in_flight_change_per_bin = _GrowingArray()
        self._ttft = LatencyBins()
        self._itl = LatencyBins()

    def snapshot(self, sessions: Sequence, t_start: float | None, t_finish: float | None) -> LiveSnapshot:
        """`sessions` need ts, ns, req_output_len, admit_time, status flags (finished, completed,
        cancelled) and finish_time, as profiler.Session has."""
        with self._lock:
            total = len(sessions)
            known = len(self._cursor)
            self._scanning.extend(range(known, total))
            self._cursor.extend([0] * (total - known))
            self._admitted.extend([False] * (total - known))
            self._producing.extend([False] * (total - known))
            self._tokens_requested += sum(sessions[i].req_output_len for i in range(known, total))
            if self._origin is None:
                self._origin = t_start
            self._count_finished(self._read_new_ticks(sessions))
            if t_finish is not None and not self._run_end_counted:
                self._end_in_flight(t_finish)
            return self._build(total, t_finish)

    def _read_new_ticks(self, sessions: Sequence) -> list:
        """Consume the ticks added since the last call; return the sessions that are now done."""
        flat_ts: list[float] = []
        flat_ns: list[int] = []
        first_index, lengths, admitted_at = [], [], []
        still_scanning, done = [], []
        decoding, longest_left = 0, 0
        cursor, admitted, producing = self._cursor, self._admitted, self._producing
        by_admission = self.records_admissions
        for i in self._scanning:
            sess = sessions[i]
            # Read the finish mark before the ticks and the admission: both precede it.
            finished = sess.finished
            if (
                not finished and sess.admit_time is None and not sess.ts
            ):  # not started: the common case early in a long run
                still_scanning.append(i)
                continue
            if by_admission and not admitted[i] and sess.admit_time is not None:
                admitted[i] = True
                admitted_at.append(sess.admit_time)
            ts, ns = sess.ts, sess.ns
            n = min(len(ts), len(ns))
            read = cursor[i]
            if n > read:
                if not by_admission and read == 0:  # LMDeploy's convention: tick 0 starts the request
                    admitted[i] = True
                    admitted_at.append(ts[0])
                lo = read - 1 if read else 0  # re-read the last tick already seen, to difference against it
                flat_ts += ts[lo:n]
                flat_ns += ns[lo:n]
                first_index.append(lo if read else -1)  # -1: this part starts at the session's tick 0
                lengths.append(n - lo)
                cursor[i] = n
                if not producing[i] and ns[n - 1] > 0:
                    producing[i] = True
                    first = next(ts[k] for k in range(read, n) if ns[k] > 0)
                    self._first_output = min(self._first_output, first)
                    self._latest_first_token = max(self._latest_first_token, first)
            if finished:
                done.append(i)
            else:
                still_scanning.append(i)
                if n and ns[n - 1] > 0:
                    decoding += 1
                    longest_left = max(longest_left, sess.req_output_len - ns[n - 1])
        self._scanning = still_scanning
        self._decoding, self._longest_left = decoding, longest_left
        if admitted_at:
            self._change_in_flight(np.array(admitted_at), +1)
        if lengths:
            self._add_ticks(
                np.fromiter(flat_ts, dtype=np.float64, count=len(flat_ts)),
                np.fromiter(flat_ns, dtype=np.int64, count=len(flat_ns)),
                np.array(first_index, dtype=np.int64),
                np.array(lengths, dtype=np.int64),
            )
        return [(sessions[i], admitted[i]) for i in done]

    def _change_in_flight(self, times: np.ndarray, step: int) -> None:
        if self._origin is None:
            self._origin = float(times.min())
        if step > 0:
            self._started += times.size
        else:
            self._finished_started += times.size
        self._in_flight_change_per_bin.add_at(self._bin(times), np.full(times.size, float(step)))

    def _add_ticks(self, ts: np.ndarray, ns: np.ndarray, first_index: np.ndarray, lengths: np.ndarray) -> None:
        """Fold new ticks (per session: the previous tick, when there is one, then the new ones) in;
        `first_index` is -1 for a part that starts at the session's tick 0."""
        part_start = np.cumsum(lengths) - lengths
        from_tick0 = first_index < 0
        fresh = part_start[from_tick0]
        if self._origin is None:
            self._origin = float(ts.min())
        self._latest_tick = max(self._latest_tick, float(ts.max()))
        # Tokens each new tick added: its step from the previous tick; a tick 0 counts its own tokens;
        # a re-read previous tick adds nothing.
        added = np.empty(ts.size)
        added[1:] = np.diff(ns)
        added[part_start] = 0.0
        added[fresh] = ns[fresh]
        self._tokens_per_bin.add_at(self._bin(ts), added)
        self._output_tokens += int(added.sum())
        # Tick 1 of a session sits right after its tick 0 in a part that starts there (new, or re-read: 0).
        second = part_start[(first_index <= 0) & (lengths >= 2)] + 1
        gaps = np.diff(ts)  # gaps[k - 1] is the gap before tick k of the flat list
        self._ttft.add(gaps[second - 1])
        is_itl = np.ones(ts.size, dtype=bool)
        is_itl[part_start] = False
        is_itl[second] = False
        self._itl.add(gaps[is_itl[1:]])

    def _bin(self, times: np.ndarray) -> np.ndarray:
        bins = ((times - self._origin) * (1.0 / self.bin_s)).astype(np.int64)
        return np.maximum(bins, 0, out=bins)

    def _count_finished(self, done: list) -> None:
        """Count sessions that finished and were fully read; those that were admitted leave the in-flight count."""
        ended_at = []
        for sess, was_admitted in done:
            if sess.completed:
                self._completed += 1
            elif sess.cancelled:
                self._cancelled += 1
            else:
                self._failed += 1
            self._ended_tokens_output += sess.ns[-1] if len(sess.ns) else 0
            self._ended_tokens_requested += sess.req_output_len
            if was_admitted:
                ended_at.append(sess.ts[-1] if sess.finish_time is None else sess.finish_time)
        if ended_at:
            self._change_in_flight(np.array(ended_at), -1)

    def _end_in_flight(self, t_finish: float) -> None:
        """Once the run has ended nothing is in flight: requests it left unfinished leave the count then."""
        self._run_end_counted = True
        left = [i for i in self._scanning if self._admitted[i]]
        for i in left:
            self._admitted[i] = False  # should it still finish, it is not counted out twice
        if left:
            self._change_in_flight(np.full(len(left), t_finish), -1)

    def _build(self, total: int, t_finish: float | None) -> LiveSnapshot:
        finished, origin = t_finish is not None, self._origin
        if origin is None:
            elapsed = 0.0
        elif t_finish is not None:
            elapsed = t_finish - origin
        else:
            # Replayed ticks may lie on another clock than now; never end before the latest tick.
            elapsed = max(perf_counter(), self._latest_tick) - origin
        whole_bins = max(int(elapsed // self.bin_s), 0)
        n_bins = (
            max(math.ceil(elapsed / self.bin_s), self._tokens_per_bin.size, self._in_flight_change_per_bin.size)
            if finished
            else whole_bins
        )
        time_s = np.arange(n_bins) * self.bin_s
        bin_seconds = np.full(n_bins, self.bin_s)
        if finished and n_bins and elapsed - time_s[-1] > 0:
            bin_seconds[-1] = min(self.bin_s, elapsed - time_s[-1])  # the last bin is partial
        cap = math.inf if self.max_in_flight is None else self.max_in_flight
        in_flight = int(min(self._started - self._finished_started, cap))
        in_flight_over_time = np.cumsum(self._in_flight_change_per_bin.padded(n_bins)).round().astype(np.int64)
        ended = self._completed + self._failed + self._cancelled
        return LiveSnapshot(
            elapsed_s=max(elapsed, 0.0),
            finished=finished,
            total_requests=total,
            completed=self._completed,
            failed=self._failed,
            cancelled=self._cancelled,
            in_flight=in_flight,
            not_started=total - ended - in_flight,
            output_tokens=self._output_tokens,
            tokens_done=self._output_tokens - self._ended_tokens_output + self._ended_tokens_requested,
            tokens_requested=self._tokens_requested,
            # A first output comes after the origin is set.
            first_output_s=None if origin is None or self._first_output == math.inf else self._first_output - origin,
            latest_first_token_s=None
            if origin is None or self._first_output == math.inf
            else self._latest_first_token - origin,
            decoding=0 if finished else self._decoding,
            longest_left=0 if finished else self._longest_left,
            bin_s=self.bin_s,
            time_s=time_s,
            output_tokens_per_s=self._tokens_per_bin.padded(n_bins) / bin_seconds,
            in_flight_over_time=np.minimum(in_flight_over_time, cap).astype(np.int64),
            ttft=self._ttft.frozen(),
            itl=self._itl.frozen(),
        )


# What the live telemetry chart shows: at 10 Hz, 600 rows per series.
TELEMETRY_WINDOW_S = 60.0


def with_telemetry(snap: LiveSnapshot, recent_samples: pd.DataFrame, origin: float) -> LiveSnapshot:
    """The snapshot with the hardware samples it is given (the last TELEMETRY_WINDOW_S of them, on the
    profiler's clock), their times made seconds since `origin` (the profiler's start) like the other series.
    The frame is the caller's fresh one (TelemetrySampler.samples), shifted in place: this runs at every publish."""
    recent_samples["time_s"] -= origin
    return dataclasses.replace(snap, telemetry=recent_samples)


def with_server_metrics(snap: LiveSnapshot, series: pd.DataFrame, origin: float) -> LiveSnapshot:
    """The snapshot with the server's unified series so far (a fresh frame, shifted in place like the telemetry)."""
    series["time_s"] -= origin
    return dataclasses.replace(snap, server_metrics=series)
