"""CSV files we write and read: LMDeploy-format CSVs appended to without ever misaligning, losing or half-writing a
row, the history's export (history.csv, written by store.history from its index), and the tables a page downloads.

An append (`append_rows`) holds an exclusive lock on a sidecar file, so two processes appending at once both land. A
row whose columns the file already has is appended in place, in one write (undone if it fails), so the file keeps its
identity: a user's CSV stays the same inode, with its mode, hard links and symlink. When the rows bring columns the
file lacks, the file gets the union header (existing columns first in their order, new ones after; missing cells
empty) by a rewrite into a temporary sibling renamed over the original, so a crash leaves the previous good file in
place; the rewrite keeps the file's mode and replaces a symlink's target, not the link.
Reading never pads or cuts a row: a record that is not a row of the header's columns (cut short by a crash, garbage,
an unterminated quote, bytes that are not UTF-8) is left out and counted (`read_rows`), and `read_table` refuses a
file holding one.
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
from pathlib import Path
from typing import TextIO

import pandas as pd
from filelock import FileLock, Timeout

from .errors import HistoryError

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


# A cell may quote a server's log (a failed run's error; one line of 200,000 characters was seen): the csv module's
# default limit of 131,072 characters per field would make such a row unreadable.
csv.field_size_limit(2**31 - 1)


def read_rows(path: str | os.PathLike) -> tuple[list[str], list[dict[str, str]], int]:
    """Header and rows of a CSV file, every cell as the string written, and how many of its records are not rows
    of the header's columns (cut short, garbled, not UTF-8): those are left out, never padded or cut to fit. After
    an unterminated quote, the rest of the file is one record that is not a row. Missing file: empty."""
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8-sig", errors="surrogateescape")
    except FileNotFoundError:
        return [], [], 0
    except OSError as exc:
        raise HistoryError(f"Cannot read {path}: {exc.strerror or exc}.") from exc
    header: list[str] | None = None
    rows, unreadable = [], 0
    try:
        for cells in csv.reader(io.StringIO(text, newline=""), strict=True):
            if not cells:
                continue
            if header is None:
                header = [spreadsheet_text(col) for col in cells]
            elif len(cells) != len(header) or not _is_utf8(cells):
                unreadable += 1
            else:
                rows.append(dict(zip(header, map(spreadsheet_text, cells))))
    except csv.Error:
        unreadable += 1
    if header is not None and not _is_utf8(header):
        return [], [], unreadable + len(rows) + 1
    return header or [], rows, unreadable


def _is_utf8(cells: list[str]) -> bool:
    """Whether the cells were UTF-8 in the file (read_rows decodes other bytes as lone surrogates)."""
    try:
        "".join(cells).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def read_table(path: str | os.PathLike) -> tuple[list[str], list[dict[str, str]]]:
    """Header and rows of a CSV file, every cell as the string written. Missing file: empty.
    A file with a record that is not a row is refused: rewriting it would make the damage permanent."""
    header, rows, unreadable = read_rows(path)
    if unreadable:
        raise HistoryError(
            f"{unreadable} line(s) of {path} are not rows of its {len(header)} columns "
            "(cut short, garbled or not UTF-8); nothing was written to it."
        )
    return header, rows


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


def append_in_place(path: Path, header: list[str], rows: Sequence[Mapping[str, object]]) -> None:
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
            os.ftruncate(fd, size)  # the part that went in comes out: no half row for the next reader
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
            append_in_place(path, columns, new_rows)
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
