"""The app shell and the Run page, driven through AppTest with the real runner and the tiny model."""

import json

import pytest
from streamlit.testing.v1 import AppTest

from bench_core.config import RunConfig
from bench_core.engines import availability
from bench_core.history import RESULTS_ENV, History
from bench_core.runner import Runner
from app_under_test import APP
from dashboard import sidebar
from dashboard.state import get_runner

TINY = "builtin:tiny-llama"
LATENCY_ROWS = ["End-to-end latency (ms)", "TTFT (ms)", "TPOT (ms)", "ITL (ms)", "Tokens per tick (tokens)"]



def tiny_config(num_prompts: int = 8, output_len: int = 8, label: str = "") -> RunConfig:
    values = {
        "backend": "transformers", "model": TINY, "dataset": "builtin:sample", "dataset_name": "sharegpt",
        "sharegpt_output_len": output_len, "num_prompts": num_prompts, "seed": 0, "load_pattern": "batch",
        "concurrency": 4, "stream_output": True, "label": label, "slo_ms": {},
    }
    return sidebar.build_run_config(values)


@pytest.fixture(scope="module")
def results_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("results")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(RESULTS_ENV, str(root))
        yield root


@pytest.fixture(autouse=True)
def fresh_state(results_root, fresh_dashboard):
    """Every test starts with a new runner and history, as after a server restart; its runs are cancelled after."""


@pytest.fixture(scope="module")
def stored_run_id(results_root, tiny_model_path) -> str:
    """A finished run that exists only in the history, as if it ran before the server started."""
    runner = Runner(History(results_root))
    run = runner.submit(tiny_config(label="stored"))
    assert run.wait(60)
    runner.shutdown()
    assert run.state == "finished", run.message
    return run.run_id


def open_app(run_id: str | None = None) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=60)
    if run_id:
        at.query_params["run"] = run_id
    return at.run()


def choose_tiny_run(at: AppTest, num_prompts: int = 8, output_len: int = 8) -> None:
    at.sidebar.selectbox(key="model_choice").select(TINY)
    at.sidebar.selectbox(key="dataset_builtin").select("builtin:sample")
    at.sidebar.number_input(key="sharegpt_output_len_cpu").set_value(output_len)
    at.sidebar.number_input(key="num_prompts_cpu").set_value(num_prompts)
    at.sidebar.number_input(key="concurrency_cpu").set_value(4)


def start(at: AppTest) -> AppTest:
    return at.sidebar.button(key="start").click().run()


def metric_value(at: AppTest, label: str) -> str:
    return next(m.value for m in at.metric if m.label == label)


def test_sidebar_opens_on_the_embedded_default_sized_for_a_cpu():
    at = open_app()
    assert not at.exception
    assert at.sidebar.selectbox(key="model_choice").value == "builtin:smollm2-135m"
    assert at.sidebar.selectbox(key="backend").value == "transformers"
    assert at.sidebar.number_input(key="num_prompts_cpu").value == 16
    assert at.sidebar.number_input(key="concurrency_cpu").value == 8
    assert at.sidebar.number_input(key="sharegpt_output_len_cpu").value == 64
    assert at.sidebar.checkbox(key="stream_output_cpu").value is True
    assert at.sidebar.number_input(key="knob_max_batch_tokens").value == 1024  # the engine's default
    assert not at.sidebar.button(key="start").disabled
    assert at.sidebar.button(key="cancel").disabled


def test_navigation_reaches_every_page_and_back_to_the_shown_run(stored_run_id):
    at = open_app(stored_run_id)
    for page in ("pages/history.py", "pages/playground.py"):
        at.switch_page(page).run()
        assert not at.exception
    at.switch_page("pages/run.py").run()
    assert at.query_params["run"] == stored_run_id  # the session remembers the run on show


@pytest.mark.skipif(availability("turbomind") is None, reason="LMDeploy can run here")
def test_lmdeploy_backends_are_disabled_with_their_reason_and_take_lmdeploy_defaults():
    at = open_app()
    captions = " ".join(c.value for c in at.sidebar.caption)
    assert availability("turbomind") in captions and availability("pytorch") in captions
    at.sidebar.selectbox(key="backend").select("turbomind").run()
    assert at.sidebar.button(key="start").disabled
    assert at.sidebar.number_input(key="num_prompts_lmdeploy").value == 5000
    assert at.sidebar.number_input(key="concurrency_lmdeploy").value == 256
    assert at.sidebar.selectbox(key="knob_quant_policy").value == 0


def test_impossible_knobs_show_one_error_and_start_nothing():
    at = open_app()
    at.sidebar.number_input(key="knob_max_batch_tokens").set_value(0)
    at.sidebar.number_input(key="knob_cache_block_seq_len").set_value(2)
    start(at)
    assert not at.exception
    (error,) = at.error
    assert "maximum tokens per batch" in error.value and "page size" in error.value
    assert get_runner().runs() == []
    assert "run" not in at.query_params


