"""A drop-in for `lmdeploy.profiler`: `Session` records ticks, `Profiler` turns them into metrics.

The same ticks give LMDeploy's numbers bit for bit (its attributes, its console table, its CSV row).
On top of that: explicit timestamps (`Session.tick_at`, to replay recorded or imported runs), finish reasons, counts of
failed / incomplete / unfinished / cancelled requests, std/min/max, goodput against an SLO, a
per-request table, a flat summary for the history, and a thread-safe live snapshot for a polling page
(requests in flight from their admission, `Session.admit`, where the caller records it). What crashes or
misleads in LMDeploy's module does not here: undefined values are NaN, shown and written as '-'.

Ticks are appended to Python lists, exactly as LMDeploy's do, because in CPython `list.append` is
the cheapest append there is (array.array parses each value); `Session.tick` is the hot path and
takes no lock. When a session finishes, its ticks move into `array.array` buffers (16 bytes a tick
instead of about 65). Either way they read as LMDeploy users expect: `sess.ts[-1]`, `sess.ns[1]`,
`len(sess.ts)`.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from time import perf_counter
from typing import Any

import numpy as np
import pandas as pd

from .. import csvstore
from ..config import SLO, RunConfig
from ..states import LoadPattern, RequestStatus
from . import metrics
from .catalog import (
    BEYOND_LMDEPLOY,
    CATALOG,
    METRICS,
    NOT_MEASURED,
    QUALITY_METRICS,
    column_label,
    lmdeploy_row,
    steady_rows,
)
from .live_snapshot import LiveSnapshot, LiveTracker
from .window import SteadyLoad, steady_load

_LMDEPLOY_ROWS = tuple(metric for metric in CATALOG if metric.lmdeploy_label)  # LMDeploy's console table


class Session:
    """One request: timestamps `ts` (perf_counter seconds) and cumulative output tokens `ns`."""

    UNKNOWN = 0
    SUCCESS = 1
    FAIL = 2
    CANCELLED = 3  # ours: stopped by the user's cancel, which says nothing about the engine

    __slots__ = (
        "ts",
        "ns",
        "input_len",
        "req_output_len",
        "status",
        "reason",
        "finish_time",
        "extra",
        "admit_time",
        "length_status",
    )

    def __init__(self, input_len: int, req_output_len: int):
        self.ts: list[float] | array = []
        self.ns: list[int] | array = []
        self.input_len = input_len
        self.req_output_len = req_output_len
        self.status = Session.UNKNOWN
        self.reason = ""
        self.finish_time: float | None = None
        self.extra: Mapping[str, Any] | None = None  # per-request facts from the engine, table columns
        self.admit_time: float | None = None
        self.length_status = ""  # the engine's own verdict on a served request's length (metrics.request_status)

    def admit(self, timestamp: float | None = None) -> None:
        """Record that the engine took the request (in batch load it ticks 0 at t0, long before)."""
        self.admit_time = perf_counter() if timestamp is None else timestamp

    def tick(self, n_token: int) -> None:
        """Record that `n_token` output tokens exist now. By convention tick(0) starts.

        LMDeploy's signature and no more: an optional timestamp's default and branch made it ~10 ns (10 %)
        slower than LMDeploy's, which reads the clock and appends twice (bench/bench_profiler.py)."""
        self.ts.append(perf_counter())
        self.ns.append(n_token)

    def tick_at(self, n_token: int, timestamp: float) -> None:
        """Record that `n_token` output tokens existed at `timestamp` (perf_counter seconds): what an
        engine's event or a recorded run says."""
        self.ts.append(timestamp)
        self.ns.append(n_token)

    def tick_many(self, timestamps: Sequence[float], n_tokens: Sequence[int]) -> None:
        """Record several ticks at once, oldest first (what one network read of a server's stream brought)."""
        self.ts.extend(timestamps)
        self.ns.extend(n_tokens)

    def finish(
        self,
        status: int,
        reason: str = "",
        timestamp: float | None = None,
        extra: Mapping[str, Any] | None = None,
        length_status: str = "",
    ) -> None:
        """End the request with SUCCESS, FAIL or CANCELLED and why (e.g. "error: CUDA OOM", "abort", "cancelled");
        `extra` values become columns of `Profiler.request_table`. `length_status` is where the engine knows better
        than the token count whether a served request came out as long as asked (see metrics.request_status)."""
        self.finish_time = perf_counter() if timestamp is None else timestamp
        self.reason = reason
        self.extra = extra
        self.length_status = length_status
        self.pack_ticks()
        # The status is written last: a reader that sees it set also sees the time, reason and ticks.
        self.status = status

    def pack_ticks(self) -> None:
        """Keep the ticks of a finished request as compact arrays."""
        try:
            self.ts, self.ns = array("d", self.ts), array("q", self.ns)
        except (TypeError, OverflowError):  # token counts that are not integers stay as given
            pass

    @property
    def finished(self) -> bool:
        return self.status != Session.UNKNOWN

    @property
    def cancelled(self) -> bool:
        return self.status == Session.CANCELLED

    @property
    def completed(self) -> bool:
        """Counted by LMDeploy's metrics: SUCCESS with at least the requested number of tokens, or as long as
        asked in the engine's own verdict."""
        if self.status != Session.SUCCESS:
            return False
        if self.length_status:
            return self.length_status == RequestStatus.SUCCESS
        output_len = self.ns[-1] if len(self.ns) else 0
        return output_len >= self.req_output_len


