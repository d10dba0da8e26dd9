"""Every flag a run's numbers carry, as the sentences the Run page, the History table, the CLI and reports show:
the machine was busy (contention.py), the client could not keep up (client_bound.py). One list, so that each place
that shows one shows them all."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from .client_bound import client_note
from .contention import busy_note


def run_flags(values: Mapping[str, Any], cpu_count: Any = None) -> list[str]:
    """The flags of a run from its summary or history row and the machine's core count; [] for a run not flagged."""
    return [note for note in (busy_note(values, cpu_count), client_note(values)) if note]


def flag_notes(runs: pd.DataFrame) -> pd.Series:
    """Per history row: its flags' sentences (`run_flags`, with the row's own core count), "" where not flagged."""
    return pd.Series(
        [" ".join(run_flags(row, row.get("env_cpu_count"))) for _, row in runs.iterrows()],
        index=runs.index,
        dtype=object,
    )
