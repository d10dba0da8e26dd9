"""A run's time left: replayed from real recorded runs, a batched prefill with and without a past run, the tail, and
which past runs count.

The recorded runs are real runs of the tiny Llama on the embedded engine, kept in tests/data/time_left/ (a history the
runner wrote) so that their replays say the same on any machine: recorded live, a past run's pace depended on what
else the machine ran meanwhile (a busy spell between two runs made the same one read 2-8x). Record them again, on a
quiet machine, after a change to what a run records:

    RECORD_TIME_LEFT_RUNS=1 .venv/bin/python -m pytest tests/test_time_left.py
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from time import perf_counter

import pandas as pd
import pytest
from profiled_runs import replayed_until

from bench_core.config import DatasetConfig, EngineConfig, LoadConfig, RunConfig
from bench_core.measure.profiler import Profiler, Session
from bench_core.measure.time_left import PastPace, describe_time_left, output_rate, past_pace, step_s, time_left_s
from bench_core.run.runner import Runner
from bench_core.store.history import History

DATA = Path(__file__).resolve().parent / "data"
RECORDINGS = DATA / "time_left"
RECORD = os.environ.get("RECORD_TIME_LEFT_RUNS") == "1"
# The share of a run after which the estimate must be within WITHIN times the time really left (issue 25 item 3).
CHECKED_AT = (0.2, 0.5, 0.8)
WITHIN = 2.0


def _tiny(load_pattern: str, num_prompts: int, concurrency: int, input_len: int, output_len: int) -> RunConfig:
    return RunConfig(
        engine=EngineConfig(backend="transformers", model="builtin:tiny-llama"),
        dataset=DatasetConfig(
            dataset="builtin:sample",
            dataset_name="random",
            num_prompts=num_prompts,
            random_input_len=input_len,
            random_output_len=output_len,
            random_range_ratio=0.5,
        ),
        load=LoadConfig(load_pattern=load_pattern, concurrency=concurrency, stream_output=True),
    )


# Batch mode in waves (16 requests, 4 at a time), batch mode all at once behind long prompts (its prefill takes half
# the run, and no request has its first token after a fifth of it), and 3 workers: real runs of the tiny Llama on the
# embedded engine, recorded in a real history. The long prompts are recorded twice: the first run is the past run the
# second's prefill is told from.
RECORDED = {
    "batch in waves": _tiny("batch", 16, 4, 64, 256),
    "batch, long prompts at once": _tiny("batch", 12, 12, 1024, 96),
    "concurrency": _tiny("concurrency", 12, 3, 64, 256),
}
PAST_RUN = "batch, long prompts at once"


def _record() -> None:
    """Run RECORDED (the past run first) into a fresh RECORDINGS, with which run is which in recorded.json."""
    shutil.rmtree(RECORDINGS, ignore_errors=True)
    runner = Runner(History(RECORDINGS))
    try:
        past = runner.submit(RECORDED[PAST_RUN])
        assert past.wait(300) and past.state == "finished", past.message
        runs = {name: runner.submit(config) for name, config in RECORDED.items()}
        for run in runs.values():
            assert run.wait(300) and run.state == "finished", run.message
    finally:
        runner.shutdown()
    (RECORDINGS / "recorded.json").write_text(json.dumps({name: run.run_id for name, run in runs.items()}, indent=1))


@pytest.fixture(scope="module")
def recorded_runs(tmp_path_factory) -> dict[str, tuple[pd.DataFrame, PastPace | None]]:
    """Per recorded run: its request table, and the pace its history (the other runs) gave it. Read from a copy: a
    first read builds the history's index, which is no file of the repository's."""
    if RECORD:
        _record()
    copy = tmp_path_factory.mktemp("time_left") / "results"
    shutil.copytree(RECORDINGS, copy)
    history = History(copy)
    rows = history.load()
    run_ids = json.loads((RECORDINGS / "recorded.json").read_text())
    assert set(run_ids) == set(RECORDED) and len(rows) == len(RECORDED) + 1
    return {
        name: (history.requests(run_id), past_pace(rows[rows["run_id"] != run_id], RECORDED[name]))
        for name, run_id in run_ids.items()
    }


def _ratios(requests: pd.DataFrame, concurrency: int, pace: PastPace | None = None) -> list[float | None]:
    """The estimate over the time really left at each CHECKED_AT share of the run (None: "estimating")."""
    end = float(requests["finish_s"].max())
    ratios = []
    for share in CHECKED_AT:
        left = time_left_s(replayed_until(requests, share * end, concurrency).live_snapshot(), pace)
        ratios.append(None if left is None else left / ((1 - share) * end))
    return ratios


@pytest.mark.parametrize("name", list(RECORDED))
def test_recorded_runs_replayed_are_estimated_within_twice_the_time_left_after_a_fifth_of_the_run(recorded_runs, name):
    requests, pace = recorded_runs[name]
    ratios = _ratios(requests, RECORDED[name].load.concurrency, pace)
    print(name, "estimate / time left at", CHECKED_AT, ":", ratios)
    assert all(ratio is not None and 1 / WITHIN <= ratio <= WITHIN for ratio in ratios), ratios
    if name == PAST_RUN:  # its own output says nothing in a fifth of the run: its prefill is under way
        assert _ratios(requests, RECORDED[name].load.concurrency)[0] is None


def test_a_run_recorded_in_the_repo_replays_within_twice_the_time_left():
    # Batch mode, 4 requests 2 at a time (154 to 568 tokens): the 568-token one decodes alone at the end.
    requests = pd.read_parquet(DATA / "history_round2" / "runs" / "20261201-104433-ef6e" / "requests.parquet")
    ratios = _ratios(requests, 2)
    assert all(ratio is not None and 1 / WITHIN <= ratio <= WITHIN for ratio in ratios), ratios


def _batched_prefill(seconds_in: float) -> tuple[Profiler, list[Session], float]:
    """A batch run of 8 requests of 100 tokens `seconds_in` seconds along, every request taken at its start and
    none with a token yet."""
    prof = Profiler(True, [50])
    t0 = perf_counter() - seconds_in
    prof.start(t0)
    sessions = [prof.new_session(512, 100) for _ in range(8)]
    for sess in sessions:
        sess.tick_at(0, t0)
    return prof, sessions, t0


def test_a_batched_prefill_is_estimating_without_a_past_run_and_told_from_one_with_it():
    prof, _, _ = _batched_prefill(10.0)
    snap = prof.live_snapshot()
    assert time_left_s(snap) is None and describe_time_left(snap) == "estimating…"
    # Past runs of the model made 40 output tok/s: these 800 tokens take 20 s, of which 10 s have gone.
    pace = PastPace(tokens_per_s=40.0, output_tokens_per_request=None, load_seconds=None, runs=2)
    assert time_left_s(snap, pace) == pytest.approx(10.0, abs=0.1)
    assert describe_time_left(snap, pace) == "about 10 s left"
    # A prefill already longer than the past runs' whole time proves them wrong for this one.
    assert time_left_s(_batched_prefill(25.0)[0].live_snapshot(), pace) is None
    # Two requests decode between the others' prefill chunks, at a rate that says nothing of the decode to come.
    prof, sessions, t0 = _batched_prefill(10.0)
    for step in range(1, 20):
        for sess in sessions[:2]:
            sess.tick_at(step, t0 + 8.0 + 0.1 * step)
    snap = prof.live_snapshot()
    assert (snap.in_flight, snap.decoding) == (8, 2)
    assert time_left_s(snap) is None and time_left_s(snap, pace) == pytest.approx(10.0, abs=0.1)


def test_after_a_batched_prefill_the_time_left_is_the_decode_rate_not_the_whole_runs_pace():
    # 10 s of prefill, then 2 s of decoding at 100 tok/s (8 requests, 1 token each per 80 ms step): 200 of the
    # 800 tokens, so 6 s left. The pace of the whole run (200 tokens in 12 s) would say 36 s.
    prof, sessions, t0 = _batched_prefill(12.0)
    for step in range(25):
        for sess in sessions:
            sess.tick_at(step + 1, t0 + 10.0 + 0.08 * step)
    snap = prof.live_snapshot()
    assert snap.first_output_s == pytest.approx(10.0) and snap.decoding == 8 and snap.longest_left == 75
    assert time_left_s(snap) == pytest.approx(6.0, rel=0.1)
    assert time_left_s(snap, PastPace(1.0, None, None, 1)) == pytest.approx(6.0, rel=0.1)  # its own output rules


def test_right_after_the_last_prefill_the_rate_is_the_requests_decoding_over_their_step():
    # Four requests of 100 tokens at once: two have their first token at 1 s and wait through the other two's
    # prefill (two 1 s stalls), which ends at 3 s; then all four decode a token per 10 ms step. 0.4 s later fewer
    # than two whole bins lie after the prefill, and output since the first token (2.4 s, 168 tokens: 70 tok/s)
    # would tell 3.3 s for the 232 tokens left. Four a step of 10 ms is 400 tok/s: 0.58 s, the tail (59 steps,
    # 0.59 s) about as long.
    prof = Profiler(True, [50])
    t0 = perf_counter() - 3.4
    prof.start(t0)
    sessions = [prof.new_session(1024, 100) for _ in range(4)]
    for sess in sessions:
        sess.tick_at(0, t0)
    for sess in sessions[:2]:
        sess.tick_at(1, t0 + 1.0)
        sess.tick_at(2, t0 + 2.0)
        sess.tick_at(3, t0 + 3.0)
    for sess in sessions[2:]:
        sess.tick_at(1, t0 + 3.0)
    for step in range(1, 41):
        for sess in sessions:
            sess.tick_at(sess.ns[-1] + 1, t0 + 3.0 + 0.01 * step)
    snap = prof.live_snapshot()
    assert snap.decoding == 4 and snap.latest_first_token_s == pytest.approx(3.0) and snap.longest_left == 59
    assert output_rate(snap) == pytest.approx(168 / 2.4, rel=0.01) and step_s(snap) == pytest.approx(0.01, rel=0.02)
    assert time_left_s(snap) == pytest.approx(0.5 * 59 * 0.01 + 0.5 * 232 / 400, rel=0.03)
    assert describe_time_left(snap) == "under 1 s left"  # not "about 0 s left"


def test_the_longest_request_still_decoding_lengthens_the_time_left_by_half_its_steps_beyond_the_rate():
    # Three requests decode one token per 100 ms step each (30 tok/s); 3 s in, they have 5, 5 and 50 tokens left:
    # 60 tokens are 2 s at 30 tok/s, but the long one needs 50 more steps: 5 s at this step time if a step's time
    # is all fixed, 50 tokens at 10 tok/s-a-sequence if it is all per sequence. Half of each: 3.5 s.
    prof = Profiler(True, [50])
    t0 = perf_counter() - 3.0
    prof.start(t0)
    sessions = [prof.new_session(8, output_len) for output_len in (35, 35, 80)]
    for sess in sessions:
        sess.tick_at(0, t0)
        for step in range(1, 31):
            sess.tick_at(step, t0 + 0.1 * step - 0.05)
    snap = prof.live_snapshot()
    assert snap.decoding == 3 and snap.longest_left == 50
    assert output_rate(snap) == pytest.approx(30.0) and step_s(snap) == pytest.approx(0.1, rel=0.02)
    assert time_left_s(snap) == pytest.approx(0.5 * 50 * step_s(snap) + 0.5 * 60 / 30.0)


def _row(**cells) -> dict:
    return {
        "model": "builtin:tiny-llama",
        "backend": "transformers",
        "status": "finished",
        "load_pattern": "batch",
        "concurrency": 4,
        "dataset": "builtin:sample",
        "dataset_name": "random",
        "random_input_len": 64,
        "random_output_len": 256,
        "random_range_ratio": 0.5,
        "output_throughput": 100.0,
        "total_output_tokens": 1600,
        "completed": 8,
        "load_seconds": 3.0,
        **cells,
    }


def test_the_past_pace_is_that_of_the_runs_most_like_this_one():
    config = _tiny("batch", 16, 4, 64, 256)
    history = pd.DataFrame(
        [
            _row(),
            _row(output_throughput=300.0),  # the same: the median of 100 and 300
            _row(output_throughput=1.0, random_output_len=16, total_output_tokens=80),  # other lengths
            _row(output_throughput=2.0, load_pattern="concurrency"),  # another load pattern
            _row(output_throughput=3.0, concurrency=8),  # a farther concurrency
            _row(output_throughput=4.0, model="builtin:smollm2-135m"),
            _row(output_throughput=5.0, status="failed"),
        ]
    )
    pace = past_pace(history, config)
    assert pace == PastPace(tokens_per_s=200.0, output_tokens_per_request=200.0, load_seconds=3.0, runs=5)
    # Without a run of its lengths, the nearest concurrency of its load pattern; without one of its model, none.
    other_lengths = _tiny("batch", 16, 4, 64, 512)
    assert past_pace(history, other_lengths).tokens_per_s == pytest.approx(100.0)  # 100, 300, 1 at 4: median
    assert past_pace(history, _tiny("batch", 16, 8, 64, 512)).tokens_per_s == pytest.approx(3.0)
    assert past_pace(history[history["model"] == "builtin:smollm2-135m"], config) is None
    assert past_pace(pd.DataFrame(), config) is None
    # Its lengths count before its load pattern: a batch of other lengths says less of its pace than its own lengths
    # under another load pattern.
    lengths_or_pattern = pd.DataFrame(
        [
            _row(output_throughput=10.0, random_output_len=16, total_output_tokens=80),
            _row(output_throughput=50.0, load_pattern="concurrency"),
        ]
    )
    assert past_pace(lengths_or_pattern, config).tokens_per_s == pytest.approx(50.0)


@pytest.mark.slow  # it runs the embedded engine twice
def test_a_run_submitted_to_a_runner_with_a_history_carries_the_pace_of_its_past_runs(tmp_path, tiny_model_path):
    history = History(tmp_path / "results")
    runner = Runner(history)
    config = _tiny("batch", 2, 2, 16, 8)
    try:
        first = runner.submit(config)
        assert first.measurement.pace is None  # nothing in the history yet
        assert first.wait(120) and first.state == "finished", first.message
        second = runner.submit(config)
        assert second.measurement.pace is not None
        assert second.measurement.pace.tokens_per_s == pytest.approx(first.record.metrics["output_throughput"])
        assert second.wait(120)
    finally:
        runner.shutdown()