@dataclass(frozen=True)
class Progress:
    total: int
    finished: int


@dataclass
class _Computed:
    """What one compute_metrics() saw, kept so the table and summary describe the same moment; the summary
    under the profiler's own SLO is kept too, as the history row, LMDeploy's row and the console all read it."""

    sessions: list[Session]
    per_request: metrics.RequestMetrics
    status: np.ndarray
    origin: float
    summary: dict[str, float | int | str] | None = None


class Profiler:
    """Collects sessions and computes LMDeploy's metrics (and ours) from their ticks."""

    def __init__(
        self,
        stream_output: bool,
        percentages: Sequence[float],
        slo: SLO | None = None,
        live_bin_s: float = 0.5,
        records_admissions: bool = False,
        max_in_flight: int | None = None,
        steady: SteadyLoad | None = None,
    ):
        """`records_admissions`: the caller marks each session's admission (Session.admit), which then
        starts its time in flight; `max_in_flight`: the most requests the engine runs at once (see
        live_snapshot); `steady`: the load the run asked for, which its steady window is measured against
        (None: no window, as LMDeploy's profiler)."""
        self.sessions: list[Session] = []
        self.stream_output = stream_output
        self.percentages = percentages
        self.slo = slo
        self.steady = steady
        self.t_start: float | None = None
        self.t_finish: float | None = None
        self.elapsed_time = math.nan  # set by finish(), or by compute_metrics() while running
        self._computed: _Computed | None = None
        self._live = LiveTracker(live_bin_s, records_admissions, max_in_flight)

    def new_session(self, *args, **kwargs) -> Session:
        sess = Session(*args, **kwargs)
        self.sessions.append(sess)
        return sess

    def start(self, timestamp: float | None = None) -> None:
        self.t_start = perf_counter() if timestamp is None else timestamp

    def finish(self, timestamp: float | None = None) -> None:
        self.t_finish = perf_counter() if timestamp is None else timestamp
        self.elapsed_time = self.t_finish - self._origin(self.sessions)
        self._computed = None

    @property
    def progress(self) -> Progress:
        return Progress(total=len(self.sessions), finished=sum(1 for s in list(self.sessions) if s.finished))

    def _origin(self, sessions: Sequence[Session]) -> float:
        """start() time; without one, the first tick (replays); NaN when there is neither."""
        if self.t_start is not None:
            return self.t_start
        firsts = [s.ts[0] for s in sessions if len(s.ts)]
        return min(firsts) if firsts else math.nan

    # ---- metrics -------------------------------------------------------------------------

    def compute_metrics(self) -> None:
        """Set LMDeploy's result attributes (and ours). Before finish(), uses the time elapsed so far."""
        sessions = list(self.sessions)
        origin = self._origin(sessions)
        if self.t_finish is None:
            self.elapsed_time = perf_counter() - origin
        per_request = metrics.request_metrics(*_gather_ticks(sessions))
        status = metrics.request_status(
            finished=np.array([s.status != Session.UNKNOWN for s in sessions], dtype=bool),
            succeeded=np.array([s.status == Session.SUCCESS for s in sessions], dtype=bool),
            cancelled=np.array([s.status == Session.CANCELLED for s in sessions], dtype=bool),
            output_len=per_request.output_len,
            req_output_len=np.array([s.req_output_len for s in sessions]),
            length_status=np.array([s.length_status for s in sessions], dtype=object),
        )
        self._computed = _Computed(sessions, per_request, status, origin)
        self._set_result_attributes(sessions, per_request, status)

    def _set_result_attributes(
        self, sessions: list[Session], per_request: metrics.RequestMetrics, status: np.ndarray
    ) -> None:
        counted = status == RequestStatus.SUCCESS
        self.success = int(counted.sum())
        self.total_output = sum(per_request.output_len[counted].tolist())
        self.total_input = sum(s.input_len for s, ok in zip(sessions, counted) if ok)
        self.output_throughput = metrics.rate(self.total_output, self.elapsed_time)
        self.input_throughput = metrics.rate(self.total_input, self.elapsed_time)
        self.rps = metrics.rate(self.success, self.elapsed_time)

        self.e2es = _defined(per_request.e2e_s[counted])
        self.tpots = _defined(per_request.tpot_s[counted])
        self.ttfts = _defined(per_request.ttft_s[counted])
        self.itls = metrics.values_of(per_request.itl_s, per_request.itl_counts, counted)
        self.tpts = metrics.values_of(per_request.tokens_per_tick, per_request.tokens_per_tick_counts, counted)
        qs = self.percentages
        none = np.array([])
        self.stats: dict[str, metrics.Distribution] = {
            "e2e": metrics.distribution(self.e2es, qs),
            "tpot": metrics.distribution(self.tpots, qs),
            "ttft": metrics.distribution(self.ttfts if self.stream_output else none, qs),
            "itl": metrics.distribution(self.itls if self.stream_output else none, qs),
            "tokens_per_tick": metrics.distribution(self.tpts if self.stream_output else none, qs),
        }
        self.e2e_mean, self.e2e_stat = self.stats["e2e"].mean, self.stats["e2e"].percentiles
        self.tpot_mean, self.tpot_stat = self.stats["tpot"].mean, self.stats["tpot"].percentiles
        self.ttft_mean, self.ttft_stat = self.stats["ttft"].mean, self.stats["ttft"].percentiles
        self.itls_mean, self.itls_stat = self.stats["itl"].mean, self.stats["itl"].percentiles
        self.tpts_mean, self.tpts_stat = self.stats["tokens_per_tick"].mean, self.stats["tokens_per_tick"].percentiles
        if self.tpts.size and self.stream_output:  # LMDeploy truncates these percentiles to integers
            self.tpts_stat = tuple(np.asarray(self.tpts_stat).astype(int))

        self.failed = int(np.count_nonzero(status == RequestStatus.FAILED))
        self.incomplete = int(np.count_nonzero(status == RequestStatus.INCOMPLETE))
        self.overrun = int(np.count_nonzero(status == RequestStatus.OVERRUN))
        self.unfinished = int(np.count_nonzero(status == RequestStatus.UNFINISHED))
        self.cancelled = int(np.count_nonzero(status == RequestStatus.CANCELLED))
        self.failure_reasons = metrics.failure_reasons(status, np.array([s.reason for s in sessions], dtype=object))
        self.good_requests: int | None = None
        self.goodput: float | None = None
        if metrics.slo_is_set(self.slo):
            good = metrics.good_requests(status, per_request.ttft_s, per_request.tpot_s, per_request.e2e_s, self.slo)
            self.good_requests = int(good.sum())
            self.goodput = metrics.rate(self.good_requests, self.elapsed_time)

    def _ensure_computed(self) -> _Computed:
        if self._computed is None:
            self.compute_metrics()
        assert self._computed is not None, "compute_metrics sets it"
        return self._computed

    def request_table(self) -> pd.DataFrame:
        """One row per session, in order; times in seconds, start/finish relative to the profiler start."""
        computed = self._ensure_computed()
        sessions, per_request = computed.sessions, computed.per_request
        first_tick = np.array([s.ts[0] if len(s.ts) else math.nan for s in sessions], dtype=np.float64)
        finish_time = np.array(
            [math.nan if s.finish_time is None else s.finish_time for s in sessions], dtype=np.float64
        )
        table = pd.DataFrame(
            {
                "index": np.arange(len(sessions)),
                "input_len": [s.input_len for s in sessions],
                "req_output_len": [s.req_output_len for s in sessions],
                "output_len": per_request.output_len,
                "status": pd.Series(computed.status, dtype=object),
                "reason": pd.Series([s.reason for s in sessions], dtype=object),
                "ttft_s": per_request.ttft_s,
                "tpot_s": per_request.tpot_s,
                "e2e_s": per_request.e2e_s,
                "itl_s": pd.Series(per_request.itl_per_request(), dtype=object),
                "tokens_per_tick": pd.Series(per_request.tokens_per_tick_per_request(), dtype=object),
                "n_ticks": per_request.n_ticks,
                "start_s": first_tick - computed.origin,
                "finish_s": finish_time - computed.origin,
            }
        )
        extra_keys = dict.fromkeys(key for s in sessions if s.extra for key in s.extra)  # first-seen order
        for key in extra_keys:
            table[key] = pd.Series([s.extra.get(key) if s.extra else None for s in sessions])
        return table

    def summary(self, slo: SLO | None = None) -> dict[str, float | int | str]:
        """Flat summary for the history (latencies in ms); `slo` defaults to the profiler's."""
        computed = self._ensure_computed()
        if slo is not None and slo != self.slo:
            return metrics.run_summary(
                self.request_table(), self.elapsed_time, self.percentages, self.stream_output, slo, self.steady
            )
        if computed.summary is None:
            computed.summary = metrics.run_summary(
                self.request_table(), self.elapsed_time, self.percentages, self.stream_output, self.slo, self.steady
            )
        return dict(computed.summary)

    def live_snapshot(self) -> LiveSnapshot:
        """Progress and value series so far; safe to call from any thread while sessions tick."""
        return self._live.snapshot(self.sessions, self.t_start, self.t_finish)

    # ---- reports -------------------------------------------------------------------------

    def summarize(
        self,
        title: str,
        hyperparams: Iterable[tuple[str, Any]] | dict | None = None,
        header: int = 40,
        digits: int = 10,
    ) -> None:
        """Print LMDeploy's table (console in seconds), then our rows below it."""
        computed = self._ensure_computed()
        table = _ConsoleTable(header, digits, len(self.percentages))
        table.title(title)
        table.row("Benchmark duration", self.elapsed_time)
        table.row("Total requests", len(computed.sessions))
        table.row("Successful requests", self.success)
        for key, value in _pairs(hyperparams):
            table.row(key, value)
        table.row("Total input tokens", self.total_input)
        table.row("Total generated tokens", self.total_output)
        table.row("Input throughput (tok/s)", self.input_throughput)
        table.row("Output throughput (tok/s)", self.output_throughput)
        table.row("Request throughput (req/s)", self.rps)
        table.rule("-")
        table.row("", "mean", *(f"P{q}" for q in self.percentages))
        self._latency_rows(table, lambda s: (s.mean, *s.percentiles), with_tokens_per_tick=True)
        table.rule("=")
        self._extra_rows(table)

    def _latency_rows(self, table: _ConsoleTable, cells, with_tokens_per_tick: bool) -> None:
        """LMDeploy's rows, in seconds; tokens per tick (percentiles truncated, as LMDeploy prints them)
        only where LMDeploy prints it."""
        for metric in _LMDEPLOY_ROWS:
            if metric.needs_streaming and not self.stream_output:
                continue
            if metric.integer_percentiles:
                if with_tokens_per_tick:
                    table.row(metric.lmdeploy_label, self.tpts_mean, *self.tpts_stat)
                continue
            table.row(metric.lmdeploy_label, *cells(self.stats[metric.key]))

    def _extra_rows(self, table: _ConsoleTable) -> None:
        summary = self.summary()
        for key in ("failed", "incomplete", "unfinished", "cancelled"):
            table.row(METRICS[key].label, summary[key])
        for reason, count in self.failure_reasons.items():
            table.row(f"  {reason}", count)
        if "achieved_rate" in summary:  # requests sent on an arrival schedule: how it was kept
            rate, lag = METRICS["achieved_rate"], METRICS["send_lag"]
            table.row(f"{rate.label} ({rate.unit})", summary[rate.column()])
            table.row(f"{column_label(lag, 'mean')} ({lag.display_unit})", summary[lag.column("mean")])
            table.row(METRICS["peak_in_flight"].label, summary["peak_in_flight"])
        for title, value in steady_rows(summary):
            table.row(title, *(() if value is None else (value,)))
        table.rule("-")
        table.row("", "std", "min", "max")
        self._latency_rows(table, lambda s: (s.std, s.min, s.max), with_tokens_per_tick=False)
        # A metric whose columns the run lacks (speculation's, on a run without it) has no row.
        measured = [
            metric
            for metric in BEYOND_LMDEPLOY
            if (self.stream_output or not metric.needs_streaming) and metric.column("mean") in summary
        ]
        if measured:
            table.rule("-")
            table.row("", "mean", *(f"P{q}" for q in self.percentages))
            stats = ("mean", *(metrics.percentile_key(q) for q in self.percentages))
            for metric in measured:
                values = (float(summary.get(metric.column(stat), math.nan)) / metric.display_scale for stat in stats)
                table.row(metric.console_title, *values)
        if self.goodput is not None:
            table.rule("-")
            for name in ("ttft", "tpot", "e2e"):
                threshold = getattr(self.slo, name)
                if threshold is not None:
                    table.row(f"SLO {name.upper()} (s)", float(threshold))
            table.row(METRICS["good_requests"].label, self.good_requests)
            table.row(METRICS["goodput"].title, self.goodput)
        judged = [metric for metric in QUALITY_METRICS if metric.column() in summary]
        if judged:
            table.rule("-")
            for metric in judged:
                table.row(metric.title, summary[metric.column()])
        table.rule("=")

    def lmdeploy_csv_row(
        self, hyperparams: Iterable[tuple[str, Any]] | dict | None = None, summary: dict | None = None
    ) -> dict[str, Any]:
        """The row LMDeploy's save_csv writes, in its column order and formats; '-' where not measured. `summary`:
        this profiler's, where the caller has it already (a run's record), so it is aggregated once."""
        return {**dict(_pairs(hyperparams)), **lmdeploy_row(self.summary() if summary is None else summary)}

    def save_csv(self, csv_file: str, hyperparams: Iterable[tuple[str, Any]] | dict | None = None) -> None:
        """Append LMDeploy's CSV row; a file with other columns is rewritten with the union header."""
        csvstore.append_row(csv_file, self.lmdeploy_csv_row(hyperparams))


