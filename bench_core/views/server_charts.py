"""The server's own metrics over a run (server_metrics.py's unified series), on the client charts' time axis.

One panel per kind of quantity the server served, sharing seconds since the start with the throughput chart:
its KV-cache usage and prefix hits, its running and waiting requests, its mean TTFT, queue and end-to-end
times per read interval (beside the client's TTFT of the requests whose first token came in that interval: the
gap is the network and the client), cached prompt tokens per second, the speculative acceptance length.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from ..engines.server_metrics import BY_KEY, unified_series
from ..states import RequestStatus
from .figures import PALETTE, no_data, titled_figure

TITLE = "Server metrics (its /metrics)"
TIME_AXIS = "Time since start (s)"
CLIENT_TTFT = "client_ttft_s"  # the client's TTFT per read interval, drawn with the server's latencies

# (panel title, its quantities, scale from the stored unit)
PANELS = (
    ("KV cache and prefix hits (%)", ("kv_cache_usage", "prefix_hit_rate"), 100.0),
    ("Requests on the server", ("running", "waiting"), 1.0),
    ("Latency, mean per interval (ms)", ("server_ttft_s", CLIENT_TTFT, "server_queue_s", "server_e2e_s"), 1000.0),
    ("Cached prompt tokens (tok/s)", ("cached_tokens_per_s",), 1.0),
    ("Tokens the server counted (tok/s)", ("prompt_tokens_per_s", "generation_tokens_per_s"), 1.0),
    ("Speculative acceptance length (tokens/step)", ("spec_accept_length",), 1.0),
)
LABELS = {**{key: metric.label for key, metric in BY_KEY.items()}, CLIENT_TTFT: "Client TTFT"}


def client_ttft_by_interval(requests: pd.DataFrame, read_times_s: np.ndarray) -> pd.DataFrame:
    """The mean client TTFT of the successful requests whose first token came in each interval between two reads
    (as a server's TTFT histogram observes them), as unified-series rows at the interval's end."""
    ok = requests[(requests["status"] == RequestStatus.SUCCESS) & np.isfinite(requests["ttft_s"].astype(float))]
    reads = np.unique(np.asarray(read_times_s, dtype=np.float64))
    if ok.empty or reads.size < 2:
        return pd.DataFrame({"time_s": [], "metric": [], "value": []})
    first_token_s = ok["start_s"].to_numpy(dtype=float) + ok["ttft_s"].to_numpy(dtype=float)
    interval = np.searchsorted(reads, first_token_s, side="left")  # i: in (reads[i-1], reads[i]]
    inside = (interval > 0) & (interval < reads.size)
    means = pd.Series(ok["ttft_s"].to_numpy(dtype=float)[inside]).groupby(interval[inside]).mean()
    return pd.DataFrame({"time_s": reads[means.index.to_numpy()], "metric": CLIENT_TTFT, "value": means.to_numpy()})


def server_metrics_over_time(
    series: pd.DataFrame | None, client_ttft: pd.DataFrame | None = None, end_s: float | None = None
) -> go.Figure:
    """The unified series against seconds since the start, a panel for each kind the server served; `client_ttft`
    (`client_ttft_by_interval`) joins the latency panel; `end_s` ends the time axis where the client charts' ends."""
    from plotly.subplots import make_subplots

    if series is not None and client_ttft is not None and not client_ttft.empty:
        series = pd.concat([series, client_ttft], ignore_index=True)
    served = set() if series is None else set(series["metric"])
    present = [panel for panel in PANELS if served.intersection(panel[1]) - {CLIENT_TTFT}]
    if not present:
        return no_data(titled_figure(TITLE, TIME_AXIS, ""))
    fig = make_subplots(
        rows=len(present),
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.07,
        subplot_titles=[title for title, _, _ in present],
    )
    assert series is not None  # else nothing is present
    for row, (title, keys, scale) in enumerate(present, start=1):
        for key in keys:
            part = series[series["metric"] == key].sort_values("time_s")
            if part.empty:
                continue
            dash = "dot" if key == CLIENT_TTFT else None
            values = part["value"].to_numpy(dtype=float) * scale
            fig.add_trace(
                go.Scatter(
                    x=part["time_s"].to_numpy(dtype=float),
                    y=values,
                    mode="lines+markers",
                    marker=dict(size=4),
                    line=dict(dash=dash),
                    name=LABELS[key],
                    legendgroup=str(row),
                    hovertemplate=f"{LABELS[key]}: %{{y:.3g}}<extra>{title}</extra>",
                ),
                row=row,
                col=1,
            )
        fig.update_yaxes(rangemode="tozero", row=row, col=1)
    if end_s is not None:
        fig.update_xaxes(range=[0, end_s])
    fig.update_xaxes(title_text=TIME_AXIS, row=len(present), col=1)
    fig.update_layout(
        title=dict(text=TITLE),
        height=190 * len(present) + 110,
        margin=dict(l=60, r=30, t=70, b=50),
        hovermode="x unified",
        colorway=PALETTE,
    )
    return fig


def ended_server_metrics(raw: pd.DataFrame, requests: pd.DataFrame | None, end_s: float | None) -> go.Figure:
    """An ended run's figure from its raw samples, the client's TTFT beside the server's where it streamed."""
    series = unified_series(raw)
    streamed = requests is not None and requests["ttft_s"].notna().any()
    client = client_ttft_by_interval(requests, series["time_s"].to_numpy()) if streamed else None
    return server_metrics_over_time(series, client, end_s)
