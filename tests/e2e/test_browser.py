"""The dashboard in a real browser: a live run on the tiny model, a finished run's results and CSV, and
the History comparison of the two, as a user clicks through them.

What AppTest cannot show is checked here: `run_every` polling driven by the browser, Plotly drawing,
the download's bytes, table row selection. Nothing waits on a fixed delay: the live run is far longer
than the test needs it to be and is cancelled once two different live states have been seen.
"""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path

import pytest
from playwright.sync_api import Locator, Page, expect

from bench_core.store.history import History
from bench_core.store.history_import import SAVE_CSV_COLUMNS
from bench_core.views.report import BASELINE, UNJUDGED_NOTE

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

TINY_MODEL = "builtin:tiny-llama"
# Long enough to outlast any wait below on a slow machine (minutes on 2 cores); it is cancelled.
LIVE_RUN = {"Input length": 64, "Output length": 256, "Number of prompts": 400, "Concurrency": 2}
# ShareGPT with a fixed output length: every request generates exactly SHORT_OUTPUT_LEN tokens.
SHORT_PROMPTS, SHORT_OUTPUT_LEN = 16, 32
SHORT_RUN = {"Fixed output length (tokens)": SHORT_OUTPUT_LEN, "Number of prompts": SHORT_PROMPTS, "Concurrency": 4}
FIRST_CHART_TIMEOUT_MS = 60_000  # model load plus the first Plotly bundle on a busy machine
RUN_END_TIMEOUT_MS = 60_000
# Streamlit's data grid: rows and header are 35 px high, the row-selection checkboxes sit in the first 30 px.
GRID_ROW_PX, GRID_MARKER_X_PX = 35, 15

# Requests counted so far by a live histogram: the sum of its bar heights as Plotly drew them.
HISTOGRAM_COUNT_JS = """key => {
    const plot = document.querySelector(`.st-key-${key} .js-plotly-plot`);
    if (!plot || !plot._fullData || !plot._fullData.length) return 0;
    return Array.from(plot._fullData[0].y || []).reduce((sum, count) => sum + count, 0);
}"""


def test_app_opens_on_the_run_page_with_its_navigation(page: Page):
    open_run_page(page)
    navigation = page.get_by_test_id("stSidebarNav")
    for title in ("Run", "History", "Playground"):
        expect(navigation.get_by_role("link", name=title)).to_be_visible()
    expect(sidebar(page).get_by_role("button", name="Start")).to_be_enabled()
    expect(sidebar(page).get_by_role("button", name="Cancel")).to_be_disabled()
    expect(page.get_by_test_id("stException")).to_have_count(0)


def test_a_bad_dataset_path_is_one_error_and_the_app_keeps_working(page: Page):
    open_run_page(page)
    choose_model(page, TINY_MODEL)
    choose_radio(page, "Path")
    fill_text(page, "Dataset file path", "/no/such/sharegpt.json")
    sidebar(page).get_by_role("button", name="Start").click()
    error = page.get_by_test_id("stAlertContentError")
    expect(error).to_have_count(1)
    expect(error).to_contain_text("/no/such/sharegpt.json")
    expect(page.get_by_test_id("stException")).to_have_count(0)
    expect(sidebar(page).get_by_role("button", name="Start")).to_be_enabled()


def test_a_shared_prefix_workload_is_sampled_and_drawn_before_start(page: Page):
    open_run_page(page)
    choose_model(page, TINY_MODEL)
    choose_radio(page, "shared-prefix")
    fill_number(page, "Prefix length (tokens)", 64)
    fill_number(page, "Number of prompts", 8)
    page.get_by_text("Workload to be sent").click()
    expect(page).to_have_url(re.compile(r"prefix_len=64"))  # the last change reached the script (8 is the default)
    wait_for_script_run(page)
    page.get_by_role("button", name="Sample the workload").click()
    for n in (0, 1):  # the token lengths, then the prefix share
        expect(page.locator(f".st-key-preview_workload_{n} .main-svg").first).to_be_visible(
            timeout=FIRST_CHART_TIMEOUT_MS
        )
    expect(page.get_by_text(re.compile(r"^8 requests, tokenized with builtin:tiny-llama"))).to_be_visible()
    expect(page.get_by_test_id("stException")).to_have_count(0)


