"""Real profilers fed with ticks at explicit timestamps, and histories of them, for chart and table tests."""

from __future__ import annotations

import math
from time import perf_counter

import numpy as np
import pandas as pd

from bench_core.config import SLO, EngineConfig, LoadConfig, RunConfig
from bench_core.measure.profiler import Profiler, Session
from bench_core.states import RequestStatus
from bench_core.store.history import History, RunRecord
from bench_core.store.history_import import lmdeploy_hyperparams

OUTPUT_LEN = 4
INCOMPLETE_TTFT_FACTOR = 10  # times the largest successful TTFT: leaking it into a chart would show


def profiled_run(
    ttfts_s: list[float], itl_s: float = 0.01, stream: bool = True, percentiles=(50, 75, 95, 99), slo: SLO | None = None
) -> Profiler:
    """A finished batch run: one successful request per TTFT (then OUTPUT_LEN - 1 gaps of `itl_s`,
    one token each), plus one incomplete, one failed and one unfinished request. The incomplete one
    comes last, so the run's duration grows with its TTFTs."""
    prof = Profiler(stream, list(percentiles), slo=slo)
    prof.start(0.0)
    end = 0.0
    for ttft in ttfts_s:
        sess = prof.new_session(10, OUTPUT_LEN)
        sess.tick_at(0, 0.0)
        times = [ttft + k * itl_s for k in range(OUTPUT_LEN)]
        for n, t in enumerate(times, start=1):
            sess.tick_at(n, t)
        sess.finish(Session.SUCCESS, timestamp=times[-1])
        end = max(end, times[-1])
    late = INCOMPLETE_TTFT_FACTOR * max(ttfts_s)
    incomplete = prof.new_session(20, OUTPUT_LEN)
    incomplete.tick_at(0, 0.0)
    incomplete.tick_at(1, late)
    incomplete.finish(Session.SUCCESS, reason="stop", timestamp=late)
    failed = prof.new_session(30, OUTPUT_LEN)
    failed.tick_at(0, 0.0)
    failed.finish(Session.FAIL, reason="error: out of memory", timestamp=0.5)
    unfinished = prof.new_session(40, OUTPUT_LEN)
    unfinished.tick_at(0, 0.0)
    unfinished.tick_at(1, 0.2)
    prof.finish(max(end, late) + 0.5)
    return prof


def recorded_history(
    root, runs: list[tuple[str, str, int, Profiler]], sweep_id: str = ""
) -> tuple[History, pd.DataFrame]:
    """Record (run_id, backend, concurrency, profiler) runs into a real History, as the runs of `sweep_id` (one
    repeat of each point) where one is given; return it and its rows."""
    history = History(root)
    for run_id, backend, concurrency, prof in runs:
        config = RunConfig(
            engine=EngineConfig(backend=backend),
            load=LoadConfig(concurrency=concurrency, stream_output=prof.stream_output),
            label=f"{backend} x{concurrency}",
            percentiles=tuple(prof.percentages),
        )
        history.record(
            RunRecord(
                run_id=run_id,
                started_at="2026-01-01T00:00:00+00:00",
                status="finished",
                config=config,
                lmdeploy_columns=prof.lmdeploy_csv_row(lmdeploy_hyperparams(config)),
                metrics=prof.summary(),
                requests=prof.request_table(),
                sweep_id=sweep_id,
                sweep_repeat=0 if sweep_id else None,
            )
        )
    return history, history.load()


_ENDED_AS = {RequestStatus.FAILED: Session.FAIL, RequestStatus.CANCELLED: Session.CANCELLED}


def replayed_until(requests: pd.DataFrame, until_s: float, concurrency: int | None = None) -> Profiler:
    """A running profiler holding what a recorded run's request table (`requests.parquet`) had measured `until_s`
    seconds in: each request's ticks rebuilt from its start, TTFT, inter-token gaps and tokens per tick, those up
    to then, and its end if it came by then. The profiler started `until_s` ago, so its live snapshot reads as the
    run did then, `concurrency` capping its requests in flight as the run's engine did."""
    prof = Profiler(True, [50], max_in_flight=concurrency)
    t0 = perf_counter() - until_s
    prof.start(t0)
    for row in requests.itertuples():
        sess = prof.new_session(row.input_len, row.req_output_len)
        if not row.start_s <= until_s:
            continue
        sess.tick_at(0, t0 + row.start_s)
        if not math.isnan(row.ttft_s):
            times = row.start_s + row.ttft_s + np.concatenate([[0.0], np.cumsum(row.itl_s)])
            counts = np.cumsum(row.tokens_per_tick)
            for t, n in zip(times, counts):
                if t > until_s:
                    break
                sess.tick_at(int(n), t0 + t)
        if row.finish_s <= until_s:  # never, for an unfinished one (NaN)
            sess.finish(_ENDED_AS.get(row.status, Session.SUCCESS), row.reason, timestamp=t0 + row.finish_s)
    return prof
