"""The per-request timeline: its bars against a real run's ticks, its colours per outcome, its size on 10,000
requests."""

from __future__ import annotations

import numpy as np
import pytest
from profiled_runs import profiled_run

from bench_core.config import DatasetConfig, EngineConfig, LoadConfig, RunConfig
from bench_core.measure.profiler import Profiler, Session
from bench_core.run.runner import Runner
from bench_core.states import RequestStatus
from bench_core.store.history import History
from bench_core.views import timeline


def _bars(fig, segment: str) -> dict[int, tuple[float, float, str]]:
    """request index -> (start, end, outcome) of each bar of one segment kind."""
    bars = {}
    for trace in fig.data:
        outcome, kind = trace.name.split(": ")
        if kind != segment:
            continue
        base, length = np.asarray(trace.base, dtype=np.float64), np.asarray(trace.x, dtype=np.float64)
        for left, width, hover in zip(base, length, trace.customdata):
            bars[int(hover[0])] = (left, left + width, outcome)
    return bars


@pytest.fixture(scope="module")
def queued_run(tmp_path_factory, tiny_model_path):
    """A real tiny-llama run of 6 requests on 2 slots: the last four wait for a slot."""
    runner = Runner(History(tmp_path_factory.mktemp("results")))
    config = RunConfig(
        engine=EngineConfig(backend="transformers", model="builtin:tiny-llama"),
        dataset=DatasetConfig(
            dataset="builtin:sample",
            dataset_name="random",
            num_prompts=6,
            random_input_len=16,
            random_output_len=8,
            random_range_ratio=1.0,
        ),
        load=LoadConfig(load_pattern="batch", concurrency=2, stream_output=True),
    )
    run = runner.submit(config)
    assert run.wait(120) and run.state == "finished", run.message
    runner.shutdown()
    return run


def test_each_bar_runs_from_the_requests_first_tick_to_its_first_token_to_its_end(queued_run):
    profiler = queued_run.measurement.profiler
    fig = timeline.request_timeline(queued_run.record.requests, end_s=profiler.elapsed_time)
    waiting, decoding = _bars(fig, timeline.WAITING), _bars(fig, timeline.DECODING)
    assert sorted(waiting) == sorted(decoding) == list(range(6))
    for index, session in enumerate(profiler.sessions):
        first_token = next(t for t, n in zip(session.ts, session.ns) if n > 0)
        start, end = session.ts[0] - profiler.t_start, session.finish_time - profiler.t_start
        assert waiting[index][:2] == pytest.approx((start, first_token - profiler.t_start), abs=1e-9)
        assert decoding[index][:2] == pytest.approx((first_token - profiler.t_start, end), abs=1e-9)
        assert waiting[index][2] == decoding[index][2] == "completed"
    # Batch: every request starts at t0, and the four behind the two slots wait for a first token the longest.
    ttfts = sorted(end - start for start, end, _ in waiting.values())
    assert ttfts[-1] > 2 * ttfts[0]


def test_rows_follow_the_start_order_with_the_first_request_on_top():
    prof = Profiler(True, [50])
    prof.start(0.0)
    for start in (0.3, 0.1, 0.2):  # sent out of index order
        sess = prof.new_session(5, 2)
        sess.tick_at(0, start)
        sess.tick_at(2, start + 0.05)
        sess.finish(Session.SUCCESS, "length", timestamp=start + 0.05)
    prof.finish(1.0)
    fig = timeline.request_timeline(prof.request_table())
    (waiting, _) = fig.data
    rows = dict(zip(np.asarray(waiting.y).tolist(), (int(hover[0]) for hover in waiting.customdata)))
    assert [rows[row] for row in sorted(rows)] == [1, 2, 0]
    assert fig.layout.yaxis.autorange == "reversed"


def test_each_outcome_has_its_own_colour_and_a_request_without_a_first_token_only_waits():
    prof = profiled_run([0.1, 0.2])  # two completed, one truncated, one failed before a token, one unfinished
    cancelled = prof.new_session(10, 4)
    cancelled.tick_at(0, 0.0)
    cancelled.finish(Session.CANCELLED, "cancelled", timestamp=0.7)
    table = prof.request_table()
    fig = timeline.request_timeline(table, end_s=prof.elapsed_time)
    colours = {}
    for trace in fig.data:
        outcome = trace.name.split(": ")[0]
        colours.setdefault(outcome, set()).add(trace.marker.color)
    expected = {
        RequestStatus.SUCCESS,
        RequestStatus.INCOMPLETE,
        RequestStatus.FAILED,
        RequestStatus.UNFINISHED,
        RequestStatus.CANCELLED,
    }
    assert colours == {timeline.OUTCOMES[status][0]: {timeline.OUTCOMES[status][1]} for status in expected}
    assert len({colour for (colour,) in colours.values()}) == len(expected)
    waiting, decoding = _bars(fig, timeline.WAITING), _bars(fig, timeline.DECODING)
    failed = int(table.index[table["status"] == RequestStatus.FAILED][0])
    assert waiting[failed][:2] == pytest.approx((0.0, 0.5)) and decoding[failed][0] == decoding[failed][1]
    unfinished = int(table.index[table["status"] == RequestStatus.UNFINISHED][0])
    assert decoding[unfinished][1] == pytest.approx(prof.elapsed_time)  # still running at the run's end
    assert waiting[cancelled_index := len(table) - 1][1] == pytest.approx(0.7)
    assert waiting[cancelled_index][2] == "cancelled"


def test_ten_thousand_requests_are_a_few_traces_and_a_bounded_subset_that_says_so():
    prof = Profiler(True, [50])
    prof.start(0.0)
    statuses = (Session.SUCCESS, Session.FAIL, Session.CANCELLED)
    for i in range(10_000):
        sess = prof.new_session(8, 4)
        start = i * 0.001
        sess.tick_at(0, start)
        sess.tick_at(4, start + 0.02)
        sess.finish(statuses[i % 3], timestamp=start + 0.03)
    prof.finish(11.0)
    fig = timeline.request_timeline(prof.request_table())
    assert len(fig.data) == 2 * len(statuses)  # one trace per outcome and segment, not one per request
    drawn = sum(len(trace.y) for trace in fig.data if trace.name.endswith(timeline.DECODING))
    assert drawn == timeline.MAX_TIMELINE_REQUESTS
    assert fig.layout.title.subtitle.text == "Every 5th request in start order: 2,000 of 10,000 drawn"


def test_a_table_of_requests_never_sent_says_no_data():
    prof = Profiler(True, [50])
    prof.new_session(8, 4)
    prof.finish(1.0)
    fig = timeline.request_timeline(prof.request_table())
    assert not fig.data and fig.layout.title.text == timeline.TITLE
