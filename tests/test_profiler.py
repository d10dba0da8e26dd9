"""The Profiler against LMDeploy's own module (bit-for-bit), and what it adds or fixes."""

from __future__ import annotations

import csv
import io
import math
import random
import threading
import time
from contextlib import redirect_stdout
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import pytest
from lmdeploy_reference import ENV_VAR, load_lmdeploy_profiler, locate_lmdeploy_profiler, why_missing

from bench_core.config import SLO
from bench_core.measure.latency_bins import BinnedLatencies
from bench_core.measure.profiler import Profiler, Session

PIPELINE_HYPERPARAMS = [
    ("backend", "turbomind"),
    ("bs", 256),
    ("dataset_name", "sharegpt"),
    ("sharegpt_output_len", None),
    ("num_prompts", 100),
]


class _ScriptedClock:
    """Stands in for the `time` module inside LMDeploy's profiler: perf_counter() returns `now`."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def reference():
    module = load_lmdeploy_profiler()
    if module is None:
        pytest.skip(why_missing())
    module.time = _ScriptedClock()  # our private copy of the module; nothing else uses it
    return module


def test_the_reference_locator_honours_its_environment_variable(monkeypatch, tmp_path):
    stand_in = tmp_path / "profiler.py"
    stand_in.write_text("class Session:\n    SUCCESS = 1\n")
    monkeypatch.setenv(ENV_VAR, str(stand_in))
    assert locate_lmdeploy_profiler() == stand_in
    assert load_lmdeploy_profiler("stand_in_profiler").Session.SUCCESS == 1
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "missing.py"))
    assert locate_lmdeploy_profiler() is None and "is not a file" in why_missing()


# ---- random runs ------------------------------------------------------------------------


@dataclass
class PlannedSession:
    input_len: int
    req_output_len: int
    status: int
    ticks: list[tuple[float, int]] = field(default_factory=list)


@dataclass
class PlannedRun:
    stream: bool
    percentages: list
    t_start: float
    t_finish: float
    sessions: list[PlannedSession]


def _token_counts(rng: random.Random, total: int, stream: bool, shape: str) -> list[int]:
    """Cumulative counts after the start tick for a request producing `total` tokens."""
    if not stream or shape == "single_chunk":
        return [total]
    counts, n = [], 0
    if rng.random() < 0.2:
        counts.append(0)  # an engine's first chunk may carry no token yet
    while n < total:
        n = min(total, n + rng.choice([1, 1, 1, 2, 3, 7]))
        counts.append(n)
    return counts


def _plan_session(rng: random.Random, stream: bool, t_begin: float) -> PlannedSession:
    req = rng.choice([1, 2, 3, 5, 8, 16, 40])
    kind = rng.choices(
        ["ok", "ok_long", "single_chunk", "short", "failed", "unfinished", "no_ticks"], weights=[10, 2, 2, 2, 2, 2, 1]
    )[0]
    status = {"failed": Session.FAIL, "unfinished": Session.UNKNOWN}.get(kind, Session.SUCCESS)
    sess = PlannedSession(rng.randint(1, 2000), req, status)
    if kind == "no_ticks":
        sess.status = rng.choice([Session.FAIL, Session.UNKNOWN])
        return sess
    total = {"ok_long": req + rng.randint(1, 5), "short": rng.randint(1, req) - 1}.get(kind, req)
    if kind in ("failed", "unfinished"):
        total = rng.randint(0, req)
    counts = _token_counts(rng, total, stream, "single_chunk" if kind == "single_chunk" else "")
    if kind in ("failed", "unfinished"):
        counts = counts[: rng.randint(0, len(counts))]
    t = t_begin
    sess.ticks.append((t, 0))
    for n in counts:
        # Equal timestamps, tiny gaps and long ones all occur in real runs.
        t += rng.choice([0.0, 1e-7, rng.expovariate(50.0), rng.expovariate(2.0)])
        sess.ticks.append((t, n))
    return sess


def plan_run(seed: int) -> PlannedRun:
    rng = random.Random(seed)
    stream = rng.random() < 0.7
    percentages = rng.choice([[50, 75, 95, 99], [50, 75, 95, 99], [90], [1, 50.5, 99.9], [0, 100]])
    t_start = rng.uniform(0.0, 5e4)  # perf_counter-sized magnitudes
    batch = rng.random() < 0.5  # batch: every session starts at t_start (LMDeploy's pipeline script)
    n_sessions = rng.choice([0, 1, 2, 3, 7, 20, 60])
    sessions = [
        _plan_session(rng, stream, t_start if batch else t_start + rng.uniform(0.0, 3.0)) for _ in range(n_sessions)
    ]
    last = max((s.ticks[-1][0] for s in sessions if s.ticks), default=t_start)
    return PlannedRun(stream, percentages, t_start, last + rng.uniform(0.0, 0.5), sessions)


def replay_on_both(run: PlannedRun, reference) -> tuple[Profiler, object]:
    """Feed the same ticks, in the same interleaved order, to ours (explicit timestamps) and theirs."""
    clock = reference.time
    ours = Profiler(run.stream, run.percentages)
    theirs = reference.Profiler(run.stream, run.percentages)
    pairs = [
        (ours.new_session(s.input_len, s.req_output_len), theirs.new_session(s.input_len, s.req_output_len))
        for s in run.sessions
    ]
    ours.start(run.t_start)
    clock.now = run.t_start
    theirs.start()
    events = sorted((t, i, j) for i, s in enumerate(run.sessions) for j, (t, _) in enumerate(s.ticks))
    for t, i, j in events:
        n = run.sessions[i].ticks[j][1]
        pairs[i][0].tick_at(n, t)
        clock.now = t
        pairs[i][1].tick(n)
    for planned, (mine, ref) in zip(run.sessions, pairs):
        if planned.status != Session.UNKNOWN:
            mine.finish(planned.status)
            ref.finish(planned.status)
    ours.finish(run.t_finish)
    clock.now = run.t_finish
    theirs.finish()
    return ours, theirs


def compute_reference(theirs) -> None:
    with np.errstate(invalid="ignore"):  # LMDeploy takes percentiles of [inf] when nothing was measured
        theirs.compute_metrics()


SCALARS = ("success", "total_input", "total_output", "elapsed_time", "output_throughput", "input_throughput", "rps")
SERIES = (("e2e_mean", "e2e_stat", "e2es"), ("tpot_mean", "tpot_stat", "tpots"))
STREAM_SERIES = (
    ("ttft_mean", "ttft_stat", "ttfts"),
    ("itls_mean", "itls_stat", "itls"),
    ("tpts_mean", "tpts_stat", "tpts"),
)


def assert_same_results(ours: Profiler, theirs) -> None:
    for name in SCALARS:
        assert getattr(ours, name) == getattr(theirs, name), name
    for mean, stat, values in SERIES + (STREAM_SERIES if theirs.stream_output else ()):
        their_values = list(getattr(theirs, values))
        if their_values in ([math.inf], [0]) and theirs.success == 0 or their_values == [math.inf]:
            # LMDeploy puts inf (or 0 tokens per tick) where nothing was measured; we say NaN.
            assert getattr(ours, values).size == 0, values
            assert math.isnan(getattr(ours, mean)), mean
            assert all(math.isnan(x) for x in getattr(ours, stat)), stat
            continue
        assert getattr(ours, values).tolist() == their_values, values
        assert getattr(ours, mean) == getattr(theirs, mean), mean
        assert getattr(ours, stat) == getattr(theirs, stat), stat


def _printed(report) -> str:
    buffer = io.StringIO()
    with redirect_stdout(buffer):
        report()
    return buffer.getvalue()


def _everything_measured(theirs) -> bool:
    means = [theirs.e2e_mean, theirs.tpot_mean]
    if theirs.stream_output:
        means += [theirs.ttft_mean, theirs.itls_mean]
    return theirs.success > 0 and all(math.isfinite(m) for m in means)


@pytest.mark.slow
def test_same_ticks_give_lmdeploys_numbers_bit_for_bit(reference, tmp_path):
    compared_reports = 0
    for seed in range(300):
        run = plan_run(seed)
        ours, theirs = replay_on_both(run, reference)
        compute_reference(theirs)
        ours.compute_metrics()
        assert_same_results(ours, theirs)
        if _everything_measured(theirs):
            title, hyper = "Profile Throughput", [("Concurrency", 64), ("Stream output", run.stream)]
            their_table = _printed(partial(theirs.summarize, title, hyper))
            assert _printed(partial(ours.summarize, title, hyper)).startswith(their_table), seed
            theirs.save_csv(str(tmp_path / f"theirs{seed}.csv"), PIPELINE_HYPERPARAMS)
            ours.save_csv(str(tmp_path / f"ours{seed}.csv"), PIPELINE_HYPERPARAMS)
            assert (tmp_path / f"ours{seed}.csv").read_bytes() == (tmp_path / f"theirs{seed}.csv").read_bytes()
            compared_reports += 1
    assert compared_reports > 100  # the generator must mostly produce fully measured runs


def test_real_clock_ticks_give_lmdeploys_numbers(reference):
    for seed in range(20):
        run = plan_run(1000 + seed)
        ours = Profiler(run.stream, run.percentages)
        theirs = reference.Profiler(run.stream, run.percentages)
        ours.start()
        for planned in run.sessions:
            mine = ours.new_session(planned.input_len, planned.req_output_len)
            for _, n in planned.ticks:
                mine.tick(n)
            if planned.status != Session.UNKNOWN:
                mine.finish(planned.status)
            ref = theirs.new_session(planned.input_len, planned.req_output_len)
            ref.ts, ref.ns, ref.status = list(mine.ts), list(mine.ns), mine.status
        ours.finish()
        theirs.t_start, theirs.elapsed_time = ours.t_start, ours.elapsed_time
        compute_reference(theirs)
        ours.compute_metrics()
        assert_same_results(ours, theirs)


def test_nothing_succeeded_shows_dashes_instead_of_inf(reference, tmp_path, capsys):
    run = PlannedRun(
        True,
        [50, 99],
        10.0,
        12.0,
        [
            PlannedSession(5, 4, Session.FAIL, [(10.0, 0), (10.5, 2)]),
            PlannedSession(5, 4, Session.SUCCESS, [(10.0, 0), (10.5, 1), (11.0, 3)]),  # short
        ],
    )
    ours, theirs = replay_on_both(run, reference)
    compute_reference(theirs)
    assert theirs.e2e_mean == math.inf  # what LMDeploy reports
    ours.summarize("Profile Pipeline API")
    printed = capsys.readouterr().out
    assert "inf" not in printed and "nan" not in printed
    assert "End-to-end Latency".ljust(40) + "-".rjust(10) * 3 in printed
    ours.save_csv(str(tmp_path / "run.csv"), PIPELINE_HYPERPARAMS)
    row = next(csv.DictReader(open(tmp_path / "run.csv")))
    assert row["completed"] == "0"
    assert {row[k] for k in ("mean_e2e_latency_ms", "mean_ttft_ms", "mean_tpot_ms", "mean_itl_ms")} == {"-"}


# ---- what LMDeploy's module crashes on ---------------------------------------------------


def _count_min_max(binned) -> tuple[int, float, float]:
    return binned.count, binned.min_s, binned.max_s


def _finished_profiler(
    sessions: list[tuple[int, int, list[tuple[float, int]], int]], stream=True, percentages=(50, 99), slo=None
) -> Profiler:
    prof = Profiler(stream, list(percentages), slo=slo)
    prof.start(100.0)
    end = 100.0
    for input_len, req, ticks, status in sessions:
        sess = prof.new_session(input_len, req)
        for t, n in ticks:
            sess.tick_at(n, t)
            end = max(end, t)
        if status != Session.UNKNOWN:
            sess.finish(status, timestamp=end)
    prof.finish(end + 1.0)
    return prof


def test_success_with_a_single_tick_counts_but_has_no_latency(capsys):
    prof = _finished_profiler([(7, 0, [(100.0, 0)], Session.SUCCESS)])
    prof.compute_metrics()
    assert prof.success == 1 and prof.total_input == 7
    assert prof.e2es.size == 0 and math.isnan(prof.e2e_mean)
    prof.summarize("Single tick")
    assert "End-to-end Latency" in capsys.readouterr().out


def test_zero_token_output_has_no_tpot_but_keeps_its_e2e():
    prof = _finished_profiler([(7, 0, [(100.0, 0), (100.25, 0)], Session.SUCCESS)])
    table = prof.request_table()
    assert table.loc[0, "e2e_s"] == 0.25
    assert math.isnan(table.loc[0, "tpot_s"])
    assert math.isnan(prof.tpot_mean) and prof.e2e_mean == 0.25


def test_metrics_before_finish_use_the_time_elapsed_so_far():
    prof = Profiler(True, [50])
    started = time.perf_counter() - 2.0
    prof.start(started)
    sess = prof.new_session(10, 2)
    sess.tick(0)
    sess.tick(2)
    sess.finish(Session.SUCCESS)
    before = time.perf_counter()
    prof.compute_metrics()
    # From the start to the moment of the call: read on the same clock just before and just after it.
    assert before - started <= prof.elapsed_time <= time.perf_counter() - started
    assert prof.rps == 1 / prof.elapsed_time


def test_summarize_and_save_csv_compute_the_metrics_themselves(tmp_path, capsys):
    prof = _finished_profiler([(3, 2, [(100.0, 0), (100.5, 1), (101.0, 2)], Session.SUCCESS)])
    prof.summarize("No compute_metrics call")
    assert "Successful requests".ljust(40) + "1".rjust(10) in capsys.readouterr().out
    prof.save_csv(str(tmp_path / "a.csv"), [])
    header, row = list(csv.reader(open(tmp_path / "a.csv")))
    assert header[0] == "completed" and row[0] == "1"  # empty hyperparams crash LMDeploy's save_csv


def test_appending_with_other_hyperparameters_never_misaligns_a_row(tmp_path):
    path = str(tmp_path / "runs.csv")
    one = _finished_profiler([(3, 2, [(100.0, 0), (101.0, 2)], Session.SUCCESS)])
    two = _finished_profiler(
        [(3, 2, [(100.0, 0), (101.0, 2)], Session.SUCCESS), (4, 2, [(100.0, 0), (102.0, 2)], Session.SUCCESS)]
    )
    one.save_csv(path, [("backend", "turbomind"), ("bs", 8)])
    two.save_csv(path, [("backend", "pytorch"), ("num_prompts", 2)])
    rows = list(csv.DictReader(open(path)))
    assert [(r["backend"], r["bs"], r["num_prompts"], r["completed"]) for r in rows] == [
        ("turbomind", "8", "", "1"),
        ("pytorch", "", "2", "2"),
    ]
    assert rows[1]["total_input_tokens"] == "7"


# ---- what we add -------------------------------------------------------------------------


def _mixed_run(slo=None) -> Profiler:
    return _finished_profiler(
        [
            (10, 3, [(100.0, 0), (100.1, 1), (100.2, 2), (100.4, 3)], Session.SUCCESS),
            (20, 3, [(100.0, 0), (100.5, 1), (100.6, 2), (100.7, 3)], Session.SUCCESS),
            (30, 3, [(100.0, 0), (101.0, 3)], Session.SUCCESS),
            (40, 3, [(100.0, 0), (100.3, 1)], Session.SUCCESS),  # incomplete
            (50, 3, [(100.0, 0)], Session.FAIL),
            (60, 3, [(100.0, 0), (100.2, 1)], Session.UNKNOWN),
        ],
        slo=slo,
    )


def test_failed_incomplete_and_unfinished_are_counted_with_reasons():
    prof = _finished_profiler(
        [
            (1, 2, [(100.0, 0), (100.2, 2)], Session.SUCCESS),
            (1, 2, [(100.0, 0)], Session.FAIL),
            (1, 2, [(100.0, 0)], Session.FAIL),
            (1, 2, [(100.0, 0), (100.2, 1)], Session.SUCCESS),
            (1, 2, [(100.0, 0)], Session.UNKNOWN),
        ]
    )
    prof.sessions[1].reason = prof.sessions[2].reason = "error: CUDA OOM"
    prof.compute_metrics()
    assert (prof.success, prof.failed, prof.incomplete, prof.unfinished) == (1, 2, 1, 1)
    assert prof.failure_reasons == {"error: CUDA OOM": 2, "incomplete": 1, "unfinished": 1}
    assert prof.summary()["failure_reasons"] == "error: CUDA OOM: 2; incomplete: 1; unfinished: 1"


def test_finish_records_reason_and_time():
    sess = Session(5, 5)
    sess.tick_at(0, 1.5)
    sess.finish(Session.FAIL, reason="abort", timestamp=2.25)
    assert (sess.status, sess.reason, sess.finish_time) == (Session.FAIL, "abort", 2.25)
    assert sess.ts[-1] == 1.5 and sess.ns[-1] == 0 and len(sess.ts) == 1


def test_finishing_moves_ticks_into_compact_arrays_with_the_same_values():
    sess = Session(5, 3)
    for n in (0, 1, 300, 70_000):
        sess.tick(n)
    ticks = (list(sess.ts), list(sess.ns))
    sess.finish(Session.SUCCESS)
    assert (sess.ts.typecode, sess.ns.typecode) == ("d", "q")
    assert (list(sess.ts), list(sess.ns)) == ticks
    sess.tick(70_001)  # a late tick still lands
    assert sess.ns[-1] == 70_001 and len(sess.ts) == 5


def test_token_counts_that_are_not_integers_survive_finish():
    sess = Session(5, 3)
    sess.tick(0)
    sess.tick(2.5)
    sess.finish(Session.SUCCESS)
    assert list(sess.ns) == [0, 2.5]


def test_ticks_of_every_kind_of_session_are_read_alike():
    """Packed arrays, lists (a running session, or one restored from a run's journal), a session caught
    between the two appends of a tick, and sessions with no or one tick: each is read as its own ticks."""
    ticks = [(100.0, 0), (100.5, 2), (100.75, 3), (101.5, 5)]
    prof = _finished_profiler([(1, 5, ticks, Session.SUCCESS)] * 2 + [(1, 5, ticks, Session.UNKNOWN)])
    restored = prof.sessions[1]
    restored.ts, restored.ns = list(restored.ts), list(restored.ns)
    prof.sessions[2].ts.append(102.0)  # its token count not appended yet
    prof.new_session(1, 5).finish(Session.FAIL, "no ticks", timestamp=101.0)
    one_tick = prof.new_session(1, 5)
    one_tick.tick_at(0, 100.2)
    table = prof.request_table()
    assert table["n_ticks"].tolist() == [4, 4, 4, 0, 1]
    assert table["output_len"].tolist() == [5, 5, 5, 0, 0]
    assert table["ttft_s"].tolist()[:3] == [0.5] * 3 and table["ttft_s"][3:].isna().all()
    assert table["tpot_s"].tolist()[:3] == [(101.5 - 100.5) / 3] * 3
    assert [list(itl) for itl in table["itl_s"]] == [[0.25, 0.75]] * 3 + [[], []]
    assert [list(steps) for steps in table["tokens_per_tick"]] == [[2, 1, 2]] * 3 + [[], []]
    assert prof.success == 2 and prof.itls.tolist() == [0.25, 0.75] * 2
    assert prof.sessions[0].ts.typecode == "d"  # read in place, and still free to grow
    prof.sessions[0].tick_at(6, 102.0)


def test_request_table_has_one_row_per_session_with_per_request_tpot():
    table = _mixed_run().request_table()
    assert list(table.columns) == [
        "index",
        "input_len",
        "req_output_len",
        "output_len",
        "status",
        "reason",
        "ttft_s",
        "tpot_s",
        "e2e_s",
        "itl_s",
        "tokens_per_tick",
        "n_ticks",
        "start_s",
        "finish_s",
    ]
    assert table["status"].tolist() == ["success", "success", "success", "incomplete", "failed", "unfinished"]
    assert table["output_len"].tolist() == [3, 3, 3, 1, 0, 1]
    assert table.loc[0, "tpot_s"] == (100.4 - 100.1) / 2
    assert table.loc[2, "tpot_s"] == 1.0 / 3  # one chunk carried every token: E2E / tokens
    assert table.loc[0, "itl_s"].tolist() == [100.2 - 100.1, 100.4 - 100.2]
    assert math.isnan(table.loc[4, "ttft_s"]) and math.isnan(table.loc[5, "finish_s"])
    assert table.loc[0, "finish_s"] == pytest.approx(0.4)  # finished at its last tick


def test_summary_keys_are_flat_with_std_min_max_and_any_percentile():
    prof = _finished_profiler(
        [(10, 1, [(100.0, 0), (100.0 + d, 1)], Session.SUCCESS) for d in (0.1, 0.2, 0.6)], percentages=(50, 99.9)
    )
    summary = prof.summary()
    assert summary["mean_e2e_ms"] == pytest.approx(300.0)
    assert summary["std_e2e_ms"] == pytest.approx(np.std([100.0, 200.0, 600.0]))
    assert (summary["min_e2e_ms"], summary["max_e2e_ms"]) == pytest.approx((100.0, 600.0))
    assert summary["p50_e2e_ms"] == pytest.approx(200.0)
    assert "p99.9_ttft_ms" in summary and "p50.0_e2e_ms" not in summary
    assert summary["completed"] == 3 and "goodput_rps" not in summary


def test_non_stream_summary_leaves_ttft_and_itl_unmeasured(capsys):
    prof = _finished_profiler([(10, 2, [(100.0, 0), (100.5, 2)], Session.SUCCESS)], stream=False)
    summary = prof.summary()
    assert math.isnan(summary["mean_ttft_ms"]) and math.isnan(summary["mean_itl_ms"])
    assert summary["mean_tpot_ms"] == pytest.approx(250.0)
    prof.summarize("Non stream")
    assert "TTFT" not in capsys.readouterr().out


def test_goodput_counts_requests_meeting_every_threshold():
    prof = _mixed_run(slo=SLO(ttft=0.6, e2e=0.8))
    prof.compute_metrics()
    # Successes: ttft 0.1/e2e 0.4 (good), ttft 0.5/e2e 0.7 (good), ttft 1.0 (too slow).
    assert prof.good_requests == 2
    assert prof.goodput == 2 / prof.elapsed_time
    tighter = prof.summary(SLO(tpot=0.12))
    assert tighter["good_requests"] == 1  # tpot 0.15 and 1/3 fail, 0.1 passes
    assert tighter["goodput_rps"] == 1 / prof.elapsed_time


def test_summarize_prints_extra_rows_below_lmdeploys_table(capsys):
    _mixed_run(slo=SLO(ttft=0.6)).summarize("Profile Pipeline API", [("Concurrency", 6)])
    lines = capsys.readouterr().out.splitlines()
    rules = [i for i, line in enumerate(lines) if set(line) == {"="}]
    extra = lines[rules[0] + 1 :]
    assert [line.split()[0] for line in extra[:3]] == ["Failed", "Incomplete", "Unfinished"]
    assert any(line.startswith("Goodput (req/s)") for line in extra)
    assert any(line.split() == ["std", "min", "max"] for line in extra)


# ---- live snapshot -----------------------------------------------------------------------


def _tick_round_robin(sessions: list[Session], chunks: int) -> None:
    for sess in sessions:
        sess.tick(0)
    for step in range(1, chunks + 1):
        for sess in sessions:
            sess.tick(step * 2)
    for i, sess in enumerate(sessions):
        sess.finish(Session.SUCCESS if i % 5 else Session.FAIL, reason="" if i % 5 else "error: boom")


def test_live_snapshot_while_ticking_from_another_thread_adds_up():
    prof = Profiler(True, [50])
    sessions = [prof.new_session(10, 40) for _ in range(200)]
    prof.start()
    worker = threading.Thread(target=_tick_round_robin, args=(sessions, 20))
    polls = []
    worker.start()
    while worker.is_alive():
        polls.append(prof.live_snapshot())
    worker.join()
    prof.finish()
    final = prof.live_snapshot()
    assert [p.output_tokens for p in polls] == sorted(p.output_tokens for p in polls)
    assert final.output_tokens == 200 * 40
    assert (final.completed, final.failed, final.in_flight, final.not_started) == (160, 40, 0, 0)
    table = prof.request_table()
    for live, values in (
        (final.ttft, table["ttft_s"].to_numpy()),
        (final.itl, np.concatenate(table["itl_s"].tolist())),
    ):
        every = BinnedLatencies.of(values)  # each value read once: the same bins and extremes as all of them
        assert np.array_equal(live.counts, every.counts) and (live.min_s, live.max_s) == (every.min_s, every.max_s)
    assert final.in_flight_over_time[-1] == 0


def test_live_series_bin_tokens_and_in_flight_requests_over_time():
    prof = Profiler(True, [50], live_bin_s=0.5)
    prof.start(10.0)
    early, late = prof.new_session(1, 4), prof.new_session(1, 2)
    for t, n in ((10.0, 0), (10.2, 2), (10.7, 4)):
        early.tick_at(n, t)
    early.finish(Session.SUCCESS, timestamp=10.7)
    for t, n in ((10.6, 0), (11.1, 1)):
        late.tick_at(n, t)
    running = prof.live_snapshot()
    assert (running.completed, running.in_flight, running.output_tokens) == (1, 1, 5)
    late.tick_at(2, 11.3)
    late.finish(Session.SUCCESS, timestamp=11.3)
    prof.finish(11.4)
    final = prof.live_snapshot()
    assert final.time_s.tolist() == [0.0, 0.5, 1.0]
    # Bins [10.0, 10.5) [10.5, 11.0) [11.0, 11.4]: the last one lasted 0.4 s.
    assert final.output_tokens_per_s.tolist() == pytest.approx([2 / 0.5, 2 / 0.5, 2 / 0.4])
    assert final.in_flight_over_time.tolist() == [1, 1, 0]
    for binned in (final.ttft, final.itl):
        assert _count_min_max(binned) == (2, pytest.approx(0.2), pytest.approx(0.5))
    assert (final.completed, final.in_flight, final.elapsed_s) == (2, 0, pytest.approx(1.4))


def test_two_pollers_never_count_a_tick_twice():
    prof = Profiler(True, [50])
    sessions = [prof.new_session(1, 30) for _ in range(100)]
    prof.start()
    worker = threading.Thread(target=_tick_round_robin, args=(sessions, 15))
    stop = threading.Event()

    def poll():
        while not stop.is_set():
            prof.live_snapshot()

    pollers = [threading.Thread(target=poll) for _ in range(2)]
    for thread in (worker, *pollers):
        thread.start()
    worker.join()
    stop.set()
    for thread in pollers:
        thread.join()
    final = prof.live_snapshot()
    assert final.output_tokens == 100 * 30
    assert final.ttft.count == 100 and final.itl.count == 100 * 14
    assert final.completed + final.failed == 100


def test_snapshot_values_do_not_change_after_they_are_returned():
    prof = Profiler(True, [50])
    prof.start(0.0)
    sess = prof.new_session(1, 5)
    for t, n in ((0.0, 0), (0.1, 1), (0.2, 2)):
        sess.tick_at(n, t)
    first = prof.live_snapshot()
    for k in range(3, 3000):
        sess.tick_at(k, 0.1 * k)
    prof.live_snapshot()
    assert _count_min_max(first.itl) == (1, pytest.approx(0.1), pytest.approx(0.1))
    assert not first.itl.counts.flags.writeable


def test_progress_counts_finished_sessions():
    prof = _mixed_run()
    assert (prof.progress.total, prof.progress.finished) == (6, 5)


def test_summary_tokens_per_tick_match_lmdeploys_statistics():
    profiler = Profiler(True, [50, 75, 95, 99])
    for chunks in ([0, 2, 3, 7], [0, 1, 5], [0, 4, 4, 9, 10]):
        session = profiler.new_session(8, chunks[-1])
        for step, n in enumerate(chunks):
            session.tick_at(n, 100.0 + step)
        session.finish(Session.SUCCESS)
    profiler.start(99.0)
    profiler.finish(110.0)
    profiler.compute_metrics()
    summary = profiler.summary()
    assert summary["mean_tokens_per_tick"] == profiler.tpts_mean
    assert [summary[f"p{q}_tokens_per_tick"] for q in (50, 75, 95, 99)] == [int(v) for v in profiler.tpts_stat]


def test_a_session_read_at_its_first_tick_is_not_counted_in_flight_twice():
    prof = Profiler(True, [50], live_bin_s=0.5)
    prof.start(0.0)
    sess = prof.new_session(1, 3)
    sess.tick_at(0, 0.0)
    assert prof.live_snapshot().in_flight == 1
    sess.tick_at(1, 0.1)  # the next poll re-reads tick 0 to difference against it
    assert prof.live_snapshot().in_flight == 1
    for n, t in ((2, 0.2), (3, 0.3)):
        sess.tick_at(n, t)
    sess.finish(Session.SUCCESS, timestamp=0.3)
    prof.finish(0.6)
    final = prof.live_snapshot()
    assert (final.in_flight, final.not_started, final.in_flight_over_time.tolist()) == (0, 0, [0, 0])
    assert _count_min_max(final.ttft) == (1, pytest.approx(0.1), pytest.approx(0.1))
    assert _count_min_max(final.itl) == (2, pytest.approx(0.1), pytest.approx(0.1))


def test_in_flight_counts_admitted_requests_not_sessions_that_ticked_at_t0():
    """Batch load: every session ticks 0 at t0, the engine admits two at a time."""
    prof = Profiler(True, [50], live_bin_s=0.5, records_admissions=True)
    prof.start(0.0)
    sessions = [prof.new_session(1, 2) for _ in range(4)]
    for sess in sessions:
        sess.tick_at(0, 0.0)
    sessions[0].admit(0.0)
    sessions[1].admit(0.0)
    snap = prof.live_snapshot()
    assert (snap.in_flight, snap.not_started) == (2, 2)

    def serve(sess, start):
        sess.tick_at(1, start + 0.2)
        sess.tick_at(2, start + 0.4)
        sess.finish(Session.SUCCESS, timestamp=start + 0.4)

    for sess in sessions[:2]:
        sess.tick_at(1, 0.2)
    assert prof.live_snapshot().in_flight == 2
    for sess in sessions[:2]:
        sess.tick_at(2, 0.4)
        sess.finish(Session.SUCCESS, timestamp=0.4)
    sessions[2].admit(0.4)
    snap = prof.live_snapshot()
    assert (snap.completed, snap.in_flight, snap.not_started) == (2, 1, 1)
    sessions[3].admit(0.6)
    serve(sessions[2], 0.4)
    serve(sessions[3], 0.6)
    prof.finish(1.0)
    final = prof.live_snapshot()
    assert (final.completed, final.in_flight, final.not_started) == (4, 0, 0)
    # In flight at the end of [0, 0.5) and [0.5, 1.0), and at 1.0: one, one, then none.
    assert final.in_flight_over_time.tolist() == [1, 1, 0]
    assert final.ttft.count == 4 and final.output_tokens == 8


def test_in_flight_is_capped_where_the_engine_admits_behind_its_own_batch_size():
    """LMDeploy's batch call takes every request at t0; its max_batch_size runs four at once."""
    prof = Profiler(True, [50], live_bin_s=0.5, records_admissions=True, max_in_flight=4)
    prof.start(0.0)
    sessions = [prof.new_session(1, 1) for _ in range(16)]
    for sess in sessions:
        sess.tick_at(0, 0.0)
        sess.admit(0.0)
    assert prof.live_snapshot().in_flight == 4
    for k, sess in enumerate(sessions):
        sess.tick_at(1, 0.1 * (k + 1))
        sess.finish(Session.SUCCESS, timestamp=0.1 * (k + 1))
    prof.finish(1.6)
    final = prof.live_snapshot()
    assert final.in_flight == 0 and final.in_flight_over_time.max() == 4 and final.in_flight_over_time[-1] == 0


def test_requests_left_running_when_the_run_ends_leave_the_in_flight_count():
    prof = Profiler(True, [50], live_bin_s=0.5, records_admissions=True)
    prof.start(0.0)
    sess = prof.new_session(1, 8)
    sess.admit(0.0)
    sess.tick_at(0, 0.0)
    assert prof.live_snapshot().in_flight == 1
    prof.finish(0.7)  # the engine broke: the session never finished
    final = prof.live_snapshot()
    assert (final.in_flight, final.in_flight_over_time.tolist()) == (0, [1, 0])
    sess.finish(Session.FAIL, timestamp=0.8)  # a late finish is not counted out twice
    assert prof.live_snapshot().in_flight_over_time.min() == 0


def test_cancelled_requests_are_counted_apart_from_failures():
    prof = Profiler(True, [50], records_admissions=True)
    prof.start(0.0)
    done, running, waiting = (prof.new_session(1, 1) for _ in range(3))
    for sess in (done, running):
        sess.admit(0.0)
        sess.tick_at(0, 0.0)
    done.tick_at(1, 0.1)
    done.finish(Session.SUCCESS, timestamp=0.1)
    running.finish(Session.CANCELLED, "cancelled", timestamp=0.2)
    waiting.finish(Session.CANCELLED, "cancelled", timestamp=0.2)
    prof.finish(0.2)
    snap = prof.live_snapshot()
    assert (snap.completed, snap.failed, snap.cancelled, snap.in_flight) == (1, 0, 2, 0)
    prof.compute_metrics()
    assert (prof.success, prof.failed, prof.cancelled, prof.failure_reasons) == (1, 0, 2, {})
    assert prof.summary()["cancelled"] == 2
