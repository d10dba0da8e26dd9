"""Sweeps on a real local Ray instance (2 CPUs, on 127.0.0.1, no dashboard) with the tiny model: one actor per
engine setting, side by side, the driver alone recording; a worker killed mid-point; resume; cancel; and the
refusal without Ray. One Ray instance serves the whole module (starting one takes seconds)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_app_sweep import open_sweep_page, set_up_tiny_sweep, table_with_column
from test_app_sweep import start_sweep as start_on_page
from test_sweep_driver import plan_of, tiny_base

from bench_core.cli.common import EXIT_BAD_INPUT
from bench_core.run.runner import Runner
from bench_core.store.history import RESULTS_ENV, History
from bench_core.sweep.cluster import PROJECT_ROOT, ClusterOptions, launcher, resources
from bench_core.sweep.driver import resume_sweep, start_sweep
from bench_core.sweep.store import SWEEP_REPEAT
from dashboard.state import get_sweeps

# Each test here runs a real engine, server, app script or process for seconds: not in the fast suite.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
GRID = ("concurrency=1,2", "max-batch-tokens=256,512")  # 2 engine settings x 2 loads: 2 actors, 2 runs each
SWEEP_TIMEOUT_S = 120
CONFIG_COLUMNS = (
    "backend",
    "model",
    "dataset",
    "num_prompts",
    "sharegpt_output_len",
    "concurrency",
    "max_batch_tokens",
    "stream_output",
    "label",
    SWEEP_REPEAT,
)


@pytest.fixture(scope="module")
def ray_cluster(tiny_model_path):
    """A local Ray instance for the module, bound to 127.0.0.1: Ray takes the loopback address only when it
    believes clusters are off (the variable is read when ray is imported, by the raylet and workers too)."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    import ray

    from bench_core.sweep.cluster import connect

    connect("local", num_cpus=2, include_dashboard=False)
    yield ray
    ray.shutdown()
    del os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"]


@pytest.fixture
def runner(tmp_path):
    runner = Runner(History(tmp_path / "results"))
    yield runner
    runner.shutdown()


def on_cluster(runner, plan, retries: int = 0, until=None):
    """Start `plan` on the cluster and wait for it; `until(sweep)` is called while it runs, until it is True."""
    sweep = start_sweep(runner, plan, launcher(ClusterOptions("local", cpus_per_point=1, retries=retries)))
    deadline = time.monotonic() + SWEEP_TIMEOUT_S
    while until is not None and not until(sweep) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sweep.wait(SWEEP_TIMEOUT_S)
    return sweep


def configs(history: History) -> list[tuple]:
    runs = history.load()
    return sorted(tuple(str(row[name]) for name in CONFIG_COLUMNS) for _, row in runs.iterrows())


def kill_a_running_worker(killed: list):
    """An `until` that kills, by pid, the worker of the first point seen measuring (once)."""

    def until(sweep) -> bool:
        running = [state for state in sweep.point_states() if state.state == "running" and state.worker_pid]
        if running and not killed:
            os.kill(running[0].worker_pid, signal.SIGKILL)
            killed.append(running[0])
        return bool(killed)

    return until


@pytest.mark.timeout(240)
def test_a_grid_on_two_workers_records_what_the_serial_sweep_records_with_each_runs_node(ray_cluster, tmp_path):
    assert {node["NodeManagerAddress"] for node in ray_cluster.nodes()} == {"127.0.0.1"}
    plan = plan_of(*GRID)
    cluster_runner = Runner(History(tmp_path / "cluster"))
    seen_at_once = []

    def watch(sweep) -> bool:
        seen_at_once.append(sum(state.state in ("loading", "running") for state in sweep.point_states()))
        return not sweep.active

    sweep = on_cluster(cluster_runner, plan, until=watch)
    serial_runner = Runner(History(tmp_path / "serial"))
    serial = start_sweep(serial_runner, plan_of(*GRID))
    assert serial.wait(SWEEP_TIMEOUT_S)
    serial_runner.shutdown()

    assert (sweep.progress().state, sweep.progress().finished) == ("finished", 4)
    rows = cluster_runner.history.load()
    assert len(rows) == 4 and set(rows["sweep_id"]) == {plan.sweep_id} and set(rows["status"]) == {"finished"}
    assert set(rows["env_hostname"]) == {socket.gethostname()} and rows["env_gpu_count"].notna().all()
    assert configs(cluster_runner.history) == configs(serial_runner.history)
    for _, row in rows.iterrows():  # the driver wrote every run's folder, request table included
        assert len(cluster_runner.history.requests(row["run_id"])) == 4
    # One actor per engine setting, each loading once and running its group's two points; both at once.
    states = sweep.point_states()
    pids = {}
    for state in states:
        pids.setdefault(state.point.split("max_batch_tokens=")[1], set()).add(state.worker_pid)
    assert sorted(len(group) for group in pids.values()) == [1, 1] and len(set.union(*pids.values())) == 2
    assert max(seen_at_once) == 2
    assert all(state.node == socket.gethostname() and state.attempts == 1 for state in states)


