"""Worker entry points for the tests of bench_core.run.engine_process: `serve`, with a real fault injected in the
worker process once it has finished some requests (the spawned worker imports this module by name), and
one that holds the tokenizer's loading until the test lets it go.

The fault and its moment come from the environment, which the spawned process inherits:
FAULT_ENV = "exception" | "exit" | "segfault", after FAULT_AFTER_ENV finished requests.
"""

import faulthandler
import itertools
import os
import signal
import time
from pathlib import Path

from bench_core.run import runner as runner_module
from bench_core.run.engine_process import PUBLISH_EVERY_S, serve
from bench_core.measure.profiler import Session

FAULT_ENV, FAULT_AFTER_ENV, RELEASE_ENV = "BENCH_TEST_FAULT", "BENCH_TEST_FAULT_AFTER", "BENCH_TEST_RELEASE"


class EngineBug(Exception):
    pass


def _raise_engine_bug(signum, frame):
    raise EngineBug("an error outside any run")


def serve_with_fault(conn) -> None:
    fault, after = os.environ[FAULT_ENV], int(os.environ[FAULT_AFTER_ENV])
    finished = itertools.count(1)
    real_finish = Session.finish
    signal.signal(signal.SIGUSR1, _raise_engine_bug)  # raised in the main thread, where nothing catches it

    def finish(self, *args, **kwargs):
        real_finish(self, *args, **kwargs)
        if next(finished) == after:
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


def serve_holding_the_tokenizer(conn) -> None:
    real_load_tokenizer = runner_module.load_tokenizer

    def load_tokenizer(*args, **kwargs):
        release = Path(os.environ[RELEASE_ENV])
        while not release.exists():
            time.sleep(0.01)
        return real_load_tokenizer(*args, **kwargs)

    runner_module.load_tokenizer = load_tokenizer
    serve(conn)