def test_live_run_then_finished_run_then_history_comparison(page: Page, app_server, artifacts):
    open_run_page(page)
    choose_model(page, TINY_MODEL)

    live_id = start_run(page, "live", dataset="random", numbers=LIVE_RUN)
    watch_live_updates(page)
    sidebar(page).get_by_role("button", name="Cancel").click()
    cancelled = re.compile(rf"^cancelled: \d+/{LIVE_RUN['Number of prompts']} requests succeeded")
    expect(page.get_by_text(cancelled)).to_be_visible(timeout=RUN_END_TIMEOUT_MS)

    short_id = start_run(page, "short", dataset="sharegpt", numbers=SHORT_RUN)
    expect(page.get_by_text(f"finished: {SHORT_PROMPTS}/{SHORT_PROMPTS} requests succeeded")).to_be_visible(
        timeout=RUN_END_TIMEOUT_MS
    )
    check_finished_view(page)
    page.screenshot(path=artifacts / "run-finished.png")
    check_lmdeploy_csv(page, History(app_server.results), short_id, artifacts)

    # The run is in the URL: a reload (a new browser session) shows the same finished run.
    page.reload()
    expect(page.get_by_role("heading", name=f"Run {short_id}")).to_be_visible()
    expect(page.get_by_text(f"finished: {SHORT_PROMPTS}/{SHORT_PROMPTS} requests succeeded")).to_be_visible()

    compare_in_history(page, {live_id: "live", short_id: "short"})
    page.screenshot(path=artifacts / "history-compare.png")
    expect(page.get_by_test_id("stException")).to_have_count(0)


# ---- steps ---------------------------------------------------------------------------------------


def start_run(page: Page, label: str, dataset: str, numbers: dict[str, int]) -> str:
    """Fill the sidebar, press Start and return the new run's id from the URL once its page shows it."""
    previous = run_id_in_url(page.url)
    fill_text(page, "Run label", label)
    choose_radio(page, dataset)
    for name, value in numbers.items():
        fill_number(page, name, value)
    sidebar(page).get_by_role("button", name="Start").click()
    page.wait_for_url(lambda url: run_id_in_url(url) not in (None, previous))
    run_id = run_id_in_url(page.url)
    expect(page.get_by_role("heading", name=f"Run {run_id}")).to_be_visible()
    # The caption says what was submitted: proof that every typed value reached the run.
    caption = page.get_by_test_id("stMain").get_by_text(re.compile(rf"^{label} · {TINY_MODEL} on transformers"))
    expect(caption).to_contain_text(f"{numbers['Number of prompts']} prompts")
    expect(caption).to_contain_text(f"concurrency {numbers['Concurrency']}")
    return run_id


def watch_live_updates(page: Page) -> None:
    """The live panel refreshes itself: the progress text and the TTFT histogram change with no input."""
    histogram = page.locator(".st-key-live_first_histogram .main-svg").first
    expect(histogram).to_be_visible(timeout=FIRST_CHART_TIMEOUT_MS)
    expect(page.locator(".st-key-live_itl_histogram .main-svg").first).to_be_visible()
    expect(page.locator(".st-key-live_throughput .main-svg").first).to_be_visible()
    progress = page.get_by_test_id("stProgress")
    first_text = progress.inner_text()
    assert first_text.startswith("running: ")
    expect(progress).not_to_have_text(first_text)
    counted = page.evaluate(HISTOGRAM_COUNT_JS, "live_first_histogram")
    page.wait_for_function(
        f"([key, before]) => ({HISTOGRAM_COUNT_JS})(key) > before", arg=["live_first_histogram", counted]
    )


