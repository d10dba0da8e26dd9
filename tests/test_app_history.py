"""The History page through AppTest, on a history made by real runs of the tiny model plus an imported LMDeploy CSV."""

import csv
import io
import json
import math
import shutil
from dataclasses import replace as dataclasses_replace
from datetime import date

import plotly.colors
import pytest
from app_under_test import APP, ROOT
from compared_runs import FIVE, NOT_STREAMED, record_five_runs
from profiled_runs import profiled_run
from streamlit.testing.v1 import AppTest

from bench_core.config import DatasetConfig, EngineConfig, LoadConfig, RunConfig
from bench_core.hardware.run_flags import FLAG_TAGS_HELP
from bench_core.measure.catalog import KEY_COLUMNS
from bench_core.run.run_again import speculation_pair
from bench_core.run.runner import Runner
from bench_core.store.history import RESULTS_ENV, History, RunRecord
from bench_core.store.history_import import lmdeploy_hyperparams
from bench_core.views import report
from bench_core.views.tables import BEYOND_NOISE_MARK, describe_column
from dashboard.history_view import FLAGS_COLUMN
from dashboard.table_view import COMPACT_PADDING_PX, drawn_px

# Each test here runs a real engine, server, app script or process for seconds: not in the fast suite.
pytestmark = pytest.mark.slow

LMDEPLOY_CSV = ROOT / "tests" / "data" / "lmdeploy_csv" / "profile_throughput.csv"


def tiny_config(concurrency: int, label: str) -> RunConfig:
    return RunConfig(
        engine=EngineConfig(backend="transformers", model="builtin:tiny-llama"),
        dataset=DatasetConfig(
            dataset="builtin:sample",
            dataset_name="random",
            num_prompts=8,
            random_input_len=16,
            random_output_len=8,
            random_range_ratio=1.0,
        ),
        load=LoadConfig(concurrency=concurrency, stream_output=True),
        label=label,
    )


@pytest.fixture(scope="module")
def prepared_history(tmp_path_factory, tiny_model_path):
    """Two real runs (concurrency 2 and 4) and two rows imported from LMDeploy's profile_throughput.py."""
    root = tmp_path_factory.mktemp("prepared") / "results"
    runner = Runner(History(root))
    runs = [runner.submit(tiny_config(c, f"tiny x{c}")) for c in (2, 4)]
    for run in runs:
        assert run.wait(60) and run.state == "finished", run.message
    runner.shutdown()
    imported = History(root).import_csv(LMDEPLOY_CSV)
    return root, [run.run_id for run in runs], imported


@pytest.fixture
def history_root(prepared_history, tmp_path, monkeypatch, fresh_dashboard):
    """A private copy of the prepared history, behind fresh cached runner and history objects."""
    source, _, _ = prepared_history
    root = tmp_path / "results"
    shutil.copytree(source, root)
    monkeypatch.setenv(RESULTS_ENV, str(root))
    return root


def open_history() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=60).run()
    return at.switch_page("app_pages/history.py").run()


def select_rows(at: AppTest, run_ids: list[str]) -> AppTest:
    """Select table rows as a click would (AppTest cannot click a dataframe; its selection state is writable)."""
    table = at.dataframe[0]
    positions = [list(table.value["run_id"]).index(run_id) for run_id in run_ids]
    at.session_state[table.key] = {"selection": {"rows": positions, "columns": [], "cells": []}}
    return at.run()


def chart_specs(at: AppTest) -> dict[str, dict]:
    """Plotly figures on the page by their key."""
    return {chart.key: json.loads(chart.proto.spec) for chart in at.get("plotly_chart")}


def subtitle(spec: dict) -> str:
    """A figure's notes under its title, its line breaks read as the spaces they replaced."""
    return spec["layout"]["title"].get("subtitle", {}).get("text", "").replace("<br>", " ")


def column_config(table) -> dict[str, dict]:
    """An st.dataframe's column configuration as the page sent it."""
    return json.loads(table.proto.columns)


