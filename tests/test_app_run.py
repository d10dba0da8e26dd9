"""The app shell and the Run page, driven through AppTest with the real runner and the tiny model."""

import asyncio
import json
import re
import time
from pathlib import Path

import engine_faults
import pytest
from aiohttp import web
from app_under_test import APP, ended_status, shown
from counted_calls import counted_calls
from metrics_server import metrics_server  # noqa: F401 (fixture)
from openai_server import add_openai_routes, answer_as_prompted, serving
from streamlit.testing.v1 import AppTest

from bench_core.config import (
    SLO,
    DatasetConfig,
    EngineConfig,
    GenerationSettings,
    LoadConfig,
    RunConfig,
    knobs_for,
    setting,
)
from bench_core.engines import availability
from bench_core.hardware.client_bound import CLIENT_PREFIX
from bench_core.hardware.contention import BUSY_PREFIX
from bench_core.measure.time_left import time_left_s
from bench_core.run import engine_process
from bench_core.run.preflight import check_run
from bench_core.run.runner import Runner
from bench_core.store.history import RESULTS_ENV, History
from bench_core.views.figures import PALETTE
from dashboard import run_view, sidebar, table_view
from dashboard.state import get_runner, get_sweeps

# Each test here runs a real engine, server, app script or process for seconds: not in the fast suite.
pytestmark = pytest.mark.slow

TINY = "builtin:tiny-llama"
DATA = Path(__file__).resolve().parent / "data"
LATENCY_ROWS = [
    "End-to-end latency (ms)",
    "TTFT (ms)",
    "TPOT (ms)",
    "ITL (ms)",
    "Tokens per tick (tokens)",
    "TTFT per 1,000 input tokens (ms)",
    "Decode tokens/s per request (tok/s)",
]


TINY_VALUES = {
    "backend": "transformers",
    "model": TINY,
    "dataset": "builtin:sample",
    "dataset_name": "sharegpt",
    "sharegpt_output_len": 8,
    "num_prompts": 8,
    "seed": 0,
    "load_pattern": "batch",
    "concurrency": 4,
    "stream_output": True,
    "label": "",
}


def tiny_config(num_prompts: int = 8, output_len: int = 8, label: str = "") -> RunConfig:
    return sidebar.build_run_config(
        {**TINY_VALUES, "sharegpt_output_len": output_len, "num_prompts": num_prompts, "label": label}
    )


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
    run = runner.submit(tiny_config(num_prompts=6, label="stored"))  # not the default count: loading it shows
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


def test_the_estimate_before_start_goes_by_the_pace_of_the_models_past_runs(stored_run_id):
    at = open_app()
    choose_tiny_run(at)
    at.run()
    (estimate,) = [shown(caption.value) for caption in at.sidebar.caption if caption.value.startswith("This run:")]
    assert re.search(
        rf"^This run: 8 requests, about 64 output tokens; takes about .+, from the output throughput of \d+ finished "
        rf"run\(s\) of {TINY} on transformers\.$",
        estimate,
    ), estimate


def test_sidebar_opens_on_the_embedded_default_sized_for_a_cpu():
    at = open_app()
    assert not at.exception
    assert at.sidebar.selectbox(key="model_choice").value == "builtin:smollm2-135m"
    assert {"synthetic:tiny", "synthetic:llama-3.2-1b", "synthetic:qwen2.5-7b"} <= set(
        at.sidebar.selectbox(key="model_choice").options
    )
    assert at.sidebar.selectbox(key="backend").value == "transformers"
    assert at.sidebar.number_input(key="num_prompts_cpu").value == 8
    assert at.sidebar.number_input(key="concurrency_cpu").value == 8
    assert at.sidebar.number_input(key="sharegpt_output_len_cpu").value == 64
    assert at.sidebar.checkbox(key="stream_output_cpu").value is True
    assert at.sidebar.number_input(key="knob_max_batch_tokens").value == 1024  # the engine's default
    knob_keys = {widget.key for widget in at.sidebar if str(getattr(widget, "key", "")).startswith("knob_")}
    assert knob_keys == {f"knob_{knob.name}" for knob in knobs_for("transformers")}  # no LMDeploy knob here
    assert not at.sidebar.button(key="start").disabled
    assert at.sidebar.button(key="cancel").disabled


def test_navigation_reaches_every_page_and_back_to_the_shown_run(stored_run_id):
    at = open_app(stored_run_id)
    for page in ("app_pages/history.py", "app_pages/playground.py"):
        at.switch_page(page).run()
        assert not at.exception
    at.switch_page("app_pages/run.py").run()
    assert at.query_params["run"] == stored_run_id  # the session remembers the run on show


@pytest.mark.skipif(availability("turbomind") is None, reason="LMDeploy can run here")
def test_lmdeploy_backends_are_disabled_with_their_reason_and_take_lmdeploy_defaults():
    at = open_app()
    captions = " ".join(shown(c.value) for c in at.sidebar.caption)
    assert availability("turbomind") in captions and availability("pytorch") in captions
    at.sidebar.selectbox(key="backend").select("turbomind").run()
    assert at.sidebar.button(key="start").disabled
    assert at.sidebar.number_input(key="num_prompts_lmdeploy").value == 5000
    assert at.sidebar.number_input(key="concurrency_lmdeploy").value == 256
    assert at.sidebar.selectbox(key="knob_quant_policy").value == 0


def test_impossible_knobs_show_one_error_and_start_nothing():
    at = open_app()
    at.sidebar.selectbox(key="knob_torch_device").select("cuda")  # no GPU here
    at.sidebar.number_input(key="knob_cache_block_seq_len").set_value(2)
    start(at)
    assert not at.exception
    (error,) = at.error
    assert "sees no GPU" in error.value and "page size" in error.value
    assert get_runner().runs() == []
    assert "run" not in at.query_params


def test_start_runs_to_finished_with_summary_downloads_and_run_id_in_url(download_data):
    at = open_app()
    choose_tiny_run(at)
    start(at)
    assert not at.exception and not at.error
    run_id = at.query_params["run"]
    run = get_runner().get(run_id)
    assert run.wait(60) and run.state == "finished", run.message
    at.run()
    assert not at.exception
    assert ended_status(at, run.record).startswith("finished: 8/8 requests succeeded")
    summary = at.dataframe[0].value
    assert list(summary["metric"]) == LATENCY_ROWS
    assert list(summary.columns[:6]) == ["metric", "mean", "P50", "P75", "P95", "P99"]
    assert [d.label for d in at.download_button] == [
        "History rows of this run (CSV)",
        "Per-request table (CSV)",
        "LMDeploy CSV",
        "Report of this run (HTML)",
    ]
    requests = next(d.value for d in at.dataframe if "request" in d.value.columns)
    assert len(requests) == 8
    report = download_data(at.download_button[3]).decode()
    assert report.startswith("<!DOCTYPE html>") and f"<h1>Run {run_id}</h1>" in report
    assert "Throughput over time" in report  # from the run this server still holds
    assert at.download_button[3].proto.deferred_file_id  # written when clicked, not on every rerun
    titles = [json.loads(chart.proto.spec)["layout"]["title"]["text"] for chart in at.get("plotly_chart")]
    assert titles == [
        "Time to first token",
        "Inter-token latency",
        "Request timeline",
        "Throughput over time",
        "Token lengths",
        "Hardware telemetry",
    ]

    second_tab = open_app(run_id)  # a reload or another tab shows the same run
    assert ended_status(second_tab, run.record) == ended_status(at, run.record)


