"""Runs a sweep on a Ray cluster: each engine-settings group of points in its own Ray actor, results recorded here.

The plan's runs are grouped as the serial driver orders them (`SweepPlan.points`: one engine load per
group). Each group gets one actor holding exclusive resources: on GPU backends as many GPUs as its engine
uses (tensor parallelism), else `cpus_per_point` cores and no GPU; concurrent points on shared hardware
would disturb each other's numbers. The actor is a plain Runner without a history: it loads the engine
once, runs the group's points one after the other and records each run where it ran (summary, request table,
engine info, environment). Its runs' progress and records reach this process as the worker process's do
(run.remote: the actor forwards them, the driver polls and follows them on its own Run); the driver adds the
node's hostname and the GPUs Ray gave the actor to the environment. Only this process writes the history,
through its own runner, so the history stays one consistent file.

The project's code reaches the workers through Ray's runtime environment (`working_dir`, the checkout
without its venv, results and artifacts); every node needs the Python packages its points need.

A worker that dies mid-point (its process killed, its node lost) fails that run, recorded with the reason and
the requests it had finished; with `retries`, the point runs again on a fresh actor, wherever Ray places it, and the group's other points
go on there. Cancel asks each actor to stop its run (kept as cancelled, as on one machine) and kills the
actors that do not within CANCEL_GRACE_S. Resume is the serial driver's: runs already in the history are
not run again.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import threading
from collections import deque
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd

from ..config import RunConfig
from ..engines import backend
from ..errors import ConfigError
from ..measure.live_snapshot import LiveSnapshot
from ..run.lifecycle import Run
from ..run.observer import JobObserver, StateChange
from ..run.remote import Forwarder, LinkLost, Message, Mirror, Outbox, follow
from ..run.runner import Runner, drift_baseline_for
from ..states import RunState
from ..store.history import new_run_id
from .driver import Launch, SweepRun, engine_key_of
from .plan import PlannedRun, SweepPlan

RAY_INSTALL = "pip install -r requirements-cluster.txt"
PROJECT_ROOT = Path(__file__).resolve().parents[2]
# Left out of the working directory shipped to the workers: environments, outputs, caches.
WORKING_DIR_EXCLUDES = [
    ".venv",
    ".venv-user",
    ".git",
    "results",
    "artifacts",
    "__pycache__",
    ".pytest_cache",
    ".cache",
    "*.pyc",
]
POLL_S = 0.25  # the longest an actor holds a poll open while its run has nothing to say
CANCEL_GRACE_S = 10.0
CONNECT_TIMEOUT_S = 5.0
SKIPPED = "skipped"  # a point not tried: a run with the same engine settings could not start


@dataclass(frozen=True)
class ClusterOptions:
    """Where and how a sweep runs on Ray: the cluster's address ("auto": the one this machine belongs to;
    "local": a new instance here), the cores each point holds, and how often a point whose worker died
    is run again."""

    address: str = "auto"
    cpus_per_point: int = 1
    retries: int = 0

    def __post_init__(self):
        if not self.address.strip():
            raise ConfigError("Give the Ray cluster's address (host:port, ray://host:port, auto or local).")
        if self.cpus_per_point < 1:
            raise ConfigError("A point on the cluster needs at least 1 CPU core (--cpus-per-point).")
        if self.retries < 0:
            raise ConfigError("Retries count the extra tries of a point whose worker died: 0 or more.")


@dataclass(frozen=True)
class PointState:
    """One run of a cluster sweep as the CLI and the Sweep page show it."""

    point: str
    repeat: int
    state: str  # queued | loading | running | finished | partial | failed | cancelled | skipped
    node: str  # the hostname (and GPUs) of the worker that has it, "" before one does
    progress: str  # requests done while running
    attempts: int
    message: str
    worker_pid: int | None  # the process of the actor running it, on its node


@dataclass(frozen=True)
class ActorPoll:
    """What an actor answers the driver's poll: its node and process, and the messages of its run since the last
    poll (remote.Message)."""

    node: dict[str, str]  # node_facts()
    pid: int
    messages: list[Message]


def import_ray():
    """The ray module; ConfigError with the install line where it is not installed."""
    try:
        import ray
    except ImportError:
        raise ConfigError(
            f"Sweeps on a Ray cluster need Ray, which is not installed; install it with: {RAY_INSTALL}"
        ) from None
    return ray


def runtime_env() -> dict[str, Any]:
    """How the project's code reaches every worker: this checkout as their working directory."""
    return {"working_dir": str(PROJECT_ROOT), "excludes": list(WORKING_DIR_EXCLUDES)}


