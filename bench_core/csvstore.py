"""Append rows to a CSV file without ever misaligning, losing or half-writing one.

Used for the run history and for LMDeploy-format CSVs alike. Every append rewrites the file into a
temporary sibling and renames it over the original, under an exclusive lock on a sidecar file, so
two processes appending at once both land and a crash leaves the previous good file in place.
When the row brings columns the file lacks (or lacks some the file has), the file gets the union
header: existing columns first in their order, new ones after; missing cells are empty.
"""

from __future__ import annotations

import csv
import io
import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TextIO

from filelock import FileLock

from .errors import HistoryError


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
            header = next(reader, [])
            rows = [dict(zip(header, cells)) for cells in reader if cells]
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise HistoryError(f"Cannot read {path}: {exc}") from exc
    return header, rows


def _cell(value: object) -> str:
    return "" if value is None else str(value)


def _write_rows(stream: TextIO, header: list[str], rows: Iterable[Mapping[str, object]]) -> None:
    writer = csv.writer(stream)
    writer.writerow(header)
    for row in rows:
        writer.writerow([_cell(row.get(col)) for col in header])


def table_bytes(header: list[str], rows: Iterable[Mapping[str, object]]) -> bytes:
    """The CSV text of `rows` under `header`, as a file download would hold it."""
    buffer = io.StringIO(newline="")
    _write_rows(buffer, header, rows)
    return buffer.getvalue().encode("utf-8")


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
