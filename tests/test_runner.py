"""Background runs on the real tiny model: states, queue, cancel, engine reuse and failures."""

import time

import pytest

from bench_core.config import DatasetConfig, EngineConfig, LoadConfig, RunConfig
from bench_core.engines.transformers_engine import TransformersEngine
from bench_core.errors import ConfigError
from bench_core.run.observer import JobObserver
from bench_core.run.runner import Runner
from bench_core.store.history import History

# Each test here runs a real engine, server, app script or process for seconds: not in the fast suite.
pytestmark = pytest.mark.slow


def tiny_config(num_prompts=8, output_len=16, concurrency=4, stream=True, **engine) -> RunConfig:
    return RunConfig(
        engine=EngineConfig(backend="transformers", model="builtin:tiny-llama", **engine),
        dataset=DatasetConfig(
            dataset="builtin:sample",
            dataset_name="random",
            num_prompts=num_prompts,
            random_input_len=16,
            random_output_len=output_len,
            random_range_ratio=1.0,
        ),
        load=LoadConfig(concurrency=concurrency, stream_output=stream),
    )


@pytest.fixture
def runner(tmp_path, tiny_model_path):
    runner = Runner(History(tmp_path / "results"))
    yield runner
    runner.shutdown()


def test_a_run_goes_through_its_states_and_is_recorded(runner):
    seen, phases = [], []

    class States(JobObserver):  # every move as the run tells it, however briefly a state lasts on a busy machine
        def on_state(self, job, change):
            seen.append(change.state)
            phases.append(change.phase)

    run = runner.submit(tiny_config(), observers=[States()])
    assert run.wait(120)  # a hung test's bound
    assert run.state == "finished", run.message
    assert "running" in seen
    rows = runner.history.load()
    assert list(rows["run_id"]) == [run.run_id] and list(rows["status"]) == ["finished"]
    # Loading (tokenizer, sampling, engine, warm-up) is timed apart from the measured run, and the end is dated.
    assert rows["load_seconds"].iloc[0] > 0 and rows["finished_at"].iloc[0] >= rows["started_at"].iloc[0]
    assert "measuring" in phases and any(phase.startswith("loading") for phase in phases)
    assert run.record.metrics["completed"] == 8
    assert run.record.lmdeploy_columns["total_output_tokens"] == 8 * 16


def test_second_run_waits_in_the_queue_and_says_how_many_are_ahead(runner):
    first = runner.submit(tiny_config(num_prompts=32, output_len=64))
    second = runner.submit(tiny_config())
    assert second.state == "queued" and runner.queue_position(second) == 1
    assert first.wait(120) and second.wait(120)
    assert (first.state, second.state) == ("finished", "finished")
    assert runner.queue_position(second) == 0


def test_cancel_stops_at_the_step_in_progress_and_keeps_what_was_measured(runner):
    run = runner.submit(tiny_config(num_prompts=200, output_len=256, concurrency=4))
    deadline = time.monotonic() + 60
    while (run.snapshot() is None or run.snapshot().completed < 2) and time.monotonic() < deadline:
        time.sleep(0.05)
    run.cancel()
    cancelled_at = time.perf_counter()  # the clock of the tokens' stamps
    assert run.wait(120)  # a hung test's bound: then the measured part is recorded
    assert run.state == "cancelled"
    # The engine stopped at the step in progress, by its own token stamps: no request got more than that step's
    # token (and one whose stop check had just passed) after the cancel, though each had up to 254 left.
    after_cancel = [sum(ts > cancelled_at for ts in session.ts) for session in run.profiler.sessions]
    assert max(after_cancel) <= 2, after_cancel
    table = run.profiler.request_table()
    assert (table["status"] == "success").sum() >= 2
    # Those running at the cancel and those waiting are cancelled: the engine failed none of them.
    assert set(table["status"]) == {"success", "cancelled"}
    assert set(table.loc[table["status"] == "cancelled", "reason"]) == {"cancelled"}
    assert (run.record.metrics["failed"], run.record.metrics["failure_reasons"]) == (0, "")
    assert run.record.metrics["cancelled"] == 200 - run.record.metrics["completed"]
    final = run.snapshot()
    assert (final.failed, final.in_flight, final.in_flight_over_time[-1]) == (0, 0, 0)
    assert list(runner.history.load()["status"]) == ["cancelled"]


