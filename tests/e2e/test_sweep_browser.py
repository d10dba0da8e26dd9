"""A small sweep on the tiny model in a real browser: set up from the sidebar and the sweep inputs, its
progress refreshing by itself until the sweep ends, the views drawn by Plotly, and the sweep found again
after a reload through the id in the URL.

What AppTest cannot show is checked here: `run_every` polling driven by the browser (nothing is clicked
between Start and the end of the sweep) and the charts really drawn.
"""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, expect
from test_browser import FIRST_CHART_TIMEOUT_MS, TINY_MODEL, choose_model, fill_number

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

# 3 points x 2 repeats of 8 prompts x 16 tokens: several seconds in all, so the running state is seen.
VALUES, REPEATS, RUNS = "1,2,4", 2, 6
SIDEBAR_NUMBERS = {"Concurrency": 2}
RUN_SIZE = {"Prompts per run": 8, "Output tokens per request": 16}
SWEEP_END_TIMEOUT_MS = 120_000
VIEW_KEYS = ("sweep_chart_band", "sweep_chart_pareto")


def test_a_small_sweep_runs_live_then_shows_its_views_and_survives_a_reload(page: Page, artifacts):
    page.goto("/sweep")
    main = page.get_by_test_id("stMain")
    expect(page.get_by_role("heading", name="Knob sweep")).to_be_visible(timeout=FIRST_CHART_TIMEOUT_MS)
    choose_model(page, TINY_MODEL)
    for label, value in SIDEBAR_NUMBERS.items():
        fill_number(page, label, value)
    values = main.get_by_role("textbox", name="Values").first
    values.fill(VALUES)
    values.press("Enter")
    for label, value in {"Repeats": REPEATS, **RUN_SIZE}.items():
        box = main.get_by_role("spinbutton", name=label)
        box.fill(str(value))
        box.press("Enter")
        expect(box).to_have_value(str(value))

    main.get_by_role("button", name="Start sweep").click()
    page.wait_for_url(re.compile(r"[?&]sweep=sweep-"))
    sweep_id = re.search(r"[?&]sweep=([^&#]+)", page.url).group(1)
    expect(page.get_by_role("heading", name=f"Sweep {sweep_id}")).to_be_visible()
    expect(main.get_by_role("button", name="Cancel sweep")).to_be_enabled()
    progress = page.get_by_test_id("stProgress")
    expect(progress).to_contain_text(re.compile(rf"running: \d/{RUNS} runs done"))
    # Nothing is clicked from here on: the page polls the sweep until it ends.
    expect(page.get_by_text(f"finished: all {RUNS} runs.")).to_be_visible(timeout=SWEEP_END_TIMEOUT_MS)
    expect(main.get_by_role("button", name="Cancel sweep")).to_be_disabled()
    for key in VIEW_KEYS:
        expect(page.locator(f".st-key-{key} .main-svg").first).to_be_visible(timeout=FIRST_CHART_TIMEOUT_MS)
    expect(main.get_by_text("Compare two points")).to_be_visible()
    page.screenshot(path=artifacts / "sweep-finished.png")

    page.reload()
    expect(page.get_by_role("heading", name=f"Sweep {sweep_id}")).to_be_visible(timeout=FIRST_CHART_TIMEOUT_MS)
    expect(page.get_by_text(f"finished: all {RUNS} runs.")).to_be_visible()
    expect(page.locator(".st-key-sweep_chart_band .main-svg").first).to_be_visible(timeout=FIRST_CHART_TIMEOUT_MS)
    expect(page.get_by_test_id("stException")).to_have_count(0)