def connect(address: str, **init_options: Any) -> None:
    """Join the Ray cluster at `address` with this checkout as the workers' code, once per process (a
    process already connected stays on its cluster). ConfigError when it cannot be reached."""
    ray = import_ray()
    if ray.is_initialized():
        return
    _check_reachable(address)
    try:
        ray.init(
            address=address,
            runtime_env=runtime_env(),
            log_to_driver=False,
            logging_level=logging.WARNING,
            **init_options,
        )
    except (ConnectionError, ValueError, RuntimeError) as exc:
        raise ConfigError(f"Cannot use the Ray cluster at {address}: {str(exc).splitlines()[0]}") from None


def _check_reachable(address: str) -> None:
    """ConfigError when a HOST:PORT (or ray://HOST:PORT) address does not answer: Ray itself would wait
    minutes for it. "auto" and "local" name no host: Ray answers for them at once."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise ConfigError(f"Cannot reach the Ray cluster at {address}: {exc.strerror or exc}.") from None


def resources(config: RunConfig, cpus_per_point: int) -> dict[str, Any]:
    """The Ray resources one point of `config` holds alone: its engine's GPUs (its backend's `gpus`), else none,
    and `cpus_per_point` cores. A point without GPUs sees none, so it cannot use one that another holds: the
    transformers engine's "auto" device means CPU there."""
    engine = config.engine
    gpus = backend(engine.backend).gpus(engine)
    options: dict[str, Any] = {"num_cpus": cpus_per_point, "num_gpus": gpus}
    if not gpus:
        options["runtime_env"] = {"env_vars": {"CUDA_VISIBLE_DEVICES": ""}}
    return options


class PointWorker:
    """The Ray actor of one engine-settings group: a Runner without a history, keeping its engine loaded across
    the group's points and recording each run where it ran. Each run's progress waits in an outbox
    (remote.Forwarder) for the driver's polls. Threaded (see `_new_worker`), so polls and cancel answer during
    a run."""

    def __init__(self):
        self.runner = Runner()
        self.outbox = Outbox()
        self.current: Run | None = None
        self.facts = node_facts()  # the actor's node and GPUs, fixed for its life: every poll reports them

    def start(self, fields: dict[str, Any]) -> None:
        run = Run(**fields, observers=[Forwarder(self.outbox)])
        self.current = run
        self.runner.enqueue(run)

    def poll(self) -> ActorPoll:
        """The messages of the run so far, waiting up to POLL_S for one."""
        return ActorPoll(self.facts, os.getpid(), self.outbox.drain(POLL_S))

    def cancel(self) -> None:
        if self.current is not None:
            self.current.cancel()

    def where(self) -> dict[str, str]:
        """The node's facts and where this actor's code comes from (the shipped working directory)."""
        from .. import __file__ as package_file

        return {**self.facts, "package": package_file, "pid": str(os.getpid())}


def node_facts() -> dict[str, str]:
    """The node a run ran on, as history columns (env_hostname, env_gpu_ids): its hostname and the GPUs Ray
    gave this worker (empty without GPUs). GPU name, count and driver are in the environment already."""
    import ray

    return {"hostname": socket.gethostname(), "gpu_ids": ",".join(str(gpu) for gpu in ray.get_gpu_ids())}


def states_table(states: list[PointState]) -> pd.DataFrame:
    """One row per run of a cluster sweep: its point, repeat (from 1), state, node, progress, attempts, message."""
    return pd.DataFrame(
        [
            {
                "point": state.point,
                "repeat": state.repeat + 1,
                "state": state.state,
                "node": state.node,
                "progress": state.progress,
                "attempts": state.attempts,
                "message": state.message,
            }
            for state in states
        ],
        columns=["point", "repeat", "state", "node", "progress", "attempts", "message"],
    )


def describe_node(facts: dict[str, str]) -> str:
    """ "host-a" or "host-a (GPU 0,1)"."""
    gpus = facts.get("gpu_ids", "")
    return facts.get("hostname", "") + (f" (GPU {gpus})" if gpus else "")


