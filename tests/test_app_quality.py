"""The quality guard in the dashboard, driven through AppTest with the real runner (its engine in a worker process)
and the tiny model: the sidebar keeps a run's answers, offers the runs that kept theirs as drift baselines, and the
Run page shows the drift and where the answers first differ."""

import json

import pytest
from app_under_test import APP
from streamlit.testing.v1 import AppTest

from bench_core.store.history import RESULTS_ENV, History
from dashboard.state import get_history, get_runner

# Each test here runs a real engine and the app script for seconds: not in the fast suite.
pytestmark = pytest.mark.slow

TINY = "builtin:tiny-llama"


@pytest.fixture(autouse=True)
def results_root(tmp_path, monkeypatch, fresh_dashboard):
    monkeypatch.setenv(RESULTS_ENV, str(tmp_path))
    return tmp_path


def open_app(run_id: str | None = None) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=60)
    if run_id:
        at.query_params["run"] = run_id
    return at.run()


def run_to_its_end(at: AppTest) -> str:
    at.sidebar.selectbox(key="model_choice").select(TINY)
    at.sidebar.selectbox(key="dataset_builtin").select("builtin:sample")
    at.sidebar.number_input(key="sharegpt_output_len_cpu").set_value(12)
    at.sidebar.number_input(key="num_prompts_cpu").set_value(4)
    at.sidebar.button(key="start").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    run = get_runner().get(at.query_params["run"])
    assert run.wait(120) and run.state == "finished", run.message
    at.run()
    assert not at.exception
    return run.run_id


def quality_tables(at: AppTest) -> list:
    return [frame.value for frame in at.dataframe if "Exact-match rate with the baseline" in frame.value.to_string()]


def test_a_run_that_kept_its_answers_is_offered_as_the_baseline_and_a_repeat_shows_no_drift(results_root):
    at = open_app()
    baseline_picker = at.sidebar.selectbox(key="drift_baseline")
    assert baseline_picker.options == ["None"]  # no run has kept its answers yet
    assert at.sidebar.text_input(key="quality_set").value == ""
    at.sidebar.checkbox(key="keep_outputs").check()
    baseline_id = run_to_its_end(at)
    kept = History(results_root).requests(baseline_id)
    assert kept["output_ids"].map(len).tolist() == kept["output_len"].tolist()
    assert not quality_tables(at)  # kept, but checked against nothing

    at.sidebar.checkbox(key="keep_outputs").uncheck()
    picker = at.sidebar.selectbox(key="drift_baseline")
    assert picker.options[0] == "None" and picker.options[1].startswith(f"{baseline_id} · {TINY}")
    picker.select_index(1)
    checked_id = run_to_its_end(at)

    row = History(results_root).row(checked_id)
    assert row["drift_baseline"] == baseline_id and float(row["drift_exact_match_rate"]) == 1.0
    (quality,) = quality_tables(at)  # its own table, not in the throughput's
    shown = dict(zip(quality["quantity"], quality["value"]))
    assert (
        shown["Exact-match rate with the baseline"] == "1" and shown["Mean first divergence from the baseline"] == "12"
    )
    (figure,) = [json.loads(chart.proto.spec) for chart in at.get("plotly_chart") if chart.key == "quality_divergence"]
    (identical,) = figure["data"]  # every answer identical: one series, at the answers' own length
    assert identical["name"] == "identical to the baseline's" and identical["x"] == [12.0] * 4


def test_a_baseline_that_kept_no_answers_is_not_offered_and_one_deleted_since_it_was_picked_is_let_go(results_root):
    at = open_app()
    run_to_its_end(at)
    assert at.sidebar.selectbox(key="drift_baseline").options == ["None"]

    at.sidebar.checkbox(key="keep_outputs").check()
    kept_id = run_to_its_end(at)
    at.sidebar.selectbox(key="drift_baseline").select_index(1).run()

    get_history().delete([kept_id])  # from the History page, say, while the sidebar still holds it
    at.run()
    assert not at.exception
    picker = at.sidebar.selectbox(key="drift_baseline")
    assert picker.options == ["None"] and picker.value == ""
