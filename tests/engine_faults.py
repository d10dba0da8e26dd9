"""Worker entry points for the tests of bench_core.run.engine_process: `serve`, with a real fault injected in the
worker process once it has finished some requests (the spawned worker imports this module by name), one whose
OpenAI client is too slow for its load, one that holds the tokenizer's loading until the test lets it go, and one
that counts its aggregations.

The fault and its moment come from a file the test writes, named by FAULT_FILE_ENV (which the spawned process
inherits): "<fault> <after>", fault = "exception" | "exit" | "segfault", after that many requests finished while the
file exists; without the file the worker is healthy. So a healthy worker left in a WorkerPool can be told to fault
by the next test (the pool hands a worker only to a runner with the environment it was started in).
"""

import faulthandler
import itertools
import os
import signal
import time
from pathlib import Path

from bench_core.measure import metrics
from bench_core.measure.profiler import Profiler, Session
from bench_core.run import runner as runner_module
from bench_core.run.engine_process import serve
from bench_core.run.runner import PUBLISH_EVERY_S

FAULT_FILE_ENV, RELEASE_ENV = "BENCH_TEST_FAULT_FILE", "BENCH_TEST_RELEASE"
COUNTS_ENV = "BENCH_TEST_AGGREGATION_COUNTS"  # the file each aggregation appends a line to


class EngineBug(Exception):
    pass


def _raise_engine_bug(signum, frame):
    raise EngineBug("an error outside any run")


def serve_with_fault(conn) -> None:
    told = Path(os.environ[FAULT_FILE_ENV])
    finished = itertools.count(1)  # requests finished since the file was written
    real_finish = Session.finish
    signal.signal(signal.SIGUSR1, _raise_engine_bug)  # raised in the main thread, where nothing catches it

    def finish(self, *args, **kwargs):
        nonlocal finished
        real_finish(self, *args, **kwargs)
        try:
            fault, after = told.read_text().split()
        except FileNotFoundError:
            finished = itertools.count(1)
            return
        if next(finished) == int(after):
            time.sleep(3 * PUBLISH_EVERY_S)  # the finished requests are published before the fault
            if fault == "exit":
                os._exit(3)
            elif fault == "segfault":
                faulthandler.disable()
                faulthandler._sigsegv()
            else:
                os.kill(os.getpid(), signal.SIGUSR1)

    Session.finish = finish
    serve(conn)


SLOW_CLIENT_BLOCK_S = 0.015  # what the slow client sleeps on its event loop for every event it hands on


def serve_with_a_slow_client(conn) -> None:
    """`serve`, with an OpenAI client too slow for any load: every event it hands on first sleeps on its event loop,
    as a slow parser or a stray blocking call would, so its loop runs late on any machine, however fast."""
    from bench_core.engines.openai_client import ClientRun

    handed_on = ClientRun._emit

    def slow_emit(self, event):
        time.sleep(SLOW_CLIENT_BLOCK_S)
        handed_on(self, event)

    ClientRun._emit = slow_emit
    serve(conn)


def serve_holding_the_tokenizer(conn) -> None:
    real_load_tokenizer = runner_module.load_tokenizer

    def load_tokenizer(*args, **kwargs):
        release = Path(os.environ[RELEASE_ENV])
        while not release.exists():
            time.sleep(0.01)
        return real_load_tokenizer(*args, **kwargs)

    runner_module.load_tokenizer = load_tokenizer
    serve(conn)


def count_aggregations(where: str, write, patch=setattr) -> None:
    """Make every Profiler.compute_metrics and metrics.run_summary call `write(f"{where} {name}")` first;
    `patch`: how the counting versions replace them (a test's monkeypatch.setattr undoes it afterwards)."""

    def counted(name, real):
        def call(*args, **kwargs):
            write(f"{where} {name}")
            return real(*args, **kwargs)

        return call

    patch(Profiler, "compute_metrics", counted("compute_metrics", Profiler.compute_metrics))
    patch(metrics, "run_summary", counted("run_summary", metrics.run_summary))


def serve_counting_aggregations(conn) -> None:
    path = Path(os.environ[COUNTS_ENV])

    def write(line: str) -> None:
        with path.open("a") as counts:
            counts.write(line + "\n")

    count_aggregations("worker", write)
    serve(conn)
