"""Append rows to a CSV file without ever misaligning, losing or half-writing one.

Used for the run history and for LMDeploy-format CSVs alike, under an exclusive lock on a sidecar
file, so two processes appending at once both land. A row whose columns the file already has is
appended in place, in one write (undone if it fails), so the file keeps its identity: a user's CSV
stays the same inode, with its mode, hard links and symlink. When the rows bring columns the file
lacks, the file gets the union header (existing columns first in their order, new ones after;
missing cells empty) by a rewrite into a temporary sibling renamed over the original, so a crash
leaves the previous good file in place; the rewrite keeps the file's mode and replaces a symlink's
target, not the link.
Reading never pads or cuts a row: a line that does not parse as a row of the header's columns (a row cut
short by a crash, garbage, an unterminated quote, bytes that are not UTF-8) is damaged. `read_table` refuses
a file holding one; `read_clean_table` moves such lines, verbatim, to a side file and keeps the rest byte for byte.
Every CSV written here, the history included, is safe to open in a spreadsheet: a text cell that would
run as a formula is stored with a leading quote (`spreadsheet_safe`), which reading takes off again.
"""

from __future__ import annotations

import contextlib
import csv
import io
import os
import re
import secrets
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import pandas as pd
from filelock import FileLock, Timeout

from .errors import HistoryColumnsError, HistoryError

LOCK_WAIT_S = 60  # how long a writer waits for another one to finish
# What a spreadsheet takes for the start of a formula; and a number as Python and LMDeploy write one.
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
_QUOTABLE_STARTS = frozenset("=+-@\t\r'")
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?|[+-]?(inf|infinity|nan)", re.IGNORECASE)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold the lock of `path`. A lock file that cannot be created is an error at once, not a lock
    to wait for; an OS error while holding it is a HistoryError naming `path`."""
    lock_path = Path(f"{path}.lock")
    try:
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        os.close(os.open(lock_path, os.O_WRONLY | os.O_CREAT, 0o666))
        with FileLock(str(lock_path), timeout=LOCK_WAIT_S):
            yield
    except Timeout:
        raise HistoryError(
            f"Another process kept {path} locked for {LOCK_WAIT_S} s ({lock_path}); nothing was written."
        ) from None
    except OSError as exc:
        raise HistoryError(f"Cannot write {path}: {exc.strerror or exc}.") from exc


def check_folder_writable(folder: str | os.PathLike, target: str | os.PathLike | None = None) -> None:
    """HistoryError naming `target` (default: `folder`) unless files can be created in `folder`, or,
    where it does not exist yet, in the nearest folder above it (where it would be made). Tried with
    a file that is removed at once."""
    folder = Path(folder)
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise HistoryError(f"Cannot write {target or folder}: {existing} is a file, not a folder.")
    try:
        fd, probe = tempfile.mkstemp(prefix=".write-check-", dir=existing)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise HistoryError(
            f"Cannot write {target or folder}: {existing} does not take new files ({exc.strerror})."
        ) from None


def check_csv_writable(path: str | os.PathLike) -> None:
    """HistoryError unless rows can be appended to the CSV at `path` (an existing file or a new one),
    and its lock file created next to it. Nothing is changed."""
    path = Path(path)
    check_folder_writable(path.parent, path)
    if path.is_dir():
        raise HistoryError(f"Cannot write {path}: it is a folder, not a file.")
    if path.exists():
        try:
            open(path, "ab").close()
        except OSError as exc:
            raise HistoryError(f"Cannot write {path}: {exc.strerror or exc}.") from None


@dataclass
class SplitTable:
    """A CSV file's lines sorted into the header, the rows that parse and the damaged lines, each kept verbatim."""

    header: list[str] = field(default_factory=list)
    header_bytes: bytes = b""
    rows: list[dict[str, str]] = field(default_factory=list)
    row_bytes: list[bytes] = field(default_factory=list)  # rows[i] as written (several lines for a quoted newline)
    row_lines: list[int] = field(default_factory=list)  # the 1-based line number rows[i] starts at
    damaged: list[tuple[int, bytes]] = field(default_factory=list)  # (1-based line number, the line as written)
    data: bytes = b""  # the file's bytes, when read from a file


