"""Our Profiler against LMDeploy's, measured side by side in one process.

    .venv/bin/python bench/bench_profiler.py [--quick]

Targets (exit status 1 when one is missed):
  - Session.tick costs no more than LMDeploy's Session.tick (CPU time of the best of many short
    sessions, each side going first in turn);
  - compute_metrics over 5,000 sessions x 1,000 ticks is at least 12x faster than LMDeploy's (best of
    3 each; 5x with --quick) and gives the same numbers, checked here too. Issue 27 aims at 20x: 15-23x
    were measured at load 2-4 on 2 cores (docs/performance.md says where the rest of the time goes);
  - a live snapshot taken while another thread ticks 5,000 sessions takes under 50 ms (median of
    polls twice a second; the maximum is printed too). The thread ticks every session once per 20 ms
    decode step, about 250k tokens/s, more than one GPU sustains at that batch;
  - a finished session's tick takes at most half the memory of LMDeploy's two Python list entries
    (tracemalloc). Running sessions keep lists, as LMDeploy's do: that row is printed for information.
"""

from __future__ import annotations

import argparse
import gc
import math
import statistics
import sys
import threading
import time
import tracemalloc
from array import array
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from lmdeploy_reference import load_lmdeploy_profiler, why_missing  # noqa: E402

from bench_core.measure.profiler import Profiler, Session  # noqa: E402

PERCENTILES = [50, 75, 95, 99]


def tick_cost_ns(session_cls, n_ticks: int) -> tuple[float, float]:
    """Per-tick CPU time of this thread for `n_ticks` ticks on a fresh session, and of its finish() spread
    over them. CPU time, not wall time: the time other processes hold the core is not counted."""
    sess = session_cls(1, n_ticks)
    tick = sess.tick
    started = time.thread_time_ns()
    for n in range(n_ticks):
        tick(n)
    ticked = time.thread_time_ns()
    sess.finish(session_cls.SUCCESS)
    finished = time.thread_time_ns()
    return (ticked - started) / n_ticks, (finished - ticked) / n_ticks


def interleaved_tick_costs(reference, n_ticks: int, repeats: int) -> dict[str, float]:
    """Best of `repeats` short sessions each, ours and theirs taking turns to go first, so that load from
    other processes and the state one leaves the allocator in fall on both alike."""
    best = {"ours": math.inf, "ours_finish": math.inf, "theirs": math.inf}
    sides = [("ours", Session), ("theirs", reference.Session)]
    for repeat in range(repeats):
        for side, session_cls in sides if repeat % 2 else sides[::-1]:
            tick_ns, finish_ns = tick_cost_ns(session_cls, n_ticks)
            best[side] = min(best[side], tick_ns)
            if side == "ours":
                best["ours_finish"] = min(best["ours_finish"], finish_ns)
    return best


def filled_profilers(reference, n_sessions: int, n_ticks: int) -> tuple[Profiler, object]:
    """A finished streaming run, one token per tick, with the same ticks in both profilers."""
    rng = np.random.default_rng(0)
    ours = Profiler(True, PERCENTILES)
    theirs = reference.Profiler(True, PERCENTILES)
    ours.start(1000.0)
    counts = np.arange(n_ticks, dtype=np.int64)
    for _ in range(n_sessions):
        ts = 1000.0 + rng.uniform(0, 5) + np.cumsum(rng.exponential(0.02, n_ticks))
        mine = ours.new_session(100, n_ticks - 1)
        mine.ts, mine.ns = array("d", ts.tobytes()), array("q", counts.tobytes())
        mine.finish(Session.SUCCESS, timestamp=float(ts[-1]))
        ref = theirs.new_session(100, n_ticks - 1)
        ref.ts, ref.ns = ts.tolist(), counts.tolist()
        ref.finish(reference.Session.SUCCESS)
    ours.finish(1000.0 + 5 + 0.02 * n_ticks * 1.5)
    theirs.t_start, theirs.elapsed_time = ours.t_start, ours.elapsed_time
    return ours, theirs


def compute_metrics_seconds(reference, n_sessions: int, n_ticks: int) -> tuple[float, float]:
    """Best of 3 for each, taking turns: either side's time swings by half from one call to the next under
    load (allocations of 40 MB arrays, collections over a heap that holds the other's 5M ticks)."""
    ours, theirs = filled_profilers(reference, n_sessions, n_ticks)
    our_s = their_s = math.inf
    for _ in range(3):
        started = time.perf_counter()
        theirs.compute_metrics()
        their_s = min(their_s, time.perf_counter() - started)
        started = time.perf_counter()
        ours.compute_metrics()
        our_s = min(our_s, time.perf_counter() - started)
    for mean, stat in (
        ("e2e_mean", "e2e_stat"),
        ("tpot_mean", "tpot_stat"),
        ("ttft_mean", "ttft_stat"),
        ("itls_mean", "itls_stat"),
        ("tpts_mean", "tpts_stat"),
    ):
        if getattr(ours, mean) != getattr(theirs, mean) or getattr(ours, stat) != getattr(theirs, stat):
            raise SystemExit(f"compute_metrics differs from LMDeploy's on {mean}/{stat}")
    return our_s, their_s


