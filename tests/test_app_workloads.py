"""The workloads of issue 22 on the Run page, through AppTest with the real runner and the tiny model: a dataset's
own settings in the sidebar, the workload sampled before Start, and what the ended run sent and its cache served."""

import json

import pytest
from app_under_test import APP, shown
from streamlit.testing.v1 import AppTest

from bench_core.store.history import RESULTS_ENV
from dashboard.state import get_runner

# Each test here runs a real engine, server, app script or process for seconds: not in the fast suite.
pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def results_root(tmp_path, fresh_dashboard):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(RESULTS_ENV, str(tmp_path / "results"))
        yield tmp_path / "results"


def titles(at: AppTest) -> list[str]:
    return [json.loads(chart.proto.spec)["layout"]["title"]["text"] for chart in at.get("plotly_chart")]


def choose(dataset_name: str, **numbers: int) -> AppTest:
    """The app with the tiny Llama on builtin:sample, this dataset, and these number inputs set (by key)."""
    at = AppTest.from_file(APP, default_timeout=120).run()
    at.sidebar.selectbox(key="model_choice").select("builtin:tiny-llama")
    at.sidebar.selectbox(key="dataset_builtin").select("builtin:sample")
    at.sidebar.radio(key="dataset_name").set_value(dataset_name).run()
    for key, value in numbers.items():
        at.sidebar.number_input(key=key).set_value(value)
    return at.run()


def choose_shared_prefix() -> AppTest:
    return choose(
        "shared-prefix",
        prefix_len=128,
        suffix_len=8,
        prefix_groups=2,
        output_len=4,
        num_prompts_cpu=8,
        concurrency_cpu=2,
    )


def run_to_its_end(at: AppTest) -> AppTest:
    at.sidebar.button(key="start").click().run()
    assert not at.exception and not at.error
    run = get_runner().get(at.query_params["run"])
    assert run.wait(120) and run.state == "finished", run.message
    at.run()
    assert not at.exception
    return at


def test_the_datasets_settings_show_and_the_workload_is_sampled_before_start():
    at = choose_shared_prefix()
    assert not at.exception
    keys = {widget.key for widget in at.sidebar if getattr(widget, "key", None)}
    assert {"prefix_len", "prefix_groups", "suffix_len", "prefix_share", "prefix_order", "output_len"} <= keys
    assert "sharegpt_output_len_cpu" not in keys and "turns" not in keys  # other datasets' settings
    assert titles(at) == []  # nothing sampled until asked
    at.button(key="sample_workload").click().run()
    assert not at.exception and not at.error
    assert titles(at)[0] == "Token lengths" and titles(at)[1].startswith("Prefix share: ")
    assert any("8 requests, tokenized with builtin:tiny-llama" in caption.value for caption in at.caption)
    at.sidebar.radio(key="dataset_name").set_value("multi-turn").run()
    assert "turns" in {widget.key for widget in at.sidebar if getattr(widget, "key", None)}
    assert titles(at) == []  # other settings: sampled anew only when asked


def test_an_ended_shared_prefix_run_shows_what_it_sent_and_what_the_cache_served():
    at = choose_shared_prefix()
    at.sidebar.checkbox(key="knob_enable_prefix_caching").check()
    at = run_to_its_end(at)
    assert {"Token lengths"} <= set(titles(at)) and any(t.startswith("Prefix share: ") for t in titles(at))
    table = next(
        frame.value
        for frame in at.dataframe
        if "quantity" in frame.value and "Prefix cache hit rate" in frame.value["quantity"].tolist()
    ).set_index("quantity")
    assert 0 < float(table.loc["Prefix cache hit rate", "value"]) < 1
    assert float(table.loc["Cached prompt tokens", "value"].replace(",", "")) > 0


def test_a_batch_shared_prefix_run_with_caching_says_why_caching_shows_little_and_how_its_cache_started():
    at = choose("shared-prefix", prefix_len=128, suffix_len=8, output_len=4, num_prompts_cpu=8, concurrency_cpu=8)
    at.sidebar.selectbox(key="prefix_order").select("interleaved")
    at.sidebar.checkbox(key="knob_enable_prefix_caching").check()
    at = run_to_its_end(at)
    infos = [shown(info.value) for info in at.info]
    assert any(
        info.startswith("8 prompts arrive at once; at most 4 of the 8 can reuse a cached prefix") for info in infos
    )
    assert any(shown(caption.value).startswith("Prefix cache at the start: cold:") for caption in at.caption)


def test_an_ended_multi_turn_run_charts_ttft_by_turn():
    at = run_to_its_end(choose("multi-turn", turns=3, sharegpt_output_len_cpu=4, num_prompts_cpu=2))
    assert titles(at).count("TTFT by turn") == 1 and "Turns: 2 sessions, up to 3 turns each" in titles(at)
    assert any("2 sessions from builtin:sample (multi-turn" in caption.value for caption in at.caption)
