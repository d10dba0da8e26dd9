"""The engine in its own process: watching a run never changes it, and an engine crash ends only its run.

`ProcessRunner` is the Runner the dashboard uses. It keeps the queue, the states and the history in the
calling process, and hands each job to a worker process (multiprocessing, spawn) that owns the engine,
the profiler and the requests: a plain `Runner` there, driven over one pipe, which records each run where it
was measured. The calling process never imports torch, transformers or lmdeploy.

The worker forwards each job's progress over the pipe (remote.Forwarder): every state change as it happens,
the live snapshot and the requests that finished (their sessions, ticks included) every PUBLISH_EVERY_S while
it measures, then the record; an empty batch every PUBLISH_EVERY_S while it has nothing to say. The caller
follows it (remote.follow), replays it on its own Run and saves the record. A worker that dies (a signal, an
exception, os._exit) fails its run with "engine process died: signal 9" (or "exit code N"); the caller then
records it from the requests it had heard of, those in flight failing with that reason. A worker silent for
`hung_after_s` (60 s by default; remote.STARTING_S before a job's first message) is killed and its run fails
as hung. The next job starts a fresh worker.

The worker keeps its engine between jobs with the same engine settings; a job with other settings ends
that worker (freeing all its memory) and starts a new one.

A runner given a `WorkerPool` leaves its worker there when it shuts down idle, and the next runner takes it instead
of starting a process that imports torch again; a pooled worker replaces its engine in place when the settings
change. The dashboard keeps one runner per server process and no pool; the tests make a runner per test and share a
pool per module (tests/conftest.py).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
import traceback
from collections.abc import Callable, Collection, Mapping
from multiprocessing.connection import Connection
from typing import Any

from ..config import EngineConfig, LoadConfig
from ..engines import engine_settings_key
from ..store.history import RESULTS_ENV, History
from .lifecycle import PlaygroundJob, Run
from .remote import AnyJob, Forwarder, LinkLost, Message, Mirror, Outbox, follow
from .runner import PUBLISH_EVERY_S, Runner

log = logging.getLogger(__name__)

# The longest a worker may stay silent before it counts as hung. Loading a model sends heartbeats too (from
# another thread), so only a process that is stopped or stuck holding the GIL goes quiet this long.
HUNG_AFTER_S = 60.0
STOP_WAIT_S = 5.0
# The environment variables only the calling process reads: the worker records nothing itself (its Runner has no
# history), so a pooled worker started under another results folder is the same worker.
CALLER_ONLY_ENV = frozenset({RESULTS_ENV})


# ---- the worker process -----------------------------------------------------------------------


def _send(conn: Connection, send_lock: threading.Lock, outbox: Outbox) -> None:
    """Send a job's messages as they come, an empty batch after PUBLISH_EVERY_S without any, until its last."""
    while True:
        batch = outbox.drain(PUBLISH_EVERY_S)
        with send_lock:
            conn.send(batch)
        if any(message.last for message in batch):
            return


def serve(conn: Connection) -> None:
    """The worker's main loop: run the jobs the caller sends, forward their progress, obey cancels."""
    try:
        _serve(conn)
    except BaseException:
        traceback.print_exc()
        # Now, without the interpreter's shutdown: the engine's threads may abort it (SIGABRT), hiding why.
        os._exit(1)


def _serve(conn: Connection) -> None:
    runner = Runner(caller_pid=os.getppid())  # the process that started this worker follows its runs
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
        outbox = Outbox()
        kind = Run if command == "run" else PlaygroundJob
        job = kind(**payload, observers=[Forwarder(outbox)])
        threading.Thread(target=_send, args=(conn, send_lock, outbox), name=f"send-{command}", daemon=True).start()
        runner.enqueue(job)


# ---- the caller's side ------------------------------------------------------------------------


class _Worker:
    """A started worker process and the caller's end of its pipe."""

    def __init__(self, target: Callable[[Connection], None]):
        context = multiprocessing.get_context("spawn")
        self.conn, child_end = context.Pipe()
        self.target, self.environment = target, dict(os.environ)
        # Daemonic: it must not outlive the dashboard, whatever stops the dashboard.
        self.process = context.Process(target=target, args=(child_end,), name="bench-engine", daemon=True)
        self.process.start()
        child_end.close()  # so that the worker's death reads as the end of the pipe here
        self.key: tuple | None = None  # the engine settings of its last job
        self.send_lock = threading.Lock()

    @property
    def pid(self) -> int:
        assert self.process.pid is not None, "started when made"
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


