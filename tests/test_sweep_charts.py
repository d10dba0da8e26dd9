"""Sweep figures: confidence bands, Pareto frontier, SLO limit on goodput, two-knob heat map."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from bench_core.config import SLO
from bench_core.measure import stats
from bench_core.views import figures, sweep_charts, tables

SLO_TEXT = "TTFT ≤ 5,000 ms"


def _says_no_data(fig) -> bool:
    return not fig.data and [a.text for a in fig.layout.annotations] == [figures.NO_DATA]


def _repeats() -> pd.DataFrame:
    """Three repeats at concurrency 1, 2 and 4 for two backends; transformers ran concurrency 4 once."""
    rows = []
    for backend, scale in (("pytorch", 2.0), ("transformers", 1.0)):
        for concurrency in (1, 2, 4):
            repeats = 1 if (backend, concurrency) == ("transformers", 4) else 3
            for k in range(repeats):
                rows.append(
                    {
                        "backend": backend,
                        "concurrency": concurrency,
                        "run_id": f"{backend}-{concurrency}-{k}",
                        "output_throughput": scale * concurrency * 10 + k,
                    }
                )
    return pd.DataFrame(rows)


def test_metric_band_draws_a_mean_line_inside_its_confidence_band_per_series():
    points = stats.group_repeats(_repeats(), ["backend", "concurrency"], "output_throughput")
    fig = sweep_charts.metric_vs_knob_band(points, "concurrency", "output_throughput", series="backend")
    bands, lines = fig.data[0::2], fig.data[1::2]
    assert [line.name for line in lines] == ["pytorch", "transformers"]
    assert all(band.fill == "toself" and band.mode == "lines" and band.hoverinfo == "skip" for band in bands)
    pytorch_band, pytorch_line = bands[0], lines[0]
    assert list(pytorch_line.x) == [1, 2, 4]
    assert np.asarray(pytorch_line.y, dtype=float) == pytest.approx([21.0, 41.0, 81.0])
    # The band runs along the upper bounds and back along the lower ones: mean ± t(0.975, 2) · 1 / √3.
    half_width = 4.303 / np.sqrt(3)
    upper, lower = np.asarray(pytorch_band.y[:3], dtype=float), np.asarray(pytorch_band.y[3:][::-1], dtype=float)
    assert upper == pytest.approx(np.array([21.0, 41.0, 81.0]) + half_width, abs=1e-3)
    assert lower == pytest.approx(np.array([21.0, 41.0, 81.0]) - half_width, abs=1e-3)
    transformers_band = bands[1]
    assert transformers_band.y[2] == transformers_band.y[3] == 40.0  # one run at concurrency 4: no width
    assert fig.layout.xaxis.title.text == "Concurrency (requests)"
    assert fig.layout.yaxis.title.text == "Output throughput (tok/s)"
    assert "runs" in pytorch_line.hovertemplate and [row[4] for row in pytorch_line.customdata] == ["95% CI"] * 3
    assert pytorch_band.legendgroup == pytorch_line.legendgroup


def test_a_point_with_two_runs_spans_their_range_and_says_so_never_a_negative_band():
    # Two throughputs far apart: their t-interval (12.7 standard errors) went below 0 tok/s; the band shows the runs.
    runs = pd.DataFrame({"concurrency": [1, 1, 2, 2, 2], "output_throughput": [2.0, 30.0, 40.0, 41.0, 42.0]})
    points = stats.group_repeats(runs, ["concurrency"], "output_throughput", bounds=(0.0, np.inf))
    band, line = sweep_charts.metric_vs_knob_band(points, "concurrency", "output_throughput").data
    assert min(band.y) == 2.0 and max(band.y) == pytest.approx(41.0 + 4.303 / np.sqrt(3), abs=1e-3)
    assert [row[4] for row in line.customdata] == ["range of the runs", "95% CI"]
    assert float(line.customdata[0][2]) == 2.0  # numbers stay numbers for the hover's format


def test_choice_knobs_are_categories_on_the_band_chart():
    points = pd.DataFrame(
        {
            "quant_policy": [0, 8],
            "n": [2, 2],
            "mean": [5.0, 6.0],
            "std": [0.1, 0.1],
            "ci_low": [4.9, 5.9],
            "ci_high": [5.1, 6.1],
        }
    )
    fig = sweep_charts.metric_vs_knob_band(points, "quant_policy", "output_throughput")
    assert fig.layout.xaxis.type == "category"
    assert list(fig.data[1].x) == ["0", "8"]


def test_pareto_chart_joins_the_undominated_runs_in_order():
    runs = pd.DataFrame(
        {"run_id": list("abcde"), "output_throughput": [300, 100, 200, 150, 50], "p99_ttft_ms": [80, 10, 30, 40, 5]}
    )
    fig = sweep_charts.pareto_chart(runs, "output_throughput", "p99_ttft_ms")
    dominated, front = fig.data
    assert front.name == "Pareto frontier" and front.mode == "lines+markers+text"
    assert list(front.x) == [50, 100, 200, 300]  # sorted along the x axis
    assert [row[0] for row in front.customdata] == ["e", "b", "c", "a"]
    assert list(dominated.x) == [150] and dominated.customdata[0][0] == "d"
    assert fig.layout.xaxis.title.text == "Output throughput (tok/s)"
    assert fig.layout.yaxis.title.text == "P99 time to first token (ms)"
    assert "tok/s" in front.hovertemplate and "ms" in front.hovertemplate


def test_pareto_points_that_a_server_s_setting_tells_apart_are_labelled_by_their_point():
    """Two points at the same max concurrency, one server speculating and one not: no declared setting tells them
    apart, so each is labelled with its point."""
    points = pd.DataFrame(
        {
            "max_concurrency": [16, 16],
            "point": ["max_concurrency=16, speculation=off", "max_concurrency=16, speculation=on"],
            "n": [2, 2],
            "output_throughput": [142.0, 98.0],
            "p99_ttft_ms": [52.0, 6.0],
        }
    )
    (front,) = [
        trace
        for trace in sweep_charts.pareto_chart(points, "output_throughput", "p99_ttft_ms").data
        if trace.name == "Pareto frontier"
    ]
    assert list(front.text) == ["max_concurrency=16, speculation=on", "max_concurrency=16, speculation=off"]


def test_pareto_chart_needs_metrics_with_a_direction():
    runs = pd.DataFrame({"concurrency": [1, 2], "output_throughput": [1.0, 2.0]})
    with pytest.raises(ValueError, match="better direction"):
        sweep_charts.pareto_chart(runs, "concurrency", "output_throughput")


def test_goodput_chart_marks_the_interpolated_highest_load_meeting_the_target():
    runs = pd.DataFrame({"concurrency": [1, 2, 4, 4, 8], "goodput_rps": [3.0, 2.8, 2.7, 2.3, 1.6]})
    fig = sweep_charts.goodput_vs_load(runs, "concurrency", "goodput_rps", target=2.4, slo=SLO_TEXT)
    assert [trace.name for trace in fig.data] == ["Runs", "Mean per load", "Highest load meeting the target"]
    points, mean_line, limit = fig.data
    assert len(points.x) == 5
    assert list(mean_line.x) == [1, 2, 4, 8]
    assert np.asarray(mean_line.y, dtype=float) == pytest.approx([3.0, 2.8, 2.5, 1.6])
    # The mean at 4 (2.5) meets 2.4 and the one at 8 (1.6) misses: the line crosses 1/9 of the way on.
    assert limit.x[0] == pytest.approx(4 + 4 / 9) and limit.y[0] == 2.4
    target_line, limit_line = fig.layout.shapes
    assert target_line.y0 == target_line.y1 == 2.4
    assert limit_line.x0 == limit_line.x1 == limit.x[0]
    assert fig.layout.xaxis.title.text == "Concurrency (requests)"
    assert fig.layout.yaxis.title.text == "Goodput (req/s)"
    assert "req/s" in points.hovertemplate and "requests" in limit.hovertemplate
    assert stats.LOAD_LIMIT_RULE in [a.text for a in fig.layout.annotations]  # monotonic: the rule alone


def test_goodput_chart_marks_a_load_meeting_the_target_above_one_that_misses_and_says_the_rule():
    # The chart: attainment 1.0 at concurrency 4, above the 0.9 line, captioned "No load meets the target".
    runs = pd.DataFrame({"concurrency": [1, 1, 2, 2, 4, 4], "slo_attainment": [0.5, 0.5, 0.75, 0.75, 1.0, 1.0]})
    fig = sweep_charts.goodput_vs_load(runs, "concurrency", "slo_attainment", target=0.9, slo=SLO_TEXT)
    limit = fig.data[-1]
    assert limit.name == "Highest load meeting the target" and limit.x[0] == 4.0
    (note,) = [a.text for a in fig.layout.annotations if a.text.startswith("Marked:")]
    assert note == stats.LOAD_LIMIT_RULE + "<br>Not monotonic: concurrency 1, 2 below it misses the target"
    assert not [a for a in fig.layout.annotations if "No load" in a.text]


def test_goodput_chart_states_its_slo_and_draws_no_target_nobody_set():
    # The report drew a 1 req/s target nobody chose ("No load meets the target") and never said which SLO counted.
    runs = pd.DataFrame({"concurrency": [1, 2], "goodput_rps": [0.5, 0.4]})
    fig = sweep_charts.goodput_vs_load(runs, "concurrency", "goodput_rps", target=None, slo=SLO_TEXT)
    assert fig.layout.title.subtitle.text == "Good requests: TTFT ≤ 5,000 ms; no target set"
    assert [trace.name for trace in fig.data] == ["Runs", "Mean per load"]
    assert not fig.layout.shapes and not [a for a in fig.layout.annotations if "target" in a.text.lower()]
    chosen = sweep_charts.goodput_vs_load(runs, "concurrency", "goodput_rps", target=0.45, slo=SLO_TEXT)
    assert chosen.layout.title.subtitle.text == "Good requests: TTFT ≤ 5,000 ms; target 0.45"
    probes = pd.DataFrame({"load": [1.0], "met": [True], "attainment": [0.95], "run_id": ["a"], "stopped_early": [""]})
    found = sweep_charts.find_max_probes(probes, "request_rate", 0.9, 1.0, SLO_TEXT)
    assert found.layout.title.subtitle.text == "Good requests: TTFT ≤ 5,000 ms; target attainment 0.9"


def test_an_slo_is_described_by_the_thresholds_it_sets():
    assert tables.describe_slo(SLO(ttft=5.0, e2e=20.0)) == "TTFT ≤ 5,000 ms, E2E ≤ 20,000 ms"
    assert tables.describe_slo(SLO(tpot=0.05)) == "TPOT ≤ 50 ms"
    assert tables.describe_slo(SLO()) == tables.describe_slo(None) == "no threshold set"


def test_goodput_chart_says_so_when_no_load_meets_the_target():
    runs = pd.DataFrame({"concurrency": [1, 2], "goodput_rps": [0.5, 0.4]})
    fig = sweep_charts.goodput_vs_load(runs, "concurrency", "goodput_rps", target=2.0, slo=SLO_TEXT)
    assert [trace.name for trace in fig.data] == ["Runs", "Mean per load"]
    assert "No load meets the target" in [a.text for a in fig.layout.annotations]


def test_heatmap_puts_the_mean_of_each_grid_cell_with_its_run_count():
    runs = pd.DataFrame(
        {
            "concurrency": [1, 1, 2, 2, 1, 2],
            "cache_max_entry_count": [0.5, 0.5, 0.5, 0.5, 0.8, 0.8],
            "p99_ttft_ms": [10.0, 12.0, 20.0, 22.0, 9.0, 18.0],
        }
    )
    points = stats.group_repeats(runs, ["concurrency", "cache_max_entry_count"], "p99_ttft_ms")
    fig = sweep_charts.knob_heatmap(points, "concurrency", "cache_max_entry_count", "p99_ttft_ms")
    (heatmap,) = fig.data
    assert list(heatmap.x) == ["1", "2"] and list(heatmap.y) == ["0.5", "0.8"]
    assert np.asarray(heatmap.z, dtype=float) == pytest.approx(np.array([[11.0, 21.0], [9.0, 18.0]]))
    assert np.asarray(heatmap.customdata).tolist() == [[2, 2], [1, 1]]
    assert heatmap.reversescale is True  # lower latency is better: the best cell stays the brightest
    assert heatmap.colorbar.title.text == "P99 time to first token (ms)"
    assert fig.layout.title.text == "P99 time to first token by concurrency and KV cache share of free GPU memory"
    assert fig.layout.xaxis.title.text == "Concurrency (requests)"
    assert fig.layout.yaxis.title.text == "KV cache share of free GPU memory (fraction)"
    assert "ms" in heatmap.hovertemplate


def test_heatmap_of_a_throughput_keeps_the_colour_scale():
    points = pd.DataFrame({"concurrency": [1, 2], "tp": [1, 1], "n": [1, 1], "mean": [5.0, 9.0]})
    assert sweep_charts.knob_heatmap(points, "concurrency", "tp", "output_throughput").data[0].reversescale is False


@pytest.mark.parametrize(
    "build",
    [
        lambda: sweep_charts.metric_vs_knob_band(pd.DataFrame(), "concurrency", "output_throughput"),
        lambda: sweep_charts.metric_vs_knob_band(
            stats.group_repeats(pd.DataFrame(), ["concurrency"], "output_throughput"),
            "concurrency",
            "output_throughput",
        ),
        lambda: sweep_charts.pareto_chart(
            pd.DataFrame(columns=["output_throughput", "p99_ttft_ms"]), "output_throughput", "p99_ttft_ms"
        ),
        lambda: sweep_charts.goodput_vs_load(
            pd.DataFrame({"concurrency": [1], "goodput_rps": [np.nan]}), "concurrency", "goodput_rps", 1.0, SLO_TEXT
        ),
        lambda: sweep_charts.knob_heatmap(pd.DataFrame(), "concurrency", "tp", "output_throughput"),
    ],
)
def test_sweep_charts_of_nothing_say_no_data(build):
    assert _says_no_data(build())


def test_find_max_probes_number_the_probes_and_say_when_no_load_met_the_target():
    probes = pd.DataFrame(
        {
            "load": [1.0, 0.5, 0.25],
            "met": [False, False, False],
            "attainment": [0.2, 0.5, 0.8],
            "run_id": ["a", "b", "c"],
            "stopped_early": ["3 of 8 requests missed the SLO", "", ""],
        }
    )
    fig = sweep_charts.find_max_probes(probes, "request_rate", 0.9, None, SLO_TEXT)
    (missed,) = fig.data
    assert missed.name == "Missed it" and list(missed.text) == ["1", "2", "3"]
    assert list(missed.marker.symbol) == ["circle-open", "circle", "circle"]
    assert [a.text for a in fig.layout.annotations if a.text.startswith("No load")] == ["No load met the target"]
    assert _says_no_data(sweep_charts.find_max_probes(probes.iloc[0:0], "request_rate", 0.9, None, SLO_TEXT))


def test_a_point_measured_on_a_busy_machine_is_crossed_and_named_in_the_legend():
    from bench_core.hardware.contention import BUSY_RUNS, BUSY_SHARE_COLUMN

    points = stats.group_repeats(_repeats(), ["backend", "concurrency"], "output_throughput")
    points[BUSY_RUNS] = [0, 1, 0, 0, 0, 2]  # pytorch at 2, transformers at 4
    fig = sweep_charts.metric_vs_knob_band(points, "concurrency", "output_throughput", series="backend")
    crosses = fig.data[-1]
    assert crosses.name == sweep_charts.BUSY_LEGEND and crosses.marker.symbol == "x-thin-open"
    assert list(crosses.x) == [2, 4] and np.asarray(crosses.y, dtype=float) == pytest.approx([41.0, 40.0])
    assert fig.layout.showlegend
    alone = sweep_charts.metric_vs_knob_band(
        points[points["backend"] == "transformers"], "concurrency", "output_throughput"
    )
    assert alone.layout.showlegend and alone.data[-1].name == sweep_charts.BUSY_LEGEND  # the legend is its note

    calm = points.assign(**{BUSY_RUNS: 0})
    assert sweep_charts.BUSY_LEGEND not in [
        t.name
        for t in sweep_charts.metric_vs_knob_band(calm, "concurrency", "output_throughput", series="backend").data
    ]

    runs = pd.DataFrame(
        {
            "run_id": list("abc"),
            "output_throughput": [300, 100, 200],
            "p99_ttft_ms": [80, 10, 30],
            BUSY_SHARE_COLUMN: [0.9, 0.0, float("nan")],
        }
    )
    pareto = sweep_charts.pareto_chart(runs, "output_throughput", "p99_ttft_ms")
    assert pareto.data[-1].name == sweep_charts.BUSY_LEGEND and list(pareto.data[-1].x) == [300]
    goodput = sweep_charts.goodput_vs_load(
        pd.DataFrame({"concurrency": [1, 2, 4], "goodput_rps": [3.0, 2.8, 1.0], BUSY_SHARE_COLUMN: [0.0, 0.5, 0.1]}),
        "concurrency",
        "goodput_rps",
        target=2.4,
        slo=SLO_TEXT,
    )
    assert goodput.data[-1].name == sweep_charts.BUSY_LEGEND and list(goodput.data[-1].x) == [2]


def test_a_point_whose_client_could_not_keep_up_is_marked_apart_from_a_busy_one():
    from bench_core.hardware.client_bound import CLIENT_BOUND_RUNS, LAG_COLUMN, SATURATED_COLUMN
    from bench_core.hardware.contention import BUSY_RUNS, BUSY_SHARE_COLUMN

    points = stats.group_repeats(_repeats(), ["backend", "concurrency"], "output_throughput")
    points[BUSY_RUNS] = [0, 1, 0, 0, 0, 0]  # pytorch at 2
    points[CLIENT_BOUND_RUNS] = [0, 0, 0, 1, 0, 2]  # transformers at 1 and 4
    fig = sweep_charts.metric_vs_knob_band(points, "concurrency", "output_throughput", series="backend")
    busy, client = fig.data[-2:]
    assert busy.name == sweep_charts.BUSY_LEGEND and list(busy.x) == [2]
    assert client.name == sweep_charts.CLIENT_BOUND_LEGEND and client.marker.symbol == "diamond-open"
    assert list(client.x) == [1, 4] and "client bound" in client.hovertemplate
    calm = points.assign(**{CLIENT_BOUND_RUNS: 0, BUSY_RUNS: 0})
    names = [t.name for t in sweep_charts.metric_vs_knob_band(calm, "concurrency", "output_throughput").data]
    assert sweep_charts.CLIENT_BOUND_LEGEND not in names

    runs = pd.DataFrame(
        {
            "run_id": list("abcd"),
            "output_throughput": [300, 100, 200, 250],
            "p99_ttft_ms": [80, 10, 30, 50],
            BUSY_SHARE_COLUMN: [float("nan")] * 4,
            LAG_COLUMN: [2.0, 25.0, float("nan"), 1.0],  # b: its loop late
            SATURATED_COLUMN: [0.0, 0.0, float("nan"), 0.7],  # d: at a full core most of the run
        }
    )
    pareto = sweep_charts.pareto_chart(runs, "output_throughput", "p99_ttft_ms")
    assert pareto.data[-1].name == sweep_charts.CLIENT_BOUND_LEGEND and sorted(pareto.data[-1].x) == [100, 250]
    assert sweep_charts.BUSY_LEGEND not in [t.name for t in pareto.data]
    goodput = sweep_charts.goodput_vs_load(
        pd.DataFrame({"request_rate": [1, 2, 4], "goodput_rps": [1.0, 1.9, 2.0], LAG_COLUMN: [1.0, 3.0, 40.0]}),
        "request_rate",
        "goodput_rps",
        target=1.5,
        slo=SLO_TEXT,
    )
    assert goodput.data[-1].name == sweep_charts.CLIENT_BOUND_LEGEND and list(goodput.data[-1].x) == [4]
