"""Plotly figures: trace types, axis titles with units, values in ms, bounded payloads, empty inputs."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from profiled_runs import INCOMPLETE_TTFT_FACTOR, OUTPUT_LEN, profiled_run, recorded_history

from bench_core.hardware.telemetry import (
    CALLER,
    CPU_CORES,
    CPU_PERCENT,
    MACHINE,
    PROCESS,
    RSS_BYTES,
    Sample,
    samples_frame,
)
from bench_core.measure.latency_bins import BinnedLatencies
from bench_core.measure.stats import pareto_front
from bench_core.store.history import History
from bench_core.views import compare_charts, figures, run_charts, sweep_charts, timeline, workload_charts

TTFTS = [0.05, 0.1, 0.2, 0.4, 0.8]


def _xy(trace) -> tuple[np.ndarray, np.ndarray]:
    """A trace's data as numbers (plotly keeps what it was given; the JSON would be base64)."""
    return np.asarray(trace.x, dtype=np.float64), np.asarray(trace.y, dtype=np.float64)


def _axis_titles(fig) -> tuple[str, str]:
    return fig.layout.xaxis.title.text, fig.layout.yaxis.title.text


def _says_no_data(fig) -> bool:
    return not fig.data and [a.text for a in fig.layout.annotations] == [figures.NO_DATA]


def test_latency_histogram_counts_every_request_in_ms():
    table = profiled_run(TTFTS).request_table()
    ttft_s = table.loc[table["status"] == "success", "ttft_s"].to_numpy()
    fig = run_charts.latency_histogram(ttft_s, "ttft")
    (trace,) = fig.data
    centres, counts = _xy(trace)
    assert trace.type == "histogram" and trace.histfunc == "sum"
    assert counts.sum() == len(TTFTS)
    assert 50.0 <= centres.min() and centres.max() <= 800.0  # bin centres lie within the values, in ms
    assert (trace.xbins.start, trace.xbins.end) == pytest.approx((50.0, 800.0))
    assert _axis_titles(fig) == ("Time to first token (ms)", "Count (requests)")
    edges = np.asarray(trace.customdata, dtype=np.float64)  # each bar hovers its range and its count
    assert (edges[0, 0], edges[-1, 1]) == pytest.approx((50.0, 800.0))
    assert "customdata[1]" in trace.hovertemplate and "ms" in trace.hovertemplate
    assert fig.layout.title.text == "Time to first token"


def test_successful_values_leave_out_other_requests_and_pool_itl():
    table = profiled_run(TTFTS, itl_s=0.02).request_table()
    assert run_charts.successful_values(table, "ttft") == pytest.approx(TTFTS)
    itl = run_charts.successful_values(table, "itl")
    assert itl == pytest.approx(np.full(len(TTFTS) * (OUTPUT_LEN - 1), 0.02))


def test_itl_histogram_counts_gaps_and_takes_a_title():
    snapshot = profiled_run(TTFTS, itl_s=0.02).live_snapshot()
    fig = run_charts.binned_latency_histogram(snapshot.itl, "itl", title="ITL so far")
    centres, counts = _xy(fig.data[0])
    assert counts.sum() == len(TTFTS) * (OUTPUT_LEN - 1)
    assert centres == pytest.approx(np.full(centres.size, 20.0))
    assert fig.layout.yaxis.title.text == "Count (gaps)" and fig.layout.title.text == "ITL so far"


def test_a_million_values_are_sent_as_bins_not_as_values():
    values = np.random.default_rng(0).exponential(0.01, 1_000_000)
    centres, counts = _xy(run_charts.latency_histogram(values, "itl").data[0])
    assert centres.size <= run_charts.HISTOGRAM_BINS
    assert counts.sum() == values.size


def test_undefined_latencies_are_left_out_of_the_histogram():
    _, counts = _xy(run_charts.latency_histogram(np.array([0.1, np.nan, 0.2, np.inf]), "e2e").data[0])
    assert counts.sum() == 2


