"""What a huge /metrics page costs a run: the same `restful` run against a server that streams a token every 100 ms,
its /metrics a page of a few lines or one with `--series` label sets of one name (300,000: some 20 MB), side by side.

    .venv/bin/python bench/bench_metrics_load.py [--quick] [--series 300000] [--prompts 64] [--tokens 75] [--rounds 2]

Two tests/load_server.py processes serve the requests (`--token-delay-ms 100`), one with `--metrics-series 1`, one
with `--metrics-series N`. Each round runs `python -m bench_core restful` against each, as a user runs it (/metrics
read every second, all `--prompts` requests at once, `--tokens` tokens each: 7.5 s of tokens at full size), alternating
which goes first. Each run prints its P99 ITL (from its history row), its duration, and how long the command ran past
its requests: its wall time less the run's load time (tokenizer, sampling) and duration, so the interpreter's
start-up, the last read of /metrics, the recording and the printing are in it, with either page. The last lines are
the targets, from the medians of the rounds: the huge page's P99 ITL within 2x the small page's (the server sends a
token every 100 ms: the client's timestamps should not slip), and the command past its requests under 30 s with the
huge page. PASS, or FAIL with exit status 1.

Before the reader ran in a process of its own (issue 36, 2026-12-04), a page of 300,000 label sets gave P99 ITL 626 ms,
and at 1M series the command ran 214 s for a 7.5 s run.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_core.store.history import History
from bench_core.sweep.server import free_port

ROOT = Path(__file__).resolve().parent.parent
LOAD_SERVER = ROOT / "tests" / "load_server.py"
TOKEN_DELAY_MS = 100
ITL_RATIO_TARGET = 2.0  # the huge page's P99 ITL over the small page's, at most
PAST_REQUESTS_TARGET_S = 30.0  # the command's time past its requests with the huge page, under


class Measured(NamedTuple):
    p99_itl_ms: float
    duration_s: float
    past_requests_s: float
    metrics_lines: list[str]  # what the command said about the server's metrics


@contextlib.contextmanager
def load_server(series: int) -> Iterator[str]:
    """A tests/load_server.py process streaming a token every TOKEN_DELAY_MS, /metrics with `series` label sets."""
    port = free_port()
    command = [sys.executable, str(LOAD_SERVER), "--port", str(port), "--token-delay-ms", str(TOKEN_DELAY_MS)]
    server = subprocess.Popen(
        [*command, "--metrics-series", str(series)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(url + "/v1/models", timeout=1):
                    break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"the load server for {series:,} series did not start") from None
                time.sleep(0.2)
        yield url
    finally:
        server.terminate()
        server.wait()


def restful(url: str, prompts: int, tokens: int) -> Measured:
    """One `python -m bench_core restful` run against `url`, recorded in a history of its own."""
    with tempfile.TemporaryDirectory(prefix="bench-metrics-load-") as folder:
        command = [
            *(sys.executable, "-m", "bench_core", "restful", "--backend", "lmdeploy", "--base-url", url),
            *("--model", "load-test", "--tokenizer", "builtin:tiny-llama", "--dataset-path", "builtin:sample"),
            *("--num-prompts", str(prompts), "--sharegpt-output-len", str(tokens), "--max-concurrency", str(prompts)),
            *("--disable-warmup", "--server-metrics-interval", "1", "--output-file", "", "--results", folder),
        ]
        began = time.perf_counter()
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        wall_s = time.perf_counter() - began
        if done.returncode != 0:
            raise SystemExit(f"restful against {url} failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
        row = History(Path(folder)).load().iloc[-1]
    duration_s, load_s = float(row["duration_s"]), float(row["load_seconds"])
    said = [line for line in done.stderr.splitlines() if "/metrics" in line or "server metrics" in line.lower()]
    return Measured(float(row["p99_itl_ms"]), duration_s, wall_s - load_s - duration_s, said)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="30,000 series, 16 requests of 30 tokens, one round")
    parser.add_argument("--series", type=int, default=300_000, help="label sets of one name on the huge page")
    parser.add_argument("--prompts", type=int, default=64, help="requests, all sent at once")
    parser.add_argument("--tokens", type=int, default=75, help="tokens per request, one every 100 ms")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if args.quick:
        args.series, args.prompts, args.tokens, args.rounds = 30_000, 16, 30, 1
    print(
        f"{args.prompts} requests of {args.tokens} tokens (one every {TOKEN_DELAY_MS} ms), /metrics read every second: "
        f"a page of 3 label sets against one of {args.series:,}; {args.rounds} rounds"
    )
    pages = {"small": 1, "huge": args.series}
    results: dict[str, list[Measured]] = {page: [] for page in pages}
    with load_server(pages["small"]) as small_url, load_server(pages["huge"]) as huge_url:
        urls = {"small": small_url, "huge": huge_url}
        for round_index in range(args.rounds):
            order = ("small", "huge") if round_index % 2 == 0 else ("huge", "small")
            for page in order:
                measured = restful(urls[page], args.prompts, args.tokens)
                results[page].append(measured)
                print(
                    f"round {round_index + 1} {page:>5} page: P99 ITL {measured.p99_itl_ms:8.1f} ms, run "
                    f"{measured.duration_s:5.1f} s, command past its requests {measured.past_requests_s:5.1f} s"
                )
                for line in measured.metrics_lines:
                    print(f"    {line}")
    small_itl = statistics.median(m.p99_itl_ms for m in results["small"])
    huge_itl = statistics.median(m.p99_itl_ms for m in results["huge"])
    small_past = statistics.median(m.past_requests_s for m in results["small"])
    huge_past = statistics.median(m.past_requests_s for m in results["huge"])
    ratio = huge_itl / small_itl
    itl_ok, past_ok = ratio <= ITL_RATIO_TARGET, huge_past < PAST_REQUESTS_TARGET_S
    print(
        f"P99 ITL, huge page / small page: {huge_itl:.1f} / {small_itl:.1f} ms = {ratio:.2f}x "
        f"(target: at most {ITL_RATIO_TARGET:g}x): {'PASS' if itl_ok else 'FAIL'}"
    )
    print(
        f"command past its requests, huge page: {huge_past:.1f} s (small page: {small_past:.1f} s; target: under "
        f"{PAST_REQUESTS_TARGET_S:g} s): {'PASS' if past_ok else 'FAIL'}"
    )
    return 0 if itl_ok and past_ok else 1


if __name__ == "__main__":
    sys.exit(main())
