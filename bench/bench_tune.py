"""A tune on the embedded engine against a same-size random sample of its space, side by side.

    .venv/bin/python bench/bench_tune.py [--trials 6] [--num-prompts 8] [--output-len 16] [--seed 0] [--slo p99_tpot_ms<=1000]
                                         [--results DIR]

Runs `tune pipeline builtin:sharegpt builtin:smollm2-135m --backend transformers --stream-output` over three knobs
(SPACE: concurrency x max_batch_tokens x enable_prefix_caching, 24 points) twice through the CLI, in this process as a
user's command runs: `--search tpe` (the tune) and `--search random` (the baseline: as many points drawn at random), with
the same budget, seed, bound (--slo, default p99 TPOT <= 1 s: on a CPU others share, a batch's TTFT is mostly its
queue, and decode slows as concurrency grows) and objective (output throughput). Prints each one's wall time and trials, then
the TPE's best point with its interval and the commands it printed to deploy it, against the median and the best of
the random sample's objective: the tune is worth its search where its best beats that median. Each trial is one run,
so a point's figure is one run's: on a machine others share, a difference of a few percent is noise.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_core.cli import main
from bench_core.store.history import History
from bench_core.sweep.plan import describe_point
from bench_core.sweep.results import tune_result
from bench_core.sweep.store import load_plan, trials_of
from bench_core.sweep.tune import describe_best

SPACE = ("concurrency=1,2,4,8", "max_batch_tokens=32,128,1024", "enable_prefix_caching=true,false")


def run_tune(results: Path, search: str, args: argparse.Namespace) -> tuple[float, str, str]:
    """One tune through the CLI: its wall seconds, its id and what it printed on stdout."""
    argv = [
        "tune", "pipeline", "builtin:sharegpt", "builtin:smollm2-135m", "--backend", "transformers", "--stream-output",
        "-n", str(args.num_prompts), "--sharegpt-output-len", str(args.output_len), "--csv", "", "--results",
        str(results), *(word for axis in SPACE for word in ("--space", axis)), "--slo", args.slo, "--trials", str(args.trials), "--tune-seed", str(args.seed),
        "--search", search,
    ]  # fmt: skip
    out, err = io.StringIO(), io.StringIO()
    started = time.monotonic()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    wall = time.monotonic() - started
    if code != 0:
        raise SystemExit(f"tune --search {search} exited {code}: {err.getvalue()[-2000:]}")
    tune_id = next(line.split()[1].rstrip(":") for line in err.getvalue().splitlines() if line.startswith("tune "))
    return wall, tune_id, out.getvalue()


def main_bench() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--output-len", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--slo", default="p99_tpot_ms<=1000", help="the bound every trial must keep")
    parser.add_argument("--results", default="", help="the history folder (default: a new temporary one)")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    results = Path(args.results or tempfile.mkdtemp(prefix="bench-tune-"))
    print(f"history: {results}; load average at start {os.getloadavg()[0]:.2f}")
    outcomes = {}
    for search in ("tpe", "random"):
        wall, tune_id, printed = run_tune(results, search, args)
        history = History(results)
        outcome = tune_result(load_plan(history, tune_id), trials_of(history, tune_id), history.load())
        outcomes[search] = (wall, tune_id, printed, outcome)
        print(f"\n== --search {search}: {tune_id}, {wall:.0f} s, load average now {os.getloadavg()[0]:.2f}")
        print(printed)
    tpe, random = outcomes["tpe"][3], outcomes["random"][3]
    sampled = [trial.objective(random.tune) for trial in random.trials if not math.isnan(trial.objective(random.tune))]
    median = statistics.median(sampled) if sampled else math.nan
    best = tpe.best.objective(tpe.tune) if tpe.best else math.nan
    print(f"== side by side (output throughput, tok/s; {args.slo})")
    print(f"tune (TPE) best:          {best:.2f}  at {describe_point(tpe.best.point) if tpe.best else '-'}")
    if tpe.best:
        print(f"                          {describe_best(tpe.best, tpe.tune, describe_point(tpe.best.point))}")
    print(f"random sample median:     {median:.2f}  over {len(sampled)} points")
    random_best = random.best.objective(random.tune) if random.best else math.nan
    print(f"random sample best:       {random_best:.2f}")
    print(f"wall: tune {outcomes['tpe'][0]:.0f} s, random {outcomes['random'][0]:.0f} s")
    print(f"verdict: the tune's best {'beats' if best > median else 'does not beat'} the random sample's median")
    sys.stdout.flush()
    os._exit(0)  # as the CLI leaves: the interpreter's teardown waits on torch's threads


if __name__ == "__main__":
    main_bench()