@pytest.mark.parametrize(
    "build",
    [
        lambda: run_charts.latency_histogram(np.array([]), "ttft"),
        lambda: run_charts.latency_histogram(np.array([np.nan]), "e2e"),
        lambda: run_charts.throughput_over_time(np.array([]), np.array([]), np.array([])),
        lambda: compare_charts.metric_vs_knob(pd.DataFrame(), "concurrency", "output_throughput"),
        lambda: compare_charts.metric_vs_knob(
            pd.DataFrame({"concurrency": [1], "output_throughput": [np.nan]}), "concurrency", "output_throughput"
        ),
        lambda: compare_charts.latency_vs_throughput(
            pd.DataFrame(columns=["run_id", "p99_ttft_ms", "output_throughput"])
        ),
        lambda: compare_charts.cdf_overlay({}, "ttft"),
        lambda: compare_charts.cdf_overlay({"run": profiled_run(TTFTS, stream=False).request_table().iloc[-3:]}, "e2e"),
    ],
    ids=[
        "histogram",
        "histogram-nan",
        "throughput",
        "knob-no-columns",
        "knob-no-values",
        "scatter",
        "cdf-no-runs",
        "cdf-no-success",
    ],
)
def test_empty_inputs_give_a_figure_that_says_no_data_yet(build):
    fig = build()
    assert _says_no_data(fig)
    assert all(_axis_titles(fig))  # the axes are titled even before data arrives


def test_throughput_over_time_puts_in_flight_on_a_secondary_axis():
    snap = profiled_run(TTFTS).live_snapshot()
    fig = run_charts.throughput_over_time(snap.time_s, snap.output_tokens_per_s, snap.in_flight_over_time)
    tokens, flight = fig.data
    assert (tokens.yaxis, flight.yaxis) == ("y", "y2")
    assert _xy(tokens)[1] == pytest.approx(snap.output_tokens_per_s)
    assert _xy(flight)[1] == pytest.approx(snap.in_flight_over_time)
    assert _xy(tokens)[0] == pytest.approx(snap.time_s)
    assert _axis_titles(fig) == ("Time since start (s)", "Output throughput (tok/s)")
    assert fig.layout.yaxis2.title.text == "In flight (requests)"
    assert fig.layout.yaxis2.dtick == 1  # whole requests on a small run, not 0.5 steps


def test_a_long_live_series_is_reduced_to_a_few_thousand_points_at_the_same_level():
    time_s = np.arange(100_000) * 0.5
    tokens = np.tile([40.0, 60.0], 50_000)
    fig = run_charts.throughput_over_time(time_s, tokens, np.full(time_s.size, 8))
    x, y = _xy(fig.data[0])
    assert x.size <= figures.MAX_POINTS
    assert x[0] == 0.0 and np.all(np.diff(x) > 0)
    assert y == pytest.approx(np.full(y.size, 50.0))
    assert _xy(fig.data[1])[1] == pytest.approx(np.full(y.size, 8.0))


@pytest.fixture
def history_runs(tmp_path) -> pd.DataFrame:
    _, runs = recorded_history(
        tmp_path,
        [
            ("tm-8", "turbomind", 8, profiled_run([0.05, 0.06])),
            ("pt-1", "pytorch", 1, profiled_run([0.3, 0.4])),
            ("tm-1", "turbomind", 1, profiled_run([0.2, 0.3])),
            ("tm-4", "turbomind", 4, profiled_run([0.1, 0.2])),
        ],
    )
    return runs


def test_metric_vs_knob_draws_one_line_per_backend_sorted_by_the_knob(history_runs):
    fig = compare_charts.metric_vs_knob(history_runs, "concurrency", "p99_ttft_ms")
    assert [t.name for t in fig.data] == ["pytorch", "turbomind"]
    turbomind = fig.data[1]
    x, y = _xy(turbomind)
    assert x.tolist() == [1, 4, 8]
    by_run = history_runs.set_index("run_id")["p99_ttft_ms"]
    assert y.tolist() == [by_run["tm-1"], by_run["tm-4"], by_run["tm-8"]]
    assert [row[0] for row in turbomind.customdata] == ["tm-1", "tm-4", "tm-8"]
    assert turbomind.customdata[0][1] == "turbomind x1"
    assert turbomind.mode == "lines+markers" and "customdata[0]" in turbomind.hovertemplate
    assert _axis_titles(fig) == ("Concurrency (requests)", "P99 time to first token (ms)")


