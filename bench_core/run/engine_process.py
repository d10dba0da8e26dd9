"""The engine in its own process: watching a run never changes it, and an engine crash ends only its run.

`ProcessRunner` is the Runner the dashboard uses. It keeps the queue, the states and the history in the
calling process, and hands each job to a worker process (multiprocessing, spawn) that owns the engine,
the profiler and the requests: a plain `Runner` there, driven over one pipe. The calling process never
imports torch, transformers or lmdeploy.

The worker publishes an `Update` every `PUBLISH_EVERY_S` and once when the job ends: state, phase,
message, warnings, the live snapshot, and the requests that finished since the last update (their
sessions, ticks included). So the caller holds every finished request as it finishes and rebuilds the
profiler from them: one way to record a run, whether the worker ended it or died in it. A worker that
dies (a signal, an exception, os._exit) fails its run with "engine process died: signal 9" (or "exit code
N"), keeping the requests it had published; those in flight fail with that reason. A worker silent for
`hung_after_s` (60 s by default; STARTING_S before a job's first update) is killed and its run fails as
hung. The next job starts a fresh worker.

The worker keeps its engine between jobs with the same engine settings; a job with other settings ends
that worker (freeing all its memory) and starts a new one.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection
from time import perf_counter
from typing import Any

from ..config import EngineConfig, LoadConfig, RunConfig
from ..load.datasets import Sample
from ..engines import EngineInfo, engine_settings_key
from ..hardware.environment import collect_environment
from ..store.history import History
from ..load.playground import PlaygroundResult
from ..measure.profiler import LiveSnapshot, Session
from .runner import FAILED, PlaygroundJob, Run, Runner, new_profiler

log = logging.getLogger(__name__)

PUBLISH_EVERY_S = 0.25
# The longest a worker may stay silent before it counts as hung. Loading a model publishes too (from
# another thread), so only a process that is stopped or stuck holding the GIL goes quiet this long.
HUNG_AFTER_S = 60.0
STARTING_S = 60.0  # the silence allowed before a job's first update: a fresh worker imports its libraries first
POLL_S = 0.05  # how often the caller checks for a cancel while it waits for updates
STOP_WAIT_S = 5.0


@dataclass
class Update:
    """What a worker publishes about its job; the fields a job type does not have stay empty."""

    job_id: str
    state: str
    message: str
    user_error: bool
    engine_info: EngineInfo | None
    environment: dict[str, str] | None
    done: bool
    published_at: float  # perf_counter: system-wide on Linux, so it compares with the ticks
    phase: str = ""
    warnings: list[str] = field(default_factory=list)
    load_seconds: float | None = None
    sample: Sample | None = None  # once, without the prompts: what the caller needs of it
    t_start: float | None = None
    t_finish: float | None = None
    live: LiveSnapshot | None = None
    finished: dict[int, Session] = field(default_factory=dict)  # sessions that ended since the last update
    telemetry: Any = None  # once the measurement ended: every hardware sample (a DataFrame, see runner.Run)
    results: list[PlaygroundResult] = field(default_factory=list)  # playground answers since the last update


# ---- the worker process -----------------------------------------------------------------------

class _Publisher:
    """Builds a job's updates, each carrying only what the caller has not had yet."""

    def __init__(self, job: Run | PlaygroundJob):
        self.job = job
        self.sent_sample = False
        self.sent_environment = False
        self.sent_info: EngineInfo | None = None
        self.unsent: list[int] | None = None  # indices of sessions not yet published as finished
        self.results_sent = 0

    def update(self) -> Update:
        job = self.job
        done = job.done_event.is_set()
        update = Update(job.job_id if isinstance(job, PlaygroundJob) else job.run_id, job.state, job.message,
                        job.user_error, job.engine_info, None, done, perf_counter())
        if not self.sent_environment or job.engine_info is not self.sent_info:
            update.environment = collect_environment(job.engine_info)
            self.sent_environment, self.sent_info = True, job.engine_info
        if isinstance(job, PlaygroundJob):
            results = list(job.results)
            update.results, self.results_sent = results[self.results_sent:], len(results)
            return update
        update.phase, update.warnings, update.load_seconds = job.phase, list(job.warnings), job.load_seconds
        if job.sample is not None and not self.sent_sample:
            update.sample = replace(job.sample, requests=[replace(r, prompt="") for r in job.sample.requests])
            self.sent_sample = True
        profiler = job.profiler
        if profiler is not None:
            sessions = profiler.sessions
            if self.unsent is None:
                self.unsent = list(range(len(sessions)))
            update.t_start, update.t_finish = profiler.t_start, profiler.t_finish
            update.live = job.snapshot()  # with the latest hardware samples
            update.finished = {i: sessions[i] for i in self.unsent if sessions[i].finished}
            self.unsent = [i for i in self.unsent if i not in update.finished]
        if done:
            update.telemetry = job.telemetry
        return update


