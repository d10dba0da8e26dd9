"""Plotly figures for the dashboard, built from snapshots, per-request tables and history rows.

Pure functions: no I/O, no streamlit. Every axis is titled with its unit (latencies in ms, stored in
seconds), every trace hovers its values, and an empty input gives an empty figure that says
"No data yet" instead of raising, so a live page can draw before the first tick.

Live figures are redrawn on every poll, so their payload is bounded whatever the run's size:
histograms are binned here (a `go.Histogram` of bin counts, not of a million ITL values) and
series are reduced to at most `MAX_POINTS` points.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from .config import ENGINE_KNOBS
from .metrics import METRICS, SUCCESS
from .tables import describe_column

TEMPLATE = "plotly_white"
MAX_POINTS = 2000
HISTOGRAM_BINS = 60
NO_DATA = "No data yet"
_NO_GROUP = "(none)"
_CHOICE_KNOBS = {knob.name for knob in ENGINE_KNOBS if knob.choices}


def latency_histogram(values_s: np.ndarray, metric: str, title: str | None = None) -> go.Figure:
    """Distribution of one latency metric ("ttft", "itl", "tpot", "e2e") in ms; y counts requests (gaps for ITL)."""
    spec = METRICS[metric]
    values = _finite(np.asarray(values_s, dtype=np.float64)) * spec.display_scale
    counted = "gaps" if metric == "itl" else "requests"
    fig = _figure(title or spec.label, f"{spec.label} ({spec.display_unit or spec.unit})", f"Count ({counted})")
    if values.size == 0:
        return _no_data(fig)
    counts, edges = np.histogram(values, bins=min(HISTOGRAM_BINS, max(1, values.size)))
    width = edges[1] - edges[0]
    fig.add_trace(go.Histogram(
        x=(edges[:-1] + edges[1:]) / 2, y=counts, histfunc="sum",
        xbins=dict(start=edges[0], end=edges[-1], size=width),
        name=spec.label, customdata=np.column_stack([edges[:-1], edges[1:]]),
        hovertemplate=(f"%{{customdata[0]:.4g}} to %{{customdata[1]:.4g}} {spec.display_unit}"
                       f"<br>%{{y}} {counted}<extra></extra>"),
    ))
    fig.update_layout(bargap=0.05, showlegend=False)
    return fig


def throughput_over_time(time_s: np.ndarray, output_tokens_per_s: np.ndarray, in_flight: np.ndarray) -> go.Figure:
    """Output tok/s (left axis) and requests in flight (right axis) against seconds since the start."""
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
    t, tokens = _downsample(time_s, np.asarray(output_tokens_per_s, dtype=np.float64))
    _, flight = _downsample(time_s, np.asarray(in_flight, dtype=np.float64))
    fig.add_trace(go.Scatter(x=t, y=tokens, mode="lines", name="Output tok/s", yaxis="y",
                             hovertemplate="%{y:.1f} tok/s<extra></extra>"))
    fig.add_trace(go.Scatter(x=t, y=flight, mode="lines", name="In flight", yaxis="y2",
                             line=dict(dash="dot", shape="hv"), hovertemplate="%{y:.0f} requests<extra></extra>"))
    # Whole requests: no tick at 0.5 of a request on a small run.
    step = _whole_step(float(np.max(flight, initial=0)))
    fig.update_layout(yaxis=dict(rangemode="tozero"), yaxis2=dict(tickmode="linear", tick0=0, dtick=step))
    return fig


def metric_vs_knob(runs: pd.DataFrame, knob: str, metric: str, color: str | None = "backend") -> go.Figure:
    """History rows: `metric` against `knob`, one line per value of `color`, sorted by the knob."""
    knob_spec, metric_spec = describe_column(knob), describe_column(metric)
    fig = _figure(f"{metric_spec.label} vs {knob_spec.label.lower()}", knob_spec.title, metric_spec.title)
    rows = _rows_with(runs, [knob, metric])
    if rows.empty:
        return _no_data(fig)
    for group, part in _groups(rows, color):
        part = part.sort_values(knob, kind="stable")
        fig.add_trace(go.Scatter(
            x=part[knob], y=part[metric], mode="lines+markers", name=group,
            customdata=_run_identity(part),
            hovertemplate=(f"{knob_spec.label}: %{{x}}<br>{metric_spec.label}: %{{y:.4g}} {metric_spec.unit}"
                           "<br>run %{customdata[0]} %{customdata[1]}<extra>%{fullData.name}</extra>"),
        ))
    fig.update_layout(showlegend=color is not None, legend_title_text=color or "")
    if knob in _CHOICE_KNOBS:  # quant_policy 0/4/8/42 are codes, not a scale
        fig.update_xaxes(type="category", categoryorder="category ascending")
    return fig


def latency_vs_throughput(runs: pd.DataFrame, latency: str = "p99_ttft_ms", throughput: str = "output_throughput",
                          color: str | None = "backend") -> go.Figure:
    """History rows: one point per run, throughput across and latency up (better is right and low)."""
    latency_spec, throughput_spec = describe_column(latency), describe_column(throughput)
    fig = _figure(f"{latency_spec.label} vs {throughput_spec.label.lower()}", throughput_spec.title, latency_spec.title)
    rows = _rows_with(runs, [latency, throughput])
    if rows.empty:
        return _no_data(fig)
    for group, part in _groups(rows, color):
        fig.add_trace(go.Scatter(
            x=part[throughput], y=part[latency], mode="markers", name=group, marker=dict(size=10),
            customdata=_run_identity(part),
            hovertemplate=(f"{throughput_spec.label}: %{{x:.4g}} {throughput_spec.unit}"
                           f"<br>{latency_spec.label}: %{{y:.4g}} {latency_spec.unit}"
                           "<br>run %{customdata[0]} %{customdata[1]}<extra>%{fullData.name}</extra>"),
        ))
    fig.update_layout(showlegend=color is not None, legend_title_text=color or "")
    return fig


def cdf_overlay(request_tables: Mapping[str, pd.DataFrame], metric: str) -> go.Figure:
    """Cumulative distribution of a latency metric per run, successful requests only (as LMDeploy counts)."""
    spec = METRICS[metric]
    fig = _figure(f"{spec.label}: cumulative distribution", f"{spec.label} ({spec.display_unit or spec.unit})",
                  "Fraction of requests" if metric != "itl" else "Fraction of gaps")
    fig.update_yaxes(range=[0, 1.02])
    for name, table in request_tables.items():
        values = np.sort(successful_values(table, metric)) * spec.display_scale
        if values.size == 0:
            continue
        keep = _cdf_points(values.size)
        # The curve rises from 0 at the smallest value, then steps up to 1 at the largest.
        x = np.concatenate([values[:1], values[keep]])
        y = np.concatenate([[0.0], (keep + 1) / values.size])
        fig.add_trace(go.Scatter(
            x=x, y=y, mode="lines", name=name, line=dict(shape="hv"),
            hovertemplate=f"%{{x:.3f}} {spec.display_unit}<br>%{{y:.1%}} at or below<extra>%{{fullData.name}}</extra>",
        ))
    if not fig.data:
        return _no_data(fig)
    return fig


def successful_values(table: pd.DataFrame, metric: str) -> np.ndarray:
    """A latency metric's defined values (s) over the successful requests of a per-request table;
    ITL pools every request's gaps. What the run's own histograms and CDFs are drawn from."""
    ok = table["status"].to_numpy(dtype=object) == SUCCESS
    if metric == "itl":
        cells = [np.asarray(c, dtype=np.float64) for c in table["itl_s"].to_numpy(dtype=object)[ok] if c is not None]
        values = np.concatenate(cells) if cells else np.array([])
    else:
        values = table[f"{metric}_s"].to_numpy(dtype=np.float64)[ok]
    return _finite(values)


# ---- helpers ---------------------------------------------------------------------------------

def _figure(title: str, x_title: str, y_title: str) -> go.Figure:
    fig = go.Figure()
    fig.update_layout(
        template=TEMPLATE,
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
    """(name, rows) per colour value, in sorted order so a value keeps its colour across charts."""
    if color is None or color not in rows:
        yield "all runs", rows
        return
    keys = rows[color].astype(str).replace({"": _NO_GROUP, "nan": _NO_GROUP})
    for key in sorted(keys.unique()):
        yield key, rows[keys == key]


def _run_identity(rows: pd.DataFrame) -> np.ndarray:
    """(run id, label) per row, for the hover."""
    blank = pd.Series("", index=rows.index)
    run_id = rows.get("run_id", blank).astype(str)
    label = rows.get("label", blank).fillna("").astype(str)
    return np.column_stack([run_id.to_numpy(dtype=object), label.to_numpy(dtype=object)])
