"""Plotly figures for the dashboard, built from snapshots, per-request tables and history rows.

Pure functions: no I/O, no streamlit. Every axis is titled with its unit (latencies in ms, stored in
seconds), every trace hovers its values, and an empty input gives an empty figure that says
"No data yet" instead of raising, so a live page can draw before the first tick.

Live figures are redrawn on every poll, so their payload is bounded whatever the run's size:
histograms are binned here (a `go.Histogram` of bin counts, not of a million ITL values) and
series are reduced to at most `MAX_POINTS` points.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd
import plotly.colors
import plotly.graph_objects as go

from ..hardware import telemetry
from ..config import KNOBS
from ..measure.latency_bins import BinnedLatencies
from ..measure.catalog import METRICS, lower_first
from ..measure.metrics import measured_values
from ..states import RequestStatus
from .run_diff import differing_settings, point_labels
from ..measure.stats import highest_load_meeting, pareto_front
from .tables import describe_column, format_number

MAX_POINTS = 2000
HISTOGRAM_BINS = 60
NO_DATA = "No data yet"
_NO_GROUP = "(none)"
_CHOICE_KNOBS = {knob.name for knob in KNOBS if knob.choices}
_PAD_FRACTION = 0.1
_LABELLED_SETTINGS = 2  # a point's label names at most this many differing settings
_MAX_TICKS = 12


def latency_histogram(values_s: np.ndarray, metric: str, title: str | None = None) -> go.Figure:
    """Distribution of one latency metric ("ttft", "itl", "tpot", "e2e") in ms; y counts requests (gaps for ITL).
    Near-equal values are one bar, far outliers one labelled bar beside the rest (see `histogram_range`)."""
    values = _finite(np.asarray(values_s, dtype=np.float64)) * METRICS[metric].display_scale
    if values.size == 0:
        return _histogram_figure(None, metric, title)
    shape = histogram_range(float(values.min()), float(values.max()), *np.percentile(values, _RANGE_PERCENTILES))
    return _histogram_figure(_bars(shape, values, np.ones(values.size)), metric, title)


def binned_latency_histogram(binned: BinnedLatencies, metric: str, title: str | None = None) -> go.Figure:
    """`latency_histogram` of a live run's binned values: its fine bins regrouped into the figure's even ones."""
    if binned.count == 0:
        return _histogram_figure(None, metric, title)
    scale = METRICS[metric].display_scale
    quartiles_and_p99 = (value * scale for value in binned.distribution(_RANGE_PERCENTILES).percentiles)
    shape = histogram_range(binned.min_s * scale, binned.max_s * scale, *quartiles_and_p99)
    return _histogram_figure(_bars(shape, binned.bin_centres_s() * scale, binned.nonzero_counts()), metric, title)


@dataclass(frozen=True)
class HistogramRange:
    """The values a histogram bins, in display units: [low, high], or one bar when they are all nearly equal;
    values above `high` (`overflow`) are counted in one labelled bar beside the others."""

    low: float
    high: float
    maximum: float
    near_equal: bool

    @property
    def overflow(self) -> bool:
        return self.high < self.maximum


# Values whose spread is within this share of their size are one bar ("all 16 within 0.04 ms"): 60 bars
# across 4,582.43 to 4,582.46 ms draw noise as a distribution.
NEAR_EQUAL_SPREAD = 1e-3
# Bins stop at the outlier cut when the values above it would stretch the axis this many times its span: a few
# 10 s stalls among 100 ms gaps would otherwise put every other gap in the first of the bars.
OVERFLOW_STRETCH = 3.0
# The cut is the P99, or Tukey's far-out fence (Q3 + 3 IQR) where that is lower: one stall per request among
# 63 gaps each is over 1% of the gaps, so the P99 is itself a stall.
TUKEY_FAR_OUT = 3.0
_RANGE_PERCENTILES = (25, 75, 99)


def histogram_range(minimum: float, maximum: float, q25: float, q75: float, p99: float) -> HistogramRange:
    """What a latency histogram bins, from its values' min, max, quartiles and P99."""
    cut = min(p99, q75 + TUKEY_FAR_OUT * (q75 - q25))
    high = cut if maximum - minimum > OVERFLOW_STRETCH * (cut - minimum) else maximum
    return HistogramRange(minimum, high, maximum, near_equal=high - minimum <= NEAR_EQUAL_SPREAD * abs(high))