class _Point:
    """The driver's view of one planned run, across its attempts."""

    def __init__(self, planned: PlannedRun, label: str):
        self.planned, self.label = planned, label
        self.state, self.progress, self.message = RunState.QUEUED, "", ""
        self.facts: dict[str, str] = {}  # node_facts() of the worker that has it
        self.attempts = 0
        self.pid: int | None = None

    def view(self) -> PointState:
        return PointState(
            self.label,
            self.planned.repeat,
            self.state,
            describe_node(self.facts),
            self.progress,
            self.attempts,
            self.message,
            self.pid,
        )


class _PointProgress(JobObserver):
    """Keeps a point's state and progress as its run tells them: the phase, then the requests done."""

    def __init__(self, point: _Point, lock: threading.Lock):
        self.point, self.lock = point, lock

    def on_state(self, run: Run, change: StateChange) -> None:
        with self.lock:
            self.point.state = change.state
            if not run.ended and run.snapshot() is None:
                self.point.progress = change.phase

    def on_snapshot(self, run: Run, snapshot: LiveSnapshot) -> None:
        done = snapshot.completed + snapshot.failed + snapshot.cancelled
        with self.lock:
            self.point.progress = f"{done}/{snapshot.total_requests} requests"


class _ActorLink:
    """The driver's end of an actor running one point's run (remote.Link): it polls the actor's outbox, and
    notes the actor's node and process on the point."""

    def __init__(self, ray, worker, run: Run, point: _Point, lock: threading.Lock):
        self.ray, self.worker, self.run, self.point, self.lock = ray, worker, run, point, lock
        self.polled = None  # the poll under way; none after the last message, which must not drain the next run's

    def receive(self, wait_s: float) -> list[Message] | None:
        ray = self.ray
        if self.polled is None:
            self.polled = self.worker.poll.remote()
        if not ray.wait([self.polled], timeout=wait_s)[0]:
            return None
        try:
            poll = ray.get(self.polled)
        except ray.exceptions.RayError as exc:
            raise LinkLost(_loss_reason(exc)) from None
        self.polled = None
        with self.lock:
            self.point.facts, self.point.pid = poll.node, poll.pid
        return poll.messages

    def cancel(self) -> None:
        if self.run.state == RunState.QUEUED:  # still waiting for resources: nothing to keep
            self.kill()
        else:
            self.worker.cancel.remote()

    def kill(self) -> None:
        self.ray.kill(self.worker)