def test_the_table_lists_every_run_with_a_link_to_the_run_page(history_root, prepared_history):
    _, run_ids, imported = prepared_history
    at = open_history()
    assert not at.exception
    table = at.dataframe[0].value
    assert sorted(table["run_id"]) == sorted(run_ids + imported)
    assert set(table["status"]) == {"finished", "imported"}
    assert list(table["open"]) == [f"./?run={run_id}" for run_id in table["run_id"]]  # the default page: the root


def test_filters_narrow_the_table(history_root, prepared_history):
    _, run_ids, _ = prepared_history
    at = open_history()
    at.multiselect(key="filter_status").select("imported").run()
    assert set(at.dataframe[0].value["status"]) == {"imported"}
    at.multiselect(key="filter_status").unselect("imported").run()
    at.text_input(key="filter_label").input("X4").run()
    assert list(at.dataframe[0].value["run_id"]) == [run_ids[1]]


def test_a_long_history_is_shown_a_page_at_a_time_the_newest_first(history_root, prepared_history, monkeypatch):
    from dashboard import history_view

    _, run_ids, imported = prepared_history
    monkeypatch.setattr(history_view, "TABLE_PAGE_ROWS", 3)
    at = open_history()
    assert not at.exception
    assert "4 of 4 runs" in at.caption[0].value
    picker = at.selectbox(key="history_page")
    assert picker.options == ["1 to 3 of 4", "4 to 4 of 4"]
    assert list(at.dataframe[0].value["run_id"]) == [*imported[::-1], run_ids[1]]
    picker.select_index(1).run()
    assert list(at.dataframe[0].value["run_id"]) == [run_ids[0]]
    at = select_rows(at, [run_ids[0]])
    assert "Select two or more runs" in at.info[0].value
    # Filters that leave one page's worth: no picker, every run that passes, the newest first.
    at.multiselect(key="filter_status").select("finished").run()
    assert all(box.key != "history_page" for box in at.selectbox)
    assert list(at.dataframe[0].value["run_id"]) == run_ids[::-1]


def test_comparing_two_runs_draws_the_charts_and_marks_better_and_worse(history_root, prepared_history):
    _, run_ids, imported = prepared_history
    at = open_history()
    assert not at.get("plotly_chart")
    at = select_rows(at, [run_ids[0], run_ids[1], imported[0]])
    assert not at.exception
    specs = chart_specs(at)
    # Concurrency takes three values here (2, 4, 256), the number of prompts two.
    assert specs["chart_metric_vs_knob"]["layout"]["xaxis"]["title"]["text"] == describe_column("concurrency").title
    # Each run is named by what tells it apart (its concurrency: 2, 4, 256), then its label or id.
    ours, theirs = ["Concurrency 2 (tiny x2)", "Concurrency 4 (tiny x4)"], f"Concurrency 256 (run {imported[0]})"
    # p99 TTFT: our runs only; LMDeploy's CSV has mean latencies, which bring the imported run in.
    assert [trace["name"] for trace in specs["chart_latency_vs_throughput"]["data"]] == ours
    assert subtitle(specs["chart_latency_vs_throughput"]) == f"No P99 time to first token recorded: {theirs}"
    at.selectbox(key="compare_latency").select("mean_ttft_ms").run()
    names = [trace["name"] for trace in chart_specs(at)["chart_latency_vs_throughput"]["data"]]
    assert sorted(names) == sorted([*ours, theirs])
    # CDFs: one curve per run with per-request data; the imported row is named as lacking it.
    for key in ("chart_cdf_ttft", "chart_cdf_itl"):
        assert [trace["name"] for trace in specs[key]["data"]] == ours
    assert any("No per-request data" in caption.value for caption in at.caption)
    # The runs against the oldest, each by its label or id: the imported rows came last, our first run is the oldest.
    compared = at.dataframe[1].value
    assert list(compared.columns) == ["tiny x2 (baseline)", "tiny x4", imported[0]]
    throughput = compared.loc[describe_column("output_throughput").title].tolist()
    assert "(" not in throughput[0] and all(cell.endswith(" %)") for cell in throughput[1:])
    # Single runs: no spread, so no change is coloured, and the caption says why.
    assert not at.dataframe[1].proto.arrow_data.styler.styles.strip()
    captions = [caption.value for caption in at.caption]
    assert any(report.UNJUDGED_NOTE in caption for caption in captions)
    # Both were run on the same prompts: each is set against the baseline request by request too.
    assert captions[-1] == report.PAIRED_NOTE


