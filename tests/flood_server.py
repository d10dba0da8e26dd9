"""An OpenAI-compatible server that floods: every request to /v1/completions gets its `max_tokens` one-token SSE chunks
as fast as the socket takes them, PER_WRITE to a network write, then a usage chunk and [DONE]. It spends little per
event, so past some rate the client reading it, not the server, sets the pace: the load that `--client-processes N`
is for. It runs in processes of its own (`flooding_server`), so that a client in the test's process does not share
an interpreter with it; several listen on one port (SO_REUSEPORT) and the kernel deals the connections out.
Shared by the client-bound tests and bench/bench_client_processes.py.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import socket
import time
from collections.abc import Iterator

from aiohttp import web

MODEL = "flood"
PER_WRITE = 16  # SSE events the server writes at once


def chunk(text: str, finish_reason: str | None = None, usage: dict | None = None) -> bytes:
    """One completions SSE event, as vLLM words it."""
    body = {
        "id": "cmpl-0123456789abcdef",
        "object": "text_completion",
        "created": 1700000000,
        "model": MODEL,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason, "stop_reason": None}],
    } | ({"usage": usage} if usage else {"usage": None})
    return b"data: " + json.dumps(body).encode() + b"\n\n"


async def _flood(request: web.Request) -> web.StreamResponse:
    n = (await request.json())["max_tokens"]
    block, per_write = request.app["block"], request.app["per_write"]
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for _ in range(n // per_write):
        await response.write(block)
    usage = {"prompt_tokens": 8, "completion_tokens": n, "total_tokens": n + 8}
    await response.write(chunk(" token") * (n % per_write) + chunk("", "length", usage) + b"data: [DONE]\n\n")
    return response


def serve(port: int, per_write: int = PER_WRITE) -> None:
    """Serve on 127.0.0.1:`port` until terminated (a process's target)."""
    app = web.Application()
    app["block"], app["per_write"] = chunk(" token") * per_write, per_write
    app.router.add_post("/v1/completions", _flood)
    web.run_app(app, host="127.0.0.1", port=port, print=None, handle_signals=True, reuse_port=True)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_listening(port: int, children: list[multiprocessing.process.BaseProcess]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and all(child.is_alive() for child in children):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("the flooding server did not start")


@contextlib.contextmanager
def flooding_server(processes: int = 1, per_write: int = PER_WRITE) -> Iterator[tuple[str, list[int]]]:
    """`processes` server processes on one free port: yields the base URL and their pids."""
    port = free_port()
    spawn = multiprocessing.get_context("spawn")  # a fresh interpreter: nothing of the test's state comes along
    children = [spawn.Process(target=serve, args=(port, per_write), daemon=True) for _ in range(processes)]
    for child in children:
        child.start()
    try:
        _wait_listening(port, children)
        yield f"http://127.0.0.1:{port}", [child.pid for child in children]
    finally:
        for child in children:
            child.terminate()
            child.join(timeout=10)
