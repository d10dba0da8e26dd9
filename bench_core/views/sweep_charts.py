"""Figures of a sweep: a metric against the swept knob inside its confidence band, the Pareto frontier of two
metrics, goodput against the load with the highest load that meets a target, and a two-knob heatmap.

Sweep points come from `stats.group_repeats` (key columns, then n, mean, std, ci_low, ci_high, with a 95%
interval; `busy_runs` and `client_bound_runs` where results.point_statistics counted the runs each flag marks);
runs are history rows. A point or run measured on a busy machine (hardware/contention.py) gets a crimson cross over
it, one whose client could not keep up (hardware/client_bound.py) an orange diamond, each with a legend entry.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.colors
import plotly.graph_objects as go

from ..hardware.client_bound import CLIENT_BOUND_RUNS
from ..hardware.contention import BUSY_RUNS
from ..hardware.run_flags import FLAGGED_RUNS
from ..measure.catalog import lower_first
from ..measure.stats import LOAD_LIMIT_RULE, highest_load_meeting, loads_missing_below, pareto_front
from .figures import (
    PALETTE,
    colour_groups,
    cycled_palette,
    inward_label_positions,
    is_categorical,
    no_data,
    notes_under_title,
    pad_axis,
    rows_with,
    run_identity,
    setting_labels,
    tick_label,
    ticks_at_values,
    titled_figure,
)
from .tables import describe_column

BUSY_LEGEND = "machine busy (other processes held the CPU)"
CLIENT_BOUND_LEGEND = "client bound (the benchmark's client could not keep up)"
# Per flag (run_flags.FLAGGED_RUNS): its legend entry, hover text, marker symbol and colour.
_FLAG_MARKS = {
    BUSY_RUNS: (BUSY_LEGEND, "machine busy: other processes held the CPU", "x-thin-open", "crimson"),
    CLIENT_BOUND_RUNS: (
        CLIENT_BOUND_LEGEND,
        "client bound: the benchmark's client could not keep up",
        "diamond-open",
        "darkorange",
    ),
}


def metric_vs_knob_band(points: pd.DataFrame, knob: str, metric: str, series: str | None = None) -> go.Figure:
    """Mean of `metric` against the swept `knob`, one line per value of `series`, each inside a shaded
    95% confidence band over its repeats (the range of the runs where they are too few for an interval,
    closed on the line where a point ran once; the hover says which)."""
    knob_spec, metric_spec = describe_column(knob), describe_column(metric)
    fig = titled_figure(f"{metric_spec.label} vs {lower_first(knob_spec.label)}", knob_spec.title, metric_spec.title)
    rows = rows_with(points, [knob, "mean"])
    if rows.empty:
        return no_data(fig)
    categorical = is_categorical(rows, knob)
    for colour, (group, part) in zip(cycled_palette(), colour_groups(rows, series)):
        part = part.sort_values(knob, kind="stable")
        x = [tick_label(v) for v in part[knob]] if categorical else part[knob].tolist()
        # Too few runs for an interval: the band spans their range; one run: it closes on the line.
        low = part["ci_low"].fillna(part.get("min", part["mean"])).fillna(part["mean"]).tolist()
        high = part["ci_high"].fillna(part.get("max", part["mean"])).fillna(part["mean"]).tolist()
        spread = [
            "95% CI" if np.isfinite(ci) else ("range of the runs" if n > 1 else "one run")
            for ci, n in zip(part["ci_low"], part["n"])
        ]
        fig.add_trace(
            go.Scatter(
                x=x + x[::-1],
                y=high + low[::-1],
                mode="lines",
                fill="toself",
                fillcolor=_translucent(colour, 0.2),
                line=dict(width=0),
                hoverinfo="skip",
                showlegend=False,
                legendgroup=group,
                name=f"{group} 95% CI",
            )
        )
        fig.add_trace(
            go.Scatter(
                x=x,
                y=part["mean"],
                mode="lines+markers",
                name=group,
                legendgroup=group,
                line=dict(color=colour),
                customdata=np.array(list(zip(part["n"], part["std"], low, high, spread)), dtype=object),
                hovertemplate=(
                    f"{knob_spec.label}: %{{x}}<br>{metric_spec.label}: %{{y:.4g}} {metric_spec.unit}"
                    f"<br>%{{customdata[4]}} %{{customdata[2]:.4g}} to %{{customdata[3]:.4g}} {metric_spec.unit}"
                    "<br>std %{customdata[1]:.3g} over %{customdata[0]} runs"
                    "<extra>%{fullData.name}</extra>"
                ),
            )
        )
    fig.update_layout(showlegend=series is not None, legend_title_text=series or "")
    x = [tick_label(v) for v in rows[knob]] if categorical else rows[knob].tolist()
    _mark_flagged(fig, x, rows["mean"], rows)
    if categorical:
        fig.update_xaxes(type="category")
    else:
        ticks_at_values(fig, rows[knob])
    return fig


def pareto_chart(runs: pd.DataFrame, x: str, y: str) -> go.Figure:
    """One point per row: a run, or a sweep point's means with its run count in `n` (results.point_means); the
    rows no other row beats on both metrics are joined as the Pareto frontier and labelled with their values
    of the settings that differ between them (every point hovers them). Both columns need a better direction
    (describe_column), e.g. output tok/s against P99 TTFT."""
    x_spec, y_spec = describe_column(x), describe_column(y)
    if x_spec.larger_is_better is None or y_spec.larger_is_better is None:
        raise ValueError(f"A Pareto front needs metrics with a better direction; {x} or {y} has none.")
    fig = titled_figure(f"{y_spec.label} vs {lower_first(x_spec.label)}: Pareto frontier", x_spec.title, y_spec.title)
    rows = rows_with(runs, [x, y])
    if rows.empty:
        return no_data(fig)
    on_front = pareto_front(rows[x], rows[y], x_spec.larger_is_better, y_spec.larger_is_better)
    labels = pd.Series(setting_labels(rows), index=rows.index)
    if "point" in rows and labels.duplicated().any():  # a server's setting is no declared one: the point names it
        labels = rows["point"].astype(str)
    means = "n" in rows  # sweep points: each the mean of its runs
    who = "mean of %{customdata[0]} runs" if means else "run %{customdata[0]} %{customdata[1]}"
    hover = (
        f"{x_spec.label}: %{{x:.4g}} {x_spec.unit}<br>{y_spec.label}: %{{y:.4g}} {y_spec.unit}"
        f"<br>%{{text}}<br>{who}<extra>%{{fullData.name}}</extra>"
    )
    identity = (lambda part: part[["n"]].to_numpy()) if means else run_identity
    others, front = rows[~on_front], rows[on_front].sort_values(x, kind="stable")
    dominated = "Dominated points" if means else "Dominated runs"
    fig.add_trace(
        go.Scatter(
            x=others[x],
            y=others[y],
            mode="markers",
            name=dominated,
            cliponaxis=False,
            marker=dict(size=8, color="lightgray"),
            customdata=identity(others),
            text=labels[others.index],
            hovertemplate=hover,
        )
    )
    fig.add_trace(
        go.Scatter(
            x=front[x],
            y=front[y],
            mode="lines+markers+text",
            name="Pareto frontier",
            cliponaxis=False,
            marker=dict(size=10, color=PALETTE[0]),
            line=dict(color=PALETTE[0]),
            text=labels[front.index],
            textposition=inward_label_positions(front[x], rows[x]),
            customdata=identity(front),
            hovertemplate=hover,
        )
    )
    _mark_flagged(fig, rows[x], rows[y], rows)
    pad_axis(fig, "x", rows[x])
    pad_axis(fig, "y", rows[y])
    return fig


def goodput_vs_load(runs: pd.DataFrame, load: str, goodput: str, target: float | None, slo: str) -> go.Figure:
    """Goodput (or SLO attainment) of every run against the load, the mean per load as a line, and under the title
    the SLO a request met to count (`slo`, tables.describe_slo) and the target. Where the user set a target: the
    target as a dashed line, and the highest load that meets it (interpolated) as a marked point, with the rule that
    chose it written on the chart (and the lower loads that miss, where there are any); none is made up."""
    load_spec, goodput_spec = describe_column(load), describe_column(goodput)
    fig = titled_figure(f"{goodput_spec.label} vs {lower_first(load_spec.label)}", load_spec.title, goodput_spec.title)
    wanted = f"target {target:.4g}" if target is not None else "no target set"  # in the y axis's unit
    notes_under_title(fig, [f"Good requests: {slo}; {wanted}"])
    rows = rows_with(runs, [load, goodput])
    if rows.empty:
        return no_data(fig)
    fig.add_trace(
        go.Scatter(
            x=rows[load],
            y=rows[goodput],
            mode="markers",
            name="Runs",
            marker=dict(size=7, opacity=0.5),
            customdata=run_identity(rows),
            hovertemplate=(
                f"{load_spec.label}: %{{x:.4g}} {load_spec.unit}<br>{goodput_spec.label}: %{{y:.4g}} "
                f"{goodput_spec.unit}<br>run %{{customdata[0]}} %{{customdata[1]}}<extra></extra>"
            ),
        )
    )
    means = rows.groupby(load, sort=True)[goodput].mean()
    fig.add_trace(
        go.Scatter(
            x=means.index,
            y=means.to_numpy(),
            mode="lines",
            name="Mean per load",
            hovertemplate=f"%{{x:.4g}} {load_spec.unit}: mean %{{y:.4g}} {goodput_spec.unit}<extra></extra>",
        )
    )
    if target is not None:
        _target_and_limit(fig, rows, load, goodput, target)
    _mark_flagged(fig, rows[load], rows[goodput], rows)
    return fig


def _target_and_limit(fig: go.Figure, rows: pd.DataFrame, load: str, goodput: str, target: float) -> None:
    """The target's line on a goodput chart, and the highest load that meets it, or a note that none does."""
    load_spec, goodput_spec = describe_column(load), describe_column(goodput)
    fig.add_hline(
        y=target,
        line=dict(dash="dash", color="gray"),
        annotation_position="top left",
        annotation_text=f"Target {target:.4g} {goodput_spec.unit}".rstrip(),
    )
    limit = highest_load_meeting(rows[load], rows[goodput], target)
    if limit is None:
        note = "No load meets the target"
    else:
        fig.add_trace(
            go.Scatter(
                x=[limit],
                y=[target],
                mode="markers",
                name="Highest load meeting the target",
                marker=dict(symbol="star", size=16, color="crimson"),
                hovertemplate=f"Highest load meeting the target: %{{x:.4g}} {load_spec.unit}<extra></extra>",
            )
        )
        fig.add_vline(x=limit, line=dict(dash="dot", color="crimson"))
        note = LOAD_LIMIT_RULE
        missing = loads_missing_below(rows[load], rows[goodput], target, limit)
        if missing:
            note += (
                f"<br>Not monotonic: {lower_first(load_spec.label)} {', '.join(map(tick_label, missing))} "
                "below it misses the target"
            )
    # Room for the note's lines between the subtitle (the SLO) and the plot.
    fig.update_layout(margin_t=fig.layout.margin.t + 18 * (note.count("<br>") + 1))
    _note_above(fig, note, font=dict(size=11))


