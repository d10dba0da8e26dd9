"""The dashboard as the browser tests serve it: a server process on a free local port, from the
repository root, waited for until it answers and stopped with every process it started."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Streamlit scrolls inside its main area, so a full-page screenshot is only the viewport: make it tall.
VIEWPORT = {"width": 1400, "height": 1600}
SERVER_START_TIMEOUT_S = 60


@dataclass
class AppServer:
    """A running `streamlit run app.py`: its URL, results folder and log file."""

    url: str
    results: Path
    log_path: Path
    process: subprocess.Popen

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def streamlit_command(port: int) -> list[str]:
    """`streamlit run app.py` from this checkout on 127.0.0.1:`port`, headless, with no file watcher."""
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(ROOT / "app.py"),
        "--server.headless=true",
        f"--server.port={port}",
        "--server.address=127.0.0.1",
        "--browser.gatherUsageStats=false",
        "--server.fileWatcherType=none",
        "--server.runOnSave=false",
    ]


@contextmanager
def serve(command: list, env: dict[str, str], port: int, folder: Path, cwd: Path = ROOT) -> Iterator[AppServer]:
    """Run the dashboard server `command` (listening on `port`, history in env's BENCH_STUDIO_RESULTS, else
    ./results in `cwd`) from `cwd`, its log in `folder`; yield it once it answers, stop its whole process group
    after."""
    log_path = folder / "streamlit.log"
    with open(log_path, "wb") as log:
        # Streamlit reads .streamlit/config.toml from the working directory (the repository root by default; the
        # installed `bench-studio app` passes it as flags). A new session makes the server the
        # leader of its own process group, so teardown reaches every child it started.
        process = subprocess.Popen(
            command, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    results = Path(env.get("BENCH_STUDIO_RESULTS", cwd / "results"))
    server = AppServer(url=f"http://127.0.0.1:{port}", results=results, log_path=log_path, process=process)
    try:
        _wait_until_healthy(server)
        yield server
    finally:
        _stop(process)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_until_healthy(server: AppServer) -> None:
    """Poll /_stcore/health; fail with the log if the server exits or never answers."""
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            pytest.fail(f"streamlit exited with {server.process.returncode} before serving:\n{server.log()}")
        try:
            with urllib.request.urlopen(f"{server.url}/_stcore/health", timeout=2) as response:
                if response.read() == b"ok":
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.2)
    pytest.fail(
        f"streamlit did not answer {server.url}/_stcore/health within {SERVER_START_TIMEOUT_S} s:\n{server.log()}"
    )


def _stop(process: subprocess.Popen) -> None:
    """SIGTERM the server's process group, SIGKILL it if it lingers."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:  # the group is already gone
            return
        try:
            process.wait(timeout=10)
            return
        except subprocess.TimeoutExpired:
            continue
