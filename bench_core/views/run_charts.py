"""Figures of one run, live or ended: its latency histograms, its throughput and requests in flight over time,
and its hardware telemetry over time; and the successful requests' latency values they are drawn from.

A live run's figures are redrawn on every poll, so their payload is bounded whatever the run's size: histograms
are binned here (a `go.Histogram` of bin counts, not of a million ITL values) and series are reduced to at most
`MAX_POINTS` points.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from ..hardware import telemetry
from ..measure.catalog import METRICS
from ..measure.latency_bins import BinnedLatencies
from ..measure.metrics import measured_values
from ..states import RequestStatus
from .figures import (
    MAX_POINTS,
    PALETTE,
    count_axis,
    cycled_palette,
    legend_below,
    no_data,
    notes_under_title,
    titled_figure,
)
from .tables import count_of, format_number

HISTOGRAM_BINS = 60


def latency_histogram(values_s: np.ndarray, metric: str, title: str | None = None) -> go.Figure:
    """Distribution of one latency metric ("ttft", "itl", "tpot", "e2e") in ms; y counts requests (gaps for ITL).
    Near-equal values are one bar, far outliers one labelled bar beside the rest (see `histogram_range`)."""
    values = _finite(np.asarray(values_s, dtype=np.float64)) * METRICS[metric].display_scale
    if values.size == 0:
        return _histogram_figure(None, metric, title)
    return _histogram_figure(_bars(range_of(values), values, np.ones(values.size)), metric, title)


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


def range_of(values: np.ndarray) -> HistogramRange:
    """`histogram_range` of some (finite, at least one) values."""
    return histogram_range(float(values.min()), float(values.max()), *np.percentile(values, _RANGE_PERCENTILES))


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
    inside_count = round(weights[inside].sum())
    overflow = round(weights.sum()) - inside_count
    if shape.near_equal:
        half = max(shape.high - shape.low, NEAR_EQUAL_SPREAD * abs(shape.high), np.finfo(float).tiny) / 2
        middle = (shape.low + shape.high) / 2
        return _Bars(shape, np.array([inside_count]), np.array([middle - half, middle + half]), overflow)
    counts, edges = np.histogram(
        values[inside],
        bins=min(HISTOGRAM_BINS, max(1, inside_count)),
        range=(shape.low, shape.high),
        weights=weights[inside],
    )
    return _Bars(shape, counts.round().astype(np.int64), edges, overflow)


def _histogram_figure(bars: _Bars | None, metric: str, title: str | None) -> go.Figure:
    spec = METRICS[metric]
    unit = spec.shown_unit
    counted = "gaps" if metric == "itl" else "requests"
    fig = titled_figure(title or spec.label, f"{spec.label} ({unit})", f"Count ({counted})")
    if bars is None:
        return no_data(fig)
    counts, edges, shape = bars.counts, bars.edges, bars.shape
    width = edges[1] - edges[0]
    fig.add_trace(
        go.Histogram(
            x=(edges[:-1] + edges[1:]) / 2,
            y=counts,
            histfunc="sum",
            xbins=dict(start=edges[0], end=edges[-1], size=width),
            name=spec.label,
            customdata=np.column_stack([edges[:-1], edges[1:]]),
            hovertemplate=(
                f"%{{customdata[0]:.4g}} to %{{customdata[1]:.4g}} {unit}<br>%{{y}} {counted}<extra></extra>"
            ),
        )
    )
    notes, right = [], edges[-1]
    if shape.near_equal:
        total = int(counts.sum())
        span = f"({format_number(shape.low)} to {format_number(shape.high)} {unit})"
        notes.append(
            f"{count_of(total, counted)} {span}"
            if total == 1
            else f"All {total:,} {counted} within {format_number(shape.high - shape.low)} {unit} {span}"
        )
    if shape.overflow:
        label, right = _overflow_bar(fig, bars, unit, counted)
        notes.append(label)
    if shape.near_equal:  # the one bar a fifth of the axis wide, not a wall across the whole plot
        bar = edges[-1] - edges[0]
        fig.update_xaxes(range=[edges[0] - 2 * bar, max(edges[-1] + 2 * bar, right)])
    notes_under_title(fig, notes)
    # Whole requests (gaps): no tick at 0.5 of one on a small run.
    count_axis(fig, float(max(counts.max(), bars.overflow_count)))
    fig.update_layout(bargap=0.05, showlegend=False)
    return fig


def _overflow_bar(fig: go.Figure, bars: _Bars, unit: str, counted: str) -> tuple[str, float]:
    """Values above the binned range as one grey bar set apart at its right, labelled with where it starts;
    returns the note that says what it holds and the bar's right edge."""
    edges, shape = bars.edges, bars.shape
    width = 2 * (edges[-1] - edges[0] if shape.near_equal else edges[1] - edges[0])
    x = edges[-1] + 1.5 * width
    fig.add_trace(
        go.Bar(
            x=[x],
            y=[bars.overflow_count],
            width=[width],
            name="Outliers",
            marker=dict(color="gray"),
            customdata=[[shape.high, shape.maximum]],
            hovertemplate=(
                f"%{{y}} {counted} above %{{customdata[0]:.4g}} {unit}, "
                f"up to %{{customdata[1]:.4g}} {unit}<extra></extra>"
            ),
        )
    )
    fig.add_annotation(
        x=x, y=bars.overflow_count, text=f"> {format_number(shape.high)}", showarrow=False, yanchor="bottom"
    )
    return overflow_note(shape, bars.overflow_count, unit, counted), x + width / 2


