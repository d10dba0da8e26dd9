"""The Run and Sweep pages take only what they can run, in a real browser: a sweep of any workload starts from the
Sweep page's own fields, a value outside a setting's bounds is said beside its field and never run, a run or sweep
out of proportion says so before Start and waits for a tick, and the sweep values follow the setting swept.

What AppTest cannot show is checked here: a number input refuses a value beyond its min_value in the browser (a red
"!") and keeps its last one, which the script never learns of; a number input with a value of its own cannot be
emptied there.
"""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, expect
from test_browser import (
    FIRST_CHART_TIMEOUT_MS,
    TINY_MODEL,
    choose_model,
    choose_radio,
    fill_number,
    open_run_page,
    sidebar,
    wait_for_script_run,
)

from bench_core.config import setting

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

# The Sweep page's defaults on the embedded engine: concurrency 1, 2, 4 twice, 4 prompts (sessions) of 32 tokens.
DEFAULT_RUNS = 6
SWEEP_END_TIMEOUT_MS = 150_000
SHARED_PREFIX_OUTPUT_LEN = 128  # the sidebar's, the shared-prefix workload's default
ZERO_PROMPTS = setting("num_prompts").problems(0)[0]  # the declaration's sentence, as the page says it


# A long time as estimate.describe_seconds writes it: days, or hours and minutes below two days (the past runs' pace,
# so this machine's speed, decides which).
LONG_TIME = r"[\d,.]+ (days|h \d\d min)"


def out_of_proportion(requests: int) -> re.Pattern:
    """The box Start waits for: a time at past runs' pace where the history has one, else the requests."""
    return re.compile(rf"^Start it anyway: it would (take about {LONG_TIME}|send up to {requests:,} requests)$")


def open_sweep_page(page: Page) -> None:
    page.goto("/sweep")
    expect(page.get_by_role("heading", name="Knob sweep")).to_be_visible(timeout=FIRST_CHART_TIMEOUT_MS)
    choose_model(page, TINY_MODEL)


@pytest.mark.parametrize("workload", ["shared-prefix", "multi-turn"])
def test_a_sweep_of_a_workload_with_its_own_output_length_starts_from_the_page_defaults_and_finishes(
    page: Page, workload: str
):
    open_sweep_page(page)
    choose_radio(page, workload)
    main = page.get_by_test_id("stMain")
    expect(main.get_by_text(re.compile(r"^concurrency = 1, 2, 4; 3 points × 2 repeats = 6 runs; "))).to_be_visible()
    wait_for_script_run(page)
    main.get_by_role("button", name="Start sweep").click()
    page.wait_for_url(re.compile(r"[?&]sweep=sweep-"))
    expect(page.get_by_text(f"finished: all {DEFAULT_RUNS} runs.")).to_be_visible(timeout=SWEEP_END_TIMEOUT_MS)
    expect(page.get_by_test_id("stAlertContentError")).to_have_count(0)
    expect(page.get_by_test_id("stException")).to_have_count(0)


def test_a_value_out_of_bounds_is_said_beside_its_field_and_start_stays_disabled(page: Page):
    open_run_page(page)
    fill_number(page, "Number of prompts", 0)
    expect(sidebar(page).get_by_text(ZERO_PROMPTS)).to_be_visible()
    expect(sidebar(page).get_by_role("button", name="Start")).to_be_disabled()
    fill_number(page, "Number of prompts", 3)
    expect(sidebar(page).get_by_text(ZERO_PROMPTS)).to_have_count(0)
    expect(sidebar(page).get_by_role("button", name="Start")).to_be_enabled()

    open_sweep_page(page)
    main = page.get_by_test_id("stMain")
    prompts = main.get_by_role("spinbutton", name="Prompts per run")
    prompts.fill("0")
    prompts.press("Enter")
    expect(prompts).to_have_value("0")
    expect(main.get_by_test_id("stAlertContentError")).to_contain_text(ZERO_PROMPTS)
    expect(main.get_by_role("button", name="Start sweep")).to_be_disabled()
    expect(page.get_by_test_id("stException")).to_have_count(0)


