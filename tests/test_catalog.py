"""The metric catalog: every name a metric goes by is generated from its one declaration."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from bench_core import catalog, tables
from bench_core.catalog import CATALOG
from bench_core.history_import import HISTORY_LEAD_COLUMNS, SAVE_CSV_COLUMNS, SAVE_CSV_HYPERPARAMS
from profiled_runs import profiled_run


def test_lmdeploys_csv_columns_come_from_the_catalog_in_its_order():
    assert SAVE_CSV_COLUMNS == SAVE_CSV_HYPERPARAMS + (
        "completed", "total_input_tokens", "total_output_tokens", "duration", "request_throughput",
        "input_throughput", "output_throughput", "mean_e2e_latency_ms", "mean_ttft_ms", "mean_tpot_ms", "mean_itl_ms")
    assert HISTORY_LEAD_COLUMNS[len(SAVE_CSV_HYPERPARAMS):] == (
        "completed", "total_input_tokens", "total_output_tokens", "duration_s", "request_throughput",
        "input_throughput", "output_throughput", "mean_e2e_ms", "mean_ttft_ms", "mean_tpot_ms", "mean_itl_ms")
    assert catalog.LEGACY_COLUMNS == {"duration": "duration_s", "mean_e2e_latency_ms": "mean_e2e_ms"}


def test_every_summary_key_is_a_catalog_column_described_from_it():
    summary = profiled_run([0.05, 0.1, 0.2], percentiles=(50, 99.9)).summary()
    for key in summary:
        metric, statistic = catalog.find_column(key)
        assert metric.column(statistic) == key
        assert tables.describe_column(key).unit == metric.shown_unit


@pytest.mark.parametrize("name, found", [
    ("p99.9_itl_ms", ("itl", "p99.9")), ("mean_e2e_last_line_ms", ("e2e_last_line", "mean")),
    ("goodput_rps", ("goodput", "value")), ("p50_tokens_per_tick", ("tokens_per_tick", "p50")),
    ("px_ttft_ms", None), ("mean_e2e_latency_ms", None), ("concurrency", None),
])
def test_columns_are_found_by_the_names_the_catalog_generates(name, found):
    result = catalog.find_column(name)
    assert (result[0].key, result[1]) == found if found else result is None


def test_derived_metrics_are_computed_from_the_columns_they_need():
    runs = pd.DataFrame({"mean_tpot_ms": [20.0, 0.0], "good_requests": [9, np.nan], "total_requests": [10, 10]})
    frame = catalog.with_derived(runs)
    assert frame["output_throughput_per_user"].tolist()[0] == 50.0 and math.isnan(frame["output_throughput_per_user"][1])
    assert frame["slo_attainment"].tolist()[0] == 0.9 and math.isnan(frame["slo_attainment"][1])
    assert {name for metric in CATALOG for name in metric.needs} <= set(runs.columns)


def test_lmdeploys_row_formats_like_lmdeploy_and_marks_what_was_not_measured():
    row = catalog.lmdeploy_row({"completed": 3, "duration_s": 2.5, "request_throughput": 1.2, "mean_e2e_ms": 12.3456,
                                "mean_ttft_ms": math.nan})
    assert row["completed"] == 3 and row["duration"] == 2.5 and row["request_throughput"] == "1.200"
    assert row["mean_e2e_latency_ms"] == "12.346" and row["mean_ttft_ms"] == "-" and row["mean_itl_ms"] == "-"