def new_profiler(config: RunConfig) -> Profiler:
    """The profiler a run of `config` measures with."""
    by_rate = config.load.load_pattern == LoadPattern.REQUEST_RATE
    return Profiler(
        config.load.stream_output,
        list(config.percentiles),
        slo=config.slo,
        records_admissions=True,
        max_in_flight=config.load.max_concurrency if by_rate else config.load.concurrency,
        steady=steady_load(config),
    )


def rebuilt_profiler(config: RunConfig, sessions: list[Session], t_start: float, t_finish: float) -> Profiler:
    """The profiler of a run of `config` whose sessions and clock come from elsewhere (another process, a run's
    journal), measured from `t_start` to `t_finish` (perf_counter)."""
    profiler = new_profiler(config)
    profiler.sessions = sessions
    profiler.start(t_start)
    profiler.finish(t_finish)
    return profiler


def served_latencies(sessions: Sequence[Session]) -> dict[str, np.ndarray]:
    """The TTFT, TPOT and E2E latencies (seconds, by their RequestMetrics names) of those of these ended requests that
    were served: what a bound on a latency's statistic can be judged on before the run ends."""
    per_request = metrics.request_metrics(*_gather_ticks(sessions))
    served = np.array([s.status == Session.SUCCESS for s in sessions], dtype=bool)
    return {name: np.asarray(getattr(per_request, name))[served] for name in ("ttft_s", "tpot_s", "e2e_s")}


