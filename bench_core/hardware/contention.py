"""Whether other processes held the machine's CPU during a run, so that its numbers are not the engine's alone.

The telemetry (telemetry.py) samples on one clock, at the same instants: the CPU cores used by the process that
runs the engine (`process`), by the process that follows it from another one where there is one (`caller`), the
machine's busy share of all its cores, and (once) how many cores it has. At each sample

    others = machine busy cores - ours (process + caller), never below 0

and the instant is *saturated by others* when the machine is at least SATURATED_PERCENT busy AND others hold at
least OTHERS_SHARE of its cores: the engine could not have had more CPU, because strangers had it. A run is flagged
"machine busy" when such instants cover at least FLAGGED_SHARE of its measured window. A sample's CPU time is
counted over the interval since the one before, so each sample weighs its interval: shares are of time. A mean
alone would hide a hog that ran for half the run, and would flag an engine that is simply busy on its own.

What "ours" is:
- a run in this process (the CLI, the embedded engine): the process is the engine and its client together;
- the dashboard's engine worker (run/engine_process.py): the worker, plus the dashboard that started it
  (`caller`): its page redraws are our cost, not a stranger's;
- a server run: the engine is the server's process, which we do not sample and which may well be on this machine,
  so its own work would count as "others": a false claim. Server runs are not judged (run_metrics leaves the
  columns out), and their rows read as not measured, never as "not busy".
Pure functions of the samples table or of a summary / history row.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from ..measure.catalog import METRICS, telemetry_columns
from .telemetry import CALLER, CPU_CORES, CPU_COUNT, CPU_PERCENT, MACHINE, PROCESS, interval_weights

SATURATED_PERCENT = 90.0  # the machine's CPU at least this busy ...
OTHERS_SHARE = 0.5  # ... with other processes holding at least this share of its cores ...
FLAGGED_SHARE = 0.25  # ... for at least this share of the run: flagged
BUSY_PREFIX = "machine busy"  # how every flag's sentence starts, wherever it is shown
BUSY_RUNS = "busy_runs"  # a sweep point's runs that were flagged (sweep/results.py): its charts mark the point
OTHER_CORES_COLUMN = METRICS["other_cpu_cores"].column()
BUSY_SHARE_COLUMN = METRICS["machine_busy_share"].column()
NOT_JUDGED = {"mean_other_cpu_cores": None, "machine_busy_share": None}


def contention_summary(samples: pd.DataFrame, start_s: float, end_s: float) -> dict[str, float | None]:
    """Other processes' mean CPU cores over [start_s, end_s] and the share of that window the machine was saturated
    by them (the module's rule); None each where the samples cannot tell (no core count, no engine or machine CPU
    samples inside the window): no telemetry is no claim either way."""
    counted = samples.loc[(samples["source"] == MACHINE) & (samples["metric"] == CPU_COUNT), "value"]
    cores = float(counted.iloc[0]) if len(counted) else 0.0
    cpu = samples[samples["metric"].isin([CPU_CORES, CPU_PERCENT])]
    if cores <= 0 or cpu.empty:
        return dict(NOT_JUDGED)
    # pivot_table's result (the last value per instant and source, time-sorted) at a quarter of its cost: this runs at
    # every live refresh of the Run page.
    by_time = cpu.groupby(["time_s", "source"])["value"].last().dropna().unstack()
    if MACHINE not in by_time or PROCESS not in by_time:
        return dict(NOT_JUDGED)
    machine, ours = by_time[MACHINE].to_numpy(), by_time[PROCESS].to_numpy()
    if CALLER in by_time:
        ours = ours + by_time[CALLER].fillna(0.0).to_numpy()
    others = np.clip(machine / 100.0 * cores - ours, 0.0, None)
    # Sample i covers (t[i-1], t[i]]: its part inside the window is its weight; an instant without both the
    # machine's and the engine's CPU (the engine's first sample has no interval behind it) says nothing.
    times = by_time.index.to_numpy(dtype=float)
    weights = interval_weights(times, start_s, end_s)
    known = ~np.isnan(others[1:])
    weights = np.where(known, weights, 0.0)
    covered = float(weights.sum())
    if covered <= 0:
        return dict(NOT_JUDGED)
    others = np.nan_to_num(others[1:])
    saturated = (np.nan_to_num(machine[1:]) >= SATURATED_PERCENT) & (others >= OTHERS_SHARE * cores)
    return {
        "mean_other_cpu_cores": float(np.sum(others * weights) / covered),
        "machine_busy_share": float(np.sum(weights[saturated]) / covered),
    }


def live_busy_note(samples: pd.DataFrame | None) -> str | None:
    """The flag's sentence for a running run, from the samples of its last minute (LiveSnapshot.telemetry); None
    where they do not flag it."""
    if samples is None or samples.empty:
        return None
    summary = contention_summary(samples, float(samples["time_s"].min()), float(samples["time_s"].max()))
    cores = samples.loc[(samples["source"] == MACHINE) & (samples["metric"] == CPU_COUNT), "value"]
    return busy_note(telemetry_columns(summary), cores.iloc[0] if len(cores) else None, "the last minute")


def machine_busy(busy_share: Any) -> bool:
    """Whether a run's share of time saturated by others (a number, a cell, NaN or None) flags it."""
    number = as_number(busy_share)
    return not math.isnan(number) and number >= FLAGGED_SHARE


def busy_runs(runs: pd.DataFrame) -> pd.Series:
    """Per history row: flagged "machine busy" (False for rows without the column: runs recorded before it, server
    runs, imported rows)."""
    if BUSY_SHARE_COLUMN not in runs:
        return pd.Series(False, index=runs.index)
    return pd.to_numeric(runs[BUSY_SHARE_COLUMN], errors="coerce").fillna(0.0) >= FLAGGED_SHARE


def busy_note(values: Mapping[str, Any], cpu_count: Any = None, during: str = "this run") -> str | None:
    """The flag as one sentence with its numbers, from a summary or history row and the machine's core count
    (its environment's `cpu_count`); None for a run that is not flagged or was not judged."""
    if not machine_busy(values.get(BUSY_SHARE_COLUMN)):
        return None
    other, share, cores = (
        as_number(values.get(OTHER_CORES_COLUMN)),
        as_number(values.get(BUSY_SHARE_COLUMN)),
        as_number(cpu_count),
    )
    of_cores = f" of {cores:g}" if cores > 0 else ""
    return (
        f"{BUSY_PREFIX}: other processes used {other:.1f}{of_cores} CPU cores during {during} and saturated the "
        f"machine {share:.0%} of the time: its numbers are not the engine's alone."
    )


def as_number(value: Any) -> float:
    """A summary value or history cell as a float; NaN where it is none (None, "", text)."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan
