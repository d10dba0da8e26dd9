"""One benchmark against a server sent from several client processes (the client_processes setting).

One asyncio process reads some 80k SSE events a second on a core; past that the client, not the server, sets the
pace. `ClientWorkers.run` splits the requests over N worker processes, each running `openai_client.run_requests` with
its own event loop and connection pool, and reads their events back as one `ClientRun` would, so the engine and its
one profiler see a single run:

- the schedule is drawn once, by the caller, from the seed, as for one process; each request is sent by one worker at
  its offset from one t0 shared by all (perf_counter is CLOCK_MONOTONIC on Linux: one clock for every process on the
  machine, so the workers' timestamps are comparable with each other and with the profiler's);
- a session's turns stay in one worker (a turn waits for the answer before it); sessions are dealt round-robin;
- a max concurrency is split between the workers (5 over 2: 3 and 2), so at most that many are in flight in all;
  fewer slots than workers is refused (`concurrency_problems`);
- every event comes back with the global index; a finish brings its `RequestResult`, which the engine reads as it
  reads a one-process run's.

Workers are plain child processes (subprocess, not multiprocessing): the dashboard's engine runs in a daemonic
process, which multiprocessing does not let have children. `ClientWorkers` starts them with the engine and keeps
them for its runs, so a run's time holds none of their start-up. Each talks over one socket pair; a worker whose
parent goes away sees the socket close and cancels its requests.

Every wait on a worker has a deadline. A worker that dies is seen at once (its socket closes). One that stops
answering (SIGSTOP, a paused container, a deadlock) is not, so a running worker's loop sends at least one batch of
events every openai_client.HEARTBEAT_S, empty where nothing happened, and a worker the parent hears nothing from for
WORKER_SILENCE_S (or that runs past its run's duration by as much) is killed: the run ends with one line naming it
and what the parent was waiting for, and keeps what it had measured. No send to or read from a worker's socket
blocks longer than that either, and its start has START_WAIT_S.
"""

from __future__ import annotations

import dataclasses
import math
import os
import queue
import socket
import struct
import subprocess
import sys
import threading
import time
import typing
from collections.abc import Iterator, Sequence
from multiprocessing.connection import Connection, Pipe, wait
from pathlib import Path

from ..config import client_in_workers, setting
from ..errors import BenchError, ConfigError
from ..load.requests import SampledRequest
from ..load.schedule import SendSchedule
from .base import EngineEvent
from .loop_lag import LoopLag
from .openai_client import ServerError, run_requests
from .openai_request import RequestResult, ServerSpec

START_MARGIN_S = 0.02  # from "all workers ready" to t0: the start message reaches each worker before it
STOP_WAIT_S = 10.0
START_WAIT_S = 120.0  # an interpreter's imports, on a machine that may be busy
# Many heartbeats (openai_client.HEARTBEAT_S) long: a loop that a busy machine runs late is not taken for a stopped one.
WORKER_SILENCE_S = 30.0
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


def concurrency_problems(processes: int, slots: int | None) -> list[str]:
    """Why `slots` (a concurrency limit, None: none) cannot be split over `processes` workers."""
    if client_in_workers(processes) and slots is not None and slots < processes:
        flag = setting("client_processes").cli_flag
        return [
            f"{flag} {processes} splits the {slots} requests allowed in flight between the processes, and each "
            f"needs at least one: use at most {slots} client processes or allow {processes} requests in flight."
        ]
    return []


def split_sessions(requests: Sequence[SampledRequest], processes: int) -> list[list[int]]:
    """The request indices each worker sends, in order: whole sessions (a request and the turns that follow it),
    dealt round-robin; ConfigError when there are fewer sessions than workers."""
    session_of: list[int] = []
    starts: list[int] = []
    for index, request in enumerate(requests):
        if request.follows is None:
            session_of.append(len(starts))
            starts.append(index)
        else:
            session_of.append(session_of[request.follows])
    if len(starts) < processes:
        what = "sessions" if len(starts) < len(requests) else "requests"
        raise ConfigError(
            f"{setting('client_processes').cli_flag} {processes} is more processes than the "
            f"{len(starts)} {what} to send: use at most {len(starts)}."
        )
    shares: list[list[int]] = [[] for _ in range(processes)]
    for index, session in enumerate(session_of):
        shares[session % processes].append(index)
    return shares


def _slots(max_concurrency: int | None, processes: int, worker: int) -> int | None:
    if max_concurrency is None:
        return None
    return max_concurrency // processes + (worker < max_concurrency % processes)