def test_metric_vs_knob_without_colour_draws_a_single_line(history_runs):
    fig = compare_charts.metric_vs_knob(history_runs, "concurrency", "output_throughput", color=None)
    (trace,) = fig.data
    assert _xy(trace)[0].tolist() == [1, 1, 4, 8]
    assert fig.layout.yaxis.title.text == "Output throughput (tok/s)"


def test_a_knob_with_coded_choices_is_drawn_as_categories(history_runs):
    fig = compare_charts.metric_vs_knob(history_runs, "quant_policy", "output_throughput")
    assert fig.layout.xaxis.type == "category"
    assert compare_charts.metric_vs_knob(history_runs, "concurrency", "output_throughput").layout.xaxis.type is None


def test_latency_vs_throughput_has_one_point_per_run(history_runs):
    fig = compare_charts.latency_vs_throughput(history_runs)
    assert sum(len(t.x) for t in fig.data) == len(history_runs)
    assert all("lines" not in t.mode for t in fig.data)
    assert _axis_titles(fig) == ("Output throughput (tok/s)", "P99 time to first token (ms)")
    points = {row[0]: (x, y) for t in fig.data for row, x, y in zip(t.customdata, t.x, t.y)}
    tm8 = history_runs.set_index("run_id").loc["tm-8"]
    assert points["tm-8"] == pytest.approx((tm8["output_throughput"], tm8["p99_ttft_ms"]))


def test_runs_on_one_backend_get_their_own_distinct_colours_when_coloured_by_run(history_runs):
    turbomind = history_runs[history_runs["backend"] == "turbomind"].assign(run=lambda rows: rows["label"])
    for fig in (
        compare_charts.latency_vs_throughput(turbomind, color="run"),
        compare_charts.metric_vs_knob(turbomind, "concurrency", "output_throughput", color="run"),
    ):
        assert sorted(t.name for t in fig.data) == sorted(turbomind["label"])
        colours = [t.marker.color for t in fig.data]
        assert len(set(colours)) == len(colours) == 3
        assert set(colours) <= set(figures.PALETTE)
        assert fig.layout.legend.title.text == "Run"


def test_colour_groups_of_a_numeric_setting_run_in_numeric_order():
    runs = pd.DataFrame(
        {
            "run_id": list("abc"),
            "concurrency": [16, 2, 4],
            "output_throughput": [3.0, 1.0, 2.0],
            "p99_ttft_ms": [30.0, 10.0, 20.0],
        }
    )
    fig = compare_charts.latency_vs_throughput(runs, color="concurrency")
    assert [t.name for t in fig.data] == ["2", "4", "16"]


def test_compare_markers_and_labels_are_not_clipped_at_the_plot_edge(history_runs):
    latency = compare_charts.latency_vs_throughput(history_runs)
    knob = compare_charts.metric_vs_knob(history_runs, "concurrency", "p99_ttft_ms")
    for fig, x, y in ((latency, "output_throughput", "p99_ttft_ms"), (knob, "concurrency", "p99_ttft_ms")):
        assert all(t.cliponaxis is False for t in fig.data)
        for axis, column in ((fig.layout.xaxis, x), (fig.layout.yaxis, y)):
            low, high = axis.range
            assert low < history_runs[column].min() and history_runs[column].max() < high


def test_latency_vs_throughput_labels_each_point_with_the_settings_that_differ(history_runs):
    fig = compare_charts.latency_vs_throughput(history_runs, color="run")
    labels = {row[0]: text for t in fig.data for row, text in zip(t.customdata, t.text)}
    assert labels == {
        "tm-8": "Backend turbomind, Concurrency 8",
        "pt-1": "Backend pytorch, Concurrency 1",
        "tm-1": "Backend turbomind, Concurrency 1",
        "tm-4": "Backend turbomind, Concurrency 4",
    }
    assert all("%{text}" in t.hovertemplate for t in fig.data)


