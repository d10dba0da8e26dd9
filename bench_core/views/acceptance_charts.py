"""Speculative decoding's acceptance per draft position, from the engine's own count (the embedded engine's prompt
lookup) or the server's per-position counters (server_metrics.acceptance_by_position): a bar per position 1..k, and
the line the CLI prints; and beside it, AIPerf's per-request view: how many requests had their drafts accepted how
often (the engine's count per request). A run that reported speculation but no per-position counts (SGLang) says
"not reported", never 0."""

from __future__ import annotations

import math
import typing
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from ..measure.catalog import (
    METRICS,
    NOT_REPORTED,
    SERVED_SPECULATIVE_COLUMNS,
    SPECULATIVE_COLUMNS,
    acceptance_by_position,
    position_metric,
    request_acceptance_rates,
    sampled_values,
)
from ..measure.draft_length import DraftAdvice
from ..measure.speculation_speedup import COSTS, JUDGED_BY, PAYS, UNDECIDED, LoadSpeedup, describe_ratio, stops_paying
from .figures import no_data, titled_figure

POSITION_AXIS = "Draft position"
RATE_AXIS = "Accepted / drafts (%)"
REQUEST_RATE_AXIS = "Accepted / drafted tokens (%)"
REQUESTS_AXIS = "Requests"
REQUEST_BIN_PERCENT = 10
SPEEDUP_AXIS = "TPOT with speculation / without"
VERDICT_COLORS = {PAYS: "#2ca02c", UNDECIDED: "#7f7f7f", COSTS: "#d62728"}


def acceptance_by_position_figure(summary: Mapping[str, Any]) -> go.Figure:
    """A bar per draft position 1..k: the share of drafts whose token at that position was accepted."""
    metric = position_metric(summary)
    fig = titled_figure(metric.label, POSITION_AXIS, RATE_AXIS)
    rates = acceptance_by_position(summary)
    if rates is None:
        no_data(fig)
        fig.update_annotations(text=NOT_REPORTED)
        return fig
    positions = list(range(1, len(rates) + 1))
    fig.add_trace(
        go.Bar(
            x=positions,
            y=[rate * 100 for rate in rates],
            text=[f"{rate:.0%}" for rate in rates],
            name=metric.label,
            hovertemplate="position %{x}: %{y:.1f}%<extra></extra>",
        )
    )
    fig.update_xaxes(tickmode="array", tickvals=positions)
    fig.update_yaxes(range=[0, 100])
    return fig


def request_acceptance_histogram(requests: pd.DataFrame) -> go.Figure:
    """How many requests had each share of their drafted tokens accepted, in bins of 10% (the last holds 100%): the
    spread the run's mean acceptance hides. Requests that drafted nothing are left out."""
    metric = METRICS["request_acceptance_rate"]
    fig = titled_figure(metric.label, REQUEST_RATE_AXIS, REQUESTS_AXIS)
    counted = request_acceptance_rates(requests, True)
    rates = np.array([]) if counted is None else counted[np.isfinite(counted)] * 100
    if not rates.size:
        no_data(fig)
        fig.update_annotations(text=NOT_REPORTED)
        return fig
    edges = np.arange(0, 100 + REQUEST_BIN_PERCENT, REQUEST_BIN_PERCENT)
    counts, _ = np.histogram(rates, bins=edges)
    fig.add_trace(
        go.Bar(
            x=(edges[:-1] + REQUEST_BIN_PERCENT / 2).tolist(),
            y=counts.tolist(),
            width=REQUEST_BIN_PERCENT,
            name=metric.label,
            customdata=np.stack([edges[:-1], edges[1:]], axis=1),
            hovertemplate="%{customdata[0]:.0f} to %{customdata[1]:.0f}%: %{y} requests<extra></extra>",
        )
    )
    fig.update_xaxes(range=[0, 100], tickvals=edges)
    return fig


def describe_acceptance_by_position(summary: Mapping[str, Any]) -> str | None:
    """ "Acceptance by draft position (server): 1: 0.75, 2: 0.5, 3: 0.25", "not reported" where the run reported
    speculation without positions; None where it reported no speculation at all."""
    rates = acceptance_by_position(summary)
    served = any(metric.key in SERVED_SPECULATIVE_COLUMNS for metric, _ in sampled_values(summary, "served"))
    if rates is None and not served and not any(_is_number(summary.get(key)) for key in SPECULATIVE_COLUMNS):
        return None
    said = NOT_REPORTED if rates is None else ", ".join(f"{i}: {rate:.3g}" for i, rate in enumerate(rates, start=1))
    return f"{position_metric(summary).label}: {said}"


def _is_number(value: Any) -> bool:
    """A figure a summary or history row holds: NaN and an empty cell are none."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)


POSITION_PREFIX = "position "


def position_table(rows: pd.DataFrame, names: Sequence[str]) -> pd.DataFrame:
    """Each run's acceptance rate at draft positions 1..k (a row per run, named by `names`, a column per position;
    NaN past a run's own k or where it reported none), from history rows; empty where no run has positions."""
    rates = [acceptance_by_position(row) for row in rows.to_dict("records")]
    longest = max((len(found) for found in rates if found), default=0)
    if not longest:
        return pd.DataFrame()
    columns = [f"{POSITION_PREFIX}{i}" for i in range(1, longest + 1)]
    table = [(found or []) + [math.nan] * (longest - len(found or [])) for found in rates]
    return pd.DataFrame(table, index=pd.Index(list(names), name="run"), columns=columns)