def test_the_sweeps_output_length_can_be_emptied_to_keep_the_sidebars(page: Page):
    open_sweep_page(page)
    choose_radio(page, "shared-prefix")
    main = page.get_by_test_id("stMain")
    output = main.get_by_role("spinbutton", name="Output tokens per request")
    expect(output).to_have_value("32")
    output.fill("")
    output.press("Enter")
    tokens = 4 * DEFAULT_RUNS * SHARED_PREFIX_OUTPUT_LEN
    expect(main.get_by_text(re.compile(rf"= 6 runs; 24 requests, about {tokens:,} output tokens; "))).to_be_visible()
    expect(output).to_have_value("")


def test_a_run_or_sweep_out_of_proportion_is_estimated_before_start_and_waits_for_a_tick(page: Page, artifacts):
    open_run_page(page)
    start = sidebar(page).get_by_role("button", name="Start", exact=True)
    expect(
        sidebar(page).get_by_text(re.compile(r"^This run: 8 requests, about 512 output tokens; takes about"))
    ).to_be_visible()
    fill_number(page, "Number of prompts", 1_000_000)  # the most a run takes
    expect(
        sidebar(page).get_by_text(
            re.compile(rf"^This run: 1,000,000 requests, about 64,000,000 output tokens; takes about {LONG_TIME}")
        )
    ).to_be_visible()
    anyway = sidebar(page).get_by_text(out_of_proportion(1_000_000))
    expect(anyway).to_be_visible()
    expect(start).to_be_disabled()
    page.screenshot(path=artifacts / "estimate-before-start-run.png")
    anyway.click()
    expect(start).to_be_enabled()
    fill_number(page, "Number of prompts", 999_999)  # another size: the tick was for the first one
    expect(start).to_be_disabled()

    open_sweep_page(page)
    main = page.get_by_test_id("stMain")
    prompts = main.get_by_role("spinbutton", name="Prompts per run")
    prompts.fill("1000000")
    prompts.press("Enter")
    expect(main.get_by_text(out_of_proportion(6 * 1_000_000))).to_be_visible()
    expect(main.get_by_role("button", name="Start sweep")).to_be_disabled()
    page.screenshot(path=artifacts / "estimate-before-start-sweep.png")
    expect(page.get_by_test_id("stException")).to_have_count(0)


def test_the_sweep_values_follow_the_setting_swept_and_are_checked_as_typed(page: Page):
    open_sweep_page(page)
    main = page.get_by_test_id("stMain")
    values = main.get_by_role("textbox", name="Values").first
    expect(values).to_have_value("1,2,4")
    main.get_by_role("combobox", name="Sweep").click()
    page.get_by_role("option", name=re.compile(r"^enable_prefix_caching")).click()
    expect(values).to_have_value("false,true")
    expect(main.get_by_role("button", name="Start sweep")).to_be_enabled()
    values.fill("1,2,4")
    values.press("Enter")
    expect(main.get_by_test_id("stAlertContentError")).to_have_text(
        "Sweep value '2' for enable_prefix_caching is not true or false."
    )
    expect(main.get_by_role("button", name="Start sweep")).to_be_disabled()
    expect(page.get_by_test_id("stException")).to_have_count(0)


def test_a_target_margin_of_error_is_typed_beside_the_repeats_and_emptied_to_count_them_again(page: Page):
    open_sweep_page(page)
    main = page.get_by_test_id("stMain")
    target = main.get_by_role("spinbutton", name=setting("target_moe").title)
    expect(target).to_have_value("")  # no target: a fixed count of repeats
    target.fill("0")
    target.press("Enter")
    expect(main.get_by_test_id("stAlertContentError")).to_contain_text(setting("target_moe").problems(0.0)[0])
    expect(main.get_by_role("button", name="Start sweep")).to_be_disabled()
    target.fill("0.05")
    target.press("Enter")
    expect(
        main.get_by_text(
            re.compile(
                r"^concurrency = 1, 2, 4; 3 points, each repeated until ±5% \(95% interval\) on Output throughput "
                r"\(tok/s\), 3 to 10 runs a point: at most 30 runs; at most 120 requests"
            )
        )
    ).to_be_visible()
    expect(main.get_by_role("button", name="Start sweep")).to_be_enabled()
    target.fill("")
    target.press("Enter")
    expect(main.get_by_text(re.compile(r"^concurrency = 1, 2, 4; 3 points × 2 repeats = 6 runs; "))).to_be_visible()
    expect(page.get_by_test_id("stException")).to_have_count(0)