@dataclass
class CleanTable:
    """The rows of a file that parse, and the line numbers of those `read_clean_table` moved out of it."""

    header: list[str]
    rows: list[dict[str, str]]
    moved: list[int]
    data: bytes = b""  # the file's bytes that these rows are, after the move (for a reader to know it unchanged)


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
            table.header = [spreadsheet_text(col) for col in cells]
            table.header_bytes, position = b"".join(lines[position:end]), end
        else:
            table.rows.append(dict(zip(table.header, map(spreadsheet_text, cells))))
            table.row_bytes.append(b"".join(lines[position:end]))
            table.row_lines.append(position + 1)
            position = end
    return table


def _whole_table(data: bytes) -> SplitTable | None:
    """`split_table`'s header and rows of a file in which every record parses with the header's cell count
    and the last ends with a line break, in one pass of the csv module (4x faster on a long history);
    None for any other file, which `split_table` then sorts line by line. The same rows: a record parses alike
    fed line by line or whole, and UTF-8 decodes alike by line or whole (no character's bytes hold a line
    break). Without row_bytes and row_lines, which only a move of damaged lines needs."""
    try:
        text = data.decode("utf-8-sig")
        records = [cells for cells in csv.reader(io.StringIO(text, newline=""), strict=True) if cells]
    except (UnicodeDecodeError, csv.Error):
        return None
    if not records or not text.endswith(("\n", "\r")):
        return None
    header = [spreadsheet_text(col) for col in records[0]]
    if any(len(cells) != len(header) for cells in records):
        return None
    quoted = "'" in text  # a cell written by spreadsheet_safe starts with a quote: most files have none
    rows = [
        dict(zip(header, map(spreadsheet_text, cells) if quoted and "'" in "".join(cells) else cells))
        for cells in records[1:]
    ]
    return SplitTable(header=header, rows=rows)


def rows_after(header: list[str], data: bytes) -> list[dict[str, str]] | None:
    """The rows of `data`, lines that follow a header `header` in a file (rows appended to it); None when a
    line of it is not a whole row of those columns."""
    if not data:
        return []
    table = _whole_table(table_bytes(header, []) + data)
    return None if table is None else table.rows


def _read_split(path: Path, whole: bool = False) -> SplitTable:
    """The file's table; with `whole`, one that `_whole_table` could read has no row_bytes or row_lines."""
    try:
        data = path.read_bytes()
        table = (whole and _whole_table(data)) or split_table(data)
    except OSError as exc:
        raise HistoryError(f"Cannot read {path}: {exc.strerror or exc}.") from exc
    table.data = data
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
        raise HistoryError(
            f"Line(s) {lines} of {path} are not rows of its {len(table.header)} columns "
            "(cut short, garbled or not UTF-8); nothing was written to it."
        )
    return table.header, table.rows


def read_clean_table(
    path: str | os.PathLike,
    side_path: str | os.PathLike,
    key_columns: Sequence[str] = (),
    keep: Callable[[dict[str, str]], bool] = lambda row: True,
) -> CleanTable:
    """Header and rows of a CSV file after moving its damaged lines, and the rows `keep` refuses, to the end of
    `side_path` as they were written; every other line stays byte for byte. A header without one of
    `key_columns` is refused (HistoryColumnsError) and nothing is moved. Cheap when nothing is damaged:
    one unlocked read."""
    path, side_path = Path(path), Path(side_path)
    if not path.exists():
        return CleanTable([], [], [])
    table = _read_split(path, whole=True)
    missing = [col for col in key_columns if table.header and col not in table.header]
    if missing:
        raise HistoryColumnsError(
            f"{path} has no {', '.join(repr(col) for col in missing)} column (its header starts with "
            f"{', '.join(table.header[:4])}), so its rows cannot be told apart; it was left as it is and nothing "
            "will be written to it until the column is back (or the file is moved away)."
        )
    if not table.damaged and all(keep(row) for row in table.rows):
        return CleanTable(table.header, table.rows, [], table.data)
    with _locked(path):
        table = _read_split(path)  # again, under the lock: another process may have written since
        refused = [not keep(row) for row in table.rows]
        kept = [(row, raw) for row, raw, out in zip(table.rows, table.row_bytes, refused) if not out]
        moved = sorted(
            [*table.damaged, *((line, raw) for line, raw, out in zip(table.row_lines, table.row_bytes, refused) if out)]
        )
        _quarantine(side_path, table.header_bytes, [raw for _, raw in moved])
        data = table.header_bytes + b"".join(raw for _, raw in kept)
        replace_bytes(path, data)
    return CleanTable(table.header, [row for row, _ in kept], [number for number, _ in moved], data)


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