def positions_by_run_figure(table: pd.DataFrame) -> go.Figure:
    """position_table's rows side by side: for each draft position, a bar per run."""
    fig = titled_figure("Acceptance by draft position, per run", POSITION_AXIS, RATE_AXIS)
    positions = list(range(1, len(table.columns) + 1))
    for name, rates in table.iterrows():
        fig.add_trace(
            go.Bar(
                x=positions,
                y=[rate * 100 for rate in rates],
                name=str(name),
                hovertemplate=f"{name}<br>position %{{x}}: %{{y:.1f}}%<extra></extra>",
            )
        )
    fig.update_layout(barmode="group")
    fig.update_xaxes(tickmode="array", tickvals=positions)
    fig.update_yaxes(range=[0, 100])
    return fig


def draft_length_figure(advice: DraftAdvice, load: str = "") -> go.Figure:
    """TPOT against the draft length: the model's prediction (0 = plain decoding) as a line, the sweep's
    measurements as points, the advised length marked."""
    title = "TPOT by draft length" + (f", at {load}" if load else "")
    fig = titled_figure(title, "Draft tokens per step", "TPOT (ms)")
    predicted = sorted(advice.predicted_tpot_s.items())
    fig.add_trace(
        go.Scatter(
            x=[k for k, _ in predicted],
            y=[tpot * 1e3 for _, tpot in predicted],
            mode="lines+markers",
            name="predicted",
            line=dict(dash="dot"),
            hovertemplate="%{x} draft tokens: predicted %{y:.1f} ms<extra></extra>",
        )
    )
    measured = sorted(advice.measured_tpot_s.items())
    fig.add_trace(
        go.Scatter(
            x=[k for k, _ in measured],
            y=[tpot * 1e3 for _, tpot in measured],
            mode="markers",
            marker=dict(size=11),
            name="measured (sweep)",
            hovertemplate="%{x} draft tokens: measured %{y:.1f} ms<extra></extra>",
        )
    )
    fig.add_vline(x=advice.advised, line_dash="dash", annotation_text=f"advised: {advice.advised}")
    fig.update_xaxes(tickmode="array", tickvals=[k for k, _ in predicted])
    return fig


SPEEDUP_PAIRS = "run pairs"
SPEEDUP_VERDICT = "speculation"


def speedup_table(speedups: Sequence[LoadSpeedup], load_axis: str) -> pd.DataFrame:
    """A row per load: the run pairs set against each other, each paired metric's ratio with speculation over
    without ("0.72 (0.70 to 0.75)", "-" where the runs lack it) and whether speculation paid there."""
    keys = list(dict.fromkeys(key for speedup in speedups for key in speedup.ratios))
    return pd.DataFrame(
        [
            {
                load_axis: speedup.at if speedup.load else "-",
                SPEEDUP_PAIRS: speedup.pairs,
                **{
                    METRICS[key].label: describe_ratio(speedup.ratios[key])
                    if key in speedup.ratios and math.isfinite(speedup.ratios[key].value)
                    else "-"
                    for key in keys
                },
                SPEEDUP_VERDICT: speedup.verdict or "-",
            }
            for speedup in speedups
        ]
    )


def speedup_by_load_figure(speedups: Sequence[LoadSpeedup], load_axis: str) -> go.Figure:
    """TPOT with speculation over without at each load, with its 95% paired interval, coloured by whether speculation
    paid there; a dashed line at 1 (no gain) and, where it stopped paying, a line at that load."""
    fig = titled_figure("Speculation against none, by load", load_axis, SPEEDUP_AXIS)
    judged = [speedup for speedup in speedups if speedup.judged is not None]
    if not judged:
        return no_data(fig)
    numeric = all(isinstance(speedup.at, (int, float)) and not isinstance(speedup.at, bool) for speedup in judged)
    numbers = [float(typing.cast(float, speedup.at)) for speedup in judged] if numeric else []
    x: list[float] | list[str] = numbers or [speedup.load for speedup in judged]
    ratios = [speedup.ratios[JUDGED_BY] for speedup in judged]
    fig.add_trace(
        go.Scatter(
            x=x,
            y=[ratio.value for ratio in ratios],
            mode="lines+markers",
            name=SPEEDUP_AXIS,
            line=dict(color="#7f7f7f"),
            marker=dict(size=11, color=[VERDICT_COLORS[speedup.verdict or UNDECIDED] for speedup in judged]),
            error_y=dict(
                type="data",
                symmetric=False,
                array=[ratio.high - ratio.value for ratio in ratios],
                arrayminus=[ratio.value - ratio.low for ratio in ratios],
            ),
            customdata=[
                [speedup.verdict, speedup.pairs, describe_ratio(ratio)] for speedup, ratio in zip(judged, ratios)
            ],
            hovertemplate="%{x}: %{customdata[2]}, %{customdata[0]} (%{customdata[1]} run pairs)<extra></extra>",
        )
    )
    fig.add_hline(y=1, line_dash="dash", line_color="gray", annotation_text="no gain", annotation_position="top left")
    wide = bool(numbers) and min(numbers) > 0 and max(numbers) / min(numbers) >= 8
    if wide:
        fig.update_xaxes(type="log")
    stop = stops_paying(judged)
    if stop is not None:
        at = numbers[judged.index(stop)] if numbers else judged.index(stop)
        fig.add_vline(x=at, line_dash="dot", line_color=VERDICT_COLORS[COSTS])
        # An annotation on a log axis is placed at the log of its value (a shape is not).
        fig.add_annotation(
            x=math.log10(at) if wide else at,
            y=1,
            yref="paper",
            text=f"stops paying at {stop.load}",
            showarrow=False,
            xanchor="left",
            yanchor="bottom",
            font=dict(color=VERDICT_COLORS[COSTS]),
        )
    return fig
