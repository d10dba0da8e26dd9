"""What the figures of bench_core.views share: a figure titled with its axes, the figure that says there is
no data yet, the palette, and how history rows are picked, grouped by colour, labelled and framed.

Figures are pure functions: no I/O, no streamlit. Every axis is titled with its unit (latencies in ms, stored in
seconds), every trace hovers its values, and an empty input gives an empty figure that says "No data yet"
instead of raising, so a live page can draw before the first tick. Live figures are redrawn on every poll, so
their payload is bounded whatever the run's size: a series is reduced to at most `MAX_POINTS` points.
"""

from __future__ import annotations

import itertools
import textwrap
from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.colors
import plotly.graph_objects as go

from ..config import KNOBS
from .run_diff import differing_settings, point_labels, telling_settings

MAX_POINTS = 2000
MAX_VALUE_TICKS = 12
NO_DATA = "No data yet"
# Every figure's series colours, set on the figure itself: Streamlit's theme drops plotly's template and colours
# series in its own palette, whose first two are shades of one blue, so paired series looked alike on the page and
# a report (plotly's template) coloured them otherwise. A colorway of the figure's own is kept by both.
PALETTE = plotly.colors.qualitative.Plotly
_NO_GROUP = "(none)"
_CHOICE_KNOBS = {knob.name for knob in KNOBS if knob.choices}
_PAD_FRACTION = 0.1
_TITLE_MARGIN_PX = 60
_NOTE_PX = 18
# A note's lines break at about this many characters: a subtitle does not wrap, and a chart in half the page's
# width cuts a longer line at its edge.
NOTE_LINE_CHARS = 70
# The figure's height without a legend (plotly's default), the room under the plot for the x axis's ticks and
# title, and a legend line's height (at plotly's 12 px font) with its padding.
FIGURE_PX = 450
AXIS_TITLE_PX = 50
_LEGEND_LINE_PX = 22
_LEGEND_PAD_PX = 10
# A legend entry breaks into lines of about this many characters: plotly never wraps one, and a chart in half the
# centred page (344 px at any window) cut a run's name, its settings then its id, at its right edge.
LEGEND_LINE_CHARS = 45


def titled_figure(title: str, x_title: str, y_title: str) -> go.Figure:
    """An empty figure with its title and its axes' titles."""
    # No template of our own: the dashboard draws figures in Streamlit's theme, and copying a plotly
    # template costs about 12 ms a figure, on every live refresh.
    fig = go.Figure()
    fig.update_layout(
        colorway=PALETTE,
        title=dict(text=title),
        xaxis=dict(title=dict(text=x_title)),
        yaxis=dict(title=dict(text=y_title)),
        margin=dict(l=60, r=30, t=60, b=50),
    )
    return fig


def count_axis(fig: go.Figure, largest: float, axis: str = "yaxis") -> None:
    """Ticks at whole counts on `axis` (0, 1, 2 ... or 0, 50, 100 ...: a 1-2-5 step giving about five ticks up to
    `largest`): plotly's own steps put ticks at 0.5 and 1.5 requests on a count up to 4."""
    rough = max(largest / 5, 1.0)
    magnitude = 10 ** int(np.floor(np.log10(rough)))
    step = int(next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= rough))
    fig.update_layout({axis: dict(tickmode="linear", tick0=0, dtick=step)})


def ticks_at_values(fig: go.Figure, values: pd.Series) -> None:
    """A tick on the x axis at each value a setting took, where they are few: none at concurrency 2.5."""
    values = np.unique(values.to_numpy(dtype=np.float64))
    if values.size <= MAX_VALUE_TICKS:
        fig.update_xaxes(tickmode="array", tickvals=values, ticktext=[tick_label(v) for v in values])


def no_data(fig: go.Figure) -> go.Figure:
    """Titled axes without ticks (their default range means nothing) and the message in the middle."""
    fig.add_annotation(
        text=NO_DATA, x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False, font=dict(size=16, color="gray")
    )
    fig.update_xaxes(showticklabels=False, showgrid=False, zeroline=False)
    fig.update_yaxes(showticklabels=False, showgrid=False, zeroline=False)
    return fig


def notes_under_title(fig: go.Figure, notes: Sequence[str]) -> None:
    """`notes` under the title, where no bar or point reaches, each broken into lines that fit the chart, after those
    already there; the top margin grows to hold them."""
    added = [line for note in notes for line in broken(note, NOTE_LINE_CHARS)]
    there = fig.layout.title.subtitle.text
    lines = [*(there.split("<br>") if there else []), *added]
    if added:
        fig.update_layout(
            title=dict(subtitle=dict(text="<br>".join(lines))), margin=dict(t=_TITLE_MARGIN_PX + _NOTE_PX * len(lines))
        )


