"""history.csv parsed once per change: its rows, indexed by run id, kept while the file holds the same bytes.

A year of runs is about 10,000 rows (14 MB), a second of parsing; the pages asked for it several times per
interaction and each CLI run twice. History keeps one `Snapshot` of the file: unchanged (same device, inode,
size, modification and change times) it is used as it is; changed, the file's bytes are read again (milliseconds)
and where they begin with the bytes the snapshot was parsed from (rows appended, by this process or another),
only the rows after them are parsed. Anything else (an edit by hand, a rewrite, a damaged row) goes through
the full read and its quarantine, as before.

A new process (each CLI command) starts from the sidecar `.history.index.json` beside the history: the size and
digest of the bytes last read clean, their header and run ids. It is a cache, never the source of truth: it
counts only for a file that begins with exactly those bytes, and rows are always parsed from the CSV.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from .. import csvstore
from .history_import import single_spelling

SIDECAR_FILE = ".history.index.json"
FileKey = tuple[int, int, int, int, int]


def file_key(path: Path) -> FileKey | None:
    """What changes whenever the file's content does (None where there is no file to read): an atomic rewrite is a
    new inode, an append a new size, an edit in place new times."""
    try:
        st = os.stat(path)
    except OSError:  # missing, or under a file: the read (or the write check) says so
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _sha1(data: bytes | memoryview):
    return hashlib.sha1(data, usedforsecurity=False)


@dataclass
class Snapshot:
    """The history as read from its first `size` bytes (whose digest is `digest`)."""

    file_header: list[str]  # as the file spells it, for the rows appended after
    header: list[str]  # each metric in its single spelling, as History reads it
    size: int
    digest: str
    run_ids: list[str]
    rows: list[dict[str, str]] | None  # None: known from the sidecar, not parsed by this process
    frame: pd.DataFrame | None = None  # History.load's typed table of these rows, once asked for
    earlier_frame: pd.DataFrame | None = None  # that of the first rows, before rows were appended
    key: FileKey | None = None  # the file's (file_key) when it held exactly these bytes; None: not known
    _positions: dict[str, int] | None = field(default=None, repr=False)

    @classmethod
    def parsed(cls, table: csvstore.CleanTable) -> Snapshot:
        header, rows = single_spelling(table.header, table.rows)
        return cls(
            table.header, header, len(table.data), _sha1(table.data).hexdigest(), [row["run_id"] for row in rows], rows
        )

    def row(self, run_id: str) -> dict[str, str] | None:
        """The first row of `run_id` (as a scan would find it); None when there is none."""
        if self._positions is None:
            self._positions = {}
            for position, row_id in enumerate(self.run_ids):
                self._positions.setdefault(row_id, position)
        position = self._positions.get(run_id)
        return None if position is None or self.rows is None else self.rows[position]

    def grown(self, data: bytes, keep: Callable[[dict[str, str]], bool]) -> Snapshot | None:
        """This snapshot with the rows `data` holds after the bytes it was read from; None unless `data` begins
        with those bytes, which hold a header, and every line after them is a row that `keep` keeps."""
        if not self.file_header or len(data) < self.size:
            return None
        hashed = _sha1(memoryview(data)[: self.size])
        if hashed.hexdigest() != self.digest:
            return None
        added = csvstore.rows_after(self.file_header, data[self.size :])
        if added is None or not all(map(keep, added)):
            return None
        if not added:
            return self
        _, added = single_spelling(self.file_header, added)
        hashed.update(memoryview(data)[self.size :])  # the digest of all of `data`, its first bytes hashed once
        return Snapshot(
            self.file_header,
            self.header,
            len(data),
            hashed.hexdigest(),
            [*self.run_ids, *(row["run_id"] for row in added)],
            None if self.rows is None else [*self.rows, *added],
            earlier_frame=self.frame if self.frame is not None else self.earlier_frame,
        )


def read_sidecar(path: Path) -> Snapshot | None:
    """The snapshot the sidecar at `path` describes, without rows; None when it is missing or not one."""
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
        snapshot = Snapshot(
            saved["file_header"], saved["header"], saved["size"], saved["digest"], saved["run_ids"], None
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
    fields = (snapshot.file_header, snapshot.header, snapshot.run_ids)
    if not isinstance(snapshot.size, int) or not all(isinstance(value, list) for value in fields):
        return None
    return snapshot


def write_sidecar(path: Path, snapshot: Snapshot) -> None:
    """Save the snapshot's description; a sidecar that cannot be written is no loss (the next start parses)."""
    text = json.dumps(
        {
            "size": snapshot.size,
            "digest": snapshot.digest,
            "file_header": snapshot.file_header,
            "header": snapshot.header,
            "run_ids": snapshot.run_ids,
        }
    )
    with contextlib.suppress(OSError):
        csvstore.replace_bytes(path, text.encode("utf-8"))