def chart_titles(at: AppTest) -> list[str]:
    return [json.loads(chart.proto.spec)["layout"]["title"]["text"] for chart in at.get("plotly_chart")]


def metrics_server_run(url: str, num_prompts: int, flavour: str = "lmdeploy") -> RunConfig:
    return RunConfig(
        engine=EngineConfig(
            backend="openai",
            model="tiny",
            base_url=f"{url}/{flavour}",
            server_kind=flavour,
            tokenizer=TINY,
            server_metrics_interval_s=0.2,
        ),
        dataset=DatasetConfig(dataset="builtin:sample", num_prompts=num_prompts, sharegpt_output_len=10),
        load=LoadConfig(load_pattern="request_rate", max_concurrency=4, stream_output=True),
    )


def test_a_server_run_shows_the_servers_own_metrics_live(metrics_server):
    run = get_runner().submit(metrics_server_run(metrics_server, num_prompts=120))  # ~14 s on 2 slots; cancelled
    try:
        deadline = time.monotonic() + 30
        while (
            not (
                (snap := run.snapshot()) is not None
                and snap.server_metrics is not None
                and (snap.server_metrics["time_s"] > 0.5).any()
            )
            and time.monotonic() < deadline
        ):
            time.sleep(0.1)
        at = open_app(run.run_id)
        assert not at.exception and run.active
        assert "Server metrics (its /metrics)" in chart_titles(at)
    finally:
        run.cancel()
        run.wait(30)


def test_a_server_run_shows_the_servers_own_metrics_under_the_throughput_and_after_a_restart(metrics_server):
    run = get_runner().submit(metrics_server_run(metrics_server, num_prompts=6))  # the samples cross the pipe
    assert run.wait(60) and run.state == "finished", run.message
    at = open_app(run.run_id)
    assert not at.exception and not at.error
    # Green, or amber only with its record's own flags (a busy machine's): no other warning.
    assert ended_status(at, run.record).startswith("finished: 6/6 requests succeeded")
    assert len(at.warning) == (0 if at.success else 1), [w.value for w in at.warning]
    titles = chart_titles(at)
    assert titles.index("Server metrics (its /metrics)") == titles.index("Throughput over time") + 1
    served = next(
        d.value.set_index("quantity")["value"]
        for d in at.dataframe
        if "Client minus server TTFT" in set(d.value.get("quantity", ()))
    )
    assert served["Peak KV-cache usage (server)"] == "1"
    get_runner.clear()  # as after a restart: from the run's folder
    assert "Server metrics (its /metrics)" in chart_titles(open_app(run.run_id))


def test_a_speculating_servers_acceptance_by_draft_position_is_a_chart_on_the_run_page(metrics_server):
    run = get_runner().submit(metrics_server_run(metrics_server, num_prompts=4, flavour="vllm"))
    assert run.wait(60) and run.state == "finished", run.message
    at = open_app(run.run_id)
    assert not at.exception
    (spec,) = [
        json.loads(chart.proto.spec) for chart in at.get("plotly_chart") if chart.key == "acceptance_by_position"
    ]
    assert spec["layout"]["title"]["text"] == "Acceptance by draft position (server)"
    (bars,) = spec["data"]
    assert (bars["x"], bars["y"]) == ([1, 2, 3], [75.0, 50.0, 25.0])
    get_runner.clear()  # as after a restart: from the history's row, the rates a JSON list in one cell
    reopened = open_app(run.run_id)
    (spec,) = [json.loads(c.proto.spec) for c in reopened.get("plotly_chart") if c.key == "acceptance_by_position"]
    assert spec["data"][0]["y"] == [75.0, 50.0, 25.0]


def test_the_embedded_engines_acceptance_by_draft_position_is_a_chart_under_its_speculative_table(results_root):
    config = tiny_config(num_prompts=4, output_len=16)
    config.engine.speculative_algorithm, config.engine.speculative_num_draft_tokens = "prompt_lookup", 3
    run = get_runner().submit(config)
    assert run.wait(120) and run.state == "finished", run.message
    get_runner.clear()  # from the history's row: the rates a JSON list in one cell
    at = open_app(run.run_id)
    assert not at.exception
    (spec,) = [
        json.loads(chart.proto.spec) for chart in at.get("plotly_chart") if chart.key == "engine_acceptance_by_position"
    ]
    assert spec["layout"]["title"]["text"] == "Acceptance by draft position"
    (bars,) = spec["data"]
    assert bars["x"] == [1, 2, 3] and all(0 <= rate <= 100 for rate in bars["y"])
    # Beside it, the requests by their own acceptance: every request that drafted is counted once.
    (histogram,) = [
        json.loads(chart.proto.spec) for chart in at.get("plotly_chart") if chart.key == "request_acceptance"
    ]
    drafted = History(results_root).requests(run.run_id)["spec_draft_tokens"].gt(0).sum()
    assert drafted > 0 and sum(histogram["data"][0]["y"]) == drafted


def test_deep_link_shows_a_run_that_ended_before_the_server_started(stored_run_id, download_data):
    at = open_app(stored_run_id)
    assert not at.exception and not at.error
    assert "stored" in at.caption[0].value
    assert list(at.dataframe[0].value["metric"]) == LATENCY_ROWS
    assert len(at.download_button) == 4
    report = download_data(at.download_button[3]).decode()
    assert f"<h1>Run {stored_run_id}</h1>" in report and "stored · builtin:tiny-llama" in report


def test_a_run_opened_from_the_history_shows_each_request_on_the_timeline(stored_run_id, results_root):
    at = open_app(stored_run_id)
    assert not at.exception and not at.error
    (chart,) = [
        json.loads(c.proto.spec)
        for c in at.get("plotly_chart")
        if json.loads(c.proto.spec)["layout"]["title"]["text"] == "Request timeline"
    ]
    assert [trace["name"] for trace in chart["data"]] == ["completed: waiting for first token", "completed: decoding"]
    # Each of the 6 requests is one bar of each segment, starting where its table says it started.
    starts = History(results_root).requests(stored_run_id).set_index("index")["start_s"]
    for trace in chart["data"]:
        assert sorted(row[0] for row in trace["customdata"]) == list(range(6))
        assert [row[5] for row in trace["customdata"]] == pytest.approx([starts[row[0]] for row in trace["customdata"]])


