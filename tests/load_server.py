"""A small OpenAI-compatible server for `sweep restful --server-cmd` tests, run as its own process:

    python tests/load_server.py --port PORT [--token-delay-ms D] [--ttft-step-ms S] [--knee K --beyond-knee-ms B]
                                [--batch B [--step-ms-per-seat P]] [--step-ms-per-request R]
                                [--draft-tokens K --acceptance A1,...,AK] [--mode MODE] [--metrics-series N]

GET /v1/models lists the model "load-test"; POST /v1/completions streams max_tokens chunks of " tok", the first after
a delay set by the server's load, then one every D ms, then the usage and [DONE]. The load is the requests in flight
when the request arrived, itself included; a request leaves that count before its last chunk (the usage and [DONE])
is written, so a client that sends its next request once one has ended is never counted twice. Without --knee the
first token comes after S ms times that count: latency rises with load. With --knee K it comes after S ms while the
count is at most K and after B ms (default 5000) beyond: a concurrency of K has every first token after S ms and K + 1
has one after B ms, so a TTFT SLO far from both is met up to K and missed above it on a machine however busy (what
the machine adds only makes the fast answers later, and nothing makes a slow one come before B ms). With --batch B
it serves at most B requests at once (the others wait their turn) and each token takes D + B x P ms: as an engine's
batch size, a larger one serves more at once and each of them slower, so throughput rises with it and so does TPOT,
and the best batch within a TPOT bound is known.

Speculative decoding, whose gain shrinks with load: after the first token each decoding step of a request costs
D + R x n x (1 + K) ms (R: --step-ms-per-request, default 0; n: the requests in flight as the step starts; K:
--draft-tokens, 0 without), on top of --batch's B x its per-seat cost. At a small batch the drafted tokens are nearly
free to verify; at a large one the step is compute-bound and each of them costs. With --draft-tokens K --acceptance
A1,...,AK (each in [0, 1], not increasing), each step drafts K tokens and accepts a deterministic number of them: at
the request's s-th decoding step (s from 1) let u = (s x 0.6180339887498949) mod 1; the accepted ones are positions
i with u < Ai, a prefix since the rates do not increase. The step's 1 + accepted tokens go out as one chunk of that
many " tok", the last step's cut to what is left of max_tokens (the usage still says max_tokens). Over many steps u
is spread evenly, so position i is accepted at rate Ai and a step yields L = 1 + A1 + ... + AK tokens: TPOT is about
(D + R n (1 + K)) / L with speculation and D + R n without, and speculation stops paying at
n = D (L - 1) / (R (1 + K - L)). Every decoding step counts as a draft of K tokens, the last one too (vLLM counts a
verification before it checks for the stop): GET /metrics then serves vLLM's page, its running and waiting requests
and its speculative counters over the server's life (drafts, draft tokens, accepted tokens, accepted tokens per
position from 0).

With --api-key-from-env VAR, a request without `Authorization: Bearer $VAR` gets 401. Its first line on stdout says its
pid. --mode changes how it behaves: "ok" serves; "exit" says why and exits with code 3 before listening; "hang" never
listens (it seems to load forever); "die" serves, but exits (code 1, no goodbye) when its second completion request
arrives. With --metrics-series N, GET /metrics answers LMDeploy's running and waiting requests (the requests in
flight, none waiting) and its KV-cache usage in N label sets (1: one engine; 300,000 make a page of some 20 MB, as a
label per request or adapter does), under vLLM's names with --draft-tokens; with neither, there is no /metrics (404).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time

from aiohttp import web

MODEL = "load-test"
PAGE_PIECE_BYTES = 256 * 1024  # of /metrics, written at a time
GOLDEN = 0.6180339887498949  # its multiples mod 1 spread evenly over [0, 1): each position accepted at its rate


def acceptance_rates(text: str, draft_tokens: int) -> list[float]:
    """--acceptance's rates, one per draft position; ValueError says what is wrong with them."""
    try:
        rates = [float(rate) for rate in text.split(",")]
    except ValueError:
        raise ValueError(f"--acceptance takes numbers separated by commas, not {text!r}") from None
    if len(rates) != draft_tokens:
        raise ValueError(
            f"--draft-tokens {draft_tokens} takes {draft_tokens} acceptance rates, one per position; --acceptance gives {len(rates)}"
        )
    if not all(0 <= rate <= 1 for rate in rates):
        raise ValueError(f"--acceptance's rates are fractions, each within 0 and 1: {text}")
    if any(later > earlier for earlier, later in zip(rates, rates[1:])):
        raise ValueError(
            f"--acceptance's rates may not increase from one position to the next (a token is accepted only after "
            f"the ones before it): {text}"
        )
    return rates


