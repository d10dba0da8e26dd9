"""Append rows to a CSV file without ever misaligning, losing or half-writing one.

Used for the run history and for LMDeploy-format CSVs alike. Every append rewrites the file into a
temporary sibling and renames it over the original, under an exclusive lock on a sidecar file, so
two processes appending at once both land and a crash leaves the previous good file in place.
When the row brings columns the file lacks (or lacks some the file has), the file gets the union
header: existing columns first in their order, new ones after; missing cells are empty.
Every CSV written here, the history included, is safe to open in a spreadsheet: a text cell that would
run as a formula is stored with a leading quote (`spreadsheet_safe`), which reading takes off again.
"""

from __future__ import annotations

import csv
import io
import os
import re
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TextIO

import pandas as pd
from filelock import FileLock

from .errors import HistoryError


# What a spreadsheet takes for the start of a formula; and a number as Python and LMDeploy write one.
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
_QUOTABLE_STARTS = frozenset("=+-@\t\r'")
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?|[+-]?(inf|infinity|nan)", re.IGNORECASE)


def _lock(path: Path) -> FileLock:
    return FileLock(str(path) + ".lock", timeout=60)


def read_table(path: str | os.PathLike) -> tuple[list[str], list[dict[str, str]]]:
    """Header and rows of a CSV file, every cell as the string written. Missing file: empty."""
    path = Path(path)
    if not path.exists():
        return [], []
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.reader(f)
            header = [spreadsheet_text(col) for col in next(reader, [])]
            rows = [dict(zip(header, map(spreadsheet_text, cells))) for cells in reader if cells]
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise HistoryError(f"Cannot read {path}: {exc}") from exc
    return header, rows


def _cell(value: object) -> str:
    return spreadsheet_safe("" if value is None else str(value))


def spreadsheet_safe(text: str) -> str:
    """A text cell as every CSV we write holds it: one that a spreadsheet would run as a formula (it starts
    with = + - @, a tab or a carriage return) gets a leading quote, as OWASP recommends against CSV
    injection. Numbers (-1.5, 1e-05, -inf) and LMDeploy's '-' stay as they are; a text that already
    starts with quotes before such a character gets one more, so `spreadsheet_text` reads back exactly."""
    if text[:1] not in _QUOTABLE_STARTS:  # nearly every cell: no work
        return text
    return "'" + text if _runs_as_formula(text.lstrip("'")) else text


def spreadsheet_text(cell: str) -> str:
    """The text a cell written by `spreadsheet_safe` stands for."""
    return cell[1:] if cell.startswith("'") and _runs_as_formula(cell[1:].lstrip("'")) else cell


def _runs_as_formula(text: str) -> bool:
    return text.startswith(_FORMULA_STARTS) and text != "-" and not _NUMBER.fullmatch(text)


def _write_rows(stream: TextIO, header: list[str], rows: Iterable[Mapping[str, object]]) -> None:
    writer = csv.writer(stream)
    writer.writerow(map(_cell, header))
    for row in rows:
        writer.writerow([_cell(row.get(col)) for col in header])


def table_bytes(header: list[str], rows: Iterable[Mapping[str, object]]) -> bytes:
    """The CSV text of `rows` under `header`, as a file download would hold it."""
    buffer = io.StringIO(newline="")
    _write_rows(buffer, header, rows)
    return buffer.getvalue().encode("utf-8")


def frame_bytes(frame: pd.DataFrame) -> bytes:
    """A table's CSV text for a download, its text cells made safe as `table_bytes` makes them."""
    safe = frame.map(lambda cell: spreadsheet_safe(cell) if isinstance(cell, str) else cell)
    return safe.to_csv(index=False).encode("utf-8")


def _write_atomically(path: Path, header: list[str], rows: Iterable[Mapping[str, object]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", newline="", encoding="utf-8") as f:
            _write_rows(f, header, rows)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def append_row(path: str | os.PathLike, row: Mapping[str, object]) -> None:
    """Append `row` (column -> value) to the CSV at `path`, creating it and its folder if needed."""
    append_rows(path, [row])


def append_rows(path: str | os.PathLike, new_rows: Iterable[Mapping[str, object]]) -> None:
    """Append several rows in one atomic write: after a crash either all of them are there or none."""
    path = Path(path)
    new_rows = list(new_rows)
    with _lock(path):
        header, rows = read_table(path)
        header = list(dict.fromkeys([*header, *(col for row in new_rows for col in row)]))
        _write_atomically(path, header, [*rows, *new_rows])


def rewrite(path: str | os.PathLike, keep) -> int:
    """Keep only the rows for which `keep(row)` is true; returns how many were removed."""
    path = Path(path)
    with _lock(path):
        header, rows = read_table(path)
        kept = [row for row in rows if keep(row)]
        if len(kept) != len(rows):
            _write_atomically(path, header, kept)
        return len(rows) - len(kept)
