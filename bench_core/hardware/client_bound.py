"""Whether the benchmark's own client kept up with a server run, so that its numbers are the server's.

Two things say it did not, each read from the run's telemetry (telemetry.py) over its measured window:
- the client's event loop woke late (engines/loop_lag.py, source CLIENT_LOOP): a chunk that arrived meanwhile waited
  as long before it was timestamped, so its ITL and TTFT carry the client's delay, and sends due then went late;
  flagged when the mean lateness is at least LAG_LIMIT_MS;
- a client process used at least SATURATED_CORES, one Python thread's worth of CPU, which is all its event loop can
  have: flagged when the busiest one did for at least SATURATED_SHARE of the window, weighing each sample by its
  interval as contention.py does. The client's processes are this one (the `process` source), and, where it sends
  from worker processes (engines/client_workers.py), those (`client_worker0`, ...) too: they read the streams, and
  this one merges their events and counts each answer's tokens. A worker at a full core is as much the limit as one
  process at a full core: spreading the load over N processes helps only while each has CPU to spare.
The limits are chosen, not derived: 10 ms late is as long as a fast server's whole ITL, and a client at one core for
half the run had nothing left for the load it was asked to send. A run flagged "client bound" says how to spread the
load (SPREAD_ADVICE). Engines in this process have no client loop and are not judged here (contention.py judges
them). Pure functions of the samples table or of a summary / history row.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pandas as pd

from ..measure.catalog import METRICS, telemetry_columns
from .contention import as_number
from .telemetry import CLIENT_WORKER, CPU_CORES, PROCESS, interval_weights, loop_lag_summary, time_weighted_mean

LAG_LIMIT_MS = 10.0  # the client's loop at least this late on average ...
SATURATED_CORES = 0.9  # ... or its process at this much CPU or more ...
SATURATED_SHARE = 0.5  # ... for at least this share of the run: flagged
CLIENT_PREFIX = "client bound"  # how the flag's sentence starts, wherever it is shown
SPREAD_ADVICE = "spread the load over more client processes (restful --client-processes N)"
CLIENT_BOUND_RUNS = "client_bound_runs"  # a sweep point's runs flagged so (sweep/results.py): its charts mark it
LAG_COLUMN = METRICS["mean_loop_lag_ms"].column()
CLIENT_CORES_COLUMN = METRICS["client_cpu_cores"].column()
SATURATED_COLUMN = METRICS["client_saturated_share"].column()


NOT_JUDGED = {"mean_client_cpu_cores": None, "client_saturated_share": None}
_WORKER_SOURCE = "^" + CLIENT_WORKER.format(r"\d+") + "$"


def client_summary(
    samples: pd.DataFrame, start_s: float, end_s: float, in_workers: bool = False
) -> dict[str, float | None]:
    """The client's mean CPU cores over [start_s, end_s], all its processes together, and the share of the window
    its busiest process used at least SATURATED_CORES; the client is this process, with its worker processes where
    `in_workers` (config.client_in_workers). None each without their CPU samples in the window (a worker run
    recorded before the workers were sampled: this process alone is not the client)."""
    cpu = samples[samples["metric"] == CPU_CORES]
    workers = cpu["source"].str.match(_WORKER_SOURCE)
    if in_workers and not workers.any():
        return dict(NOT_JUDGED)
    # The sampler reads every process at one instant: a row per instant, a column per client process.
    by_time = cpu[(cpu["source"] == PROCESS) | (workers & in_workers)].groupby(["time_s", "source"])["value"]
    by_time = by_time.last().unstack()
    if len(by_time) < 2:
        return dict(NOT_JUDGED)
    times = by_time.index.to_numpy(dtype=float)
    weights = interval_weights(times, start_s, end_s)
    covered = float(weights.sum())
    if covered <= 0:
        return dict(NOT_JUDGED)
    means = [time_weighted_mean(times, by_time[source].to_numpy(), start_s, end_s) for source in by_time]
    busiest = by_time.max(axis=1).to_numpy()[1:]  # NaN only where no client process was read: not saturated
    return {
        "mean_client_cpu_cores": float(sum(m for m in means if m is not None)),
        "client_saturated_share": float(weights[busiest >= SATURATED_CORES].sum() / covered),
    }


def client_bound(values: Mapping[str, Any]) -> bool:
    """Whether a summary or history row's loop lag or client CPU flags the run (NaN, None, absent: not flagged)."""
    return bool(_flagged(as_number(values.get(LAG_COLUMN)), as_number(values.get(SATURATED_COLUMN))))


def _flagged(lag_ms, saturated_share):
    """The rule, on numbers or on columns of them alike (NaN: not flagged)."""
    return (lag_ms >= LAG_LIMIT_MS) | (saturated_share >= SATURATED_SHARE)


def live_client_note(samples: pd.DataFrame | None, in_workers: bool) -> str | None:
    """The flag's sentence for a running run, from the samples of its last minute (LiveSnapshot.telemetry): its
    client processes' CPU and, where the loop is in the engine's process, its lateness (worker processes hand theirs
    over at the run's end); None where they do not flag it."""
    if samples is None or samples.empty:
        return None
    start_s, end_s = float(samples["time_s"].min()), float(samples["time_s"].max())
    summary = {**client_summary(samples, start_s, end_s, in_workers), **loop_lag_summary(samples, start_s, end_s)}
    return client_note(telemetry_columns(summary), "the last minute")


def client_bound_runs(runs: pd.DataFrame) -> pd.Series:
    """Per history row: flagged "client bound" by `client_bound`'s rule, for all rows at once (False for rows without the columns: runs recorded
    before them, engines in this process, imported rows)."""

    def numbers(column: str) -> pd.Series:
        return pd.to_numeric(runs[column], errors="coerce") if column in runs else pd.Series(math.nan, index=runs.index)

    return _flagged(numbers(LAG_COLUMN), numbers(SATURATED_COLUMN))


def client_note(values: Mapping[str, Any], during: str = "this run") -> str | None:
    """The flag as one sentence with its numbers, from a summary or history row; None for a run not flagged."""
    if not client_bound(values):
        return None
    lag, share = as_number(values.get(LAG_COLUMN)), as_number(values.get(SATURATED_COLUMN))
    said = []
    if not math.isnan(lag):
        said.append(f"its event loop woke {lag:.1f} ms late on average (limit {LAG_LIMIT_MS:g} ms)")
    if not math.isnan(share):
        said.append(f"its busiest process used {SATURATED_CORES:g} cores or more {share:.0%} of the time")
    return (
        f"{CLIENT_PREFIX}: the benchmark's client could not keep up during {during}: {' and '.join(said)}, so "
        f"the timings include the client's own delay and the server may have had more to give; {SPREAD_ADVICE}."
    )