def accepted_at(step: int, rates: list[float]) -> int:
    """How many of the draft tokens the request's `step`-th decoding step (from 1) accepts."""
    u = (step * GOLDEN) % 1
    return sum(u < rate for rate in rates)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--token-delay-ms", type=float, default=10.0)
    parser.add_argument("--ttft-step-ms", type=float, default=0.0)
    parser.add_argument("--knee", type=int, help="the most requests in flight that get their first token in S ms")
    parser.add_argument("--beyond-knee-ms", type=float, default=5000.0, help="the first token's delay beyond --knee")
    parser.add_argument("--batch", type=int, help="serve at most this many requests at once; the others wait")
    parser.add_argument(
        "--step-ms-per-seat", type=float, default=0.0, help="with --batch B: each token takes B times this longer"
    )
    parser.add_argument(
        "--step-ms-per-request",
        type=float,
        default=0.0,
        help="each decoding step takes this times the requests in flight times (1 + draft tokens) longer",
    )
    parser.add_argument("--draft-tokens", type=int, help="speculate: draft this many tokens at each decoding step")
    parser.add_argument("--acceptance", help="with --draft-tokens K: K acceptance rates, one per position, a1,...,aK")
    parser.add_argument("--mode", choices=("ok", "exit", "hang", "die"), default="ok")
    parser.add_argument("--api-key-from-env", metavar="VAR", help="answer 401 to requests without Bearer $VAR")
    parser.add_argument("--metrics-series", type=int, help="serve /metrics, with this many KV-cache usage label sets")
    args = parser.parse_args()
    rates: list[float] = []
    if (args.draft_tokens is None) != (args.acceptance is None):
        parser.error("--draft-tokens and --acceptance go together: K draft tokens and their K acceptance rates")
    if args.draft_tokens is not None:
        if args.draft_tokens < 1:
            parser.error(f"--draft-tokens is at least 1, not {args.draft_tokens}")
        try:
            rates = acceptance_rates(args.acceptance, args.draft_tokens)
        except ValueError as exc:
            parser.error(str(exc))
    print(f"load_server pid {os.getpid()} mode {args.mode} port {args.port}", flush=True)
    if args.mode == "exit":
        print("boom: the model does not fit", flush=True)
        sys.exit(3)
    if args.mode == "hang":
        print("loading the model forever", flush=True)
        while True:
            time.sleep(1)
    state = {"in_flight": 0, "arrived": 0}
    seats = asyncio.Semaphore(args.batch) if args.batch else contextlib.nullcontext()
    token_delay_ms = args.token_delay_ms + args.step_ms_per_seat * (args.batch or 0)
    step_width = 1 + len(rates)  # the tokens a step verifies: its own and the drafted ones
    # vLLM's speculative counters over the server's life; accepted per draft position from 0.
    spec = {"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0}
    accepted_by_position = [0] * len(rates)

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def completions(request: web.Request) -> web.StreamResponse:
        async with seats:
            return await serve(request)

    async def serve(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        state["arrived"] += 1
        if args.mode == "die" and state["arrived"] == 2:
            print("dying mid-run", flush=True)
            os._exit(1)
        state["in_flight"] += 1
        in_flight, counted = state["in_flight"], True
        try:
            if args.knee is None:
                first_token_ms = args.ttft_step_ms * in_flight
            else:
                first_token_ms = args.ttft_step_ms if in_flight <= args.knee else args.beyond_knee_ms
            await asyncio.sleep(first_token_ms / 1000)
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            n = body.get("max_tokens") or 4
            await write_tokens(response, 1)  # the prefill's
            sent, step = 1, 0
            while sent < n:
                step += 1
                await asyncio.sleep(
                    (token_delay_ms + args.step_ms_per_request * state["in_flight"] * step_width) / 1000
                )
                accepted = accepted_at(step, rates)
                if rates:
                    spec["drafts"] += 1
                    spec["draft_tokens"] += len(rates)
                    spec["accepted_tokens"] += accepted
                    for position in range(accepted):
                        accepted_by_position[position] += 1
                tokens = min(1 + accepted, n - sent)
                await write_tokens(response, tokens)
                sent += tokens
            last = {
                "choices": [{"index": 0, "text": "", "finish_reason": "length"}],
                "usage": {"prompt_tokens": 5, "completion_tokens": n, "total_tokens": n + 5},
            }
            # Out of the count before the client can read its end and send its next request.
            state["in_flight"] -= 1
            counted = False
            await response.write(b"data: " + json.dumps(last).encode() + b"\n\ndata: [DONE]\n\n")
            return response
        finally:
            if counted:  # ended early: the client went away
                state["in_flight"] -= 1

    async def write_tokens(response: web.StreamResponse, tokens: int) -> None:
        chunk = {"choices": [{"index": 0, "text": " tok" * tokens, "finish_reason": None}]}
        await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")

    # A speculating server is vLLM (its page has the per-position counters the runs read), else LMDeploy.
    prefix, usage_name = ("vllm", "kv_cache_usage_perc") if rates else ("lmdeploy", "gpu_cache_usage_perc")
    labels = f'engine="0",model_name="{MODEL}"' if rates else f'model_name="{MODEL}"'
    # The label sets are the same at every read: made once, in pieces of PAGE_PIECE_BYTES, the page costs the server
    # writes of its bytes, each awaited, so that its tokens go out between them as a real exporter's would.
    usage = b"".join(
        f'{prefix}:{usage_name}{{engine="{engine}",model_name="{MODEL}"}} 0.5\n'.encode()
        for engine in range(args.metrics_series or 0)
    )
    usage_pieces = [usage[start : start + PAGE_PIECE_BYTES] for start in range(0, len(usage), PAGE_PIECE_BYTES)]

    def counters() -> str:
        if not rates:
            return ""
        lines = [
            f"# TYPE vllm:spec_decode_num_{name} counter\nvllm:spec_decode_num_{name}_total{{{labels}}} {count}\n"
            for name, count in spec.items()
        ]
        lines.append("# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter\n")
        lines += [
            f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="{position}"}} {count}\n'
            for position, count in enumerate(accepted_by_position)
        ]
        return "".join(lines)

    async def metrics(request: web.Request) -> web.StreamResponse:
        gauges = (
            f"{counters()}# TYPE {prefix}:num_requests_running gauge\n"
            f"{prefix}:num_requests_running{{{labels}}} {state['in_flight']}\n"
            f"# TYPE {prefix}:num_requests_waiting gauge\n"
            f"{prefix}:num_requests_waiting{{{labels}}} 0\n"
            f"# TYPE {prefix}:{usage_name} gauge\n"
        ).encode()
        response = web.StreamResponse(
            headers={"Content-Type": "text/plain", "Content-Length": str(len(gauges) + len(usage))}
        )
        await response.prepare(request)
        for piece in (gauges, *usage_pieces):
            await response.write(piece)
        return response

    @web.middleware
    async def key_check(request: web.Request, handler):
        expected = f"Bearer {os.environ[args.api_key_from_env]}" if args.api_key_from_env else None
        if expected is not None and request.headers.get("Authorization") != expected:
            return web.json_response({"error": "invalid api key"}, status=401)
        return await handler(request)

    app = web.Application(middlewares=[key_check])
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    if args.metrics_series is not None or rates:
        app.router.add_get("/metrics", metrics)
    web.run_app(app, host="127.0.0.1", port=args.port, print=None)


if __name__ == "__main__":
    main()
