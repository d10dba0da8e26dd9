"""Fixtures for the real-browser tests: the dashboard served by `streamlit run` on a free local port,
Debian's chromium driven by playwright (never `playwright install`), and the server log on failure.

The server writes its history into a temporary folder (BENCH_STUDIO_RESULTS) and shares the model
cache with the rest of the suite, so the tiny model is built once per machine.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
from playwright.sync_api import expect

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
# Headless chromium as root in a container, with nothing that phones home or updates itself.
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
# Streamlit scrolls inside its main area, so a full-page screenshot is only the viewport: make it tall.
VIEWPORT = {"width": 1400, "height": 1600}
ARTIFACTS = ROOT / "artifacts" / "e2e"
SERVER_START_TIMEOUT_S = 60
DEFAULT_TIMEOUT_MS = 20_000
LOG_TAIL_CHARS = 12_000


@dataclass
class AppServer:
    """A running `streamlit run app.py`: its URL, results folder and log file."""

    url: str
    results: Path
    log_path: Path
    process: subprocess.Popen

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@pytest.fixture(scope="session")
def chromium() -> Path:
    """Debian's chromium; the browser tests skip on a machine without it (CI installs it: .ci/run)."""
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"no chromium at {CHROMIUM}: install Debian's chromium package to run the browser tests")
    return CHROMIUM


@pytest.fixture(scope="session")
def app_server(chromium, tiny_model_path, tmp_path_factory) -> AppServer:
    """`streamlit run app.py` on 127.0.0.1, stopped with its whole process group at the end of the session.

    Depends on `tiny_model_path` so the built-in tiny model exists before the server first loads it.
    """
    folder = tmp_path_factory.mktemp("e2e-server")
    results, log_path = folder / "results", folder / "streamlit.log"
    port = _free_port()
    env = {**os.environ, "BENCH_STUDIO_RESULTS": str(results), "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    command = [
        sys.executable, "-m", "streamlit", "run", str(ROOT / "app.py"),
        "--server.headless=true", f"--server.port={port}", "--server.address=127.0.0.1",
        "--browser.gatherUsageStats=false", "--server.fileWatcherType=none", "--server.runOnSave=false",
    ]
    with open(log_path, "wb") as log:
        # cwd=ROOT: streamlit reads .streamlit/config.toml from there. A new session makes the server the
        # leader of its own process group, so teardown reaches every child it started.
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    server = AppServer(url=f"http://127.0.0.1:{port}", results=results, log_path=log_path, process=process)
    try:
        _wait_until_healthy(server)
        yield server
    finally:
        _stop(process)


@pytest.fixture(scope="session")
def base_url(app_server) -> str:
    """pytest-playwright's base URL, so tests navigate with paths such as page.goto("/history")."""
    return app_server.url


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args, chromium) -> dict:
    return {**browser_type_launch_args, "executable_path": str(chromium), "args": CHROMIUM_ARGS}


@pytest.fixture(scope="session")
def browser_context_args(browser_context_args) -> dict:
    return {**browser_context_args, "viewport": VIEWPORT, "accept_downloads": True}


@pytest.fixture(autouse=True)
def generous_timeouts(request):
    """Web-first waits long enough for a busy 2-core machine; a run's first chart gets more where it waits."""
    expect.set_options(timeout=DEFAULT_TIMEOUT_MS)
    if "page" in request.fixturenames:
        request.getfixturevalue("page").set_default_timeout(DEFAULT_TIMEOUT_MS)


@pytest.fixture(scope="session")
def artifacts() -> Path:
    """artifacts/e2e/ (ignored by git): screenshots and downloads to look at after a run."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed browser test carries the tail of the server log: tracebacks from the page scripts land there."""
    report = yield
    server = item.funcargs.get("app_server") if hasattr(item, "funcargs") else None
    if report.failed and isinstance(server, AppServer):
        report.sections.append(("streamlit server log (tail)", server.log()[-LOG_TAIL_CHARS:]))
    return report


def _free_port() -> int:
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
    pytest.fail(f"streamlit did not answer {server.url}/_stcore/health within {SERVER_START_TIMEOUT_S} s:\n"
                f"{server.log()}")


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