def test_two_runs_differing_in_concurrency_say_so_first_and_nothing_else(history_root, prepared_history):
    _, run_ids, _ = prepared_history
    at = select_rows(open_history(), run_ids)
    assert not at.exception
    (differences,) = at.table
    assert differences.value.to_dict("index") == {
        "Concurrency (requests)": {"Concurrency 2 (tiny x2)": "2", "Concurrency 4 (tiny x4)": "4"}
    }
    order = [element.type for element in at.main if element.type in ("table", "plotly_chart")]
    assert order[0] == "table"  # before every chart
    across = at.selectbox(key="compare_knob")
    assert across.options == ["Concurrency (requests)"] and across.value == "concurrency"
    assert at.selectbox(key="compare_colour").value == "run"


def test_compare_charts_colour_each_run_apart_and_label_its_setting(history_root, prepared_history):
    _, run_ids, _ = prepared_history
    specs = chart_specs(select_rows(open_history(), run_ids))
    for key in ("chart_metric_vs_knob", "chart_latency_vs_throughput"):
        traces = specs[key]["data"]
        assert [trace["name"] for trace in traces] == ["Concurrency 2 (tiny x2)", "Concurrency 4 (tiny x4)"]
        colours = {trace["marker"]["color"] for trace in traces}
        assert len(colours) == 2 and colours <= set(plotly.colors.qualitative.Plotly)
        assert all(trace["cliponaxis"] is False for trace in traces)
    labels = [trace["text"] for trace in specs["chart_latency_vs_throughput"]["data"]]
    assert labels == [["Concurrency 2"], ["Concurrency 4"]]


def test_the_baseline_is_the_oldest_run_until_one_is_picked_and_a_pick_stays_while_the_selection_grows(
    history_root, prepared_history
):
    _, run_ids, imported = prepared_history
    at = select_rows(open_history(), run_ids[::-1])
    baseline = at.selectbox(key="compare_baseline")
    assert baseline.value == run_ids[0]  # the oldest
    assert at.dataframe[1].value.columns[0] == "tiny x2 (baseline)"
    baseline.select(run_ids[1]).run()
    compared = at.dataframe[1].value
    assert list(compared.columns[:2]) == ["tiny x4 (baseline)", "tiny x2"]
    assert compared.loc[describe_column("concurrency").title].tolist() == ["4", "2"]
    at = select_rows(at, [*run_ids, imported[0]])
    assert at.selectbox(key="compare_baseline").value == run_ids[1]  # the pick, not the oldest
    assert at.dataframe[1].value.columns[0] == "tiny x4 (baseline)"
    # A picked run that leaves the selection leaves the baseline to the oldest again.
    at = select_rows(at, [run_ids[0], imported[0]])
    assert at.dataframe[1].value.columns[0] == "tiny x2 (baseline)"
    report_html = at.download_button[-1]
    assert report_html.label == "Report of this comparison (HTML)"


@pytest.fixture
def repeated_history(tmp_path, monkeypatch, fresh_dashboard, tiny_model_path) -> list[str]:
    """Two real runs at concurrency 2 and two at 4, alone in a fresh history behind the dashboard."""
    root = tmp_path / "results"
    runner = Runner(History(root))
    runs = [runner.submit(tiny_config(c, f"c{c} #{repeat}")) for repeat in (1, 2) for c in (2, 4)]
    for run in runs:
        assert run.wait(60) and run.state == "finished", run.message
    runner.shutdown()
    monkeypatch.setenv(RESULTS_ENV, str(root))
    return [run.run_id for run in runs]


