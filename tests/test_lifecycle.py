"""The run lifecycle (bench_core.run.lifecycle, observer, remote): the state machine refuses every move it does not
hold, one observer hears a real run's moves, snapshots, finished requests and record in order, in this process
and across the worker process's pipe, and a run's metrics are aggregated once, where it was measured."""

import engine_faults
import pytest

from bench_core.config import DatasetConfig, EngineConfig, LoadConfig, RunConfig
from bench_core.run.engine_process import ProcessRunner
from bench_core.run.lifecycle import TRANSITIONS, IllegalTransition, Run
from bench_core.run.observer import JobObserver
from bench_core.run.runner import Runner
from bench_core.states import RunState
from bench_core.store.history import History

ENDED = [state for state in RunState if not TRANSITIONS[state]]
# A path from queued to each ended state.
PATH_TO = {
    RunState.FINISHED: [RunState.LOADING, RunState.RUNNING, RunState.FINISHED],
    RunState.PARTIAL: [RunState.LOADING, RunState.RUNNING, RunState.PARTIAL],
    RunState.FAILED: [RunState.LOADING, RunState.FAILED],
    RunState.CANCELLED: [RunState.CANCELLED],
}


def tiny_config(num_prompts: int = 8, output_len: int = 16) -> RunConfig:
    return RunConfig(
        engine=EngineConfig(model="builtin:tiny-llama"),
        dataset=DatasetConfig(dataset="builtin:sample", num_prompts=num_prompts, sharegpt_output_len=output_len),
        load=LoadConfig(concurrency=4, stream_output=True),
    )


@pytest.fixture(scope="module", autouse=True)
def worker_counts(tmp_path_factory):
    """The file the module's worker (engine_faults.serve_counting_aggregations) appends each aggregation to, named in
    the environment for the whole module: every worker here is started in the same one, so the module's pool
    (engine_workers) hands the worker one test started to the next instead of starting another."""
    path = tmp_path_factory.mktemp("counts") / "worker-aggregations"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(engine_faults.COUNTS_ENV, str(path))
        yield path


def in_a_worker_process(history: History, engine_workers) -> ProcessRunner:
    """A ProcessRunner on the module's worker: `serve`, counting its aggregations in a file and nothing else."""
    return ProcessRunner(history, worker_main=engine_faults.serve_counting_aggregations, workers=engine_workers)


def handle() -> Run:
    return Run(run_id="r", config=RunConfig())


class Heard(JobObserver):
    """Every call an observer gets, in order."""

    def __init__(self):
        self.calls = []

    def on_state(self, job, change):
        self.calls.append(("state", change))

    def on_snapshot(self, run, snapshot):
        self.calls.append(("snapshot", snapshot))

    def on_requests(self, run, finished):
        self.calls.append(("requests", finished))

    def on_record(self, run, record):
        self.calls.append(("record", record))

    def kinds(self) -> list[str]:
        return [kind for kind, _ in self.calls]

    def states(self) -> list[RunState]:
        return [change.state for kind, change in self.calls if kind == "state"]


def test_a_run_moves_only_along_the_lifecycle():
    run = handle()
    for skipping in (RunState.RUNNING, RunState.FINISHED, RunState.PARTIAL):
        with pytest.raises(IllegalTransition):
            run.move(skipping)
    assert run.state == RunState.QUEUED
    run.move(RunState.LOADING)
    run.describe("warming up")
    with pytest.raises(IllegalTransition):
        run.move(RunState.FINISHED)  # a run finishes only after it ran
    run.move(RunState.RUNNING, phase="measuring")
    with pytest.raises(IllegalTransition):
        run.move(RunState.LOADING)  # never back
    run.move(RunState.PARTIAL, "1 of 8 requests failed")
    assert (run.state, run.phase, run.message) == (RunState.PARTIAL, "measuring", "1 of 8 requests failed")


@pytest.mark.parametrize("ended", ENDED)
def test_an_ended_run_never_moves_again(ended):
    run = handle()
    for state in PATH_TO[ended]:
        run.move(state)
    for state in RunState:
        with pytest.raises(IllegalTransition):
            run.move(state)
    with pytest.raises(IllegalTransition):
        run.describe("still going")
    assert run.state == ended and run.ended and not run.claim()


