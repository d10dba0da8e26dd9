"""The history's runs as text, for a terminal, a file or a script (`python -m bench_core history`): a fixed-width
table or a markdown one with numbers as every table shows them (tables.format_number), and CSV or JSON with each
value as loaded. Pure functions of a loaded table (History.load) or of one run's cells. The tables and a run's
cells are for reading: a control character in a cell (an imported label's escape sequence) is written as its
escape, so a terminal shows it and the columns line up; CSV and JSON hold each value exactly.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from ..terminal import escaped
from .tables import formatted

COLUMN_GAP = "  "  # between the columns of the fixed-width table


def runs_text(table: pd.DataFrame, format_name: str) -> str:
    """Every row and column of `table` in `format_name` (one of RUNS_FORMATS), ending with a newline."""
    return _WRITERS[format_name](table)


def fixed_width_table(table: pd.DataFrame) -> str:
    """A table for a terminal: a header of column names, numbers right-aligned, text left-aligned."""
    lines = [[escaped(str(cell)) for cell in line] for line in [table.columns, *formatted(table).to_numpy().tolist()]]
    widths = [max(len(line[index]) for line in lines) for index in range(len(table.columns))]
    numbers = [_holds_numbers(table[name]) for name in table.columns]
    return "".join(
        COLUMN_GAP.join(
            cell.rjust(width) if right else cell.ljust(width) for cell, width, right in zip(line, widths, numbers)
        ).rstrip()
        + "\n"
        for line in lines
    )


def markdown_table(table: pd.DataFrame) -> str:
    """A GitHub-flavoured markdown table (a pipe in a cell escaped), numbers right-aligned."""
    rule = ["---:" if _holds_numbers(table[name]) else "---" for name in table.columns]
    lines = [list(table.columns), rule, *formatted(table).to_numpy().tolist()]
    return "".join("| " + " | ".join(_markdown_cell(cell) for cell in line) + " |\n" for line in lines)


def csv_text(table: pd.DataFrame) -> str:
    """The table as CSV: a header, then each row's values as loaded (a missing one empty, a whole number without a
    decimal point)."""
    buffer = io.StringIO(newline="")
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(table.columns)
    for record in plain_records(table):
        writer.writerow("" if value is None else value for value in record.values())
    return buffer.getvalue()


def json_text(value: Any) -> str:
    """`value` (plain values: plain_records', present_cells') as indented JSON, ending with a newline."""
    return json.dumps(value, indent=2, ensure_ascii=False) + "\n"


def plain_records(table: pd.DataFrame) -> list[dict[str, Any]]:
    """One dict per row, every column of the table, each value as plain_value makes it."""
    return [{name: plain_value(value) for name, value in zip(table.columns, row)} for row in table.to_numpy().tolist()]


def present_cells(run: pd.Series) -> dict[str, Any]:
    """The cells of one run (a row of a loaded table) that hold a value (not missing, not empty text), each as
    plain_value makes it."""
    plain = {str(name): plain_value(value) for name, value in run.items()}
    return {name: value for name, value in plain.items() if value is not None and value != ""}


def plain_value(value: Any) -> Any:
    """A cell as JSON holds it: missing as None, a whole number as an int (a column with a missing cell loads its
    numbers as floats), a number that is not finite as the text LMDeploy writes for it ("inf": nothing succeeded),
    numpy's scalars as Python's."""
    if value is None or value is pd.NA or (isinstance(value, float | np.floating) and math.isnan(value)):
        return None
    if isinstance(value, bool | np.bool_):
        return bool(value)
    if isinstance(value, int | np.integer):
        return int(value)
    if isinstance(value, float | np.floating):
        number = float(value)
        if math.isinf(number):
            return "inf" if number > 0 else "-inf"
        return int(number) if number.is_integer() else number
    return value


def cells_text(cells: Mapping[str, Any]) -> str:
    """One run's cells as `name  value` lines, the values in a column of their own."""
    width = max((len(escaped(name)) for name in cells), default=0)
    return "".join(f"{escaped(name):<{width}}{COLUMN_GAP}{escaped(str(value))}\n" for name, value in cells.items())


_WRITERS = {
    "table": fixed_width_table,
    "csv": csv_text,
    "json": lambda table: json_text(plain_records(table)),
    "markdown": markdown_table,
}
RUNS_FORMATS = tuple(_WRITERS)  # the first is the default


def _holds_numbers(column: pd.Series) -> bool:
    return pd.api.types.is_numeric_dtype(column) and not pd.api.types.is_bool_dtype(column)


def _markdown_cell(cell: str) -> str:
    return escaped(cell.replace("|", "\\|").replace("\n", " "))
