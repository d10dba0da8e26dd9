"""Repeat statistics against published values: Student t tables, textbook Welch tests, hand-checked fronts."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from bench_core.measure import stats

# Two-sided 95% critical values t(0.975, df) for df = 1..30, as printed in every t table.
T_975 = [
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
]

# Wikipedia, "Welch's t-test", examples 1 and 2.
WELCH_EQUAL_SIZES = (
    [27.5, 21.0, 19.0, 23.6, 17.0, 17.9, 16.9, 20.1, 21.9, 22.6, 23.1, 19.6, 19.0, 21.7, 21.4],
    [27.1, 22.0, 20.8, 23.4, 23.4, 23.5, 25.8, 22.0, 24.8, 20.2, 21.9, 22.1, 22.9, 20.5, 24.4],
)
WELCH_UNEQUAL_SIZES = (
    [17.2, 20.9, 22.6, 18.1, 21.7, 21.4, 23.5, 24.2, 14.7, 21.8],
    [
        21.5,
        22.8,
        21.0,
        23.0,
        21.6,
        23.6,
        22.5,
        20.7,
        23.4,
        21.8,
        20.7,
        21.7,
        21.5,
        22.5,
        23.6,
        21.5,
        22.5,
        23.5,
        21.5,
        21.8,
    ],
)


@pytest.mark.parametrize("df", range(1, 31))
def test_t_quantile_matches_the_printed_table(df):
    assert round(stats.t_quantile(0.975, df), 3) == T_975[df - 1]


@pytest.mark.parametrize(
    ("p", "df", "expected"),
    [
        (0.95, 1, 6.314),
        (0.95, 5, 2.015),
        (0.95, 10, 1.812),
        (0.95, 30, 1.697),
        (0.995, 1, 63.657),
        (0.995, 5, 4.032),
        (0.995, 10, 3.169),
        (0.995, 30, 2.750),
        (0.025, 4, -2.776),
    ],
)
def test_t_quantile_at_other_levels(p, df, expected):
    assert stats.t_quantile(p, df) == pytest.approx(expected, abs=5e-4)


@pytest.mark.parametrize("t", [-30.0, -2.0, -0.5, 0.0, 0.3, 1.0, 4.0, 100.0])
def test_t_cdf_equals_the_closed_forms_for_one_and_two_degrees_of_freedom(t):
    assert stats.t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-12)
    assert stats.t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-12)


def test_t_cdf_approaches_the_normal_for_many_degrees_of_freedom():
    assert stats.t_cdf(1.959964, 1e7) == pytest.approx(0.975, abs=1e-6)


def test_describe_gives_mean_sample_std_and_t_interval():
    summary = stats.describe([2, 4, 4, 4, 5, 5, 7, 9])
    assert summary.n == 8
    assert summary.mean == pytest.approx(5.0)
    assert summary.std == pytest.approx(math.sqrt(32 / 7))  # ddof=1, not the population 2.0
    assert (summary.ci_low, summary.ci_high) == pytest.approx((3.212512, 6.787488), abs=1e-6)
    assert summary.cv == pytest.approx(math.sqrt(32 / 7) / 5)


def test_the_relative_margin_of_error_is_the_intervals_half_width_over_the_mean():
    values = [2, 4, 4, 4, 5, 5, 7, 9]  # the interval above: 5 +/- 1.787488
    assert stats.relative_margin_of_error(values) == pytest.approx(1.787488 / 5, abs=1e-6)
    assert stats.relative_margin_of_error([-v for v in values]) == pytest.approx(1.787488 / 5, abs=1e-6)
    assert stats.relative_margin_of_error([10.0, 10.0, 10.0, float("nan")]) == 0.0


def test_no_margin_of_error_below_three_values_or_around_a_mean_of_zero():
    assert math.isnan(stats.relative_margin_of_error([1.0, 1.1]))  # no interval is drawn for two runs
    assert math.isnan(stats.relative_margin_of_error([1.0, 1.1, None, float("inf")]))
    assert math.isnan(stats.relative_margin_of_error([-1.0, 0.0, 1.0]))


def test_describe_ignores_missing_values_and_has_no_spread_for_one_run():
    assert stats.describe([3.0, float("nan"), None, 5.0]).mean == pytest.approx(4.0)
    single = stats.describe([7.0])
    assert (single.n, single.mean) == (1, 7.0)
    assert all(math.isnan(v) for v in (single.std, single.ci_low, single.ci_high, single.cv))
    assert stats.describe([]).n == 0 and math.isnan(stats.describe([]).mean)


def test_welch_test_on_equal_sizes_matches_the_textbook():
    comparison = stats.compare(*WELCH_EQUAL_SIZES)
    assert comparison.method == stats.WELCH
    assert comparison.p_value == pytest.approx(0.021378, abs=1e-6)
    assert comparison.df == pytest.approx(24.9885, abs=1e-4)
    assert comparison.difference == pytest.approx(22.986667 - 20.82, abs=1e-6)
    assert comparison.significant is True
    assert comparison.ci_low > 0  # the interval of the difference excludes zero


def test_welch_test_on_unequal_sizes_finds_no_significant_difference():
    comparison = stats.compare(*WELCH_UNEQUAL_SIZES)
    assert comparison.p_value == pytest.approx(0.148842, abs=1e-6)
    assert comparison.df == pytest.approx(9.9047, abs=1e-4)
    assert comparison.significant is False
    assert comparison.ci_low < 0 < comparison.ci_high


def test_comparison_is_relative_to_the_first_side():
    comparison = stats.compare([10.0, 10.2, 9.8], [12.0, 12.2, 11.8])
    assert comparison.difference == pytest.approx(2.0)
    assert comparison.relative == pytest.approx(0.2)
    assert comparison.significant is True


def test_single_runs_cannot_be_judged_against_a_spread():
    comparison = stats.compare([10.0], [12.0, 12.5])
    assert comparison.significant is None
    assert comparison.method == stats.TOO_FEW_RUNS
    assert comparison.difference == pytest.approx(2.25)


def test_identical_repeats_make_any_difference_significant():
    assert stats.compare([5.0, 5.0], [6.0, 6.0]).significant is True
    assert stats.compare([5.0, 5.0], [5.0, 5.0]).significant is False


def test_group_repeats_summarises_each_point_and_skips_failed_runs():
    runs = pd.DataFrame(
        {
            "concurrency": [1, 1, 1, 4, 4, 8],
            "backend": ["transformers"] * 6,
            "output_throughput": [10.0, 12.0, 14.0, 40.0, np.nan, np.nan],
        }
    )
    points = stats.group_repeats(runs, ["concurrency", "backend"], "output_throughput")
    assert list(points.columns) == ["concurrency", "backend", "n", "mean", "std", "min", "max", "ci_low", "ci_high"]
    assert points["concurrency"].tolist() == [1, 4]  # concurrency 8 has no successful run
    first, second = points.iloc[0], points.iloc[1]
    assert (first["n"], first["mean"], first["std"]) == (3, pytest.approx(12.0), pytest.approx(2.0))
    half_width = 4.303 * 2.0 / math.sqrt(3)
    assert (first["ci_low"], first["ci_high"]) == pytest.approx((12 - half_width, 12 + half_width), abs=1e-3)
    assert second["n"] == 1 and math.isnan(second["ci_low"])


def test_an_interval_stops_at_the_quantitys_bounds():
    # Three throughputs far apart: the t-interval of their mean reaches below 0 unless it is cut at 0.
    unbounded = stats.describe([1.0, 2.0, 30.0])
    assert unbounded.ci_low < 0
    bounded = stats.describe([1.0, 2.0, 30.0], bounds=(0.0, math.inf))
    assert bounded.ci_low == 0.0 and bounded.ci_high == pytest.approx(unbounded.ci_high)
    attainment = stats.describe([0.5, 1.0, 1.0], bounds=(0.0, 1.0))
    assert attainment.ci_high == 1.0 and 0 <= attainment.ci_low < attainment.mean


def test_two_runs_give_their_range_and_no_interval():
    # t(0.975, 1) = 12.7: the interval of two runs is nine standard deviations wide, no use to anyone.
    pair = stats.describe([100.0, 120.0], bounds=(0.0, math.inf))
    assert (pair.n, pair.mean, pair.minimum, pair.maximum) == (2, 110.0, 100.0, 120.0)
    assert math.isnan(pair.ci_low) and math.isnan(pair.ci_high)
    assert pair.std == pytest.approx(math.sqrt(200.0))
    assert stats.compare([100.0, 120.0], [200.0, 220.0]).significant is True  # Welch still judges two runs


def test_group_repeats_of_a_missing_metric_is_an_empty_table():
    points = stats.group_repeats(pd.DataFrame({"concurrency": [1]}), ["concurrency"], "goodput_rps")
    assert points.empty and "mean" in points.columns


def test_pareto_front_keeps_only_undominated_points():
    throughput = [100, 200, 150, 300, 300, 50, np.nan]  # larger is better
    p99_ttft = [10, 30, 40, 80, 80, 5, 1]  # smaller is better
    mask = stats.pareto_front(throughput, p99_ttft, x_larger_better=True, y_larger_better=False)
    # (150, 40) loses to (200, 30); the two equal (300, 80) points both stay; NaN never counts.
    assert mask.tolist() == [True, True, False, True, True, True, False]


def test_pareto_front_with_both_axes_larger_is_better():
    per_user = [50, 40, 30, 20, 35]
    total = [100, 200, 300, 400, 150]
    mask = stats.pareto_front(total, per_user, x_larger_better=True, y_larger_better=True)
    assert mask.tolist() == [True, True, True, True, False]  # (150, 35) loses to (200, 40)


def test_highest_load_meeting_interpolates_between_the_last_pass_and_the_next_miss():
    # Attainment 0.95 at 4 and 0.85 at 8: the 0.9 target is crossed halfway, at 6.
    assert stats.highest_load_meeting([1, 2, 4, 8, 16], [1.0, 0.99, 0.95, 0.85, 0.8], 0.9) == pytest.approx(6.0)


def test_a_load_that_meets_the_target_above_one_that_misses_is_the_limit_and_the_miss_is_named():
    # Batched: TTFT includes the queue, so concurrency 1 and 2 miss and 4 meets (the chart said no load did).
    load, attainment = [1, 2, 4], [0.5, 0.8, 1.0]
    assert stats.highest_load_meeting(load, attainment, 0.9) == 4.0
    assert stats.loads_missing_below(load, attainment, 0.9, 4.0) == [1.0, 2.0]
    assert stats.highest_load_meeting([1, 2, 4, 8, 16], [1.0, 0.99, 0.95, 0.85, 0.95], 0.9) == 16.0
    assert stats.loads_missing_below([1, 2, 4, 8], [1.0, 0.99, 0.95, 0.85], 0.9, 6.0) == []


def test_highest_load_meeting_averages_repeats_and_ignores_order():
    load = [8, 4, 4, 8, 2]
    attainment = [0.80, 1.0, 0.90, 0.90, 1.0]  # means: 2 -> 1.0, 4 -> 0.95, 8 -> 0.85
    assert stats.highest_load_meeting(load, attainment, 0.9) == pytest.approx(6.0)


def test_highest_load_meeting_at_the_ends():
    assert stats.highest_load_meeting([1, 2, 4], [0.5, 0.4, 0.3], 0.9) is None
    assert stats.highest_load_meeting([1, 2, 4], [1.0, 0.95, 0.92], 0.9) == 4.0
    assert stats.highest_load_meeting([1, 2], [0.9, 0.5], 0.9) == pytest.approx(1.0)  # meeting exactly counts
    assert stats.highest_load_meeting([], [], 0.9) is None


def test_a_paired_ratio_is_the_mean_of_b_over_a_with_an_interval_over_the_pairs():
    exact = stats.paired_ratio([1.0, 2.0, 4.0, 8.0], [0.5, 1.0, 2.0, 4.0])
    assert (exact.value, exact.low, exact.high, exact.n) == (0.5, 0.5, 0.5, 4)
    # Requests of very different lengths, each B the same share of its A but for noise: the pairing keeps the
    # lengths out of the interval, which stays narrow around the ratio.
    lengths = np.array([1.0, 10.0, 100.0, 5.0, 50.0, 20.0, 2.0, 80.0])
    noisy = stats.paired_ratio(lengths, lengths * np.array([0.6, 0.62, 0.58, 0.61, 0.59, 0.6, 0.63, 0.6]))
    assert noisy.low <= noisy.value <= noisy.high and 0.55 < noisy.low and noisy.high < 0.65


def test_a_paired_ratio_leaves_out_a_pair_missing_a_side_and_needs_two():
    assert stats.paired_ratio([1.0, math.nan, 2.0], [2.0, 5.0, 4.0]).value == 2.0
    assert stats.paired_ratio([1.0, math.nan], [2.0, 5.0]).n == 1
    assert math.isnan(stats.paired_ratio([1.0, math.nan], [2.0, 5.0]).value)
