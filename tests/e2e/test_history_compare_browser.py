"""History in a real browser: two real runs of the tiny model that differ only in concurrency, selected in
the runs table, are compared starting with what differs between them: concurrency with both values, nothing
else. The test's folder keeps a screenshot of the comparison for a reader. Five runs at a 1,600 px window, the
History page opened by its URL: the runs table's first view showing each run's workload, load and key results,
legends clear of every title with each entry whole, the run id pinned in the runs table when it scrolls, and the
table against the baseline whole in view, its values and changes in % read from the grid's accessible table;
screenshots of that comparison go to artifacts/e2e/.

What AppTest cannot show is checked here: the rows ticked in the grid by a click, the summary as the browser
lays it out above the charts, the charts drawn, and what a scrolled grid keeps in view.
"""

from __future__ import annotations

import math

import pytest
from compared_runs import FIVE, NOT_STREAMED, record_five_runs
from playwright.sync_api import Page, expect
from test_browser import FIRST_CHART_TIMEOUT_MS, dataframe_with_cell, select_grid_row

from bench_core.config import DatasetConfig, EngineConfig, LoadConfig, RunConfig
from bench_core.measure.catalog import KEY_COLUMNS
from bench_core.run.runner import Runner
from bench_core.store.history import History
from bench_core.views.report import BASELINE
from bench_core.views.tables import describe_column, format_change, format_number

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

CONCURRENCIES = (2, 4)
RUN_TIMEOUT_S = 120