def test_repeats_say_which_changes_are_beyond_their_noise(repeated_history):
    at = select_rows(open_history(), repeated_history)
    assert not at.exception
    assert list(at.table[0].value.index) == ["Concurrency (requests)"]
    compared = at.dataframe[1].value
    # Recorded c2, c4, c2, c4: the oldest is the baseline, the others follow in the order they ran.
    assert compared.loc[describe_column("concurrency").title].tolist() == ["2", "4", "2", "4"]
    assert compared.loc[report.REPEATS].tolist() == ["2"] * 4
    completed = compared.loc[describe_column("completed").title].tolist()
    assert completed[1:] == ["8 (+0.0 %)"] * 3  # every request done in each run: no change, nothing marked
    marked = [cell for row in compared.to_numpy() for cell in row if cell.endswith(BEYOND_NOISE_MARK)]
    # Only the c4 runs' cells can be judged (against the two c2 runs), never those of the baseline's repeat.
    assert all(not cell.endswith(BEYOND_NOISE_MARK) for cell in compared.iloc[:, 2])
    styles = at.dataframe[1].proto.arrow_data.styler.styles
    assert bool(marked) == ("rgba(46, 160, 67" in styles or "rgba(218, 54, 51" in styles)
    assert report.UNJUDGED_NOTE not in at.caption[-1].value


def test_the_table_shows_output_length_load_and_the_settings_that_differ_in_it(history_root, prepared_history):
    at = open_history()
    table = at.dataframe[0].value.set_index("run_id")
    # Across our CPU runs and LMDeploy's rows: backend, dataset, prompt lengths and load differ.
    for column in ("output_length", "load_pattern", "concurrency", "random_input_len", "random_range_ratio"):
        assert column in table.columns
    assert {table.loc[run_id, "output_length"] for run_id in prepared_history[1]} == {"8"}
    assert {str(table.loc[run_id, "model_random_weights"]) for run_id in prepared_history[1]} == {"True"}  # tiny-llama
    at.multiselect(key="filter_backend").select("transformers").run()
    narrowed = at.dataframe[0].value
    assert "random_input_len" not in narrowed.columns  # the same 16 tokens on every run on show
    assert {"output_length", "load_pattern", "concurrency"} <= set(narrowed.columns)


def test_delete_asks_first_and_then_removes_only_the_chosen_run(history_root, prepared_history):
    _, run_ids, imported = prepared_history
    at = select_rows(open_history(), [run_ids[0]])
    at.button(key="delete_ask").click().run()
    assert run_ids[0] in at.warning[0].value
    assert len(History(history_root).load()) == 4  # nothing gone before the confirmation
    at.button(key="delete_confirm").click().run()
    assert not at.exception
    remaining = History(history_root).load()
    assert sorted(remaining["run_id"]) == sorted([run_ids[1], *imported])
    assert not (history_root / "runs" / run_ids[0]).exists()
    assert (history_root / "runs" / run_ids[1] / "requests.parquet").exists()
    assert sorted(at.dataframe[0].value["run_id"]) == sorted(remaining["run_id"])


def test_delete_can_be_called_off(history_root, prepared_history):
    _, run_ids, _ = prepared_history
    at = select_rows(open_history(), [run_ids[0]])
    at.button(key="delete_ask").click().run()
    at.button(key="delete_keep").click().run()
    assert not at.warning and len(History(history_root).load()) == 4


def test_a_bad_upload_is_one_error_and_writes_nothing(history_root):
    before = (history_root / "history.csv").read_bytes()
    at = open_history()
    at.file_uploader[0].set_value(("notes.csv", b"name,comment\nx,y\n", "text/csv")).run()
    at.button(key="import_button").click().run()
    assert not at.exception
    assert len(at.error) == 1 and "notes.csv" in at.error[0].value
    assert (history_root / "history.csv").read_bytes() == before


