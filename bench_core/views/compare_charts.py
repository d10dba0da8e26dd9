"""Figures that compare runs of the history: a metric against a knob, latency against throughput (each run a
point labelled with the settings that tell it apart), and a latency's cumulative distribution per run overlaid.

A run the chart has no point for is named in a note under the title with the reason (a latency measured on
streamed output only, from a run that was not streamed), and a CDF stretched by far outliers is cut as the run's
histograms are, saying so. The legend stands under the plot, one run a line, clear of the title and its notes
however many runs it lists.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from ..measure.catalog import METRICS, find_column, lower_first
from .figures import (
    AXIS_TITLE_PX,
    FIGURE_PX,
    MAX_POINTS,
    colour_groups,
    cycled_palette,
    inward_label_positions,
    is_categorical,
    legend_below,
    no_data,
    notes_under_title,
    pad_axis,
    rows_with,
    run_identity,
    setting_labels,
    ticks_at_values,
    titled_figure,
)
from .run_charts import overflow_note, range_of, successful_values
from .run_diff import setting_cells
from .tables import describe_column, run_names

RUN = "run"  # the column naming each compared run (run_diff.compared_names); colouring by it tells every run apart
_STREAM_OUTPUT = "stream_output"
# What the comparison charts show first: throughput, and LMDeploy's CSVs carry means only, so a mean latency puts
# imported runs on the chart too, yet the P99 TTFT is what a user waits for where runs have it.
DEFAULT_METRIC = "output_throughput"
DEFAULT_LATENCY = "p99_ttft_ms"


def chartable_metrics(runs: pd.DataFrame) -> list[str]:
    """The columns of history rows `runs` with a better direction and a value for at least one run."""
    return [
        name
        for name in runs.columns
        if describe_column(name).larger_is_better is not None
        and (runs[name].notna() & (runs[name].astype(str) != "")).any()
    ]


def default_of(options: list[str], preferred: str) -> str:
    """`preferred` where it is among `options`, else the first."""
    return preferred if preferred in options else options[0]


def metric_vs_knob(runs: pd.DataFrame, knob: str, metric: str, color: str | None = "backend") -> go.Figure:
    """History rows: `metric` against `knob`, one line per value of `color` (a run name column colours each
    run apart), sorted by the knob."""
    knob_spec, metric_spec = describe_column(knob), describe_column(metric)
    fig = titled_figure(f"{metric_spec.label} vs {knob_spec.label.lower()}", knob_spec.title, metric_spec.title)
    rows = rows_with(runs, [knob, metric])
    notes_under_title(fig, left_out_notes(runs, rows, [knob, metric]))
    if rows.empty:
        return no_data(fig)
    for colour, (group, part) in zip(cycled_palette(), colour_groups(rows, color)):
        part = part.sort_values(knob, kind="stable")
        fig.add_trace(
            go.Scatter(
                x=part[knob],
                y=part[metric],
                mode="lines+markers",
                name=group,
                cliponaxis=False,
                marker=dict(size=10, color=colour),
                line=dict(color=colour),
                customdata=run_identity(part),
                hovertemplate=(
                    f"{knob_spec.label}: %{{x}}<br>{metric_spec.label}: %{{y:.4g}} {metric_spec.unit}"
                    "<br>run %{customdata[0]} %{customdata[1]}<extra>%{fullData.name}</extra>"
                ),
            )
        )
    _legend(fig, color)
    if is_categorical(rows, knob):  # quant_policy 0/4/8/42 are codes, not a scale; text knobs are names
        fig.update_xaxes(type="category", categoryorder="category ascending")
    else:
        pad_axis(fig, "x", rows[knob])
        ticks_at_values(fig, rows[knob])
    pad_axis(fig, "y", rows[metric])
    return fig


def latency_vs_throughput(
    runs: pd.DataFrame,
    latency: str = "p99_ttft_ms",
    throughput: str = "output_throughput",
    color: str | None = "backend",
) -> go.Figure:
    """History rows: one point per run, throughput across and latency up (better is right and low); each
    point is labelled with its values of the settings that differ between the runs."""
    latency_spec, throughput_spec = describe_column(latency), describe_column(throughput)
    fig = titled_figure(
        f"{latency_spec.label} vs {throughput_spec.label.lower()}", throughput_spec.title, latency_spec.title
    )
    rows = rows_with(runs, [latency, throughput])
    notes_under_title(fig, left_out_notes(runs, rows, [latency, throughput]))
    if rows.empty:
        return no_data(fig)
    labels = pd.Series(setting_labels(rows), index=rows.index)
    for colour, (group, part) in zip(cycled_palette(), colour_groups(rows, color)):
        fig.add_trace(
            go.Scatter(
                x=part[throughput],
                y=part[latency],
                mode="markers+text",
                name=group,
                cliponaxis=False,
                marker=dict(size=10, color=colour),
                text=labels[part.index],
                textposition=inward_label_positions(part[throughput], rows[throughput]),
                customdata=run_identity(part),
                hovertemplate=(
                    f"{throughput_spec.label}: %{{x:.4g}} {throughput_spec.unit}"
                    f"<br>{latency_spec.label}: %{{y:.4g}} {latency_spec.unit}"
                    "<br>%{text}<br>run %{customdata[0]} %{customdata[1]}<extra>%{fullData.name}</extra>"
                ),
            )
        )
    _legend(fig, color)
    pad_axis(fig, "x", rows[throughput])
    pad_axis(fig, "y", rows[latency])
    return fig


def cdf_overlay(
    request_tables: Mapping[str, pd.DataFrame], metric: str, not_streamed: Collection[str] = ()
) -> go.Figure:
    """Cumulative distribution of a latency metric per run, successful requests only (as LMDeploy counts). Far
    outliers among all the runs' values end the axis where the run's histograms cut them (`run_charts.range_of`),
    and a note says how many lie beyond and how far. The runs `not_streamed` have no curve of a metric that needs
    streamed output; they and any run without a value are named in a note."""
    spec = METRICS[metric]
    fig = titled_figure(
        f"{spec.label}: cumulative distribution",
        f"{spec.label} ({spec.shown_unit})",
        "Fraction of requests" if metric != "itl" else "Fraction of gaps",
    )
    fig.update_yaxes(range=[0, 1.02])
    colours = dict(zip(sorted(request_tables), cycled_palette()))  # each run in its colour on the compare charts
    drawn, absent = [], []
    for name, table in request_tables.items():
        # Without streaming the tokens arrive at once: as in LMDeploy's results, such a run has no TTFT or ITL.
        unstreamed = spec.needs_streaming and name in not_streamed
        values = np.array([]) if unstreamed else np.sort(successful_values(table, metric)) * spec.display_scale
        if values.size == 0:
            absent.append((name, lower_first(spec.label), unstreamed))
            continue
        drawn.append(values)
        keep = _cdf_points(values.size)
        # The curve rises from 0 at the smallest value, then steps up to 1 at the largest.
        x = np.concatenate([values[:1], values[keep]])
        y = np.concatenate([[0.0], (keep + 1) / values.size])
        fig.add_trace(
            go.Scatter(
                x=x,
                y=y,
                mode="lines",
                name=name,
                line=dict(shape="hv", color=colours[name]),
                hovertemplate=f"%{{x:.3f}} {spec.display_unit}<br>%{{y:.1%}} at or below<extra>%{{fullData.name}}</extra>",
            )
        )
    notes = _absence_notes(absent)
    if not fig.data:
        notes_under_title(fig, notes)
        return no_data(fig)
    _legend(fig, RUN)
    every = np.concatenate(drawn)
    shape = range_of(every)
    if shape.overflow:
        pad_axis(fig, "x", pd.Series([shape.low, shape.high]))
        above = int((every > shape.high).sum())
        counted = "gaps" if metric == "itl" else "requests"
        notes.insert(0, f"Axis cut: {overflow_note(shape, above, spec.shown_unit, counted)}")
    notes_under_title(fig, notes)
    return fig


def not_streamed(runs: pd.DataFrame) -> list[str]:
    """The names (`_names`) of the runs that were not streamed: they have no TTFT or ITL."""
    names = _names(runs)
    streamed = setting_cells(runs, [_STREAM_OUTPUT])[_STREAM_OUTPUT]
    return [name for name, stream in zip(names, streamed) if stream is False]


def left_out_notes(runs: pd.DataFrame, rows: pd.DataFrame, columns: list[str]) -> list[str]:
    """Which of `runs` have no point among `rows` (those with a value in each of `columns`), and why: a latency
    that needs streamed output (TTFT, ITL) is not measured on a run that was not streamed; anything else that
    run did not record. Runs are named as `_names` names them; rows without a run id go unnamed."""
    left_out = runs.drop(index=rows.index)
    if left_out.empty or (RUN not in left_out and "run_id" not in left_out):
        return []
    names = _names(left_out)
    unstreamed = set(not_streamed(left_out))
    kept = {column: rows_with(left_out, [column]).index for column in columns}
    absent = []
    for name, index in zip(names, left_out.index):
        missing = [column for column in columns if index not in kept[column]] or columns
        what = " or ".join(lower_first(describe_column(column).label) for column in missing)
        absent.append((name, what, name in unstreamed and all(map(_needs_streaming, missing))))
    return _absence_notes(absent)


def _names(runs: pd.DataFrame) -> list[str]:
    """The runs' names: their RUN column, else `tables.run_names`."""
    return runs[RUN].astype(str).tolist() if RUN in runs else run_names(runs)