class ClusterSweepRun(SweepRun):
    """A sweep whose runs go to a Ray cluster (see the module's docstring); build it through
    `launcher(options)` and sweep_driver's start_sweep or resume_sweep."""

    def __init__(self, plan: SweepPlan, runner: Runner, todo: list[PlannedRun], options: ClusterOptions):
        self.options = options
        self._ray = import_ray()
        self._points: list[_Point] = []
        # The actors have no history: each run takes its drift baseline's answers along, read here once (and refused
        # here, before any point runs, where the history lacks them).
        self._baselines = {
            planned.config.dataset.drift_baseline: drift_baseline_for(planned.config, runner.history)
            for planned in todo
        }
        super().__init__(plan, runner, todo)

    def point_states(self) -> list[PointState]:
        """Every run still to do when the sweep started, in plan order, with its state and node."""
        with self._lock:
            return [point.view() for point in self._points]

    def cancel(self) -> None:
        with self._lock:
            self._cancel.set()
            for point in self._points:
                if point.state == RunState.QUEUED:
                    point.state, point.message = RunState.CANCELLED, "Cancelled before it started."

    def _now(self, current) -> tuple[str, str]:
        """Runs under way across the cluster, e.g. "2 running, 1 loading"; no single run id to watch."""
        with self._lock:
            states = [point.state for point in self._points]
        under_way = [
            f"{states.count(state)} {state}" for state in (RunState.RUNNING, RunState.LOADING) if state in states
        ]
        return ", ".join(under_way), ""

    def _drive(self) -> None:
        with self._lock:
            self._points = [_Point(planned, self.describe(planned)) for planned in self._todo]
        groups: dict[tuple, list[_Point]] = {}
        for point in self._points:
            groups.setdefault(engine_key_of(point.planned), []).append(point)
        threads = [
            threading.Thread(target=self._run_group, args=(group,), name=f"{self.sweep_id}-group-{index}", daemon=True)
            for index, group in enumerate(groups.values())
        ]
        try:
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        finally:
            self._done.set()

    def _run_group(self, group: list[_Point]) -> None:
        """The group's points in order on one actor; a fresh actor after one died."""
        todo, worker = deque(group), None
        try:
            while todo and not self._cancel.is_set():
                point = todo.popleft()
                if self._skip(point.planned):
                    with self._lock:
                        point.state = SKIPPED
                    continue
                if worker is None:
                    worker = self._new_worker(point.planned.config)
                run, lost = self._attempt(point, worker)
                if lost:
                    self._kill(worker)
                    worker = None
                    if self._retrying(point):
                        todo.appendleft(point)
                elif run.state == RunState.CANCELLED:
                    return
        finally:
            if worker is not None:
                self._kill(worker)

    def _retrying(self, point: _Point) -> bool:
        return point.attempts <= self.options.retries and not self._cancel.is_set()

    def _attempt(self, point: _Point, worker) -> tuple[Run, bool]:
        """Run the point once on `worker` and record it here: the Run as it ended, and whether the worker
        was lost (died, or was stopped by a cancel)."""
        planned = point.planned
        run = Run(
            run_id=new_run_id(),
            config=planned.config,
            sweep_id=self.sweep_id,
            sweep_repeat=planned.repeat,
            baseline=self._baselines[planned.config.dataset.drift_baseline],
            observers=[_PointProgress(point, self._lock)],
        )
        with self._lock:
            point.attempts += 1
            point.state, point.progress = RunState.QUEUED, ""
            self.runs = [entry for entry in self.runs if entry[0] is not planned] + [(planned, run)]
        worker.start.remote(run.fields())
        mirror = Mirror(run)
        lost = follow(
            run,
            _ActorLink(self._ray, worker, run, point, self._lock),
            mirror,
            cancel_grace_s=CANCEL_GRACE_S,
            cancel=self._cancel,
        )
        with self._lock:
            node = dict(point.facts)
        measurement = run.measurement
        if lost is None:
            if run.record is not None:  # the history's env_hostname and env_gpu_ids say where it ran
                measurement.record = replace(run.record, environment={**run.record.environment, **node})
            if run.state in (RunState.FAILED, RunState.PARTIAL):
                self._note_failure(run.message, None if measurement.measured else engine_key_of(planned))
        elif self._cancel.is_set():
            if not run.ended:
                run.move(RunState.CANCELLED, "Cancelled; its worker was stopped.")
        else:
            where = f" on {describe_node(node)}" if node else ""
            mirror.lose(f"Its Ray worker was lost{where}: {lost}")
            measurement.environment = {**measurement.environment, **node}
            if not self._retrying(point):
                self._note_failure(run.message, None)
        self.runner.keep(run)  # a lost run is recorded as failed with its reason, as one that breaks on one machine
        if measurement.save_error:
            self._note_failure(measurement.save_error, None)
        with self._lock:
            point.state, point.message = run.state, run.message
            if lost is not None and run.state == RunState.FAILED and self._retrying(point):
                point.message += f" Trying again (attempt {point.attempts + 1})."
        run.close()
        return run, lost is not None

    def _new_worker(self, config: RunConfig):
        # Threads: status and cancel are answered while a run goes on.
        return _worker_class().options(max_concurrency=4, **resources(config, self.options.cpus_per_point)).remote()

    def _kill(self, worker) -> None:
        self._ray.kill(worker)


def launch_for(address: str, cpus_per_point: int = 1, retries: int = 0) -> Launch:
    """How a sweep's runs are run: here (sweep_driver's SweepRun) without a cluster address, else on that
    cluster, connected now (ConfigError without Ray or when the cluster cannot be reached)."""
    return launcher(ClusterOptions(address, cpus_per_point, retries)) if address else SweepRun


def launcher(options: ClusterOptions):
    """sweep_driver's `launch` for a sweep on the cluster `options` names, connected to it; ConfigError
    without Ray or when the cluster cannot be reached."""
    connect(options.address)

    def launch(plan: SweepPlan, runner: Runner, todo: list[PlannedRun]) -> ClusterSweepRun:
        return ClusterSweepRun(plan, runner, todo, options)

    return launch


@functools.cache
def _worker_class():
    """PointWorker as a Ray actor class, made once: Ray exports a class each time it is wrapped."""
    return import_ray().remote(PointWorker)


def _loss_reason(exc: Exception) -> str:
    """Ray's reason for a lost actor, without its troubleshooting advice: its first line, and why the
    actor is dead where Ray says ("... because its worker process has died", "... because its node died")."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    because = next((line.split(". ")[0].rstrip(".") + "." for line in lines[1:] if " because " in line), "")
    return " ".join(filter(None, (lines[0] if lines else type(exc).__name__, because)))