def test_an_lmdeploy_csv_upload_adds_its_rows(history_root):
    at = open_history()
    data = (ROOT / "tests" / "data" / "lmdeploy_csv" / "profile_pipeline_api.csv").read_bytes()
    at.file_uploader[0].set_value(("profile_pipeline_api.csv", data, "text/csv")).run()
    at.button(key="import_button").click().run()
    assert "Imported 2 run(s)" in at.success[0].value
    assert len(at.dataframe[0].value) == 6
    assert at.button(key="import_button").disabled  # the uploader starts empty: no second import by accident


def test_downloads_offer_the_whole_history_and_the_selection(history_root, prepared_history, download_data):
    _, run_ids, _ = prepared_history
    at = open_history()
    assert [button.label for button in at.download_button] == ["Download the whole history (CSV)"]
    at = select_rows(at, run_ids[:1])
    assert [button.label for button in at.download_button] == [
        "Download the whole history (CSV)",
        "Download the selected run's row (CSV)",
    ]
    (one,) = list(csv.DictReader(io.StringIO(download_data(at.download_button[1]).decode())))
    assert one["run_id"] == run_ids[0]
    at = select_rows(at, run_ids)
    labels = [button.label for button in at.download_button]
    assert labels == [
        "Download the whole history (CSV)",
        "History rows of this comparison (CSV)",
        "Report of this comparison (HTML)",
    ]
    picked = list(csv.DictReader(io.StringIO(download_data(at.download_button[1]).decode())))
    assert sorted(row["run_id"] for row in picked) == sorted(run_ids)
    report = download_data(at.download_button[2]).decode()
    heading = report[report.index("<h1>") : report.index("</h1>")]
    assert report.startswith("<!DOCTYPE html>") and all(run_id in heading for run_id in run_ids)
    assert "Output throughput vs concurrency" in report and "<h3>Against the baseline</h3>" in report


def test_the_whole_history_is_written_out_only_when_its_download_is_clicked(history_root):
    """Not at every rerun of the page: at 10,000 rows writing the file out takes a second (bench_history_scale)."""
    whole = open_history().download_button[0]
    assert whole.label == "Download the whole history (CSV)"
    assert whole.proto.deferred_file_id and not whole.proto.url


def test_a_run_that_failed_before_measuring_is_listed_as_failed_with_its_reason(
    history_root, prepared_history, tmp_path
):
    _, run_ids, _ = prepared_history
    runner = Runner(History(history_root))
    broken = tmp_path / "broken-model"  # a model folder that fails to load: a run that failed, not a typo refused
    broken.mkdir()
    (broken / "config.json").write_text("{}")
    failed = runner.submit(
        RunConfig(
            engine=EngineConfig(backend="transformers", model=str(broken)),
            dataset=DatasetConfig(dataset="builtin:sample", num_prompts=2),
        )
    )
    assert failed.wait(60) and failed.state == "failed"
    runner.shutdown()
    at = open_history()
    assert not at.exception
    table = at.dataframe[0].value.set_index("run_id")
    assert table.loc[failed.run_id, "status"] == "failed"
    assert table.loc[failed.run_id, "error"].startswith("Could not load the tokenizer of")
    at = select_rows(at, [failed.run_id, run_ids[0]])  # compared with a measured run: charts and table, no error
    assert not at.exception and not at.error
    compared = at.dataframe[1].value  # the comparison table: both runs side by side, no change against nothing
    assert len(compared.columns) == 2
    assert compared.loc[describe_column("output_throughput").title].tolist()[1] == "-"  # the failed run, the newest
    assert any("failed before measuring" in caption.value for caption in at.caption)


@pytest.fixture(scope="module")
def five_runs(tmp_path_factory, tiny_model_path) -> tuple:
    """The five runs of compared_runs, alone in a history of their own (read only)."""
    root = tmp_path_factory.mktemp("five") / "results"
    return root, record_five_runs(root)


@pytest.fixture
def five_run_history(five_runs, monkeypatch, fresh_dashboard) -> list[str]:
    root, run_ids = five_runs
    monkeypatch.setenv(RESULTS_ENV, str(root))
    return run_ids


