"""The quality guard's figure (measure/quality.py): where each answer first left its drift baseline's, a histogram
of the requests by that position. A run checked against no baseline has none."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from ..measure.quality import DRIFT_DIVERGENCE, DRIFT_IDENTICAL
from .figures import count_axis, titled_figure

DIVERGENCE_TITLE = "Where each answer first differs from the baseline's"
DIVERGENCE_AXIS = "First differing token (position in the answer)"
REQUESTS_AXIS = "Requests"
IDENTICAL = "identical to the baseline's"
DIFFERENT = "differs from the baseline's"
_MAX_BINS = 40


def divergence_histogram(requests: pd.DataFrame) -> go.Figure | None:
    """The requests by the position of their answer's first token that differs from the baseline's, those that
    differ apart from those identical to it (whose "divergence" is their length); None without drift columns."""
    if DRIFT_DIVERGENCE not in requests or not requests[DRIFT_DIVERGENCE].notna().any():
        return None
    judged = requests[requests[DRIFT_DIVERGENCE].notna()]
    identical = judged[DRIFT_IDENTICAL] == 1.0
    positions = judged[DRIFT_DIVERGENCE].to_numpy(dtype=np.float64)
    largest = float(positions.max())
    size = max(1.0, math.ceil((largest + 1) / _MAX_BINS))
    fig = titled_figure(DIVERGENCE_TITLE, DIVERGENCE_AXIS, REQUESTS_AXIS)
    for name, chosen in ((DIFFERENT, ~identical), (IDENTICAL, identical)):
        if chosen.any():
            fig.add_trace(
                go.Histogram(
                    x=positions[chosen.to_numpy()].tolist(),
                    xbins=dict(start=0, end=largest + size, size=size),
                    name=name,
                    hovertemplate="tokens %{x}: %{y} requests<extra></extra>",
                )
            )
    fig.update_layout(barmode="stack", legend=dict(orientation="h", y=-0.25))
    count_axis(fig, float(np.histogram(positions, bins=np.arange(0, largest + 2 * size, size))[0].max()))
    return fig
