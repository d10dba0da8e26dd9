"""A tune's chart: its trials' objective against the metric of its tightest bound, the Pareto front joined (what more
of the objective costs in that metric), the bound's limit drawn, and the best trial that kept every bound marked."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from .figures import PALETTE
from .sweep_charts import pareto_chart
from .tables import describe_column

BEST_TRIAL = "Best trial within every bound"


def tune_front_chart(
    trials: pd.DataFrame, bound_metric: str, objective: str, limit: float, best: int | None
) -> go.Figure:
    """`trials` (tune.trial_table's rows: a trial's point, `runs`, the metrics) as the Pareto chart of `objective`
    against `bound_metric`, with the bound's `limit` as a dotted line and the trial numbered `best` (None: no trial
    kept every bound) as a star."""
    fig = pareto_chart(trials.rename(columns={"runs": "n"}), bound_metric, objective)
    bound = describe_column(bound_metric)
    fig.add_vline(
        x=limit,
        line=dict(dash="dot", color="crimson"),
        annotation_text=f"bound: {bound.label} {limit:g} {bound.unit}".rstrip(),
        annotation_position="top",
    )
    chosen = trials[trials["trial"] == best] if best is not None else trials.iloc[0:0]
    if not chosen.empty:
        fig.add_trace(
            go.Scatter(
                x=chosen[bound_metric],
                y=chosen[objective],
                mode="markers",
                name=BEST_TRIAL,
                marker=dict(symbol="star", size=18, color=PALETTE[2], line=dict(width=1, color="black")),
                hovertemplate=f"trial %{{customdata}}<extra>{BEST_TRIAL}</extra>",
                customdata=chosen["trial"],
            )
        )
    return fig
