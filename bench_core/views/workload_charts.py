"""Figures of the workload a run sends (before it starts) or sent (after it ended): the token-length plot AIPerf's
and vLLM's users look at first, and what shows how much of it a cache can reuse.

Each takes a workload table, one row per request (load.workload.workload_table before the run, or the run's own
request table after it, which holds the same columns): `input_len`, `req_output_len`, and where the dataset
gives them `turn` and `session` (multi-turn), `shared_prefix_tokens` (tokens of a prompt that open an earlier
prompt too: a shared prefix, the conversation so far, a trace's repeated blocks) and `send_at_s` (a trace's
times). Pure plotly, no I/O.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from ..states import RequestStatus
from .figures import count_axis, legend_below, no_data, titled_figure

LENGTH_BINS = 40
PREFIX_SHARE_BIN = 0.05


def length_histograms(table: pd.DataFrame) -> go.Figure:
    """Input and output lengths, overlaid histograms in tokens, with their means in the legend."""
    fig = titled_figure("Token lengths", "Tokens", "Requests")
    if table.empty:
        return no_data(fig)
    largest = 0
    for column, name in (("input_len", "Input"), ("req_output_len", "Output asked")):
        values = table[column].to_numpy(dtype=np.float64)
        edges = _whole_token_bins(values)
        largest = max(largest, int(np.histogram(values, edges)[0].max()))
        fig.add_trace(
            go.Histogram(
                x=values,
                name=f"{name} (mean {values.mean():,.0f})",
                opacity=0.65,
                xbins=dict(start=edges[0], end=edges[-1], size=edges[1] - edges[0]),
                hovertemplate="%{x} tokens: %{y} requests<extra></extra>",
            )
        )
    fig.update_layout(barmode="overlay")
    legend_below(fig)
    count_axis(fig, largest)
    return fig


def _whole_token_bins(lengths: np.ndarray) -> np.ndarray:
    """Edges of at most LENGTH_BINS bins of a whole number of tokens each, halfway between lengths: the bins are
    drawn here rather than by plotly, so the count axis knows its tallest bar."""
    low, high = float(np.min(lengths)), float(np.max(lengths))
    size = max(1, math.ceil((high - low + 1) / LENGTH_BINS))
    return low - 0.5 + size * np.arange(math.ceil((high - low + 1) / size) + 1)


def reuse_figure(table: pd.DataFrame) -> go.Figure | None:
    """What a cache could reuse: for multi-turn sessions the prompt length turn by turn (the part repeated from
    earlier turns shaded); otherwise the share of each prompt that opens an earlier prompt too. None when the
    workload says nothing about it (ShareGPT, random, custom prompts)."""
    if "turn" in table:
        return _turns(table)
    if "shared_prefix_tokens" in table:
        return _prefix_share(table)
    return None


def send_times_figure(table: pd.DataFrame) -> go.Figure | None:
    """When a trace's requests go: requests per second of the trace's own clock. None without trace times."""
    if "send_at_s" not in table:
        return None
    times = table["send_at_s"].to_numpy(dtype=np.float64)
    fig = titled_figure("Trace schedule (before any speed-up)", "Time in the trace (s)", "Requests sent per second")
    span = float(np.nanmax(times)) if times.size else 0.0
    edges = np.arange(0.0, max(span, 0.0) + 1.0, 1.0)
    counts, _ = np.histogram(times, bins=edges if edges.size > 1 else 1)
    fig.add_trace(
        go.Bar(
            x=edges[:-1] + 0.5 if edges.size > 1 else [0.5],
            y=counts,
            width=1.0,
            name="requests",
            hovertemplate="%{x:.1f} s: %{y} requests<extra></extra>",
        )
    )
    count_axis(fig, float(counts.max(initial=0)))
    return fig


def workload_figures(table: pd.DataFrame) -> list[go.Figure]:
    """The figures of a workload (sampled before a run, or sent by one): lengths, and where they apply the prefix
    reuse and the send times."""
    figures = [length_histograms(table), reuse_figure(table), send_times_figure(table)]
    return [figure for figure in figures if figure is not None]


def ttft_by_turn(table: pd.DataFrame) -> go.Figure | None:
    """A multi-turn run's TTFT against the turn number (the chart that shows prefix reuse): each completed
    request's TTFT in ms as a box per turn, its mean marked. None without turns or TTFTs (a run not streamed)."""
    if "turn" not in table or "ttft_s" not in table:
        return None
    done = table[(table["status"] == RequestStatus.SUCCESS) if "status" in table else slice(None)]
    done = done[done["ttft_s"].notna()]
    if done.empty:
        return None
    fig = titled_figure("TTFT by turn", "Turn", "TTFT (ms)")
    turn, ttft_ms = done["turn"].to_numpy(dtype=np.int64) + 1, done["ttft_s"].to_numpy(dtype=np.float64) * 1000
    fig.add_trace(
        go.Box(x=turn, y=ttft_ms, boxmean=True, name="TTFT", hovertemplate="turn %{x}: %{y:,.1f} ms<extra></extra>")
    )
    fig.update_xaxes(dtick=1)
    return fig


def _turns(table: pd.DataFrame) -> go.Figure:
    turns = table["turn"].to_numpy(dtype=np.float64) + 1
    sessions = table["session"].nunique() if "session" in table else 0
    fig = titled_figure(
        f"Turns: {sessions} sessions, up to {int(np.nanmax(turns))} turns each", "Turn", "Mean input length (tokens)"
    )
    means = table.assign(turn_number=turns).groupby("turn_number")
    repeated = means["shared_prefix_tokens"].mean() if "shared_prefix_tokens" in table else None
    total = means["input_len"].mean()
    if repeated is not None:
        fig.add_trace(
            go.Bar(
                x=total.index,
                y=repeated.to_numpy(),
                name="repeated from earlier turns",
                hovertemplate="turn %{x}: %{y:,.0f} tokens repeated<extra></extra>",
            )
        )
        fig.add_trace(
            go.Bar(
                x=total.index,
                y=(total - repeated).to_numpy(),
                name="new in this turn",
                hovertemplate="turn %{x}: %{y:,.0f} new tokens<extra></extra>",
            )
        )
        fig.update_layout(barmode="stack")
    else:
        fig.add_trace(go.Bar(x=total.index, y=total.to_numpy(), name="input"))
    fig.update_xaxes(dtick=1)
    legend_below(fig)
    return fig


def _prefix_share(table: pd.DataFrame) -> go.Figure:
    shared = table["shared_prefix_tokens"].to_numpy(dtype=np.float64)
    inputs = table["input_len"].to_numpy(dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(inputs > 0, shared / inputs, np.nan)
    overall = np.nansum(shared) / np.nansum(inputs) if np.nansum(inputs) else np.nan
    fig = titled_figure(
        f"Prefix share: {overall:.0%} of prompt tokens open other prompts too",
        "Share of the prompt shared with other prompts",
        "Requests",
    )
    # Plotly's bins: from 0 on, a prompt shared whole in a bin of its own past 100 %.
    edges = PREFIX_SHARE_BIN * np.arange(round(1 / PREFIX_SHARE_BIN) + 2)
    fig.add_trace(
        go.Histogram(
            x=share,
            xbins=dict(start=0.0, end=1.0001, size=PREFIX_SHARE_BIN),
            name="requests",
            hovertemplate="%{x}: %{y} requests<extra></extra>",
        )
    )
    fig.update_xaxes(range=[0, 1], tickformat=".0%")
    count_axis(fig, float(np.histogram(share[np.isfinite(share)], edges)[0].max(initial=0)))
    return fig
