"""A pool of engine workers (bench_core.run.engine_process.WorkerPool), with the real tiny model: a runner takes the
worker the last one left idle, with its own history, and a worker that was busy, killed or started in another
environment is never handed on."""

import os
import signal
import time

import psutil
import pytest

from bench_core.config import DatasetConfig, EngineConfig, LoadConfig, RunConfig
from bench_core.run.engine_process import ProcessRunner, WorkerPool, serve
from bench_core.store.history import RESULTS_ENV, History

# Each test here starts engine worker processes, seconds each: not in the fast suite.
pytestmark = pytest.mark.slow

TINY = "builtin:tiny-llama"


def tiny_config(num_prompts: int = 4, max_batch_tokens: int = 1024) -> RunConfig:
    return RunConfig(
        engine=EngineConfig(model=TINY, max_batch_tokens=max_batch_tokens),
        dataset=DatasetConfig(dataset="builtin:sample", num_prompts=num_prompts, sharegpt_output_len=4),
        load=LoadConfig(concurrency=2, stream_output=True),
    )


def finished(runner: ProcessRunner, config: RunConfig):
    run = runner.submit(config)
    assert run.wait(120) and run.state == "finished", run.message
    return run


def test_the_next_runner_takes_the_idle_worker_with_any_settings_and_its_own_history(
    tmp_path, tiny_model_path, monkeypatch
):
    pool = WorkerPool()
    try:
        first = ProcessRunner(History(tmp_path / "first"), workers=pool)
        earlier = finished(first, tiny_config())
        pid = first.worker_pid()
        first.shutdown()
        assert psutil.pid_exists(pid)  # idle in the pool

        monkeypatch.setenv(RESULTS_ENV, str(tmp_path / "elsewhere"))  # only the caller reads it
        second = ProcessRunner(History(tmp_path / "second"), workers=pool)
        assert second.loaded_engine() is None  # as after a restart, until its first job
        run = finished(second, tiny_config(max_batch_tokens=256))  # other engine settings: replaced in place
        assert second.worker_pid() == pid
        assert second.loaded_engine() == run.config.engine
        assert second.get(earlier.run_id) is None and second.runs() == [run]
        assert History(tmp_path / "second").load()["run_id"].tolist() == [run.run_id]
        assert History(tmp_path / "first").load()["run_id"].tolist() == [earlier.run_id]

        os.kill(pid, signal.SIGKILL)  # a worker that died idle is not handed on
        deadline = time.monotonic() + 30
        while second.worker_pid() is not None:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        second.shutdown()
        third = ProcessRunner(History(tmp_path / "third"), workers=pool)
        finished(third, tiny_config())
        fresh = third.worker_pid()
        assert fresh not in (None, pid)
        third.shutdown()

        with monkeypatch.context() as patch:
            patch.setenv("BENCH_TEST_POOL", "another environment")  # a worker would read it: not handed on
            assert pool.take(serve) is None
        kept = pool.take(serve)
        assert kept is not None and kept.pid == fresh
        pool.keep(kept)
    finally:
        pool.close()


def test_a_worker_still_busy_when_its_runner_shuts_down_ends_and_is_not_kept(tmp_path, tiny_model_path):
    pool = WorkerPool()
    try:
        runner = ProcessRunner(History(tmp_path), workers=pool)
        run = runner.submit(tiny_config(num_prompts=2000))
        while run.snapshot() is None:
            assert not run.wait(0.02), run.message
        pid = runner.worker_pid()
        runner.shutdown(timeout=0)  # the run is still in the worker
        assert not psutil.pid_exists(pid) and pool.take(serve) is None
        assert run.wait(30) and run.ended
    finally:
        pool.close()