def overflow_note(shape: HistogramRange, count: int, unit: str, counted: str) -> str:
    """What lies beyond a cut range: "3 gaps above 250 ms (outliers), up to 70,000 ms"."""
    return (
        f"{count_of(count, counted)} above {format_number(shape.high)} {unit} (outliers), "
        f"up to {format_number(shape.maximum)} {unit}"
    )


# Throughput bins with no token beside bins with a whole decode step of them draw a comb; the line averages
# enough bins for about this many steps each, and keeps at least MIN_TREND_POINTS points.
STEPS_PER_POINT = 4
COMB_FILLED = 0.9
MIN_TREND_POINTS = 20


def recent_output_rate(output_tokens_per_s: np.ndarray, bin_s: float) -> tuple[float, float]:
    """The output tok/s of a live run's latest complete window, and the window's seconds: as many of the last
    bins as a point of the throughput line averages (`throughput_window`), so a gap between two decode steps
    does not read as 0 tok/s while tokens flow. (0.0, bin_s) before the first complete bin."""
    rate = np.asarray(output_tokens_per_s, dtype=np.float64)
    if rate.size == 0:
        return 0.0, bin_s
    window = min(_steps_window(rate), rate.size)
    return float(rate[-window:].mean()), window * bin_s


def throughput_window(output_tokens_per_s: np.ndarray) -> int:
    """How many of the series' bins each point of the line averages: 1 when nearly every bin between the first
    token and the last holds tokens, else enough bins for `STEPS_PER_POINT` filled ones on average (fewer
    where the line would keep under `MIN_TREND_POINTS` points)."""
    return int(max(1, min(_steps_window(output_tokens_per_s), len(output_tokens_per_s) // MIN_TREND_POINTS)))


def _steps_window(output_tokens_per_s: np.ndarray) -> int:
    """Bins holding `STEPS_PER_POINT` filled ones on average; 1 when nearly every bin is filled or none is."""
    filled = np.flatnonzero(np.asarray(output_tokens_per_s) > 0)
    if filled.size == 0:
        return 1
    span = filled[-1] - filled[0] + 1
    if filled.size >= COMB_FILLED * span:
        return 1
    return math.ceil(STEPS_PER_POINT * span / filled.size)


def steady_span(summary: Mapping[str, Any]) -> tuple[float, float] | None:
    """The steady window a run's summary holds, (start, end) in seconds from its start; None without one."""
    start, end = (summary.get(METRICS[key].column()) for key in ("steady_window_start", "steady_window_end"))
    if not isinstance(start, (int, float)) or not isinstance(end, (int, float)) or not end > start:
        return None
    return float(start), float(end)


def throughput_over_time(
    time_s: np.ndarray,
    output_tokens_per_s: np.ndarray,
    in_flight: np.ndarray,
    steady: tuple[float, float] | None = None,
) -> go.Figure:
    """Output tok/s (left axis) and requests in flight (right axis) against seconds since the start, the steady
    window (`steady_span`) shaded where there is one. A comb of sparse bins is averaged over `throughput_window`
    bins; the hover keeps the raw per-bin rates."""
    fig = titled_figure("Throughput over time", "Time since start (s)", "Output throughput (tok/s)")
    fig.update_layout(
        yaxis2=dict(
            title=dict(text="In flight (requests)"), overlaying="y", side="right", rangemode="tozero", showgrid=False
        ),
        hovermode="x unified",
    )
    time_s = np.asarray(time_s, dtype=np.float64)
    if time_s.size == 0:
        return no_data(fig)
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
        hover = (
            f"%{{y:.1f}} tok/s, mean over {window * bin_s:g} s"
            f"<br>per {bin_s:g} s: %{{customdata[0]:.1f}} to %{{customdata[1]:.1f}} tok/s<extra></extra>"
        )
    else:
        hover = "%{y:.1f} tok/s<extra></extra>"
    fig.add_trace(
        go.Scatter(
            x=t,
            y=averaged,
            mode="lines",
            name="Output tok/s",
            yaxis="y",
            customdata=np.column_stack([lowest, highest]),
            hovertemplate=hover,
        )
    )
    fig.add_trace(
        go.Scatter(
            x=t,
            y=at_end,
            mode="lines",
            name="In flight",
            yaxis="y2",
            line=dict(dash="dot", shape="hv"),
            hovertemplate="%{y:.0f} requests<extra></extra>",
        )
    )
    if steady is not None:
        fig.add_vrect(
            x0=steady[0],
            x1=steady[1],
            fillcolor=PALETTE[2],
            opacity=0.12,
            line_width=0,
            annotation_text="steady window",
            annotation_position="top left",
        )
    fig.update_layout(yaxis=dict(rangemode="tozero"))
    count_axis(fig, float(np.max(at_end, initial=0)), "yaxis2")
    legend_below(fig)
    return fig


def successful_values(table: pd.DataFrame, metric: str) -> np.ndarray:
    """A latency metric's defined values (s) over the successful requests of a per-request table;
    ITL pools every request's gaps. What the run's own histograms and CDFs are drawn from."""
    ok = table["status"].to_numpy(dtype=object) == RequestStatus.SUCCESS
    values = measured_values(METRICS[metric], table, ok, stream_output=True)
    assert values is not None, f"a request table has {metric}"
    return _finite(values.astype(np.float64))


# Hardware telemetry (telemetry.py's long table): one panel per quantity, one line per source, shared time axis.
_TELEMETRY_PANELS = (  # (metric, panel title with its unit, scale from the stored unit)
    (telemetry.GPU_UTIL_PERCENT, "GPU utilisation (%)", 1.0),
    (telemetry.GPU_MEMORY_BYTES, "GPU memory used (GiB)", 1 / 1024**3),
    (telemetry.POWER_W, "GPU power (W)", 1.0),
    (telemetry.CPU_CORES, "Engine process CPU (cores)", 1.0),
    (telemetry.RSS_BYTES, "Engine process memory, RSS (GiB)", 1 / 1024**3),
    (telemetry.CPU_PERCENT, "Machine CPU busy (%)", 1.0),
    (telemetry.LOOP_LAG_S, "Client event-loop lag (ms)", 1000.0),
)
_SOURCE_LABELS = {
    telemetry.PROCESS: "engine process",
    telemetry.CALLER: "process that started the engine",
    telemetry.MACHINE: "whole machine",
    telemetry.CLIENT_LOOP: "HTTP client's event loop",
}
_NUMBERED_SOURCES = (
    (telemetry.GPU_SOURCE.format(""), "GPU {}"),
    (telemetry.CLIENT_WORKER.format(""), "client worker {}"),
)
_LEGEND_PX = 40


def source_label(source: str) -> str:
    """What a telemetry source is, in words: "engine process", "GPU 0", "client worker 1"."""
    if source in _SOURCE_LABELS:
        return _SOURCE_LABELS[source]
    for prefix, label in _NUMBERED_SOURCES:
        if source.startswith(prefix) and source[len(prefix) :].isdigit():
            return label.format(source[len(prefix) :])
    return source


def telemetry_over_time(samples: pd.DataFrame | None) -> go.Figure:
    """The run's hardware samples against seconds since the start: a panel for each quantity sampled (GPU
    utilisation, memory and power per GPU; the engine process's CPU and memory; the machine's CPU; an HTTP client's
    event-loop lag). A source keeps its colour in every panel, and the legend below names the sources where there
    are several (the engine process's and its starter's CPU share a panel)."""
    from plotly.subplots import make_subplots

    present = [] if samples is None else [panel for panel in _TELEMETRY_PANELS if (samples["metric"] == panel[0]).any()]
    if not present:
        return no_data(titled_figure("Hardware telemetry", "Time since start (s)", ""))
    fig = make_subplots(
        rows=len(present),
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.06,
        subplot_titles=[title for _, title, _ in present],
    )
    assert samples is not None  # else nothing is present
    shown = samples[samples["metric"].isin([metric for metric, _, _ in present])]
    sources = sorted(shown["source"].unique())
    colours = dict(zip(sources, cycled_palette()))
    named = set()
    for row, (metric, title, scale) in enumerate(present, start=1):
        chosen = samples[samples["metric"] == metric]
        for source, part in chosen.groupby("source", sort=True):
            part = part.sort_values("time_s")
            t, values = _downsample(
                part["time_s"].to_numpy(dtype=np.float64), part["value"].to_numpy(dtype=np.float64) * scale
            )
            fig.add_trace(
                go.Scatter(
                    x=t,
                    y=values,
                    mode="lines",
                    name=source_label(source),
                    legendgroup=source,
                    showlegend=source not in named,
                    line=dict(color=colours[source]),
                    hovertemplate=f"{source_label(source)}: %{{y:.3g}}<extra>{title}</extra>",
                ),
                row=row,
                col=1,
            )
            named.add(source)
        fig.update_yaxes(rangemode="tozero", row=row, col=1)
    fig.update_xaxes(title_text="Time since start (s)", row=len(present), col=1)
    legend_px = _LEGEND_PX if len(sources) > 1 else 0
    fig.update_layout(
        title=dict(text="Hardware telemetry"),
        height=170 * len(present) + 90 + legend_px,
        margin=dict(l=60, r=30, t=70, b=50 + legend_px),
        hovermode="x unified",
        colorway=PALETTE,
        showlegend=len(sources) > 1,
        legend=dict(orientation="h", x=0, xref="container", y=0, yref="container", yanchor="bottom"),
    )
    return fig


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