@pytest.mark.timeout(60)
def test_the_workers_run_the_code_shipped_as_their_working_directory(ray_cluster):
    from bench_core.sweep.cluster import _worker_class

    worker = _worker_class().options(num_cpus=1).remote()
    where = ray_cluster.get(worker.where.remote())
    ray_cluster.kill(worker)
    package = Path(where["package"])
    assert "working_dir_files" in package.parts and not package.is_relative_to(PROJECT_ROOT)
    assert where["hostname"] == socket.gethostname() and where["gpu_ids"] == ""


@pytest.mark.timeout(240)
def test_a_worker_killed_mid_point_fails_that_point_the_others_finish_and_resume_reruns_it(ray_cluster, runner):
    plan = plan_of(*GRID, base=tiny_base(num_prompts=16, output_len=48))
    killed = []
    sweep = on_cluster(runner, plan, until=kill_a_running_worker(killed))

    (victim,) = killed
    progress = sweep.progress()
    assert (progress.state, progress.finished, progress.failed) == ("failed", 3, 1)
    (failed,) = [state for state in sweep.point_states() if state.state == "failed"]
    assert failed.point == victim.point and failed.message.startswith(
        f"Its Ray worker was lost on {socket.gethostname()}: "
    )
    rows = runner.history.load()
    assert sorted(rows["status"]) == ["failed", "finished", "finished", "finished"]
    failed_row = rows[rows["status"] == "failed"].iloc[0]
    assert failed_row["error"] == failed.message and failed_row["env_hostname"] == socket.gethostname()

    # A new driver (as after a restart) runs only the point that did not finish.
    resumed = resume_sweep(runner, plan.sweep_id, launcher(ClusterOptions("local")))
    assert resumed.wait(SWEEP_TIMEOUT_S)
    assert [state.point for state in resumed.point_states()] == [victim.point]
    assert resumed.progress().state == "finished"
    assert sorted(runner.history.load()["status"]) == ["failed"] + ["finished"] * 4


@pytest.mark.timeout(240)
def test_with_a_retry_the_killed_point_runs_again_on_a_fresh_worker(ray_cluster, runner):
    plan = plan_of(*GRID, base=tiny_base(num_prompts=16, output_len=48))
    killed = []
    sweep = on_cluster(runner, plan, retries=1, until=kill_a_running_worker(killed))

    (victim,) = killed
    progress = sweep.progress()
    assert (progress.state, progress.finished, progress.failed) == ("finished", 4, 0)
    (retried,) = [state for state in sweep.point_states() if state.point == victim.point]
    assert retried.attempts == 2 and retried.state == "finished" and retried.worker_pid != victim.worker_pid
    rows = runner.history.load()  # the lost attempt stays recorded, with its reason
    assert sorted(rows["status"]) == ["failed"] + ["finished"] * 4
    assert "Its Ray worker was lost" in rows[rows["status"] == "failed"].iloc[0]["error"]


@pytest.mark.timeout(120)
def test_cancel_stops_the_clusters_work(ray_cluster, runner):
    plan = plan_of(*GRID, repeats=2, base=tiny_base(num_prompts=200, output_len=64))

    def cancel_once_running(sweep) -> bool:
        if any(state.state == "running" for state in sweep.point_states()):
            sweep.cancel()
            return True
        return False

    sweep = on_cluster(runner, plan, until=cancel_once_running)
    assert sweep.progress().state == "cancelled"
    states = [state.state for state in sweep.point_states()]
    assert "running" not in states and "queued" not in states and "loading" not in states
    assert set(runner.history.load()["status"]) <= {"cancelled"}
    ray_cluster_idle = ray_cluster.available_resources().get("CPU", 0)
    deadline = time.monotonic() + 30
    while ray_cluster_idle < 2 and time.monotonic() < deadline:  # the actors are gone: their cores are free
        time.sleep(0.2)
        ray_cluster_idle = ray_cluster.available_resources().get("CPU", 0)
    assert ray_cluster_idle == 2