def knob_heatmap(points: pd.DataFrame, knob_x: str, knob_y: str, metric: str) -> go.Figure:
    """Mean of `metric` over a two-knob grid, each cell labelled with its value; colours run the same
    way for every metric: the brightest cell is the best one."""
    x_spec, y_spec, metric_spec = describe_column(knob_x), describe_column(knob_y), describe_column(metric)
    fig = titled_figure(
        f"{metric_spec.label} by {lower_first(x_spec.label)} and {lower_first(y_spec.label)}",
        x_spec.title,
        y_spec.title,
    )
    rows = rows_with(points, [knob_x, knob_y, "mean"])
    if rows.empty:
        return no_data(fig)
    means = rows.pivot_table(index=knob_y, columns=knob_x, values="mean", aggfunc="mean", sort=True)
    counts = rows.pivot_table(index=knob_y, columns=knob_x, values="n", aggfunc="sum", sort=True)
    counts = counts.reindex(index=means.index, columns=means.columns).fillna(0).astype(int)
    fig.add_trace(
        go.Heatmap(
            x=[tick_label(v) for v in means.columns],
            y=[tick_label(v) for v in means.index],
            z=means.to_numpy(),
            customdata=counts.to_numpy(),
            colorscale="Viridis",
            reversescale=metric_spec.larger_is_better is False,
            colorbar=dict(title=dict(text=metric_spec.title)),
            texttemplate="%{z:.3g}",
            hovertemplate=(
                f"{x_spec.label}: %{{x}}<br>{y_spec.label}: %{{y}}<br>{metric_spec.label}: %{{z:.4g}} "
                f"{metric_spec.unit}<br>mean of %{{customdata}} runs<extra></extra>"
            ),
        )
    )
    fig.update_xaxes(type="category")
    fig.update_yaxes(type="category")
    return fig