def _absence_notes(absent: list[tuple[str, str, bool]]) -> list[str]:
    """Notes naming the runs without a value, from (run name, what it lacks, whether because it was not streamed)."""
    unstreamed: dict[str, list[str]] = {}
    lacking: dict[str, list[str]] = {}
    for name, what, because_not_streamed in absent:
        (unstreamed if because_not_streamed else lacking).setdefault(what, []).append(name)
    return [f"Not streamed, so no {what}: {', '.join(names)}" for what, names in unstreamed.items()] + [
        f"No {what} recorded: {', '.join(names)}" for what, names in lacking.items()
    ]


def _needs_streaming(column: str) -> bool:
    found = find_column(column)
    return found is not None and found[0].needs_streaming


def _cdf_points(n: int) -> np.ndarray:
    """Indices of at most MAX_POINTS evenly spread points of a sorted series, the last always kept."""
    if n <= MAX_POINTS:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, MAX_POINTS).round().astype(np.int64))


def _legend(fig: go.Figure, color: str | None) -> None:
    """The runs' legend below the plot, titled by what colours them (figures.legend_below); none without runs."""
    if color is not None and fig.data:
        legend_below(fig, describe_column(color).label)
    else:
        fig.update_layout(showlegend=False, height=FIGURE_PX, margin=dict(b=AXIS_TITLE_PX))