@dataclass(frozen=True)
class _Bars:
    shape: HistogramRange
    counts: np.ndarray
    edges: np.ndarray
    overflow_count: int


def _bars(shape: HistogramRange, values: np.ndarray, weights: np.ndarray) -> _Bars:
    """Counts of `values` (each weighing its weight: 1, or a live bin's count) within the range, and above it."""
    inside = values <= shape.high
    inside_count = int(round(weights[inside].sum()))
    overflow = int(round(weights.sum())) - inside_count
    if shape.near_equal:
        half = max(shape.high - shape.low, NEAR_EQUAL_SPREAD * abs(shape.high), np.finfo(float).tiny) / 2
        middle = (shape.low + shape.high) / 2
        return _Bars(shape, np.array([inside_count]), np.array([middle - half, middle + half]), overflow)
    counts, edges = np.histogram(values[inside], bins=min(HISTOGRAM_BINS, max(1, inside_count)),
                                 range=(shape.low, shape.high), weights=weights[inside])
    return _Bars(shape, counts.round().astype(np.int64), edges, overflow)


def _histogram_figure(bars: _Bars | None, metric: str, title: str | None) -> go.Figure:
    spec = METRICS[metric]
    unit = spec.shown_unit
    counted = "gaps" if metric == "itl" else "requests"
    fig = _figure(title or spec.label, f"{spec.label} ({unit})", f"Count ({counted})")
    if bars is None:
        return _no_data(fig)
    counts, edges, shape = bars.counts, bars.edges, bars.shape
    width = edges[1] - edges[0]
    fig.add_trace(go.Histogram(
        x=(edges[:-1] + edges[1:]) / 2, y=counts, histfunc="sum",
        xbins=dict(start=edges[0], end=edges[-1], size=width),
        name=spec.label, customdata=np.column_stack([edges[:-1], edges[1:]]),
        hovertemplate=(f"%{{customdata[0]:.4g}} to %{{customdata[1]:.4g}} {unit}"
                       f"<br>%{{y}} {counted}<extra></extra>"),
    ))
    notes, right = [], edges[-1]
    if shape.near_equal:
        notes.append(f"All {int(counts.sum()):,} {counted} within {format_number(shape.high - shape.low)} {unit} "
                     f"({format_number(shape.low)} to {format_number(shape.high)} {unit})")
    if shape.overflow:
        label, right = _overflow_bar(fig, bars, unit, counted)
        notes.append(label)
    if shape.near_equal:  # the one bar a fifth of the axis wide, not a wall across the whole plot
        bar = edges[-1] - edges[0]
        fig.update_xaxes(range=[edges[0] - 2 * bar, max(edges[-1] + 2 * bar, right)])
    if notes:  # under the title, where no bar reaches
        fig.update_layout(title=dict(subtitle=dict(text="<br>".join(notes))),
                          margin=dict(t=_TITLE_MARGIN_PX + _NOTE_PX * len(notes)))
    fig.update_layout(bargap=0.05, showlegend=False)
    return fig


_TITLE_MARGIN_PX = 60
_NOTE_PX = 18


def _overflow_bar(fig: go.Figure, bars: _Bars, unit: str, counted: str) -> tuple[str, float]:
    """Values above the binned range as one grey bar set apart at its right, labelled with where it starts;
    returns the note that says what it holds and the bar's right edge."""
    edges, shape = bars.edges, bars.shape
    width = 2 * (edges[-1] - edges[0] if shape.near_equal else edges[1] - edges[0])
    x = edges[-1] + 1.5 * width
    fig.add_trace(go.Bar(
        x=[x], y=[bars.overflow_count], width=[width], name="Outliers", marker=dict(color="gray"),
        customdata=[[shape.high, shape.maximum]],
        hovertemplate=(f"%{{y}} {counted} above %{{customdata[0]:.4g}} {unit}, "
                       f"up to %{{customdata[1]:.4g}} {unit}<extra></extra>"),
    ))
    fig.add_annotation(x=x, y=bars.overflow_count, text=f"> {format_number(shape.high)}", showarrow=False,
                       yanchor="bottom")
    note = (f"{bars.overflow_count:,} {counted} above {format_number(shape.high)} {unit} (outliers), "
            f"up to {format_number(shape.maximum)} {unit}")
    return note, x + width / 2


