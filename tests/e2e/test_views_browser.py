"""Tables and histograms that read without squinting, and the default sweep, in a real browser.

What AppTest cannot show is checked here: a table's box holds all its rows (the grid does not scroll),
Plotly draws the histograms' notes, and the Sweep page's default sweep runs to its end with an estimate
before Start and a time left while it runs.
"""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import Locator, Page, expect
from profiled_runs import recorded_history
from test_browser import FIRST_CHART_TIMEOUT_MS, TINY_MODEL, choose_model, dataframe_with_cell

from bench_core.measure.profiler import Profiler, Session

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

STALLED_RUN_ID = "20260101-000000-e2e1"
REQUESTS, OUTPUT_LEN, STALLS = 16, 32, 3
DEFAULT_SWEEP_RUNS = 6
SWEEP_END_TIMEOUT_MS = 150_000
DEFAULT_BOX_ROWS = 10  # st.dataframe's own box shows about this many rows


def stalled_run() -> Profiler:
    """16 requests whose first tokens came within 0.03 ms of each other (one batch step), then gaps of about
    100 ms, three of them stalled for 10 to 13 s."""
    prof = Profiler(True, [50, 75, 95, 99])
    prof.start(0.0)
    end = 0.0
    for index in range(REQUESTS):
        session = prof.new_session(10, OUTPUT_LEN)
        session.tick_at(0, 0.0)
        time = 4.58243 + index * 0.000002
        session.tick_at(1, time)
        for n in range(2, OUTPUT_LEN + 1):
            stalled = index < STALLS and n == OUTPUT_LEN // 2
            time += 10.0 + index if stalled else 0.1 + 0.002 * ((7 * n + index) % 10)
            session.tick_at(n, time)
        session.finish(Session.SUCCESS, timestamp=time)
        end = max(end, time)
    prof.finish(end + 0.1)
    return prof


def scroll_to(target: Locator, tries: int = 5) -> None:
    """Scroll `target` into view; a Streamlit rerun may swap the element out mid-scroll, and the locator then
    finds its replacement on the next try."""
    for _ in range(tries - 1):
        try:
            target.scroll_into_view_if_needed()
            return
        except PlaywrightError as exc:
            if "not attached" not in str(exc):
                raise
    target.scroll_into_view_if_needed()


def all_rows_in_view(grid: Locator) -> bool:
    """The grid's box holds every row: its scroller has nothing below the fold."""
    return grid.locator(".dvn-scroller").first.evaluate("box => box.scrollHeight <= box.clientHeight + 2")


def test_histograms_say_when_values_are_nearly_equal_or_stalled_and_tables_show_every_row(
    page: Page, app_server, artifacts
):
    recorded_history(app_server.results, [(STALLED_RUN_ID, "transformers", REQUESTS, stalled_run())])
    page.goto(f"/?run={STALLED_RUN_ID}")  # the Run page is the default one, at the root
    first = page.locator(".st-key-ended_first")
    second = page.locator(".st-key-ended_second")
    expect(first.locator(".main-svg").first).to_be_visible(timeout=FIRST_CHART_TIMEOUT_MS)
    expect(first).to_contain_text(re.compile(r"All 16 requests within 0\.0\d+ ms \(4,582\.43\d to 4,582\.46\d ms\)"))
    expect(second).to_contain_text(
        re.compile(r"\d+ gaps above 1\d\d(\.\d+)? ms \(outliers\), up to 1\d,\d{3}(\.\d+)? ms")
    )
    expect(second).to_contain_text(re.compile(r"> 1\d\d"))  # the overflow bar's own label
    first.screenshot(path=artifacts / "histogram-near-equal.png")
    second.screenshot(path=artifacts / "histogram-stalls.png")

    requests = dataframe_with_cell(page, "req_output_len")
    requests.scroll_into_view_if_needed()
    expect(requests.locator("xpath=.//tr[td]")).to_have_count(REQUESTS)  # more than the default box holds
    assert REQUESTS > DEFAULT_BOX_ROWS and all_rows_in_view(requests)
    throughput = dataframe_with_cell(page, "Output throughput")
    assert all_rows_in_view(throughput)
    expect(dataframe_with_cell(page, "TTFT (ms)")).not_to_contain_text("None")


def test_the_default_sweep_says_how_long_it_takes_shows_time_left_and_finishes(page: Page, artifacts):
    page.goto("/sweep")
    main = page.get_by_test_id("stMain")
    expect(page.get_by_role("heading", name="Knob sweep")).to_be_visible(timeout=FIRST_CHART_TIMEOUT_MS)
    choose_model(page, TINY_MODEL)
    expect(main.get_by_text(re.compile(r"= 6 runs; .*takes about \d+"))).to_be_visible()

    main.get_by_role("button", name="Start sweep").click()
    page.wait_for_url(re.compile(r"[?&]sweep=sweep-"))
    progress = page.get_by_test_id("stProgress")
    expect(progress).to_contain_text(re.compile(rf"running: \d/{DEFAULT_SWEEP_RUNS} runs done.*, about \d+.* s left"))
    expect(page.get_by_text(f"finished: all {DEFAULT_SWEEP_RUNS} runs.")).to_be_visible(timeout=SWEEP_END_TIMEOUT_MS)

    scroll_to(main.get_by_text("Per point", exact=True))  # the grid lists its cells once in view
    points = dataframe_with_cell(page, "std")
    scroll_to(points)
    rows = points.locator("xpath=.//tr[td]").count()
    assert rows > DEFAULT_BOX_ROWS, rows  # several metrics for each of 3 points
    assert all_rows_in_view(points)
    scroll_to(main.get_by_text("Compare two points"))
    verdicts = dataframe_with_cell(page, "A mean")
    scroll_to(verdicts)
    assert all_rows_in_view(verdicts)
    page.screenshot(path=artifacts / "default-sweep-finished.png", full_page=True)