def legend_below(fig: go.Figure, title: str = "") -> None:
    """The legend below the plot, one entry a line across the whole width, the figure taller by as much: however
    many entries it lists, it stays clear of the title and the notes above the plot (a row above the plot wraps into
    them once its entries pass the chart's width) and leaves the plot its height. It starts at the figure's left
    edge, not the plot's, and a long entry takes more lines, so a narrow chart shows each entry whole."""
    lines = 1 if title else 0
    for trace in fig.data:
        name = broken(str(trace.name), LEGEND_LINE_CHARS)
        trace.name = "<br>".join(name)
        lines += len(name)
    legend_px = lines * _LEGEND_LINE_PX + _LEGEND_PAD_PX
    fig.update_layout(
        height=FIGURE_PX + legend_px,
        margin=dict(b=AXIS_TITLE_PX + legend_px),
        legend=dict(
            orientation="h",
            entrywidth=1,
            entrywidthmode="fraction",
            x=0,
            xref="container",
            xanchor="left",
            y=0,
            yref="container",
            yanchor="bottom",
            title=dict(text=title, side="top"),
        ),
    )


def broken(text: str, width: int) -> list[str]:
    """`text` in lines of about `width` characters, broken at spaces only: a run id (20261201-101500-ab12) stays
    on one line, findable as written."""
    return textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False) or [text]


def rows_with(runs: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """Rows where every named column has a value; numeric columns as numbers."""
    if any(col not in runs for col in columns):
        return runs.iloc[0:0]
    rows = runs.copy()
    for col in columns:
        numeric = pd.to_numeric(rows[col], errors="coerce")
        if numeric.notna().sum() == rows[col].notna().sum():  # keep text knobs (model_format) as text
            rows[col] = numeric
    return rows.dropna(subset=columns)


def colour_groups(rows: pd.DataFrame, color: str | None):
    """(name, rows) per colour value, in sorted order (numbers as numbers) so a value keeps its colour
    across charts."""
    if color is None or color not in rows:
        yield "all runs", rows
        return
    keys = rows[color].map(lambda value: _NO_GROUP if pd.isna(value) or value == "" else tick_label(value))
    numbers = pd.to_numeric(rows[color], errors="coerce").groupby(keys).first()
    for key in sorted(numbers.index, key=lambda key: (0, numbers[key], key) if pd.notna(numbers[key]) else (1, 0, key)):
        yield key, rows[keys == key]


def cycled_palette():
    """The qualitative palette, cycled: neighbouring groups get clearly different colours."""
    return itertools.cycle(PALETTE)


def inward_label_positions(x: pd.Series, all_x: pd.Series) -> list[str]:
    """Label positions that keep a label inside the plot: above its point, towards the middle."""
    middle = (pd.to_numeric(all_x).min() + pd.to_numeric(all_x).max()) / 2
    return ["top left" if value > middle else "top right" for value in pd.to_numeric(x)]


def pad_axis(fig: go.Figure, axis: str, values: pd.Series) -> None:
    """A numeric axis over the values with a tenth of their span (or of the value) to spare on each side, so a
    marker and its label at the edge stay whole, and a single value sits mid-axis."""
    numbers = pd.to_numeric(values, errors="coerce").to_numpy(dtype=np.float64)
    numbers = numbers[np.isfinite(numbers)]
    if not numbers.size:
        return
    low, high = float(numbers.min()), float(numbers.max())
    spare = (high - low) * _PAD_FRACTION or abs(high) * _PAD_FRACTION or 1.0
    fig.update_layout({f"{axis}axis": dict(range=[low - spare, high + spare])})


def setting_labels(rows: pd.DataFrame) -> list[str]:
    """Per run, its values of the settings that tell the rows apart: "Concurrency 4" (see
    `run_diff.telling_settings`), so two runs that differ never share a label."""
    return point_labels(rows, telling_settings(rows, differing_settings(rows)))


def run_identity(rows: pd.DataFrame) -> np.ndarray:
    """(run id, label) per row, for the hover."""
    blank = pd.Series("", index=rows.index)
    run_id = rows.get("run_id", blank).astype(str)
    label = rows.get("label", blank).fillna("").astype(str)
    return np.column_stack([run_id.to_numpy(dtype=object), label.to_numpy(dtype=object)])


def is_categorical(rows: pd.DataFrame, knob: str) -> bool:
    """Choice knobs (codes such as quant_policy), flags and text knobs are categories, not a scale."""
    column = rows[knob]
    return knob in _CHOICE_KNOBS or pd.api.types.is_bool_dtype(column) or not pd.api.types.is_numeric_dtype(column)


def tick_label(value) -> str:
    """A knob value as an axis category: 4 rather than 4.0."""
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return str(int(value))
    return str(value)
