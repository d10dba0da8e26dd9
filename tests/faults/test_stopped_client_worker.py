"""A client worker process that stops answering (reliability round 4, n21): SIGSTOP here, as a paused container or a
deadlock would leave it. With --client-processes 2, the run used to wait on its socket for ever. Every wait on a
worker now has a deadline: a worker the parent hears nothing from (a running worker's loop beats every
HEARTBEAT_S) for WORKER_SILENCE_S is killed, and the run ends in one line naming it and what was awaited, with the
requests measured before it recorded.

Real worker processes stopped with a real SIGSTOP, a real server on 127.0.0.1 (raw_http_server) that answers the
requests the test lets through and holds the others open, the CLI in this process. The test sets
WORKER_SILENCE_S: how long the run waits is the product's deadline, never how fast this machine is."""

from __future__ import annotations

import asyncio
import math
import os
import signal
import threading
import time

import psutil
import pytest
from llama_server import MODEL, STREAM_HEAD, sse_events
from raw_http_server import LAST_CHUNK, RawServer, Request, chunk, respond_json
from restful_cli import restful

from bench_core.engines import client_workers
from bench_core.engines.client_workers import ClientWorkers
from bench_core.engines.openai_client import HEARTBEAT_S, ServerError
from bench_core.engines.openai_request import ServerSpec
from bench_core.load.datasets import SampledRequest
from bench_core.load.schedule import SendSchedule

# Each test here runs a real engine, server, app script or process for seconds: not in the fast suite.
pytestmark = pytest.mark.slow

SILENCE_S = 5 * HEARTBEAT_S  # a live worker beats five times within it
HELD = "held"


@pytest.fixture(autouse=True)
def short_silence(monkeypatch):
    monkeypatch.setattr(client_workers, "WORKER_SILENCE_S", SILENCE_S)