def test_engine_is_reused_while_its_settings_are_unchanged(runner):
    first = runner.submit(tiny_config(concurrency=2))
    second = runner.submit(tiny_config(concurrency=6, output_len=8))
    third = runner.submit(tiny_config(dtype="float32"))
    for run in (first, second, third):
        assert run.wait(120) and run.state == "finished", run.message
    assert second.measurement.engine_info is first.measurement.engine_info
    assert third.measurement.engine_info is not first.measurement.engine_info


def test_a_changed_kv_cache_setting_applies_to_the_next_run(runner):
    """The cache sizing knobs are recorded with a run, so the run must use them, not the loaded engine's."""
    starved = runner.submit(tiny_config(num_prompts=2, num_blocks=1, cache_block_seq_len=16))
    roomy = runner.submit(tiny_config(num_prompts=2, num_blocks=8, cache_block_seq_len=16))
    assert starved.wait(120) and roomy.wait(120)
    assert starved.state == "failed" and "cache has 1" in starved.message
    assert roomy.state == "finished", roomy.message


def test_an_engine_exception_fails_the_run_with_its_message_and_the_next_run_works(runner, monkeypatch):
    real_stream = TransformersEngine.stream

    def stream_then_break(self, *args, **kwargs):
        for count, event in enumerate(real_stream(self, *args, **kwargs)):
            if count == 20:
                raise RuntimeError("kernel exploded")  # injected fault inside a real engine's stream
            yield event

    monkeypatch.setattr(TransformersEngine, "stream", stream_then_break)
    broken = runner.submit(tiny_config())
    assert broken.wait(120)
    assert broken.state == "failed" and "kernel exploded" in broken.message
    assert list(runner.history.load()["status"]) == ["failed"]

    monkeypatch.setattr(TransformersEngine, "stream", real_stream)
    healthy = runner.submit(tiny_config())
    assert healthy.wait(120) and healthy.state == "finished"


def test_a_run_whose_record_cannot_be_made_says_so_and_the_next_run_works(runner, monkeypatch):
    import bench_core.run.runner as runner_module

    real_roofline = runner_module.run_roofline

    def broken_roofline(*args, **kwargs):
        raise RuntimeError("roofline bug")  # injected fault: a defect in summing up a run that did finish

    monkeypatch.setattr(runner_module, "run_roofline", broken_roofline)
    broken = runner.submit(tiny_config())
    assert broken.wait(120) and broken.state == "finished"
    assert "could not be made (RuntimeError: roofline bug)" in broken.measurement.save_error
    assert runner.history.load().empty  # not said to be saved, and nothing half-written

    monkeypatch.setattr(runner_module, "run_roofline", real_roofline)
    healthy = runner.submit(tiny_config())  # the worker lives on
    assert healthy.wait(120) and healthy.state == "finished" and not healthy.measurement.save_error
    assert list(runner.history.load()["run_id"]) == [healthy.run_id]


