"""A small sweep on the tiny model in a real browser: set up from the sidebar and the sweep inputs, its
progress refreshing by itself until the sweep ends, the views drawn by Plotly, and the sweep found again
after a reload through the id in the URL.

What AppTest cannot show is checked here: `run_every` polling driven by the browser (nothing is clicked
between Start and the end of the sweep) and the charts really drawn.

Then a capacity search started from the page: the sidebar's server settings and SLO from a link, the search and the
server it starts per probe chosen on the page, the probes' chart with the SLO, the search's bounds and the server's
settings written under its title. The server (tests/load_server.py, through sweep_cli.KNEE_SERVER) answers late
beyond KNEE requests in flight, so the highest concurrency within the SLO is KNEE on a machine however busy.
"""

from __future__ import annotations

import re
from urllib.parse import urlencode

import pytest
from playwright.sync_api import Page, expect
from test_browser import FIRST_CHART_TIMEOUT_MS, TINY_MODEL, choose_model, fill_number, wait_for_script_run

from tests.sweep_cli import KNEE, KNEE_SERVER, SLO_MS

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


# The openai backend, 8 prompts of ShareGPT's sample answered with 4 tokens each, a TTFT SLO: the sidebar's widgets, as
# a link sets them.
SIDEBAR = {
    "backend": "openai",
    "knob_tokenizer": TINY_MODEL,
    "dataset_builtin": "builtin:sample",
    "sharegpt_output_len_cpu": 4,
    "num_prompts_cpu": 8,
    "slo_ttft_ms": SLO_MS,
}
WIDE = {"width": 1600, "height": 1600}
SEARCH_END_TIMEOUT_MS = 180_000  # four probes, each starting its own server, on a busy machine


@pytest.mark.timeout(300)
def test_a_capacity_search_started_from_the_sweep_page_shows_the_highest_load_within_its_slo(page: Page, artifacts):
    page.set_viewport_size(WIDE)
    page.goto(f"/sweep?{urlencode(SIDEBAR)}")
    main = page.get_by_test_id("stMain")
    expect(page.get_by_role("heading", name="Knob sweep")).to_be_visible(timeout=FIRST_CHART_TIMEOUT_MS)
    main.get_by_role("radio", name="Find the highest load within the SLO", exact=True).check(force=True)
    main.get_by_role("checkbox", name="Start a server for every run").check(force=True)
    command = main.get_by_role("textbox", name="Server command")
    command.fill(KNEE_SERVER)
    command.press("Enter")
    knee = main.get_by_role("textbox", name="{knee} (fixed)")
    knee.fill(str(KNEE))
    knee.press("Enter")
    main.get_by_role("combobox", name="Search for the highest").click()
    page.get_by_role("option", name=re.compile(r"^max_concurrency")).click()
    expect(
        main.get_by_text(f"Good requests: TTFT ≤ {SLO_MS:,} ms, as set under Goodput SLO in the sidebar.")
    ).to_be_visible()
    expect(
        main.get_by_text(re.compile(r"at most 320 requests and 1,280 output tokens; no duration estimate"))
    ).to_be_visible()
    wait_for_script_run(page)
    page.mouse.move(0, 0)
    page.screenshot(path=artifacts / "sweep-find-max-before-start.png")

    main.get_by_role("button", name="Start sweep").click()
    page.wait_for_url(re.compile(r"[?&]sweep=sweep-"))
    expect(page.get_by_text("finished: all 4 probes.")).to_be_visible(timeout=SEARCH_END_TIMEOUT_MS)
    expect(main.get_by_text(f"Highest max_concurrency meeting the target: {KNEE}")).to_be_visible()
    chart = page.locator("[class*='st-key-sweep_chart_find_max'] .main-svg").first
    expect(chart).to_be_visible(timeout=FIRST_CHART_TIMEOUT_MS)
    probes = page.locator("[class*='st-key-sweep_chart_find_max']")
    for line in (
        f"Good requests: TTFT ≤ {SLO_MS:,} ms; target attainment 0.9",
        "Search: max_concurrency from 1 up to 8, within 10%, at most 40 probes",
        f"A server started per run, with knee={KNEE}",
    ):
        expect(probes.get_by_text(line)).to_be_visible()
    expect(probes.get_by_text(f"Highest load meeting it: {KNEE}")).to_be_visible()  # the legend
    expect(page.get_by_test_id("stException")).to_have_count(0)
    # For the screenshot: the sweep's heading at the top, its chart and probes below.
    page.get_by_role("heading", name=re.compile(r"^Sweep sweep-")).evaluate("e => e.scrollIntoView()")
    page.mouse.move(0, 0)
    page.screenshot(path=artifacts / "sweep-find-max-result.png")
