"""The Run page with the openai backend, through AppTest, against the real `transformers serve`."""

import pytest
from app_under_test import APP, ended_status, shown
from openai_server import free_port, transformers_server  # noqa: F401 (fixture)
from streamlit.testing.v1 import AppTest

from bench_core.load.arrivals import achieved_rate
from bench_core.store.history import RESULTS_ENV
from dashboard.state import get_runner

# Each test here runs a real engine, server, app script or process for seconds: not in the fast suite.
pytestmark = pytest.mark.slow

SECRET = "sk-typed-in-the-page-0123456789"


@pytest.fixture(autouse=True)
def fresh_state(tmp_path, monkeypatch, fresh_dashboard):
    monkeypatch.setenv(RESULTS_ENV, str(tmp_path / "results"))


def choose_server(base_url: str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=60).run()
    at.sidebar.selectbox(key="backend").select("openai").run()
    at.sidebar.text_input(key="knob_base_url").input(base_url)
    at.sidebar.selectbox(key="knob_server_kind").select("transformers")
    at.sidebar.text_input(key="knob_tokenizer").input("builtin:tiny-llama")
    at.sidebar.text_input(key="api_key").input(SECRET)
    at.sidebar.selectbox(key="dataset_builtin").select("builtin:sample")
    at.sidebar.number_input(key="sharegpt_output_len_cpu").set_value(8)
    at.sidebar.number_input(key="num_prompts_cpu").set_value(6)
    at.sidebar.number_input(key="request_rate").set_value(50.0)
    at.sidebar.number_input(key="max_concurrency").set_value(4)
    return at


def test_a_server_run_shows_its_results_and_the_load_achieved_and_never_stores_the_key(
    transformers_server, tmp_path, caplog
):
    at = choose_server(transformers_server)
    assert at.sidebar.selectbox(key="load_pattern_server").value == "request_rate"
    at.sidebar.button(key="start").click().run()
    assert not at.exception and not at.error
    run = get_runner().get(at.query_params["run"])
    assert run.wait(60) and run.state == "finished", run.message
    at.run()
    assert not at.exception and not at.error
    assert ended_status(at, run.record).startswith("finished: 6/6 requests succeeded")  # amber if flagged
    assert f"the served model on the transformers server at {transformers_server}" in shown(at.caption[0].value)
    assert "request_rate load, 50 req/s, burstiness 1, max concurrency 4" in shown(at.caption[0].value)
    labels = {m.label: m.value for m in at.metric}
    assert labels["Requested rate (req/s)"] == "50"
    # What went out, from the requests' own send times (a busy client sends late: the first request late and the rest
    # on time makes the achieved rate higher than the drawn one, so no bound between the two holds on any machine).
    sent = run.record.requests["sent_s"].dropna()
    assert float(labels["Achieved send rate (req/s)"]) == pytest.approx(achieved_rate(sent), abs=0.006)
    assert len(sent) == 6
    requests = next(d.value for d in at.dataframe if "request" in d.value.columns)
    assert requests["usage_output_len"].tolist() == [8.0] * 6
    assert (requests["retokenized_output_len"] > 0).all()

    results = tmp_path / "results"
    for path in results.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path
    assert SECRET not in caplog.text


def test_a_server_that_is_down_is_one_error_and_the_app_keeps_working(tmp_path):
    at = choose_server(f"http://127.0.0.1:{free_port()}")
    at.sidebar.button(key="start").click().run()
    run = get_runner().get(at.query_params["run"])
    assert run.wait(30) and run.state == "failed"
    at.run()
    assert not at.exception
    (error,) = at.error
    assert "Cannot reach" in error.value and "Is the server running" in error.value


def test_a_missing_url_is_one_error_and_starts_nothing():
    at = choose_server("")
    at.sidebar.button(key="start").click().run()
    assert not at.exception
    (error,) = at.error
    assert "No server URL" in error.value
    assert get_runner().runs() == []