def test_an_ended_run_shows_its_telemetry_chart_roofline_verdict_and_random_weights(stored_run_id):
    at = open_app(stored_run_id)
    assert not at.exception and not at.error
    assert any(caption.value.startswith("Random-weight run:") for caption in at.caption)
    telemetry = next(
        d.value.set_index("quantity")["value"]
        for d in at.dataframe
        if "Engine process CPU" in set(d.value.get("quantity", ()))
    )
    assert "Peak engine process memory (RSS)" in telemetry.index
    values = telemetry.str.replace(",", "").astype(float)
    # The engine's own use is above 0; other processes' share may be 0 on a machine it had to itself.
    assert (values[["Engine process CPU", "Peak engine process memory (RSS)"]] > 0).all() and (values >= 0).all()
    chart = next(
        json.loads(c.proto.spec)
        for c in at.get("plotly_chart")
        if json.loads(c.proto.spec)["layout"]["title"]["text"] == "Hardware telemetry"
    )
    panels = {annotation["text"] for annotation in chart["layout"]["annotations"]}
    assert {"Engine process CPU (cores)", "Engine process memory, RSS (GiB)"} <= panels
    # Several sources (the engine process, the whole machine): the legend names each one's lines.
    named = {trace["name"] for trace in chart["data"] if trace.get("showlegend") is not False}
    assert chart["layout"]["showlegend"] and {"engine process", "whole machine"} <= named
    assert chart["layout"]["colorway"] == list(PALETTE)  # the figure's own colours, which a report keeps too
    # A pipeline batch sends every prompt at once: its TTFT per 1,000 input tokens holds the wait, and says so.
    assert any("is not prefill speed here: every request arrived at once" in c.value for c in at.caption)
    assert [info.value for info in at.info] == ["Roofline verdict: host bound."]
    (reasons,) = [m.value for m in at.markdown if "steps/s" in m.value]
    assert "is not the limit" in reasons and "measured once per machine and cached in" in reasons


def test_tables_show_formatted_numbers_a_dash_for_missing_values_and_uncut_row_titles(stored_run_id):
    at = open_app(stored_run_id)
    percentiles, throughput = at.dataframe[0], at.dataframe[1]
    assert percentiles.proto.placeholder == "-" and throughput.proto.placeholder == "-"
    quantities = throughput.value.set_index("quantity")["value"]
    assert quantities["Total requests"] == "6" and quantities["Total output tokens"] == "48"
    assert re.fullmatch(r"[\d,]+\.\d{3}", quantities["Output throughput"])  # not 9.088000
    cells = set(percentiles.value.drop(columns="metric").to_numpy().ravel())
    assert "-" in cells and not cells & {"None", "nan"}  # tokens per tick has no std, min or max
    widths = json.loads(percentiles.proto.columns)
    longest = max(len(title) for title in LATENCY_ROWS)
    assert widths["metric"]["width"] >= longest * table_view.CHAR_PX  # "TTFT (m" no more
    assert widths["mean"]["alignment"] == "right"


def test_deep_link_to_an_unknown_run_says_so_and_shows_the_page_without_it():
    at = open_app("20000101-000000-dead")
    assert not at.exception and not at.error
    (warning,) = at.warning
    assert shown(warning.value).startswith("Run 20000101-000000-dead is not in the history")
    assert "run" not in at.query_params and at.info  # the page's own start: choose settings, press Start


def test_a_run_deleted_in_the_history_no_longer_opens_by_its_link(results_root):
    """The runner still holds the ended run in memory: the history, where the user deleted it, decides."""
    at = open_app()
    choose_tiny_run(at, num_prompts=2, output_len=4)
    start(at)
    run_id = at.query_params["run"]
    run = get_runner().get(run_id)
    assert run.wait(60) and run.state == "finished", run.message
    at.switch_page("app_pages/history.py").run()
    table = at.dataframe[0]
    at.session_state[table.key] = {
        "selection": {"rows": [list(table.value["run_id"]).index(run_id)], "columns": [], "cells": []}
    }
    at.run().button(key="delete_ask").click().run()
    at.button(key="delete_confirm").click().run()
    assert History(results_root).row(run_id) is None and get_runner().get(run_id) is not None

    for page in (open_app(run_id), at.switch_page("app_pages/run.py").run()):  # its link, and this session's last run
        assert not page.exception and not page.error
        assert [shown(w.value) for w in page.warning] == [
            f"Run {run_id} is not in the history (it was deleted): here is the Run page without it."
        ]
        assert "run" not in page.query_params
        assert not page.dataframe and not page.get("plotly_chart") and not page.download_button
        assert "load_settings" not in [button.key for button in page.button]
        assert not page.sidebar.button(key="start").disabled


def test_slo_inputs_change_goodput_without_a_new_run(stored_run_id):
    at = open_app(stored_run_id)
    assert not [m for m in at.metric if m.label == "Good requests"]  # no SLO yet: no goodput
    at.sidebar.number_input(key="slo_e2e_ms").set_value(1e6).run()
    assert metric_value(at, "Good requests") == "6/6"
    at.sidebar.number_input(key="slo_e2e_ms").set_value(0.001).run()
    assert metric_value(at, "Good requests") == "0/6"
    assert metric_value(at, "Goodput (req/s)") == "0.000"
    assert get_runner().runs() == []


def long_run(label: str = "") -> RunConfig:
    """Far longer than any test waits for: it is still active when the test looks, and cancelled after."""
    return tiny_config(num_prompts=2000, output_len=64, label=label)


def banner_lines(at: AppTest) -> list[str]:
    """The active-runs banner's lines, with the run each "Open it" link leads to."""
    lines = [m.value for m in at.markdown if m.value.startswith(":material/pending:")]
    links = [link.proto.query_string for link in at.get("page_link")]
    return [f"{line} -> {link}" for line, link in zip(lines, links)]


def asked(at: AppTest) -> list[str]:
    """The page's warnings but a running run's flags ("Machine busy", which a run measuring on this shared machine may
    show at any moment, or "Client bound"; hardware/run_flags.py::live_run_flags)."""
    flags = tuple(f"{prefix.capitalize()}: " for prefix in (BUSY_PREFIX, CLIENT_PREFIX))
    return [w.value for w in at.warning if not shown(w.value).startswith(flags)]


def test_a_second_press_of_start_with_the_same_settings_queues_nothing():
    at = open_app()
    choose_tiny_run(at, num_prompts=2000, output_len=64)
    start(at)
    first = get_runner().get(at.query_params["run"])
    start(at)  # the same settings while the first run is still active
    assert not at.exception
    assert [run.run_id for run in get_runner().runs()] == [first.run_id]
    assert at.query_params["run"] == first.run_id
    assert any(info.value.startswith(f"Already started: run {first.run_id} is ") for info in at.info)
    assert not asked(at)  # nothing to confirm: nothing is queued