def test_five_runs_are_named_by_what_tells_each_apart_on_every_part_of_the_comparison(five_run_history):
    at = select_rows(open_history(), five_run_history)
    assert not at.exception
    names = [
        f"Dataset name {dataset}, Concurrency {concurrency}, Stream output {'yes' if streamed else 'no'} (run {run_id})"
        for (dataset, concurrency, streamed), run_id in zip(FIVE, five_run_history)
    ]
    assert list(at.table[0].value.columns) == names
    specs = chart_specs(at)
    streamed = [name for index, name in enumerate(names) if index != NOT_STREAMED]
    latency = specs["chart_latency_vs_throughput"]
    # A legend entry longer than a line is broken onto more (figures.legend_below): the same name.
    assert sorted(trace["name"].replace("<br>", " ") for trace in latency["data"]) == sorted(streamed)
    labels = [text for trace in latency["data"] for text in trace["text"]]
    assert len(set(labels)) == len(streamed)  # the two ShareGPT runs no longer read alike
    # The run without a point is named, and why.
    assert subtitle(latency) == f"Not streamed, so no P99 time to first token: {names[NOT_STREAMED]}"
    for key, metric in (("chart_cdf_ttft", "time to first token"), ("chart_cdf_itl", "inter-token latency")):
        assert [trace["name"].replace("<br>", " ") for trace in specs[key]["data"]] == streamed
        assert subtitle(specs[key]).endswith(f"Not streamed, so no {metric}: {names[NOT_STREAMED]}")


# The width of the page's main column at a 1,600 px window (its sidebar open): where the grids are drawn.
MAIN_PX_AT_1600 = 1140


def test_the_run_id_is_pinned_and_five_compared_runs_fit_beside_the_metric_names(five_run_history):
    at = select_rows(open_history(), five_run_history)
    assert column_config(at.dataframe[0])["run_id"]["pinned"] is True
    compared = at.dataframe[1].value
    assert list(compared.columns) == [f"{five_run_history[0]} ({report.BASELINE})", *five_run_history[1:]]
    # The settings that differ first, then the key metrics.
    assert list(compared.index[:4]) == [
        "Dataset name",
        "Output length (tokens)",
        "Concurrency (requests)",
        "Stream output",
    ]
    assert compared.index[4] == describe_column("output_throughput").title
    # Every column as wide as its text as the grid draws it, and all of them within the page at 1,600 px.
    config = column_config(at.dataframe[1])
    widths = [config["_index"]["width"], *(config[name]["width"] for name in compared.columns)]
    assert sum(widths) <= MAIN_PX_AT_1600
    texts = [[compared.index.name, *compared.index], *([name, *compared[name]] for name in compared.columns)]
    assert all(width >= max(drawn_px(text) for text in column) + 16 for width, column in zip(widths, texts))


# ---- the first view: which run, its flags, its workload and load, the key results -------------------------------

BOTH_FLAGS = "machine busy, client bound"
# A run's numbers that flag it on both counts: other processes saturated the machine, the client's loop woke late.
FLAGGING = {"machine_busy_share": 0.9, "other_cpu_cores": 1.5, "mean_loop_lag_ms": 30.0, "client_saturated_share": 0.9}


def record_run(history: History, run_id: str, day: int, dataset: DatasetConfig, load: LoadConfig, **extra) -> None:
    """A finished run of `dataset` under `load`, started on the `day`th of March 2026, its numbers measured by a real
    profiler (and `extra` numbers)."""
    prof = profiled_run([0.1, 0.2])
    config = RunConfig(
        engine=EngineConfig(backend="transformers", model="builtin:tiny-llama"), dataset=dataset, load=load
    )
    history.record(
        RunRecord(
            run_id=run_id,
            started_at=f"2026-03-{day:02d}T10:00:00+00:00",
            status="finished",
            config=config,
            lmdeploy_columns=prof.lmdeploy_csv_row(lmdeploy_hyperparams(config)),
            metrics={**prof.summary(), **extra},
            requests=prof.request_table(),
        )
    )


