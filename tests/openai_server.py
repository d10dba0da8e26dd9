"""Real OpenAI-compatible servers on 127.0.0.1 for the client tests.

- `transformers_server`: `transformers serve` with continuous batching on the built-in tiny Llama,
  started once per test session (about 5 s) and stopped at the end.
- `misbehaving_server`: a small aiohttp.web server in a thread that answers the OpenAI routes
  the way the prompt says, so one run can mix good and bad requests:
  "ok" streams one chunk per token (10 ms apart) and finishes properly,
  "reasoning" streams reasoning_content for the first half of the tokens asked, then the answer,
  "thinking" streams reasoning_content only (a reasoning model stopped at its limit before answering),
  "short" stops with finish_reason "stop" after half the tokens asked (as if it ignored ignore_eos),
  "status500" answers HTTP 500, "slow" says nothing for 30 s, "keepalive" sends SSE comments (": ping")
  every 0.1 s but never a token,
  "cut" drops the connection after 3 tokens, "error-event" sends an error event after 3 tokens,
  "auth" answers 401 unless the Bearer key is `API_KEY`; any other prompt is answered as "ok",
  and the client ports of "reuse" requests are kept in `REUSE_PORTS` (one per connection). A model
  named "keepalive" behaves so whatever the prompt (a CLI run sends its dataset's prompts).
  Odd values a real server could send: "infinite-usage" ends with usage.completion_tokens Infinity
  (Python's json writes and reads it; JSON has no such number), "number-text" streams the number 7
  as its text, "deep-500" answers HTTP 500 with a body of DEEP_BODY_BRACKETS "[" characters.
`serving(app)` serves any aiohttp app the same way (a test may wrap `_make_app()` to watch what arrives);
`recording_app(bodies)` is that server keeping every request body it gets in `bodies`;
`answering_in_turn(behaviours)` gives the n-th request to arrive the n-th behaviour, whatever its prompt;
`vllm_like(model, metrics, answer_as)` says it is vLLM in GET /v1/models, with or without a /metrics page.
Import the fixtures into a test module to use them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web

from bench_core.sweep.server import free_port

TOKENS_BEFORE_CUT = 3
API_KEY = "sk-test-not-a-secret"
REUSE_PORTS: set[int] = set()
CHUNK_GAP_S = 0.01
DEEP_BODY_BRACKETS = 5000  # deeper than Python's recursion limit


def _wait_healthy(url: str, process: subprocess.Popen, log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"transformers serve exited with {process.returncode}:\n{log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    pytest.fail(f"transformers serve did not answer /health within {timeout_s:g} s:\n{log.read_text()[-2000:]}")


@pytest.fixture(scope="session")
def transformers_server(tiny_model_path) -> str:
    """Base URL of `transformers serve` (continuous batching, CPU) serving the tiny Llama."""
    port = free_port()
    log = Path(tempfile.mkdtemp(prefix="transformers-serve-")) / "server.log"
    command = [
        sys.executable,
        "-m",
        "transformers.cli.transformers",
        "serve",
        tiny_model_path,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--device",
        "cpu",
        # Without continuous batching the server runs one request at a time; the sizes are the
        # ones measured to work on CPU (see the reference notes on transformers serve).
        "--continuous-batching",
        "--cb-num-blocks",
        "64",
        "--cb-block-size",
        "64",
        "--cb-max-batch-tokens",
        "512",
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, process, log, timeout_s=120)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def sse_chunk(
    endpoint: str, text: object = "", reasoning: str = "", finish_reason: str | None = None, usage: dict | None = None
) -> bytes:
    if endpoint == "chat":
        delta = {k: v for k, v in (("content", text), ("reasoning_content", reasoning)) if v}
        choice = {"index": 0, "delta": delta, "finish_reason": finish_reason}
    else:
        choice = {"index": 0, "text": text, "finish_reason": finish_reason}
    body = {"choices": [choice]} | ({"usage": usage} if usage else {})
    return b"data: " + json.dumps(body).encode() + b"\n\n"


async def answer_as_prompted(request: web.Request, endpoint: str, behaviour: str = "") -> web.StreamResponse:
    """The answer the prompt asks for, or `behaviour` where one is given."""
    body = await request.json()
    behaviour = behaviour or (body["messages"][-1]["content"] if endpoint == "chat" else body["prompt"])
    if body.get("model") == "keepalive":
        behaviour = "keepalive"
    n = body.get("max_tokens") or body.get("max_completion_tokens") or 4
    n, finish_reason = (n // 2, "stop") if behaviour == "short" else (n, "length")
    if behaviour == "reuse":
        REUSE_PORTS.add(request.transport.get_extra_info("peername")[1])
    if behaviour == "auth" and request.headers.get("Authorization") != f"Bearer {API_KEY}":
        return web.json_response({"error": {"message": "Incorrect API key provided"}}, status=401)
    if behaviour == "status500":
        return web.json_response({"object": "error", "message": "the engine crashed"}, status=500)
    if behaviour == "deep-500":
        return web.Response(body=b"[" * DEEP_BODY_BRACKETS, status=500, content_type="application/json")
    if behaviour == "slow":
        await asyncio.sleep(30)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    while behaviour == "keepalive":  # until the client gives up (handler_cancellation)
        await response.write(b": ping\n\n")
        await asyncio.sleep(0.1)
    while behaviour == "forever":  # tokens past any limit, never finishing, until the client gives up
        await response.write(sse_chunk(endpoint, text=" tok"))
        await asyncio.sleep(CHUNK_GAP_S / 10)
    for i in range(n):
        if behaviour == "thinking" or (behaviour == "reasoning" and i < n // 2):
            await response.write(sse_chunk(endpoint, reasoning="hmm"))
        else:
            await response.write(sse_chunk(endpoint, text=7 if behaviour == "number-text" else " tok"))
        await asyncio.sleep(CHUNK_GAP_S)
        if behaviour == "cut" and i + 1 == TOKENS_BEFORE_CUT:
            request.transport.close()  # no end of the chunked body: the client sees a broken payload
            return response
        if behaviour == "error-event" and i + 1 == TOKENS_BEFORE_CUT:
            await response.write(b'data: {"error": {"message": "out of memory", "code": 500}}\n\n')
            return response
    completion_tokens = math.inf if behaviour == "infinite-usage" else n
    usage = {"prompt_tokens": 3, "completion_tokens": completion_tokens, "total_tokens": completion_tokens + 3}
    await response.write(sse_chunk(endpoint, finish_reason=finish_reason, usage=usage))
    await response.write(b"data: [DONE]\n\n")
    while behaviour == "after-done":  # text after the end, the connection held open, until the client gives up
        await response.write(sse_chunk(endpoint, text=" late"))
        await asyncio.sleep(CHUNK_GAP_S)
    return response


def add_openai_routes(app: web.Application, answer, prefix: str = "") -> web.Application:
    """{prefix}/v1/completions and {prefix}/v1/chat/completions, each answered by `answer(request, endpoint)`."""
    for endpoint, path in (("completions", "completions"), ("chat", "chat/completions")):

        async def handle(request: web.Request, endpoint: str = endpoint) -> web.StreamResponse:
            return await answer(request, endpoint)

        app.router.add_post(f"{prefix}/v1/{path}", handle)
    return app


def _make_app() -> web.Application:
    return add_openai_routes(web.Application(), answer_as_prompted)


def recording_app(bodies: list[dict]) -> web.Application:
    async def answer(request: web.Request, endpoint: str) -> web.StreamResponse:
        bodies.append(await request.json())
        return await answer_as_prompted(request, endpoint)

    return add_openai_routes(web.Application(), answer)


def answering_in_turn(behaviours: list[str]) -> web.Application:
    """The server above, the n-th request to arrive answered as `behaviours[n]` (and "ok" past the list)."""
    arrived = iter(behaviours)

    async def answer(request: web.Request, endpoint: str) -> web.StreamResponse:
        return await answer_as_prompted(request, endpoint, next(arrived, "ok"))

    return add_openai_routes(web.Application(), answer)


@contextlib.contextmanager
def serving(app: web.Application, runners: list[web.AppRunner] | None = None) -> Iterator[str]:
    """Serve `app` on a free port of 127.0.0.1 from a thread of its own; yields its base URL. Its runner goes into
    `runners`, where given: a handler can then shut the server down (`runner.cleanup()`, as on SIGTERM)."""
    # The loop lives in its own thread from the start: the test thread may already run one (Playwright's
    # sync API keeps a loop running in it for the whole session once the browser tests have started).
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="test-server", daemon=True)
    thread.start()
    # handler_cancellation: a "slow" handler stops when the client gives up, so cleanup is quick
    runner = web.AppRunner(app, handle_signals=False, handler_cancellation=True)
    if runners is not None:
        runners.append(runner)
    port = free_port()
    asyncio.run_coroutine_threadsafe(runner.setup(), loop).result(timeout=10)
    asyncio.run_coroutine_threadsafe(web.TCPSite(runner, "127.0.0.1", port).start(), loop).result(timeout=10)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


@pytest.fixture(scope="session")
def misbehaving_server() -> str:
    """Base URL of the server above."""
    with serving(_make_app()) as url:
        yield url


def vllm_like(model: str, metrics: bool, answer_as: str) -> web.Application:
    """A server that says it is vLLM (`model` its one model), with or without a /metrics page, answering every
    completion `answer_as`."""

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": model, "object": "model", "owned_by": "vllm"}]})

    async def page(request: web.Request) -> web.Response:
        return web.Response(text="vllm:num_requests_running 1.0\nvllm:num_requests_waiting 0.0\n")

    app = add_openai_routes(
        web.Application(), lambda request, endpoint: answer_as_prompted(request, endpoint, answer_as)
    )
    app.router.add_get("/v1/models", models)
    if metrics:
        app.router.add_get("/metrics", page)
    return app