def _publish(conn: Connection, send_lock: threading.Lock, job: Run | PlaygroundJob, every_s: float) -> None:
    publisher = _Publisher(job)
    while True:
        done = job.done_event.wait(every_s)
        update = publisher.update()
        with send_lock:
            conn.send(update)
        if done:
            return


class _WorkerRunner(Runner):
    """The worker's Runner: the caller records the runs, from what the worker published."""

    def record(self, run: Run) -> None:
        pass


def serve(conn: Connection, publish_every_s: float = PUBLISH_EVERY_S) -> None:
    """The worker's main loop: run the jobs the caller sends, publish their updates, obey cancels."""
    try:
        _serve(conn, publish_every_s)
    except BaseException:
        traceback.print_exc()
        # Now, without the interpreter's shutdown: the engine's threads may abort it (SIGABRT), hiding why.
        os._exit(1)


def _serve(conn: Connection, publish_every_s: float) -> None:
    runner = _WorkerRunner()
    send_lock = threading.Lock()
    while True:
        try:
            command, payload = conn.recv()
        except EOFError:  # the caller is gone
            command = "stop"
        if command == "stop":  # an error ends the process as it is instead: the caller sees it die
            runner.shutdown()
            return
        if command == "cancel":
            job = runner.get(payload) or runner.get_playground(payload)
            if job is not None:
                job.cancel()
            continue
        job = Run(**payload) if command == "run" else PlaygroundJob(**payload)
        threading.Thread(target=_publish, args=(conn, send_lock, job, publish_every_s),
                         name=f"publish-{command}", daemon=True).start()
        runner.enqueue(job)


# ---- the caller's side ------------------------------------------------------------------------

class _Worker:
    """A started worker process and the caller's end of its pipe."""

    def __init__(self, target: Callable[[Connection], None], key: tuple, settings: tuple[EngineConfig, LoadConfig]):
        context = multiprocessing.get_context("spawn")
        self.conn, child_end = context.Pipe()
        # Daemonic: it must not outlive the dashboard, whatever stops the dashboard.
        self.process = context.Process(target=target, args=(child_end,), name="bench-engine", daemon=True)
        self.process.start()
        child_end.close()  # so that the worker's death reads as the end of the pipe here
        self.key, self.settings = key, settings
        self.send_lock = threading.Lock()

    @property
    def pid(self) -> int:
        return self.process.pid

    def send(self, command: str, payload: Any = None) -> None:
        with self.send_lock:
            self.conn.send((command, payload))

    def death(self) -> str:
        """Why the process ended, once it has."""
        self.process.join(STOP_WAIT_S)
        code = self.process.exitcode
        if code is None:
            return "engine process stopped answering"
        return f"engine process died: signal {-code}" if code < 0 else f"engine process died: exit code {code}"

    def stop(self) -> None:
        try:
            self.send("stop")
        except OSError:
            pass
        self.process.join(STOP_WAIT_S)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(STOP_WAIT_S)
        self.conn.close()


class _Mirror:
    """The caller's copy of a run in a worker, from its updates; at the end it rebuilds the profiler."""

    def __init__(self, run: Run):
        self.run = run
        self.sessions: list[Session] = []
        self.t_start: float | None = None
        self.t_finish: float | None = None
        self.last_heard: float | None = None

    def apply(self, update: Update) -> None:
        run = self.run
        _apply_common(run, update)
        run.phase, run.warnings, run.load_seconds = update.phase, update.warnings, update.load_seconds
        if update.sample is not None:
            run.sample = update.sample
            self.sessions = [Session(r.input_len, r.output_len) for r in update.sample.requests]
        for index, session in update.finished.items():
            self.sessions[index] = session
        self.t_start, self.t_finish, self.last_heard = update.t_start, update.t_finish, update.published_at
        run.live = update.live
        if update.telemetry is not None:
            run.telemetry = update.telemetry

    def end(self, lost: str | None) -> None:
        """Give the run its profiler, once it started measuring; `lost`: why the worker went away."""
        run = self.run
        if lost is not None:
            run.state, run.message = FAILED, lost
            if run.environment is None:
                run.environment = {}  # unknown: the process that would have said is gone
        if self.t_start is None:
            return
        profiler = new_profiler(run.config)
        profiler.sessions = self.sessions
        profiler.start(self.t_start)
        if lost is not None:
            for session in self.sessions:
                if not session.finished:
                    session.finish(Session.FAIL, lost, self.last_heard)
        profiler.finish(self.t_finish if self.t_finish is not None else self.last_heard)
        profiler.compute_metrics()
        run.profiler = profiler


