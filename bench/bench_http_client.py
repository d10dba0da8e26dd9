"""How many streamed tokens per second our HTTP client takes in, next to a vLLM-style client.

    .venv/bin/python bench/bench_http_client.py [--quick] [--concurrency 256] [--requests 512] [--tokens 256]

A minimal SSE server in a child process (tests/flood_server.py) streams `--tokens` completion chunks per request as fast
as it can (pre-encoded, vLLM-shaped chunks ending with a usage chunk and [DONE]), so the clients,
not the server, set the pace. Two clients read the same load, alternating which goes first, best of `--rounds` after one
unmeasured round each:

  - ours: `bench_core.engines.openai_client.run_requests`, events drained from its queue by this thread,
    as `Engine.stream()` will drain them;
  - vLLM-style: written here the way vLLM's bench client works (one pooled aiohttp session, a
    semaphore, `iter_any`, a str buffer split on blank lines, one `json.loads` and one
    timestamp per message). A fresh rewrite for comparison, not vLLM's code.

The rate that matters is tokens per second of the client's own CPU time (this process, all its
threads; the server runs in another): it is the most a client can take in once it is the
bottleneck, and unlike wall time it holds steady on a shared machine. Wall-clock tokens/s is
printed too. The ratio ours / vLLM-style is of the CPU rates; exit status 1 when ours is the
slower one by more than the noise margin (`--margin`, default 5 %).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from flood_server import MODEL, flooding_server

from bench_core.engines.openai_client import run_requests
from bench_core.engines.openai_request import ServerSpec
from bench_core.load.datasets import SampledRequest

# --- the two clients ------------------------------------------------------------------------------


def run_ours(url: str, n_requests: int, tokens: int, concurrency: int) -> int:
    """Tokens taken in by our client, reading its events the way the engine will."""
    requests = [SampledRequest("hello", 8, tokens)] * n_requests
    run = run_requests(ServerSpec(url, server_kind="vllm"), MODEL, requests, max_concurrency=concurrency)
    received = {}
    for event in run.events():
        if event.kind == "finish":
            received[event.index] = event.n_tokens
    return sum(received.values())


class _MessageBuffer:
    """Bytes in, complete SSE messages out, the way vLLM's bench splits them (str buffer, blank lines)."""

    def __init__(self) -> None:
        self.buffer = ""

    def add(self, chunk: bytes) -> list[str]:
        self.buffer += chunk.decode("utf-8")
        messages = []
        while "\n\n" in self.buffer:
            message, self.buffer = self.buffer.split("\n\n", 1)
            if message.strip():
                messages.append(message.strip())
        return messages


async def _vllm_style_request(session: aiohttp.ClientSession, url: str, tokens: int) -> int:
    payload = {
        "model": MODEL,
        "prompt": "hello",
        "max_tokens": tokens,
        "stream": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    last, ttft, itl, text, output_tokens = start, 0.0, [], "", 0
    async with session.post(url, json=payload) as response:
        buffer = _MessageBuffer()
        async for chunk in response.content.iter_any():
            for message in buffer.add(chunk):
                if message.startswith(":"):
                    continue
                data = message.removeprefix("data: ")
                if data == "[DONE]":
                    continue
                body = json.loads(data)
                now = time.perf_counter()
                if choices := body.get("choices"):
                    if not ttft:
                        ttft = now - start
                    else:
                        itl.append(now - last)
                    last = now
                    text += choices[0].get("text") or ""
                if usage := body.get("usage"):
                    output_tokens = usage["completion_tokens"]
    return output_tokens


def run_vllm_style(url: str, n_requests: int, tokens: int, concurrency: int) -> int:
    async def main() -> int:
        connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=concurrency, keepalive_timeout=60)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=6 * 3600)) as session:
            slots = asyncio.Semaphore(concurrency)

            async def limited() -> int:
                async with slots:
                    return await _vllm_style_request(session, url + "/v1/completions", tokens)

            return sum(await asyncio.gather(*(limited() for _ in range(n_requests))))

    return asyncio.run(main())


def _measure(client, url: str, args) -> tuple[float, float]:
    """(tokens per CPU second of this process, tokens per wall-clock second) for one round."""
    wall, cpu = time.perf_counter(), time.process_time()
    received = client(url, args.requests, args.tokens, args.concurrency)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    expected = args.requests * args.tokens
    if received != expected:
        raise SystemExit(f"{client.__name__} received {received} tokens, expected {expected}")
    return received / cpu, received / wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smaller load (64 streams x 128 requests x 128 tokens)")
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--requests", type=int, default=512)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--margin", type=float, default=0.05)
    args = parser.parse_args()
    if args.quick:
        args.concurrency, args.requests, args.tokens, args.rounds = 64, 128, 128, 2

    with flooding_server(per_write=1) as (url, _):  # an event to a write, as a server streams token by token
        print(
            f"{args.requests} requests x {args.tokens} tokens, {args.concurrency} streams at once, best of {args.rounds} rounds"
        )
        clients = [("ours", run_ours), ("vllm-style", run_vllm_style)]
        for _, client in clients:  # a first, unmeasured round each: imports, connections, caches
            _measure(client, url, args)
        best = {"ours": (0.0, 0.0), "vllm-style": (0.0, 0.0)}
        for round_ in range(args.rounds):
            for name, client in clients if round_ % 2 == 0 else clients[::-1]:  # neither always goes first
                cpu_rate, wall_rate = _measure(client, url, args)
                best[name] = max(best[name], (cpu_rate, wall_rate))
                print(
                    f"  round {round_ + 1}  {name:<11} {cpu_rate:>10,.0f} tokens/CPU-s  {wall_rate:>10,.0f} tokens/s wall"
                )
    (ours, ours_wall), (theirs, theirs_wall) = best["ours"], best["vllm-style"]
    ratio = ours / theirs
    print(f"ours {ours:,.0f} tokens/CPU-s ({ours_wall:,.0f} wall), vLLM-style {theirs:,.0f} ({theirs_wall:,.0f} wall)")
    print(f"ratio ours/vLLM-style {ratio:.2f} (CPU), {ours_wall / theirs_wall:.2f} (wall)")
    if ratio < 1 - args.margin:
        print(f"FAIL: our client is slower than the vLLM-style client (ratio {ratio:.2f} < {1 - args.margin:.2f})")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