def _read_header(path: Path) -> list[str]:
    """The header of the CSV at `path` (empty when the file is missing or empty). Only the header
    is decoded: a damaged row further down does not stop an append."""
    try:
        with open(path, newline="", encoding="utf-8", errors="surrogateescape") as f:
            header = [spreadsheet_text(col) for col in next((cells for cells in csv.reader(f) if cells), [])]
    except FileNotFoundError:
        return []
    except csv.Error as exc:
        raise HistoryError(f"Cannot read the header of {path}: {exc}") from exc
    try:
        "".join(header).encode("utf-8")
    except UnicodeEncodeError:
        raise HistoryError(f"Cannot read the header of {path}: it is not UTF-8 text.") from None
    return header


def cell_text(value: object) -> str:
    """The text a value is written as (before `spreadsheet_safe`): None as an empty cell."""
    return "" if value is None else str(value)


def _cell(value: object) -> str:
    return spreadsheet_safe(cell_text(value))


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


def _write_rows(
    stream: TextIO, header: list[str], rows: Iterable[Mapping[str, object]], with_header: bool = True
) -> None:
    writer = csv.writer(stream)
    if with_header:
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


def _append_in_place(path: Path, header: list[str], rows: list[Mapping[str, object]]) -> None:
    """Append `rows` to the file (with `header` first when it is empty) in one write; a write that
    fails is undone by cutting the file back to its former length."""
    fd = os.open(path, os.O_RDWR | os.O_APPEND)
    try:
        size = os.lseek(fd, 0, os.SEEK_END)
        buffer = io.StringIO(newline="")
        if size and os.pread(fd, 1, size - 1) not in (b"\n", b"\r"):
            buffer.write("\r\n")  # a last line without its line break (an edit by hand) stays a line of its own
        _write_rows(buffer, header, rows, with_header=size == 0)
        data = memoryview(buffer.getvalue().encode("utf-8"))
        try:
            while data:  # unbuffered: what a full disk refused is not written again by a flush on the way out
                data = data[os.write(fd, data) :]
            os.fsync(fd)
        except BaseException:
            os.ftruncate(fd, size)  # the part that went in comes out: no half row for the next start to quarantine
            raise
    finally:
        os.close(fd)


def replace_file(path: Path, write: Callable[[Path], object]) -> None:
    """Replace the file (a symlink's target, keeping the link) by a complete new one that `write(tmp)` writes, with
    the same mode; a new file gets the mode the umask gives, as every file we write (one policy: the user's umask).
    A crash never leaves half a file: the new one is written beside it and renamed over it."""
    target = Path(os.path.realpath(path))
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp_path = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with contextlib.suppress(FileNotFoundError):
            os.fchmod(fd, stat.S_IMODE(os.stat(target).st_mode))
        os.close(fd)
        write(tmp_path)
        with open(tmp_path, "rb") as written:
            os.fsync(written.fileno())
        os.replace(tmp_path, target)
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        raise


def replace_bytes(path: Path, data: bytes) -> None:
    """Replace the file by one holding `data` (see replace_file)."""
    replace_file(path, lambda tmp: tmp.write_bytes(data))


def _write_atomically(path: Path, header: list[str], rows: Iterable[Mapping[str, object]]) -> None:
    replace_bytes(path, table_bytes(header, rows))


def append_row(path: str | os.PathLike, row: Mapping[str, object]) -> None:
    """Append `row` (column -> value) to the CSV at `path`, creating it and its folder if needed."""
    append_rows(path, [row])


def append_rows(path: str | os.PathLike, new_rows: Iterable[Mapping[str, object]]) -> None:
    """Append several rows in one write: after a crash either all of them are there or none."""
    path = Path(path)
    new_rows = list(new_rows)
    with _locked(path):
        header = _read_header(path)
        columns = list(dict.fromkeys([*header, *(col for row in new_rows for col in row)]))
        if path.exists() and (columns == header or path.stat().st_size == 0):
            _append_in_place(path, columns, new_rows)
        else:
            _, rows = read_table(path)
            _write_atomically(path, columns, [*rows, *new_rows])


def rewrite(path: str | os.PathLike, keep) -> int:
    """Keep only the rows for which `keep(row)` is true; returns how many were removed."""
    path = Path(path)
    with _locked(path):
        header, rows = read_table(path)
        kept = [row for row in rows if keep(row)]
        if len(kept) != len(rows):
            _write_atomically(path, header, kept)
        return len(rows) - len(kept)