def _apply_common(job: Run | PlaygroundJob, update: Update) -> None:
    job.state, job.message, job.user_error = update.state, update.message, update.user_error
    job.engine_info = update.engine_info
    if update.environment is not None and isinstance(job, Run):
        job.environment = update.environment


class ProcessRunner(Runner):
    """A Runner whose engine runs in a worker process (see the module's docstring)."""

    def __init__(self, history: History | None = None, hung_after_s: float = HUNG_AFTER_S,
                 worker_main: Callable[[Connection], None] | None = None):
        """`worker_main`: the worker's entry point, `serve` unless given; the spawned process imports it."""
        super().__init__(history)
        self.hung_after_s = hung_after_s
        self.worker_main = worker_main or serve
        self._worker: _Worker | None = None

    def worker_pid(self) -> int | None:
        """The worker process's id while one is running."""
        worker = self._worker
        return worker.pid if worker is not None and worker.process.is_alive() else None

    def _benchmark(self, run: Run) -> None:
        config = run.config
        worker = self._worker_for(config.engine, config.load)
        worker.send("run", dict(run_id=run.run_id, config=config, created_at=run.created_at,
                                sweep_id=run.sweep_id, sweep_repeat=run.sweep_repeat))
        mirror = _Mirror(run)
        mirror.end(self._follow(worker, run, mirror.apply))

    def _complete(self, job: PlaygroundJob) -> None:
        load = self._engine_settings[1] if self._engine_settings is not None else LoadConfig()
        worker = self._worker_for(job.engine, load)
        worker.send("playground", dict(job_id=job.job_id, engine=job.engine, conversations=job.conversations,
                                       generation=job.generation, max_new_tokens=job.max_new_tokens))

        def apply(update: Update) -> None:
            _apply_common(job, update)
            job.results.extend(update.results)

        lost = self._follow(worker, job, apply)
        if lost is not None:
            job.state, job.message = FAILED, lost

    def _follow(self, worker: _Worker, job: Run | PlaygroundJob, apply: Callable[[Update], None]) -> str | None:
        """Apply the job's updates until it ends; None then, else why the worker went away."""
        cancel_sent = False
        heard, allowed_s = time.monotonic(), max(self.hung_after_s, STARTING_S)
        try:
            while True:
                if job.cancel_event.is_set() and not cancel_sent:
                    worker.send("cancel", job.job_id if isinstance(job, PlaygroundJob) else job.run_id)
                    cancel_sent = True
                if worker.conn.poll(POLL_S):
                    update = worker.conn.recv()
                    heard, allowed_s = time.monotonic(), self.hung_after_s
                    apply(update)
                    if update.done:
                        return None
                elif time.monotonic() - heard > allowed_s:
                    log.error("engine process %s published nothing for %s s; killing it", worker.pid, allowed_s)
                    worker.process.kill()
                    self._release_engine()
                    return f"engine process hung: it published nothing for {allowed_s:g} s and was killed"
        except (EOFError, OSError):
            reason = worker.death()
            log.error("%s (pid %s)", reason, worker.pid)
            self._release_engine()
            return reason

    def _worker_for(self, engine: EngineConfig, load: LoadConfig) -> _Worker:
        key = engine_settings_key(engine, load)
        if self._worker is None or self._worker.key != key or not self._worker.process.is_alive():
            self._release_engine()
            self._worker = _Worker(self.worker_main, key, (engine, load))
            self._engine_settings = (engine, load)
        return self._worker

    def _release_engine(self) -> None:
        worker, self._worker, self._engine_settings = self._worker, None, None
        if worker is not None:
            worker.stop()