def tiny_run(concurrency: int) -> RunConfig:
    return RunConfig(
        engine=EngineConfig(backend="transformers", model="builtin:tiny-llama"),
        dataset=DatasetConfig(
            dataset="builtin:sample",
            dataset_name="random",
            num_prompts=8,
            random_input_len=16,
            random_output_len=16,
            random_range_ratio=1.0,
        ),
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
    assert headers[1:] == [f"Concurrency {c} (compare c{c})" for c in CONCURRENCIES]
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


# The window five compared runs were unreadable at (issue 39): only the colours of cells cut off showed.
WINDOW_1600 = {"width": 1600, "height": 1600}
COMPARE_CHARTS = ("chart_metric_vs_knob", "chart_latency_vs_throughput", "chart_cdf_ttft", "chart_cdf_itl")
# The grid's accessible table lists the columns in view: it changes when the grid has scrolled and redrawn.
HEADERS_JS = "grid => Array.from(grid.querySelectorAll('thead th')).map(th => th.textContent.trim())"
ROWS_JS = """grid => Array.from(grid.querySelectorAll('tbody tr')).map(
    tr => Array.from(tr.querySelectorAll('th, td')).map(cell => cell.textContent.trim()))"""
# How far a grid scrolls sideways: 0 when every column is in view.
SIDEWAYS_JS = "grid => { const box = grid.querySelector('.dvn-scroller'); return box.scrollWidth - box.clientWidth; }"
# The left of the runs table that its pinned column covers: the row markers and the run id, short of its right
# edge, where the grid draws a shadow once scrolled.
RUN_ID_STRIP_PX = 180
SCROLLBAR_PX = 20
SCROLL_RIGHT_JS = "box => { box.scrollLeft = box.scrollWidth; return box.scrollLeft; }"


@pytest.fixture
def five_runs(app_server) -> list[str]:
    """compared_runs' five runs in the served history: ShareGPT and random prompts, three concurrencies, one run
    not streamed."""
    return record_five_runs(app_server.results)


def _overlaps(a: dict, b: dict) -> bool:
    return (
        a["x"] < b["x"] + b["width"]
        and b["x"] < a["x"] + a["width"]
        and a["y"] < b["y"] + b["height"]
        and b["y"] < a["y"] + a["height"]
    )


def _left_strip(grid, width_px: int) -> bytes:
    """A screenshot of the grid's left `width_px`, above where a scrollbar shows."""
    box = grid.bounding_box()
    return grid.page.screenshot(
        clip={"x": box["x"], "y": box["y"], "width": width_px, "height": box["height"] - SCROLLBAR_PX}
    )


def _scroll_right(grid) -> None:
    """Scroll a grid to its last column and wait until it has redrawn its accessible table."""
    before = grid.evaluate(HEADERS_JS)
    assert grid.locator(".dvn-scroller").first.evaluate(SCROLL_RIGHT_JS) > 0, "the grid has nothing to scroll"
    grid.page.wait_for_function(
        f"([grid, before]) => ({HEADERS_JS})(grid).join() !== before.join()", arg=[grid.element_handle(), before]
    )


@pytest.mark.timeout(600)
def test_comparing_five_runs_keeps_legends_clear_of_titles_and_every_value_and_change_in_view(
    page: Page, five_runs, app_server, artifacts
):
    page.set_viewport_size(WINDOW_1600)
    page.goto("/history")
    expect(page.get_by_role("heading", name="History", exact=True)).to_be_visible(timeout=FIRST_CHART_TIMEOUT_MS)
    runs = dataframe_with_cell(page, five_runs[0])
    # The first view at this width: which run, its workload and load, and the key results (the last of them whole, the
    # column after it in view too), none scrolled to; at first the dataset file, the labels and the flags' sentences
    # filled it.
    headers = runs.evaluate(HEADERS_JS)
    wanted = [describe_column(name).header for name in ("dataset_name", "concurrency", *KEY_COLUMNS[:5])]
    assert [header for header in headers if header in wanted] == wanted, headers

    # The runs table scrolled to its last column still shows which row is which: its left, the ids, is unmoved.
    page.mouse.move(0, 0)
    ids = _left_strip(runs, RUN_ID_STRIP_PX)
    _scroll_right(runs)
    assert _left_strip(runs, RUN_ID_STRIP_PX) == ids
    for run_id in five_runs:
        select_grid_row(runs, run_id)
    heading = page.get_by_role("heading", name="Compare 5 runs")
    expect(heading).to_be_visible()
    # Each tick reran the page: what the run with four drew goes once the rerun with five has drawn.
    expect(page.locator("[data-stale='true']")).to_have_count(0, timeout=FIRST_CHART_TIMEOUT_MS)

    for key in COMPARE_CHARTS:
        chart = page.locator(f".st-key-{key}")
        chart.scroll_into_view_if_needed()
        legend = chart.locator("g.legend").first
        expect(legend).to_be_visible(timeout=FIRST_CHART_TIMEOUT_MS)
        box = legend.bounding_box()
        for above in (".gtitle", ".gtitle-subtitle", ".xtitle"):  # the title, its notes, the axis title
            for element in chart.locator(above).all():
                assert not _overlaps(box, element.bounding_box()), (key, above)
        assert box["y"] > chart.locator(".xtitle").first.bounding_box()["y"], key  # under the plot
        # Each entry, a run's settings then its id, whole inside the figure (in a line or more).
        figure = chart.locator(".main-svg").first.bounding_box()
        for entry in chart.locator("g.legend .legendtext").all():
            text = entry.bounding_box()
            assert figure["x"] <= text["x"] and text["x"] + text["width"] <= figure["x"] + figure["width"], (
                key,
                entry.text_content(),
            )
    notes = page.locator(".st-key-chart_latency_vs_throughput .gtitle-subtitle")
    expect(notes).to_contain_text("Not streamed, so no P99 time to first token")
    expect(notes).to_contain_text(five_runs[NOT_STREAMED])

    # The table against the baseline (the oldest run) at this width: every run's column in view, nothing to scroll,
    # and in its cells, as a screen reader reads them, each run's value and its change in % against the baseline's.
    dataframe_with_cell(page, describe_column("output_throughput").title)
    compare = page.get_by_test_id("stDataFrame").nth(1)  # after the runs table: a locator that outlives a redraw
    compare.scroll_into_view_if_needed()
    assert compare.evaluate(HEADERS_JS) == ["run", f"{five_runs[0]} ({BASELINE})", *five_runs[1:]]
    assert compare.evaluate(SIDEWAYS_JS) <= 0
    rows = {cells[0]: cells[1:] for cells in compare.evaluate(ROWS_JS)}
    assert rows["Concurrency (requests)"] == [str(concurrency) for _, concurrency, _ in FIVE]
    recorded = History(app_server.results).load().set_index("run_id").loc[five_runs]
    for metric in ("output_throughput", "mean_e2e_ms", "mean_ttft_ms"):
        values = recorded[metric].astype(float).tolist()
        expected = [format_number(values[0])] + [
            format_number(value) if math.isnan(value) else f"{format_number(value)} ({format_change(value, values[0])})"
            for value in values[1:]
        ]
        assert rows[describe_column(metric).title] == expected, metric
    assert rows[describe_column("mean_ttft_ms").title][NOT_STREAMED] == "-"
    page.mouse.move(0, 0)
    heading.evaluate("e => e.scrollIntoView()")
    page.screenshot(path=artifacts / "history_compare_5_runs_charts.png")
    compare.evaluate("e => e.scrollIntoView()")
    page.screenshot(path=artifacts / "history_compare_5_runs_table.png")
    expect(page.get_by_test_id("stException")).to_have_count(0)