def certainly_outside_slo(sessions: Sequence[Session], slo: SLO) -> int:
    """How many of these ended requests miss the SLO whatever happens next: failed, or served outside a threshold
    (cancelled ones, and the requests the run's end may still count as short, are not counted)."""
    per_request = metrics.request_metrics(*_gather_ticks(sessions))
    served = np.array([s.status == Session.SUCCESS for s in sessions], dtype=bool)
    status = np.where(served, RequestStatus.SUCCESS, RequestStatus.FAILED).astype(object)
    good = metrics.good_requests(status, per_request.ttft_s, per_request.tpot_s, per_request.e2e_s, slo)
    failed = np.array([s.status == Session.FAIL for s in sessions], dtype=bool)
    return int((failed | (served & ~good)).sum())


def _gather_ticks(sessions: Sequence[Session]) -> tuple[list[Sequence[float]], list[Sequence[int]]]:
    """Each session's ticks (metrics.request_metrics' input), as they are where that is safe.

    A running session's ticks are sliced first: a slice is an atomic copy, whereas a numpy view of a live
    array.array would stop a concurrent append from growing it. A finished session's packed arrays no
    longer change (its status is set after they are), so they are passed as they are, copying nothing.
    """
    ts_per_session: list[Sequence[float]] = []
    ns_per_session: list[Sequence[int]] = []
    for sess in sessions:
        ts, ns = sess.ts, sess.ns
        if sess.status == Session.UNKNOWN or len(ts) != len(ns):
            n = min(len(ts), len(ns))  # another thread may be between the two appends of a tick
            ts, ns = ts[:n], ns[:n]
        ts_per_session.append(ts)
        ns_per_session.append(ns)
    return ts_per_session, ns_per_session