def _mark_flagged(fig: go.Figure, x, y, rows: pd.DataFrame) -> None:
    """A mark over each point (x, y) that a flag marks (its runs, or one of them; or the run the row is), one trace
    per flag, named in the legend: its numbers are not the engine's alone. `rows` are sweep points with their flags'
    counts, or history rows, judged here."""
    for column, flagged_runs in FLAGGED_RUNS.items():
        marked = np.asarray(rows[column] > 0 if column in rows else flagged_runs(rows), dtype=bool)
        if not marked.any():
            continue
        legend, hover, symbol, colour = _FLAG_MARKS[column]
        fig.add_trace(
            go.Scatter(
                x=np.asarray(list(x), dtype=object)[marked],
                y=np.asarray(list(y), dtype=float)[marked],
                mode="markers",
                name=legend,
                cliponaxis=False,
                marker=dict(symbol=symbol, size=16, line=dict(width=2, color=colour)),
                hovertemplate=f"{hover} during this point's runs<extra></extra>",
            )
        )
        fig.update_layout(showlegend=True)


def _note_above(fig: go.Figure, text: str, font: dict | None = None) -> None:
    """`text` centred between the title and the plot."""
    fig.add_annotation(
        text=text, x=0.5, y=1.0, xref="paper", yref="paper", showarrow=False, yanchor="bottom", font=font
    )