def test_start_while_another_run_is_active_names_it_and_queues_only_when_confirmed():
    first = get_runner().submit(long_run(label="other tab"))
    at = open_app(first.run_id)
    choose_tiny_run(at)
    start(at)
    assert [run.run_id for run in get_runner().runs()] == [first.run_id]  # asked, not queued
    (warning,) = asked(at)
    assert f"run {first.run_id} (other tab) is " in warning and "waits in the queue behind it" in warning
    at.button(key="discard_start").click().run()
    assert not asked(at) and [run.run_id for run in get_runner().runs()] == [first.run_id]

    start(at)
    at.button(key="confirm_start").click().run()
    second = get_runner().get(at.query_params["run"])
    assert second is not first and second.state == "queued"
    assert len(get_runner().runs()) == 2 and not asked(at)
    assert any("waiting: 1 run(s) ahead" in info.value for info in at.info)
    assert not at.sidebar.button(key="cancel").disabled
    first.cancel()
    at.sidebar.button(key="cancel").click().run()
    assert second.wait(30) and second.state == "cancelled"


def test_start_checks_the_run_once_whether_it_is_queued_at_once_or_after_the_question():
    at = open_app()
    choose_tiny_run(at, num_prompts=2000, output_len=64)
    with counted_calls(check_run) as checks:
        start(at)
    first = get_runner().get(at.query_params["run"])
    assert len(checks) == 1 and first.config.dataset.num_prompts == 2000
    choose_tiny_run(at)  # other settings: asked before it waits behind the first
    with counted_calls(check_run) as checks:
        start(at)
        assert [run.run_id for run in get_runner().runs()] == [first.run_id]  # asked, checked, not queued
        at.button(key="confirm_start").click().run()
    second = get_runner().get(at.query_params["run"])
    assert len(checks) == 1 and second is not first and second.state == "queued"
    first.cancel()
    second.cancel()
    assert first.wait(30) and second.wait(30)


def test_the_base_url_in_a_new_tab_shows_the_active_run_instead_of_the_intro():
    run = get_runner().submit(long_run())
    at = open_app()  # a new session on the base URL, as a second tab is
    assert not at.exception
    assert at.query_params["run"] == run.run_id
    assert at.subheader[0].value == f"Run {run.run_id}"
    assert not [info for info in at.info if "press **Start**" in info.value]
    assert not at.sidebar.button(key="cancel").disabled
    assert banner_lines(at) == []  # the page shows that run in full: no banner, no second poll


def test_every_other_page_shows_the_active_and_queued_runs_with_links_to_them():
    runner = get_runner()
    running, queued = runner.submit(long_run(label="busy")), runner.submit(long_run(label="next"))
    at = open_app()
    for page in ("app_pages/history.py", "app_pages/sweep.py", "app_pages/playground.py"):
        at.switch_page(page).run()
        assert not at.exception
        first, second = banner_lines(at)
        assert first.startswith(f":material/pending: run {running.run_id} (busy) is ")
        assert first.endswith(f"-> run={running.run_id}")
        assert (
            second == f":material/pending: run {queued.run_id} (next) is queued, 1 ahead of it -> run={queued.run_id}"
        )
    at.switch_page("app_pages/run.py").run()  # it shows the running one in full; the banner lists the other
    assert [line.split(" is ")[0] for line in banner_lines(at)] == [f":material/pending: run {queued.run_id} (next)"]
    running.cancel()
    queued.cancel()
    assert running.wait(30) and queued.wait(30)
    at.switch_page("app_pages/history.py").run()
    assert banner_lines(at) == []


def test_sidebar_settings_follow_the_user_across_pages_and_into_the_url():
    at = open_app()
    at.sidebar.number_input(key="num_prompts_cpu").set_value(3)
    at.sidebar.number_input(key="concurrency_cpu").set_value(2)
    at.sidebar.selectbox(key="model_choice").select(TINY).run()
    for page in ("app_pages/sweep.py", "app_pages/history.py", "app_pages/run.py"):
        at.switch_page(page).run()
        assert not at.exception
        if page != "app_pages/history.py":  # no sidebar settings there
            assert at.sidebar.number_input(key="num_prompts_cpu").value == 3
            assert at.sidebar.number_input(key="concurrency_cpu").value == 2
            assert at.sidebar.selectbox(key="model_choice").value == TINY
    settings = {key: value for key, value in at.query_params.items() if key != "run"}
    assert settings == {"num_prompts_cpu": "3", "concurrency_cpu": "2", "model_choice": TINY}  # only the changed ones


def test_a_reload_restores_the_settings_in_the_url_and_ignores_impossible_ones():
    at = AppTest.from_file(APP, default_timeout=60)
    at.query_params.update(
        num_prompts_cpu="3",
        concurrency_cpu="2",
        model_choice=TINY,
        stream_output_cpu="false",
        dataset_name="random",
        random_input_len="0",
        knob_dtype="float64",
    )
    at.run()
    assert not at.exception
    assert at.sidebar.number_input(key="num_prompts_cpu").value == 3
    assert at.sidebar.number_input(key="concurrency_cpu").value == 2
    assert at.sidebar.selectbox(key="model_choice").value == TINY
    assert at.sidebar.checkbox(key="stream_output_cpu").value is False
    assert at.sidebar.radio(key="dataset_name").value == "random"
    assert (
        at.sidebar.number_input(key="random_input_len").value == setting("random_input_len").widget.start
    )  # below its minimum
    assert at.sidebar.selectbox(key="knob_dtype").value == "auto"  # not one of its choices


def test_random_lengths_say_the_span_drawn_and_the_rule_not_only_the_ratio():
    # "input 64, output 16, range ratio 0.0" read as fixed lengths to a vLLM user; LMDeploy draws 1..64 and 1..16.
    at = AppTest.from_file(APP, default_timeout=60)
    at.query_params.update(dataset_name="random", random_input_len="64", random_output_len="16")
    at.run()
    assert not at.exception
    drawn = [shown(caption.value) for caption in at.sidebar.caption if caption.value.startswith("Lengths drawn")]
    assert drawn == [
        "Lengths drawn: input 1..64 tokens, output 1..16 tokens (range ratio 0: uniform in "
        "[max(1, int(len x ratio)), len])"
    ]
    assert "0.0 gives 1..len, not fixed lengths" in at.sidebar.slider(key="random_range_ratio").help
    config = _random_dataset_from_a_path("model")  # 16 in, 4 out, ratio 0.5
    assert "(random, input 8..16 tokens, output 2..4 tokens (range ratio 0.5: " in run_view.describe_config(config)


