"""A sweep on one machine against the same sweep on 2 Ray workers: the wall-clock ratio.

    .venv/bin/python bench/bench_sweep_cluster.py [--prompts 32] [--tokens 64] [--workers 2]

The sweep: tiny-llama, a 2 x 2 grid (concurrency 1,2 x max_batch_tokens 256,512), so two engine settings of
two points each. Serial: the runner of this process, one run after the other, as `python -m bench_core sweep`
runs it. Cluster: a local Ray instance with --workers CPUs (on 127.0.0.1, no dashboard) and one core per
point, so the two engine-settings groups run side by side, each in its own actor. Both wall clocks count from
the sweep's start to its end, engine loads included; starting Ray itself is printed apart, since a cluster
is started once, not per sweep. Printed: both times, serial / cluster, and the machine's load (`uptime`).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
for name, value in {
    "HF_HUB_OFFLINE": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "TOKENIZERS_PARALLELISM": "false",
}.items():  # quiet, in the Ray workers too (they inherit it)
    os.environ.setdefault(name, value)
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # Ray on the loopback address (read when ray is imported)

from test_sweep_driver import plan_of, tiny_base  # noqa: E402

from bench_core.run.runner import Runner  # noqa: E402
from bench_core.store.history import History  # noqa: E402
from bench_core.sweep.cluster import ClusterOptions, connect, launcher  # noqa: E402
from bench_core.sweep.driver import start_sweep  # noqa: E402

GRID = ("concurrency=1,2", "max-batch-tokens=256,512")


def timed_sweep(results: Path, launch, prompts: int, tokens: int) -> tuple[float, float, float]:
    """The sweep's wall clock, and the sums over its runs of the measured time and of the time loading."""
    runner = Runner(History(results))
    plan = plan_of(*GRID, base=tiny_base(num_prompts=prompts, output_len=tokens))
    started = time.perf_counter()
    sweep = start_sweep(runner, plan, launch) if launch else start_sweep(runner, plan)
    sweep.wait()
    elapsed = time.perf_counter() - started
    runner.shutdown()
    progress = sweep.progress()
    assert progress.state == "finished", progress.message
    runs = History(results).load()
    return elapsed, float(runs["duration"].sum()), float(runs["load_seconds"].sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=32, help="prompts per point")
    parser.add_argument("--tokens", type=int, default=64, help="output tokens per prompt")
    parser.add_argument("--workers", type=int, default=2, help="CPUs of the local Ray instance, one per point")
    args = parser.parse_args()
    from bench_core.models.resolve import resolve_model

    resolve_model("builtin:tiny-llama")
    with tempfile.TemporaryDirectory() as folder:
        serial = timed_sweep(Path(folder) / "serial", None, args.prompts, args.tokens)
        started = time.perf_counter()
        connect("local", num_cpus=args.workers, include_dashboard=False)
        ray_start = time.perf_counter() - started
        cluster = timed_sweep(
            Path(folder) / "cluster", launcher(ClusterOptions("local", cpus_per_point=1)), args.prompts, args.tokens
        )
    print(
        f"4-point tiny-llama sweep, {args.prompts} prompts x {args.tokens} tokens per point; wall clock, and "
        f"summed over the 4 runs: measured time, loading (sampling, engine load or reuse, warm-up)"
    )
    for name, (wall, measured, loading) in (
        ("serial (this process)", serial),
        (f"Ray, {args.workers} workers x 1 core", cluster),
    ):
        print(f"  {name:<26} {wall:6.1f} s   runs measured {measured:6.1f} s, loading {loading:5.1f} s")
    print(f"  starting Ray (not counted): {ray_start:.1f} s")
    print(f"  serial / Ray: {serial[0] / cluster[0]:.2f}x")
    print(f"  load: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")


if __name__ == "__main__":
    main()
