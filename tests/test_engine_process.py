"""The engine in a worker process (bench_core.run.engine_process), with the real tiny model: runs, reuse,
cancel, and the faults that end a worker, each caused for real in the worker process."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import engine_faults
import psutil
import pytest

from bench_core.config import DatasetConfig, EngineConfig, GenerationSettings, LoadConfig, RunConfig
from bench_core.run import remote
from bench_core.run.engine_process import ProcessRunner
from bench_core.run.runner import Runner
from bench_core.store.history import History

# Each test here runs a real engine, server, app script or process for seconds: not in the fast suite.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
TINY = "builtin:tiny-llama"


def tiny_config(num_prompts: int = 8, output_len: int = 8, dtype: str = "auto") -> RunConfig:
    return RunConfig(
        engine=EngineConfig(model=TINY, dtype=dtype),
        dataset=DatasetConfig(dataset="builtin:sample", num_prompts=num_prompts, sharegpt_output_len=output_len),
        load=LoadConfig(concurrency=4, stream_output=True),
    )


@pytest.fixture
def history(tmp_path, tiny_model_path) -> History:
    return History(tmp_path)


@pytest.fixture(scope="module", autouse=True)
def fault_file(tmp_path_factory):
    """Where a test tells the fault-injecting worker (engine_faults.serve_with_fault) to fault, named in the
    environment for the whole module: every worker here is started in the same one, so the module's pool
    (engine_workers) can hand the last test's worker to the next."""
    path = tmp_path_factory.mktemp("fault") / "fault"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(engine_faults.FAULT_FILE_ENV, str(path))
        yield path


@pytest.fixture
def runner(history, engine_workers):
    """A runner that takes the module's idle worker (engine_workers) if there is one, else starts one, and leaves it
    idle there after: for the tests of what a worker does, not of how one starts or ends."""
    runner = ProcessRunner(history, workers=engine_workers)
    yield runner
    runner.shutdown()


@pytest.fixture
def own_runner(history):
    """A runner with no pool, as the dashboard's: its worker starts with it and ends on other settings and with it."""
    runner = ProcessRunner(history)
    yield runner
    runner.shutdown()


def wait_for_completed(run, at_least: int) -> None:
    while run.snapshot() is None or run.snapshot().completed < at_least:
        assert not run.wait(0.02), f"{run.state}: {run.message}"


def test_a_run_in_the_worker_gives_the_numbers_of_a_run_in_process(runner, history):
    # The run in this process first: torch, loaded here, sets an environment variable (TORCHINDUCTOR_CACHE_DIR) the
    # worker inherits, and the pool hands the next test only a worker started in the environment it will run in.
    in_process = Runner(history)
    local = in_process.submit(tiny_config(num_prompts=12))
    assert local.wait(120) and local.state == "finished"
    in_process.shutdown()
    run = runner.submit(tiny_config(num_prompts=12))
    assert run.wait(120) and run.state == "finished", run.message
    mine, theirs = run.record.requests, local.record.requests
    assert mine["output_len"].tolist() == theirs["output_len"].tolist() == [8] * 12
    assert mine["input_len"].tolist() == theirs["input_len"].tolist()
    assert (
        run.record.metrics["completed"] == 12 and run.record.environment["torch"] == local.record.environment["torch"]
    )
    assert history.load()["status"].tolist() == ["finished", "finished"]
    assert run.snapshot().finished and run.snapshot().completed == 12  # the worker's last snapshot


def test_a_cancel_ends_the_run_at_once_and_keeps_what_it_measured(runner):
    run = runner.submit(tiny_config(num_prompts=200, output_len=64))
    wait_for_completed(run, 4)
    run.cancel()
    asked = time.perf_counter()  # the clock the worker stamps requests with (CLOCK_MONOTONIC: one per machine)
    assert run.wait(120)  # a hung test's bound
    assert run.state == "cancelled" and run.record.status == "cancelled"
    assert 4 <= run.record.metrics["completed"] < 200
    # The worker stopped at once: of the requests left when the cancel was asked, fewer than a tenth were served
    # after it (those in flight, and any the cancel's way through the pipe gave time to).
    table = run.record.requests
    served = table.loc[table["status"] == "success", "finish_s"] + run.clock_start  # as the worker stamped them
    left = 200 - (served <= asked).sum()
    assert (served > asked).sum() < left / 10


def test_a_playground_job_is_answered_in_the_worker(runner):
    job = runner.submit_playground(
        EngineConfig(model=TINY), [[{"role": "user", "content": "Hello"}]], GenerationSettings(), 4
    )
    assert job.wait(120) and job.state == "finished", job.message
    (result,) = job.results
    assert result.output_tokens == 4 and job.engine_info.model == TINY


def assert_died_keeping(run, history, reason: str, at_least: int) -> None:
    assert run.wait(30), "the run never ended"
    assert (run.state, run.message) == ("failed", reason)
    table = run.record.requests
    assert (table["status"] == "success").sum() >= at_least
    assert set(table.loc[table["status"] != "success", "reason"]) == {reason}
    (row,) = history.load().to_dict("records")
    assert row["status"] == "failed" and row["error"] == reason