def test_a_knob_shows_only_the_constraints_of_the_chosen_backend():
    # The block length on transformers showed "TurboMind: a multiple of 32 ...; PyTorch: a power of 2".
    at = open_app()
    assert at.sidebar.selectbox(key="backend").value == "transformers"
    constraints = [caption.value for caption in at.sidebar.caption if caption.value.startswith("Constraint:")]
    assert constraints and not [text for text in constraints if "TurboMind" in text or "PyTorch" in text]
    assert any(text.startswith("Constraint: transformers: whole KV cache blocks") for text in constraints)
    block = setting("cache_block_seq_len")
    assert [block.rule_for(name) for name in ("turbomind", "pytorch", "transformers")] == [
        "TurboMind: a multiple of 32 (compute capability >= 8.0) or 64",
        "PyTorch: a power of 2, >= 16",
        "",
    ]
    assert setting("dp").rule_for("turbomind") == ">= 1"  # a part that names no backend holds everywhere


def test_the_api_key_never_reaches_the_url():
    at = open_app()
    at.sidebar.selectbox(key="backend").select("openai").run()
    at.sidebar.text_input(key="api_key").input("sk-secret-key")
    at.sidebar.text_input(key="knob_base_url").input("http://127.0.0.1:9").run()
    assert not at.exception
    assert at.query_params["knob_base_url"] == "http://127.0.0.1:9"
    assert not [key for key, value in at.query_params.items() if "api_key" in key or "sk-secret" in str(value)]


def test_a_past_runs_settings_load_into_the_sidebar_and_run_again_as_they_were(stored_run_id, results_root):
    at = open_app(stored_run_id)
    at.button(key="load_settings").click().run()
    assert not at.exception
    assert at.sidebar.selectbox(key="model_choice").value == TINY
    assert at.sidebar.number_input(key="num_prompts_cpu").value == 6
    assert at.sidebar.text_input(key="label").value == "stored"
    at.switch_page("app_pages/sweep.py").run()  # loaded settings are the sidebar's on every page
    assert at.sidebar.selectbox(key="dataset_builtin").value == "builtin:sample"
    at.switch_page("app_pages/run.py").run()
    start(at)
    again = get_runner().get(at.query_params["run"])
    assert again.run_id != stored_run_id
    assert again.config == History(results_root).config(stored_run_id)


def test_a_missing_model_path_is_one_error_and_the_app_keeps_working():
    at = open_app()
    at.sidebar.selectbox(key="model_choice").select(sidebar.OTHER_MODEL).run()
    at.sidebar.text_input(key="model_path").input("/no/such/model")
    at.sidebar.radio(key="dataset_source").set_value(sidebar.SOURCE_PATH).run()
    at.sidebar.text_input(key="dataset_path").input("/no/such/data.json")
    start(at)
    assert not at.exception
    (error,) = at.error  # both typos at once, before anything is queued: no run, no run id
    assert (
        "No model folder at /no/such/model" in error.value
        and "Dataset /no/such/data.json does not exist" in error.value
    )
    assert get_runner().runs() == [] and "run" not in at.query_params
    at.sidebar.selectbox(key="model_choice").select(TINY)
    at.sidebar.radio(key="dataset_source").set_value(sidebar.SOURCE_BUILTIN).run()
    at.sidebar.selectbox(key="dataset_builtin").select("builtin:sample")
    at.sidebar.number_input(key="num_prompts_cpu").set_value(4)
    at.sidebar.number_input(key="sharegpt_output_len_cpu").set_value(4)
    start(at)
    run = get_runner().get(at.query_params["run"])
    assert run.wait(60)
    at.run()
    assert not at.error and ended_status(at, run.record)


def _random_dataset_from_a_path(tiny_model_path: str) -> RunConfig:
    config = tiny_config(num_prompts=4, label="again")
    config.engine = EngineConfig(backend="transformers", model=tiny_model_path, dtype="float32", max_batch_tokens=256)
    config.dataset = DatasetConfig(
        dataset=str(DATA / "sharegpt_small.json"),
        dataset_name="random",
        num_prompts=4,
        seed=3,
        random_input_len=16,
        random_output_len=4,
        random_range_ratio=0.5,
    )
    config.load = LoadConfig(load_pattern="concurrency", concurrency=2, stream_output=False)
    config.generation = GenerationSettings(top_k=5, temperature=0.5)
    config.slo = SLO(ttft=0.25)
    return config


def _a_server_at_a_rate(_) -> RunConfig:
    return RunConfig(
        engine=EngineConfig(
            backend="openai",
            model="served",
            base_url="http://127.0.0.1:9",
            endpoint="chat",
            server_kind="vllm",
            tokenizer=TINY,
            read_timeout_s=5.0,
            server_metrics=False,
            server_metrics_interval_s=2.5,
        ),
        dataset=DatasetConfig(dataset="builtin:sample", num_prompts=4, sharegpt_output_len=None),
        load=LoadConfig(
            load_pattern="request_rate",
            request_rate=5.0,
            burstiness=0.5,
            exact_rate_arrivals=True,
            max_concurrency=3,
            warmup_requests=0,
            duration_s=30.0,
            stream_output=True,
        ),
        label="server",
    )


@pytest.mark.parametrize("make_config", [_random_dataset_from_a_path, _a_server_at_a_rate])
def test_widget_values_are_the_way_back_from_a_config_to_the_sidebar(make_config, tiny_model_path):
    config = make_config(tiny_model_path)
    at = AppTest.from_file(APP, default_timeout=60)
    for key, value in sidebar.widget_values(config).items():
        at.session_state[key] = value  # what "Load these settings" does
    start(at.run())
    assert not at.exception and not at.error
    assert get_runner().get(at.query_params["run"]).config == config


def test_build_run_config_maps_widgets_to_the_run_settings():
    values = {
        "backend": "transformers",
        "model": " builtin:tiny-llama ",
        "dataset": "builtin:sample",
        "dataset_name": "random",
        "sharegpt_output_len": 128,
        "random_input_len": 32,
        "random_output_len": 16,
        "random_range_ratio": 0.5,
        "num_prompts": 10,
        "seed": 3,
        "load_pattern": "concurrency",
        "concurrency": 2,
        "stream_output": False,
        "label": " mine ",
        "max_batch_tokens": 256,
        "top_k": 5,
        "ttft": 0.25,
    }
    config = sidebar.build_run_config(values)
    assert config.engine.model == TINY and config.engine.max_batch_tokens == 256
    assert (config.dataset.random_input_len, config.dataset.random_output_len) == (32, 16)
    assert config.dataset.sharegpt_output_len is None  # only for the sharegpt dataset
    assert (config.load.load_pattern, config.load.concurrency, config.load.stream_output) == ("concurrency", 2, False)
    assert config.generation.top_k == 5 and config.label == "mine"
    assert (config.slo.ttft, config.slo.tpot) == (0.25, None)