# Throughput bins with no token beside bins with a whole decode step of them draw a comb; the line averages
# enough bins for about this many steps each, and keeps at least MIN_TREND_POINTS points.
STEPS_PER_POINT = 4
COMB_FILLED = 0.9
MIN_TREND_POINTS = 20


def throughput_window(output_tokens_per_s: np.ndarray) -> int:
    """How many of the series' bins each point of the line averages: 1 when nearly every bin between the first
    token and the last holds tokens, else enough bins for `STEPS_PER_POINT` filled ones on average."""
    filled = np.flatnonzero(np.asarray(output_tokens_per_s) > 0)
    if filled.size == 0:
        return 1
    span = filled[-1] - filled[0] + 1
    if filled.size >= COMB_FILLED * span:
        return 1
    window = math.ceil(STEPS_PER_POINT * span / filled.size)
    return int(max(1, min(window, len(output_tokens_per_s) // MIN_TREND_POINTS)))


def throughput_over_time(time_s: np.ndarray, output_tokens_per_s: np.ndarray, in_flight: np.ndarray) -> go.Figure:
    """Output tok/s (left axis) and requests in flight (right axis) against seconds since the start. A comb of
    sparse bins is averaged over `throughput_window` bins; the hover keeps the raw per-bin rates."""
    fig = _figure("Throughput over time", "Time since start (s)", "Output throughput (tok/s)")
    fig.update_layout(
        yaxis2=dict(title=dict(text="In flight (requests)"), overlaying="y", side="right", rangemode="tozero",
                    showgrid=False),
        hovermode="x unified",
        legend=dict(orientation="h", yanchor="bottom", y=1.02, x=0),
    )
    time_s = np.asarray(time_s, dtype=np.float64)
    if time_s.size == 0:
        return _no_data(fig)
    rate = np.asarray(output_tokens_per_s, dtype=np.float64)
    # At most MAX_POINTS points, whatever the run's length: means over equal runs of bins keep the level.
    window = max(throughput_window(rate), math.ceil(time_s.size / MAX_POINTS))
    starts = np.arange(0, time_s.size, window)
    averaged = np.add.reduceat(rate, starts) / np.diff(np.append(starts, time_s.size))
    lowest, highest = np.minimum.reduceat(rate, starts), np.maximum.reduceat(rate, starts)
    at_end = np.asarray(in_flight, dtype=np.float64)[np.minimum(starts + window, time_s.size) - 1]
    t = time_s[starts]
    bin_s = time_s[1] - time_s[0] if time_s.size > 1 else 0.0
    if window > 1:
        hover = (f"%{{y:.1f}} tok/s, mean over {window * bin_s:g} s"
                 f"<br>per {bin_s:g} s: %{{customdata[0]:.1f}} to %{{customdata[1]:.1f}} tok/s<extra></extra>")
    else:
        hover = "%{y:.1f} tok/s<extra></extra>"
    fig.add_trace(go.Scatter(x=t, y=averaged, mode="lines", name="Output tok/s", yaxis="y",
                             customdata=np.column_stack([lowest, highest]), hovertemplate=hover))
    fig.add_trace(go.Scatter(x=t, y=at_end, mode="lines", name="In flight", yaxis="y2",
                             line=dict(dash="dot", shape="hv"), hovertemplate="%{y:.0f} requests<extra></extra>"))
    # Whole requests: no tick at 0.5 of a request on a small run.
    step = _whole_step(float(np.max(at_end, initial=0)))
    fig.update_layout(yaxis=dict(rangemode="tozero"), yaxis2=dict(tickmode="linear", tick0=0, dtick=step))
    return fig


def metric_vs_knob(runs: pd.DataFrame, knob: str, metric: str, color: str | None = "backend") -> go.Figure:
    """History rows: `metric` against `knob`, one line per value of `color` (a run name column colours each
    run apart), sorted by the knob."""
    knob_spec, metric_spec = describe_column(knob), describe_column(metric)
    fig = _figure(f"{metric_spec.label} vs {knob_spec.label.lower()}", knob_spec.title, metric_spec.title)
    rows = _rows_with(runs, [knob, metric])
    if rows.empty:
        return _no_data(fig)
    for colour, (group, part) in zip(_colours(), _groups(rows, color)):
        part = part.sort_values(knob, kind="stable")
        fig.add_trace(go.Scatter(
            x=part[knob], y=part[metric], mode="lines+markers", name=group, cliponaxis=False,
            marker=dict(size=10, color=colour), line=dict(color=colour), customdata=_run_identity(part),
            hovertemplate=(f"{knob_spec.label}: %{{x}}<br>{metric_spec.label}: %{{y:.4g}} {metric_spec.unit}"
                           "<br>run %{customdata[0]} %{customdata[1]}<extra>%{fullData.name}</extra>"),
        ))
    _legend(fig, color)
    if _is_categorical(rows, knob):  # quant_policy 0/4/8/42 are codes, not a scale; text knobs are names
        fig.update_xaxes(type="category", categoryorder="category ascending")
    else:
        _pad(fig, "x", rows[knob])
        values = np.unique(rows[knob].to_numpy(dtype=np.float64))
        if values.size <= _MAX_TICKS:  # a tick at each value run, none at concurrency 2.5
            fig.update_xaxes(tickmode="array", tickvals=values, ticktext=[_tick(v) for v in values])
    _pad(fig, "y", rows[metric])
    return fig


def latency_vs_throughput(runs: pd.DataFrame, latency: str = "p99_ttft_ms", throughput: str = "output_throughput",
                          color: str | None = "backend") -> go.Figure:
    """History rows: one point per run, throughput across and latency up (better is right and low); each
    point is labelled with its values of the settings that differ between the runs."""
    latency_spec, throughput_spec = describe_column(latency), describe_column(throughput)
    fig = _figure(f"{latency_spec.label} vs {throughput_spec.label.lower()}", throughput_spec.title, latency_spec.title)
    rows = _rows_with(runs, [latency, throughput])
    if rows.empty:
        return _no_data(fig)
    labels = pd.Series(_setting_labels(rows), index=rows.index)
    for colour, (group, part) in zip(_colours(), _groups(rows, color)):
        fig.add_trace(go.Scatter(
            x=part[throughput], y=part[latency], mode="markers+text", name=group, cliponaxis=False,
            marker=dict(size=10, color=colour), text=labels[part.index],
            textposition=_inward(part[throughput], rows[throughput]), customdata=_run_identity(part),
            hovertemplate=(f"{throughput_spec.label}: %{{x:.4g}} {throughput_spec.unit}"
                           f"<br>{latency_spec.label}: %{{y:.4g}} {latency_spec.unit}"
                           "<br>%{text}<br>run %{customdata[0]} %{customdata[1]}<extra>%{fullData.name}</extra>"),
        ))
    _legend(fig, color)
    _pad(fig, "x", rows[throughput])
    _pad(fig, "y", rows[latency])
    return fig


def cdf_overlay(request_tables: Mapping[str, pd.DataFrame], metric: str) -> go.Figure:
    """Cumulative distribution of a latency metric per run, successful requests only (as LMDeploy counts)."""
    spec = METRICS[metric]
    fig = _figure(f"{spec.label}: cumulative distribution", f"{spec.label} ({spec.shown_unit})",
                  "Fraction of requests" if metric != "itl" else "Fraction of gaps")
    fig.update_yaxes(range=[0, 1.02])
    colours = dict(zip(sorted(request_tables), _colours()))  # each run in its colour on the compare charts
    for name, table in request_tables.items():
        values = np.sort(successful_values(table, metric)) * spec.display_scale
        if values.size == 0:
            continue
        keep = _cdf_points(values.size)
        # The curve rises from 0 at the smallest value, then steps up to 1 at the largest.
        x = np.concatenate([values[:1], values[keep]])
        y = np.concatenate([[0.0], (keep + 1) / values.size])
        fig.add_trace(go.Scatter(
            x=x, y=y, mode="lines", name=name, line=dict(shape="hv", color=colours[name]),
            hovertemplate=f"%{{x:.3f}} {spec.display_unit}<br>%{{y:.1%}} at or below<extra>%{{fullData.name}}</extra>",
        ))
    if not fig.data:
        return _no_data(fig)
    return fig


def successful_values(table: pd.DataFrame, metric: str) -> np.ndarray:
    """A latency metric's defined values (s) over the successful requests of a per-request table;
    ITL pools every request's gaps. What the run's own histograms and CDFs are drawn from."""
    ok = table["status"].to_numpy(dtype=object) == RequestStatus.SUCCESS
    return _finite(measured_values(METRICS[metric], table, ok, stream_output=True).astype(np.float64))


# ---- helpers ---------------------------------------------------------------------------------

def _figure(title: str, x_title: str, y_title: str) -> go.Figure:
    # No template of our own: the dashboard draws figures in Streamlit's theme, and copying a plotly
    # template costs about 12 ms a figure, on every live refresh.
    fig = go.Figure()
    fig.update_layout(
        title=dict(text=title),
        xaxis=dict(title=dict(text=x_title)),
        yaxis=dict(title=dict(text=y_title)),
        margin=dict(l=60, r=30, t=60, b=50),
    )
    return fig


def _no_data(fig: go.Figure) -> go.Figure:
    """Titled axes without ticks (their default range means nothing) and the message in the middle."""
    fig.add_annotation(text=NO_DATA, x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False,
                       font=dict(size=16, color="gray"))
    fig.update_xaxes(showticklabels=False, showgrid=False, zeroline=False)
    fig.update_yaxes(showticklabels=False, showgrid=False, zeroline=False)
    return fig


def _whole_step(largest: float) -> int:
    """A 1-2-5 tick step giving about five ticks up to `largest`, never below 1."""
    rough = max(largest / 5, 1.0)
    magnitude = 10 ** int(np.floor(np.log10(rough)))
    return int(next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= rough))


def _finite(values: np.ndarray) -> np.ndarray:
    return values[np.isfinite(values)]


def _downsample(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """At most MAX_POINTS points: means over equal runs of consecutive points, which keeps the level."""
    n = min(x.size, y.size)
    x, y = x[:n], y[:n]
    if n <= MAX_POINTS:
        return x, y
    groups = np.array_split(np.arange(n), MAX_POINTS)
    starts = np.array([g[0] for g in groups])
    sizes = np.array([g.size for g in groups])
    return x[starts], np.add.reduceat(y, starts) / sizes


def _cdf_points(n: int) -> np.ndarray:
    """Indices of at most MAX_POINTS evenly spread points of a sorted series, the last always kept."""
    if n <= MAX_POINTS:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, MAX_POINTS).round().astype(np.int64))


def _rows_with(runs: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """Rows where every named column has a value; numeric columns as numbers."""
    if any(col not in runs for col in columns):
        return runs.iloc[0:0]
    rows = runs.copy()
    for col in columns:
        numeric = pd.to_numeric(rows[col], errors="coerce")
        if numeric.notna().sum() == rows[col].notna().sum():  # keep text knobs (model_format) as text
            rows[col] = numeric
    return rows.dropna(subset=columns)


def _groups(rows: pd.DataFrame, color: str | None):
    """(name, rows) per colour value, in sorted order (numbers as numbers) so a value keeps its colour
    across charts."""
    if color is None or color not in rows:
        yield "all runs", rows
        return
    keys = rows[color].map(lambda value: _NO_GROUP if pd.isna(value) or value == "" else _tick(value))
    numbers = pd.to_numeric(rows[color], errors="coerce").groupby(keys).first()
    for key in sorted(numbers.index, key=lambda key: (0, numbers[key], key) if pd.notna(numbers[key]) else (1, 0, key)):
        yield key, rows[keys == key]


def _colours():
    """The qualitative palette, cycled: neighbouring groups get clearly different colours."""
    return itertools.cycle(_PALETTE)


def _legend(fig: go.Figure, color: str | None) -> None:
    """Above the plot, in a row: the plot keeps the full width for its points and their labels."""
    title = describe_column(color).label if color else ""
    fig.update_layout(showlegend=color is not None,
                      legend=dict(orientation="h", yanchor="bottom", y=1.0, x=0, title=dict(text=title, side="left")))


def _inward(x: pd.Series, all_x: pd.Series) -> list[str]:
    """Label positions that keep a label inside the plot: above its point, towards the middle."""
    middle = (pd.to_numeric(all_x).min() + pd.to_numeric(all_x).max()) / 2
    return ["top left" if value > middle else "top right" for value in pd.to_numeric(x)]


def _pad(fig: go.Figure, axis: str, values: pd.Series) -> None:
    """A numeric axis over the values with a tenth of their span (or of the value) to spare on each side, so a
    marker and its label at the edge stay whole, and a single value sits mid-axis."""
    numbers = pd.to_numeric(values, errors="coerce").to_numpy(dtype=np.float64)
    numbers = numbers[np.isfinite(numbers)]
    if not numbers.size:
        return
    low, high = float(numbers.min()), float(numbers.max())
    spare = (high - low) * _PAD_FRACTION or abs(high) * _PAD_FRACTION or 1.0
    fig.update_layout({f"{axis}axis": dict(range=[low - spare, high + spare])})


def _setting_labels(rows: pd.DataFrame) -> list[str]:
    """Per run, its values of the (first two) settings that differ between the rows: "Concurrency 4"."""
    return point_labels(rows, differing_settings(rows)[:_LABELLED_SETTINGS])


def _run_identity(rows: pd.DataFrame) -> np.ndarray:
    """(run id, label) per row, for the hover."""
    blank = pd.Series("", index=rows.index)
    run_id = rows.get("run_id", blank).astype(str)
    label = rows.get("label", blank).fillna("").astype(str)
    return np.column_stack([run_id.to_numpy(dtype=object), label.to_numpy(dtype=object)])


# ---- sweeps ----------------------------------------------------------------------------------
# Sweep points come from `stats.group_repeats` (key columns, then n, mean, std, ci_low, ci_high,
# with a 95% interval); runs are history rows.

def metric_vs_knob_band(points: pd.DataFrame, knob: str, metric: str, series: str | None = None) -> go.Figure:
    """Mean of `metric` against the swept `knob`, one line per value of `series`, each inside a shaded
    95% confidence band over its repeats (the band closes on the line where a point ran once)."""
    knob_spec, metric_spec = describe_column(knob), describe_column(metric)
    fig = _figure(f"{metric_spec.label} vs {lower_first(knob_spec.label)}", knob_spec.title, metric_spec.title)
    rows = _rows_with(points, [knob, "mean"])
    if rows.empty:
        return _no_data(fig)
    categorical = _is_categorical(rows, knob)
    for colour, (group, part) in zip(_colours(), _groups(rows, series)):
        part = part.sort_values(knob, kind="stable")
        x = [_tick(v) for v in part[knob]] if categorical else part[knob].tolist()
        low = part["ci_low"].fillna(part["mean"]).tolist()
        high = part["ci_high"].fillna(part["mean"]).tolist()
        fig.add_trace(go.Scatter(
            x=x + x[::-1], y=high + low[::-1], mode="lines", fill="toself", fillcolor=_translucent(colour, 0.2),
            line=dict(width=0), hoverinfo="skip", showlegend=False, legendgroup=group, name=f"{group} 95% CI",
        ))
        fig.add_trace(go.Scatter(
            x=x, y=part["mean"], mode="lines+markers", name=group, legendgroup=group, line=dict(color=colour),
            customdata=np.column_stack([part["n"], part["std"], low, high]),
            hovertemplate=(f"{knob_spec.label}: %{{x}}<br>{metric_spec.label}: %{{y:.4g}} {metric_spec.unit}"
                           f"<br>95% CI %{{customdata[2]:.4g}} to %{{customdata[3]:.4g}} {metric_spec.unit}"
                           "<br>std %{customdata[1]:.3g} over %{customdata[0]} runs"
                           "<extra>%{fullData.name}</extra>"),
        ))
    fig.update_layout(showlegend=series is not None, legend_title_text=series or "")
    if categorical:
        fig.update_xaxes(type="category")
    return fig


def pareto_chart(runs: pd.DataFrame, x: str, y: str) -> go.Figure:
    """One point per run; the runs no other run beats on both metrics are joined as the Pareto frontier and
    labelled with their values of the settings that differ between the runs (every point hovers them).
    Both columns need a better direction (describe_column), e.g. output tok/s against P99 TTFT."""
    x_spec, y_spec = describe_column(x), describe_column(y)
    if x_spec.larger_is_better is None or y_spec.larger_is_better is None:
        raise ValueError(f"A Pareto front needs metrics with a better direction; {x} or {y} has none.")
    fig = _figure(f"{y_spec.label} vs {lower_first(x_spec.label)}: Pareto frontier", x_spec.title, y_spec.title)
    rows = _rows_with(runs, [x, y])
    if rows.empty:
        return _no_data(fig)
    on_front = pareto_front(rows[x], rows[y], x_spec.larger_is_better, y_spec.larger_is_better)
    labels = pd.Series(_setting_labels(rows), index=rows.index)
    hover = (f"{x_spec.label}: %{{x:.4g}} {x_spec.unit}<br>{y_spec.label}: %{{y:.4g}} {y_spec.unit}"
             "<br>%{text}<br>run %{customdata[0]} %{customdata[1]}<extra>%{fullData.name}</extra>")
    others, front = rows[~on_front], rows[on_front].sort_values(x, kind="stable")
    fig.add_trace(go.Scatter(x=others[x], y=others[y], mode="markers", name="Dominated runs", cliponaxis=False,
                             marker=dict(size=8, color="lightgray"), customdata=_run_identity(others),
                             text=labels[others.index], hovertemplate=hover))
    fig.add_trace(go.Scatter(x=front[x], y=front[y], mode="lines+markers+text", name="Pareto frontier",
                             cliponaxis=False, marker=dict(size=10, color=_PALETTE[0]), line=dict(color=_PALETTE[0]),
                             text=labels[front.index], textposition=_inward(front[x], rows[x]),
                             customdata=_run_identity(front),
                             hovertemplate=hover))
    _pad(fig, "x", rows[x])
    _pad(fig, "y", rows[y])
    return fig


def goodput_vs_load(runs: pd.DataFrame, load: str, goodput: str, target: float) -> go.Figure:
    """Goodput (or SLO attainment) of every run against the load, the mean per load as a line, the
    target as a dashed line, and the highest load that meets it (interpolated) as a marked point."""
    load_spec, goodput_spec = describe_column(load), describe_column(goodput)
    fig = _figure(f"{goodput_spec.label} vs {lower_first(load_spec.label)}", load_spec.title, goodput_spec.title)
    rows = _rows_with(runs, [load, goodput])
    if rows.empty:
        return _no_data(fig)
    fig.add_trace(go.Scatter(
        x=rows[load], y=rows[goodput], mode="markers", name="Runs", marker=dict(size=7, opacity=0.5),
        customdata=_run_identity(rows),
        hovertemplate=(f"{load_spec.label}: %{{x:.4g}} {load_spec.unit}<br>{goodput_spec.label}: %{{y:.4g}} "
                       f"{goodput_spec.unit}<br>run %{{customdata[0]}} %{{customdata[1]}}<extra></extra>"),
    ))
    means = rows.groupby(load, sort=True)[goodput].mean()
    fig.add_trace(go.Scatter(
        x=means.index, y=means.to_numpy(), mode="lines", name="Mean per load",
        hovertemplate=f"%{{x:.4g}} {load_spec.unit}: mean %{{y:.4g}} {goodput_spec.unit}<extra></extra>",
    ))
    fig.add_hline(y=target, line=dict(dash="dash", color="gray"), annotation_position="top left",
                  annotation_text=f"Target {target:.4g} {goodput_spec.unit}".rstrip())
    limit = highest_load_meeting(rows[load], rows[goodput], target)
    if limit is None:
        fig.add_annotation(text="No load meets the target", x=0.5, y=1.0, xref="paper", yref="paper",
                           showarrow=False, yanchor="bottom")
    else:
        fig.add_trace(go.Scatter(
            x=[limit], y=[target], mode="markers", name="Highest load meeting the target",
            marker=dict(symbol="star", size=16, color="crimson"),
            hovertemplate=f"Highest load meeting the target: %{{x:.4g}} {load_spec.unit}<extra></extra>",
        ))
        fig.add_vline(x=limit, line=dict(dash="dot", color="crimson"))
    return fig


def knob_heatmap(points: pd.DataFrame, knob_x: str, knob_y: str, metric: str) -> go.Figure:
    """Mean of `metric` over a two-knob grid, each cell labelled with its value; colours run the same
    way for every metric: the brightest cell is the best one."""
    x_spec, y_spec, metric_spec = describe_column(knob_x), describe_column(knob_y), describe_column(metric)
    fig = _figure(f"{metric_spec.label} by {lower_first(x_spec.label)} and {lower_first(y_spec.label)}",
                  x_spec.title, y_spec.title)
    rows = _rows_with(points, [knob_x, knob_y, "mean"])
    if rows.empty:
        return _no_data(fig)
    means = rows.pivot_table(index=knob_y, columns=knob_x, values="mean", aggfunc="mean", sort=True)
    counts = rows.pivot_table(index=knob_y, columns=knob_x, values="n", aggfunc="sum", sort=True)
    counts = counts.reindex(index=means.index, columns=means.columns).fillna(0).astype(int)
    fig.add_trace(go.Heatmap(
        x=[_tick(v) for v in means.columns], y=[_tick(v) for v in means.index], z=means.to_numpy(),
        customdata=counts.to_numpy(), colorscale="Viridis", reversescale=metric_spec.larger_is_better is False,
        colorbar=dict(title=dict(text=metric_spec.title)), texttemplate="%{z:.3g}",
        hovertemplate=(f"{x_spec.label}: %{{x}}<br>{y_spec.label}: %{{y}}<br>{metric_spec.label}: %{{z:.4g}} "
                       f"{metric_spec.unit}<br>mean of %{{customdata}} runs<extra></extra>"),
    ))
    fig.update_xaxes(type="category")
    fig.update_yaxes(type="category")
    return fig


_PALETTE = plotly.colors.qualitative.Plotly


def _translucent(hex_colour: str, alpha: float) -> str:
    red, green, blue = plotly.colors.hex_to_rgb(hex_colour)
    return f"rgba({red}, {green}, {blue}, {alpha})"


def _is_categorical(rows: pd.DataFrame, knob: str) -> bool:
    """Choice knobs (codes such as quant_policy), flags and text knobs are categories, not a scale."""
    column = rows[knob]
    return knob in _CHOICE_KNOBS or pd.api.types.is_bool_dtype(column) or not pd.api.types.is_numeric_dtype(column)


def _tick(value) -> str:
    """A knob value as an axis category: 4 rather than 4.0."""
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return str(int(value))
    return str(value)


# Hardware telemetry (telemetry.py's long table): one panel per quantity, one line per source, shared time axis.
_TELEMETRY_PANELS = (  # (metric, panel title with its unit, scale from the stored unit)
    (telemetry.GPU_UTIL_PERCENT, "GPU utilisation (%)", 1.0),
    (telemetry.GPU_MEMORY_BYTES, "GPU memory used (GiB)", 1 / 1024**3),
    (telemetry.POWER_W, "GPU power (W)", 1.0),
    (telemetry.CPU_CORES, "Engine process CPU (cores)", 1.0),
    (telemetry.RSS_BYTES, "Engine process memory, RSS (GiB)", 1 / 1024**3),
    (telemetry.CPU_PERCENT, "Machine CPU busy (%)", 1.0),
)


def telemetry_over_time(samples: pd.DataFrame | None) -> go.Figure:
    """The run's hardware samples against seconds since the start: a panel for each quantity sampled (GPU
    utilisation, memory and power per GPU; the engine process's CPU and memory; the machine's CPU)."""
    from plotly.subplots import make_subplots

    present = [] if samples is None else [panel for panel in _TELEMETRY_PANELS
                                          if (samples["metric"] == panel[0]).any()]
    if not present:
        return _no_data(_figure("Hardware telemetry", "Time since start (s)", ""))
    fig = make_subplots(rows=len(present), cols=1, shared_xaxes=True, vertical_spacing=0.06,
                        subplot_titles=[title for _, title, _ in present])
    for row, (metric, title, scale) in enumerate(present, start=1):
        chosen = samples[samples["metric"] == metric]
        for source, part in chosen.groupby("source", sort=True):
            part = part.sort_values("time_s")
            t, values = _downsample(part["time_s"].to_numpy(dtype=np.float64),
                                    part["value"].to_numpy(dtype=np.float64) * scale)
            fig.add_trace(go.Scatter(x=t, y=values, mode="lines", name=f"{source} {metric}", showlegend=False,
                                     hovertemplate=f"{source}: %{{y:.3g}}<extra>{title}</extra>"), row=row, col=1)
        fig.update_yaxes(rangemode="tozero", row=row, col=1)
    fig.update_xaxes(title_text="Time since start (s)", row=len(present), col=1)
    fig.update_layout(title=dict(text="Hardware telemetry"), height=170 * len(present) + 90,
                      margin=dict(l=60, r=30, t=70, b=50), hovermode="x unified")
    return fig