def test_a_worker_killed_mid_run_fails_the_run_keeps_its_requests_and_the_next_run_gets_a_fresh_worker(runner, history):
    run = runner.submit(tiny_config(num_prompts=200, output_len=16))
    wait_for_completed(run, 8)
    killed = runner.worker_pid()
    os.kill(killed, signal.SIGKILL)
    assert_died_keeping(run, history, "engine process died: signal 9", 8)
    after = runner.submit(tiny_config())
    assert after.wait(120) and after.state == "finished", after.message
    assert runner.worker_pid() not in (None, killed)


class FollowerClock:
    """The clock the caller's follower (remote.follow) measures a worker's silence with, moved only by the test;
    `reads` counts the follower's looks at it, one per turn of its loop."""

    def __init__(self) -> None:
        self.now, self.reads = 0.0, 0

    def monotonic(self) -> float:
        self.reads += 1
        return self.now

    def await_reads(self, count: int, run) -> None:
        """Until the follower has gone `count` more times round its loop, or `run` has ended."""
        target, hung_at = self.reads + count, time.monotonic() + 60  # a hung test's bound, not a speed
        while self.reads < target and not run.wait(0.01):
            assert time.monotonic() < hung_at, "the follower stopped looking at its clock"


def test_a_worker_that_stops_publishing_is_reported_hung_after_that_silence_and_killed(
    history, engine_workers, monkeypatch
):
    clock = FollowerClock()
    monkeypatch.setattr(remote, "time", clock)  # the silence is the test's: the machine's pace never counts
    runner = ProcessRunner(history, hung_after_s=2.0, workers=engine_workers)  # the worker the last test left
    try:
        run = runner.submit(tiny_config(num_prompts=200, output_len=16))
        wait_for_completed(run, 4)
        stopped = runner.worker_pid()
        os.kill(stopped, signal.SIGSTOP)
        clock.await_reads(20, run)  # it has read what the worker sent before it stopped
        clock.now += 1.9  # silent for less than hung_after_s: not hung yet
        clock.await_reads(20, run)
        assert run.state == "running", run.message
        clock.now += 2.1  # past hung_after_s since anything it heard
        assert run.wait(60)  # a hung test's bound
        assert (
            run.state == "failed" and run.message == "engine process hung: it published nothing for 2 s and was killed"
        )
        assert run.record.metrics["completed"] >= 4
        assert not psutil.pid_exists(stopped)
    finally:
        runner.shutdown()


def test_the_engine_stays_loaded_for_the_same_settings_and_other_settings_end_the_worker(own_runner):
    runner = own_runner
    first = runner.submit(tiny_config())
    assert first.wait(120) and first.state == "finished", first.message
    pid = runner.worker_pid()
    second = runner.submit(tiny_config())
    assert second.wait(120) and second.state == "finished"
    assert runner.worker_pid() == pid and second.measurement.load_seconds < first.measurement.load_seconds / 2
    other = runner.submit(tiny_config(dtype="float32"))
    assert other.wait(120) and other.state == "finished", other.message
    assert runner.worker_pid() != pid and not psutil.pid_exists(pid)
    assert runner.loaded_engine() == other.config.engine


@pytest.mark.parametrize(
    "fault, reason",
    [
        ("exception", "engine process died: exit code 1"),
        ("exit", "engine process died: exit code 3"),
        ("segfault", "engine process died: signal 11"),
    ],
)
def test_a_worker_that_dies_by_itself_fails_the_run_and_keeps_its_requests(
    history, engine_workers, fault_file, fault, reason
):
    # The faulting worker is the healthy one the last of these tests left in the pool (or a new one, the first time):
    # told now, it faults after 10 finished requests; the fresh worker the next run starts is left for the next test.
    runner = ProcessRunner(history, worker_main=engine_faults.serve_with_fault, workers=engine_workers)
    fault_file.write_text(f"{fault} 10")
    try:
        run = runner.submit(tiny_config(num_prompts=200, output_len=16))
        assert_died_keeping(run, history, reason, 10)
        fault_file.unlink()  # the next worker stays healthy
        after = runner.submit(tiny_config())
        assert after.wait(120) and after.state == "finished", after.message
    finally:
        fault_file.unlink(missing_ok=True)
        runner.shutdown()


SERVE_A_RUN_PAGE = """
import sys
sys.path[:0] = {paths!r}
from test_app_run import choose_tiny_run, open_app, start
from dashboard.state import get_runner
at = open_app()
choose_tiny_run(at, num_prompts=4, output_len=4)
at = start(at)
run = get_runner().get(at.query_params["run"])
while not run.wait(0.05):
    at.run()
at.run()
assert run.state == "finished" and not at.exception, run.message
get_runner.clear()
print(sorted(name for name in ("torch", "transformers", "lmdeploy") if name in sys.modules))
"""


def test_serving_the_run_page_through_a_whole_run_never_imports_an_engine_library(tmp_path, tiny_model_path):
    script = SERVE_A_RUN_PAGE.format(paths=[str(ROOT), str(ROOT / "tests")])
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, "BENCH_STUDIO_RESULTS": str(tmp_path)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