def check_finished_view(page: Page) -> None:
    """LMDeploy's percentile table, the throughput table and both histograms of the finished run."""
    percentiles = dataframe_with_cell(page, "TTFT (ms)")
    for header in ("metric", "mean", "P50", "P99", "std", "min", "max"):
        expect(percentiles.get_by_role("columnheader", name=header, exact=True, include_hidden=True)).to_have_count(1)
    for row in ("End-to-end latency (ms)", "TTFT (ms)", "TPOT (ms)", "ITL (ms)"):
        expect(percentiles).to_contain_text(row)
    throughput = dataframe_with_cell(page, "Total output tokens")
    total_output = throughput.locator("xpath=.//tr[td[1][normalize-space()='Total output tokens']]/td[2]")
    expect(total_output).to_have_text(str(SHORT_PROMPTS * SHORT_OUTPUT_LEN))
    for key in ("ended_first", "ended_second", "ended_throughput"):
        expect(page.locator(f".st-key-{key} .main-svg").first).to_be_visible()


def check_lmdeploy_csv(page: Page, history: History, run_id: str, artifacts: Path) -> None:
    """The LMDeploy CSV download: LMDeploy's columns in order, every request completed, exact token totals."""
    with page.expect_download() as download:
        page.get_by_test_id("stDownloadButton").get_by_role("button", name="LMDeploy CSV").click()
    path = artifacts / download.value.suggested_filename
    download.value.save_as(path)
    assert path.name == f"run-{run_id}-lmdeploy.csv"
    reader = csv.DictReader(io.StringIO(path.read_text()))
    (row,) = list(reader)
    assert reader.fieldnames == list(SAVE_CSV_COLUMNS)
    assert int(row["num_prompts"]) == SHORT_PROMPTS
    assert int(row["completed"]) == SHORT_PROMPTS
    assert int(row["total_output_tokens"]) == SHORT_PROMPTS * SHORT_OUTPUT_LEN
    assert int(row["total_input_tokens"]) == history.requests(run_id)["input_len"].sum()
    assert float(row["duration"]) > 0


def compare_in_history(page: Page, labels: dict[str, str]) -> None:
    """Select the runs' rows on the History page (the oldest first): comparison charts and the table against the
    baseline appear."""
    sidebar(page).get_by_role("link", name="History").click()
    expect(page.get_by_role("heading", name="History", exact=True)).to_be_visible()
    runs = dataframe_with_cell(page, next(iter(labels)))
    for run_id in labels:
        select_grid_row(runs, run_id)
    expect(runs.locator("tr[aria-selected=true]")).to_have_count(len(labels))
    expect(page.get_by_role("heading", name=f"Compare {len(labels)} runs")).to_be_visible()
    for key in ("chart_metric_vs_knob", "chart_latency_vs_throughput", "chart_cdf_ttft", "chart_cdf_itl"):
        expect(page.locator(f".st-key-{key} .main-svg").first).to_be_visible(timeout=FIRST_CHART_TIMEOUT_MS)
    # The runs against the first (the oldest), each column headed by its label; the other's throughput with its
    # change in %, not coloured: each ran once, so nothing tells its noise.
    table = dataframe_with_cell(page, "Output throughput (tok/s)")
    baseline, *others = labels.values()
    for header in (f"{baseline} ({BASELINE})", *others):
        expect(table.get_by_role("columnheader", name=header, exact=True, include_hidden=True)).to_have_count(1)
    throughput = table.locator("xpath=.//tr[*[1][normalize-space()='Output throughput (tok/s)']]/td")
    expect(throughput.last).to_have_text(re.compile(r"^[\d,.]+ \([+-][\d,.]+ %\)$"))
    expect(page.get_by_text(UNJUDGED_NOTE)).to_be_visible()
    # For the screenshot: the comparison at the top of the view, no chart toolbar under the pointer.
    page.get_by_role("heading", name=f"Compare {len(labels)} runs").evaluate("e => e.scrollIntoView()")
    page.mouse.move(0, 0)


# ---- widgets -------------------------------------------------------------------------------------


def open_run_page(page: Page) -> None:
    page.goto("/")
    expect(page.get_by_role("heading", name="Run a benchmark")).to_be_visible(timeout=FIRST_CHART_TIMEOUT_MS)


