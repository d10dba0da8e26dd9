"""The Sweep page through AppTest with the real runner and the tiny model: a grid from the sidebar's settings,
its progress, the four views, the per-point table and the two-point comparison; the sweep in the URL;
past sweeps; cancel and resume; bad input as one error."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest
from app_under_test import APP, shown
from profiled_runs import profiled_run, recorded_history
from streamlit.testing.v1 import AppTest
from sweep_cli import KNEE, KNEE_SERVER, SLO_MS, SMALL_RUN

from bench_core.cli import build_parser, commands, main
from bench_core.cli.sweep import build_plan
from bench_core.config import RunConfig
from bench_core.hardware.contention import busy_runs
from bench_core.measure.speculation_speedup import COSTS, PAYS, UNDECIDED
from bench_core.store.history import RESULTS_ENV
from bench_core.sweep.plan import CPU_SWEEP_OUTPUT_LEN, CPU_SWEEP_PROMPTS, SweepPlan, parse_sweep_arg
from bench_core.sweep.precision import CAPPED, REACHED
from bench_core.sweep.store import save_plan
from bench_core.views import sweep_charts
from bench_core.views.report import chart_count as report_charts
from dashboard import sweep_form
from dashboard.state import get_history, get_runner, get_sweeps

# Each test here runs a real engine, server, app script or process for seconds: not in the fast suite.
pytestmark = pytest.mark.slow

PAGE = "app_pages/sweep.py"
TINY = "builtin:tiny-llama"
SWEEP_TIMEOUT_S = 120


@pytest.fixture(autouse=True)
def fresh_state(tmp_path, monkeypatch, tiny_model_path, fresh_dashboard):
    """Each test has its own history and a fresh runner and sweep registry; what it started is cancelled after."""
    monkeypatch.setenv(RESULTS_ENV, str(tmp_path / "results"))


def open_sweep_page(sweep_id: str | None = None) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=60)
    if sweep_id:
        at.query_params["sweep"] = sweep_id
    at.run()
    return at.switch_page(PAGE).run()


def set_up_tiny_sweep(
    at: AppTest,
    values: str,
    second: tuple[str, str] | None = None,
    repeats: int = 2,
    num_prompts: int = 4,
    output_len: int = 8,
) -> None:
    at.sidebar.selectbox(key="model_choice").select(TINY)
    at.sidebar.selectbox(key="dataset_builtin").select("builtin:sample")
    at.sidebar.number_input(key="sharegpt_output_len_cpu").set_value(output_len)
    at.sidebar.number_input(key="num_prompts_cpu").set_value(num_prompts)
    at.sidebar.number_input(key="concurrency_cpu").set_value(2)
    at.sidebar.number_input(key="slo_ttft_ms").set_value(10_000.0)  # generous: every request is good
    at.text_input(key="sweep_values").set_value(values)
    at.number_input(key="sweep_repeats").set_value(repeats)
    at.number_input(key="sweep_num_prompts").set_value(num_prompts)
    at.number_input(key="sweep_output_len").set_value(output_len)
    if second:
        at.selectbox(key="sweep_name_2").select(second[0]).run()
        at.text_input(key="sweep_values_2").set_value(second[1]).run()  # typed: Start is enabled once they parse


def start_sweep(at: AppTest) -> str:
    at.button(key="sweep_start").click().run()
    assert not at.error, [e.value for e in at.error]
    return at.session_state["sweep_id"]


def table_with_column(at: AppTest, column: str, numbers: tuple[str, ...] = ()):
    """The one dataframe on the page with `column` (AppTest does not expose a dataframe's key); the tables show
    formatted text, so the `numbers` columns are read back as numbers."""
    (table,) = [frame.value for frame in at.dataframe if column in frame.value.columns]
    for name in numbers:
        table[name] = pd.to_numeric(table[name].str.replace(",", ""), errors="coerce")
    return table


def test_the_page_is_in_the_navigation_with_concurrency_to_sweep_by_default():
    at = open_sweep_page()
    assert not at.exception
    assert at.title[0].value == "Knob sweep"
    assert at.selectbox(key="sweep_name").value == "concurrency"
    assert at.text_input(key="sweep_values").value == "1,2,4"
    assert at.selectbox(key="sweep_name_2").value == "(none)" and at.text_input(key="sweep_values_2").disabled
    assert at.number_input(key="sweep_repeats").value == 2
    assert at.button(key="sweep_cancel").disabled and not at.button(key="sweep_start").disabled
    assert "No sweep yet." in [caption.value for caption in at.caption]


def test_the_default_sweep_is_small_on_a_cpu_and_says_how_long_it_takes_before_start():
    at = open_sweep_page()
    assert (at.number_input(key="sweep_num_prompts").value, at.number_input(key="sweep_output_len").value) == (
        CPU_SWEEP_PROMPTS,
        CPU_SWEEP_OUTPUT_LEN,
    )
    (estimate,) = [shown(caption.value) for caption in at.caption if "takes about" in caption.value]
    assert estimate.startswith(
        "concurrency = 1, 2, 4; 3 points × 2 repeats = 6 runs; 24 requests, about 768 output tokens; takes about"
    )
    assert "a rough CPU estimate" in estimate  # an empty history: nothing measured to go by


def test_a_grid_sweep_shows_progress_then_every_view_of_its_results(download_data):
    at = open_sweep_page()
    set_up_tiny_sweep(at, "1,2", second=("max_batch_tokens", "256,512"))
    sweep_id = start_sweep(at)
    assert at.query_params["sweep"] == sweep_id
    assert not at.button(key="sweep_cancel").disabled
    (progress,) = at.get("progress")
    assert progress.proto.text.startswith("running: ") and "/8 runs done" in progress.proto.text
    assert re.search(r"about \d+( min \d\d)? s left$", progress.proto.text)  # the sweep's ETA

    assert get_sweeps()[sweep_id].wait(SWEEP_TIMEOUT_S)
    at.run()
    assert not at.exception
    assert at.success[0].value == "finished: all 8 runs."
    charts = {chart.key: json.loads(chart.proto.spec) for chart in at.get("plotly_chart")}
    assert set(charts) == {"sweep_chart_band", "sweep_chart_heatmap", "sweep_chart_pareto", "sweep_chart_goodput"}
    assert charts["sweep_chart_band"]["layout"]["title"]["text"] == "Output throughput vs concurrency"
    # One line per value of the second setting, and a cross for the points this shared machine ran busy, if any.
    busy = busy_runs(get_history().load()).any()
    assert [trace["name"] for trace in charts["sweep_chart_band"]["data"] if trace.get("showlegend") is not False] == [
        "256",
        "512",
        *([sweep_charts.BUSY_LEGEND] if busy else []),
    ]
    assert charts["sweep_chart_heatmap"]["data"][0]["type"] == "heatmap"
    assert "Pareto frontier" in [trace["name"] for trace in charts["sweep_chart_pareto"]["data"]]
    # The goodput chart says which SLO counted, and draws no target until one is set.
    goodput = charts["sweep_chart_goodput"]
    assert goodput["layout"]["title"]["subtitle"]["text"] == "Good requests: TTFT ≤ 10,000 ms; no target set"
    assert "Highest load meeting the target" not in [trace["name"] for trace in goodput["data"]]
    at.number_input(key="sweep_target_slo_attainment").set_value(0.9).run()
    goodput = next(
        json.loads(chart.proto.spec) for chart in at.get("plotly_chart") if chart.key == "sweep_chart_goodput"
    )
    assert "Highest load meeting the target" in [trace["name"] for trace in goodput["data"]]  # every request met it

    assert (
        sum(
            len(trace["x"])
            for trace in charts["sweep_chart_pareto"]["data"]
            if trace["name"] != sweep_charts.BUSY_LEGEND
        )
        == 4
    )  # a marker per point (and a cross on a busy one)
    points = table_with_column(
        at,
        "std",
        ("concurrency", "max_batch_tokens", "n", "95% CI low", "mean", "95% CI high", "lowest run", "highest run"),
    )
    output = points[points["metric"] == "Output throughput (tok/s)"]
    assert output[["concurrency", "max_batch_tokens", "n"]].values.tolist() == [
        [1, 256, 2],
        [1, 512, 2],
        [2, 256, 2],
        [2, 512, 2],
    ]
    # Two repeats are too few for a 95% interval (it reached below 0 tok/s): the table gives their range and says so.
    assert output["95% CI low"].isna().all() and output["95% CI high"].isna().all()
    assert (output["lowest run"] <= output["mean"]).all() and (output["mean"] <= output["highest run"]).all()
    (note,) = [shown(caption.value) for caption in at.caption if "physical bounds" in caption.value]
    assert "concurrency=1, max_batch_tokens=256" in note and "too few runs for a 95% interval" in note
    compared = table_with_column(at, "verdict")
    assert at.selectbox(key="sweep_point_a").value == "concurrency=1, max_batch_tokens=256"
    assert at.selectbox(key="sweep_point_b").value == "concurrency=2, max_batch_tokens=512"
    assert set(compared["verdict"]) <= {"beyond the run-to-run spread", "within the run-to-run spread"}
    assert (compared["runs (A, B)"] == "2, 2").all()
    past = table_with_column(at, "sweep_id", ("finished", "runs"))
    assert past[["sweep_id", "finished", "runs"]].values.tolist() == [[sweep_id, 8, 8]]
    assert [button.label for button in at.download_button] == [
        "History rows of this sweep (CSV)",
        "Report of this sweep (HTML)",
    ]
    report = download_data(at.download_button[1]).decode()
    assert report.startswith("<!DOCTYPE html>") and f"<h1>Sweep {sweep_id}</h1>" in report
    # Every view at the page's first choices: the band and the heatmap, three Pareto views, goodput and SLO
    # attainment at each max_batch_tokens (the sidebar's 10 s TTFT SLO recomputed them).
    assert report_charts(report) == 9 and "Goodput vs concurrency, at max_batch_tokens 512" in report
    assert (
        "good requests: TTFT ≤ 10,000 ms; target: SLO attainment (fraction) ≥ 0.9" in report
    )  # the page's target, no other
    (estimate,) = [shown(caption.value) for caption in at.caption if "takes about" in caption.value]
    assert "from the output throughput of 8 finished run(s) of builtin:tiny-llama" in estimate


def test_after_a_restart_the_sweep_is_rebuilt_from_its_plan_and_the_history_and_resumes():
    at = open_sweep_page()
    set_up_tiny_sweep(at, "1,2", repeats=1)
    sweep_id = start_sweep(at)
    assert get_sweeps()[sweep_id].wait(SWEEP_TIMEOUT_S)
    get_sweeps.clear()  # as after a server restart: only the files remain

    again = open_sweep_page(sweep_id)
    assert not again.exception
    assert again.subheader[0].value == f"Sweep {sweep_id}"
    assert again.success[0].value == "finished: all 2 runs."
    assert {chart.key for chart in again.get("plotly_chart")} >= {"sweep_chart_band", "sweep_chart_pareto"}

    history = get_history()
    history.delete(history.load()["run_id"].iloc[:1])  # as if that run had been cancelled
    half_done = open_sweep_page(sweep_id)
    assert half_done.warning[0].value == "stopped: 1 of 2 runs finished; resume the sweep to run the other 1."
    half_done.button(key="sweep_resume").click().run()
    assert get_sweeps()[sweep_id].wait(SWEEP_TIMEOUT_S)
    assert half_done.run().success[0].value == "finished: all 2 runs."


def test_cancel_stops_the_sweep_and_resume_runs_the_rest():
    at = open_sweep_page()
    set_up_tiny_sweep(at, "1,2", repeats=1, num_prompts=200, output_len=64)  # minutes: it is cancelled
    sweep_id = start_sweep(at)
    sweep = get_sweeps()[sweep_id]
    at.button(key="sweep_cancel").click().run()
    assert sweep.wait(30)
    at.run()
    assert not at.exception
    assert at.warning[0].value == "cancelled: 0 of 2 runs finished; resume the sweep to run the other 2."
    at.button(key="sweep_resume").click().run()
    resumed = get_sweeps()[sweep_id]
    assert resumed is not sweep and resumed.active and resumed.total == 2
    assert at.get("progress")[0].proto.text.startswith("running: 0/2 runs done")


def test_start_sweep_while_a_sweep_runs_starts_nothing_twice_and_asks_before_a_second_sweep():
    at = open_sweep_page()
    set_up_tiny_sweep(at, "1,2", repeats=1, num_prompts=200, output_len=64)  # minutes: it is cancelled
    first = start_sweep(at)
    start_sweep(at)  # pressed again with the same settings while it runs, as the Run page's Start
    assert list(get_sweeps()) == [first] and at.query_params["sweep"] == first
    assert any(info.value.startswith(f"Already started: sweep {first} is running, 0/2 runs done") for info in at.info)
    assert not at.warning

    at.text_input(key="sweep_values").set_value("2,4")
    at.button(key="sweep_start").click().run()
    assert list(get_sweeps()) == [first]  # asked, not started
    (warning,) = at.warning
    assert warning.value.startswith(f"Already running: sweep {first} is running") and "take turns" in warning.value
    at.button(key="sweep_discard_start").click().run()
    assert not at.warning and list(get_sweeps()) == [first]

    at.button(key="sweep_start").click().run()
    at.button(key="sweep_confirm_start").click().run()
    assert not at.exception and not at.error
    (first_sweep, second) = get_sweeps().values()
    assert second.sweep_id == at.query_params["sweep"] != first and second.active
    assert [axis.values for axis in second.plan.axes] == [(2, 4)]
    first_sweep.cancel(), second.cancel()
    assert first_sweep.wait(SWEEP_TIMEOUT_S) and second.wait(SWEEP_TIMEOUT_S)


def test_bad_sweep_values_are_one_error_and_start_nothing():
    at = open_sweep_page()
    set_up_tiny_sweep(at, "1,x")
    at.button(key="sweep_start").click().run()
    assert [e.value for e in at.error] == ["Sweep value 'x' for concurrency is not a whole number from 1 to 1,000,000."]
    assert not at.exception
    assert get_sweeps() == {} and get_runner().runs() == []
    assert "sweep" not in at.query_params


def test_an_unknown_sweep_in_the_url_is_one_error():
    at = open_sweep_page("sweep-19990101-000000-dead")
    assert not at.exception
    (error,) = at.error
    assert error.value.startswith("There is no sweep sweep-19990101-000000-dead")


def test_the_settings_offered_are_those_the_sidebars_dataset_and_load_pattern_use():
    at = open_sweep_page()

    def offered() -> set[str]:
        return {option.split(" (")[0] for option in at.selectbox(key="sweep_name").options}

    assert {"concurrency", "sharegpt_output_len"} <= offered()
    assert not {"random_output_len", "output_len", "request_rate"} & offered()  # they would change nothing
    at.sidebar.radio(key="dataset_name").set_value("shared-prefix").run()
    assert {"output_len", "prefix_len", "prefix_share"} <= offered() and "sharegpt_output_len" not in offered()
    assert not at.error and not at.button(key="sweep_start").disabled


def set_up_knee_search(at: AppTest) -> None:
    """A capacity search of max_concurrency within a 1.5 s TTFT, each probe starting the server whose first tokens
    come late beyond KNEE requests in flight (sweep_cli.KNEE_SERVER), {knee} given its one value on the page."""
    at.sidebar.selectbox(key="backend").select("openai").run()
    at.sidebar.text_input(key="knob_tokenizer").input(TINY)
    at.sidebar.selectbox(key="dataset_builtin").select("builtin:sample")
    at.sidebar.number_input(key="sharegpt_output_len_cpu").set_value(4)
    at.sidebar.number_input(key="num_prompts_cpu").set_value(8)
    at.sidebar.number_input(key="slo_ttft_ms").set_value(float(SLO_MS))
    at.radio(key="sweep_kind").set_value(sweep_form.FIND_MAX).run()
    at.checkbox(key="sweep_server_per_run").check().run()
    at.text_input(key="sweep_server_cmd").input(KNEE_SERVER).run()
    at.text_input(key="sweep_server_setting_knee").input(str(KNEE))
    at.selectbox(key="find_max_setting").select("max_concurrency").run()


def test_a_capacity_search_started_from_the_page_finds_the_servers_knee_within_the_slo_it_states(download_data):
    at = open_sweep_page()
    set_up_knee_search(at)
    assert not at.error and not at.exception, [e.value for e in at.error]
    captions = [shown(caption.value) for caption in at.caption]
    assert f"Good requests: TTFT ≤ {SLO_MS:,} ms, as set under Goodput SLO in the sidebar." in captions
    # The search's size is bounded by its budget only: 40 probes of 8 requests, and no time to promise.
    (estimate,) = [caption for caption in captions if "no duration estimate" in caption]
    assert estimate == (
        f"highest max_concurrency at which 90% of requests meet the SLO (TTFT ≤ {SLO_MS:,} ms), within 10% · a server "
        "started per run; at most "
        "320 requests and 1,280 output tokens; no duration estimate: a search runs until it finds its load, at most 40 "
        "probes (--find-max-probes) and 24 h 00 min (--find-max-time) at its point."
    )
    sweep_id = start_sweep(at)
    (progress,) = at.get("progress")  # the search decides how many probes it runs: no fraction of them, no time left
    assert re.fullmatch(r"searching: \d probes done(, now max_concurrency=\d)?", progress.proto.text)
    plan = get_sweeps()[sweep_id].plan
    # The plan the command line builds from the same settings.
    (sweep_command,) = [command for command in commands() if command.name == "sweep"]
    cli_args = build_parser().parse_args(
        [
            *SMALL_RUN[:2],
            "--num-prompts",
            "8",
            "--server-cmd",
            KNEE_SERVER,
            "--server-setting",
            f"knee={KNEE}",
            "--find-max",
            "max_concurrency",
            "--slo-ttft-ms",
            str(SLO_MS),
        ]
    )
    cli_plan = build_plan(cli_args, sweep_command.engine_commands["restful"])
    assert (plan.find_max, plan.server_cmd, plan.axes, plan.fixed_server_settings()) == (
        cli_plan.find_max,
        cli_plan.server_cmd,
        cli_plan.axes,
        cli_plan.fixed_server_settings(),
    )
    assert get_sweeps()[sweep_id].wait(SWEEP_TIMEOUT_S)
    at.run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert at.success[0].value == "finished: all 4 probes."
    assert f"**Highest max\\_concurrency meeting the target: {KNEE}**" in [m.value for m in at.markdown]
    (chart,) = [json.loads(element.proto.spec) for element in at.get("plotly_chart")]
    assert chart["layout"]["title"]["subtitle"]["text"].split("<br>") == [
        f"Good requests: TTFT ≤ {SLO_MS:,} ms; target attainment 0.9",
        "Search: max_concurrency from 1 up to 8, within 10%, at most 40 probes",
        "and 24 h 00 min a point",
        f"A server started per run, with knee={KNEE}",
    ]
    probes = table_with_column(at, "attainment", ("load",))
    assert probes["load"].tolist() == [1, 2, 4, 3] and probes["met"].tolist() == ["True", "True", "False", "True"]
    report = download_data(at.download_button[1]).decode()
    assert (
        f"good requests: TTFT ≤ {SLO_MS:,} ms; target attainment 0.9" in report
        and "Search: max_concurrency from 1 up to 8, within 10%" in report
        and f"A server started per run, with knee={KNEE}" in report
    )


def test_a_sweep_over_a_server_setting_starts_a_server_per_run_and_says_so_on_its_charts():
    at = open_sweep_page()
    at.sidebar.selectbox(key="backend").select("openai").run()
    at.sidebar.text_input(key="knob_tokenizer").input(TINY)
    at.sidebar.selectbox(key="dataset_builtin").select("builtin:sample")
    at.sidebar.number_input(key="sharegpt_output_len_cpu").set_value(4)
    at.sidebar.number_input(key="num_prompts_cpu").set_value(4)
    at.checkbox(key="sweep_server_per_run").check().run()
    at.text_input(key="sweep_server_cmd").input(KNEE_SERVER).run()
    assert "{knee} (server command)" in at.selectbox(key="sweep_name").options
    at.selectbox(key="sweep_name").select("knee").run()
    at.text_input(key="sweep_values").set_value("1,8")
    at.number_input(key="sweep_repeats").set_value(1).run()
    assert not at.error, [e.value for e in at.error]
    # Each server names its model once up: no past run of it to time the sweep by, said as such.
    assert (
        "knee = 1, 8; 2 points × 1 repeats = 2 runs · a server started per run; 8 requests, about 32 output tokens; no "
        "duration estimate: no finished run of the model each server serves on openai to estimate from."
    ) in [shown(caption.value) for caption in at.caption]
    sweep_id = start_sweep(at)
    assert get_sweeps()[sweep_id].wait(SWEEP_TIMEOUT_S)
    at.run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert at.success[0].value == "finished: all 2 runs."
    band = next(json.loads(chart.proto.spec) for chart in at.get("plotly_chart") if chart.key == "sweep_chart_band")
    assert band["layout"]["title"]["subtitle"]["text"] == "A server started per run"
    assert get_history().load()["server_settings"].tolist() == ['{"knee": 1}', '{"knee": 8}']


def test_a_search_that_cannot_work_is_one_error_beside_its_inputs_and_start_stays_disabled():
    at = open_sweep_page()
    at.sidebar.selectbox(key="backend").select("openai").run()
    at.radio(key="sweep_kind").set_value(sweep_form.FIND_MAX).run()

    def refused() -> list[str]:
        assert not at.exception and at.button(key="sweep_start").disabled
        return [shown(error.value) for error in at.error]

    assert refused() == [
        "--find-max looks for the highest load within an SLO: give --slo-ttft-ms, --slo-tpot-ms or --slo-e2e-ms."
    ]
    assert "Good requests: no threshold set yet." in shown(at.caption[1].value)
    at.sidebar.number_input(key="slo_ttft_ms").set_value(1000.0)
    at.number_input(key="find_max_precision").set_value(0.0).run()
    assert refused() == ["--find-max-precision must be a number from 0.001 to 1; got 0."]
    at.number_input(key="find_max_precision").set_value(0.1)
    at.sidebar.selectbox(key="load_pattern_server").select("batch").run()
    assert refused() == [
        "Cannot search request_rate under the pipeline batch load pattern: it applies under request rate only."
    ]
    at.sidebar.selectbox(key="load_pattern_server").select("request_rate")
    at.checkbox(key="sweep_server_per_run").check().run()
    at.text_input(key="sweep_server_cmd").input("python -m my_server --port 8000").run()
    assert refused() == [
        "The server command has no {port} field: the sweep chooses a free port for each run and reaches the server "
        "there."
    ]
    assert get_sweeps() == {} and get_runner().runs() == []


def test_a_sweep_with_a_target_margin_of_error_says_where_each_point_ended():
    at = open_sweep_page()
    set_up_tiny_sweep(at, "1", repeats=1)
    assert at.selectbox(key="sweep_target_moe_metric").disabled  # no target yet: the repeats are a fixed count
    at.number_input(key="sweep_target_moe").set_value(1.0)
    at.number_input(key="sweep_max_repeats").set_value(2).run()
    assert at.button(key="sweep_start").disabled
    assert [shown(error.value) for error in at.error] == [
        "--max-repeats must be at least 3 with --target-moe: a 95% interval needs 3 runs; got 2."
    ]
    # The cap at the fewest runs that give an interval: the point runs 3 times, whether its margin is within the
    # target then (a steady machine) or not (a busy one).
    at.number_input(key="sweep_max_repeats").set_value(3).run()
    assert not at.error, [e.value for e in at.error]
    assert any(
        shown(caption.value).startswith(
            "concurrency = 1; 1 points, each repeated until ±100% (95% interval) on Output throughput (tok/s), "
            "3 to 3 runs a point: at most 3 runs;"
        )
        for caption in at.caption
    )
    sweep_id = start_sweep(at)
    assert get_sweeps()[sweep_id].wait(SWEEP_TIMEOUT_S)
    at.run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert at.success[0].value == "finished: all 3 runs."
    table = table_with_column(at, "margin of error", numbers=("runs",))
    assert table["runs"].tolist() == [3] and table["outcome"].iloc[0] in (REACHED, CAPPED)
    (summary,) = [shown(caption.value) for caption in at.caption if caption.value.startswith("Target")]
    assert summary.startswith("Target ±100% (95% interval) on Output throughput (tok/s), 3 to 3 runs a point. ")
    assert "at 1 point: concurrency=1 (3 runs, ±" in summary


def test_an_export_in_the_plugin_folder_is_a_download_button_of_the_sweep_it_builds(
    tmp_path, toy_export, download_data
):
    """A sweep recorded before the server started (its plan and two runs, no engine): the toy export's button comes
    first, by its order, and hands over what its builder makes of the sweep's runs."""
    plan = SweepPlan("sweep-toy", RunConfig(), (parse_sweep_arg("concurrency=1,2"),), repeats=1)
    runs = [(f"toy{index}", "transformers", index + 1, profiled_run([0.1 * (index + 1), 0.2])) for index in range(2)]
    history, _ = recorded_history(tmp_path / "results", runs, sweep_id=plan.sweep_id)
    save_plan(history, plan)
    at = open_sweep_page(plan.sweep_id)
    assert not at.exception and not at.error
    assert [button.label for button in at.download_button] == [
        "Run ids (TXT)",
        "History rows of this sweep (CSV)",
        "Report of this sweep (HTML)",
    ]
    assert download_data(at.download_button[0]) == b"toy0\ntoy1\n"


def test_a_sweep_over_the_draft_length_states_and_charts_the_advised_length(tmp_path):
    argv = ["sweep", "pipeline", "builtin:sample", TINY, "--backend", "transformers", "--load", "concurrency"]
    argv += ["-c", "1", "-n", "4", "--sharegpt-output-len", "16", "--stream-output"]
    argv += ["--speculative-algorithm", "prompt_lookup", "--sweep", "speculative_num_draft_tokens=1,3"]
    assert main([*argv, "--results", str(tmp_path / "results"), "--csv", ""]) == 0
    (sweep_id,) = pd.read_csv(tmp_path / "results" / "history.csv")["sweep_id"].unique()
    at = open_sweep_page(sweep_id)
    assert not at.exception
    (said,) = [c.value for c in at.caption if "draft length advised" in c.value or c.value.startswith("Advised")]
    charts = {chart.key: json.loads(chart.proto.spec) for chart in at.get("plotly_chart")}
    if said.startswith("Advised"):  # the machine's timings decide which length; the page must say and mark the same
        found = re.search(r"draft (\d+) tokens? per step", said)
        advised = int(found.group(1)) if found else 0  # "speculation does not pay"
        figure = charts["sweep_chart_draft_length_1"]
        assert figure["layout"]["title"]["text"] == "TPOT by draft length"
        assert [shape["x0"] for shape in figure["layout"]["shapes"]] == [advised]
        assert any(c.value.startswith("Model: a step drafting k tokens") for c in at.caption)
    else:
        assert not any(key.startswith("sweep_chart_draft_length") for key in charts)


def test_a_sweep_against_no_speculation_says_by_load_whether_it_paid_in_the_cli_and_on_the_page(tmp_path, capsys):
    argv = ["sweep", "pipeline", "builtin:sample", TINY, "--backend", "transformers", "-n", "4"]
    argv += ["--sharegpt-output-len", "16", "--stream-output", "--speculative-algorithm", "prompt_lookup"]
    argv += ["--against-no-speculation", "--sweep", "concurrency=1,2", "--report", str(tmp_path / "sweep.html")]
    assert main([*argv, "--results", str(tmp_path / "results"), "--csv", ""]) == 0
    printed = capsys.readouterr().out
    history = pd.read_csv(tmp_path / "results" / "history.csv", keep_default_na=False)
    assert sorted(zip(history["concurrency"], history["speculative_algorithm"])) == [
        (1, ""),
        (1, "prompt_lookup"),
        (2, ""),
        (2, "prompt_lookup"),
    ]
    assert set(history["decode_path"]) == {"generate"}  # the pair differs in the drafting alone
    table = printed.split("Speculation against none, by load")[1]
    lines = table.splitlines()[2:4]
    assert [line.split()[:2] for line in lines] == [["1", "1"], ["2", "1"]]  # each load's one pair of runs
    # The machine's timings decide which verdict.
    assert all(line.endswith((PAYS, COSTS, UNDECIDED)) for line in lines), lines
    (sentence,) = [line for line in printed.splitlines() if line.startswith("Speculation paid")]
    assert "TPOT with speculation over without, on the same prompts (95% paired interval): concurrency=1 " in sentence
    report = (tmp_path / "sweep.html").read_text()
    assert "Speculation against none, by load: with over without" in report and sentence.split(".")[0] in report

    at = open_sweep_page(history["sweep_id"].iloc[0])
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert [c.value for c in at.caption if c.value.startswith("Speculation paid")] == [sentence]
    charts = {chart.key: json.loads(chart.proto.spec) for chart in at.get("plotly_chart")}
    figure = charts["sweep_chart_speedup_1"]
    assert figure["layout"]["title"]["text"] == "Speculation against none, by load"
    assert figure["data"][0]["x"] == [1, 2]
    shown_table = table_with_column(at, "run pairs", numbers=("run pairs",))
    assert shown_table["run pairs"].tolist() == [1, 1]


def test_the_page_offers_speculation_against_none_where_the_sidebar_speculates():
    at = open_sweep_page()
    assert "sweep_against_no_speculation" not in [box.key for box in at.checkbox]
    set_up_tiny_sweep(at, "1,2", repeats=1)
    at.sidebar.selectbox(key="knob_speculative_algorithm").select("prompt_lookup").run()
    at.checkbox(key="sweep_against_no_speculation").check().run()
    assert not at.error, [e.value for e in at.error]
    assert any(
        shown(caption.value).startswith(
            "concurrency = 1, 2 × speculative_algorithm = none, prompt_lookup; 4 points × 1 repeat"
        )
        for caption in at.caption
    ), [shown(c.value) for c in at.caption]
    at.selectbox(key="sweep_name_2").select("max_batch_tokens").run()
    at.text_input(key="sweep_values_2").set_value("64,128").run()
    assert [shown(error.value) for error in at.error] == [
        "--against-no-speculation adds the axis speculation off/on to the sweep: sweep one setting with it."
    ]