def snapshot_ms_while_ticking(n_sessions: int, n_ticks: int, step_s: float, poll_s: float) -> tuple[list[float], int]:
    """Snapshot durations while an engine thread decodes every session one token per `step_s` step."""
    prof = Profiler(True, PERCENTILES)
    sessions = [prof.new_session(100, n_ticks - 1) for _ in range(n_sessions)]

    def engine() -> None:
        for n in range(n_ticks):
            for sess in sessions:
                sess.tick(n)
            time.sleep(step_s)
        for sess in sessions:
            sess.finish(Session.SUCCESS)

    prof.start()
    worker = threading.Thread(target=engine)
    worker.start()
    durations = []
    while worker.is_alive():
        time.sleep(poll_s)
        started = time.perf_counter()
        prof.live_snapshot()
        durations.append((time.perf_counter() - started) * 1000)
    worker.join()
    prof.finish()
    snap = prof.live_snapshot()
    if snap.output_tokens != n_sessions * (n_ticks - 1) or snap.completed != n_sessions:
        raise SystemExit("the live snapshot lost or double-counted ticks")
    return durations, round(n_sessions * n_ticks / snap.elapsed_s)


def bytes_per_tick(session_cls, n_sessions: int, n_ticks: int, finish: bool) -> float:
    gc.collect()
    tracemalloc.start()
    sessions = [session_cls(100, n_ticks) for _ in range(n_sessions)]
    base = tracemalloc.get_traced_memory()[0]
    for sess in sessions:
        for n in range(n_ticks):
            sess.tick(n)
        if finish:
            sess.finish(session_cls.SUCCESS)
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    return used / (n_sessions * n_ticks)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1,000 sessions x 200 ticks instead of 5,000 x 1,000")
    args = parser.parse_args()
    reference = load_lmdeploy_profiler()
    if reference is None:
        print(f"Cannot compare: {why_missing()}.", file=sys.stderr)
        return 2
    sessions, ticks = (1000, 200) if args.quick else (5000, 1000)
    tick = interleaved_tick_costs(reference, 30_000, 15 if args.quick else 51)
    ours_cm, theirs_cm = compute_metrics_seconds(reference, sessions, ticks)
    min_speedup = 5 if args.quick else 12  # at 1,000 x 200 our fixed costs weigh more: 8-19x measured
    snap_ms, ticks_per_s = snapshot_ms_while_ticking(sessions, ticks, step_s=0.02, poll_s=0.5)
    ours_mem = bytes_per_tick(Session, 200, 1000, finish=True)
    ours_mem_running = bytes_per_tick(Session, 200, 1000, finish=False)
    theirs_mem = bytes_per_tick(reference.Session, 200, 1000, finish=True)
    snap_median = statistics.median(snap_ms) if snap_ms else 0.0
    nan = math.nan

    rows = [
        (
            "Session.tick (ns/tick)",
            tick["ours"],
            tick["theirs"],
            tick["ours"] / tick["theirs"],
            "<= 1.0x",
            tick["ours"] <= tick["theirs"],
        ),
        (
            "  + its share of finish() (ns/tick)",
            tick["ours"] + tick["ours_finish"],
            tick["theirs"],
            (tick["ours"] + tick["ours_finish"]) / tick["theirs"],
            "(info)",
            True,
        ),
        (
            f"compute_metrics {sessions}x{ticks} (s)",
            ours_cm,
            theirs_cm,
            theirs_cm / ours_cm,
            f">= {min_speedup}x faster",
            theirs_cm >= min_speedup * ours_cm,
        ),
        (
            "memory, finished (bytes/tick)",
            ours_mem,
            theirs_mem,
            ours_mem / theirs_mem,
            "<= 0.5x",
            ours_mem <= 0.5 * theirs_mem,
        ),
        (
            "memory, still running (bytes/tick)",
            ours_mem_running,
            theirs_mem,
            ours_mem_running / theirs_mem,
            "(info)",
            True,
        ),
        (f"live snapshot, median of {len(snap_ms)} (ms)", snap_median, nan, nan, "< 50 ms", snap_median < 50),
        ("live snapshot, max (ms)", max(snap_ms, default=0.0), nan, nan, "(info)", True),
    ]
    print(f"{'measure':<38}{'ours':>11}{'lmdeploy':>11}{'ratio':>8}  {'target':<15}result")
    for name, ours, theirs, ratio, target, ok in rows:
        print(f"{name:<38}{ours:>11.4g}{theirs:>11.4g}{ratio:>8.3g}  {target:<15}{'ok' if ok else 'MISSED'}")
    print("ratio: ours / lmdeploy, except compute_metrics: lmdeploy / ours.")
    print(
        f"snapshots polled every 0.5 s while {sessions} sessions ticked once per 20 ms step ({ticks_per_s:,} ticks/s)."
    )
    return 0 if all(row[-1] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
