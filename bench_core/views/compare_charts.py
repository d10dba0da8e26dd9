"""Figures that compare runs of the history: a metric against a knob, latency against throughput (each run a
point labelled with the settings that differ), and a latency's cumulative distribution per run overlaid.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from ..measure.catalog import METRICS
from .figures import (MAX_POINTS, colour_groups, cycled_palette, inward_label_positions, is_categorical, no_data,
                      pad_axis, rows_with, run_identity, setting_labels, tick_label, titled_figure)
from .run_charts import successful_values
from .tables import describe_column

_MAX_TICKS = 12
# What the comparison charts show first: throughput, and LMDeploy's CSVs carry means only, so a mean latency puts
# imported runs on the chart too, yet the P99 TTFT is what a user waits for where runs have it.
DEFAULT_METRIC = "output_throughput"
DEFAULT_LATENCY = "p99_ttft_ms"


def chartable_metrics(runs: pd.DataFrame) -> list[str]:
    """The columns of history rows `runs` with a better direction and a value for at least one run."""
    return [name for name in runs.columns if describe_column(name).larger_is_better is not None
            and (runs[name].notna() & (runs[name].astype(str) != "")).any()]


def default_of(options: list[str], preferred: str) -> str:
    """`preferred` where it is among `options`, else the first."""
    return preferred if preferred in options else options[0]


def metric_vs_knob(runs: pd.DataFrame, knob: str, metric: str, color: str | None = "backend") -> go.Figure:
    """History rows: `metric` against `knob`, one line per value of `color` (a run name column colours each
    run apart), sorted by the knob."""
    knob_spec, metric_spec = describe_column(knob), describe_column(metric)
    fig = titled_figure(f"{metric_spec.label} vs {knob_spec.label.lower()}", knob_spec.title, metric_spec.title)
    rows = rows_with(runs, [knob, metric])
    if rows.empty:
        return no_data(fig)
    for colour, (group, part) in zip(cycled_palette(), colour_groups(rows, color)):
        part = part.sort_values(knob, kind="stable")
        fig.add_trace(go.Scatter(
            x=part[knob], y=part[metric], mode="lines+markers", name=group, cliponaxis=False,
            marker=dict(size=10, color=colour), line=dict(color=colour), customdata=run_identity(part),
            hovertemplate=(f"{knob_spec.label}: %{{x}}<br>{metric_spec.label}: %{{y:.4g}} {metric_spec.unit}"
                           "<br>run %{customdata[0]} %{customdata[1]}<extra>%{fullData.name}</extra>"),
        ))
    _legend(fig, color)
    if is_categorical(rows, knob):  # quant_policy 0/4/8/42 are codes, not a scale; text knobs are names
        fig.update_xaxes(type="category", categoryorder="category ascending")
    else:
        pad_axis(fig, "x", rows[knob])
        values = np.unique(rows[knob].to_numpy(dtype=np.float64))
        if values.size <= _MAX_TICKS:  # a tick at each value run, none at concurrency 2.5
            fig.update_xaxes(tickmode="array", tickvals=values, ticktext=[tick_label(v) for v in values])
    pad_axis(fig, "y", rows[metric])
    return fig


def latency_vs_throughput(runs: pd.DataFrame, latency: str = "p99_ttft_ms", throughput: str = "output_throughput",
                          color: str | None = "backend") -> go.Figure:
    """History rows: one point per run, throughput across and latency up (better is right and low); each
    point is labelled with its values of the settings that differ between the runs."""
    latency_spec, throughput_spec = describe_column(latency), describe_column(throughput)
    fig = titled_figure(f"{latency_spec.label} vs {throughput_spec.label.lower()}", throughput_spec.title,
                        latency_spec.title)
    rows = rows_with(runs, [latency, throughput])
    if rows.empty:
        return no_data(fig)
    labels = pd.Series(setting_labels(rows), index=rows.index)
    for colour, (group, part) in zip(cycled_palette(), colour_groups(rows, color)):
        fig.add_trace(go.Scatter(
            x=part[throughput], y=part[latency], mode="markers+text", name=group, cliponaxis=False,
            marker=dict(size=10, color=colour), text=labels[part.index],
            textposition=inward_label_positions(part[throughput], rows[throughput]), customdata=run_identity(part),
            hovertemplate=(f"{throughput_spec.label}: %{{x:.4g}} {throughput_spec.unit}"
                           f"<br>{latency_spec.label}: %{{y:.4g}} {latency_spec.unit}"
                           "<br>%{text}<br>run %{customdata[0]} %{customdata[1]}<extra>%{fullData.name}</extra>"),
        ))
    _legend(fig, color)
    pad_axis(fig, "x", rows[throughput])
    pad_axis(fig, "y", rows[latency])
    return fig


def cdf_overlay(request_tables: Mapping[str, pd.DataFrame], metric: str) -> go.Figure:
    """Cumulative distribution of a latency metric per run, successful requests only (as LMDeploy counts)."""
    spec = METRICS[metric]
    fig = titled_figure(f"{spec.label}: cumulative distribution", f"{spec.label} ({spec.shown_unit})",
                  "Fraction of requests" if metric != "itl" else "Fraction of gaps")
    fig.update_yaxes(range=[0, 1.02])
    colours = dict(zip(sorted(request_tables), cycled_palette()))  # each run in its colour on the compare charts
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
        return no_data(fig)
    return fig


def _cdf_points(n: int) -> np.ndarray:
    """Indices of at most MAX_POINTS evenly spread points of a sorted series, the last always kept."""
    if n <= MAX_POINTS:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, MAX_POINTS).round().astype(np.int64))


def _legend(fig: go.Figure, color: str | None) -> None:
    """Above the plot, in a row: the plot keeps the full width for its points and their labels."""
    title = describe_column(color).label if color else ""
    fig.update_layout(showlegend=color is not None,
                      legend=dict(orientation="h", yanchor="bottom", y=1.0, x=0, title=dict(text=title, side="left")))
