"""History in a real browser: two real runs of the tiny model that differ only in concurrency, selected in
the runs table, are compared starting with what differs between them: concurrency with both values, nothing
else. The test's folder keeps a screenshot of the comparison for a reader.

What AppTest cannot show is checked here: the rows ticked in the grid by a click, the summary as the browser
lays it out above the charts, and the charts drawn.
"""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect
from test_browser import FIRST_CHART_TIMEOUT_MS, dataframe_with_cell, select_grid_row

from bench_core.config import DatasetConfig, EngineConfig, LoadConfig, RunConfig
from bench_core.store.history import History
from bench_core.run.runner import Runner

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

CONCURRENCIES = (2, 4)
RUN_TIMEOUT_S = 120


def tiny_run(concurrency: int) -> RunConfig:
    return RunConfig(
        engine=EngineConfig(backend="transformers", model="builtin:tiny-llama"),
        dataset=DatasetConfig(dataset="builtin:sample", dataset_name="random", num_prompts=8,
                              random_input_len=16, random_output_len=16, random_range_ratio=1.0),
        load=LoadConfig(concurrency=concurrency, stream_output=True),
        label=f"compare c{concurrency}",
    )


@pytest.fixture
def two_runs(app_server) -> list[str]:
    """Two finished runs in the served history, the same in everything but concurrency."""
    runner = Runner(History(app_server.results))
    try:
        runs = [runner.submit(tiny_run(concurrency)) for concurrency in CONCURRENCIES]
        for run in runs:
            assert run.wait(RUN_TIMEOUT_S) and run.state == "finished", run.message
    finally:
        runner.shutdown()
    return [run.run_id for run in runs]


def test_comparing_two_runs_names_the_one_setting_that_differs(page: Page, two_runs, tmp_path):
    page.goto("/history")
    expect(page.get_by_role("heading", name="History", exact=True)).to_be_visible(timeout=FIRST_CHART_TIMEOUT_MS)
    runs = dataframe_with_cell(page, two_runs[0])
    for run_id in two_runs:
        select_grid_row(runs, run_id)
    heading = page.get_by_role("heading", name="Compare 2 runs")
    expect(heading).to_be_visible()

    summary = page.locator(".st-key-compare_differences")
    expect(summary).to_contain_text("What differs between these runs")
    rows = summary.locator("tbody tr")
    expect(rows).to_have_count(1)
    cells = [text.strip() for text in rows.first.locator("th, td").all_inner_texts()]
    assert cells == ["Concurrency (requests)", *(str(c) for c in CONCURRENCIES)]
    headers = [text.strip() for text in summary.locator("thead th").all_inner_texts()]
    assert headers[1:] == [f"compare c{c}" for c in CONCURRENCIES]
    # The summary comes first: above the charts of the comparison.
    chart = page.locator(".st-key-chart_metric_vs_knob .main-svg").first
    expect(chart).to_be_visible(timeout=FIRST_CHART_TIMEOUT_MS)
    assert summary.bounding_box()["y"] < chart.bounding_box()["y"]
    expect(page.get_by_role("combobox", name="Setting across")).to_have_value("Concurrency (requests)")
    expect(page.locator(".st-key-chart_latency_vs_throughput .main-svg").first).to_be_visible()
    expect(page.get_by_test_id("stException")).to_have_count(0)

    heading.evaluate("e => e.scrollIntoView()")
    page.mouse.move(0, 0)
    page.screenshot(path=tmp_path / "history_compare.png")
