"""Append rows to a CSV file without ever misaligning, losing or half-writing one.

Used for the run history and for LMDeploy-format CSVs alike, under an exclusive lock on a sidecar
file, so two processes appending at once both land. A row whose columns the file already has is
appended in place, in one write (undone if it fails), so the file keeps its identity: a user's CSV
stays the same inode, with its mode, hard links and symlink. When the rows bring columns the file
lacks, the file gets the union header (existing columns first in their order, new ones after;
missing cells empty) by a rewrite into a temporary sibling renamed over the original, so a crash
leaves the previous good file in place; the rewrite keeps the file's mode and replaces a symlink's
target, not the link.
"""

from __future__ import annotations

import contextlib
import csv
import io
import os
import secrets
import stat
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TextIO

from filelock import FileLock, Timeout

from .errors import HistoryError

LOCK_WAIT_S = 60  # how long a writer waits for another one to finish


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
        raise HistoryError(f"Another process kept {path} locked for {LOCK_WAIT_S} s ({lock_path}); "
                           "nothing was written.") from None
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


def _read_header(path: Path) -> list[str]:
    """The header of the CSV at `path` (empty when the file is missing or empty). Only the header
    is decoded: a damaged row further down does not stop an append."""
    try:
        with open(path, newline="", encoding="utf-8", errors="surrogateescape") as f:
            header = next((cells for cells in csv.reader(f) if cells), [])
    except FileNotFoundError:
        return []
    except csv.Error as exc:
        raise HistoryError(f"Cannot read the header of {path}: {exc}") from exc
    try:
        "".join(header).encode("utf-8")
    except UnicodeEncodeError:
        raise HistoryError(f"Cannot read the header of {path}: it is not UTF-8 text.") from None
    return header


def _cell(value: object) -> str:
    return "" if value is None else str(value)


def _write_rows(
    stream: TextIO, header: list[str], rows: Iterable[Mapping[str, object]], with_header: bool = True
) -> None:
    writer = csv.writer(stream)
    if with_header:
        writer.writerow(header)
    for row in rows:
        writer.writerow([_cell(row.get(col)) for col in header])


def table_bytes(header: list[str], rows: Iterable[Mapping[str, object]]) -> bytes:
    """The CSV text of `rows` under `header`, as a file download would hold it."""
    buffer = io.StringIO(newline="")
    _write_rows(buffer, header, rows)
    return buffer.getvalue().encode("utf-8")


def _append_in_place(path: Path, header: list[str], rows: list[Mapping[str, object]]) -> None:
    """Append `rows` to the file (with `header` first when it is empty) in one write; a write that
    fails is undone by cutting the file back to its former length."""
    with open(path, "a+b") as f:
        size = f.seek(0, os.SEEK_END)
        buffer = io.StringIO(newline="")
        if size and os.pread(f.fileno(), 1, size - 1) not in (b"\n", b"\r"):
            buffer.write("\r\n")  # a last line without its line break (an edit by hand) stays a line of its own
        _write_rows(buffer, header, rows, with_header=size == 0)
        try:
            f.write(buffer.getvalue().encode("utf-8"))
            f.flush()
            os.fsync(f.fileno())
        except BaseException:
            f.truncate(size)
            raise


def _write_atomically(path: Path, header: list[str], rows: Iterable[Mapping[str, object]]) -> None:
    """Replace the file (a symlink's target, keeping the link) by a complete new one with the same mode;
    a new file gets the mode the umask gives."""
    target = Path(os.path.realpath(path))
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp_path = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "w", newline="", encoding="utf-8") as f:
            with contextlib.suppress(FileNotFoundError):
                os.fchmod(f.fileno(), stat.S_IMODE(os.stat(target).st_mode))
            _write_rows(f, header, rows)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_path, target)
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        raise


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
