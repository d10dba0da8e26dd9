"""A run's journal and its writer's lock: what lets the next start tell a run still being written from one whose
process died, and record what the dead one had measured.

While a run measures, the process that will record it appends the requests that finish to
`runs/<id>/journal.jsonl`, one JSON line per batch (the runner publishes a batch every quarter second), after a
first line with what a row needs besides them: the settings, the engine, the machine, the load time and the
clock's start. Each line is flushed to the file (not synced): a killed process loses nothing it wrote, a crash
of the machine at most the last lines, and a line cut short is skipped. When the run is recorded its folder gets
its files and `row.json` (the history row, cell for cell), then its row; the journal is removed.

A writer holds `runs/<id>/.writing` locked (flock) from the journal's start, or from the folder's first file,
to its row: the kernel releases the lock when the process ends, SIGKILL included. So a folder without a row is
a run in progress exactly when its lock is held, whatever its age; the one who takes the lock of a folder
(`FolderLock.claim`) knows its writer is gone. Locks live on the folder's file system: on a network one shared
by several machines, flock needs its server's lock support (NFSv4 has it).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from pathlib import Path
from typing import Any

from ..measure.profiler import Session

JOURNAL_FILE = "journal.jsonl"
LOCK_FILE = ".writing"
_SESSION_FIELDS = tuple(name for name in Session.__slots__ if name not in ("ts", "ns"))  # kept as JSON lists


class FolderLock:
    """The lock of a run folder's writer (see the module's docstring); `release` when done."""

    def __init__(self, fd: int, path: Path):
        self.fd, self.path = fd, path

    @classmethod
    def hold(cls, folder: Path) -> FolderLock:
        """Make the folder and lock it, waiting while a start that tidies holds it (a moment)."""
        while True:
            folder.mkdir(parents=True, exist_ok=True)
            lock = cls._locked(folder, fcntl.LOCK_EX)
            if lock is not None:
                return lock

    @classmethod
    def claim(cls, folder: Path) -> FolderLock | None:
        """The lock of a folder whose writer is gone; None while a live process holds it (or the folder went)."""
        try:
            return cls._locked(folder, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except (BlockingIOError, FileNotFoundError, NotADirectoryError):
            return None

    @classmethod
    def _locked(cls, folder: Path, how: int) -> FolderLock | None:
        """The folder's lock taken, or None where the lock file was removed (its folder tidied away) meanwhile."""
        path = folder / LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, how)
            if os.path.exists(path) and os.path.samestat(os.fstat(fd), os.stat(path)):
                return cls(fd, path)
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
        return None

    def release(self) -> None:
        """Take the lock file away (whoever locks the folder next makes a new one), then unlock."""
        if self.fd < 0:
            return
        self.path.unlink(missing_ok=True)
        os.close(self.fd)
        self.fd = -1


class RunJournal:
    """The journal of one run as it measures (see the module's docstring); holds its folder's lock."""

    def __init__(self, folder: Path, header: dict[str, Any]):
        self.folder = folder
        self.lock = FolderLock.hold(folder)
        try:
            self._file = open(folder / JOURNAL_FILE, "a", encoding="utf-8")
            self._write(header)
        except BaseException:
            self.lock.release()
            raise

    def add(self, finished: dict[int, Session]) -> None:
        """Append the requests that finished since the last call."""
        self._write({"requests": {str(index): session_state(session) for index, session in finished.items()}})

    def _write(self, line: dict[str, Any]) -> None:
        self._file.write(json.dumps(line, default=str) + "\n")
        self._file.flush()

    def end(self) -> FolderLock:
        """Stop writing; the file stays until the run's row is in. The lock is still held: the caller's."""
        with contextlib.suppress(OSError):  # a full disk refusing the last flush: the record says what it measured
            self._file.close()
        return self.lock


def read_journal(folder: Path) -> tuple[dict[str, Any], dict[int, Session]] | None:
    """The journal's first line and the requests it recorded as finished; None without a readable first line."""
    try:
        lines = (folder / JOURNAL_FILE).read_text(encoding="utf-8").splitlines()
        header = json.loads(lines[0])
    except (OSError, ValueError, IndexError):
        return None
    finished: dict[int, Session] = {}
    for line in lines[1:]:
        try:
            batch = json.loads(line)["requests"]
            finished.update({int(index): session_from_state(state) for index, state in batch.items()})
        except (ValueError, KeyError, TypeError):  # a line the kill cut short: the last one
            continue
    return header, finished


def session_state(session: Session) -> dict[str, Any]:
    """A finished session as plain JSON values."""
    return {
        "ts": list(session.ts),
        "ns": list(session.ns),
        **{name: getattr(session, name) for name in _SESSION_FIELDS},
    }


def session_from_state(state: dict[str, Any]) -> Session:
    session = Session(state["input_len"], state["req_output_len"])
    for name in _SESSION_FIELDS:
        setattr(session, name, state[name])
    session.ts, session.ns = state["ts"], state["ns"]
    session.pack_ticks()
    return session
