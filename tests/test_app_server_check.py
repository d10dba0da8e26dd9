"""The Run page's "Test connection" for a server backend, through AppTest, against aiohttp servers on 127.0.0.1: one
box with the models served, the kind detected, whether /metrics has series a run reads, and whether the server
honours ignore_eos; the server's own words shown as text, never as Markdown."""

from __future__ import annotations

import pytest
from app_under_test import APP
from openai_server import free_port, serving, vllm_like
from streamlit.testing.v1 import AppTest

from bench_core.store.history import RESULTS_ENV

pytestmark = pytest.mark.slow  # the app script, for seconds

MODEL = "org/*bold*-[link](http://example.invalid)"


@pytest.fixture(autouse=True)
def fresh_state(tmp_path, monkeypatch, fresh_dashboard):
    monkeypatch.setenv(RESULTS_ENV, str(tmp_path / "results"))


def press_test_connection(base_url: str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=60).run()
    at.sidebar.selectbox(key="backend").select("openai").run()
    at.sidebar.text_input(key="knob_base_url").input(base_url).run()
    at.button(key="test_connection").click().run()
    assert not at.exception
    return at


def test_the_check_says_what_the_server_serves_its_kind_metrics_and_ignore_eos():
    with serving(vllm_like(MODEL, metrics=True, answer_as="ok")) as url:
        at = press_test_connection(url)

    (box,) = at.success
    assert "*bold*" not in box.value.replace("\\*", "")  # the model's name is text, escaped
    assert "**Models served**: org/\\*bold\\*" in box.value
    assert '**Server kind**: vllm, detected from /v1/models (owned\\_by "vllm")' in box.value
    assert "**Metrics (/metrics)**: available (Running requests, Waiting requests)" in box.value
    assert "**ignore\\_eos**: honoured: asked for 4 tokens with ignore\\_eos, 4 came back" in box.value


def test_a_server_without_metrics_that_stops_at_eos_is_said_so():
    with serving(vllm_like(MODEL, metrics=False, answer_as="short")) as url:
        at = press_test_connection(url)

    (box,) = at.success
    assert "**Metrics (/metrics)**: not available: " in box.value and "HTTP 404" in box.value
    assert "not honoured: asked for 4 tokens with ignore\\_eos, the server stopped at EOS after 2" in box.value


def test_a_server_that_is_not_there_is_one_error():
    at = press_test_connection(f"http://127.0.0.1:{free_port()}")
    (box,) = at.error
    assert box.value.startswith("**Server**: Cannot reach ")
