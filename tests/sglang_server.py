"""A scripted SGLang server on 127.0.0.1 that answers its native POST /generate as SGLang writes it.

Streamed (SGLang's http_server and tokenizer_manager): one `data: {json}` event per verify step, each with the whole
text so far (SGLang's default; under /incremental only the new text and ids, as with the server's
--incremental-streaming-output), all the output ids so far and a meta_info whose finish_reason is null until the last
event; the last one carries finish_reason {"type": "length", "length": N} and the request's speculative accounting
(spec_verify_ct, spec_num_proposed_drafts, spec_num_correct_drafts and spec_accept_histogram, as SGLang's
_calculate_spec_decoding_metrics writes them); then `data: [DONE]`. Not streamed: the last event's body alone, once
the stream would have ended. Each verify step brings one token more than the draft tokens it accepted (the bonus),
one STEP_S after the last, the first at FIRST_STEP_S after the request arrived.

The n-th request to arrive (on any route) gets HISTOGRAMS[n % 2]: both make OUTPUT_TOKENS tokens, so a run of an even
number of requests asking OUTPUT_TOKENS each has a known acceptance, however they interleave:
- (2, 1, 3, 2): 8 steps, 13 accepted, positions 1..4 accepted 6, 5, 2, 0 times (no step accepted all 4);
- (1, 0, 2, 1, 2): 6 steps, 15 accepted, positions accepted 5, 5, 3, 2 times.
Every step proposes DRAFT_TOKENS (SGLang's speculative_num_draft_tokens 5, less the verified token).

Under /error the stream sends one step, then SGLang's error event ({"error": {"message"}}) and [DONE]; under /no-generate
there is no /generate (404), only /v1/models. Every route serves GET /v1/models, as SGLang does.
"""

from __future__ import annotations

import asyncio
import itertools
import json

import pytest
from aiohttp import web
from openai_server import serving

MODEL = "sglang-scripted"
FIRST_STEP_S = 0.100
STEP_S = 0.010
DRAFT_TOKENS = 4
HISTOGRAMS = ((2, 1, 3, 2), (1, 0, 2, 1, 2))
OUTPUT_TOKENS = 21  # steps + accepted tokens, the same for both
PROMPT_TOKENS = 7
ERROR_MESSAGE = "The input (9999 tokens) is longer than the model's context length (2048 tokens)."
BODIES: list[dict] = []  # every /generate body received


def steps_of(histogram: tuple[int, ...]) -> list[int]:
    """The accepted draft tokens of each verify step, in an order whose counts make `histogram`."""
    return [accepted for accepted, count in enumerate(histogram) for _ in range(count)]


def _event(body: dict) -> bytes:
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def _meta(tokens: int, finish: dict | None) -> dict:
    return {"id": "req", "prompt_tokens": PROMPT_TOKENS, "completion_tokens": tokens, "cached_tokens": 0,
            "finish_reason": finish}  # fmt: skip


def _speculation(histogram: tuple[int, ...]) -> dict:
    steps = sum(histogram)
    accepted = sum(n * count for n, count in enumerate(histogram))
    return {
        "spec_verify_ct": steps,
        "spec_num_proposed_drafts": steps * DRAFT_TOKENS,
        "spec_num_correct_drafts": accepted,
        "spec_accept_histogram": list(histogram),
        "spec_accept_rate": accepted / (steps * DRAFT_TOKENS),
        "spec_accept_length": (steps + accepted) / steps,
    }


def _make_app() -> web.Application:
    app = web.Application()
    arrivals = itertools.count()

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def generate(request: web.Request) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        arrived = loop.time()
        body = await request.json()
        BODIES.append(body)
        histogram = HISTOGRAMS[next(arrivals) % len(HISTOGRAMS)]
        incremental = request.path.startswith("/incremental/")
        failing = request.path.startswith("/error/")
        events, ids = [], []
        for accepted in steps_of(histogram):
            new_ids = list(range(len(ids), len(ids) + accepted + 1))
            ids += new_ids
            last = len(ids) >= OUTPUT_TOKENS
            meta = _meta(len(ids), {"type": "length", "length": len(ids)} if last else None)
            if last:
                meta.update(_speculation(histogram))
            shown = new_ids if incremental else list(ids)
            events.append({"text": " tok" * len(shown), "output_ids": shown, "meta_info": meta})
        if not body.get("stream"):
            await asyncio.sleep(max(0.0, arrived + FIRST_STEP_S + (len(events) - 1) * STEP_S - loop.time()))
            return web.json_response(events[-1])
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        if failing:
            events = [events[0], {"error": {"message": ERROR_MESSAGE}}]
        for step, event in enumerate(events):
            await asyncio.sleep(max(0.0, arrived + FIRST_STEP_S + step * STEP_S - loop.time()))
            await response.write(_event(event))
        await response.write(b"data: [DONE]\n\n")
        return response

    for prefix in ("", "/incremental", "/error", "/no-generate"):
        app.router.add_get(f"{prefix}/v1/models", models)
        if prefix != "/no-generate":
            app.router.add_post(f"{prefix}/generate", generate)
    return app


@pytest.fixture(scope="session")
def sglang_server() -> str:
    """Base URL of the server above (append /incremental, /error or /no-generate for those routes)."""
    with serving(_make_app()) as url:
        yield url
