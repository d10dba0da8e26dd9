"""Tables for the dashboard: LMDeploy's percentile table, throughput, per-request rows, run comparison."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from profiled_runs import OUTPUT_LEN, profiled_run, recorded_history

from bench_core.config import SLO
from bench_core.measure.catalog import METRICS
from bench_core.views import tables

TTFTS = [0.05, 0.1, 0.2, 0.4, 0.8]


def test_percentile_table_values_equal_the_summary():
    prof = profiled_run(TTFTS, percentiles=(50, 75, 95, 99))
    summary = prof.summary()
    table = tables.percentile_table(summary, (50, 75, 95, 99), stream_output=True)
    assert list(table.columns) == ["mean", "P50", "P75", "P95", "P99", "std", "min", "max"]
    assert list(table.index) == [
        "End-to-end latency (ms)",
        "TTFT (ms)",
        "TPOT (ms)",
        "ITL (ms)",
        "Tokens per tick (tokens)",
        "TTFT per 1,000 input tokens (ms)",
        "Decode tokens/s per request (tok/s)",
    ]
    for metric, row in zip(("e2e", "ttft", "tpot", "itl"), table.index):
        for column, key in zip(table.columns, ("mean", "p50", "p75", "p95", "p99", "std", "min", "max")):
            assert table.loc[row, column] == summary[f"{key}_{metric}_ms"]
    assert table.loc["TTFT (ms)", "max"] == pytest.approx(800.0)  # stored in seconds, shown in ms
    assert table.loc["Tokens per tick (tokens)", "mean"] == summary["mean_tokens_per_tick"] == 1.0


def test_non_streamed_runs_have_no_ttft_itl_or_tokens_per_tick_rows():
    prof = profiled_run(TTFTS, stream=False)
    table = tables.percentile_table(prof.summary(), (50, 99), stream_output=False)
    assert list(table.index) == ["End-to-end latency (ms)", "TPOT (ms)"]


def test_percentile_columns_follow_the_configured_percentiles():
    summary = profiled_run(TTFTS, percentiles=(90, 99.9)).summary()
    table = tables.percentile_table(summary, (90, 99.9), stream_output=True)
    assert list(table.columns) == ["mean", "P90", "P99.9", "std", "min", "max"]
    assert table.loc["End-to-end latency (ms)", "P99.9"] == summary["p99.9_e2e_ms"]


def test_a_history_row_without_percentile_values_gives_nan_not_an_error():
    table = tables.percentile_table({"mean_e2e_ms": "-", "mean_ttft_ms": 12.5}, (50,), stream_output=True)
    assert math.isnan(table.loc["End-to-end latency (ms)", "mean"])
    assert table.loc["TTFT (ms)", "mean"] == 12.5


def test_throughput_table_counts_every_request_status_with_units():
    prof = profiled_run(TTFTS)
    summary = prof.summary()
    table = tables.throughput_table(summary)
    assert table.loc["Completed requests", "value"] == len(TTFTS)
    assert [table.loc[f"{status} requests", "value"] for status in ("Failed", "Incomplete", "Unfinished")] == [1, 1, 1]
    assert table.loc["Total requests", "value"] == len(TTFTS) + 3
    assert table.loc["Output throughput", "value"] == summary["output_throughput"]
    assert table.loc["Output throughput", "unit"] == "tok/s"
    assert table.loc["Benchmark duration", "unit"] == "s"
    assert "Goodput" not in table.index  # no SLO, no goodput


def test_throughput_table_shows_goodput_when_the_run_had_an_slo():
    prof = profiled_run(TTFTS, slo=SLO(ttft=0.15))
    table = tables.throughput_table(prof.summary())
    assert table.loc["Good requests", "value"] == 2  # TTFT 50 ms and 100 ms
    assert table.loc["Goodput", "unit"] == "req/s"


def test_requests_for_display_shows_ms_and_summarises_itl():
    prof = profiled_run(TTFTS, itl_s=0.01)
    shown = tables.requests_for_display(prof.request_table())
    assert len(shown) == len(TTFTS) + 3
    assert shown["ttft_ms"].iloc[:5].to_numpy() == pytest.approx(np.array(TTFTS) * 1000)
    assert shown["itl_count"].iloc[0] == OUTPUT_LEN - 1
    assert shown["itl_mean_ms"].iloc[0] == pytest.approx(10.0)
    assert shown["status"].tolist()[-3:] == ["incomplete", "failed", "unfinished"]
    assert math.isnan(shown["itl_mean_ms"].iloc[-2])  # the failed request had no gap
    assert not any(isinstance(v, (list, np.ndarray)) for v in shown.to_numpy().ravel())
    assert shown.to_csv(index=False).count("\n") == len(shown) + 1


def test_requests_for_display_reads_a_table_stored_in_the_history(tmp_path):
    history, _ = recorded_history(tmp_path, [("r1", "turbomind", 4, profiled_run(TTFTS))])
    shown = tables.requests_for_display(history.requests("r1"))
    assert shown["itl_count"].iloc[0] == OUTPUT_LEN - 1
    assert shown["itl_mean_ms"].iloc[0] == pytest.approx(10.0)


@pytest.fixture
def three_runs(tmp_path) -> pd.DataFrame:
    _, runs = recorded_history(
        tmp_path,
        [
            ("slow", "pytorch", 1, profiled_run([0.4, 0.5, 0.6])),
            ("fast", "turbomind", 8, profiled_run([0.05, 0.06, 0.07])),
            ("middle", "turbomind", 4, profiled_run([0.1, 0.2, 0.3])),
        ],
    )
    return runs


def test_compare_runs_puts_one_run_per_column_and_one_metric_per_row(three_runs):
    table = tables.compare_runs(three_runs, ["output_throughput", "p99_ttft_ms"])
    assert list(table.columns) == ["pytorch x1", "turbomind x8", "turbomind x4"]
    assert list(table.index) == ["Output throughput (tok/s)", "P99 time to first token (ms)"]
    assert table.loc["Output throughput (tok/s)"].tolist() == three_runs["output_throughput"].tolist()


def test_compare_marks_pick_the_best_and_worst_run_in_both_directions(three_runs):
    metrics = ["mean_ttft_ms", "request_throughput", "concurrency"]
    marks = tables.compare_marks(three_runs, metrics)
    ttft, throughput, concurrency = marks.index
    assert marks.loc[ttft].tolist() == ["worse", "better", ""]  # lower latency is better
    assert marks.loc[throughput].tolist() == ["worse", "better", ""]  # the fast run finished first
    assert marks.loc[concurrency].tolist() == ["", "", ""]  # a setting is neither better nor worse


def test_equal_or_missing_values_are_not_marked():
    runs = pd.DataFrame(
        {
            "run_id": ["a", "b", "c"],
            "label": ["", "", ""],
            "failed": [0, 0, 0],
            "output_throughput": [5.0, np.nan, 7.0],
            "goodput_rps": [np.nan, np.nan, 1.0],
        }
    )
    marks = tables.compare_marks(runs, ["failed", "output_throughput", "goodput_rps", "not_a_column"])
    assert marks.to_numpy().tolist() == [["", "", ""], ["worse", "", "better"], ["", "", ""], ["", "", ""]]


def test_style_comparison_colours_better_green_and_worse_red(three_runs):
    metrics = ["mean_e2e_ms"]
    table, marks = tables.compare_runs(three_runs, metrics), tables.compare_marks(three_runs, metrics)
    html = tables.style_comparison(table, marks).to_html()
    assert "rgba(46, 160, 67" in html and "rgba(218, 54, 51" in html


def test_noise_verdicts_judge_differences_against_the_spread_of_repeats():
    runs = pd.DataFrame(
        {
            "run_id": list("abcdef"),
            "output_throughput": [100.0, 101, 200, 201, 150, 151],
            "mean_ttft_ms": [10.0, 30, 11, 29, 12, 28],
        }
    )
    metrics = ["output_throughput", "mean_ttft_ms"]
    two_configurations = tables.noise_verdicts(runs.iloc[:4], metrics, [0, 0, 1, 1])
    assert two_configurations[0].startswith(tables.BEYOND_NOISE) and "2 vs 2 runs" in two_configurations[0]
    assert two_configurations[1].startswith(tables.WITHIN_NOISE)
    three = tables.noise_verdicts(runs, metrics, [0, 0, 1, 1, 2, 2])
    # Lowest against highest, as the column's help says: the cell stays short enough to read beside the runs.
    assert three[0].startswith(tables.BEYOND_NOISE) and max(len(verdict) for verdict in three) <= 40


def test_noise_verdicts_say_when_there_is_no_spread_to_judge_by():
    runs = pd.DataFrame({"run_id": list("abc"), "output_throughput": [100.0, 200, 300], "goodput_rps": [np.nan] * 3})
    metrics = ["output_throughput", "goodput_rps"]
    assert tables.noise_verdicts(runs.iloc[:2], metrics, [0, 1]) == [tables.SINGLE_RUN, ""]
    assert tables.noise_verdicts(runs, metrics, [0, 0, 1]) == [tables.SINGLE_RUN, ""]  # one side ran once
    assert tables.noise_verdicts(runs, metrics, [0, 0, 0]) == [tables.ONE_CONFIGURATION, ""]
    runs.loc[1:, "output_throughput"] = np.nan  # a run that failed before measuring: one value, nothing to judge
    assert tables.noise_verdicts(runs, metrics, [0, 1, 2]) == ["", ""]


def test_runs_sharing_a_label_or_without_one_are_told_apart_by_run_id():
    runs = pd.DataFrame({"run_id": ["a", "b", "c"], "label": ["base", "base", ""]})
    assert tables.run_names(runs) == ["base · a", "base · b", "c"]


@pytest.mark.parametrize(
    "column, title, larger_is_better",
    [
        ("p99_ttft_ms", "P99 time to first token (ms)", False),
        ("p99.9_itl_ms", "P99.9 inter-token latency (ms)", False),
        ("mean_e2e_ms", "Mean end-to-end latency (ms)", False),
        ("std_ttft_ms", "Std of time to first token (ms)", False),  # less spread is better
        ("p50_tokens_per_tick", "P50 tokens per tick (tokens)", True),
        ("p50_decode_tokens_per_s", "P50 decode tokens/s per request (tok/s)", True),
        ("goodput_rps", "Goodput (req/s)", True),
        ("completed", "Completed requests (requests)", True),
        ("duration_s", "Benchmark duration (s)", False),
        ("cache_max_entry_count", "KV cache share of free GPU memory (fraction)", None),
    ],
)
def test_history_columns_are_described_with_unit_and_direction(column, title, larger_is_better):
    spec = tables.describe_column(column)
    assert (spec.title, spec.larger_is_better) == (title, larger_is_better)


@pytest.mark.parametrize(
    "value, shown",
    [
        (9.088, "9.088"),
        (4582.4312, "4,582.431"),
        (16.0, "16"),
        (1234567, "1,234,567"),
        (0.5, "0.500"),
        (0.0001234, "0.000123"),
        (-3.14159, "-3.142"),
        (None, "-"),
        (math.nan, "-"),
        ("-", "-"),
    ],
)
def test_numbers_are_written_one_way_thousands_three_decimals_and_a_dash_for_missing(value, shown):
    assert tables.format_number(value) == shown


def test_a_formatted_table_keeps_its_row_titles_as_a_column_and_writes_no_none_or_nan():
    summary = profiled_run(TTFTS).summary()
    shown = tables.formatted(tables.percentile_table(summary, (50, 99), stream_output=True))
    assert list(shown.columns[:3]) == ["metric", "mean", "P50"]
    assert "TTFT (ms)" in set(shown["metric"])
    cells = set(shown.to_numpy().ravel())
    assert not cells & {"None", "nan", "NaN"} and "-" in cells  # tokens per tick has no std/min/max
    assert all(len(cell.partition(".")[2]) <= 3 for cell in shown["mean"] if cell != "-")


def test_a_formatted_table_writes_text_as_it_is_and_missing_text_as_a_dash():
    shown = tables.formatted(pd.DataFrame({"verdict": ["beyond the spread", None], "p-value": [0.00012, math.nan]}))
    assert shown.to_dict("list") == {"verdict": ["beyond the spread", "-"], "p-value": ["0.000120", "-"]}


def test_the_workload_table_says_not_reported_where_no_engine_told_what_it_cached():
    summary = {
        "total_cached_tokens": math.nan,
        "prefix_cache_hit_rate": math.nan,
        "mean_cached_tokens": math.nan,
        "mean_ttft_turn1_ms": 40.0,
        "mean_ttft_turn2_ms": 12.5,
    }
    table = tables.workload_metrics_table(summary)
    assert table.to_dict("index") == {
        "Cached prompt tokens": {"value": "not reported", "unit": "tokens"},
        "Prefix cache hit rate": {"value": "not reported", "unit": "fraction"},
        "Mean cached prompt tokens per request": {"value": "not reported", "unit": "tokens"},
        "Mean TTFT of turn 1": {"value": 40.0, "unit": "ms"},
        "Mean TTFT of turn 2": {"value": 12.5, "unit": "ms"},
    }
    assert tables.workload_metrics_table({"completed": 3}).empty  # a run without them: no table
    assert tables.throughput_table(summary).index.intersection(table.index).empty  # shown once, in their own table


def test_ttft_per_1000_input_tokens_says_where_it_means_nothing():
    # A 1-token prompt turned a 1.57 s TTFT into 1,574,352 ms per 1,000 input tokens.
    summary = {"mean_ttft_per_1k_input_ms": 1_574_352.0, "completed": 4, "total_input_tokens": 4}
    caveat = tables.per_1k_input_caveat(summary)
    assert caveat.startswith("TTFT per 1,000 input tokens means little here: the prompts average 1 token (under 100)")
    assert tables.per_1k_input_caveat({**summary, "total_input_tokens": 4 * 512}) == ""
    assert tables.per_1k_input_caveat({"completed": 4, "total_input_tokens": 4}) == ""  # not streamed: no such row
    assert "meaningless for prompts under 100 tokens" in METRICS["ttft_per_1k_input"].definition