class ClientWorkers:
    """N started worker processes, kept for the engine's life: each interpreter's imports (some 1.5 CPU s) come
    while the engine loads, not after the run's clock has started. `run` hands them one run at a time."""

    def __init__(self, processes: int) -> None:
        self._workers: list[tuple[subprocess.Popen, Connection]] = []
        self.silence_s = WORKER_SILENCE_S
        try:
            for _ in range(processes):
                self._start_worker()
            for process, conn in self._workers:
                if not conn.poll(START_WAIT_S):
                    raise ServerError(self.kill_worker(conn, _silent(START_WAIT_S, "it to start")) + ".")
                self._expect(process, conn, "up")
        except BaseException:
            self.close()
            raise

    def __len__(self) -> int:
        return len(self._workers)

    @property
    def pids(self) -> list[int]:
        return [process.pid for process, _ in self._workers]

    def _start_worker(self) -> None:
        ours, theirs = Pipe()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (_PACKAGE_ROOT, os.environ.get("PYTHONPATH"))))}
        process = subprocess.Popen(
            [sys.executable, "-m", __name__, str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            env=env,
            stdin=subprocess.DEVNULL,
        )
        theirs.close()  # so that the worker's death reads as the end of the socket here
        _limit_blocking(ours, self.silence_s)
        self._workers.append((process, ours))

    @staticmethod
    def _expect(process: subprocess.Popen, conn: Connection, kind: str) -> None:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            raise ServerError(_died(process)) from None
        if message[0] != kind:
            raise ServerError(f"A client worker process answered {message[0]!r} where {kind!r} was due.")

    def kill_worker(self, conn: Connection, why: str) -> str:
        """Kill the worker on `conn` for `why` (what it did not do); the sentence that says so, naming it (the pool
        is `broken` from now on)."""
        number, process = next((n, p) for n, (p, c) in enumerate(self._workers, 1) if c is conn)
        process.kill()  # a stopped process too: SIGKILL needs no SIGCONT
        process.wait()
        return f"Client worker process {number} of {len(self._workers)} (pid {process.pid}) {why}, so it was killed"

    @property
    def broken(self) -> bool:
        """A worker has ended (it died, or a run left it in an unknown state): the pool cannot run again."""
        return any(process.poll() is not None for process, _ in self._workers)

    def run(
        self,
        spec: ServerSpec,
        model: str,
        requests: Sequence[SampledRequest],
        schedule: SendSchedule,
        max_concurrency: int | None = None,
        duration_s: float | None = None,
        ignore_eos: bool = True,
        cancel: threading.Event | None = None,
    ) -> ProcessClientRun:
        """`openai_client.run_requests` on `schedule` (an arrival process's, drawn once by the caller), from the
        workers: each gets its share (`split_sessions`) and sends once `ProcessClientRun.events()` has heard every
        worker ready. Warm-ups are the engine's, before this."""
        if problems := concurrency_problems(len(self._workers), max_concurrency):
            raise ConfigError(problems[0])
        shares = split_sessions(requests, len(self._workers))
        for worker, ((process, conn), indices) in enumerate(zip(self._workers, shares)):
            local = {index: position for position, index in enumerate(indices)}
            mine = [
                requests[i]
                if (follows := requests[i].follows) is None
                else dataclasses.replace(requests[i], follows=local[follows])
                for i in indices
            ]
            task = {
                "spec": spec,
                "model": model,
                "requests": mine,
                "indices": indices,
                "offsets": [schedule.offset(i) for i in indices if requests[i].follows is None],
                "duration_s": duration_s,
                "ignore_eos": ignore_eos,
                "max_concurrency": _slots(max_concurrency, len(shares), worker),
            }
            try:
                conn.send(("run", task))
            except BlockingIOError:  # its socket's buffer full for `silence_s`: the worker reads nothing
                why = _silent(self.silence_s, "it to take its share of the run")
                raise ServerError(self.kill_worker(conn, why) + ".") from None
            except OSError:
                raise ServerError(_died(process)) from None
        return ProcessClientRun(self, spec, requests, schedule, cancel or threading.Event(), duration_s)

    def send_all(self, message: tuple) -> None:
        for _, conn in self._workers:
            try:
                conn.send(message)
            except OSError:  # a worker that already ended; its end of the socket says so
                pass

    def close(self) -> None:
        """Stop the workers: each ends its run (cancelled) and exits; one that does not within STOP_WAIT_S is
        killed."""
        self.send_all(("close",))
        deadline = time.monotonic() + STOP_WAIT_S
        for process, conn in self._workers:
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            conn.close()
        self._workers = []


def _silent(seconds: float, waiting_for: str) -> str:
    """Why a worker is killed that sent nothing for `seconds`."""
    return f"stopped answering: nothing from it for {seconds:g} s while waiting for {waiting_for}"


def _died(process: subprocess.Popen) -> str:
    try:
        code = process.wait(STOP_WAIT_S)  # its socket closed: it is exiting
    except subprocess.TimeoutExpired:  # or closed it and lives on
        process.kill()
        code = process.wait()
    how = f"signal {-code}" if code < 0 else f"exit code {code}"
    return f"A client worker process died ({how}), so its requests have no results."


class ProcessClientRun:
    """A run split over the workers, read as `openai_client.ClientRun` is: `events()`, `results`, `t0`, `spec`."""

    def __init__(
        self,
        workers: ClientWorkers,
        spec: ServerSpec,
        requests: Sequence[SampledRequest],
        schedule: SendSchedule,
        cancel: threading.Event,
        duration_s: float | None = None,
    ) -> None:
        self.spec, self.cancel, self._workers, self._duration_s = spec, cancel, workers, duration_s
        self.results = [
            RequestResult(i, r.output_len, math.nan if (due := schedule.offset(i)) is None else due)
            for i, r in enumerate(requests)
        ]
        self.t0: float | None = None
        self.loop_lag = LoopLag()  # not sampled here: the workers' loops' samples, gathered as each is done

    def events(self) -> Iterator[EngineEvent]:
        """Every worker's events, as they come; raises the first worker's error at the end. A worker that dies or
        stops answering (see the module's docstring) cancels the others' requests. Closed early (a failure in the
        reader), it cancels the workers and waits for their end, so they can run again."""
        workers, silence_s = self._workers, self._workers.silence_s
        open_ = {conn: process for process, conn in workers._workers}
        heard = dict.fromkeys(open_, time.monotonic())  # when each last said something, or was told to start
        ready: set[Connection] = set()
        error, cancelled = None, False
        try:
            while open_:
                if self.cancel.is_set() and not cancelled:
                    cancelled = True
                    workers.send_all(("cancel",))
                for conn in _ready(open_, 0.05):
                    heard[conn] = time.monotonic()
                    try:
                        message = conn.recv()
                    except BlockingIOError:  # a message begun, and the rest not sent for `silence_s`
                        del open_[conn]
                        error = error or ServerError(self._lost(conn, _silent(silence_s, "the rest of a message")))
                        continue
                    except (EOFError, OSError):
                        error = error or ServerError(_died(open_.pop(conn)))
                        self.cancel.set()
                        continue
                    if message[0] == "events":  # an empty batch: the worker's heartbeat
                        yield from self._merge(message[1])
                    elif message[0] == "ready":
                        ready.add(conn)
                    else:  # "done"
                        del open_[conn]
                        error = error or message[1]
                        self.loop_lag.samples.extend(message[2])
                for conn, why in self._overdue(open_, heard, ready, cancelled):
                    del open_[conn]
                    error = error or ServerError(self._lost(conn, why))
                # Every worker left is ready (all of them, or the rest of a run that lost one: they end it cancelled).
                if self.t0 is None and open_ and ready.issuperset(open_):
                    self.t0 = time.perf_counter() + START_MARGIN_S
                    workers.send_all(("start", self.t0))
                    heard = dict.fromkeys(heard, time.monotonic())  # a ready worker waited on the others
        finally:
            if open_:
                workers.send_all(("cancel",))
                _drain(open_)
        if error is not None:
            raise error

    def _overdue(
        self, open_: dict[Connection, subprocess.Popen], heard: dict[Connection, float], ready: set, cancelled: bool
    ) -> list[tuple[Connection, str]]:
        """The workers not heard from for `silence_s`, or still running that long past the run's duration; each with
        what it did not do."""
        silence_s, now = self._workers.silence_s, time.monotonic()
        overdue = []
        for conn in open_:
            if conn in ready and self.t0 is None:  # told to wait for the others to be ready
                continue
            if conn not in ready:
                waiting_for = "it to say it was ready to send"
            elif cancelled:
                waiting_for = "its cancelled requests to end"
            else:
                waiting_for = "the events of its requests"
            if now - heard[conn] > silence_s:
                overdue.append((conn, _silent(silence_s, waiting_for)))
            elif (
                self._duration_s is not None
                and self.t0 is not None
                and time.perf_counter() > self.t0 + self._duration_s + silence_s
            ):
                overdue.append(
                    (conn, f"was still running {silence_s:g} s after the run's {self._duration_s:g} s duration ended")
                )
        return overdue

    def _lost(self, conn: Connection, why: str) -> str:
        """A worker that stopped answering: killed, the others' requests cancelled; what the run's error says."""
        self.cancel.set()
        return self._workers.kill_worker(conn, why) + "; the requests measured before are kept."

    def _merge(self, items: list) -> Iterator[EngineEvent]:
        for item in items:
            if len(item) == 5:  # the ticks of one read, sent bare: most events are these
                index, ts, n_tokens, earlier_ts, earlier_ns = item
                yield EngineEvent(index, "tokens", ts, n_tokens, earlier_ts=earlier_ts, earlier_ns=earlier_ns)
            else:
                event, result = item
                if result is not None:
                    self.results[event.index] = result
                yield event


def _limit_blocking(conn: Connection, seconds: float) -> None:
    """Let no send to or read from `conn`'s socket wait more than `seconds` for the other end (SO_SNDTIMEO and
    SO_RCVTIMEO: one that would raises BlockingIOError). Set on a duplicate of the socket: options are the socket's."""
    with socket.socket(fileno=os.dup(conn.fileno())) as sock:
        timeval = struct.pack("ll", int(seconds), int(seconds % 1 * 1e6))
        for option in (socket.SO_SNDTIMEO, socket.SO_RCVTIMEO):
            sock.setsockopt(socket.SOL_SOCKET, option, timeval)


def _ready(open_: dict[Connection, subprocess.Popen], timeout: float) -> list[Connection]:
    """The workers' connections with a message waiting (or closed), within `timeout` seconds."""
    return typing.cast("list[Connection]", wait(list(open_), timeout=timeout))


def _drain(open_: dict[Connection, subprocess.Popen]) -> None:
    """Read the cancelled workers' last events until each is done; kill one that is not within STOP_WAIT_S (the
    pool is then `broken`)."""
    deadline = time.monotonic() + STOP_WAIT_S
    while open_ and (left := deadline - time.monotonic()) > 0:
        for conn in _ready(open_, left):
            try:
                if conn.recv()[0] == "done":
                    del open_[conn]
            except BlockingIOError:  # a message begun and not finished: killed below
                pass
            except (EOFError, OSError):
                del open_[conn]
    for process in open_.values():
        process.kill()


# ---- the worker's side ----------------------------------------------------------------------------


def _worker(conn: Connection) -> None:
    """Run what the parent hands out, one run at a time, until it says close or goes away."""
    inbox: queue.SimpleQueue = queue.SimpleQueue()
    current = {"cancel": threading.Event()}
    threading.Thread(target=_read_messages, args=(conn, inbox, current), name="worker-inbox", daemon=True).start()
    conn.send(("up",))
    while (message := inbox.get())[0] == "run":
        _, task, cancel = message
        conn.send(("ready",))
        start = inbox.get()
        if start[0] != "start":
            return
        conn.send(("done", *_run(conn, task, cancel, start[1])))


def _run(
    conn: Connection, task: dict, cancel: threading.Event, start_at: float
) -> tuple[BenchError | None, list[tuple[float, float]]]:
    """Send the task's requests; the run's error, if any, and how late this worker's loop ran."""
    requests, indices = task["requests"], task["indices"]
    run = run_requests(
        task["spec"],
        task["model"],
        requests,
        max_concurrency=task["max_concurrency"],
        duration_s=task["duration_s"],
        cancel=cancel,
        ignore_eos=task["ignore_eos"],
        schedule=SendSchedule(requests, offsets=task["offsets"]),
        start_at=start_at,
    )
    try:
        for batch in run.batches():
            conn.send(("events", [_outgoing(event, run.results[event.index], indices) for event in batch]))
    except BenchError as exc:
        return exc, run.loop_lag.samples
    except Exception as exc:
        return ServerError(f"A client worker process failed: {type(exc).__name__}: {exc}"), run.loop_lag.samples
    return None, run.loop_lag.samples


def _outgoing(event: EngineEvent, result: RequestResult, indices: list[int]) -> tuple:
    """An event with its global index: the ticks of one read as a bare (index, ts, n_tokens, earlier_ts,
    earlier_ns), the rest with the result the engine reads at them (None where it reads none)."""
    index = indices[event.index]
    if event.kind == "tokens":
        return index, event.ts, event.n_tokens, event.earlier_ts, event.earlier_ns
    wanted = event.kind == "finish"
    return (dataclasses.replace(event, index=index), dataclasses.replace(result, index=index) if wanted else None)


def _read_messages(conn: Connection, inbox: queue.SimpleQueue, current: dict) -> None:
    """The parent's messages: a cancel sets the current run's event at once (a run's event is made here, as its
    task comes, so no cancel can come before it); the rest go to the worker's loop. The parent gone (its socket
    closed) is a cancel and a close."""
    try:
        while (message := conn.recv())[0] != "close":
            if message[0] == "cancel":
                current["cancel"].set()
            elif message[0] == "run":
                current["cancel"] = threading.Event()
                inbox.put(("run", message[1], current["cancel"]))
            else:
                inbox.put(message)
    except (EOFError, OSError):
        pass
    current["cancel"].set()
    inbox.put(("close",))


if __name__ == "__main__":
    connection = Connection(int(sys.argv[1]))
    try:
        _worker(connection)
    except (EOFError, BrokenPipeError, ConnectionResetError):  # the parent went away: nobody to report to
        pass
