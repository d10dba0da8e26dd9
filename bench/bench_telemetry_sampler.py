"""The observer cost of hardware telemetry: a run with the 10 Hz sampler against one sampled only at its ends.

    .venv/bin/python bench/bench_telemetry_sampler.py [--pairs 3] [--prompts 16] [--tokens 128]

tiny-llama on the embedded engine (CPU), streamed, concurrency 4, in process (Runner). "off" replaces the
runner's sampler by one whose interval is an hour: it still takes the first and last samples, so everything
else the run does is the same. Each pair runs its two sides in alternating order; the ratio (output tok/s
sampled at 10 Hz / at the ends only) is the median of the pairs', printed with every pair and the machine's
load. Target: at least 0.98. Exit status 1 when missed. Also printed, steadier than short runs on a busy
machine: the CPU the sampler itself uses over 5 s of sampling with nothing else running (share of one core).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from bench_core.config import DatasetConfig, EngineConfig, LoadConfig, RunConfig  # noqa: E402
from bench_core.hardware.telemetry import TelemetrySampler  # noqa: E402
from bench_core.run import runner as runner_module  # noqa: E402

TARGET = 0.98
AT_THE_ENDS_ONLY = functools.partial(TelemetrySampler, interval_s=3600.0)


def tokens_per_s(runner: runner_module.Runner, config: RunConfig, sampled: bool) -> float:
    runner_module.TelemetrySampler = TelemetrySampler if sampled else AT_THE_ENDS_ONLY
    run = runner.submit(config)
    run.wait()
    if run.state != "finished":
        raise SystemExit(f"the run ended {run.state}: {run.message}")
    return run.profiler.output_throughput


def sampler_cpu_share(seconds: float = 5.0) -> tuple[float, int]:
    """The share of one core this process spends sampling at 10 Hz, idle otherwise, and the samples taken."""
    started = time.process_time()
    sampler = TelemetrySampler().start()
    time.sleep(seconds)
    samples = sampler.stop()
    return (time.process_time() - started) / seconds, int(samples["time_s"].nunique())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=128)
    args = parser.parse_args()
    config = RunConfig(
        engine=EngineConfig(backend="transformers", model="builtin:tiny-llama"),
        dataset=DatasetConfig(dataset="builtin:sample", num_prompts=args.prompts, sharegpt_output_len=args.tokens),
        load=LoadConfig(concurrency=4, stream_output=True),
    )
    runner = runner_module.Runner()  # no history: nothing recorded
    try:
        tokens_per_s(runner, config, sampled=False)  # load and warm the engine once
        ratios = []
        for pair in range(args.pairs):
            order = (True, False) if pair % 2 == 0 else (False, True)
            rates = {sampled: tokens_per_s(runner, config, sampled) for sampled in order}
            ratios.append(rates[True] / rates[False])
            print(
                f"pair {pair + 1}: 10 Hz {rates[True]:,.1f} tok/s, ends only {rates[False]:,.1f} tok/s, "
                f"ratio {ratios[-1]:.3f}"
            )
    finally:
        runner.shutdown()
    share, taken = sampler_cpu_share()
    print(f"the sampler alone: {share:.2%} of one core ({taken} samples in 5 s)")
    median = statistics.median(ratios)
    print(
        f"observer cost of the 10 Hz sampler: ratio {median:.3f} (median of {len(ratios)} pairs, spread "
        f"{min(ratios):.3f}-{max(ratios):.3f}; load average {os.getloadavg()[0]:.2f}); target >= {TARGET}"
    )
    return 0 if median >= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
