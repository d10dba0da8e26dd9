"""Tables for the dashboard: LMDeploy's percentile table, throughput, per-request rows, run comparison."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from profiled_runs import OUTPUT_LEN, profiled_run, recorded_history

from bench_core.config import SLO, LoadConfig
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


def test_against_baseline_puts_the_baseline_first_and_each_other_run_with_its_change_in_percent(three_runs):
    names = tables.run_names(three_runs)
    cells, marks = tables.against_baseline(three_runs, ["output_throughput", "p99_ttft_ms"], names, [0, 1, 2], 2)
    assert list(cells.columns) == ["turbomind x4", "pytorch x1", "turbomind x8"]  # the baseline first
    assert list(cells.index) == ["Output throughput (tok/s)", "P99 time to first token (ms)"]
    throughput = three_runs["output_throughput"].tolist()
    change = tables.format_change(throughput[0], throughput[2])
    assert cells.iloc[0].tolist()[:2] == [
        tables.format_number(throughput[2]),
        f"{tables.format_number(throughput[0])} ({change})",
    ]
    assert change.startswith("-") and change.endswith(" %")  # the slow run made fewer tokens a second
    # Three setups run once each: no spread, so no change is judged, however large.
    assert (marks == "").all().all() and tables.BEYOND_NOISE_MARK not in "".join(cells.to_numpy().ravel())


def test_format_change_writes_the_change_in_percent_with_its_sign():
    assert tables.format_change(120.0, 100.0) == "+20.0 %"
    assert tables.format_change(96.5, 100.0) == "-3.5 %"
    assert tables.format_change(1350.0, 100.0) == "+1,250 %"
    assert tables.format_change(5.0, -10.0) == "+150 %"  # against the size of a negative base
    assert tables.format_change(100.0, 100.0) == "+0.0 %"
    for value, base in ((1.0, 0.0), (np.nan, 1.0), (1.0, np.nan)):
        assert tables.format_change(value, base) == ""  # nothing to divide by, or nothing measured


REPEATED = pd.DataFrame(
    {
        "run_id": list("abcdef"),
        "output_throughput": [100.0, 101, 200, 201, 100.5, 250],
        "mean_ttft_ms": [10.0, 30, 11, 29, 20, 5],
        "peak_kv_cache_usage": [0.2, 0.21, 0.5, 0.51, 0.2, 0.9],
    }
)
REPEATED_METRICS = ["output_throughput", "mean_ttft_ms", "peak_kv_cache_usage"]


def test_a_change_beyond_the_noise_of_repeats_is_marked_and_coloured_and_one_within_it_is_not():
    # Setups: a and b (the baseline's), c and d, e alone, f alone.
    cells, marks = tables.against_baseline(REPEATED, REPEATED_METRICS, list("abcdef"), [0, 0, 1, 1, 2, 3], 0)
    throughput, ttft, kv_cache = cells.index
    assert marks.loc[throughput].tolist() == ["", "", tables.BETTER, tables.BETTER, "", ""]
    assert cells.loc[throughput, "c"] == f"200 (+100 %) {tables.BEYOND_NOISE_MARK}"
    assert cells.loc[throughput, "b"] == "101 (+1.0 %)"  # a repeat of the baseline: its noise, not judged
    assert cells.loc[throughput, "f"] == "250 (+150 %)"  # run once: no spread to judge by
    assert marks.loc[ttft].tolist() == [""] * 6  # 10 and 30 against 11 and 29: within noise
    assert marks.loc[kv_cache].tolist() == ["", "", tables.CHANGED, tables.CHANGED, "", ""]  # neither way is better
    lower = REPEATED.assign(output_throughput=[200.0, 201, 100, 101, 0, 0])
    _, marks = tables.against_baseline(lower, ["output_throughput"], list("abcdef"), [0, 0, 1, 1, 2, 3], 0)
    assert marks.iloc[0].tolist() == ["", "", tables.WORSE, tables.WORSE, "", ""]


def test_a_run_without_a_value_is_neither_marked_nor_given_a_change():
    runs = REPEATED.assign(output_throughput=[100.0, 101, 200, np.nan, 100, 100])
    cells, marks = tables.against_baseline(
        runs, ["output_throughput", "goodput_rps"], list("abcdef"), [0, 0, 1, 1, 2, 3], 0
    )
    assert cells.loc["Output throughput (tok/s)", "d"] == tables.MISSING and marks.iloc[0, 3] == ""
    assert cells.loc["Goodput (req/s)"].tolist() == [tables.MISSING] * 6  # a column the history lacks


def test_style_comparison_colours_better_green_worse_red_and_other_changes_blue():
    cells, marks = tables.against_baseline(REPEATED, REPEATED_METRICS, list("abcdef"), [0, 0, 1, 1, 2, 3], 0)
    html = tables.style_comparison(cells, marks).to_html()
    assert "rgba(46, 160, 67" in html and "rgba(9, 105, 218" in html
    lower = REPEATED.assign(output_throughput=[200.0, 201, 100, 101, 0, 0])
    cells, marks = tables.against_baseline(lower, ["output_throughput"], list("abcdef"), [0, 0, 1, 1, 2, 3], 0)
    assert "rgba(218, 54, 51" in tables.style_comparison(cells, marks).to_html()


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
    workers = LoadConfig(load_pattern="concurrency", stream_output=True)
    (caveat,) = tables.per_1k_input_caveats(summary, workers)
    assert caveat.startswith("TTFT per 1,000 input tokens means little here: the prompts average 1 token (under 100)")
    assert tables.per_1k_input_caveats({**summary, "total_input_tokens": 4 * 512}, workers) == []
    no_row = {"completed": 4, "total_input_tokens": 4}  # not streamed: no such row
    assert tables.per_1k_input_caveats(no_row, LoadConfig(load_pattern="batch", stream_output=True)) == []
    assert "meaningless for prompts under 100 tokens" in METRICS["ttft_per_1k_input"].definition


@pytest.mark.parametrize(
    ("load", "at_once"),
    [
        (LoadConfig(load_pattern="batch", stream_output=True), True),
        (LoadConfig(load_pattern="request_rate", request_rate=math.inf, stream_output=True), True),
        (LoadConfig(load_pattern="request_rate", request_rate=4.0, stream_output=True), False),
        (LoadConfig(load_pattern="concurrency", stream_output=True), False),
        (LoadConfig(load_pattern="batch", stream_output=False), False),  # no TTFT without streaming
    ],
)
def test_ttft_per_1000_input_tokens_of_requests_sent_at_once_says_it_holds_their_wait(load, at_once):
    # A batch of long prompts gave 31,836 ms per 1k: the last prompt's TTFT is every other prompt's prefill.
    summary = {"mean_ttft_per_1k_input_ms": 31_836.0, "completed": 8, "total_input_tokens": 8 * 512}
    caveats = tables.per_1k_input_caveats(summary, load)
    assert bool(caveats) == at_once
    assert all(caveat.startswith("TTFT per 1,000 input tokens is not prefill speed here") for caveat in caveats)


def _requests_of(input_lens, e2e, status=None) -> pd.DataFrame:
    count = len(input_lens)
    return pd.DataFrame(
        {
            "input_len": input_lens,
            "output_len": [11] * count,
            "status": status or ["success"] * count,
            "ttft_s": [0.1] * count,
            "tpot_s": [0.01] * count,
            "e2e_s": e2e,
        }
    )


def test_runs_of_the_baseline_prompts_are_set_against_it_request_by_request():
    baseline = _requests_of([5, 9, 7], [1.0, 2.0, 4.0])
    faster = _requests_of([5, 9, 7], [0.5, 1.0, 99.0], status=["success", "success", "failed"])
    other_prompts = _requests_of([5, 9, 8], [0.5, 1.0, 2.0])
    table = tables.paired_ratios({"off": baseline, "on": faster, "other": other_prompts}, "off", not_streamed=["on"])
    # The failed request is left out of both sides; TTFT and decode speed need streamed output, which "on" had not.
    assert list(table.columns) == ["on"]
    assert table["on"].to_dict() == {"Time per output token": "1 (1 to 1)", "End-to-end latency": "0.5 (0.5 to 0.5)"}
    assert tables.paired_ratios({"off": baseline, "other": other_prompts}, "off").empty
