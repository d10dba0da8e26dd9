"""A small OpenAI-compatible server for `sweep restful --server-cmd` tests, run as its own process:

    python tests/load_server.py --port PORT [--token-delay-ms D] [--ttft-step-ms S] [--knee K --beyond-knee-ms B]
                                [--batch B [--step-ms-per-seat K]] [--mode MODE] [--metrics-series N]

GET /v1/models lists the model "load-test"; POST /v1/completions streams max_tokens chunks of " tok", the first after
a delay set by the server's load, then one every D ms, then the usage and [DONE]. The load is the requests in flight
when the request arrived, itself included; a request leaves that count before its last chunk (the usage and [DONE])
is written, so a client that sends its next request once one has ended is never counted twice. Without --knee the
first token comes after S ms times that count: latency rises with load. With --knee K it comes after S ms while the
count is at most K and after B ms (default 5000) beyond: a concurrency of K has every first token after S ms and K + 1
has one after B ms, so a TTFT SLO far from both is met up to K and missed above it on a machine however busy (what
the machine adds only makes the fast answers later, and nothing makes a slow one come before B ms). With --batch B
it serves at most B requests at once (the others wait their turn) and each token takes D + B x K ms: as an engine's
batch size, a larger one serves more at once and each of them slower, so throughput rises with it and so does TPOT,
and the best batch within a TPOT bound is known. With
--api-key-from-env VAR, a request without `Authorization: Bearer $VAR` gets 401. Its first line on stdout says its
pid. --mode changes how it behaves: "ok" serves; "exit" says why and exits with code 3 before listening; "hang" never
listens (it seems to load forever); "die" serves, but exits (code 1, no goodbye) when its second completion request
arrives. With --metrics-series N, GET /metrics answers LMDeploy's running and waiting requests (the requests in
flight, none waiting) and its KV-cache usage in N label sets (1: one engine; 300,000 make a page of some 20 MB, as a
label per request or adapter does); without, there is no /metrics (404).
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
    parser.add_argument("--mode", choices=("ok", "exit", "hang", "die"), default="ok")
    parser.add_argument("--api-key-from-env", metavar="VAR", help="answer 401 to requests without Bearer $VAR")
    parser.add_argument("--metrics-series", type=int, help="serve /metrics, with this many KV-cache usage label sets")
    args = parser.parse_args()
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
            for i in range(n):
                if i:
                    await asyncio.sleep(token_delay_ms / 1000)
                chunk = {"choices": [{"index": 0, "text": " tok", "finish_reason": None}]}
                await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
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

    # The label sets are the same at every read: made once, in pieces of PAGE_PIECE_BYTES, the page costs the server
    # writes of its bytes, each awaited, so that its tokens go out between them as a real exporter's would.
    usage = b"".join(
        f'lmdeploy:gpu_cache_usage_perc{{engine="{engine}",model_name="{MODEL}"}} 0.5\n'.encode()
        for engine in range(args.metrics_series or 0)
    )
    usage_pieces = [usage[start : start + PAGE_PIECE_BYTES] for start in range(0, len(usage), PAGE_PIECE_BYTES)]

    async def metrics(request: web.Request) -> web.StreamResponse:
        gauges = (
            "# TYPE lmdeploy:num_requests_running gauge\n"
            f'lmdeploy:num_requests_running{{model_name="{MODEL}"}} {state["in_flight"]}\n'
            "# TYPE lmdeploy:num_requests_waiting gauge\n"
            f'lmdeploy:num_requests_waiting{{model_name="{MODEL}"}} 0\n'
            "# TYPE lmdeploy:gpu_cache_usage_perc gauge\n"
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
    if args.metrics_series is not None:
        app.router.add_get("/metrics", metrics)
    web.run_app(app, host="127.0.0.1", port=args.port, print=None)


if __name__ == "__main__":
    main()
