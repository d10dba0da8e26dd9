"""Every flag a run's numbers carry, as the sentences the Run page, the History table, the CLI and reports show:
the machine was busy (contention.py), the client could not keep up (client_bound.py). One list, so that each place
that shows one shows them all."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from .client_bound import CLIENT_BOUND_RUNS, client_bound_runs, client_note, live_client_note
from .contention import BUSY_RUNS, busy_note, busy_runs, live_busy_note

# Per flag, the column of a sweep point's count of runs it flagged, and the rule that flags each history row.
FLAGGED_RUNS = {BUSY_RUNS: busy_runs, CLIENT_BOUND_RUNS: client_bound_runs}


def run_flags(values: Mapping[str, Any], cpu_count: Any = None) -> list[str]:
    """The flags of a run from its summary or history row and the machine's core count; [] for a run not flagged."""
    return [note for note in (busy_note(values, cpu_count), client_note(values)) if note]


def live_run_flags(samples: pd.DataFrame | None, in_process: bool, in_workers: bool) -> list[str]:
    """The flags of a running run from its last minute of telemetry: an engine in this process is judged for a busy
    machine, a server run's client for keeping up (`in_workers`: config.client_in_workers), as the run's end judges
    them (store/history.run_metrics)."""
    note = live_busy_note(samples) if in_process else live_client_note(samples, in_workers)
    return [note] if note else []


def flag_notes(runs: pd.DataFrame) -> pd.Series:
    """Per history row: its flags' sentences (`run_flags`, with the row's own core count), "" where not flagged. The
    rows are found by the flags' rules on the whole table first: a sentence per row of a long history took a second."""
    notes = pd.Series("", index=runs.index, dtype=object)
    flagged = pd.Series(False, index=runs.index)
    for rule in FLAGGED_RUNS.values():
        flagged |= rule(runs)
    for index, row in runs[flagged].iterrows():
        notes[index] = " ".join(run_flags(row, row.get("env_cpu_count")))
    return notes