def test_pareto_points_say_which_setting_value_each_is(history_runs):
    turbomind = history_runs[history_runs["backend"] == "turbomind"]
    dominated, front = sweep_charts.pareto_chart(turbomind, "output_throughput", "p99_ttft_ms").data
    on_front = pareto_front(turbomind["output_throughput"], turbomind["p99_ttft_ms"], True, False)
    assert sorted(front.text) == sorted(f"Concurrency {c}" for c in turbomind.loc[on_front, "concurrency"])
    assert len(dominated.text) == len(dominated.x) and "%{text}" in dominated.hovertemplate


def test_cdf_is_monotone_ends_at_one_and_counts_only_successful_requests():
    table = profiled_run(TTFTS).request_table()
    fig = compare_charts.cdf_overlay({"run a": table}, "ttft")
    (trace,) = fig.data
    x, y = _xy(trace)
    # It rises from 0 at the smallest TTFT; the incomplete request's late TTFT is not there.
    assert x == pytest.approx(np.array(TTFTS[:1] + TTFTS) * 1000)
    assert y == pytest.approx([0.0, 0.2, 0.4, 0.6, 0.8, 1.0])
    assert x.max() < INCOMPLETE_TTFT_FACTOR * max(TTFTS) * 1000
    assert trace.name == "run a"
    assert _axis_titles(fig) == ("Time to first token (ms)", "Fraction of requests")


def test_itl_cdf_pools_the_gaps_of_every_successful_request_from_the_history(tmp_path):
    history, _ = recorded_history(
        tmp_path,
        [
            ("r1", "turbomind", 4, profiled_run(TTFTS, itl_s=0.02)),
            ("r2", "pytorch", 4, profiled_run(TTFTS, itl_s=0.03)),
        ],
    )
    fig = compare_charts.cdf_overlay({run_id: history.requests(run_id) for run_id in ("r1", "r2")}, "itl")
    assert [t.name for t in fig.data] == ["r1", "r2"]
    for trace, gap_ms in zip(fig.data, (20.0, 30.0)):
        x, y = _xy(trace)
        assert x.size == 1 + len(TTFTS) * (OUTPUT_LEN - 1)
        assert x == pytest.approx(np.full(x.size, gap_ms))
        assert y[-1] == 1.0
    assert fig.layout.yaxis.title.text == "Fraction of gaps"


def test_cdf_of_a_large_run_keeps_few_points_and_still_ends_at_one():
    e2e_s = np.random.default_rng(1).exponential(1.0, 50_000)
    table = pd.DataFrame({"status": ["success"] * e2e_s.size, "e2e_s": e2e_s})
    x, y = _xy(compare_charts.cdf_overlay({"big": table}, "e2e").data[0])
    assert x.size <= figures.MAX_POINTS + 1
    assert np.all(np.diff(x) >= 0) and np.all(np.diff(y) > 0)
    assert (x[-1], y[-1]) == (pytest.approx(e2e_s.max() * 1000), 1.0)


def _notes(fig) -> list[str]:
    """The lines under a histogram's title that say what its bars alone would not."""
    text = fig.layout.title.subtitle.text
    return text.split("<br>") if text else []


NEAR_EQUAL_TTFT_S = 4.58243 + np.linspace(0, 0.00004, 16)  # 4,582.43 to 4,582.47 ms: batch TTFTs of one step


@pytest.mark.parametrize(
    "build",
    [
        lambda: run_charts.latency_histogram(NEAR_EQUAL_TTFT_S, "ttft"),
        lambda: run_charts.binned_latency_histogram(BinnedLatencies.of(NEAR_EQUAL_TTFT_S), "ttft"),
    ],
    ids=["ended", "live"],
)
def test_nearly_equal_values_are_one_bar_that_says_how_close_they_are(build):
    fig = build()
    (bars,) = fig.data
    _, counts = _xy(bars)
    assert counts.tolist() == [16]
    (note,) = _notes(fig)
    assert note.startswith("All 16 requests within 0.04") and "4,582.43" in note


