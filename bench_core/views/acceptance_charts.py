"""Speculative decoding's acceptance per draft position, from the engine's own count (the embedded engine's prompt
lookup) or the server's per-position counters (server_metrics.acceptance_by_position): a bar per position 1..k, and
the line the CLI prints. A run that reported speculation but no per-position counts (SGLang) says "not reported",
never 0."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import plotly.graph_objects as go

from ..measure.catalog import NOT_REPORTED, acceptance_by_position, position_metric, sampled_values
from .figures import no_data, titled_figure

POSITION_AXIS = "Draft position"
RATE_AXIS = "Accepted / drafts (%)"
# The figures that say a run decoded speculatively, with or without per-position counts: the server's and the engine's.
_SERVED_SPECULATION = ("mean_spec_accept_length", "server_spec_acceptance_rate")
_ENGINE_SPECULATION = ("spec_acceptance_length", "spec_acceptance_rate")


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


def describe_acceptance_by_position(summary: Mapping[str, Any]) -> str | None:
    """ "Acceptance by draft position (server): 1: 0.75, 2: 0.5, 3: 0.25", "not reported" where the run reported
    speculation without positions; None where it reported no speculation at all."""
    rates = acceptance_by_position(summary)
    served = any(metric.key in _SERVED_SPECULATION for metric, _ in sampled_values(summary, "served"))
    if rates is None and not served and not any(_is_number(summary.get(key)) for key in _ENGINE_SPECULATION):
        return None
    said = NOT_REPORTED if rates is None else ", ".join(f"{i}: {rate:.3g}" for i, rate in enumerate(rates, start=1))
    return f"{position_metric(summary).label}: {said}"


def _is_number(value: Any) -> bool:
    """A figure a summary or history row holds: NaN and an empty cell are none."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)