def _defined(values: np.ndarray) -> np.ndarray:
    return values[~np.isnan(values)]


def _pairs(hyperparams: Iterable[tuple[str, Any]] | dict | None) -> list[tuple[str, Any]]:
    if not hyperparams:
        return []
    return list(hyperparams.items() if isinstance(hyperparams, dict) else hyperparams)


def _is_nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


class _ConsoleTable:
    """LMDeploy's console layout: a `header`-wide name column, then `digits`-wide value columns."""

    def __init__(self, header: int, digits: int, n_percentiles: int):
        self.header = header
        self.digits = digits
        self.width = header + digits * (1 + n_percentiles)

    def title(self, text: str) -> None:
        print("\n" + format(f" {text} ", f"=^{self.width}"))

    def rule(self, char: str) -> None:
        print(char * self.width)

    def cell(self, value: Any) -> str:
        spec = f">{self.digits}"
        if _is_nan(value):
            return format(NOT_MEASURED, spec)
        if isinstance(value, float):
            return format(value, f"{spec}.3f")
        try:
            return format(value, spec)
        except TypeError:  # e.g. None: LMDeploy would crash here
            return format(str(value), spec)

    def row(self, name: str, *values: Any) -> None:
        print(f"{name:<{self.header}}" + "".join(self.cell(v) for v in values))