class WorkerPool:
    """An idle engine worker kept between runners: a runner that shuts down with nothing in flight leaves its worker
    here, and the next runner takes it instead of starting a process.

    The worker is taken only by a runner that would start the same one: the same entry point, and the same
    environment but for CALLER_ONLY_ENV and `unread_env`, variables the pool's owner knows the worker never reads
    (pytest's PYTEST_CURRENT_TEST, say): a worker inherits the environment it was started in. It keeps the engine
    it last loaded: a job with the same engine settings reuses it, one with others has the worker's Runner replace it
    in place, as the CLI's Runner does, instead of ending the process; so a pool suits many short-lived runners, one
    at a time, on one machine (the tests), not a server that must give all of an engine's memory back. It holds one
    worker per entry point: keeping another ends the one it held, and `close` ends them all."""

    def __init__(self, unread_env: Collection[str] = ()) -> None:
        self.unread_env = frozenset(unread_env)
        self._idle: dict[Callable[[Connection], None], _Worker] = {}  # by entry point
        self._lock = threading.Lock()

    def take(self, target: Callable[[Connection], None]) -> _Worker | None:
        """The idle worker if it is alive and was started with `target` in this environment, now the caller's."""
        with self._lock:
            worker = self._idle.get(target)
            if worker is None or not self._same_environment(worker):
                return None
            del self._idle[target]
        if not worker.process.is_alive():
            worker.stop()
            return None
        return worker

    def _same_environment(self, worker: _Worker) -> bool:
        """Whether a worker started now would read the environment `worker` was started in."""
        unread = CALLER_ONLY_ENV | self.unread_env

        def read(environment: Mapping[str, str]) -> dict[str, str]:
            return {name: value for name, value in environment.items() if name not in unread}

        return read(worker.environment) == read(os.environ)

    def keep(self, worker: _Worker) -> None:
        """Hold an idle worker for the next runner."""
        with self._lock:
            ended = self._idle.get(worker.target)
            self._idle[worker.target] = worker
        if ended is not None:
            ended.stop()

    def close(self) -> None:
        """End the workers held."""
        with self._lock:
            ended, self._idle = list(self._idle.values()), {}
        for worker in ended:
            worker.stop()


class _PipeLink:
    """The caller's end of the pipe, for the one job the worker has (remote.Link)."""

    def __init__(self, worker: _Worker, job_id: str, release: Callable[[], None]):
        self.worker, self.job_id, self.release = worker, job_id, release

    def receive(self, wait_s: float) -> list[Message] | None:
        try:
            return self.worker.conn.recv() if self.worker.conn.poll(wait_s) else None
        except (EOFError, OSError):
            reason = self.worker.death()
            log.error("%s (pid %s)", reason, self.worker.pid)
            self.release()
            raise LinkLost(reason) from None

    def cancel(self) -> None:
        try:
            self.worker.send("cancel", self.job_id)
        except OSError:  # the worker is gone: the next receive says why
            pass

    def kill(self) -> None:
        self.worker.process.kill()

    def hung(self, silent_s: float) -> str:
        log.error("engine process %s published nothing for %s s; killing it", self.worker.pid, silent_s)
        self.kill()
        self.release()
        return f"engine process hung: it published nothing for {silent_s:g} s and was killed"


class ProcessRunner(Runner):
    """A Runner whose engine runs in a worker process (see the module's docstring)."""

    def __init__(
        self,
        history: History | None = None,
        hung_after_s: float = HUNG_AFTER_S,
        worker_main: Callable[[Connection], None] | None = None,
        workers: WorkerPool | None = None,
    ):
        """`worker_main`: the worker's entry point, `serve` unless given; the spawned process imports it. `workers`:
        where the worker is taken from and left at shutdown instead of being started and ended (WorkerPool)."""
        super().__init__(history)
        self.hung_after_s = hung_after_s
        self.worker_main = worker_main or serve
        self.workers = workers
        self._worker: _Worker | None = None

    def worker_pid(self) -> int | None:
        """The worker process's id while one is running."""
        worker = self._worker
        return worker.pid if worker is not None and worker.process.is_alive() else None

    def _benchmark(self, run: Run) -> None:
        config = run.config
        worker = self._worker_for(config.engine, config.load)
        worker.send("run", run.fields())
        self._follow(worker, run, run.run_id)

    def _complete(self, job: PlaygroundJob) -> None:
        load = self._engine_settings[1] if self._engine_settings is not None else LoadConfig()
        worker = self._worker_for(job.engine, load)
        worker.send(
            "playground",
            dict(
                job_id=job.job_id,
                engine=job.engine,
                conversations=job.conversations,
                generation=job.generation,
                max_new_tokens=job.max_new_tokens,
            ),
        )
        self._follow(worker, job, job.job_id)

    def _follow(self, worker: _Worker, job: AnyJob, job_id: str) -> None:
        mirror = Mirror(job)
        lost = follow(job, _PipeLink(worker, job_id, self._release_engine), mirror, hung_after_s=self.hung_after_s)
        if lost is not None:
            mirror.lose(lost)

    def _worker_for(self, engine: EngineConfig, load: LoadConfig) -> _Worker:
        key = engine_settings_key(engine, load)
        worker = self._worker
        # Other settings end the worker, unless it is a pool's: that one replaces its engine in place.
        if worker is None or not worker.process.is_alive() or (worker.key != key and self.workers is None):
            self._release_engine()
            taken = self.workers.take(self.worker_main) if self.workers is not None else None
            worker = self._worker = taken or _Worker(self.worker_main)
        if worker.key != key or self._engine_settings is None:
            worker.key, self._engine_settings = key, (engine, load)
        return worker

    def _release_engine(self) -> None:
        """Let the worker go: to the pool when the runner's thread has ended (shutdown, nothing in flight), else it
        ends (a lost or hung worker, an error in a job, other engine settings)."""
        worker, self._worker, self._engine_settings = self._worker, None, None
        if worker is None:
            return
        idle = self._thread is None or not self._thread.is_alive()
        if self.workers is not None and idle and worker.process.is_alive():
            self.workers.keep(worker)
        else:
            worker.stop()
