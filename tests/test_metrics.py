"""The pure metric functions, on hand-made ticks and per-request tables (no Profiler involved)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from bench_core.config import SLO
from bench_core.measure import metrics
from bench_core.measure.catalog import CATALOG, METRICS


def _ticks(*sessions: list[tuple[float, int]]):
    ts = [np.array([t for t, _ in sess], dtype=np.float64) for sess in sessions]
    ns = [np.array([n for _, n in sess], dtype=np.int64) for sess in sessions]
    return ts, ns


def test_every_metric_has_a_unit_and_a_direction():
    for key in ("e2e", "ttft", "tpot", "itl"):
        spec = METRICS[key]
        assert (spec.unit, spec.larger_is_better, spec.display_unit, spec.display_scale) == ("s", False, "ms", 1000.0)
    for key in ("request_throughput", "output_throughput", "goodput"):
        assert METRICS[key].larger_is_better
    assert all(spec.label and spec.definition for spec in METRICS.values())


def test_every_metric_has_exactly_one_formula():
    for metric in CATALOG:
        formulas = [metric.per_request, metric.aggregate, metric.derived, metric.sampled, metric.served]
        assert sum(formula is not None for formula in formulas) == 1, metric.key
        assert bool(metric.needs) == (metric.derived is not None), metric.key


def test_request_metrics_follow_lmdeploys_definitions():
    per_request = metrics.request_metrics(
        *_ticks(
            [(0.0, 0), (0.5, 1), (0.75, 3), (1.5, 5)],  # stream: TPOT from the first chunk
            [(2.0, 0), (4.0, 8)],  # non-stream: TPOT falls back to E2E / tokens
        )
    )
    assert per_request.ttft_s.tolist() == [0.5, 2.0]
    assert per_request.e2e_s.tolist() == [1.5, 2.0]
    assert per_request.tpot_s.tolist() == [(1.5 - 0.5) / (5 - 1), 2.0 / 8]
    assert per_request.output_len.tolist() == [5, 8]
    assert per_request.itl_s.tolist() == [0.25, 0.75]
    assert [a.tolist() for a in per_request.itl_per_request()] == [[0.25, 0.75], []]
    assert per_request.tokens_per_tick.tolist() == [1, 2, 2, 8]


def test_requests_without_ticks_do_not_join_their_neighbours_gaps():
    per_request = metrics.request_metrics(
        *_ticks(
            [(0.0, 0), (1.0, 1), (3.0, 2)],
            [],
            [(10.0, 0)],
            [(20.0, 0), (21.0, 4)],
        )
    )
    assert per_request.itl_s.tolist() == [2.0]
    assert per_request.tokens_per_tick.tolist() == [1, 1, 4]
    assert per_request.itl_counts.tolist() == [1, 0, 0, 0]
    assert per_request.e2e_s[0] == 3.0 and np.isnan(per_request.e2e_s[1:3]).all()
    assert per_request.output_len.tolist() == [2, 0, 0, 4]


def test_zero_tokens_leave_tpot_undefined_instead_of_dividing_by_zero():
    per_request = metrics.request_metrics(*_ticks([(0.0, 0), (0.5, 0)]))
    assert np.isnan(per_request.tpot_s[0]) and per_request.e2e_s[0] == 0.5


def test_no_ticks_at_all_give_empty_series():
    per_request = metrics.request_metrics(*_ticks())
    assert per_request.itl_s.size == 0 and per_request.e2e_s.size == 0


def test_distribution_of_nothing_is_nan_and_of_values_matches_numpy():
    empty = metrics.distribution([], [50, 99])
    assert empty.count == 0 and math.isnan(empty.mean) and all(math.isnan(p) for p in empty.percentiles)
    values = np.array([0.3, 0.1, 0.2, 0.9])
    stats = metrics.distribution(values, [50, 90])
    assert (stats.mean, stats.std, stats.min, stats.max) == (np.mean(values), np.std(values), 0.1, 0.9)
    assert stats.percentiles == tuple(np.percentile(values, [50, 90]))


@pytest.mark.parametrize(
    "values",
    [
        np.random.default_rng(0).exponential(0.02, 10_001),  # ITL-like, every value distinct
        np.random.default_rng(1).integers(0, 4, 5_000),  # tokens per tick: integers, mostly ties
        np.round(np.random.default_rng(2).normal(size=999), 1),  # negative values, ties between floats
        np.array([0.661, 0.931, 0.207]),  # at P81.5, a + (b - a) * g is one ulp off numpy's b - (b - a) * (1 - g)
        np.array([7.5]),
        np.array([2, 1]),
        np.array([1.0, np.inf]),
        np.array([0.5, np.nan, 0.1]),
    ],
    ids=["distinct", "integer-ties", "float-ties", "upper-weight", "one", "two", "infinite", "nan"],
)
def test_linear_percentiles_are_numpys_to_the_bit(values):
    copy = values.copy()
    with np.errstate(invalid="ignore"):  # inf - inf, as in numpy
        for qs in ([50, 75, 95, 99], [0, 100], [99.9, 1, 50], [33.3, 66.6], [50, 50.000001], [81.5]):
            expected = tuple(np.percentile(values, qs))
            ours = metrics.linear_percentiles(values, qs)
            np.testing.assert_array_equal(ours, expected)  # exact equality; NaN where numpy has NaN
            assert all(type(a) is type(b) for a, b in zip(ours, expected))
    np.testing.assert_array_equal(values, copy)  # the caller's values stay in their order


def test_linear_percentiles_refuse_what_numpy_refuses():
    with pytest.raises(ValueError, match="range"):
        metrics.linear_percentiles(np.array([1.0, 2.0]), [101])


def test_request_status_separates_failed_incomplete_and_unfinished():
    status = metrics.request_status(
        finished=np.array([True, True, True, False]),
        succeeded=np.array([True, False, True, False]),
        output_len=np.array([4, 4, 3, 4]),
        req_output_len=np.array([4, 4, 4, 4]),
    )
    assert status.tolist() == ["success", "failed", "incomplete", "unfinished"]


def test_an_engines_own_length_verdict_stands_over_the_count_of_a_served_request():
    status = metrics.request_status(
        finished=np.array([True, True, True, True, True]),
        succeeded=np.array([True, True, True, False, True]),
        output_len=np.array([3, 9, 3, 3, 4]),
        req_output_len=np.array([4, 4, 4, 4, 4]),
        length_status=np.array(["success", "overrun", "", "success", ""], dtype=object),
    )
    assert status.tolist() == ["success", "overrun", "incomplete", "failed", "success"]


def test_a_session_the_engine_vouched_for_is_completed_and_an_overrun_is_not():
    from bench_core.measure.profiler import Profiler, Session

    profiler = Profiler(stream_output=True, percentages=[50])
    verdicts = ("success", "overrun", "")
    for verdict in verdicts:
        sess = profiler.new_session(5, 4)
        sess.tick_at(0, 1.0)
        sess.tick_at(3 if verdict != "overrun" else 9, 2.0)
        sess.finish(Session.SUCCESS, "length", 2.0, length_status=verdict)
    profiler.start(1.0)
    profiler.finish(3.0)
    assert [sess.completed for sess in profiler.sessions] == [True, False, False]
    assert profiler.request_table()["status"].tolist() == ["success", "overrun", "incomplete"]
    assert (profiler.success, profiler.overrun, profiler.incomplete, profiler.total_output) == (1, 1, 1, 3)


def test_rate_over_no_time_is_nan():
    assert math.isnan(metrics.rate(5, 0.0)) and math.isnan(metrics.rate(5, math.nan))
    assert metrics.rate(5, 2.0) == 2.5


def _table() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "index": [0, 1, 2, 3, 4],
            "input_len": [10, 20, 30, 40, 50],
            "req_output_len": [4, 4, 4, 4, 4],
            "output_len": [4, 4, 4, 2, 0],
            "status": ["success", "success", "success", "incomplete", "failed"],
            "reason": ["", "", "", "", "error: CUDA OOM"],
            "ttft_s": [0.1, 0.2, 0.4, 0.1, math.nan],
            "tpot_s": [0.01, 0.03, 0.02, 0.01, math.nan],
            "e2e_s": [0.13, 0.29, 0.46, 0.11, math.nan],
            "itl_s": [
                np.array([0.01, 0.01, 0.01]),
                np.array([0.03, 0.03, 0.03]),
                np.array([0.02, 0.02, 0.02]),
                np.array([0.01]),
                np.array([]),
            ],
            "tokens_per_tick": [
                np.array([1, 1, 1, 1]),
                np.array([1, 1, 1, 1]),
                np.array([1, 1, 1, 1]),
                np.array([1, 1]),
                np.array([], dtype=np.int64),
            ],
            "n_ticks": [5, 5, 5, 3, 1],
            "start_s": [0.0] * 5,
            "finish_s": [0.13, 0.29, 0.46, 0.11, 0.05],
        }
    )


def test_run_summary_from_a_table_counts_only_successes():
    summary = metrics.run_summary(_table(), duration_s=2.0, percentiles=[50, 99.9], stream_output=True)
    assert (
        summary["total_requests"],
        summary["completed"],
        summary["failed"],
        summary["incomplete"],
        summary["unfinished"],
    ) == (5, 3, 1, 1, 0)
    assert summary["failure_reasons"] == "error: CUDA OOM: 1; incomplete: 1"
    assert (summary["total_input_tokens"], summary["total_output_tokens"]) == (60, 12)
    assert (summary["request_throughput"], summary["input_throughput"], summary["output_throughput"]) == (1.5, 30, 6)
    assert summary["mean_ttft_ms"] == pytest.approx(700 / 3)
    assert summary["max_e2e_ms"] == pytest.approx(460.0) and summary["min_tpot_ms"] == pytest.approx(10.0)
    assert summary["p99.9_itl_ms"] == pytest.approx(30.0) and summary["p50_itl_ms"] == pytest.approx(20.0)
    assert summary["mean_tokens_per_tick"] == 1.0
    assert "good_requests" not in summary


def test_run_summary_without_streaming_leaves_ttft_and_itl_nan():
    summary = metrics.run_summary(_table(), 2.0, [50], stream_output=False)
    assert math.isnan(summary["mean_ttft_ms"]) and math.isnan(summary["p50_itl_ms"])
    assert math.isnan(summary["mean_tokens_per_tick"])
    assert summary["mean_tpot_ms"] == pytest.approx(20.0)


def test_goodput_recomputes_for_new_thresholds_from_a_stored_table(tmp_path):
    path = tmp_path / "requests.parquet"
    _table().to_parquet(path)
    stored = pd.read_parquet(path)
    for slo, good in ((SLO(ttft=0.25), 2), (SLO(ttft=0.25, tpot=0.02), 1), (SLO(e2e=1.0), 3), (SLO(tpot=0.001), 0)):
        summary = metrics.run_summary(stored, 2.0, [50], True, slo)
        assert (summary["good_requests"], summary["goodput_rps"]) == (good, good / 2.0)
    assert metrics.run_summary(stored, 2.0, [50], True) == metrics.run_summary(_table(), 2.0, [50], True)


def test_percentile_keys_drop_a_trailing_zero():
    assert [metrics.percentile_key(q) for q in (50, 50.0, 99.9)] == ["p50", "p50", "p99.9"]