def test_start_runs_to_finished_with_summary_downloads_and_run_id_in_url():
    at = open_app()
    choose_tiny_run(at)
    start(at)
    assert not at.exception and not at.error
    run_id = at.query_params["run"]
    run = get_runner().get(run_id)
    assert run.wait(60) and run.state == "finished", run.message
    at.run()
    assert not at.exception
    assert at.success[0].value.startswith("finished: 8/8 requests succeeded")
    summary = at.dataframe[0].value
    assert list(summary.index) == LATENCY_ROWS
    assert list(summary.columns[:5]) == ["mean", "P50", "P75", "P95", "P99"]
    assert [d.label for d in at.download_button] == ["History row (CSV)", "Per-request table (CSV)", "LMDeploy CSV"]
    requests = next(d.value for d in at.dataframe if "request" in d.value.columns)
    assert len(requests) == 8
    titles = [json.loads(chart.proto.spec)["layout"]["title"]["text"] for chart in at.get("plotly_chart")]
    assert titles == ["Time to first token", "Inter-token latency", "Throughput over time"]

    second_tab = open_app(run_id)  # a reload or another tab shows the same run
    assert second_tab.success[0].value == at.success[0].value


def test_deep_link_shows_a_run_that_ended_before_the_server_started(stored_run_id):
    at = open_app(stored_run_id)
    assert not at.exception and not at.error
    assert "stored" in at.caption[0].value
    assert list(at.dataframe[0].value.index) == LATENCY_ROWS
    assert len(at.download_button) == 3


def test_deep_link_to_an_unknown_run_says_so():
    at = open_app("20000101-000000-dead")
    (error,) = at.error
    assert "There is no run 20000101-000000-dead" in error.value


def test_slo_inputs_change_goodput_without_a_new_run(stored_run_id):
    at = open_app(stored_run_id)
    assert not [m for m in at.metric if m.label == "Good requests"]  # no SLO yet: no goodput
    at.sidebar.number_input(key="slo_e2e_ms").set_value(1e6).run()
    assert metric_value(at, "Good requests") == "8/8"
    at.sidebar.number_input(key="slo_e2e_ms").set_value(0.001).run()
    assert metric_value(at, "Good requests") == "0/8"
    assert metric_value(at, "Goodput (req/s)") == "0.000"
    assert get_runner().runs() == []


def test_a_second_run_waits_in_the_queue_and_says_so():
    first = get_runner().submit(tiny_config(num_prompts=2000, output_len=64))
    at = open_app()
    choose_tiny_run(at)
    start(at)
    second = get_runner().get(at.query_params["run"])
    assert second is not first and second.state == "queued"
    assert any("waiting: 1 run(s) ahead" in info.value for info in at.info)
    assert not at.sidebar.button(key="cancel").disabled
    first.cancel()
    at.sidebar.button(key="cancel").click().run()
    assert second.wait(30) and second.state == "cancelled"


def test_a_missing_model_path_is_one_error_and_the_app_keeps_working():
    at = open_app()
    at.sidebar.selectbox(key="model_choice").select(sidebar.OTHER_MODEL).run()
    at.sidebar.text_input(key="model_path").input("/no/such/model")
    start(at)
    run = get_runner().get(at.query_params["run"])
    assert run.wait(30) and run.state == "failed"
    at.run()
    assert not at.exception
    (error,) = at.error
    assert "No model folder at /no/such/model" in error.value
    at.sidebar.selectbox(key="model_choice").select(TINY)
    at.sidebar.selectbox(key="dataset_builtin").select("builtin:sample")
    at.sidebar.number_input(key="num_prompts_cpu").set_value(4)
    at.sidebar.number_input(key="sharegpt_output_len_cpu").set_value(4)
    start(at)
    assert get_runner().get(at.query_params["run"]).wait(60)
    at.run()
    assert not at.error and at.success


def test_build_run_config_maps_widgets_to_the_run_settings():
    values = {
        "backend": "transformers", "model": " builtin:tiny-llama ", "dataset": "builtin:sample",
        "dataset_name": "random", "sharegpt_output_len": 128, "random_input_len": 32, "random_output_len": 16,
        "random_range_ratio": 0.5, "num_prompts": 10, "seed": 3, "load_pattern": "concurrency", "concurrency": 2,
        "stream_output": False, "label": " mine ", "knobs": {"max_batch_tokens": 256},
        "generation": {"top_k": 5}, "slo_ms": {"ttft": 250.0, "tpot": None, "e2e": None},
    }
    config = sidebar.build_run_config(values)
    assert config.engine.model == TINY and config.engine.max_batch_tokens == 256
    assert (config.dataset.random_input_len, config.dataset.random_output_len) == (32, 16)
    assert config.dataset.sharegpt_output_len is None  # only for the sharegpt dataset
    assert (config.load.load_pattern, config.load.concurrency, config.load.stream_output) == ("concurrency", 2, False)
    assert config.generation.top_k == 5 and config.label == "mine"
    assert (config.slo.ttft, config.slo.tpot) == (0.25, None)
