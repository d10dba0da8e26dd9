"""One way to put a table on a page: every row in view, numbers written alike, no column cut short.

st.dataframe's default box shows about ten rows and scrolls the rest out of sight, and it shows a missing
value as "None". `show_table` sizes the box to its rows (up to `max_rows`, past which it scrolls), writes
numbers with `tables.format_number` (right-aligned, a dash where a value is missing) and gives each text
column the width of its longest cell (the grid's own sizing cut row titles short: "TTFT (m"). A table whose numbers a user sorts (History's runs) keeps them as
numbers with `keep_numbers`: the grid then sorts them by value, in its own localized format.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pandas as pd
import streamlit as st
from pandas.io.formats.style import Styler

from bench_core.views import tables

# The grid's row and header height, and its border (Streamlit's defaults).
ROW_PX = 35
BORDER_PX = 3
# About one character of the grid's font, its cell padding, and the widest a column is sized.
CHAR_PX = 8
PADDING_PX = 32
MAX_COLUMN_PX = 640
# A compact table's columns are sized to their text as the grid draws it, for a table whose every column must be in
# view (five compared runs at 1,600 px): its cells are padded 8 px a side, and `drawn_px` reckons the font's widths.
COMPACT_PADDING_PX = 20
# The grid sizes a number column to its widest cell or header, up to this width: a longer header (a compared run's
# name, "Dataset name sharegpt, Concurrency 8 (run 20261201-101500-ab12)") would be cut short.
GRID_AUTO_WIDTH_PX = 500
# Tables of runs or requests may hold thousands of rows: past this many they scroll.
LONG_TABLE_ROWS = 25


def show_table(
    data: pd.DataFrame | Styler,
    *,
    key: str,
    max_rows: int | None = None,
    column_config: Mapping[str, Any] | None = None,
    keep_numbers: bool = False,
    compact: bool = False,
    **options,
):
    """Draw `data` (a frame, or a Styler whose colours are kept) with `st.dataframe`; returns what it returns.

    `column_config` entries win over the ones made here: a plain string is a column's label, a plain
    `st.column_config.Column` sets its fields on the column made here (pinned, help), an entry of a type of its
    own (a link) replaces it. `compact` sizes text columns to their text as drawn (`drawn_px`) rather than at a
    generous 8 px a character. `options` go to st.dataframe as they are (selection, hide_index)."""
    frame = data.data if isinstance(data, Styler) else data
    if isinstance(data, Styler):
        shown = data.format(tables.format_number)
    elif keep_numbers:
        shown = frame
    else:
        shown = tables.formatted(frame)
        options.setdefault("hide_index", True)
    shown_frame = shown.data if isinstance(shown, Styler) else shown
    sizes = (drawn_px, COMPACT_PADDING_PX) if compact else (lambda text: len(text) * CHAR_PX, PADDING_PX)
    config = _column_config(shown_frame, keep_numbers or isinstance(data, Styler), *sizes)
    for name, entry in (column_config or {}).items():
        config[name] = _laid_over(config.get(name), entry)
    return st.dataframe(
        shown,
        key=key,
        height=table_height(len(frame), max_rows),
        column_config=config,
        placeholder=tables.MISSING,
        **options,
    )


def table_height(rows: int, max_rows: int | None = None) -> int | str:
    """Every row ("content"), or a box of `max_rows` rows that scrolls when there are more."""
    if max_rows is None or rows <= max_rows:
        return "content"
    return (max_rows + 1) * ROW_PX + BORDER_PX


def drawn_px(text: str) -> int:
    """About how wide the grid draws `text`, a little over rather than under (its 14 px Source Sans, measured in
    chromium): capitals 10 px, other letters and digits 7 (an "m" 12, an "i" 3), "%" 12, "+" and "_" 7, spaces and
    other marks 4."""
    return sum(
        10 if char.isupper() else 7 if char.isalnum() or char in "+_" else 12 if char == "%" else 4 for char in text
    )


def _column_config(
    frame: pd.DataFrame, numbers_kept: bool, text_px: Callable[[str], int], padding_px: int
) -> dict[str, Any]:
    config: dict[str, Any] = {}
    for name in frame.columns:
        column = frame[name]
        header_px = text_px(str(name)) + padding_px
        header = {"width": min(header_px, MAX_COLUMN_PX)} if header_px > GRID_AUTO_WIDTH_PX else {}
        if numbers_kept and pd.api.types.is_numeric_dtype(column) and not pd.api.types.is_bool_dtype(column):
            config[name] = st.column_config.NumberColumn(format="localized", **header)
            continue
        if not numbers_kept and _holds_numbers(column):  # the grid sizes number columns to their widest cell
            config[name] = st.column_config.Column(alignment="right", **header)
            continue
        width = max(text_px(str(text)) for text in (name, *column)) + padding_px
        config[name] = st.column_config.Column(width=min(width, MAX_COLUMN_PX))
    if not isinstance(frame.index, pd.RangeIndex):
        width = max(text_px(str(text)) for text in (frame.index.name or "", *frame.index)) + padding_px
        config["_index"] = st.column_config.Column(width=min(width, MAX_COLUMN_PX))
    return config


def _holds_numbers(column: pd.Series) -> bool:
    """A formatted column that was numbers: every cell a formatted number or a dash."""
    cells = [cell for cell in column if cell != tables.MISSING]
    return bool(cells) and all(_is_formatted_number(cell) for cell in cells)


def _is_formatted_number(cell: str) -> bool:
    try:
        float(cell.replace(",", ""))
    except (TypeError, ValueError, AttributeError):
        return cell in ("∞", "-∞")
    return True


def _laid_over(made: Any, given: Any) -> Any:
    """A caller's entry on the column made here: a label string, or the fields a plain Column sets; an entry with
    a type of its own (LinkColumn's type_config) replaces it."""
    if made is None:
        return given
    if isinstance(given, str):
        return {**made, "label": given}
    if given.get("type_config") is not None:
        return given
    return {**made, **{field: value for field, value in given.items() if value is not None}}
