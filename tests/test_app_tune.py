"""The Sweep page's Tune mode through AppTest with the real runner and the tiny model: a tune of two settings under
the sidebar's SLO runs its trials in the background, then shows the best point, the command that runs it again, the
front, every trial and the report; after a restart it opens again from its plan and journal; bad input is one error."""

from __future__ import annotations

import json

import pytest
from app_under_test import APP, shown
from streamlit.testing.v1 import AppTest

from bench_core.store.history import RESULTS_ENV
from bench_core.sweep.results import tune_result
from bench_core.sweep.store import load_plan, trials_of
from bench_core.views.tune_charts import BEST_TRIAL
from dashboard.state import get_history, get_runner, get_sweeps

# Each test here runs the app script, and most a real engine, for seconds: not in the fast suite.
pytestmark = pytest.mark.slow

PAGE = "app_pages/sweep.py"
TUNE_TIMEOUT_S = 180


@pytest.fixture(autouse=True)
def fresh_state(tmp_path, monkeypatch, tiny_model_path, fresh_dashboard):
    monkeypatch.setenv(RESULTS_ENV, str(tmp_path / "results"))


def open_tune_page(sweep_id: str | None = None) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=60)
    if sweep_id:
        at.query_params["sweep"] = sweep_id
    at.run()
    at = at.switch_page(PAGE).run()
    return at.radio(key="sweep_mode").set_value("Tune").run()


def set_up_tiny_tune(at: AppTest) -> None:
    """The tiny model on the sample prompts, 2 prompts of 4 tokens a run, the sidebar's TTFT SLO generous enough
    that every trial keeps it: a space of concurrency 1,2 × prefix caching off and on, three trials."""
    at.sidebar.selectbox(key="model_choice").select("builtin:tiny-llama")
    at.sidebar.selectbox(key="dataset_builtin").select("builtin:sample")
    at.sidebar.number_input(key="slo_ttft_ms").set_value(60_000.0)
    at.run()
    assert at.multiselect(key="tune_settings").value == ["concurrency", "enable_prefix_caching"]
    at.text_input(key="tune_values_concurrency").set_value("1,2")
    assert at.text_input(key="tune_values_enable_prefix_caching").value == "false,true"
    at.number_input(key="tune_trials").set_value(3)
    at.number_input(key="sweep_num_prompts").set_value(2)
    at.number_input(key="sweep_output_len").set_value(4)
    at.run()


def test_a_tune_started_on_the_page_shows_its_best_point_and_how_to_run_it_and_opens_again_later(download_data):
    at = open_tune_page()
    set_up_tiny_tune(at)
    assert at.checkbox(key="tune_within_slo").value  # the sidebar's SLO, kept by default
    (plan_line,) = [shown(caption.value) for caption in at.caption if "of the space's 4 points" in caption.value]
    assert (
        "at most 3 of the space's 4 points, picked by TPE (seed 0), to maximise Output throughput (tok/s) within p99_ttft_ms<=60000"
        in (plan_line)
    )
    at.button(key="sweep_start").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    tune_id = at.session_state["sweep_id"]
    assert tune_id.startswith("tune-") and at.query_params["sweep"] == tune_id
    (progress,) = at.get("progress")
    assert "/3 trials done" in progress.proto.text

    assert get_sweeps()[tune_id].wait(TUNE_TIMEOUT_S)
    at.run()
    assert not at.exception
    assert at.success[0].value == "finished: all 3 trials."
    trials = trials_of(get_history(), tune_id)
    assert len(trials) == 3
    (best,) = [shown(message.value) for message in at.success if message.value.startswith("Best: ")]
    assert "Output throughput (tok/s)" in best and "over 1 run" in best
    # The best point's command, with its settings: the embedded engine has no server of its own to deploy.
    (rerun,) = [block.value for block in at.code]
    assert "The transformers backend has no server or engine config of its own to deploy." in [
        shown(caption.value) for caption in at.caption
    ]
    best_point = tune_result(load_plan(get_history(), tune_id), trials, get_history().load()).best.point
    assert rerun.startswith("python -m bench_core pipeline builtin:sample builtin:tiny-llama")
    assert f"--concurrency {best_point['concurrency']}" in rerun
    assert ("--enable-prefix-caching" in rerun) == best_point["enable_prefix_caching"]
    assert any(shown(caption.value) == "Tried 3 of the space's 4 points (75%)." for caption in at.caption)
    (front,) = [json.loads(chart.proto.spec) for chart in at.get("plotly_chart") if chart.key == "tune_chart_front"]
    assert BEST_TRIAL in [trace["name"] for trace in front["data"]]
    (table,) = [frame.value for frame in at.dataframe if "within bounds" in frame.value.columns]
    assert list(table["trial"].astype(int)) == [0, 1, 2] and set(table["within bounds"]) == {"yes"}
    (report_button,) = [button for button in at.download_button if button.label == "Report of this sweep (HTML)"]
    report = download_data(report_button).decode()
    assert f"<h1>Tune {tune_id}</h1>" in report and rerun in report

    get_sweeps.clear()  # as after a server restart: the plan, the journal and the history remain
    again = open_tune_page(tune_id)
    assert not again.exception
    assert again.subheader[0].value == f"Sweep {tune_id}"
    assert [block.value for block in again.code] == [rerun]
    assert shown(again.success[-1].value) == best
    (past,) = [frame.value for frame in again.dataframe if "sweep_id" in frame.value.columns]
    assert list(past["sweep_id"]) == [tune_id]


def test_a_bound_that_is_not_one_is_one_error_and_starts_nothing():
    at = open_tune_page()
    set_up_tiny_tune(at)
    at.text_input(key="tune_bounds").set_value("p99_ttft_ms<500").run()
    assert [shown(error.value) for error in at.error] == [
        "--slo 'p99_ttft_ms<500' is not a bound: write METRIC<=LIMIT or METRIC>=LIMIT (e.g. p99_ttft_ms<=500)."
    ]
    assert not at.exception and at.button(key="sweep_start").disabled
    assert get_sweeps() == {} and get_runner().runs() == []


def test_the_search_and_its_seed_are_the_page_s_to_choose():
    at = open_tune_page()
    set_up_tiny_tune(at)
    at.selectbox(key="tune_search").select("random")
    at.number_input(key="tune_seed").set_value(7).run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert any("of the space's 4 points, picked at random (seed 7), to maximise" in shown(c.value) for c in at.caption)
