"""The objects every page and browser tab share: one Runner (one run at a time, its engine in a worker
process), one History and the sweeps started in this server.

They live in `st.cache_resource`, so they exist once per server process, survive reruns and are shared
by all sessions; tests clear them with `get_runner.clear()`, `get_history.clear()`, `get_sweeps.clear()`.
"""

from __future__ import annotations

import atexit

import streamlit as st

from bench_core.run.engine_process import ProcessRunner, WorkerPool
from bench_core.store.history import History
from bench_core.sweep.driver import SweepRun

# Where the runner takes its engine worker from and leaves it when released (engine_process.WorkerPool): none in the
# app, whose runner lives as long as its server; the AppTest tests set one per module, so that each test's new runner
# takes the worker the last test's runner left instead of starting one (tests/conftest.py::fresh_dashboard).
WORKERS: WorkerPool | None = None


@st.cache_resource
def get_history() -> History:
    """The run history under $BENCH_STUDIO_RESULTS, else ./results."""
    return History()


@st.cache_resource(on_release=lambda runner: runner.shutdown())
def get_runner() -> ProcessRunner:
    """The process-wide runner; releasing it (cache clear, server stop) cancels its runs and ends its
    engine process (or leaves it, idle, in WORKERS)."""
    runner = ProcessRunner(history=get_history(), workers=WORKERS)
    # Streamlit ends on SIGTERM or Ctrl-C without releasing its cached resources: at exit the runner cancels what
    # runs, so a run under way is recorded as cancelled with what it measured. Registered after multiprocessing's
    # own exit handler, it runs before that one ends the engine process (the last registered runs first).
    atexit.register(runner.shutdown)
    return runner


@st.cache_resource(on_release=lambda sweeps: [sweep.cancel() for sweep in sweeps.values()])
def get_sweeps() -> dict[str, SweepRun]:
    """The sweeps started in this server process, by id; releasing it (cache clear, server stop) cancels them."""
    return {}