@pytest.mark.timeout(120)
def test_the_sweep_page_sends_the_sweep_to_the_cluster_and_shows_each_runs_state_and_node(
    ray_cluster, tmp_path, monkeypatch, fresh_dashboard
):
    monkeypatch.setenv(RESULTS_ENV, str(tmp_path / "results"))
    at = open_sweep_page()
    set_up_tiny_sweep(at, "1,2", repeats=1)
    at.text_input(key="sweep_ray_address").set_value("local")
    sweep_id = start_on_page(at)
    assert list(table_with_column(at, "node")["point"]) == ["concurrency=1", "concurrency=2"]

    assert get_sweeps()[sweep_id].wait(SWEEP_TIMEOUT_S)
    at.run()
    assert not at.exception and at.success[0].value == "finished: all 2 runs."
    where = table_with_column(at, "node")
    assert list(where["state"]) == ["finished", "finished"] and set(where["node"]) == {socket.gethostname()}
    assert set(History(tmp_path / "results").load()["env_hostname"]) == {socket.gethostname()}


@pytest.mark.parametrize(
    "backend, settings, gpus",
    [
        ("turbomind", {"tp": 2}, 2),
        ("pytorch", {"tp": 4}, 4),
        ("transformers", {"torch_device": "cuda"}, 1),
        ("transformers", {"torch_device": "auto"}, 0),
        ("openai", {}, 0),
    ],
)
def test_a_point_holds_its_engines_gpus_or_none_and_its_stated_cores(backend, settings, gpus):
    config = tiny_base()
    config.engine.backend = backend
    for name, value in settings.items():
        setattr(config.engine, name, value)
    held = resources(config, cpus_per_point=3)
    assert (held["num_gpus"], held["num_cpus"]) == (gpus, 3)
    assert ("runtime_env" in held) == (gpus == 0)  # no GPU held: none visible
    if not gpus:
        assert held["runtime_env"] == {"env_vars": {"CUDA_VISIBLE_DEVICES": ""}}


def run_cli(tmp_path, *flags: str, code: str = "from bench_core.cli import main; sys.exit(main(sys.argv[1:]))"):
    """The sweep command in a fresh process (no Ray started in it), with `flags` after a small sweep."""
    args = [
        "sweep",
        "pipeline",
        "builtin:sample",
        "builtin:tiny-llama",
        "--backend",
        "transformers",
        "--sweep",
        "concurrency=1,2",
        "--results",
        "results",
        *flags,
    ]
    return subprocess.run(
        [sys.executable, "-c", "import sys; " + code, *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=60,
    )


def test_without_ray_the_option_is_one_line_naming_the_install_and_exit_2(tmp_path):
    proc = run_cli(
        tmp_path,
        "--ray-address",
        "auto",
        code="sys.modules['ray'] = None; from bench_core.cli import main; sys.exit(main(sys.argv[1:]))",
    )
    assert proc.returncode == EXIT_BAD_INPUT
    assert proc.stderr == (
        "error: Sweeps on a Ray cluster need Ray, which is not installed; install it with: "
        "pip install -r requirements-cluster.txt\n"
    )
    assert not (tmp_path / "results").exists()


def test_a_cluster_that_does_not_answer_is_one_line_and_exit_2_at_once(tmp_path):
    # Ray would wait minutes for an address that does not answer: the sweep refuses it before asking Ray to join.
    proc = run_cli(
        tmp_path,
        "--ray-address",
        "127.0.0.1:1",
        code="import ray; ray.init = lambda *args, **kwargs: sys.exit('ray.init was called'); "
        "from bench_core.cli import main; sys.exit(main(sys.argv[1:]))",
    )
    assert proc.returncode == EXIT_BAD_INPUT, proc.stderr
    assert proc.stderr == "error: Cannot reach the Ray cluster at 127.0.0.1:1: Connection refused.\n"
    assert not (tmp_path / "results").exists()