def test_a_run_cancelled_while_queued_ends_at_once_and_cannot_be_claimed():
    heard = Heard()
    run = Run(run_id="r", config=RunConfig(), observers=[heard])
    run.cancel()
    assert (run.state, run.message) == (RunState.CANCELLED, "Cancelled before it started.")
    assert run.wait(0) and not run.claim()
    assert heard.kinds() == ["state", "record"] and heard.calls[-1] == ("record", None)


def test_a_claimed_run_is_cancelled_by_its_flag_and_ends_where_it_runs():
    run = handle()
    assert run.claim() and not run.claim()
    run.cancel()
    assert run.cancel_event.is_set() and run.state == RunState.LOADING and not run.wait(0)


@pytest.mark.slow
@pytest.mark.parametrize(
    "make_runner",
    [lambda history, workers: Runner(history), in_a_worker_process],
    ids=["in this process", "in a worker process"],
)
def test_one_observer_hears_a_real_runs_moves_snapshots_requests_and_record_in_order(
    make_runner, tmp_path, tiny_model_path, engine_workers
):
    runner, heard = make_runner(History(tmp_path), engine_workers), Heard()
    run = runner.submit(tiny_config(), observers=[heard])
    try:
        assert run.wait(120) and run.state == RunState.FINISHED, run.message
    finally:
        runner.shutdown()
    kinds = heard.kinds()
    assert list(dict.fromkeys(heard.states())) == [RunState.LOADING, RunState.RUNNING, RunState.FINISHED]
    phases = [change.phase for kind, change in heard.calls if kind == "state" and change.state == RunState.LOADING]
    assert "loading the tokenizer of builtin:tiny-llama" in phases and phases[-1] == "warming up"
    # Snapshots and finished requests come while the run measures, after the move to running and before its end.
    running = next(i for i, (kind, change) in enumerate(heard.calls) if kind == "state" and change.state == "running")
    ended = kinds.index("state", running + 1)
    assert {kind for kind in kinds[running + 1 : ended]} == {"snapshot", "requests"}
    assert "snapshot" not in kinds[:running] and "snapshot" not in kinds[ended:]
    last_snapshot = [payload for kind, payload in heard.calls if kind == "snapshot"][-1]
    assert last_snapshot.finished and last_snapshot.completed == 8
    told = [index for kind, finished in heard.calls if kind == "requests" for index in finished]
    assert sorted(told) == list(range(8))  # each request once, as it finished
    assert kinds[-1] == "record" and kinds.count("record") == 1 and heard.calls[-1][1] is run.record
    assert run.record.status == RunState.FINISHED and run.record.metrics["completed"] == 8


def test_a_run_in_this_process_aggregates_its_metrics_once(monkeypatch, tmp_path, tiny_model_path):
    aggregations = []
    engine_faults.count_aggregations("here", aggregations.append, monkeypatch.setattr)
    runner = Runner(History(tmp_path))
    run = runner.submit(tiny_config())
    try:
        assert run.wait(120) and run.state == RunState.FINISHED, run.message
    finally:
        runner.shutdown()
    assert aggregations == ["here compute_metrics", "here run_summary"]


@pytest.mark.slow
def test_a_dashboard_run_is_aggregated_once_in_its_worker_and_saved_as_sent(
    monkeypatch, tmp_path, tiny_model_path, engine_workers, worker_counts
):
    worker_counts.unlink(missing_ok=True)  # what a run of an earlier test on the same worker counted
    here = []
    engine_faults.count_aggregations("caller", here.append, monkeypatch.setattr)
    history = History(tmp_path / "results")
    runner = in_a_worker_process(history, engine_workers)
    run = runner.submit(tiny_config())
    try:
        assert run.wait(120) and run.state == RunState.FINISHED, run.message
    finally:
        runner.shutdown()
    assert worker_counts.read_text().splitlines() == ["worker compute_metrics", "worker run_summary"]
    assert here == []  # the caller saved the record the worker built
    (row,) = history.load().to_dict("records")
    assert row["completed"] == run.record.metrics["completed"] == 8
    assert row["output_throughput"] == pytest.approx(run.record.metrics["output_throughput"])
