"""Sweeps through the real runner and the tiny model: every point into the history with the sweep's id and
repeat, engine loads only when an engine setting changes, cancel, resume, and a failing engine skipped."""

from __future__ import annotations

import pytest

import bench_core.run.runner as runner_module
from bench_core.config import RunConfig
from bench_core.errors import ConfigError
from bench_core.run.runner import Runner
from bench_core.store.history import History
from bench_core.sweep.driver import resume_sweep, start_sweep
from bench_core.sweep.plan import SweepPlan, new_sweep_id, parse_sweep_arg
from bench_core.sweep.store import SWEEP_REPEAT, load_plan, past_sweeps, remaining

# Each test here runs a real engine, server, app script or process for seconds: not in the fast suite.
pytestmark = pytest.mark.slow

SWEEP_TIMEOUT_S = 120


def tiny_base(num_prompts: int = 4, output_len: int = 8) -> RunConfig:
    config = RunConfig(label="base")
    config.engine.backend, config.engine.model = "transformers", "builtin:tiny-llama"
    config.dataset.dataset, config.dataset.num_prompts = "builtin:sample", num_prompts
    config.dataset.sharegpt_output_len = output_len
    config.load.concurrency, config.load.stream_output = 2, True
    return config


def plan_of(*sweeps: str, repeats: int = 1, base: RunConfig | None = None) -> SweepPlan:
    return SweepPlan(new_sweep_id(), base or tiny_base(), tuple(parse_sweep_arg(text) for text in sweeps), repeats)


@pytest.fixture
def runner(tmp_path, tiny_model_path):
    runner = Runner(History(tmp_path / "results"))
    yield runner
    runner.shutdown()


def run_to_the_end(runner: Runner, plan: SweepPlan):
    sweep = start_sweep(runner, plan)
    assert sweep.wait(SWEEP_TIMEOUT_S)
    return sweep


def test_every_point_and_repeat_lands_in_the_history_with_the_sweeps_id(runner):
    plan = plan_of("concurrency=1,2", repeats=2)
    sweep = run_to_the_end(runner, plan)

    progress = sweep.progress()
    assert (progress.state, progress.finished, progress.total, progress.ended) == ("finished", 4, 4, 4)
    assert progress.message == "" and progress.current == ""
    rows = runner.history.load()
    assert set(rows["sweep_id"]) == {plan.sweep_id} and set(rows["status"]) == {"finished"}
    assert sorted(zip(rows["concurrency"], rows[SWEEP_REPEAT])) == [(1, 0), (1, 1), (2, 0), (2, 1)]
    assert set(rows["label"]) == {f"base · concurrency={c} · repeat {r}/2" for c in (1, 2) for r in (1, 2)}
    assert load_plan(runner.history, plan.sweep_id) == plan
    assert remaining(plan, rows) == []


def test_the_engine_is_loaded_once_per_engine_setting_and_reused_across_load_changes(runner, monkeypatch):
    loads = []
    real_load = runner_module.load_engine

    def counting_load(engine, load):
        loads.append((engine.dtype, load.concurrency))
        return real_load(engine, load)

    monkeypatch.setattr(runner_module, "load_engine", counting_load)
    sweep = run_to_the_end(runner, plan_of("concurrency=1,2", "dtype=float32,bfloat16"))
    assert sweep.progress().state == "finished"
    assert [dtype for dtype, _ in loads] == ["float32", "bfloat16"]


def test_cancel_stops_the_running_run_and_submits_no_more(runner):
    plan = plan_of("concurrency=1,2", repeats=2, base=tiny_base(num_prompts=200, output_len=64))
    sweep = start_sweep(runner, plan)
    first = wait_for_first_run(sweep)
    sweep.cancel()
    assert sweep.wait(30)
    progress = sweep.progress()
    assert progress.state == "cancelled"
    assert [run.run_id for _, run in sweep.runs] == [first.run_id] and first.state == "cancelled"
    assert progress.finished == 0 and "resume the sweep to run the other 4" in progress.message
    assert len(remaining(plan, runner.history.load())) == 4  # a cancelled run does not count as done