@pytest.fixture
def varied_history(tmp_path, monkeypatch, fresh_dashboard) -> History:
    """Three runs, oldest first: random prompts sent at 4 req/s; shared-prefix prompts at their default output length
    (128) in a batch of 8; random prompts in a batch of 4 on a machine too busy, from a client too slow."""
    history = History(tmp_path / "results")
    random = DatasetConfig(dataset="builtin:sample", dataset_name="random", random_input_len=16, random_output_len=8)
    record_run(history, "rate", 1, random, LoadConfig(load_pattern="request_rate", request_rate=4.0))
    prefix = DatasetConfig(dataset="builtin:sample", dataset_name="shared-prefix")
    record_run(history, "prefix", 2, prefix, LoadConfig(concurrency=8))
    record_run(history, "busy", 3, random, LoadConfig(concurrency=4), **FLAGGING)
    monkeypatch.setenv(RESULTS_ENV, str(history.root))
    return history


def test_each_run_shows_the_load_and_output_length_that_apply_to_it(varied_history):
    """A request-rate run read as concurrency 256 and a shared-prefix run's 128 tokens as "default"."""
    table = open_history().dataframe[0].value.set_index("run_id")
    assert math.isnan(table.loc["rate", "concurrency"]) and table.loc["rate", "request_rate"] == 4
    assert table.loc["prefix", "concurrency"] == 8 and math.isnan(table.loc["prefix", "request_rate"])
    assert table.loc["prefix", "output_length"] == "128" and table.loc["rate", "output_length"] == "8"


def test_flags_are_short_tags_explained_in_their_column_help_and_the_key_columns_come_first(varied_history):
    at = open_history()
    table = at.dataframe[0].value
    assert list(table.columns[:7]) == [
        "run_id",
        "open",
        "status",
        FLAGS_COLUMN,
        "dataset_name",
        "concurrency",
        "request_rate",
    ]
    assert list(table.columns[7 : 7 + len(KEY_COLUMNS)]) == list(KEY_COLUMNS)
    assert table.set_index("run_id")[FLAGS_COLUMN].to_dict() == {"busy": BOTH_FLAGS, "prefix": "", "rate": ""}
    config = column_config(at.dataframe[0])
    assert config[FLAGS_COLUMN]["help"] == FLAG_TAGS_HELP
    # As wide as its tags, not a sentence's width.
    assert config[FLAGS_COLUMN]["width"] == max(drawn_px(BOTH_FLAGS), drawn_px(FLAGS_COLUMN)) + COMPACT_PADDING_PX
    # Short headers, their titles in their help.
    assert (
        config["mean_ttft_ms"]["label"] == "Mean TTFT (ms)"
        and config["mean_ttft_ms"]["help"] == describe_column("mean_ttft_ms").title
    )


def test_filters_pick_workloads_concurrencies_and_the_days_runs_started(varied_history):
    at = open_history()
    assert at.multiselect(key="filter_dataset_name").options == ["random", "shared-prefix"]  # not the files
    concurrency = at.multiselect(key="filter_concurrency")
    assert concurrency.options == ["4", "8", "n/a"]
    concurrency.select("n/a").run()
    assert list(at.dataframe[0].value["run_id"]) == ["rate"]
    at.multiselect(key="filter_concurrency").unselect("n/a").run()
    at.multiselect(key="filter_dataset_name").select("random").run()
    assert list(at.dataframe[0].value["run_id"]) == ["busy", "rate"]
    at.multiselect(key="filter_dataset_name").unselect("random").run()
    at.date_input(key="filter_started").set_value((date(2026, 3, 2), date(2026, 3, 3))).run()
    assert list(at.dataframe[0].value["run_id"]) == ["busy", "prefix"]
    at.date_input(key="filter_started").set_value((date(2026, 3, 3),)).run()  # a range being picked: its first day
    assert list(at.dataframe[0].value["run_id"]) == ["busy"]


def subheaders(at: AppTest) -> list[str]:
    return [element.value for element in at.subheader]


