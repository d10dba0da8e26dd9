"""The Run page's "Run again with one thing changed" in a real browser, at 1,600 px: a multi-turn run that ended
without prefix caching is run again with it on from its Run page, in the one box the page offers above its results,
and once the new run has ended History opens the two compared against the ended run. The comparison's numbers are read
from the grid's accessible table and checked against the history; screenshots of the box and of the comparison go to
artifacts/e2e/.
"""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect
from test_browser import FIRST_CHART_TIMEOUT_MS
from test_history_compare_browser import HEADERS_JS, ROWS_JS, WINDOW_1600

from bench_core.config import config_from_values
from bench_core.run.runner import Runner
from bench_core.store.history import History
from bench_core.views.report import BASELINE
from bench_core.views.tables import describe_column, format_change, format_number

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

MODEL = "builtin:tiny-llama"
RUN_TIMEOUT_S = 180
NEW_RUN_TIMEOUT_MS = 240_000  # the engine loads again (a knob changed), then the run, on a busy machine
# Four conversations of four turns, each turn resending the ones before: what prefix caching saves shows per turn.
MULTI_TURN = {
    "model": MODEL,
    "dataset_name": "multi-turn",
    "num_prompts": 4,
    "turns": 4,
    "sharegpt_output_len": 16,
    "load_pattern": "concurrency",
    "concurrency": 4,
    "stream_output": True,
}
COMPARED = ("mean_ttft_ms", "mean_ttft_turn2_ms", "mean_ttft_turn4_ms", "output_throughput")


@pytest.fixture
def multi_turn_run(app_server) -> str:
    """A finished multi-turn run without prefix caching in the served history."""
    runner = Runner(History(app_server.results))
    try:
        run = runner.submit(config_from_values(MULTI_TURN, label="chat"))
        assert run.wait(RUN_TIMEOUT_S) and run.state == "finished", run.message
    finally:
        runner.shutdown()
    return run.run_id


def test_run_again_with_prefix_caching_on_opens_both_runs_compared_against_the_ended_one(
    page: Page, multi_turn_run, app_server, artifacts
):
    page.set_viewport_size(WINDOW_1600)
    page.goto(f"/?run={multi_turn_run}")
    box = page.locator(".st-key-run_again")
    expect(box).to_be_visible(timeout=FIRST_CHART_TIMEOUT_MS)
    # The knob a preset shows first, switched over from the run's own value.
    expect(box.get_by_role("combobox", name="Setting to change")).to_have_value("Enable prefix caching")
    expect(box).to_contain_text("This run: no")
    expect(box.get_by_role("checkbox", name="--enable-prefix-caching")).to_be_checked()
    # The run's results drawn beneath it, for the screenshot.
    expect(page.locator(".st-key-ended_timeline .main-svg").first).to_be_visible(timeout=FIRST_CHART_TIMEOUT_MS)
    expect(page.locator("[data-stale='true']")).to_have_count(0)
    page.mouse.move(0, 0)
    page.screenshot(path=artifacts / "run_again_prefix_caching_on.png")
    # The served history is the whole session's: other browser tests' runs are in it too.
    before = set(History(app_server.results).load(columns=["run_id"])["run_id"].astype(str))
    box.get_by_role("button", name="Start").click()

    heading = page.get_by_role("heading", name="Compare 2 runs")
    expect(heading).to_be_visible(timeout=NEW_RUN_TIMEOUT_MS)
    expect(page.get_by_role("heading", name="History", exact=True)).to_be_visible()
    runs = History(app_server.results).load().set_index("run_id")
    (again,) = [run_id for run_id in runs.index.astype(str) if run_id not in before]
    assert runs.loc[again, "label"] == "chat · enable_prefix_caching=true"
    expect(page.locator("[data-stale='true']")).to_have_count(0, timeout=FIRST_CHART_TIMEOUT_MS)

    # The table against the baseline, as a screen reader reads it: the ended run first, then the new run's value and
    # its change in % for each metric, per turn too.
    compare = page.get_by_test_id("stDataFrame").nth(1)  # after the runs table
    compare.scroll_into_view_if_needed()
    expect(compare.locator("thead th")).to_have_count(3)
    assert compare.evaluate(HEADERS_JS) == ["run", f"chat ({BASELINE})", "chat · enable_prefix_caching=true"]
    rows = {cells[0]: cells[1:] for cells in compare.evaluate(ROWS_JS)}
    assert rows[describe_column("enable_prefix_caching").title] == ["no", "yes"]
    for metric in COMPARED:
        before, after = runs.loc[[multi_turn_run, again], metric].astype(float)
        assert rows[describe_column(metric).title] == [
            format_number(before),
            f"{format_number(after)} ({format_change(after, before)})",
        ], metric
    expect(page.get_by_test_id("stException")).to_have_count(0)

    page.mouse.move(0, 0)
    heading.evaluate("e => e.scrollIntoView()")
    page.screenshot(path=artifacts / "run_again_compared_charts.png")
    compare.evaluate("e => e.scrollIntoView()")
    page.screenshot(path=artifacts / "run_again_compared_table.png")