def cache_starved_config(num_blocks: int) -> RunConfig:
    """Six random requests through a KV cache of `num_blocks` 4-token blocks: with 1 none fits, with 5 all
    but the longest do."""
    values = {
        "backend": "transformers",
        "model": TINY,
        "dataset": "builtin:sample",
        "dataset_name": "random",
        "random_input_len": 16,
        "random_output_len": 8,
        "random_range_ratio": 0.1,
        "num_prompts": 6,
        "seed": 0,
        "load_pattern": "batch",
        "concurrency": 1,
        "stream_output": True,
        "label": "",
        "num_blocks": num_blocks,
        "cache_block_seq_len": 4,
    }
    return sidebar.build_run_config(values)


def test_a_run_where_no_request_succeeded_is_red_and_one_with_failures_amber_with_their_reasons(results_root):
    failed = get_runner().submit(cache_starved_config(num_blocks=1))  # shown from memory
    assert failed.wait(60)
    # Another runner, as before a restart (shown from the history); a reused engine would keep the first
    # run's cache size, since the transformers engine takes its cache knobs from the settings it loaded with.
    earlier = Runner(History(results_root))
    partial = earlier.submit(cache_starved_config(num_blocks=5))
    assert partial.wait(60)
    earlier.shutdown()
    at = open_app(failed.run_id)
    assert not at.exception and not at.success
    (error,) = at.error
    assert error.value.startswith("failed: No request succeeded (error: The request needs")
    assert "0/6 requests succeeded" in error.value

    at = open_app(partial.run_id)
    assert not at.exception and not at.success and not at.error, [e.value for e in at.error]
    assert at.warning[0].value.startswith("partial: 1 of 6 requests failed (error: The request needs 6 KV cache blocks")
    assert "5/6 requests succeeded" in at.warning[0].value

    at.switch_page("app_pages/history.py").run()
    table = at.dataframe[0].value.set_index("run_id")
    assert table.loc[failed.run_id, "status"] == "failed" and table.loc[partial.run_id, "status"] == "partial"
    assert table.loc[failed.run_id, "error"].startswith("No request succeeded")


def test_a_run_that_failed_before_measuring_is_shown_from_the_history_after_a_restart(results_root, tmp_path):
    runner = Runner(History(results_root))
    broken = tmp_path / "broken-model"  # a model folder that fails to load (a missing one is refused, not recorded)
    broken.mkdir()
    (broken / "config.json").write_text("{}")
    run = runner.submit(
        RunConfig(
            engine=sidebar.build_run_config({**TINY_VALUES, "model": str(broken)}).engine, dataset=tiny_config().dataset
        )
    )
    assert run.wait(60) and run.state == "failed"
    runner.shutdown()
    at = open_app(run.run_id)  # this server's runner never saw it
    assert not at.exception
    (error,) = at.error
    assert shown(error.value).startswith("failed: Could not load the tokenizer of")
    assert str(broken) in shown(at.caption[0].value)
    assert not at.dataframe and not at.download_button  # no per-request table for a run that measured nothing


def test_a_run_that_measured_nothing_offers_run_again_alone_with_no_comparison_and_no_target(tmp_path):
    broken = tmp_path / "broken-model"  # found only once loading: the run fails before measuring, and is recorded
    broken.mkdir()
    (broken / "config.json").write_text("{}")
    failed = get_runner().submit(
        RunConfig(
            engine=sidebar.build_run_config({**TINY_VALUES, "model": str(broken)}).engine, dataset=tiny_config().dataset
        )
    )
    assert failed.wait(60) and failed.state == "failed" and not failed.refused
    at = open_app(failed.run_id)
    assert not at.exception
    assert any("this run measured nothing, so the new one is shown alone" in text.value for text in at.markdown)
    keys = {widget.key for widget in at.number_input}
    assert "run_again_target_moe" not in keys  # nothing measured to repeat until a margin of error
    assert at.button(key="run_again_start").help == "A new run with this one change."
    at.selectbox(key=f"run_again_setting_{failed.run_id}").set_value(setting("num_prompts")).run()
    at.number_input(key=f"run_again_{failed.run_id}_num_prompts").set_value(4).run()
    at.button(key="run_again_start").click().run()
    assert not at.exception
    again = get_runner().get(at.query_params["run"])
    assert again.run_id != failed.run_id and again.config.dataset.num_prompts == 4
    assert again.config.engine == failed.config.engine
    assert again.wait(60)
    at.run()
    assert not at.exception
    assert at.title[0].value == "Run a benchmark"  # shown alone, not opened compared in History


def test_loading_says_what_it_is_doing(monkeypatch, tmp_path):
    release = tmp_path / "release"
    monkeypatch.setenv(engine_faults.RELEASE_ENV, str(release))  # the worker process holds its tokenizer till then
    monkeypatch.setattr(engine_process, "serve", engine_faults.serve_holding_the_tokenizer)
    run = get_runner().submit(tiny_config(num_prompts=2, output_len=4))
    try:
        while run.phase != f"loading the tokenizer of {TINY}":
            assert not run.wait(0.01), run.message
        at = open_app(run.run_id)
        assert [shown(info.value) for info in at.info] == [f"loading: loading the tokenizer of {TINY}…"]
    finally:
        release.touch()
    assert run.wait(60) and run.state == "finished"


def test_the_live_view_estimates_the_time_left_and_a_cancel_counts_no_failure():
    run = get_runner().submit(tiny_config(num_prompts=200, output_len=64))
    while run.snapshot() is None or run.snapshot().in_flight == 0:
        assert not run.wait(0.01), run.message
    at = open_app(run.run_id)
    assert not at.exception
    (progress,) = at.get("progress")
    assert progress.proto.text.endswith(("estimating…", " s left")), progress.proto.text
    assert 1 <= int(metric_value(at, "In flight (requests)")) <= 4
    (rate,) = [m.label for m in at.metric if m.label.startswith("Output (tok/s, ")]
    assert re.fullmatch(r"Output \(tok/s, last [\d.]+ s\)", rate)  # a complete window, not the bin being filled
    at.sidebar.button(key="cancel").click().run()
    assert run.wait(30) and run.state == "cancelled"
    at.run()
    assert not at.exception and not at.error
    said = at.warning[0].value
    assert said.startswith("cancelled: ") and " 0 failed," in said and "abort" not in said
    assert f"{200 - run.record.metrics['completed']} cancelled" in said