def test_the_live_output_rate_is_the_last_complete_window_not_a_gap_between_decode_steps():
    # CPU decoding: one step of 8 tokens every 4 bins of 0.5 s; the last bin alone read 0.0 tok/s while tokens flowed.
    rate = np.tile([16.0, 0.0, 0.0, 0.0], 10)[:-1]
    recent, seconds = run_charts.recent_output_rate(rate, 0.5)
    assert rate[-1] == 0.0 and recent > 0
    # A window of 4 steps on average (15 bins: 37 bins hold 10 steps), here holding 4 of them: 4 x 16 / 15 tok/s.
    assert recent == pytest.approx(4 * 16 / 15) and seconds == 7.5
    assert run_charts.recent_output_rate(np.full(6, 30.0), 0.5) == (30.0, 0.5)  # every bin filled: the last one
    assert run_charts.recent_output_rate(np.array([]), 0.5) == (0.0, 0.5)


def test_one_request_is_one_request_and_counts_tick_at_whole_requests():
    # "All 1 requests" and ticks at 0.5 and 1.5 requests on a small run.
    fig = run_charts.latency_histogram(np.array([0.25]), "ttft")
    (note,) = _notes(fig)
    assert note.startswith("1 request (") and "All" not in note
    assert (fig.layout.yaxis.tickmode, fig.layout.yaxis.tick0, fig.layout.yaxis.dtick) == ("linear", 0, 1)
    few = run_charts.latency_histogram(np.array([0.1, 0.2, 0.2, 0.9]), "ttft")
    assert few.layout.yaxis.dtick == 1
    many = run_charts.latency_histogram(_itl_with_stalls(), "itl")
    assert many.layout.yaxis.dtick >= 100 and float(many.layout.yaxis.dtick).is_integer()
    one_stall = run_charts.latency_histogram(np.concatenate([np.linspace(0.09, 0.11, 20), [12.0]]), "itl")
    assert _notes(one_stall)[0].startswith("1 gap above")


def _whole_ticks(axis) -> bool:
    """Plotly draws ticks at tick0 + k * dtick: whole counts only with a whole step from 0."""
    return (
        axis.tickmode == "linear"
        and axis.tick0 == 0
        and axis.dtick is not None
        and float(axis.dtick).is_integer()
        and axis.dtick >= 1
    )


