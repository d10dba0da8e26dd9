"""The metric catalog: every name a metric goes by is generated from its one declaration."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from profiled_runs import OUTPUT_LEN, profiled_run, recorded_history

from bench_core.measure import catalog
from bench_core.measure.catalog import CATALOG, COMPARED_COLUMNS, METRICS
from bench_core.store.history_import import HISTORY_LEAD_COLUMNS, SAVE_CSV_COLUMNS, SAVE_CSV_HYPERPARAMS
from bench_core.sweep import results as sweep_results
from bench_core.views import tables

# The two metrics added to prove the catalog: one declaration each, nothing else.
NEW_METRICS = ("ttft_per_1k_input", "decode_tokens_per_s")


def test_lmdeploys_csv_columns_come_from_the_catalog_in_its_order():
    assert SAVE_CSV_COLUMNS == SAVE_CSV_HYPERPARAMS + (
        "completed",
        "total_input_tokens",
        "total_output_tokens",
        "duration",
        "request_throughput",
        "input_throughput",
        "output_throughput",
        "mean_e2e_latency_ms",
        "mean_ttft_ms",
        "mean_tpot_ms",
        "mean_itl_ms",
    )
    assert HISTORY_LEAD_COLUMNS[len(SAVE_CSV_HYPERPARAMS) :] == (
        "completed",
        "total_input_tokens",
        "total_output_tokens",
        "duration_s",
        "request_throughput",
        "input_throughput",
        "output_throughput",
        "mean_e2e_ms",
        "mean_ttft_ms",
        "mean_tpot_ms",
        "mean_itl_ms",
    )
    assert catalog.LEGACY_COLUMNS == {"duration": "duration_s", "mean_e2e_latency_ms": "mean_e2e_ms"}


def test_every_summary_key_is_a_catalog_column_described_from_it():
    summary = profiled_run([0.05, 0.1, 0.2], percentiles=(50, 99.9)).summary()
    for key in summary:
        metric, statistic = catalog.find_column(key)
        assert metric.column(statistic) == key
        assert tables.describe_column(key).unit == metric.shown_unit


@pytest.mark.parametrize(
    "name, found",
    [
        ("p99.9_itl_ms", ("itl", "p99.9")),
        ("mean_e2e_last_line_ms", ("e2e_last_line", "mean")),
        ("goodput_rps", ("goodput", "value")),
        ("p50_tokens_per_tick", ("tokens_per_tick", "p50")),
        ("px_ttft_ms", None),
        ("mean_e2e_latency_ms", None),
        ("concurrency", None),
    ],
)
def test_columns_are_found_by_the_names_the_catalog_generates(name, found):
    result = catalog.find_column(name)
    assert (result[0].key, result[1]) == found if found else result is None


def test_the_new_metrics_follow_their_formulas_per_request():
    table = profiled_run([0.05, 0.1], itl_s=0.01).request_table()
    ok = table["status"] == "success"
    ttft_per_1k = METRICS["ttft_per_1k_input"].per_request(table, True)[ok.to_numpy()]
    assert ttft_per_1k == pytest.approx([0.05 / 10 * 1000, 0.1 / 10 * 1000])  # input_len 10
    decode = METRICS["decode_tokens_per_s"].per_request(table, True)[ok.to_numpy()]
    assert decode == pytest.approx([(OUTPUT_LEN - 1) / ((OUTPUT_LEN - 1) * 0.01)] * 2)  # 100 tok/s


def test_the_new_metrics_are_summarised_with_every_statistic_and_need_streaming():
    summary = profiled_run([0.05, 0.1], percentiles=(50, 99)).summary()
    assert summary["mean_ttft_per_1k_input_ms"] == pytest.approx(7500.0)  # 7.5 s per 1,000 input tokens
    assert summary["p50_decode_tokens_per_s"] == pytest.approx(100.0)
    assert {"std_decode_tokens_per_s", "min_ttft_per_1k_input_ms", "max_ttft_per_1k_input_ms"} <= set(summary)
    unstreamed = profiled_run([0.05, 0.1], stream=False).summary()
    assert math.isnan(unstreamed["mean_ttft_per_1k_input_ms"]) and math.isnan(unstreamed["mean_decode_tokens_per_s"])


def test_the_new_metrics_reach_the_history_the_compare_table_and_the_sweep_picker(tmp_path):
    _, runs = recorded_history(
        tmp_path,
        [
            ("slow", "pytorch", 1, profiled_run([0.4, 0.8], itl_s=0.02)),
            ("fast", "turbomind", 8, profiled_run([0.05, 0.1], itl_s=0.01)),
        ],
    )
    for key in NEW_METRICS:
        metric = METRICS[key]
        assert {metric.column("mean"), metric.column("p99")} <= set(runs.columns)  # history columns
        assert metric.column("mean") in sweep_results.SWEEP_METRICS  # the sweep metric picker's list
    compared, _ = tables.against_baseline(runs, COMPARED_COLUMNS, tables.run_names(runs), [0, 1], 0)
    for title, values, change in (
        ("Mean TTFT per 1,000 input tokens (ms)", [60000.0, 7500.0], "(-87.5 %)"),
        ("Mean decode tokens/s per request (tok/s)", [50.0, 100.0], "(+100 %)"),
    ):
        cells = compared.loc[title].tolist()
        assert [float(cell.split(" (")[0].replace(",", "")) for cell in cells] == pytest.approx(values)
        assert cells[1].endswith(change)
    for key in NEW_METRICS:  # better when lower, and when higher
        metric = METRICS[key]
        assert tables.describe_column(metric.column("mean")).larger_is_better is metric.larger_is_better


def test_derived_metrics_are_computed_from_the_columns_they_need():
    runs = pd.DataFrame(
        {
            "mean_tpot_ms": [20.0, 0.0],
            "good_requests": [9, np.nan],
            "total_requests": [10, 10],
            "mean_ttft_ms": [120.0, 80.0],
            "mean_server_ttft_ms": [95.0, np.nan],
        }
    )
    frame = catalog.with_derived(runs)
    per_user = frame["output_throughput_per_user"]
    assert per_user.tolist()[0] == 50.0 and math.isnan(per_user[1])
    assert frame["slo_attainment"].tolist()[0] == 0.9 and math.isnan(frame["slo_attainment"][1])
    assert frame["ttft_gap_ms"].tolist()[0] == 25.0 and math.isnan(frame["ttft_gap_ms"][1])  # a run without /metrics
    assert {name for metric in CATALOG for name in metric.needs} <= set(runs.columns)


def test_lmdeploys_row_formats_like_lmdeploy_and_marks_what_was_not_measured():
    row = catalog.lmdeploy_row(
        {"completed": 3, "duration_s": 2.5, "request_throughput": 1.2, "mean_e2e_ms": 12.3456, "mean_ttft_ms": math.nan}
    )
    assert row["completed"] == 3 and row["duration"] == 2.5 and row["request_throughput"] == "1.200"
    assert row["mean_e2e_latency_ms"] == "12.346" and row["mean_ttft_ms"] == "-" and row["mean_itl_ms"] == "-"


def _with_speculative_accounting(accounts):
    """A profiled run whose requests finished with these (drafts, drafted, accepted) extras (None: none reported)."""
    from bench_core.engines.engine_api import SPEC_COLUMNS

    profiler = profiled_run([0.05] * len(accounts))
    for session, account in zip(profiler.sessions, accounts):
        session.extra = None if account is None else dict(zip(SPEC_COLUMNS, account))
    profiler.compute_metrics()
    return profiler


def test_speculative_acceptance_is_summed_over_the_requests_the_engine_reported_on():
    summary = _with_speculative_accounting([(10, 30, 20), (5, 15, 4), None]).summary()
    assert summary["spec_acceptance_length"] == pytest.approx(1 + 24 / 15)  # the bonus token counted, as LMDeploy
    assert summary["spec_acceptance_rate"] == pytest.approx(24 / 45)
    shown = tables.speculative_table(summary)
    assert shown["value"].tolist() == pytest.approx([1 + 24 / 15, 24 / 45])
    assert "spec_acceptance_length" in sweep_results.SWEEP_METRICS  # sweeps over speculative_num_draft_tokens


def test_an_engine_that_reports_no_acceptance_says_not_reported_never_zero():
    summary = profiled_run([0.05, 0.1]).summary()
    assert not set(catalog.SPECULATIVE_COLUMNS) & set(summary)  # no column, so no 0 in the history either
    assert tables.speculative_table(summary)["value"].tolist() == [catalog.NOT_REPORTED] * 2
    assert "Mean acceptance length" not in tables.throughput_table(summary).index


def test_the_achieved_rate_is_named_the_send_rate_beside_the_request_throughput():
    """At request rate inf every request goes out at once: an "Achieved request rate" of thousands beside a request
    throughput below one read as a contradiction. It is the rate the load was sent at, and says so."""
    sent = METRICS["achieved_rate"]
    assert sent.label == "Achieved send rate"
    assert "not the pace answers came back (that is Request throughput)" in sent.definition
    assert METRICS["request_throughput"].label == "Request throughput"
