"""`sweep restful` through the command line, for the tests of sweeps that start servers (tests/test_sweep_servers.py,
tests/faults/test_sweep_servers_and_search.py): the command run in this process, or as a process of its own with
its server's pid found once that server serves, and a real server per run (tests/load_server.py)."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from bench_core.cli import main
from bench_core.store.history import History
from bench_core.store.journal import JOURNAL_FILE
from bench_core.sweep.server import SERVER_LOG

ROOT = Path(__file__).resolve().parent.parent
SERVER = f"{sys.executable} {ROOT / 'tests' / 'load_server.py'} --port {{port}}"
# The server's first token comes after FAST_MS while at most {knee} requests are in flight, after SLOW_MS beyond: the
# SLO between them is 75 times the one and a third of the other, so 3 at once meet it and 4 miss it on a machine however
# busy (its delays only add, to a fast answer's 1,480 ms of room; nothing makes a slow one come before SLOW_MS).
KNEE, FAST_MS, SLO_MS, SLOW_MS = 3, 20, 1500, 4500
KNEE_SERVER = f"{SERVER} --knee {{knee}} --ttft-step-ms {FAST_MS} --beyond-knee-ms {SLOW_MS}"
# 4 requests of 8 input and 8 output tokens each; the tiny Llama's tokenizer samples them and counts the answers.
SMALL_RUN = (
    "sweep",
    "restful",
    "--tokenizer",
    "builtin:tiny-llama",
    "--num-prompts",
    "4",
    "--dataset-name",
    "random",
    "--random-input-len",
    "8",
    "--random-output-len",
    "8",
    "--disable-warmup",
    "--output-file",
    "",
    "--results",
    "results",
    "--no-server-metrics",
)


def bench(work: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """The command line run in this process, in `work` with `env` added, its output and exit code as a process's: a
    fresh interpreter would add seconds of imports and nothing these tests check (the Ctrl-C tests start one)."""
    out, err = io.StringIO(), io.StringIO()
    env = {"HF_HUB_OFFLINE": "1", **env}
    saved, cwd = {name: os.environ.get(name) for name in env}, os.getcwd()
    os.environ.update(env)
    os.chdir(work)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(args))
    finally:
        os.chdir(cwd)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return subprocess.CompletedProcess(["python", "-m", "bench_core", *args], code, out.getvalue(), err.getvalue())


def cli_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}


def rows_of(work: Path):
    return History(work / "results").load()


def server_pid_once_measuring(work: Path) -> int:
    """The pid the first run's server logged, once the run has sent its requests (its server is serving)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        logs = list((work / "results" / "runs").glob(f"*/{SERVER_LOG}")) if (work / "results").exists() else []
        text = logs[0].read_text() if logs else ""
        if "pid" in text and _serving(int(text.split()[2]), int(text.split()[6]), logs[0].parent):
            return int(text.split()[2])
        time.sleep(0.2)
    pytest.fail("the sweep's first server never started serving its run")


def _serving(pid: int, port: int, run_folder: Path) -> bool:
    """The run measures (its journal is started) and a request is in flight: the client holds a connection to the
    server's port (each request's output, at 200 ms a token, takes 13 s)."""
    if not (run_folder / JOURNAL_FILE).exists():
        return False
    try:
        connections = psutil.Process(pid).net_connections(kind="tcp")
    except psutil.Error:
        return False
    return any(c.status == psutil.CONN_ESTABLISHED and c.laddr.port == port for c in connections)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie has exited; only its parent's wait is missing (the parent is gone once the CLI has exited).
    status = Path(f"/proc/{pid}/stat").read_text().split()[2] if Path(f"/proc/{pid}/stat").exists() else "X"
    return status != "Z"


def group_members(pgid: int) -> list[int]:
    """The live processes of process group `pgid` (zombies, whose reaping is their new parent's, are not)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # After the command's closing parenthesis: state, ppid, pgrp.
            state, _, group = stat.read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, IndexError):  # ended while read
            continue
        if int(group) == pgid and state != "Z":
            members.append(int(stat.parent.name))
    return members
