"""Every flag a run's numbers carry, as the sentences the Run page, the CLI and reports show and the tags the History
table shows: the machine was busy (contention.py), the client could not keep up (client_bound.py). One list, so that
each place that shows one shows them all."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from .client_bound import CLIENT_BOUND_RUNS, CLIENT_PREFIX, client_bound_runs, client_note, live_client_note
from .contention import BUSY_PREFIX, BUSY_RUNS, busy_note, busy_runs, live_busy_note

# Per flag, the column of a sweep point's count of runs it flagged, and the rule that flags each history row.
FLAGGED_RUNS = {BUSY_RUNS: busy_runs, CLIENT_BOUND_RUNS: client_bound_runs}
# Per flag, its tag: how its sentence starts.
FLAG_TAGS = {BUSY_RUNS: BUSY_PREFIX, CLIENT_BOUND_RUNS: CLIENT_PREFIX}
FLAG_TAGS_HELP = (
    f"{BUSY_PREFIX}: other processes kept the machine busy during the run, so its numbers are not the engine's alone. "
    f"{CLIENT_PREFIX}: the benchmark's client could not keep up, so the timings include its own delay. The run's page "
    "gives the numbers."
)


def run_flags(values: Mapping[str, Any], cpu_count: Any = None) -> list[str]:
    """The flags of a run from its summary or history row and the machine's core count; [] for a run not flagged."""
    return [note for note in (busy_note(values, cpu_count), client_note(values)) if note]


def live_run_flags(samples: pd.DataFrame | None, in_process: bool, in_workers: bool) -> list[str]:
    """The flags of a running run from its last minute of telemetry: an engine in this process is judged for a busy
    machine, a server run's client for keeping up (`in_workers`: config.client_in_workers), as the run's end judges
    them (store/history.run_metrics)."""
    note = live_busy_note(samples) if in_process else live_client_note(samples, in_workers)
    return [note] if note else []


def flag_tags(runs: pd.DataFrame) -> pd.Series:
    """Per history row: the tags of its flags (how their sentences start: "machine busy, client bound"), "" where not
    flagged; each flag's rule runs on the whole table at once. A table of runs shows these, and FLAG_TAGS_HELP says
    what they mean: a sentence per row filled the History table's width."""
    tags = pd.Series("", index=runs.index, dtype=object)
    for column, rule in FLAGGED_RUNS.items():
        flagged = rule(runs)
        tags[flagged] = tags[flagged].where(tags[flagged] == "", tags[flagged] + ", ") + FLAG_TAGS[column]
    return tags
