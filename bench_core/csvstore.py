"""Append rows to a CSV file without ever misaligning, losing or half-writing one.

Used for the run history and for LMDeploy-format CSVs alike. Every append rewrites the file into a
temporary sibling and renames it over the original, under an exclusive lock on a sidecar file, so
two processes appending at once both land and a crash leaves the previous good file in place.
When the row brings columns the file lacks (or lacks some the file has), the file gets the union
header: existing columns first in their order, new ones after; missing cells are empty.
Reading never pads or cuts a row: a line that does not parse as a row of the header's columns (a row cut
short by a crash, garbage, an unterminated quote, bytes that are not UTF-8) is damaged. `read_table` refuses
a file holding one; `read_clean_table` moves such lines, verbatim, to a side file and keeps the rest byte for byte.
"""

from __future__ import annotations

import csv
import io
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from filelock import FileLock

from .errors import HistoryColumnsError, HistoryError


def _lock(path: Path) -> FileLock:
    return FileLock(str(path) + ".lock", timeout=60)


@dataclass
class SplitTable:
    """A CSV file's lines sorted into the header, the rows that parse and the damaged lines, each kept verbatim."""

    header: list[str] = field(default_factory=list)
    header_bytes: bytes = b""
    rows: list[dict[str, str]] = field(default_factory=list)
    row_bytes: list[bytes] = field(default_factory=list)  # rows[i] as written (several lines for a quoted newline)
    row_lines: list[int] = field(default_factory=list)  # the 1-based line number rows[i] starts at
    damaged: list[tuple[int, bytes]] = field(default_factory=list)  # (1-based line number, the line as written)


@dataclass
class CleanTable:
    """The rows of a file that parse, and the line numbers of those `read_clean_table` moved out of it."""

    header: list[str]
    rows: list[dict[str, str]]
    moved: list[int]


def _record(lines: list[bytes], start: int) -> tuple[list[str] | None, int]:
    """The cells of the CSV record starting at line `start` (None when it does not parse) and the line after it."""
    end = start

    def decoded() -> Iterator[str]:
        nonlocal end
        while end < len(lines):
            text = lines[end].decode("utf-8-sig" if end == 0 else "utf-8")
            end += 1
            yield text

    try:
        cells = next(csv.reader(decoded(), strict=True))
    except (csv.Error, UnicodeDecodeError, StopIteration):
        return None, end
    if not lines[end - 1].endswith((b"\n", b"\r")):  # every writer ends a row with a line break: this one was cut
        return None, end
    return cells, end


def split_table(data: bytes) -> SplitTable:
    """Sort a CSV file's lines: the first record is the header; a later one with the header's cell count is a
    row; any other line is damaged. A record that fails to parse or has the wrong cell count condemns only its
    first line, and reading goes on from the next, so an unterminated quote does not swallow the rows after it.
    A first line that is not a header leaves the table without one and the rest unsorted."""
    lines = data.splitlines(keepends=True)
    table, position = SplitTable(), 0
    while position < len(lines):
        cells, end = _record(lines, position)
        if cells == []:  # a blank line
            position = end
        elif cells is None or (table.header_bytes and len(cells) != len(table.header)):
            table.damaged.append((position + 1, lines[position]))
            if not table.header_bytes:
                return table
            position += 1
        elif not table.header_bytes:
            table.header, table.header_bytes, position = cells, b"".join(lines[position:end]), end
        else:
            table.rows.append(dict(zip(table.header, cells)))
            table.row_bytes.append(b"".join(lines[position:end]))
            table.row_lines.append(position + 1)
            position = end
    return table


def _read_split(path: Path) -> SplitTable:
    try:
        table = split_table(path.read_bytes())
    except OSError as exc:
        raise HistoryError(f"Cannot read {path}: {exc.strerror or exc}.") from exc
    if table.damaged and not table.header_bytes:
        raise HistoryError(f"Cannot read {path}: its first line is not a CSV header (garbled or not UTF-8).")
    return table


def read_table(path: str | os.PathLike) -> tuple[list[str], list[dict[str, str]]]:
    """Header and rows of a CSV file, every cell as the string written. Missing file: empty.
    A damaged line is refused, never padded or cut to fit: rewriting it would make the damage permanent."""
    path = Path(path)
    if not path.exists():
        return [], []
    table = _read_split(path)
    if table.damaged:
        lines = ", ".join(str(number) for number, _ in table.damaged)
        raise HistoryError(f"Line(s) {lines} of {path} are not rows of its {len(table.header)} columns "
                           "(cut short, garbled or not UTF-8); nothing was written to it.")
    return table.header, table.rows


def read_clean_table(
    path: str | os.PathLike, side_path: str | os.PathLike, key_columns: Sequence[str] = (),
    keep: Callable[[dict[str, str]], bool] = lambda row: True,
) -> CleanTable:
    """Header and rows of a CSV file after moving its damaged lines, and the rows `keep` refuses, to the end of
    `side_path` as they were written; every other line stays byte for byte. A header without one of
    `key_columns` is refused (HistoryColumnsError) and nothing is moved. Cheap when nothing is damaged:
    one unlocked read."""
    path, side_path = Path(path), Path(side_path)
    if not path.exists():
        return CleanTable([], [], [])
    table = _read_split(path)
    missing = [col for col in key_columns if table.header_bytes and col not in table.header]
    if missing:
        raise HistoryColumnsError(
            f"{path} has no {', '.join(repr(col) for col in missing)} column (its header starts with "
            f"{', '.join(table.header[:4])}), so its rows cannot be told apart; it was left as it is and nothing "
            "will be written to it until the column is back (or the file is moved away).")
    if not table.damaged and all(keep(row) for row in table.rows):
        return CleanTable(table.header, table.rows, [])
    with _lock(path):
        table = _read_split(path)  # again, under the lock: another process may have written since
        refused = [not keep(row) for row in table.rows]
        kept = [(row, raw) for row, raw, out in zip(table.rows, table.row_bytes, refused) if not out]
        moved = sorted([*table.damaged, *((line, raw) for line, raw, out in
                                          zip(table.row_lines, table.row_bytes, refused) if out)])
        _quarantine(side_path, table.header_bytes, [raw for _, raw in moved])
        _replace_bytes(path, table.header_bytes + b"".join(raw for _, raw in kept))
    return CleanTable(table.header, [row for row, _ in kept], [number for number, _ in moved])


def _quarantine(side_path: Path, header_bytes: bytes, lines: list[bytes]) -> None:
    """Append `lines` to the side file (its first line the header), each ending in a line break, on disk before
    they leave the original."""
    new = not side_path.exists()
    with open(side_path, "ab") as f:
        if new:
            f.write(header_bytes)
        f.writelines(line if line.endswith((b"\n", b"\r")) else line + b"\n" for line in lines)
        f.flush()
        os.fsync(f.fileno())


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


def _replace_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def _write_atomically(path: Path, header: list[str], rows: Iterable[Mapping[str, object]]) -> None:
    _replace_bytes(path, table_bytes(header, rows))


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
