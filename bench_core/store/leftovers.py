"""What a crash leaves in a results folder: temporary files of interrupted atomic writes, and run folders
that never got their history row. History.tidy recovers the folders it can and removes the rest.

A run in progress writes the same things (its folder, then temporary files renamed into place, then its row),
so only what has not changed for STALE_AFTER_S counts as left over. A save takes seconds, and waits at
most a minute for the history's lock; a run's folder is written only when the run has ended, so a long
benchmark still running elsewhere has no folder yet. Ten minutes leaves a wide margin and still cleans up
at the next start after a crash.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

STALE_AFTER_S = 600.0
TMP_PATTERN = ".*.tmp"  # the names csvstore and history give their temporary files: .<file name>.<random>.tmp


@dataclass
class Leftovers:
    tmp_files: list[Path] = field(default_factory=list)
    folders: list[Path] = field(default_factory=list)  # run folders without a history row


def _last_change(path: Path) -> float:
    """The newest modification time of a file, or of a folder and what is directly in it."""
    times = [path.stat().st_mtime]
    if path.is_dir():
        times += [child.stat().st_mtime for child in path.iterdir()]
    return max(times)


def _entries(folder: str | Path) -> list[os.DirEntry]:
    """What is in `folder`: os.scandir, where pathlib's glob and stat took a second over a year of run folders."""
    with os.scandir(folder) as entries:
        return list(entries)


def find(root: Path, runs_dir: Path, recorded: set[str], now: float | None = None) -> Leftovers:
    """The temporary files under `root` and its run folders, and the run folders whose name is not in `recorded`,
    that have not changed for STALE_AFTER_S."""
    cutoff = (time.time() if now is None else now) - STALE_AFTER_S
    leftovers = Leftovers()
    try:
        run_folders = sorted((entry for entry in (_entries(runs_dir) if runs_dir.is_dir() else []) if entry.is_dir()),
                             key=lambda entry: entry.name)
        tmp_files = [*root.glob(TMP_PATTERN), *(Path(entry.path) for folder in run_folders
                                               for entry in _entries(folder.path)
                                               if fnmatch.fnmatchcase(entry.name, TMP_PATTERN))]
        leftovers.tmp_files = [path for path in tmp_files if path.is_file() and _last_change(path) < cutoff]
        leftovers.folders = [Path(folder.path) for folder in run_folders if folder.name not in recorded
                             and _last_change(Path(folder.path)) < cutoff]
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


def describe(runs_dir: Path, recovered: list[str], removed: list[Path]) -> str:
    """One line saying what tidying did; empty when it did nothing."""
    parts = []
    if recovered:
        parts.append(f"put back {len(recovered)} run(s) a crash had left out of the history, rebuilt from "
                     f"{runs_dir}: {', '.join(recovered)}")
    if removed:
        parts.append(f"removed {len(removed)} leftover(s) of interrupted writes: {', '.join(map(str, removed))}")
    return ("After a crash: " + "; ".join(parts) + ".") if parts else ""
