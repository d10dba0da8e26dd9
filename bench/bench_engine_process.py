"""The engine in its own process, measured: the observer effect and the cost of the split.

    .venv/bin/python bench/bench_engine_process.py [--pairs 3] [--observer-tokens 128] [--split-requests 5000]

(1) Observer effect: SmolLM2, 16 prompts x 128 tokens, concurrency 8, streamed, run headless by the CLI
    (`python -m bench_core pipeline`, engine in process) and run from the dashboard (engine in its worker
    process) while headless chromium shows that run's Run page live. Target: watched output tok/s at least
    0.98x headless.
(2) Split overhead: tiny-llama, N requests, through the worker process (ProcessRunner) and in process
    (Runner), in this one Python process. Target: worker at least 0.98x in process.
Each pair runs its two sides in alternating order; the ratio is the median of the pairs' ratios, printed
with every pair, the spread and the machine's load (`uptime`). Also printed: the resident memory of a worker
with tiny-llama loaded, and what a change of engine settings gives back. Exit status 1 when a target is missed.
Sizes are arguments: on a small machine run a smaller version and say so.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from bench_core.config import DatasetConfig, EngineConfig, LoadConfig, RunConfig  # noqa: E402
from bench_core.run.engine_process import ProcessRunner  # noqa: E402
from bench_core.run.runner import Runner  # noqa: E402
from bench_core.store.history import History  # noqa: E402

TARGET = 0.98
SMOLLM2, TINY = "builtin:smollm2-135m", "builtin:tiny-llama"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]


def load_average() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def throughput(history: History, run_id: str) -> float:
    row = history.load().set_index("run_id").loc[run_id]
    assert row["status"] == "finished", f"run {run_id} ended {row['status']}: {row['error']}"
    return float(row["output_throughput"])


def report(name: str, pairs: list[tuple[float, float]], labels: tuple[str, str]) -> bool:
    ratios = [b / a for a, b in pairs]
    print(f"\n{name}: {labels[1]} / {labels[0]} output tok/s")
    for i, (a, b) in enumerate(pairs, 1):
        print(f"  pair {i}: {labels[0]} {a:9.1f}  {labels[1]} {b:9.1f}  ratio {b / a:.3f}")
    median = statistics.median(ratios)
    met = median >= TARGET
    print(
        f"  ratio median {median:.3f} (min {min(ratios):.3f}, max {max(ratios):.3f}), target >= {TARGET}: "
        f"{'met' if met else 'MISSED'}"
    )
    print(f"  load: {load_average()}")
    return met


# ---- (1) the observer effect -------------------------------------------------------------------


def headless_run(results: Path, tokens: int, prompts: int) -> str:
    command = [
        sys.executable,
        "-m",
        "bench_core",
        "pipeline",
        "builtin:sharegpt",
        SMOLLM2,
        "--backend",
        "transformers",
        "-n",
        str(prompts),
        "-c",
        "8",
        "--stream-output",
        "--sharegpt-output-len",
        str(tokens),
        "--results",
        str(results),
        "--csv",
        str(results / "pipeline.csv"),
    ]
    subprocess.run(command, check=True, cwd=ROOT, capture_output=True)
    return History(results).load()["run_id"].iloc[-1]


def watched_run(page, url: str, results: Path, tokens: int, prompts: int, watch: bool) -> str:
    """Start the run from the sidebar (settings in the URL) and keep its live Run page open till it ends
    (or, with `watch` False, leave the page once the run has started)."""
    page.goto(f"{url}/?sharegpt_output_len_cpu={tokens}&num_prompts_cpu={prompts}&concurrency_cpu=8")
    page.get_by_test_id("stSidebar").get_by_role("button", name="Start").click()
    page.wait_for_url(lambda u: "run=" in u, timeout=60_000)
    run_id = page.url.split("run=")[1].split("&")[0]
    if watch:
        page.get_by_test_id("stProgress").wait_for(timeout=300_000)  # the live view is up: it refreshes itself
    else:
        page.goto("about:blank")
    history = History(results)
    watchers = [psutil.Process(pid) for pid in _watcher_pids()]
    cpu_before, started = _cpu_seconds(watchers), time.perf_counter()
    while history.load().empty or run_id not in set(history.load()["run_id"]):
        time.sleep(0.5)
    print(
        f"  the dashboard's server and chromium used {(_cpu_seconds(watchers) - cpu_before) / (time.perf_counter() - started):.2f} "
        "CPU cores meanwhile",
        flush=True,
    )
    return run_id


def _watcher_pids() -> list[int]:
    """The streamlit server (not its engine worker) and every chromium process."""
    found = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        command = " ".join(process.info["cmdline"] or [])
        if ("streamlit run" in command or "chromium" in command) and "spawn_main" not in command:
            found.append(process.info["pid"])
    return found


def _cpu_seconds(processes: list[psutil.Process]) -> float:
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


def observer_effect(pairs: int, tokens: int, prompts: int, watch: bool) -> bool:
    from playwright.sync_api import sync_playwright

    sys.path.insert(0, str(ROOT / "tests" / "e2e"))
    from dashboard_server import free_port, serve

    folder = Path(tempfile.mkdtemp(prefix="bench-observer-"))
    headless_results, served_results = folder / "headless", folder / "served"
    port = free_port()
    env = {**os.environ, "BENCH_STUDIO_RESULTS": str(served_results), "HF_HUB_OFFLINE": "1"}
    command = [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(ROOT / "app.py"),
        "--server.headless=true",
        f"--server.port={port}",
        "--server.address=127.0.0.1",
        "--browser.gatherUsageStats=false",
    ]
    measured: list[tuple[float, float]] = []
    with serve(command, env, port, folder) as server, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1600})
        for i in range(pairs):
            sides = {}
            for side in ("headless", "watched") if i % 2 == 0 else ("watched", "headless"):
                if side == "headless":
                    run_id = headless_run(headless_results, tokens, prompts)
                    sides[side] = throughput(History(headless_results), run_id)
                else:
                    run_id = watched_run(page, server.url, served_results, tokens, prompts, watch)
                    sides[side] = throughput(History(served_results), run_id)
                print(f"  {side}: {sides[side]:.1f} output tok/s (run {run_id})", flush=True)
            measured.append((sides["headless"], sides["watched"]))
        browser.close()
    same = _same_settings(History(headless_results), History(served_results))
    print(f"  the two sides ran the same settings: {same}")
    return (
        report(
            f"Observer effect (SmolLM2, {prompts} prompts x {tokens} tokens, concurrency 8, streamed"
            f"{'' if watch else ', the dashboard run NOT watched'})",
            measured,
            ("headless", "watched"),
        )
        and same
    )


def _same_settings(a: History, b: History) -> bool:
    first, second = a.config(a.load()["run_id"].iloc[0]), b.config(b.load()["run_id"].iloc[0])
    return (first.engine, first.dataset, first.load, first.generation) == (
        second.engine,
        second.dataset,
        second.load,
        second.generation,
    )


# ---- (2) the overhead of the split -------------------------------------------------------------


def split_config(requests: int, tokens: int, dtype: str = "auto") -> RunConfig:
    return RunConfig(
        engine=EngineConfig(model=TINY, dtype=dtype),
        dataset=DatasetConfig(dataset="builtin:sharegpt", num_prompts=requests, sharegpt_output_len=tokens),
        load=LoadConfig(concurrency=64, stream_output=True),
    )


def measure(runner: Runner, config: RunConfig) -> float:
    run = runner.submit(config)
    run.wait()
    assert run.state == "finished", run.message
    return float(run.record.metrics["output_throughput"])


def split_overhead(pairs: int, requests: int, tokens: int) -> bool:
    history = History(tempfile.mkdtemp(prefix="bench-split-"))
    in_process, worker = Runner(history), ProcessRunner(history)
    config = split_config(requests, tokens)
    measured: list[tuple[float, float]] = []
    for i in range(pairs):
        sides = {}
        for side in ("in process", "worker") if i % 2 == 0 else ("worker", "in process"):
            sides[side] = measure(in_process if side == "in process" else worker, config)
            print(f"  {side}: {sides[side]:.1f} output tok/s", flush=True)
        measured.append((sides["in process"], sides["worker"]))
    in_process.shutdown()
    met = report(
        f"Split overhead (tiny-llama, {requests} requests x {tokens} tokens, concurrency 64, streamed)",
        measured,
        ("in process", "worker"),
    )
    memory_of_a_settings_change(worker, requests, tokens)
    worker.shutdown()
    return met


def memory_of_a_settings_change(worker: ProcessRunner, requests: int, tokens: int) -> None:
    mib = 2**20
    old_pid = worker.worker_pid()
    old_rss = psutil.Process(old_pid).memory_info().rss
    available = psutil.virtual_memory().available
    measure(worker, split_config(min(requests, 64), tokens, dtype="float32"))  # other engine settings
    new_pid = worker.worker_pid()
    print(
        f"\nMemory: this process {psutil.Process().memory_info().rss / mib:.0f} MiB RSS; worker {old_pid} with "
        f"tiny-llama loaded {old_rss / mib:.0f} MiB RSS; after a change of engine settings it is "
        f"{'gone' if not psutil.pid_exists(old_pid) else 'STILL THERE'}, the new worker {new_pid} has "
        f"{psutil.Process(new_pid).memory_info().rss / mib:.0f} MiB RSS; available memory "
        f"{available / mib:.0f} -> {psutil.virtual_memory().available / mib:.0f} MiB"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--observer-prompts", type=int, default=16)
    parser.add_argument("--observer-tokens", type=int, default=128)
    parser.add_argument("--split-requests", type=int, default=5000)
    parser.add_argument("--split-tokens", type=int, default=8)
    parser.add_argument("--only", choices=("observer", "split"), default=None)
    parser.add_argument(
        "--unwatched",
        action="store_true",
        help="leave the Run page once the dashboard's run has started: what watching itself costs",
    )
    args = parser.parse_args()
    print(f"start: {load_average()}", flush=True)
    met = True
    if args.only in (None, "split"):
        met &= split_overhead(args.pairs, args.split_requests, args.split_tokens)
    if args.only in (None, "observer"):
        met &= observer_effect(args.pairs, args.observer_tokens, args.observer_prompts, not args.unwatched)
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