def wait_for_first_run(sweep):
    for _ in range(600):
        if sweep.runs and sweep.runs[0][1].state == "running":
            return sweep.runs[0][1]
        sweep.wait(0.1)
    pytest.fail("the sweep's first run never started")


def test_resume_runs_only_what_the_history_does_not_have_finished(runner):
    plan = plan_of("concurrency=1,2", repeats=2)
    first_pass = run_to_the_end(runner, plan)
    lost = first_pass.runs[1][1].run_id  # as if that run had been cancelled or failed
    runner.history.delete([lost])

    again = resume_sweep(runner, plan.sweep_id)
    assert again.wait(SWEEP_TIMEOUT_S)
    assert [planned for planned, _ in again.runs] == [first_pass.runs[1][0]]
    progress = again.progress()
    assert (progress.state, progress.finished, progress.total) == ("finished", 4, 4)
    overview = past_sweeps(runner.history, runner.history.load())
    assert overview.to_dict("records") == [
        {
            "sweep_id": plan.sweep_id,
            "varies": "concurrency",
            "values": "1, 2",
            "repeats": 2,
            "model": "builtin:tiny-llama",
            "backend": "transformers",
            "finished": 4,
            "runs": 4,
        }
    ]


def test_a_complete_sweep_resumes_to_nothing(runner):
    plan = plan_of("concurrency=1")
    run_to_the_end(runner, plan)
    again = resume_sweep(runner, plan.sweep_id)
    assert again.wait(5)
    assert again.runs == [] and again.progress().state == "finished"


def test_an_engine_that_cannot_start_fails_once_and_its_other_runs_are_skipped(runner, tmp_path):
    broken = tmp_path / "broken-model"  # a model folder that fails to load (a missing one is refused, not recorded)
    broken.mkdir()
    (broken / "config.json").write_text("{}")
    base = tiny_base()
    base.engine.model = str(broken)
    sweep = run_to_the_end(runner, plan_of("concurrency=1,2", repeats=2, base=base))
    progress = sweep.progress()
    assert (progress.state, progress.failed, progress.skipped, progress.finished) == ("failed", 1, 3, 0)
    assert len(progress.errors) == 1 and str(broken) in progress.errors[0]
    assert progress.message.startswith(f"1 run(s) failed: {progress.errors[0]} 3 run(s) skipped")
    # The run that tried is recorded as failed, with its reason; the skipped ones never ran.
    rows = runner.history.load()
    assert rows["status"].tolist() == ["failed"] and str(broken) in rows["error"].iloc[0]


def test_an_impossible_point_is_refused_before_anything_is_saved(runner):
    with pytest.raises(
        ConfigError,
        match="Sweep points with concurrency=0: --concurrency must be a whole number from 1 to 1,000,000; got 0",
    ):
        start_sweep(runner, plan_of("concurrency=0,1"))
    with pytest.raises(ConfigError, match="sharegpt_output_len=4000: .* does not fit the 2,048-token context window"):
        start_sweep(runner, plan_of("sharegpt_output_len=8,4000"))
    assert not (runner.history.root / "sweeps").exists()
    assert runner.runs() == []


def test_a_point_where_some_requests_failed_counts_as_failed_with_its_reason(runner):
    base = tiny_base(num_prompts=6)
    base.dataset.dataset_name, base.dataset.sharegpt_output_len = "random", None
    base.dataset.random_input_len, base.dataset.random_output_len, base.dataset.random_range_ratio = 16, 8, 0.1
    base.engine.cache_block_seq_len, base.load.concurrency = 4, 1
    sweep = run_to_the_end(runner, plan_of("num_blocks=5", base=base))  # the longest request needs 6 blocks
    progress = sweep.progress()
    assert (progress.state, progress.failed, progress.finished) == ("failed", 1, 0)
    assert progress.message.startswith("1 run(s) failed: 1 of 6 requests failed (error: The request needs 6 KV")
    assert runner.history.load()["status"].tolist() == ["partial"]
