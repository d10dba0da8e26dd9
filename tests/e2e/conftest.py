"""Fixtures for the real-browser tests: the dashboard served by `streamlit run` on a free local port,
Debian's chromium driven by playwright (never `playwright install`), and the server log on failure.

The server writes its history into a temporary folder (BENCH_STUDIO_RESULTS) and shares the model
cache with the rest of the suite, so the tiny model is built once per machine.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from dashboard_server import ROOT, VIEWPORT, AppServer, free_port, serve, streamlit_command
from playwright.sync_api import expect

CHROMIUM = Path("/usr/bin/chromium")
# Headless chromium as root in a container, with nothing that phones home or updates itself.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = ROOT / "artifacts" / "e2e"
DEFAULT_TIMEOUT_MS = 20_000
LOG_TAIL_CHARS = 12_000
MAX_RUNS_CANCELLED_AFTER_A_FAILURE = 5
FAILED = pytest.StashKey[bool]()  # set on a test item whose setup, call or teardown failed


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
    port = free_port()
    env = {
        **os.environ,
        "BENCH_STUDIO_RESULTS": str(folder / "results"),
        "HF_HUB_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
    }
    with serve(streamlit_command(port), env, port, folder) as server:
        yield server


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
    servers = [value for value in getattr(item, "funcargs", {}).values() if isinstance(value, AppServer)]
    if report.failed:
        item.stash[FAILED] = True
        for server in servers:
            report.sections.append(("streamlit server log (tail)", server.log()[-LOG_TAIL_CHARS:]))
    return report


@pytest.fixture(autouse=True)
def no_run_outlives_a_failed_test(request):
    """A browser test that fails mid-run leaves no run holding the shared server's engine: the next test's Start
    would queue behind it and fail too (a CI run once saw one failure become two this way)."""
    yield
    if request.node.stash.get(FAILED, False) and "page" in request.fixturenames:
        cancel_active_runs(request.getfixturevalue("browser"), request.getfixturevalue("base_url"))


def cancel_active_runs(browser, base_url: str) -> None:
    """Cancel, from a tab of its own, the run the Run page shows while the Cancel button is enabled: each active
    run in turn, the queued ones after the running one."""
    context = browser.new_context(base_url=base_url, viewport=VIEWPORT)
    try:
        page = context.new_page()
        for _ in range(MAX_RUNS_CANCELLED_AFTER_A_FAILURE):
            page.goto("/")
            cancel = page.get_by_test_id("stSidebar").get_by_role("button", name="Cancel")
            expect(cancel).to_be_visible()
            if not cancel.is_enabled():
                return
            cancel.click()
            expect(cancel).to_be_disabled()
    finally:
        context.close()