def _translucent(hex_colour: str, alpha: float) -> str:
    red, green, blue = plotly.colors.hex_to_rgb(hex_colour)
    return f"rgba({red}, {green}, {blue}, {alpha})"


def find_max_probes(
    probes: pd.DataFrame, load: str, target: float, found: float | None, slo: str, notes: Sequence[str] = ()
) -> go.Figure:
    """A find-max search's probes (sweep_store.probes_of: load, met, attainment, run_id, stopped_early), numbered in
    the order they ran, SLO attainment against the load: those that met the target and those that missed it (a
    hollow marker where the probe stopped early), the target as a dashed line and the highest load that met it as
    a star; under the title, the SLO a request met to count (`slo`, tables.describe_slo) and the target, then
    `notes` (the search's bounds, the server's settings)."""
    load_spec = describe_column(load)
    fig = titled_figure(
        f"SLO attainment of the probes vs {lower_first(load_spec.label)}",
        load_spec.title,
        describe_column("slo_attainment").title,
    )
    notes_under_title(fig, [f"Good requests: {slo}; target attainment {target:.4g}", *notes])
    if probes.empty:
        return no_data(fig)
    numbered = probes.assign(order=range(1, len(probes) + 1))
    for met, name, colour in ((True, "Met the target", PALETTE[2]), (False, "Missed it", "crimson")):
        part = numbered[numbered["met"] == met]
        if part.empty:
            continue
        early = part["stopped_early"].astype(str) != ""
        fig.add_trace(
            go.Scatter(
                x=part["load"],
                y=part["attainment"],
                mode="markers+text",
                name=name,
                text=part["order"].astype(str),
                textposition="top center",
                cliponaxis=False,
                marker=dict(
                    size=11,
                    color=colour,
                    symbol=["circle-open" if e else "circle" for e in early],
                    line=dict(width=2, color=colour),
                ),
                customdata=np.column_stack([part["run_id"].astype(str), part["stopped_early"].astype(str)]),
                hovertemplate=(
                    f"probe %{{text}}: {load_spec.label} %{{x:.4g}} {load_spec.unit}<br>SLO attainment "
                    "%{y:.3f}<br>run %{customdata[0]}<br>%{customdata[1]}<extra>%{fullData.name}</extra>"
                ),
            )
        )
    fig.add_hline(
        y=target,
        line=dict(dash="dash", color="gray"),
        annotation_position="bottom left",
        annotation_text=f"Target {target:.4g}",
    )
    if found is None:
        _note_above(fig, "No load met the target")
    else:
        at = numbered[numbered["load"] == found]["attainment"].max()
        fig.add_trace(
            go.Scatter(
                x=[found],
                y=[at],
                mode="markers",
                name=f"Highest load meeting it: {found:g}",
                marker=dict(symbol="star", size=18, color="gold", line=dict(width=1, color="black")),
                hovertemplate=f"Highest load meeting the target: %{{x:.4g}} {load_spec.unit}<extra></extra>",
            )
        )
    pad_axis(fig, "x", probes["load"])
    return fig