def test_a_model_that_cannot_load_fails_with_one_sentence_and_is_recorded_as_tried(runner, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{}")  # a model folder, whose tokenizer and weights cannot load
    run = runner.submit(
        RunConfig(
            engine=EngineConfig(backend="transformers", model=str(broken)),
            dataset=DatasetConfig(dataset="builtin:sample", num_prompts=2),
        )
    )
    assert run.wait(60)
    assert run.state == "failed" and run.user_error and not run.refused
    assert "Could not load the tokenizer" in run.message and "\n" not in run.message
    (row,) = runner.history.load().to_dict("records")
    assert (row["run_id"], row["status"], row["error"]) == (run.run_id, "failed", run.message)
    assert row["model"] == str(broken) and row["finished_at"] >= row["started_at"]
    assert row["load_seconds"] >= 0
    assert run.record.requests is None


def test_a_model_that_is_not_there_is_refused_before_anything_is_queued(runner, tmp_path):
    config = RunConfig(
        engine=EngineConfig(backend="transformers", model=str(tmp_path / "missing")),
        dataset=DatasetConfig(dataset="builtin:sample", num_prompts=2),
    )
    with pytest.raises(ConfigError, match="No model folder"):
        runner.submit(config)
    assert runner.runs() == [] and runner.history.load().empty


def test_input_refused_while_loading_is_not_recorded(runner, tmp_path):
    """A file found only once read to be no dataset is a typo too: the run fails, refused, with no history row."""
    not_json = tmp_path / "notes.txt"
    not_json.write_text("hello")
    run = runner.submit(
        RunConfig(
            engine=EngineConfig(backend="transformers", model="builtin:tiny-llama"),
            dataset=DatasetConfig(dataset=str(not_json), num_prompts=2),
        )
    )
    assert run.wait(60)
    assert run.state == "failed" and run.refused and "is not JSON" in run.message
    assert runner.history.load().empty and run.record is None


def test_impossible_settings_are_refused_before_anything_is_queued(runner):
    config = tiny_config()
    config.load.concurrency = 0
    with pytest.raises(ConfigError, match="--concurrency must be a whole number from 1"):
        runner.submit(config)
    assert runner.runs() == []


def test_a_run_cancelled_while_queued_never_starts(runner):
    first = runner.submit(tiny_config(num_prompts=16, output_len=32))
    queued = runner.submit(tiny_config())
    queued.cancel()
    assert queued.wait(0.5) and queued.state == "cancelled"  # at once, not when it reaches the front
    assert runner.queue_position(queued) == 0
    assert first.wait(120) and first.state == "finished"
    assert queued.profiler is None
    assert list(runner.history.load()["run_id"]) == [first.run_id]


@pytest.mark.parametrize(
    "num_prompts, concurrency, load_pattern",
    [(4, 4, "batch"), (3, 4, "batch"), (16, 4, "batch"), (6, 2, "concurrency")],
)
def test_in_flight_never_exceeds_concurrency_or_prompts_and_ends_at_zero(
    runner, num_prompts, concurrency, load_pattern
):
    config = tiny_config(num_prompts=num_prompts, output_len=24, concurrency=concurrency)
    config.load.load_pattern = load_pattern
    run = runner.submit(config)
    polled = []
    while not run.wait(0.01):
        if (snap := run.snapshot()) is not None:
            polled.append(snap.in_flight)
    assert run.state == "finished", run.message
    final = run.snapshot()
    most = min(concurrency, num_prompts)
    assert 1 <= max(polled) <= most
    assert final.in_flight_over_time.max() <= most
    assert (final.in_flight, final.not_started, final.in_flight_over_time[-1]) == (0, 0, 0)


def test_the_first_use_of_a_built_in_model_says_it_is_being_built(tmp_path, monkeypatch, runner):
    monkeypatch.setenv("BENCH_STUDIO_CACHE", str(tmp_path / "empty-cache"))
    phases = []

    class Phases(JobObserver):  # every phase as the run tells it, however briefly it lasts on a busy machine
        def on_state(self, job, change):
            if change.phase and (not phases or phases[-1] != change.phase):
                phases.append(change.phase)

    run = runner.submit(tiny_config(num_prompts=2, output_len=4), observers=[Phases()])
    assert run.wait(120)  # a hung test's bound
    assert run.state == "finished", run.message
    assert phases[:2] == [
        "building the tiny Llama, once (about a second)",
        "loading the tokenizer of builtin:tiny-llama",
    ]
    assert phases[-1] == "measuring"


@pytest.mark.parametrize("pattern", ["batch", "engine_api"])
def test_warm_up_runs_after_the_engine_loads_and_before_the_clock_starts(runner, monkeypatch, pattern):
    served, real_stream = [], TransformersEngine.stream

    def stream(self, requests, generation, load, cancel):  # the real engine's, noting when each call ends
        yield from real_stream(self, requests, generation, load, cancel)
        served.append((len(requests), time.perf_counter()))

    monkeypatch.setattr(TransformersEngine, "stream", stream)
    config = tiny_config(num_prompts=3, output_len=6)
    config = RunConfig(
        engine=config.engine,
        dataset=config.dataset,
        load=LoadConfig(load_pattern=pattern, concurrency=4, stream_output=True, warmup_requests=5),
    )
    run = runner.submit(config)
    assert run.wait(120) and run.state == "finished", run.message
    (warmed, warm_end), (measured, _) = served
    assert (warmed, measured) == (5, 3)  # the first prompts, again from the first: 5 of 3
    profiler = run.measurement.profiler
    assert warm_end <= profiler.t_start  # none of it inside the measured window
    assert len(profiler.sessions) == 3 and run.record.metrics["total_requests"] == 3
    assert 0 < run.record.warmup_seconds <= run.record.load_seconds
    assert runner.history.load()["warmup_seconds"].iloc[0] == pytest.approx(run.record.warmup_seconds)