def test_the_runs_ticked_stay_ticked_while_the_filters_change_what_is_on_show(varied_history):
    at = select_rows(open_history(), ["busy", "prefix", "rate"])
    assert subheaders(at) == ["Compare 3 runs"]
    at.multiselect(key="filter_dataset_name").select("random").run()
    assert not at.exception and subheaders(at) == ["Compare 2 runs"]  # the two random runs still on show
    at.multiselect(key="filter_dataset_name").unselect("random").run()
    assert subheaders(at) == ["Compare 3 runs"]  # the one filtered out is ticked again when back
    # Unticked while on show, it stays unticked after.
    at = select_rows(at, ["busy", "prefix"])
    at.multiselect(key="filter_status").select("finished").run()
    assert subheaders(at) == ["Compare 2 runs"]
    selected = at.session_state[at.dataframe[0].key]["selection"]["rows"]
    assert sorted(at.dataframe[0].value["run_id"].iloc[selected]) == ["busy", "prefix"]


def test_runs_that_kept_their_answers_show_their_drift_from_the_picked_baseline(
    tmp_path, monkeypatch, fresh_dashboard, tiny_model_path
):
    """Two greedy runs of the same prompts, float32 and bfloat16, that kept their answers: the compare table gives
    the bfloat16 run's exact-match rate against the float32 baseline, though neither run named a drift baseline."""
    root = tmp_path / "results"
    runner = Runner(History(root))
    configs = []
    for dtype in ("float32", "bfloat16"):
        config = tiny_config(2, dtype)
        configs.append(
            dataclasses_replace(
                config,
                engine=dataclasses_replace(config.engine, dtype=dtype),
                # ShareGPT prompts: long enough for bfloat16's rounding to turn a greedy choice within 64 tokens.
                dataset=DatasetConfig(
                    dataset="builtin:sample", num_prompts=4, seed=3, sharegpt_output_len=64, keep_outputs=True
                ),
            )
        )
    runs = [runner.submit(config) for config in configs]
    for run in runs:
        assert run.wait(120) and run.state == "finished", run.message
    runner.shutdown()
    monkeypatch.setenv(RESULTS_ENV, str(root))
    at = select_rows(open_history(), [run.run_id for run in runs])
    assert not at.exception
    compared = at.dataframe[1].value
    assert list(compared.columns) == ["float32 (baseline)", "bfloat16"]
    exact_match = compared.loc[describe_column("drift_exact_match_rate").title].tolist()
    assert exact_match[0].startswith("1") and float(exact_match[1].split()[0]) < 1


def test_an_export_in_the_plugin_folder_is_a_download_button_of_the_comparison_it_builds(
    history_root, prepared_history, toy_export, download_data
):
    _, run_ids, _ = prepared_history
    at = select_rows(open_history(), run_ids)
    assert not at.exception and not at.error
    labels = [button.label for button in at.download_button]
    assert labels == [
        "Download the whole history (CSV)",
        "Run ids (TXT)",
        "History rows of this comparison (CSV)",
        "Report of this comparison (HTML)",
    ]
    assert sorted(download_data(at.download_button[1]).decode().splitlines()) == sorted(run_ids)


def test_a_pair_against_no_speculation_shows_each_runs_acceptance_by_position(tmp_path, monkeypatch, fresh_dashboard):
    root = tmp_path / "results"
    speculative = tiny_config(1, "")
    speculative.engine.speculative_algorithm, speculative.engine.speculative_num_draft_tokens = "prompt_lookup", 2
    runner = Runner(History(root))
    runs = [runner.submit(config) for config in speculation_pair(speculative)]
    for run in runs:
        assert run.wait(60) and run.state == "finished", run.message
    runner.shutdown()
    monkeypatch.setenv(RESULTS_ENV, str(root))
    at = select_rows(open_history(), [run.run_id for run in runs])
    assert not at.exception
    rates = json.loads(History(root).row(runs[1].run_id)["engine_acceptance_by_position"])
    (bars_off, bars_on) = chart_specs(at)["compare_positions_chart"]["data"]
    assert bars_on["x"] == [1, 2] and bars_on["y"] == pytest.approx([rate * 100 for rate in rates])
    assert all(value is None for value in bars_off["y"])  # no speculation: no bars, never 0
