"""The per-request timeline of an ended run (vLLM's `--plot-timeline`, AIPerf's): each request a horizontal bar
from its start to its first token (waiting) and on to its end (decoding), one row per request in the order the
requests started, coloured by how the request ended. A batch that queues behind the engine's slots reads as a
staircase of long waiting bars; a head-of-line stall as a column of bars that all wait until the same moment.

A request's start is its `start_s` in the per-request table: the tick its latency clock starts at, the moment it
was sent (LMDeploy's batch sends every request at t0) or admitted where the load pattern starts the clock there.
So the waiting bar is exactly the request's TTFT, and the whole bar its time in flight.

The figure holds one `go.Bar` per (outcome, segment), with every request of that kind in its arrays (`base` and
`x`), whatever the run's size; past `MAX_TIMELINE_REQUESTS` rows, which are below a pixel each on any screen,
an evenly spaced subset in start order is drawn and the figure says so.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from ..states import RequestStatus
from .figures import legend_below, no_data, titled_figure
from .tables import count_of

MAX_TIMELINE_REQUESTS = 2000
TITLE = "Request timeline"

# How each request status reads on the timeline, in legend order, and its colour.
OUTCOMES: dict[RequestStatus, tuple[str, str]] = {
    RequestStatus.SUCCESS: ("completed", "#2ca02c"),
    RequestStatus.INCOMPLETE: ("truncated", "#ff7f0e"),  # served, with fewer tokens than asked
    RequestStatus.OVERRUN: ("overran", "#9467bd"),  # served, past its token limit
    RequestStatus.FAILED: ("failed", "#d62728"),
    RequestStatus.CANCELLED: ("cancelled", "#7f7f7f"),
    RequestStatus.UNFINISHED: ("unfinished", "#8c564b"),  # still running when the run ended: drawn to its end
}
WAITING, DECODING = "waiting for first token", "decoding"
_WAITING_OPACITY = 0.45  # the same colour, lighter: the eye follows one request's two segments as one bar


def request_timeline(table: pd.DataFrame, end_s: float | None = None) -> go.Figure:
    """The timeline of a per-request table (`Profiler.request_table`, a run's requests.parquet); `end_s` (seconds
    since the start) is where the bars of requests that never finished stop: the run's end."""
    fig = titled_figure(TITLE, "Time since start (s)", "Request (in start order)")
    start = table["start_s"].to_numpy(dtype=np.float64) if len(table) else np.array([])
    sent = np.isfinite(start)
    if not sent.any():
        return no_data(fig)
    rows = table[sent]
    order = np.lexsort((rows["index"].to_numpy(), start[sent]))  # ties (a batch at t0): in request order
    notes = []
    if sent.size - sent.sum():
        notes.append(f"{count_of(int(sent.size - sent.sum()), 'requests')} never sent, not drawn")
    if order.size > MAX_TIMELINE_REQUESTS:
        step = math.ceil(order.size / MAX_TIMELINE_REQUESTS)
        notes.append(f"Every {_ordinal(step)} request in start order: {order[::step].size:,} of {order.size:,} drawn")
        order = order[::step]
    rows = rows.iloc[order]
    bars = _Bars(rows, end_s)
    position = np.arange(len(rows))
    for status, (outcome, colour) in OUTCOMES.items():
        chosen = bars.status == status
        if not chosen.any():
            continue
        for segment, left, right, opacity in (
            (WAITING, bars.start, bars.first_token, _WAITING_OPACITY),
            (DECODING, bars.first_token, bars.end, 1.0),
        ):
            fig.add_trace(
                go.Bar(
                    orientation="h",
                    y=position[chosen],
                    base=left[chosen],
                    x=(right - left)[chosen],
                    name=f"{outcome}: {segment}",
                    legendgroup=outcome,
                    marker=dict(color=colour, line=dict(width=0)),
                    opacity=opacity,
                    customdata=bars.hover[chosen],
                    hovertemplate=(
                        f"request %{{customdata[0]}}, {outcome}, {segment}"
                        "<br>start %{customdata[5]:.3f} s · first token %{customdata[6]:.3f} s"
                        " · end %{customdata[7]:.3f} s<br>TTFT %{customdata[1]} · E2E %{customdata[2]}"
                        "<br>%{customdata[3]} input · %{customdata[4]} output tokens<extra></extra>"
                    ),
                )
            )
    fig.update_yaxes(autorange="reversed", showticklabels=False, showgrid=False)  # the first request at the top
    fig.update_xaxes(rangemode="tozero")
    fig.update_layout(
        barmode="overlay",
        bargap=0.1 if len(rows) < 50 else 0,
    )
    if notes:
        fig.update_layout(title=dict(subtitle=dict(text="<br>".join(notes))))
    legend_below(fig)
    return fig


class _Bars:
    """Each drawn request's segment boundaries (s since the start), status and hover values."""

    def __init__(self, rows: pd.DataFrame, end_s: float | None):
        self.status = rows["status"].to_numpy(dtype=object)
        self.start = rows["start_s"].to_numpy(dtype=np.float64)
        ttft = rows["ttft_s"].to_numpy(dtype=np.float64)
        finish = rows["finish_s"].to_numpy(dtype=np.float64)
        latest = np.nanmax(np.append(finish, self.start + np.nan_to_num(ttft)))
        run_end = latest if end_s is None or not math.isfinite(end_s) else max(end_s, latest)
        self.end = np.where(np.isfinite(finish), finish, run_end)
        # No first token (failed or cancelled while waiting): the whole bar is waiting.
        self.first_token = np.where(np.isfinite(ttft), np.minimum(self.start + ttft, self.end), self.end)
        e2e = rows["e2e_s"].to_numpy(dtype=np.float64)
        self.hover = np.column_stack(
            [
                rows["index"].to_numpy(dtype=object),
                _ms(ttft),
                _ms(e2e),
                rows["input_len"].to_numpy(dtype=object),
                rows["output_len"].to_numpy(dtype=object),
                self.start,
                self.first_token,
                self.end,
            ]
        )


def _ms(seconds: np.ndarray) -> np.ndarray:
    """Latencies as hover text: "123.4 ms", or "-" where undefined (a request without a first token)."""
    return np.array([f"{value * 1000:,.1f} ms" if math.isfinite(value) else "-" for value in seconds], dtype=object)


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
