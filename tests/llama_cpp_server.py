"""A server on 127.0.0.1 that streams as llama-cpp-python's does: no usage, and the tokens of one UTF-8
character folded into one chunk.

- `/v1/chat/completions` and `/v1/completions` generate PIECES over and over, each piece one chunk: " the"
  (one token of the built-in tiny Llama's byte-level BPE), a lone space (one) and "é" (two byte tokens,
  which decode to nothing until both are there, so the server sends them together). Like llama-cpp-python
  0.3, the server heeds `max_tokens` only: it stops there with finish_reason "length"; given only
  `max_completion_tokens`, it runs on to its own end, OWN_LENGTH tokens, and says "stop" (its EOS). It
  ignores `stream_options` and `ignore_eos` and never sends usage. A chat stream opens with the role chunk
  and ends with an empty delta that carries the finish_reason, then [DONE].
- `/replay/v1/chat/completions` replays tests/data/llama_cpp_python_chat.json write by write at its times
  (pings, role chunk, folded characters, the empty last chunk; see its "recorded" note). REPLAYED keeps when
  each replayed request arrived and each of its writes began (`scripted_server.Served`, on perf_counter), the
  times a test compares the client's with: a busy machine writes later than the recording says.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from aiohttp import web
from openai_server import add_openai_routes, serving
from scripted_server import Served

PIECES = ((" the", 1), (" ", 1), ("é", 2))  # (text, tokens): llama-cpp-python sends "é" once both bytes are out
OWN_LENGTH = 48  # tokens the server generates when it ignores the limit it was sent
CHUNK_GAP_S = 0.002
RECORDING = Path(__file__).resolve().parent / "data" / "llama_cpp_python_chat.json"
REPLAYED: list[Served] = []  # in the order the replayed requests arrived; a test clears it before the run it reads


def pieces(n_tokens: int) -> list[str]:
    """The chunks' texts of a generation of exactly `n_tokens` tokens."""
    texts, left, i = [], n_tokens, 0
    while left:
        text, count = PIECES[i % len(PIECES)]
        if count > left:  # the last token: a whole " the"
            text, count = PIECES[0]
        texts.append(text)
        left -= count
        i += 1
    return texts


def _event(endpoint: str, text: str | None, finish_reason: str | None = None, role: bool = False) -> bytes:
    if endpoint == "chat":
        delta = {"role": "assistant"} if role else ({} if text is None else {"content": text})
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        body = {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "smollm2",
            "choices": [choice],
        }
    else:
        choice = {"text": text or "", "index": 0, "logprobs": None, "finish_reason": finish_reason}
        body = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "smollm2", "choices": [choice]}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


async def _generate(request: web.Request, endpoint: str) -> web.StreamResponse:
    body = await request.json()
    limit = body.get("max_tokens")
    n_tokens, finish_reason = (limit, "length") if limit is not None else (OWN_LENGTH, "stop")
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    if endpoint == "chat":
        await response.write(_event(endpoint, None, role=True))
    for text in pieces(n_tokens):
        await asyncio.sleep(CHUNK_GAP_S)
        await response.write(_event(endpoint, text))
    await response.write(_event(endpoint, None, finish_reason))
    await response.write(b"data: [DONE]\n\n")
    return response


async def _replay(request: web.Request) -> web.StreamResponse:
    loop = asyncio.get_running_loop()
    arrived = loop.time()
    served = Served("replay", time.perf_counter())
    REPLAYED.append(served)
    await request.read()
    recording = json.loads(RECORDING.read_text(encoding="utf-8"))
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for due, data in recording["writes"]:
        await asyncio.sleep(max(0.0, arrived + due - loop.time()))
        served.writes.append(time.perf_counter())
        await response.write(data.encode())
    return response


@pytest.fixture(scope="session")
def llama_cpp_server() -> str:
    """Base URL of the server above (append /replay for the recorded stream)."""
    app = add_openai_routes(web.Application(), _generate)
    app.router.add_post("/replay/v1/chat/completions", _replay)
    with serving(app) as url:
        yield url
