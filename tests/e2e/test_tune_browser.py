"""A small tune on the tiny model in a real browser: the Sweep page's Tune mode, the sidebar's SLO kept as a bound,
its progress refreshing by itself in trials until it ends, then the best point, the command that runs it again, the
front drawn by Plotly with the bound and the best trial, found again after a reload through the id in the URL."""

from __future__ import annotations

import re
from urllib.parse import urlencode

import pytest
from playwright.sync_api import Page, expect
from test_browser import FIRST_CHART_TIMEOUT_MS, TINY_MODEL, choose_model, wait_for_script_run

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

SIDEBAR = {"dataset_builtin": "builtin:sample", "slo_ttft_ms": 60_000}
TRIALS, SPACE = 4, 6  # concurrency 1,2,4 × prefix caching off and on
RUN_SIZE = {"Prompts per run": 4, "Output tokens per request": 8, "Trials": TRIALS}
TUNE_END_TIMEOUT_MS = 180_000
WIDE = {"width": 1600, "height": 1800}


def test_a_small_tune_runs_live_then_shows_its_best_point_front_and_command_and_survives_a_reload(
    page: Page, artifacts
):
    page.set_viewport_size(WIDE)
    page.goto(f"/sweep?{urlencode(SIDEBAR)}")
    main = page.get_by_test_id("stMain")
    expect(page.get_by_role("heading", name="Knob sweep")).to_be_visible(timeout=FIRST_CHART_TIMEOUT_MS)
    choose_model(page, TINY_MODEL)
    main.get_by_role("radio", name="Tune", exact=True).check(force=True)
    expect(main.get_by_text("Keep every trial within the sidebar's SLO: p99_ttft_ms<=60000")).to_be_visible()
    for label, value in RUN_SIZE.items():
        box = main.get_by_role("spinbutton", name=label, exact=True)
        box.fill(str(value))
        box.press("Enter")
        expect(box).to_have_value(str(value))
    expect(main.get_by_text(re.compile(rf"at most {TRIALS} of the space's {SPACE} points"))).to_be_visible()
    wait_for_script_run(page)

    main.get_by_role("button", name="Start sweep").click()
    page.wait_for_url(re.compile(r"[?&]sweep=tune-"))
    tune_id = re.search(r"[?&]sweep=([^&#]+)", page.url).group(1)
    expect(page.get_by_test_id("stProgress")).to_contain_text(re.compile(rf"running: \d/{TRIALS} trials done"))
    # Nothing is clicked from here on: the page polls the tune until it ends.
    expect(page.get_by_text(f"finished: all {TRIALS} trials.")).to_be_visible(timeout=TUNE_END_TIMEOUT_MS)
    expect(main.get_by_text(re.compile(r"^Best: concurrency="))).to_be_visible()
    expect(main.get_by_text(f"Tried {TRIALS} of the space's {SPACE} points")).to_be_visible()
    expect(main.get_by_test_id("stCode").first).to_contain_text("python -m bench_core pipeline builtin:sample")
    expect(page.locator(".st-key-tune_chart_front .main-svg").first).to_be_visible(timeout=FIRST_CHART_TIMEOUT_MS)
    expect(page.get_by_test_id("stException")).to_have_count(0)
    page.get_by_role("heading", name=f"Sweep {tune_id}").evaluate("e => e.scrollIntoView()")
    page.mouse.move(0, 0)
    page.screenshot(path=artifacts / "tune-finished.png")

    page.reload()
    expect(page.get_by_text(re.compile(r"^Best: concurrency="))).to_be_visible(timeout=FIRST_CHART_TIMEOUT_MS)
    expect(page.locator(".st-key-tune_chart_front .main-svg").first).to_be_visible(timeout=FIRST_CHART_TIMEOUT_MS)
    expect(page.get_by_test_id("stException")).to_have_count(0)