def serve() -> RawServer:
    """A server that streams the first completion on each connection whole; every later one on it (a worker with
    one request in flight sends its next on the same connection) gets its first token and is then held open until
    the server stops (logged HELD)."""

    async def handle(request: Request, writer: asyncio.StreamWriter) -> bool:
        if request.method == "GET":
            await respond_json(writer, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
            return True
        events = sse_events("completions", request.json().get("max_tokens") or 4)
        writer.write(STREAM_HEAD)
        if request.nth > 0:
            request.answer = HELD
            writer.write(chunk(events[0]))
            await writer.drain()
            await asyncio.Event().wait()
        for event in events:
            writer.write(chunk(event))
        writer.write(LAST_CHUNK)
        await writer.drain()
        return True

    return RawServer(handle)


def held(server: RawServer) -> int:
    return sum(request.answer == HELD for request in server.log)


def wait_for(condition, what: str) -> None:
    """Poll `condition` until it holds; the deadline only guards against a hang."""
    deadline = time.monotonic() + 120
    while not condition():
        assert time.monotonic() < deadline, f"never saw {what}"
        time.sleep(0.02)


def stop(pid: int) -> None:
    os.kill(pid, signal.SIGSTOP)


def stop_when(condition, pid: int) -> threading.Thread:
    """Stop process `pid` once `condition` holds, from a thread of its own (started)."""

    def stopper() -> None:
        wait_for(condition, "the moment to stop a worker")
        stop(pid)

    thread = threading.Thread(target=stopper, daemon=True)
    thread.start()
    return thread


def stopped_line(number: int, pid: int | str, waiting_for: str) -> str:
    return (
        f"Client worker process {number} of 2 (pid {pid}) stopped answering: nothing from it for {SILENCE_S:g} s "
        f"while waiting for {waiting_for}, so it was killed"
    )


def test_a_worker_stopped_while_its_requests_are_in_flight_is_killed_and_the_run_keeps_what_it_measured():
    # Each worker sends two requests, one at a time: the server answers its first and holds its second.
    requests = [SampledRequest(f"p{i}", 2, 4) for i in range(4)]
    with serve() as server:
        workers = ClientWorkers(2)
        try:
            run = workers.run(
                ServerSpec(server.url, server_kind="lmdeploy", read_timeout_s=120),
                MODEL,
                requests,
                SendSchedule.at_rate(requests, math.inf),
                max_concurrency=2,
            )
            victim = workers.pids[0]
            stopper = stop_when(lambda: held(server) == 2, victim)
            with pytest.raises(ServerError) as error:
                for _ in run.events():
                    pass
            stopper.join()
            assert str(error.value) == (
                stopped_line(1, victim, "the events of its requests") + "; the requests measured before are kept."
            )
            assert not psutil.pid_exists(victim)  # killed and reaped
            assert workers.broken
            answered = {int(r.json()["prompt"][1:]) for r in server.log if r.method == "POST" and r.answer != HELD}
            assert {i for i, r in enumerate(run.results) if r.finish_reason == "length"} == answered
            assert len(answered) == 2 and {r.finish_reason for r in run.results} == {"length", "abort", ""}
        finally:
            workers.close()


@pytest.mark.parametrize(
    "how, prompt_chars, said",
    [
        (signal.SIGSTOP, 10, stopped_line(1, "{pid}", "it to say it was ready to send")),
        (signal.SIGSTOP, 8_000_000, stopped_line(1, "{pid}", "it to take its share of the run")),
        (signal.SIGKILL, 10, "A client worker process died (signal 9), so its requests have no results."),
    ],
    ids=["stopped, task in the socket's buffer", "stopped, task larger than the socket's buffer", "killed"],
)
def test_a_worker_stopped_or_killed_before_the_run_starts_ends_the_run_in_one_line(how, prompt_chars, said):
    requests = [SampledRequest("x" * prompt_chars, 2, 4) for _ in range(2)]
    with serve() as server:
        workers = ClientWorkers(2)
        try:
            victim = workers.pids[0]
            os.kill(victim, how)
            with pytest.raises(ServerError) as error:
                run = workers.run(
                    ServerSpec(server.url, server_kind="lmdeploy"),
                    MODEL,
                    requests,
                    SendSchedule.at_rate(requests, math.inf),
                )
                for _ in run.events():
                    pass
            assert str(error.value).startswith(said.format(pid=victim))
            # The worker left may have been told to start before the loss was noticed, and send a request it then
            # cancels: what is asserted is the run's end, not that the server never heard from it.
            assert workers.broken
        finally:
            workers.close()


def test_a_restful_run_whose_worker_stops_fails_in_one_line_and_records_the_requests_it_measured(tmp_path, capsys):
    with serve() as server:
        stopped: list[int] = []

        def stop_a_worker_once_two_requests_are_held() -> None:
            wait_for(lambda: held(server) == 2, "two requests held")
            (worker, *_) = [
                child
                for child in psutil.Process().children()
                if "bench_core.engines.client_workers" in " ".join(child.cmdline())
            ]
            stopped.append(worker.pid)
            stop(worker.pid)

        stopper = threading.Thread(target=stop_a_worker_once_two_requests_are_held, daemon=True)
        stopper.start()
        run = restful(
            server.url,
            tmp_path,
            capsys,
            "--backend",
            "lmdeploy",
            "--model",
            MODEL,
            "--client-processes",
            "2",
            "--max-concurrency",
            "2",
            "--no-server-metrics",
            prompts=6,
            output_len=4,
        )
        stopper.join()
    assert run.code == 1 and "Traceback" not in run.lines
    (line,) = [line for line in run.err.splitlines() if line.startswith("error: ")]
    assert line.startswith("error: Client worker process ") and line.endswith(
        f" of 2 (pid {stopped[0]}) stopped answering: nothing from it for {SILENCE_S:g} s while waiting for the events "
        "of its requests, so it was killed; the requests measured before are kept."
    )
    assert run.summary["status"] == "failed"
    # The other worker's first answer is measured; the stopped one's counts too where its report reached the run
    # before the stop (a worker reports in batches: beside a busy machine's other work, the stop can come first).
    assert (run.table["status"] == "success").sum() in (1, 2) and len(run.table) == 6