def wait_for_script_run(page: Page) -> None:
    """Until the script run under way ends. A button press that lands while reruns of earlier edits follow each
    other can be superseded by one of them before the script reaches the button, and is then lost."""
    expect(page.get_by_test_id("stStatusWidgetRunningIcon")).to_have_count(0, timeout=FIRST_CHART_TIMEOUT_MS)


def sidebar(page: Page) -> Locator:
    return page.get_by_test_id("stSidebar")


def choose_radio(page: Page, option: str) -> None:
    # Streamlit draws its own circle over the native radio input, which playwright then sees as covered.
    sidebar(page).get_by_role("radio", name=option, exact=True).check(force=True)


def choose_model(page: Page, model: str) -> None:
    sidebar(page).get_by_role("combobox", name="Model").click()
    page.get_by_role("option", name=model, exact=True).click()
    expect(sidebar(page).get_by_role("combobox", name="Model")).to_have_value(model)


def fill_text(page: Page, label: str, value: str) -> None:
    """Type into a text input and commit it (Enter), as a user does before pressing Start."""
    box = sidebar(page).get_by_role("textbox", name=label, exact=True)
    box.fill(value)
    box.press("Enter")
    expect(box).to_have_value(value)


def fill_number(page: Page, label: str, value: int) -> None:
    """Type into a number input and commit it (Enter)."""
    box = sidebar(page).get_by_role("spinbutton", name=label, exact=True)
    box.fill(str(value))
    box.press("Enter")
    expect(box).to_have_value(str(value))


def dataframe_with_cell(page: Page, text: str) -> Locator:
    """The one st.dataframe holding a cell or header `text` (read from the grid's accessible table)."""
    cell = page.locator(f"xpath=.//*[self::td or self::th][normalize-space()='{text}']")
    grid = page.get_by_test_id("stDataFrame").filter(has=cell)
    expect(grid).to_have_count(1)
    return grid


def select_grid_row(grid: Locator, first_cell: str) -> None:
    """Tick the selection checkbox of the row whose first data cell is `first_cell`.

    The grid draws on a canvas; its accessible table gives the row's index, the row height its place.
    """
    row = grid.locator(f"xpath=.//tr[td[1][normalize-space()='{first_cell}']]")
    expect(row).to_have_count(1)
    index = int(row.get_attribute("aria-rowindex")) - 2  # 1 is the header row
    grid.scroll_into_view_if_needed()
    box = grid.get_by_test_id("stDataFrameResizable").bounding_box()
    grid.page.mouse.click(box["x"] + GRID_MARKER_X_PX, box["y"] + GRID_ROW_PX * (index + 1.5))
    expect(row).to_have_attribute("aria-selected", "true")


def run_id_in_url(url: str) -> str | None:
    match = re.search(r"[?&]run=([^&#]+)", url)
    return match.group(1) if match else None


def test_a_batch_shared_prefix_run_with_caching_says_why_caching_shows_little_and_that_it_started_cold(page: Page):
    # Every prompt at once (a batch at concurrency 8), interleaved, the default's leaders-first turned off.
    page.goto(
        "/?model_choice=builtin%3Atiny-llama&dataset_name=shared-prefix&prefix_len=64&output_len=4"
        "&prefix_order=interleaved&num_prompts_cpu=8&concurrency_cpu=8&knob_enable_prefix_caching=true"
    )
    expect(page.get_by_role("heading", name="Run a benchmark")).to_be_visible(timeout=FIRST_CHART_TIMEOUT_MS)
    wait_for_script_run(page)
    sidebar(page).get_by_role("button", name="Start").click()
    expect(page.get_by_text("finished: 8/8 requests succeeded")).to_be_visible(timeout=RUN_END_TIMEOUT_MS)
    note = page.get_by_test_id("stAlertContentInfo").filter(has_text="8 prompts arrive at once")
    expect(note).to_contain_text("at most 4 of the 8 can reuse a cached prefix")
    expect(page.get_by_text(re.compile(r"^Prefix cache at the start: cold"))).to_be_visible()
    expect(page.get_by_test_id("stException")).to_have_count(0)
