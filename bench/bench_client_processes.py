"""How many streamed events per second `restful --client-processes N` takes in, for N = 1, 2 and 4 side by side.

    .venv/bin/python bench/bench_client_processes.py [--quick] [--processes 1,2,4] [--requests 1024] [--tokens 256]

A flooding SSE server in a child process answers every request with `--tokens` completion chunks pre-encoded
and written `--per-write` at a time, then a usage chunk and [DONE]: it spends little per event, so the clients set
the pace. Each round drains one run's events in this process into one Profiler (a session per request: admit,
a tick per event, finish), as the runner does, for N = 1 (`openai_client.run_requests`, today's one-process path)
and N > 1 (`client_workers.ClientWorkers.run`), alternating which goes first, best of `--rounds` after an unmeasured
round each. The rate is events (ticks) per wall second from the run's t0 to its last event. The worker processes
start once per N, as the engine starts them when it loads (their start-up is printed apart), and serve every
round. Ratios are against N=1. Exit status 1 when N=2 takes in less than `--want` (default 1.7) times N=1's rate.

On a shared machine wall rates say how busy it was; so each round also prints the CPU time per event of this
process (the merge into the profiler; at N=1 the whole client) and of the workers together, and the rate those costs
allow where each process has a core of its own: min(1 / this process's cost, N / the workers' cost).
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import sys
import time
from pathlib import Path

import psutil
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_http_client import MODEL, _chunk, _free_port, _wait_listening

from bench_core.engines.client_workers import ClientWorkers
from bench_core.engines.openai_client import ServerSpec, run_requests
from bench_core.load.datasets import SampledRequest
from bench_core.load.schedule import SendSchedule
from bench_core.measure.profiler import Profiler, Session


async def _flood(request: web.Request) -> web.StreamResponse:
    n = (await request.json())["max_tokens"]
    block, per_write = request.app["block"], request.app["per_write"]
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for _ in range(n // per_write):
        await response.write(block)
    usage = {"prompt_tokens": 8, "completion_tokens": n, "total_tokens": n + 8}
    await response.write(_chunk(" token") * (n % per_write) + _chunk("", "length", usage) + b"data: [DONE]\n\n")
    return response


def _serve(port: int, per_write: int) -> None:
    app = web.Application()
    app["block"], app["per_write"] = _chunk(" token") * per_write, per_write
    app.router.add_post("/v1/completions", _flood)
    web.run_app(app, host="127.0.0.1", port=port, print=None, handle_signals=True)


def _worker_cpu_s() -> float:
    return sum(
        sum(child.cpu_times()[:2])
        for child in psutil.Process().children()
        if "bench_core.engines.client_workers" in " ".join(child.cmdline())
    )


def measure(url: str, workers: ClientWorkers | None, args) -> tuple[float, float, float, float]:
    """(ticks per wall second from t0, seconds from the call to t0, CPU microseconds per tick of this process and of
    the workers) of one run drained into one profiler; `workers` None: the one-process client."""
    requests = [SampledRequest("hello", 8, args.tokens)] * args.requests
    spec = ServerSpec(url, server_kind="vllm")
    own_cpu, worker_cpu = time.process_time(), _worker_cpu_s()
    called = time.perf_counter()
    if workers is None:
        run = run_requests(spec, MODEL, requests, max_concurrency=args.concurrency)
    else:
        run = workers.run(spec, MODEL, requests, SendSchedule.at_rate(requests, math.inf), args.concurrency)
    profiler = Profiler(stream_output=True, percentages=[50, 99])
    sessions = [profiler.new_session(8, args.tokens) for _ in requests]
    profiler.start()
    ticks, last = 0, called
    for event in run.events():
        session: Session = sessions[event.index]
        if event.kind == "tokens":
            session.tick_at(event.n_tokens, event.ts)
            ticks += 1
        elif event.kind == "admit":
            session.admit(event.ts)
        else:
            session.finish(Session.SUCCESS, "", event.ts)
        last = event.ts
    profiler.finish()
    own_cpu, worker_cpu = time.process_time() - own_cpu, _worker_cpu_s() - worker_cpu
    _check(sessions, run.results, args)
    return ticks / (last - run.t0), run.t0 - called, own_cpu / ticks * 1e6, worker_cpu / ticks * 1e6


def allowed_rate(n: int, own_us: float, workers_us: float) -> float:
    """Events per second the CPU costs allow with a core per process."""
    return 1e6 / max(own_us, workers_us / n)


def _check(sessions, results, args) -> None:
    done = sum(r.finish_reason == "length" and r.output_tokens == args.tokens for r in results)
    if done != args.requests:
        raise SystemExit(f"{done} of {args.requests} requests came back whole")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smaller load (256 requests x 128 tokens, 2 rounds)")
    parser.add_argument("--processes", default="1,2,4", help="client process counts, comma-separated (1 first)")
    parser.add_argument("--concurrency", type=int, default=256, help="requests in flight in all")
    parser.add_argument("--requests", type=int, default=1024)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--per-write", type=int, default=16, help="SSE events the server writes at once")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--want", type=float, default=1.7, help="the least N=2 / N=1 ratio that passes")
    args = parser.parse_args()
    if args.quick:
        args.requests, args.tokens, args.rounds = 256, 128, 2
    counts = [int(n) for n in args.processes.split(",")]

    port = _free_port()
    server = multiprocessing.get_context("spawn").Process(target=_serve, args=(port, args.per_write), daemon=True)
    server.start()
    pools: dict[int, ClientWorkers | None] = {}
    try:
        _wait_listening(port)
        url = f"http://127.0.0.1:{port}"
        print(
            f"{args.requests} requests x {args.tokens} events, {args.concurrency} in flight in all, "
            f"{args.per_write} events per server write, best of {args.rounds} rounds"
        )
        for n in counts:
            started = time.perf_counter()
            pools[n] = ClientWorkers(n) if n > 1 else None
            print(f"  N={n}: workers started in {time.perf_counter() - started:.2f} s")
            measure(url, pools[n], args)  # unmeasured: imports, connections, caches
        best = dict.fromkeys(counts, (0.0, 0.0, 0.0, 0.0))
        for round_ in range(args.rounds):
            for n in counts if round_ % 2 == 0 else counts[::-1]:  # none always goes first
                rate, to_t0, own_us, workers_us = measure(url, pools[n], args)
                best[n] = max(best[n], (rate, to_t0, own_us, workers_us))
                print(
                    f"  round {round_ + 1}  N={n}  {rate:>10,.0f} events/s  ({to_t0 * 1000:.0f} ms from the call "
                    f"to t0)  CPU per event: this process {own_us:.1f} us, workers {workers_us:.1f} us: "
                    f"{allowed_rate(n, own_us, workers_us):,.0f} events/s on free cores"
                )
    finally:
        for pool in pools.values():
            if pool is not None:
                pool.close()
        server.terminate()
        server.join(timeout=10)
    one, one_free = best[counts[0]][0], allowed_rate(counts[0], *best[counts[0]][2:])
    print(f"load average now {psutil.getloadavg()[0]:.1f} on {psutil.cpu_count()} cores")
    for n in counts:
        free = allowed_rate(n, *best[n][2:])
        print(
            f"N={n}: {best[n][0]:>10,.0f} events/s  ratio to N={counts[0]}: {best[n][0] / one:.2f}   "
            f"on free cores (from CPU per event, best wall round): {free:,.0f} events/s, ratio {free / one_free:.2f}"
        )
    if 2 in best and best[2][0] / one < args.want:
        print(f"BELOW TARGET: N=2 takes in {best[2][0] / one:.2f}x N=1's events per second (want {args.want})")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