def test_every_count_axis_ticks_at_whole_requests():
    # Issue 25: count axes ticked at 0.5 and 1.5 requests. A run of 5 requests, the workload of 2 and of 50: the run's
    # histograms and in-flight axis, the workload's length, send-time and prefix-share histograms.
    prof = profiled_run([0.05, 0.1])
    table = prof.request_table()
    snap = prof.live_snapshot()
    workload = table.assign(send_at_s=np.linspace(0.0, 1.5, len(table)), shared_prefix_tokens=table["input_len"] // 2)
    large = pd.concat([workload] * 10, ignore_index=True)
    figures_with_counts = {
        "latency histogram": (run_charts.latency_histogram(table["e2e_s"].dropna().to_numpy(), "e2e"), "yaxis"),
        "live histogram": (run_charts.binned_latency_histogram(snap.ttft, "ttft"), "yaxis"),
        "in flight": (
            run_charts.throughput_over_time(snap.time_s, snap.output_tokens_per_s, snap.in_flight_over_time),
            "yaxis2",
        ),
        **{
            f"{name} of {len(rows)}": (figure, "yaxis")
            for rows in (workload.head(2), large)
            for name, figure in (
                ("lengths", workload_charts.length_histograms(rows)),
                ("send times", workload_charts.send_times_figure(rows)),
                ("prefix share", workload_charts.reuse_figure(rows)),
            )
        },
    }
    crooked = [name for name, (fig, axis) in figures_with_counts.items() if not _whole_ticks(fig.layout[axis])]
    assert not crooked, crooked
    # The step fits the tallest bar: 50 requests of 4 output tokens stand in one bin.
    assert figures_with_counts["lengths of 50"][0].layout.yaxis.dtick == 10
    assert figures_with_counts["lengths of 2"][0].layout.yaxis.dtick == 1
    # The length bins are whole tokens, each length in one: 10, 20 ... 40 input tokens, 4 output tokens.
    inputs, outputs = figures_with_counts["lengths of 50"][0].data
    assert (inputs.xbins.start, inputs.xbins.size, outputs.xbins.start, outputs.xbins.size) == (9.5, 1, 3.5, 1)


def test_the_run_and_workload_legends_are_below_the_plot_clear_of_the_title():
    # Issue 25: a legend in a row above the plot lay over the chart's title (the request timeline's over "Request
    # timeline"); below the plot, one entry a line, the figure grows by as much as the legend takes.
    prof = profiled_run([0.05, 0.1])
    table = prof.request_table()
    snap = prof.live_snapshot()
    workload = table.assign(send_at_s=np.linspace(0.0, 1.5, len(table)), shared_prefix_tokens=table["input_len"] // 2)
    for fig in (
        run_charts.throughput_over_time(snap.time_s, snap.output_tokens_per_s, snap.in_flight_over_time),
        timeline.request_timeline(table, end_s=prof.elapsed_time),
        workload_charts.length_histograms(workload),
    ):
        legend = fig.layout.legend
        assert (legend.yref, legend.y, legend.yanchor) == ("container", 0, "bottom"), fig.layout.title.text
        assert fig.layout.margin.b >= 50 + len(fig.data) * 20
        assert fig.layout.height == figures.FIGURE_PX + fig.layout.margin.b - 50


def test_a_swept_count_ticks_at_the_values_it_took():
    # A sweep over concurrency 1, 2, 4 read ticks at 1.5, 2.5 and 3.5 requests.
    points = pd.DataFrame(
        {
            "concurrency": [1, 2, 4],
            "mean": [16.7, 27.6, 46.7],
            "ci_low": np.nan,
            "ci_high": np.nan,
            "min": [15.2, 21.8, 40.7],
            "max": [18.2, 33.5, 52.7],
            "n": 2,
            "std": [2.1, 8.3, 8.4],
        }
    )
    fig = sweep_charts.metric_vs_knob_band(points, "concurrency", "output_throughput")
    assert fig.layout.xaxis.tickmode == "array" and list(fig.layout.xaxis.tickvals) == [1, 2, 4]


def _itl_with_stalls() -> np.ndarray:
    """10,000 gaps around 100 ms and eight 10-13 s stalls."""
    rng = np.random.default_rng(0)
    return np.concatenate([rng.normal(0.1, 0.01, 10_000), np.linspace(10.0, 13.0, 8)])


@pytest.mark.parametrize(
    "build",
    [
        lambda values: run_charts.latency_histogram(values, "itl"),
        lambda values: run_charts.binned_latency_histogram(BinnedLatencies.of(values), "itl"),
    ],
    ids=["ended", "live"],
)
def test_a_few_far_outliers_go_into_a_labelled_bar_and_the_rest_keep_their_shape(build):
    values = _itl_with_stalls()
    fig = build(values)
    body, overflow = fig.data
    centres, counts = _xy(body)
    p99_ms = np.percentile(values, 99) * 1000
    assert centres.max() < p99_ms * 1.02  # bins stop at the P99, not at 13 s
    assert (counts > 0).sum() > 20  # the ~100 ms gaps spread over many bars, not squashed into one
    (above,) = overflow.y
    assert counts.sum() + above == values.size and above >= 8
    (note,) = _notes(fig)
    assert f"{above:,} gaps above" in note and "up to 13,000" in note
    (label,) = [annotation.text for annotation in fig.layout.annotations]
    assert label.startswith("> ")  # on the grey bar itself


@pytest.mark.parametrize(
    "build",
    [
        lambda values: run_charts.latency_histogram(values, "itl"),
        lambda values: run_charts.binned_latency_histogram(BinnedLatencies.of(values), "itl"),
    ],
    ids=["ended", "live"],
)
def test_stalls_above_one_percent_of_the_gaps_still_go_into_the_labelled_bar(build):
    """The default first run: 8 requests of 64 tokens, each with one 7-9 s stall while the others prefill, so
    the P99 is itself a stall."""
    rng = np.random.default_rng(2)
    values = np.concatenate([rng.normal(0.15, 0.03, 8 * 62), np.linspace(7.0, 9.0, 8)])
    fig = build(values)
    body, overflow = fig.data
    centres, counts = _xy(body)
    assert centres.max() < 1000 and (counts > 0).sum() > 20  # the ~150 ms gaps keep their shape
    assert overflow.y == (8,)


def test_a_spread_without_outliers_is_binned_over_its_whole_range():
    values = np.random.default_rng(1).normal(0.1, 0.01, 5_000)
    fig = run_charts.latency_histogram(values, "itl")
    (body,) = fig.data
    assert body.xbins.end == pytest.approx(values.max() * 1000) and not _notes(fig)
    shape = run_charts.histogram_range(values.min(), values.max(), *np.percentile(values, [25, 75, 99]))
    assert not shape.near_equal and not shape.overflow


def test_a_comb_of_empty_and_full_throughput_bins_is_averaged_to_its_trend_and_hovers_the_raw_rates():
    time_s = np.arange(400) * 0.5
    comb = np.tile([0.0, 0.0, 32.0], 134)[:400]  # a 16-token decode step every 1.5 s, in 0.5 s bins
    fig = run_charts.throughput_over_time(time_s, comb, np.full(400, 16))
    window = run_charts.throughput_window(comb)
    assert window >= 12
    _, y = _xy(fig.data[0])
    assert y[:-1] == pytest.approx(np.full(y.size - 1, comb.mean()), rel=0.1)  # a level line, not 0-to-32 spikes
    raw = np.asarray(fig.data[0].customdata)
    assert raw[:, 0].min() == 0 and raw[:, 1].max() == 32.0
    assert f"mean over {window * 0.5:g} s" in fig.data[0].hovertemplate


def test_a_steady_throughput_series_is_drawn_bin_by_bin():
    rate = np.random.default_rng(2).uniform(50, 70, 300)
    assert run_charts.throughput_window(rate) == 1
    _, y = _xy(run_charts.throughput_over_time(np.arange(300) * 0.5, rate, np.full(300, 4)).data[0])
    assert y == pytest.approx(rate)


def test_the_legend_of_many_runs_is_below_the_plot_one_run_a_line_clear_of_the_title(history_runs):
    runs = history_runs.assign(run=history_runs["label"])
    tables = {name: profiled_run(TTFTS).request_table() for name in runs["run"]}
    for fig in (
        compare_charts.latency_vs_throughput(runs, color="run"),
        compare_charts.metric_vs_knob(runs, "concurrency", "output_throughput", color="run"),
        compare_charts.cdf_overlay(tables, "ttft"),
    ):
        legend = fig.layout.legend
        # At the foot of the figure, not in the top margin where the title and its notes are.
        assert (legend.yref, legend.y, legend.yanchor) == ("container", 0, "bottom")
        assert (legend.orientation, legend.entrywidth, legend.entrywidthmode) == ("h", 1, "fraction")
        # The margin under the plot holds the axis title and a line per run and the legend's title.
        lines = len(runs) + 1
        assert fig.layout.margin.b >= 50 + lines * 20
        assert fig.layout.height == compare_charts.FIGURE_PX + fig.layout.margin.b - 50


def test_a_run_that_was_not_streamed_is_named_as_having_no_ttft_point(tmp_path):
    _, runs = recorded_history(
        tmp_path,
        [
            ("s2", "turbomind", 2, profiled_run(TTFTS)),
            ("s4", "turbomind", 4, profiled_run(TTFTS)),
            ("n8", "turbomind", 8, profiled_run(TTFTS, stream=False)),
        ],
    )
    runs = runs.assign(run=runs["label"])
    for fig in (
        compare_charts.latency_vs_throughput(runs, color="run"),
        compare_charts.metric_vs_knob(runs, "concurrency", "p99_ttft_ms", color="run"),
    ):
        assert sorted(t.name for t in fig.data) == ["turbomind x2", "turbomind x4"]
        assert _notes(fig) == ["Not streamed, so no P99 time to first token: turbomind x8"]
    assert not _notes(compare_charts.latency_vs_throughput(runs, latency="mean_e2e_ms", color="run"))
    history = History(tmp_path)
    requests = {name: history.requests(run_id) for name, run_id in zip(runs["run"], runs["run_id"])}
    cdf = compare_charts.cdf_overlay(requests, "itl", compare_charts.not_streamed(runs))
    assert [t.name for t in cdf.data] == ["turbomind x2", "turbomind x4"]
    assert _notes(cdf) == ["Not streamed, so no inter-token latency: turbomind x8"]


def _gaps(rng, requests: int = 8, per_request: int = 63) -> pd.DataFrame:
    """Successful requests with ITL gaps of 10 to 30 ms."""
    return pd.DataFrame(
        {"status": ["success"] * requests, "itl_s": [rng.uniform(0.01, 0.03, per_request) for _ in range(requests)]}
    )


def test_one_far_itl_outlier_is_cut_off_the_cdf_axis_as_the_histograms_cut_it_and_said():
    rng = np.random.default_rng(3)
    steady, stalled = _gaps(rng), _gaps(rng)
    stalled.at[2, "itl_s"][10] = 70.0  # one 70 s stall among 1,008 gaps
    fig = compare_charts.cdf_overlay({"steady": steady, "stalled": stalled}, "itl")
    low, high = fig.layout.xaxis.range
    assert low < 10 and 30 <= high < 40  # ms: the gaps' own spread fills the axis
    (note,) = _notes(fig)
    assert note.startswith("Axis cut: ") and note.endswith("(outliers), up to 70,000 ms")
    # The same cut as the run's ITL histogram.
    pooled = np.concatenate([*steady["itl_s"], *stalled["itl_s"]])
    assert _notes(run_charts.latency_histogram(pooled, "itl")) == [note.removeprefix("Axis cut: ")]
    assert _xy(fig.data[1])[0].max() == pytest.approx(70_000)  # the curve itself still goes there
    plain = compare_charts.cdf_overlay({"steady": steady}, "itl")
    assert plain.layout.xaxis.range is None and not _notes(plain)


def test_the_telemetry_chart_names_its_sources_in_a_legend_and_keeps_each_ones_colour():
    # The engine CPU panel drew the engine process and the process that started it as two bare lines, and a source
    # took another colour in the next panel: which line was which could not be told.
    rows = [Sample(t, PROCESS, CPU_CORES, 1.5) for t in (0.0, 1.0, 2.0)]
    rows += [Sample(t, CALLER, CPU_CORES, 0.2) for t in (0.0, 1.0, 2.0)]
    rows += [Sample(t, PROCESS, RSS_BYTES, 2.0 * 1024**3) for t in (0.0, 1.0, 2.0)]
    rows += [Sample(t, MACHINE, CPU_PERCENT, 60.0) for t in (0.0, 1.0, 2.0)]
    fig = run_charts.telemetry_over_time(samples_frame(rows))
    assert fig.layout.showlegend
    named = [trace.name for trace in fig.data if trace.showlegend is not False]
    assert sorted(named) == ["engine process", "process that started the engine", "whole machine"]
    colour_of = {}
    for trace in fig.data:
        colour_of.setdefault(trace.legendgroup, set()).add(trace.line.color)
    assert all(len(colours) == 1 for colours in colour_of.values())  # one colour per source, in every panel
    assert len({colours.pop() for colours in colour_of.values()}) == 3  # and a different one for each


def test_a_telemetry_chart_of_one_source_needs_no_legend():
    fig = run_charts.telemetry_over_time(samples_frame([Sample(t, PROCESS, CPU_CORES, 1.0) for t in (0.0, 1.0)]))
    assert not fig.layout.showlegend
    assert run_charts.source_label("gpu1") == "GPU 1" and run_charts.source_label("client_worker0") == "client worker 0"
