"""What a crash leaves in a results folder: temporary files of interrupted atomic writes, and run folders
without their history row (a crash before the row, a process killed while its run measured, a folder moved back
from `unsaved-results`). History.tidy recovers the folders it can and removes the rest.

A run in progress has such a folder too, from its first finished request to its row, for as long as it measures:
it holds the folder's lock (store.journal), so whatever its age, a folder is left over exactly when nobody holds
its lock, and the next start deals with it at once. Temporary files have no lock: one in progress is renamed into
place within seconds (a save waits at most a minute for the history's lock), so only those untouched for
STALE_AFTER_S count as left over.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

STALE_AFTER_S = 600.0
TMP_PATTERN = ".*.tmp"  # the names csvstore and history give their temporary files: .<file name>.<random>.tmp
DELETED_PREFIX = ".deleted-"  # a run folder History.delete moved out of the way, to remove
_RUN_FOLDER = re.compile(r"^[A-Za-z0-9]")  # a run's folder; the others (.deleted-*, a user's .git) are not runs


@dataclass
class Leftovers:
    tmp_files: list[Path] = field(default_factory=list)
    folders: list[Path] = field(default_factory=list)  # run folders without a history row
    deleted: list[Path] = field(default_factory=list)  # folders of deleted runs that a crash left


@dataclass
class Recovered:
    """What History.tidy made of the run folders without a row whose writer was gone."""

    rows: list[dict] = field(default_factory=list)  # to append to the history
    put_back: list[str] = field(default_factory=list)  # run ids whose row.json went back as it was
    journaled: list[str] = field(default_factory=list)  # recorded as cancelled from their journal
    rebuilt: list[str] = field(default_factory=list)  # rebuilt from a folder without row.json
    unusable: list[Path] = field(default_factory=list)  # folders that give nothing back, to remove


# What a row rebuilt from a folder without row.json (written before runs kept one) cannot have.
NOT_REBUILT = (
    "its duration is the last request's finish, not the measured one, so its throughputs read high; "
    "finished_at, load_seconds, warmup_seconds, cache_start, the engine_* columns, sweep_id and sweep_repeat stay "
    "empty"
)


def entries(folder: str | Path) -> list[os.DirEntry]:
    """What is in `folder`: os.scandir, where pathlib's glob and stat took a second over a year of run folders."""
    with os.scandir(folder) as entries:
        return list(entries)


def find(root: Path, runs_dir: Path, recorded: set[str], now: float | None = None) -> Leftovers:
    """The temporary files under `root` and in the run folders without a history row that have not changed for
    STALE_AFTER_S, the run folders whose name is not in `recorded` (whether their writer is gone is for
    FolderLock.claim to say), and the folders of deleted runs. A recorded folder holds none: its files are all written
    before its row."""
    cutoff = (time.time() if now is None else now) - STALE_AFTER_S
    leftovers = Leftovers()
    try:
        # Set arithmetic first: of a long history's folders, nearly all are recorded.
        unrecorded = sorted(
            (entry for entry in (entries(runs_dir) if runs_dir.is_dir() else []) if entry.name not in recorded),
            key=lambda entry: entry.name,
        )
        run_folders = [entry for entry in unrecorded if entry.is_dir()]
        leftovers.folders = [Path(folder.path) for folder in run_folders if _RUN_FOLDER.match(folder.name)]
        tmp_files = [
            *root.glob(TMP_PATTERN),
            *(
                Path(entry.path)
                for folder in leftovers.folders
                for entry in entries(folder)
                if fnmatch.fnmatchcase(entry.name, TMP_PATTERN)
            ),
        ]
        leftovers.tmp_files = [path for path in tmp_files if path.is_file() and path.stat().st_mtime < cutoff]
        # A delete renames a folder, then removes it; one whose delete is under way may still be renamed back.
        leftovers.deleted = [
            Path(folder.path)
            for folder in run_folders
            if folder.name.startswith(DELETED_PREFIX) and folder.stat().st_ctime < cutoff
        ]
    except FileNotFoundError:  # another process tidied or wrote in between: the next start looks again
        return Leftovers()
    return leftovers


def remove(paths: list[Path]) -> list[Path]:
    """Delete these files and folders; returns those that went (one that cannot go stays, for the next start)."""
    removed = []
    for path in paths:
        try:
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()
        except OSError:
            continue
        removed.append(path)
    return removed


def describe(runs_dir: Path, found: Recovered, removed: list[Path]) -> str:
    """One line saying what tidying did; empty when it did nothing."""
    parts = []
    if found.put_back:
        parts.append(
            f"put back {len(found.put_back)} run(s) missing from the history, as recorded (their "
            f"row.json in {runs_dir}): {', '.join(found.put_back)}"
        )
    if found.journaled:
        parts.append(
            f"recorded {len(found.journaled)} run(s) whose process was killed while they measured, as "
            f"cancelled with the requests their journal in {runs_dir} holds (their duration runs to the last "
            f"recorded request): {', '.join(found.journaled)}"
        )
    if found.rebuilt:
        parts.append(
            f"put back {len(found.rebuilt)} run(s) missing from the history, rebuilt from older folders "
            f"in {runs_dir} without row.json ({NOT_REBUILT}): {', '.join(found.rebuilt)}"
        )
    if removed:
        parts.append(f"removed {len(removed)} leftover(s) of interrupted writes: {', '.join(map(str, removed))}")
    return ("Tidying the results: " + "; ".join(parts) + ".") if parts else ""
