"""How much slower a first run is without a warm-up, on the embedded engine (lmdeploy#3341 reports about 40% on
Ascend), measured side by side in fresh processes:

    .venv/bin/python bench/bench_warmup.py [--pairs 3] [--model builtin:smollm2-135m] [-n 8] [-c 8] [--output-len 64]

Each pair runs `python -m bench_core throughput` twice, each in a fresh process (so nothing of torch is warm):
once with --warmup-requests 0, once with --warmup-requests N (the dashboard's default), in alternating order.
It prints each pair's output tok/s, the median ratio cold/warm, its spread and the machine's load (`uptime`).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from bench_core.config.catalog import WARMUP_START  # noqa: E402
from bench_core.store.history import History  # noqa: E402


def load_average() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def output_throughput(args: argparse.Namespace, warmup: int, results: Path) -> float:
    """One throughput run in a fresh process; its output tok/s from the history."""
    before = len(History(results).load()) if (results / "history.csv").exists() else 0
    subprocess.run(
        [
            sys.executable,
            "-m",
            "bench_core",
            "throughput",
            "builtin:sharegpt",
            args.model,
            "--backend",
            "transformers",
            "-n",
            str(args.n),
            "-c",
            str(args.c),
            "--sharegpt-output-len",
            str(args.output_len),
            "--warmup-requests",
            str(warmup),
            "--csv",
            "",
            "--results",
            str(results),
        ],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    )
    rows = History(results).load()
    assert len(rows) == before + 1
    row = rows.iloc[-1]
    assert row["status"] == "finished", row["error"]
    return float(row["output_throughput"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--model", default="builtin:smollm2-135m")
    parser.add_argument("-n", type=int, default=8)
    parser.add_argument("-c", type=int, default=8)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=WARMUP_START)
    args = parser.parse_args()
    print(f"before: {load_average()}")
    ratios = []
    with tempfile.TemporaryDirectory() as folder:
        results = Path(folder)
        for pair in range(args.pairs):
            order = (0, args.warmup) if pair % 2 == 0 else (args.warmup, 0)
            measured = {warmup: output_throughput(args, warmup, results) for warmup in order}
            ratios.append(measured[0] / measured[args.warmup])
            print(
                f"pair {pair + 1}: no warm-up {measured[0]:.1f} tok/s, {args.warmup} warm-up requests "
                f"{measured[args.warmup]:.1f} tok/s: {ratios[-1]:.3f}x"
            )
    print(
        f"{args.model}, {args.n} prompts x {args.output_len} tokens, concurrency {args.c}: a first run without "
        f"warm-up gives median {statistics.median(ratios):.3f}x the output tok/s of one after {args.warmup} "
        f"warm-up requests ({min(ratios):.3f}-{max(ratios):.3f})"
    )
    print(f"after: {load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
