"""What a run looks like so far, for a page that polls while sessions tick in another thread.

The tracker is incremental: it keeps a cursor per session and reads only the ticks added since the
last snapshot, and drops a session from its scan list once it is finished and fully read, so a poll
costs about the work done since the previous one. Ticks are read by slicing each session's `ts`
and `ns` (lists while it runs, arrays once finished; a slice is an atomic copy under the GIL) up to
min(len(ts), len(ns)); the tick thread takes no lock. A lock guards the tracker's own state, so two
pollers are safe.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from time import perf_counter

import numpy as np


@dataclass(frozen=True)
class LiveSnapshot:
    """Counts and series at one moment. Times are seconds since the profiler started.

    `time_s` holds the start of each `bin_s`-wide bin; `output_tokens_per_s` and `in_flight_over_time`
    (requests in flight at the end of each bin) are aligned with it. While running, only whole bins
    are listed. `ttft_s` and `itl_s` hold every value seen so far, of all requests (finished or not).
    """

    elapsed_s: float
    finished: bool
    total_requests: int
    completed: int
    failed: int  # finished without the requested tokens: failed or incomplete
    in_flight: int
    not_started: int
    output_tokens: int
    bin_s: float
    time_s: np.ndarray
    output_tokens_per_s: np.ndarray
    in_flight_over_time: np.ndarray
    ttft_s: np.ndarray
    itl_s: np.ndarray


class _GrowingArray:
    """An append-only float buffer whose read-only prefix views stay valid as it grows."""

    def __init__(self) -> None:
        self._data = np.zeros(1024)
        self.size = 0

    def _reserve(self, size: int) -> None:
        if size > self._data.size:
            grown = np.zeros(max(size, 2 * self._data.size))
            grown[: self.size] = self._data[: self.size]
            self._data = grown

    def extend(self, values: np.ndarray) -> None:
        self._reserve(self.size + values.size)
        self._data[self.size: self.size + values.size] = values
        self.size += values.size

    def add_at(self, positions: np.ndarray, weights: np.ndarray) -> None:
        """Add weights into per-position totals (bins), growing the buffer to cover every position."""
        if positions.size == 0:
            return
        sums = np.bincount(positions, weights=weights)
        self._reserve(sums.size)
        self._data[: sums.size] += sums
        self.size = max(self.size, sums.size)

    def view(self) -> np.ndarray:
        """Values so far. Later appends write past this prefix or into a new buffer, never into it."""
        prefix = self._data[: self.size]
        prefix.flags.writeable = False
        return prefix

    def padded(self, length: int) -> np.ndarray:
        out = np.zeros(length)
        n = min(length, self.size)
        out[:n] = self._data[:n]
        return out


class LiveTracker:
    """Incremental reader of a profiler's sessions (see the module docstring)."""

    def __init__(self, bin_s: float = 0.5) -> None:
        if not bin_s > 0:
            raise ValueError("bin_s must be positive")
        self.bin_s = bin_s
        self._lock = threading.Lock()
        self._cursor: list[int] = []  # ticks read so far, per session
        self._scanning: list[int] = []  # sessions that may still tick or finish
        self._origin: float | None = None
        self._latest_tick = -math.inf
        self._started = 0
        self._finished_started = 0
        self._completed = 0
        self._failed = 0
        self._output_tokens = 0
        self._tokens_per_bin = _GrowingArray()
        self._in_flight_change_per_bin = _GrowingArray()
        self._ttft = _GrowingArray()
        self._itl = _GrowingArray()

    def snapshot(self, sessions: Sequence, t_start: float | None, t_finish: float | None) -> LiveSnapshot:
        """`sessions` need ts, ns, finished, completed and finish_time, as profiler.Session has."""
        with self._lock:
            total = len(sessions)
            self._scanning.extend(range(len(self._cursor), total))
            self._cursor.extend([0] * (total - len(self._cursor)))
            if self._origin is None:
                self._origin = t_start
            self._count_finished(self._read_new_ticks(sessions))
            return self._build(total, t_finish)

    def _read_new_ticks(self, sessions: Sequence) -> list:
        """Consume the ticks added since the last call; return the sessions that are now done."""
        flat_ts: list[float] = []
        flat_ns: list[int] = []
        first_index, lengths = [], []
        still_scanning, done = [], []
        cursor = self._cursor
        for i in self._scanning:
            sess = sessions[i]
            # Read the finish mark before the ticks: every tick of a finished session precedes it.
            finished = sess.finished
            ts, ns = sess.ts, sess.ns
            n = min(len(ts), len(ns))
            read = cursor[i]
            if n > read:
                lo = read - 1 if read else 0  # re-read the last tick already seen, to difference against it
                flat_ts += ts[lo:n]
                flat_ns += ns[lo:n]
                first_index.append(lo)
                lengths.append(n - lo)
                cursor[i] = n
            if finished:
                done.append(sess)
            else:
                still_scanning.append(i)
        self._scanning = still_scanning
        if lengths:
            self._add_ticks(np.fromiter(flat_ts, dtype=np.float64, count=len(flat_ts)),
                            np.fromiter(flat_ns, dtype=np.int64, count=len(flat_ns)),
                            np.array(first_index, dtype=np.int64), np.array(lengths, dtype=np.int64))
        return done

    def _add_ticks(self, ts: np.ndarray, ns: np.ndarray, first_index: np.ndarray, lengths: np.ndarray) -> None:
        """Fold new ticks (per session: the previous tick, when there is one, then the new ones) in."""
        part_start = np.cumsum(lengths) - lengths
        fresh = part_start[first_index == 0]  # parts whose first tick is the session's tick 0
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
        self._started += fresh.size
        self._in_flight_change_per_bin.add_at(self._bin(ts[fresh]), np.ones(fresh.size))
        # Tick 1 of a session sits right after its tick 0, which is in the part (new or re-read).
        second = part_start[(first_index == 0) & (lengths >= 2)] + 1
        gaps = np.diff(ts)  # gaps[k - 1] is the gap before tick k of the flat list
        self._ttft.extend(gaps[second - 1])
        is_itl = np.ones(ts.size, dtype=bool)
        is_itl[part_start] = False
        is_itl[second] = False
        self._itl.extend(gaps[is_itl[1:]])

    def _bin(self, times: np.ndarray) -> np.ndarray:
        bins = ((times - self._origin) * (1.0 / self.bin_s)).astype(np.int64)
        return np.maximum(bins, 0, out=bins)

    def _count_finished(self, done: list) -> None:
        """Count sessions that finished and were fully read; those that had started leave the in-flight count."""
        ended_at = []
        for sess in done:
            if sess.completed:
                self._completed += 1
            else:
                self._failed += 1
            if len(sess.ts):
                ended_at.append(sess.ts[-1] if sess.finish_time is None else sess.finish_time)
        if ended_at:
            self._finished_started += len(ended_at)
            self._in_flight_change_per_bin.add_at(self._bin(np.array(ended_at)), np.full(len(ended_at), -1.0))

    def _build(self, total: int, t_finish: float | None) -> LiveSnapshot:
        finished = t_finish is not None
        if self._origin is None:
            elapsed = 0.0
        elif finished:
            elapsed = t_finish - self._origin
        else:
            # Replayed ticks may lie on another clock than now; never end before the latest tick.
            elapsed = max(perf_counter(), self._latest_tick) - self._origin
        whole_bins = max(int(elapsed // self.bin_s), 0)
        n_bins = max(math.ceil(elapsed / self.bin_s), self._tokens_per_bin.size) if finished else whole_bins
        time_s = np.arange(n_bins) * self.bin_s
        bin_seconds = np.full(n_bins, self.bin_s)
        if finished and n_bins and elapsed - time_s[-1] > 0:
            bin_seconds[-1] = min(self.bin_s, elapsed - time_s[-1])  # the last bin is partial
        in_flight = self._started - self._finished_started
        return LiveSnapshot(
            elapsed_s=max(elapsed, 0.0),
            finished=finished,
            total_requests=total,
            completed=self._completed,
            failed=self._failed,
            in_flight=in_flight,
            not_started=total - self._completed - self._failed - in_flight,
            output_tokens=self._output_tokens,
            bin_s=self.bin_s,
            time_s=time_s,
            output_tokens_per_s=self._tokens_per_bin.padded(n_bins) / bin_seconds,
            in_flight_over_time=np.cumsum(self._in_flight_change_per_bin.padded(n_bins)).round().astype(np.int64),
            ttft_s=self._ttft.view(),
            itl_s=self._itl.view(),
        )