def test_a_server_run_whose_client_cannot_keep_up_says_so_live_once_its_telemetry_does(monkeypatch):
    """The engine process is the client, and a slow one (engine_faults.serve_with_a_slow_client: every event it hands
    on sleeps on its loop first, so its loop runs late on any machine): its lateness comes to the page live, and the
    page says "client bound", with the way to spread the load, while the run goes on."""
    from flood_server import flooding_server

    from bench_core.hardware.client_bound import SPREAD_ADVICE
    from bench_core.hardware.run_flags import live_run_flags

    monkeypatch.setattr(engine_process, "serve", engine_faults.serve_with_a_slow_client)
    with flooding_server() as (url, _):
        config = RunConfig(
            engine=EngineConfig(backend="openai", model="flood", base_url=url, tokenizer=TINY, server_metrics=False),
            dataset=DatasetConfig(
                dataset="builtin:sample",
                dataset_name="random",
                num_prompts=1500,  # far more than the slow client reads in a minute: cancelled once the page said it
                random_input_len=8,
                random_output_len=2500,
                random_range_ratio=1.0,
            ),
            load=LoadConfig(load_pattern="request_rate", request_rate=50, warmup_requests=0, stream_output=True),
        )
        run = get_runner().submit(config)
        deadline = time.monotonic() + 60
        while not ((snap := run.snapshot()) is not None and live_run_flags(snap.telemetry, False, False)):
            assert not run.wait(0.2) and time.monotonic() < deadline, run.message
        at = open_app(run.run_id)
        assert run.active and not at.exception
        print(
            [shown(w.value) for w in at.warning],
            [shown(i.value) for i in at.info],
            live_run_flags(run.snapshot().telemetry, False, False),
        )
        (said,) = [shown(w.value) for w in at.warning if shown(w.value).startswith("Client bound: ")]
        assert said.startswith(
            "Client bound: the benchmark's client could not keep up during the last minute: its event loop woke "
        )
        assert SPREAD_ADVICE in said
        run.cancel()
        assert run.wait(30)


# A server that sits on every request as a batched prefill does, then streams its tokens 10 ms apart.
PREFILL_S = 3.0


@pytest.fixture
def prefilling_server():
    async def answer(request, endpoint):
        await asyncio.sleep(PREFILL_S)
        return await answer_as_prompted(request, endpoint)

    with serving(add_openai_routes(web.Application(), answer)) as url:
        yield url


def prefilling_run(url: str) -> RunConfig:
    """2 requests of 400 tokens at once: 3 s without a token, then about 4 s of decoding."""
    return RunConfig(
        engine=EngineConfig(backend="openai", model="prefill-test", base_url=url, tokenizer=TINY, server_metrics=False),
        dataset=DatasetConfig(
            dataset="builtin:sample",
            dataset_name="random",
            num_prompts=2,
            random_input_len=8,
            random_output_len=400,
            random_range_ratio=1.0,
        ),
        load=LoadConfig(load_pattern="request_rate", warmup_requests=0, stream_output=True),
    )


def live_progress_text(run) -> str:
    (progress,) = open_app(run.run_id).get("progress")
    return progress.proto.text


def test_the_live_view_says_estimating_in_a_batched_prefill_then_a_time_from_its_decode_or_from_past_runs(
    prefilling_server,
):
    first = get_runner().submit(prefilling_run(prefilling_server))
    while first.snapshot() is None:
        assert not first.wait(0.01), first.message
    assert live_progress_text(first).endswith("estimating…")  # no token yet, nothing like it in the history
    while time_left_s(first.snapshot()) is None:
        assert not first.wait(0.01), first.message
    # Decoding: the time told is the decode's. The pace of the run so far, the prefill's 3 s without a token included,
    # says several times more (24 s for 4 s left on a quiet machine; a busy one slows the decode in both alike).
    snap = first.snapshot()
    whole_run_pace = (snap.tokens_requested - snap.tokens_done) * snap.elapsed_s / snap.tokens_done
    seconds = int(re.search(r"about (\d+) s left$", live_progress_text(first)).group(1))
    assert seconds <= whole_run_pace / 2, whole_run_pace
    assert first.wait(60) and first.state == "finished", first.message

    again = get_runner().submit(prefilling_run(prefilling_server))
    while again.snapshot() is None:
        assert not again.wait(0.01), again.message
    assert again.snapshot().first_output_s is None  # still in its prefill: the finished run tells the time
    assert re.search(r", about \d+ s left$", live_progress_text(again))
    assert again.wait(60) and again.state == "finished", again.message


def test_an_output_length_beyond_the_models_context_window_is_refused_at_start():
    at = open_app()
    choose_tiny_run(at, num_prompts=2, output_len=4000)
    start(at)
    assert not at.exception
    (error,) = at.error
    assert "does not fit the 2,048-token context window of builtin:tiny-llama" in shown(error.value)
    assert get_runner().runs() == [] and "run" not in at.query_params


def test_the_engine_api_is_offered_beside_the_pipeline_patterns_and_warm_up_is_on_with_its_count():
    at = open_app()
    assert at.sidebar.selectbox(key="load_pattern").options == [
        "pipeline batch",
        "pipeline concurrency",
        "engine API",
        "request rate",
        "trace replay",
    ]
    assert at.sidebar.checkbox(key="warmup_requests_on").value is True  # on by default, the count beside it
    assert at.sidebar.number_input(key="warmup_requests").value == setting("warmup_requests").widget.start
    assert not {"skip_tokenize", "cancel_rate"} & {getattr(w, "key", "") for w in at.sidebar}
    at.sidebar.selectbox(key="load_pattern").select("engine_api").run()
    assert {"skip_tokenize", "skip_detokenize", "cancel_rate", "use_uvloop"} <= {
        getattr(w, "key", "") for w in at.sidebar
    }
    choose_tiny_run(at, num_prompts=12, output_len=12)
    at.sidebar.checkbox(key="skip_tokenize").check()
    at.sidebar.slider(key="cancel_rate").set_value(0.5)
    start(at)
    assert not at.exception and not at.error
    run = get_runner().get(at.query_params["run"])
    assert run.wait(120) and run.state == "finished", run.message
    load = run.config.load
    assert (load.load_pattern, load.skip_tokenize, load.cancel_rate) == ("engine_api", True, 0.5)
    assert load.warmup_requests == setting("warmup_requests").widget.start
    assert run.record.warmup_seconds is not None  # warmed up, outside the measurement
    at.run()
    assert not at.exception
    cancelled = run.record.metrics["cancelled"]
    assert cancelled > 0 and run.record.metrics["failed"] == 0
    assert f"{cancelled} cancelled" in ended_status(at, run.record)


