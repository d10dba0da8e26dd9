"""Write the README's screenshots, docs/images/*.png, from a real run of the dashboard.

    .venv/bin/python scripts/screenshots.py          # needs Debian's chromium (/usr/bin/chromium)

It serves the dashboard on 127.0.0.1 with an empty history, as the browser tests do, starts a long run of
builtin:tiny-llama from the sidebar and captures the Run page while it runs (then cancels it), captures a short
run once it has ended, then records two runs that differ in concurrency and captures their comparison on the
History page. Running it again refreshes every image. The clicks are the browser tests' own steps (tests/e2e), so a change to the pages that
breaks the screenshots breaks those tests too.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# tests/e2e first: its conftest (the chromium flags) is the one imported by that name.
sys.path[:0] = [str(ROOT / "tests" / "e2e"), str(ROOT / "tests"), str(ROOT)]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from conftest import CHROMIUM, CHROMIUM_ARGS  # noqa: E402
from dashboard_server import free_port, serve, streamlit_command  # noqa: E402
from PIL import Image  # noqa: E402
from playwright.sync_api import Page, expect, sync_playwright  # noqa: E402
from test_browser import (  # noqa: E402
    TINY_MODEL,
    choose_model,
    compare_in_history,
    open_run_page,
    sidebar,
    start_run,
)
from test_history_compare_browser import tiny_run  # noqa: E402

from bench_core.models.resolve import resolve_model  # noqa: E402
from bench_core.run.runner import Runner  # noqa: E402
from bench_core.states import RunState  # noqa: E402
from bench_core.store.history import History  # noqa: E402

IMAGES = ROOT / "docs" / "images"
VIEWPORT = {"width": 1400, "height": 900}
# Far longer than the capture needs, then cancelled: the live view is caught whatever the machine's speed.
LIVE_RUN = {"Input length": 64, "Output length": 128, "Number of prompts": 400, "Concurrency": 4}
LIVE_CHARTS = ("live_first_histogram", "live_itl_histogram", "live_throughput")
LIVE_REQUESTS_SHOWN = 24  # requests done before the capture, so the histograms have a shape
ENDED_RUN = {"Input length": 64, "Output length": 64, "Number of prompts": 48, "Concurrency": 4}
# A busy 2-core machine gets minutes for each wait: a click, a rerun, a run.
STEP_TIMEOUT_MS = 120_000
RUN_TIMEOUT_MS = 600_000
COMPARED_CONCURRENCIES = (2, 8)  # two: every column of the side-by-side table fits the window
COMPARED_RUN_TIMEOUT_S = 300
# A 256-colour palette keeps a screenshot of flat page colours a fraction of its RGB size.
PALETTE_COLOURS = 256
LIVE_PROGRESS = re.compile(r"running: (\d+)/")  # the progress line: "running: 12/400 requests, ..."
POLL_S = 0.5


def save(page: Page, name: str) -> Path:
    page.mouse.move(0, 0)  # no chart toolbar or tooltip under the pointer
    path = IMAGES / name
    page.screenshot(path=path)
    Image.open(path).convert("RGB").quantize(PALETTE_COLOURS).save(path, optimize=True)
    print(f"wrote {path.relative_to(ROOT)} ({path.stat().st_size // 1024} KiB)")
    return path


def live_run(page: Page) -> None:
    start_run(page, "live", dataset="random", numbers=LIVE_RUN)
    charts = [page.locator(f".st-key-{key} .main-svg").first for key in LIVE_CHARTS]
    for chart in charts:
        expect(chart).to_be_visible(timeout=RUN_TIMEOUT_MS)
    progress = page.get_by_test_id("stProgress").first
    deadline = time.monotonic() + RUN_TIMEOUT_MS / 1000
    while not ((done := LIVE_PROGRESS.search(progress.inner_text())) and int(done[1]) >= LIVE_REQUESTS_SHOWN):
        if time.monotonic() > deadline:
            raise SystemExit(f"the live run did not reach {LIVE_REQUESTS_SHOWN} requests: {progress.inner_text()!r}")
        time.sleep(POLL_S)
    progress.evaluate("e => e.scrollIntoView()")  # the progress line at the top, the live charts below it
    for chart in charts:  # drawn again where the scroll brought them into view
        expect(chart).to_be_visible(timeout=RUN_TIMEOUT_MS)
    save(page, "run-live.png")
    sidebar(page).get_by_role("button", name="Cancel").click()
    expect(page.get_by_text(re.compile(r"^cancelled: \d"))).to_be_visible(timeout=RUN_TIMEOUT_MS)


def ended_run(page: Page) -> None:
    start_run(page, "ended", dataset="random", numbers=ENDED_RUN)
    prompts = ENDED_RUN["Number of prompts"]
    expect(page.get_by_text(f"finished: {prompts}/{prompts} requests succeeded")).to_be_visible(timeout=RUN_TIMEOUT_MS)
    expect(page.locator(".st-key-ended_throughput .main-svg").first).to_be_visible(timeout=RUN_TIMEOUT_MS)
    save(page, "run-ended.png")


def record_compared_runs(results: Path) -> dict[str, str]:
    """Runs of the tiny model that differ only in concurrency, recorded into the served history."""
    runner = Runner(History(results))
    try:
        runs = [runner.submit(tiny_run(concurrency)) for concurrency in COMPARED_CONCURRENCIES]
        for run in runs:
            if not (run.wait(COMPARED_RUN_TIMEOUT_S) and run.state == RunState.FINISHED):
                raise SystemExit(f"a compared run did not finish: {run.state}: {run.message}")
    finally:
        runner.shutdown()
    return {run.run_id: f"compare c{concurrency}" for run, concurrency in zip(runs, COMPARED_CONCURRENCIES)}


def main() -> int:
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # stop the server and browser on the way out
    if not os.access(CHROMIUM, os.X_OK):
        print(f"no chromium at {CHROMIUM}: install Debian's chromium package", file=sys.stderr)
        return 2
    IMAGES.mkdir(parents=True, exist_ok=True)
    resolve_model(TINY_MODEL)  # built before the server first asks for it
    with tempfile.TemporaryDirectory(prefix="screenshots-") as folder:
        port = free_port()
        env = {**os.environ, "BENCH_STUDIO_RESULTS": str(Path(folder) / "results"), "PYTHONUNBUFFERED": "1"}
        with serve(streamlit_command(port), env, port, Path(folder)) as server, sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            page = browser.new_page(base_url=server.url, viewport=VIEWPORT)
            page.set_default_timeout(STEP_TIMEOUT_MS)
            expect.set_options(timeout=STEP_TIMEOUT_MS)
            open_run_page(page)
            choose_model(page, TINY_MODEL)
            live_run(page)
            ended_run(page)
            compare_in_history(page, record_compared_runs(server.results))
            save(page, "history-compare.png")
            browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
