"""A server with the connection handling of llama.cpp's `llama-server` (the C++ server on cpp-httplib; the Python
llama-cpp-python is tests/llama_cpp_server.py): every response says `Connection: keep-alive` and
`Keep-Alive: timeout=5, max=100`, never `Connection: close`, and yet the socket is closed right after a streamed
response's last chunk. A client that takes the server at its word hands that connection to its next request, which
then meets a closed socket before any byte of an answer: at concurrency 2, half the requests of a run failed so.

`llama_handler(closing)` answers, for `raw_http_server.RawServer`:
- POST /v1/completions and /v1/chat/completions: SSE in a chunked body, one chunk per event: (chat: the role chunk,)
  `max_tokens` (else `max_completion_tokens`, else 16) chunks of " the" (one token of the built-in tiny Llama), a
  last chunk with finish_reason "length" and the usage, then [DONE]. No pause anywhere: the order of events, not
  this machine's speed, is what a test sees.
- GET /v1/models: one model, MODEL, with a Content-Length body (the connection kept).
- GET /metrics: running and waiting requests under LMDeploy's names (the product reads none of llama.cpp's), so a
  run with server metrics on reads something.

After a streamed response, per `closing`:
- AFTER_STREAM: the socket is closed at once, as llama-server does; whether the client's next request on it meets
  the close before it is sent or after is the race of the real server.
- AT_NEXT_REQUEST: the connection stays open and the next request on it is read, then the socket closed unanswered
  (logged "dropped"): the order in which the race is lost, made certain.
- NEVER: the connection is kept, as a server that means its keep-alive.
`reused_reply` (bytes): every POST that arrives on a connection used before gets those bytes, then the socket
closes (logged "cut"): a reused connection that fails after the response has begun.
Each request's `answer` in the log says what it got: "streamed", "dropped", "cut", "listed", "metrics".
`send_all(url, n, tokens)` sends it requests with the product's client and returns their results.
"""

from __future__ import annotations

import asyncio
import json

from raw_http_server import LAST_CHUNK, Handler, Request, chunk, head, respond, respond_json

from bench_core.engines.openai_client import run_requests
from bench_core.engines.openai_request import RequestResult, ServerSpec
from bench_core.load.datasets import SampledRequest

MODEL = "llama"
TEXT = " the"  # one token of the built-in tiny Llama
KEEP_ALIVE = (("Connection", "keep-alive"), ("Keep-Alive", "timeout=5, max=100"), ("Server", "llama.cpp"))
STREAM_HEAD = head(200, [*KEEP_ALIVE, ("Content-Type", "text/event-stream"), ("Transfer-Encoding", "chunked")])
AFTER_STREAM, AT_NEXT_REQUEST, NEVER = "after the stream", "at the next request", "never"
ENDPOINTS = {"/v1/completions": "completions", "/v1/chat/completions": "chat"}


def sse_events(endpoint: str, n_tokens: int, prompt_tokens: int = 3) -> list[bytes]:
    """A stream's SSE events, [DONE] included."""

    def event(text: str | None, finish_reason: str | None = None, usage: dict | None = None, role: bool = False):
        if endpoint == "chat":
            delta = {"role": "assistant"} if role else ({} if text is None else {"content": text})
            choice = {"index": 0, "delta": delta, "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": text or "", "finish_reason": finish_reason}
        body = {"id": "cmpl-1", "model": MODEL, "choices": [choice]} | ({"usage": usage} if usage else {})
        return b"data: " + json.dumps(body).encode() + b"\n\n"

    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n_tokens, "total_tokens": prompt_tokens + n_tokens}
    return [
        *([event(None, role=True)] if endpoint == "chat" else []),
        *(event(TEXT) for _ in range(n_tokens)),
        event(None, "length", usage),
        b"data: [DONE]\n\n",
    ]


def llama_handler(closing: str = AFTER_STREAM, reused_reply: bytes | None = None, model: str = MODEL) -> Handler:
    doomed: set[int] = set()  # connections to close at their next request (AT_NEXT_REQUEST)
    in_flight = [0]

    async def handle(request: Request, writer: asyncio.StreamWriter) -> bool:
        if request.connection in doomed:
            request.answer = "dropped"
            return False
        if request.method == "GET" and request.target == "/v1/models":
            request.answer = "listed"
            await respond_json(
                writer, {"object": "list", "data": [{"id": model, "object": "model"}]}, headers=KEEP_ALIVE
            )
            return True
        if request.method == "GET" and request.target == "/metrics":
            request.answer = "metrics"
            page = (
                f'lmdeploy:num_requests_running{{model_name="{model}"}} {in_flight[0]}\n'
                f'lmdeploy:num_requests_waiting{{model_name="{model}"}} 0\n'
            )
            await respond(writer, 200, page.encode(), "text/plain; version=0.0.4", KEEP_ALIVE)
            return True
        if request.method != "POST" or request.target not in ENDPOINTS:
            request.answer = "not found"
            await respond_json(writer, {"error": {"message": "File Not Found", "code": 404}}, 404, KEEP_ALIVE)
            return True
        if reused_reply is not None and request.nth > 0:
            request.answer = "cut"
            writer.write(reused_reply)
            await writer.drain()
            return False
        body = request.json()
        n_tokens = body.get("max_tokens") or body.get("max_completion_tokens") or 16
        in_flight[0] += 1
        try:
            writer.write(STREAM_HEAD)
            for event in sse_events(ENDPOINTS[request.target], n_tokens):
                writer.write(chunk(event))
            writer.write(LAST_CHUNK)
            await writer.drain()
        finally:
            in_flight[0] -= 1
        request.answer = "streamed"
        if closing == AT_NEXT_REQUEST:
            doomed.add(request.connection)
        return closing != AFTER_STREAM

    return handle


def send_all(url: str, n: int, tokens: int, concurrency: int = 1, **spec) -> list[RequestResult]:
    """The results of `n` requests for `tokens` tokens each from the product's client (`run_requests`), all due at
    once, at most `concurrency` in flight; `spec`: other ServerSpec fields (endpoint, api_key, network)."""
    server = ServerSpec(url, **{"server_kind": "lmdeploy", "read_timeout_s": 120, **spec})
    client = run_requests(server, MODEL, [SampledRequest("hi", 2, tokens)] * n, max_concurrency=concurrency)
    for _ in client.events():
        pass
    return client.results