def test_a_request_rate_is_offered_on_the_embedded_engine_with_its_arrivals_and_limit_but_no_duration():
    at = open_app()
    at.sidebar.selectbox(key="load_pattern").select("request_rate").run()
    keys = {getattr(w, "key", "") for w in at.sidebar}
    assert {"request_rate", "burstiness", "exact_rate_arrivals", "max_concurrency"} <= keys
    assert not {"duration_s", "concurrency_cpu"} & keys  # a time limit is a server client's; slots are the limit's
    at.sidebar.selectbox(key="model_choice").select(TINY)
    at.sidebar.selectbox(key="dataset_builtin").select("builtin:sample")
    at.sidebar.number_input(key="sharegpt_output_len_cpu").set_value(4)
    at.sidebar.number_input(key="num_prompts_cpu").set_value(4)
    at.sidebar.number_input(key="request_rate").set_value(8.0)
    start(at)
    assert not at.exception and not at.error
    run = get_runner().get(at.query_params["run"])
    assert run.wait(60) and run.state == "finished", run.message
    assert (run.config.load.load_pattern, run.config.load.request_rate) == ("request_rate", 8.0)


def test_warm_up_can_be_turned_off_and_a_run_then_sends_none():
    at = open_app()
    choose_tiny_run(at, num_prompts=4, output_len=4)
    at.sidebar.checkbox(key="warmup_requests_on").uncheck()
    start(at)
    run = get_runner().get(at.query_params["run"])
    assert run.wait(60) and run.state == "finished", run.message
    assert run.config.load.warmup_requests == 0 and run.record.warmup_seconds is None


def test_run_again_with_one_thing_changed_starts_it_then_opens_both_compared_against_the_ended_run(
    stored_run_id, results_root
):
    at = open_app(stored_run_id)
    picker = at.selectbox(key=f"run_again_setting_{stored_run_id}")
    # What applies to a batch run of ShareGPT prompts on the embedded engine, the knob a preset shows first.
    assert picker.value == setting("enable_prefix_caching")
    assert {"Concurrency (requests)", "ShareGPT output length (tokens)", "Stream output"} <= set(picker.options)
    assert not {"Request rate (req/s)", "Turns per session (turns)", "Dataset name"} & set(picker.options)
    picker.set_value(setting("concurrency")).run()
    at.number_input(key=f"run_again_{stored_run_id}_concurrency").set_value(2).run()
    at.button(key="run_again_start").click().run()
    assert not at.exception
    again = get_runner().get(at.query_params["run"])
    assert again.run_id != stored_run_id
    stored = History(results_root).config(stored_run_id)
    stored.load.concurrency, stored.label = 2, "stored · concurrency=2"
    assert again.config == stored
    assert again.wait(60) and again.state == "finished", again.message
    at.run()  # the run page's rerun once the run has ended
    assert not at.exception
    assert at.title[0].value == "History"
    assert at.subheader[0].value == "Compare 2 runs"
    assert at.selectbox(key="compare_baseline").value == stored_run_id


def test_run_again_with_a_target_repeats_both_values_until_it_in_a_sweep_and_opens_the_sweep_page(
    stored_run_id, results_root
):
    at = open_app(stored_run_id)
    at.selectbox(key=f"run_again_setting_{stored_run_id}").set_value(setting("temperature")).run()
    at.number_input(key=f"run_again_{stored_run_id}_temperature").set_value(0.5)
    at.number_input(key="run_again_target_moe").set_value(1.0).run()
    assert at.button(key="run_again_start").disabled  # a sweep does not vary the temperature
    assert at.button(key="run_again_start").help.startswith("Temperature is run again once, not until a target")
    at.selectbox(key=f"run_again_setting_{stored_run_id}").set_value(setting("concurrency")).run()
    at.number_input(key=f"run_again_{stored_run_id}_concurrency").set_value(2)
    # The cap at the fewest runs that give an interval: each value runs 3 times, whether within the target or not.
    at.number_input(key="run_again_max_repeats").set_value(3).run()
    at.button(key="run_again_start").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert at.title[0].value == "Knob sweep"
    sweep = get_sweeps()[at.session_state["sweep_id"]]
    stored = History(results_root).config(stored_run_id)
    assert sweep.plan.base == stored and stored.load.concurrency != 2
    assert (sweep.plan.axes[0].name, sweep.plan.axes[0].values) == ("concurrency", (stored.load.concurrency, 2))
    assert sweep.wait(180)
    at.run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert at.success[0].value == "finished: all 6 runs."
    runs = History(results_root).load()
    assert sorted(runs[runs["sweep_id"] == sweep.sweep_id]["concurrency"]) == sorted([stored.load.concurrency, 2] * 3)


def test_a_preset_starts_its_two_runs_on_the_sidebars_engine_then_opens_them_compared():
    at = open_app()
    choose_tiny_run(at)
    at.button(key="preset_1").click().run()  # concurrency 1 vs 8
    assert not at.exception
    first, second = get_runner().runs()
    assert at.query_params["run"] == second.run_id  # the last started is on show; the first's banner links to it
    assert (first.config.engine.model, first.config.load.concurrency, second.config.load.concurrency) == (TINY, 1, 8)
    assert first.config.dataset.dataset == "builtin:sharegpt" and first.config.dataset.num_prompts == 8
    for run in (first, second):
        assert run.wait(120) and run.state == "finished", run.message
    at.run()
    assert not at.exception
    assert at.title[0].value == "History"
    assert at.subheader[0].value == "Compare 2 runs"
    assert at.selectbox(key="compare_baseline").value == first.run_id


def test_a_run_again_while_another_run_holds_the_engine_asks_first_and_once_queued_still_opens_compared(
    stored_run_id,
):
    other = get_runner().submit(long_run(label="other tab"))
    at = open_app(stored_run_id)
    at.selectbox(key=f"run_again_setting_{stored_run_id}").set_value(setting("num_prompts")).run()
    at.number_input(key=f"run_again_{stored_run_id}_num_prompts").set_value(4).run()
    at.button(key="run_again_start").click().run()
    assert not at.exception
    assert [run.run_id for run in get_runner().runs()] == [other.run_id]  # asked, not queued
    (warning,) = [warning for warning in asked(at) if "waits in the queue behind it" in warning]
    assert f"run {other.run_id} (other tab) is " in warning
    at.button(key="confirm_start").click().run()
    again = get_runner().get(at.query_params["run"])
    assert again.state == "queued" and again.config.dataset.num_prompts == 4
    other.cancel()
    assert again.wait(60) and again.state == "finished", again.message
    at.run()
    assert at.title[0].value == "History"
    assert at.selectbox(key="compare_baseline").value == stored_run_id


def test_an_export_in_the_plugin_folder_is_a_download_button_of_the_run_it_builds(
    stored_run_id, toy_export, download_data
):
    at = open_app(stored_run_id)
    assert not at.exception and not at.error
    assert [button.label for button in at.download_button] == [
        "Run ids (TXT)",
        "History rows of this run (CSV)",
        "Per-request table (CSV)",
        "LMDeploy CSV",
        "Report of this run (HTML)",
    ]
    assert download_data(at.download_button[0]) == f"{stored_run_id}\n".encode()
