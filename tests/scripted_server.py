"""A scripted OpenAI-compatible server on 127.0.0.1 whose every write leaves at a known time.

Every request to /v1/completions gets the same stream, timed from the moment its request arrived:
- TEXT_EVENTS text chunks of one token each: the first at FIRST_TOKEN_S (200 ms), then one every
  CHUNK_GAP_S (20 ms), the last at LAST_TEXT_S (840 ms); chunk PAIRED goes out late, in one write
  with the chunk after it (two SSE events in one network write);
- USAGE_AFTER_S (50 ms) after the last text: the usage chunk (finish_reason "length") and [DONE],
  in one write, at LAST_LINE_S (890 ms).
Under /usage-only/v1/completions the chunks carry empty text, as `transformers serve` streams
tokens that decode to part of a UTF-8 character: only the usage says how many tokens there were.
Under /cached/v1/completions the usage also says CACHED_TOKENS of the prompt were cached
(`prompt_tokens_details.cached_tokens`, as vLLM and SGLang report prefix-cache hits).
A request with "stream": false gets the whole answer at LAST_LINE_S.
SERVED keeps, for every request, when it arrived and when each write began (`Served`), on time.perf_counter:
CLOCK_MONOTONIC, the client's clock in this process and in its worker processes. Those are when the server did
what it did, however late a busy machine made it; a test compares what the client measured with them, never
with the nominal times above: no byte of a write can be read before the write began, and the client stamps
its send before the server sees the request. Like `transformers serve`, the
server answers 422 to a body with an `ignore_eos` field, which
LMDeploy's profile_restful_api.py always sends.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

import numpy as np
import pytest
from aiohttp import web
from openai_server import serving

FIRST_TOKEN_S = 0.200
CHUNK_GAP_S = 0.020
TEXT_EVENTS = 33  # the first token, then 32 chunks
LAST_TEXT_S = FIRST_TOKEN_S + (TEXT_EVENTS - 1) * CHUNK_GAP_S
USAGE_AFTER_S = 0.050
LAST_LINE_S = LAST_TEXT_S + USAGE_AFTER_S
PAIRED = 16  # this chunk's event waits for the next one's write
CACHED_TOKENS = 3


@dataclass
class Served:
    """One request as the server handled it: its route ("", "usage-only", "cached"), when its handler began and
    when each write of its answer began (perf_counter seconds). A streamed answer's writes are `script`'s, the
    last of them the usage line and [DONE]; an unstreamed answer has one, the whole response."""

    route: str
    arrived: float
    writes: list[float] = field(default_factory=list)

    def text_written(self, event: int) -> float:
        """When the write that carried text event `event` (0: the first token) began: PAIRED's went out with the
        next event's."""
        return self.writes[event - (event > PAIRED)]

    @property
    def last_line_written(self) -> float:
        return self.writes[-1]


SERVED: list[Served] = []  # in the order the requests arrived; a test clears it before the run it reads


def _event(body: dict) -> bytes:
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def _usage(cached: bool = False) -> dict:
    usage = {"prompt_tokens": 5, "completion_tokens": TEXT_EVENTS, "total_tokens": TEXT_EVENTS + 5}
    return usage | ({"prompt_tokens_details": {"cached_tokens": CACHED_TOKENS}} if cached else {})


def script(text: str, cached: bool = False) -> list[tuple[float, bytes]]:
    """(seconds after the request arrived, bytes written then) of one response."""
    writes: list[tuple[float, bytes]] = []
    pending = b""
    for i in range(TEXT_EVENTS):
        pending += _event({"choices": [{"index": 0, "text": text, "finish_reason": None}]})
        if i != PAIRED:
            writes.append((FIRST_TOKEN_S + i * CHUNK_GAP_S, pending))
            pending = b""
    last = _event({"choices": [{"index": 0, "text": "", "finish_reason": "length"}], "usage": _usage(cached)})
    writes.append((LAST_LINE_S, last + b"data: [DONE]\n\n"))
    return writes


async def _completions(request: web.Request, route: str, text: str, cached: bool = False) -> web.StreamResponse:
    loop = asyncio.get_running_loop()
    arrived = loop.time()
    served = Served(route, time.perf_counter())
    SERVED.append(served)
    body = await request.json()
    if "ignore_eos" in body:
        return web.json_response(
            {"detail": [{"loc": ["body", "ignore_eos"], "msg": "Extra inputs are not permitted"}]}, status=422
        )
    if not body.get("stream"):  # the whole answer at once, when the stream would have ended
        await asyncio.sleep(max(0.0, arrived + LAST_LINE_S - loop.time()))
        served.writes.append(time.perf_counter())
        return web.json_response(
            {"choices": [{"index": 0, "text": text * TEXT_EVENTS, "finish_reason": "length"}], "usage": _usage()}
        )
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for due, data in script(text, cached):
        await asyncio.sleep(max(0.0, arrived + due - loop.time()))
        served.writes.append(time.perf_counter())
        await response.write(data)
    return response


def _make_app() -> web.Application:
    app = web.Application()

    async def with_text(request: web.Request) -> web.StreamResponse:
        return await _completions(request, "", " tok")

    async def usage_only(request: web.Request) -> web.StreamResponse:
        return await _completions(request, "usage-only", "")

    async def cached(request: web.Request) -> web.StreamResponse:
        return await _completions(request, "cached", " tok", cached=True)

    app.router.add_post("/v1/completions", with_text)
    app.router.add_post("/usage-only/v1/completions", usage_only)
    app.router.add_post("/cached/v1/completions", cached)
    return app


@pytest.fixture(scope="session")
def scripted_server() -> str:
    """Base URL of the server above (append /usage-only for its usage-only streams, /cached for cache hits)."""
    with serving(_make_app()) as url:
        yield url


def restful_argv(url: str, folder, prompts: int, *flags: str, output_len: int = TEXT_EVENTS) -> list[str]:
    """`restful` against a test server at `url`: `prompts` requests of `output_len` tokens from the built-in sample,
    no warm-up, its CSV and history in `folder`, then `flags`. The server kind is transformers', which sends no
    ignore_eos: the scripted server refuses a body with one, as `transformers serve` does."""
    return [
        "restful",
        "--backend",
        "transformers",
        "--base-url",
        url,
        "--model",
        "scripted",
        "--tokenizer",
        "builtin:tiny-llama",
        "--dataset-path",
        "builtin:sample",
        "--num-prompts",
        str(prompts),
        "--sharegpt-output-len",
        str(output_len),
        "--disable-warmup",
        "--output-file",
        str(folder / "out.csv"),
        "--results",
        str(folder / "results"),
        *flags,
    ]


# A read's lag behind its write on a busy machine: under 8 CPU hogs at most 127 ms was seen; 5 s is no lag but a slip.
NEVER_THAT_LATE_S = 5.0


def assert_never_before_the_server(measured, server) -> None:
    """Each of the client's times (from its send) is at least the server's own (from the arrival) for the same
    request. Which client row is which server request is not known (the N requests leave at once and may arrive in
    either order), so their order statistics are compared: if some pairing satisfies it, the i-th smallest of one
    is at least the i-th smallest of the other. Along the last axis, for arrays of per-event times. Nor is it
    seconds later (NEVER_THAT_LATE_S): a unit slip (milliseconds read as seconds) is not a busy machine's lag."""
    measured, server = np.sort(np.asarray(measured), axis=0), np.sort(np.asarray(server), axis=0)
    assert measured.shape == server.shape
    assert (measured >= server).all(), (measured - server).min()
    assert (measured <= server + NEVER_THAT_LATE_S).all(), (measured - server).max()
