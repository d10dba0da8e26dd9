"""What the Run page shows for a run that has ended, whether it is still in memory or only in the history.

A run submitted in this server process is read from its `Run` (its record, warnings, notes); a run that
ended before the server restarted is rebuilt from the history: its row, config.json and
requests.parquet. Both give one `RunResult`, so the finished view has a single code path. No streamlit
here: this is plain data loading, testable on its own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from bench_core.config import SLO, RunConfig
from bench_core.errors import HistoryError
from bench_core.hardware.run_flags import run_flags
from bench_core.measure import metrics
from bench_core.measure.live_snapshot import LiveSnapshot
from bench_core.measure.window import steady_load
from bench_core.run.runner import Run
from bench_core.states import RunState
from bench_core.store.history import History, lmdeploy_row_of


@dataclass
class RunResult:
    """An ended run: settings, per-request table and LMDeploy's CSV row, ready to summarise."""

    run_id: str
    status: str
    config: RunConfig
    requests: pd.DataFrame | None  # None when the run failed before measuring
    duration_s: float
    lmdeploy_row: dict
    message: str = ""
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # about the dataset, e.g. a truncated file that was recovered
    # Only while the run is in memory: the live tracker's series give tokens/s over time.
    snapshot: LiveSnapshot | None = None
    # Only when rebuilt from the history: its row, as History.row read it.
    history_row: dict | None = None
    # Why its numbers are not the engine's alone (hardware/run_flags.py: a busy machine, a client that could not keep
    # up): each flag's sentence.
    flags: list[str] = field(default_factory=list)
    cache_start: str = ""  # the prefix cache's state when the clock started; "" where not recorded

    def summary(self, slo: SLO | None) -> dict:
        """The run's summary recomputed from its per-request table, with goodput for `slo`."""
        cfg = self.config
        return metrics.run_summary(
            self.requests, self.duration_s, cfg.percentiles, cfg.load.stream_output, slo, steady_load(cfg)
        )


def result_from_run(run: Run) -> RunResult | None:
    """The result of an ended in-memory run; None when nothing was recorded (cancelled before measuring)."""
    measurement = run.measurement
    record = measurement.record
    if record is None:
        return None
    return RunResult(
        run_id=run.run_id,
        status=record.status,
        config=record.config,
        requests=record.requests,
        duration_s=float(record.metrics.get("duration_s", math.nan)),
        lmdeploy_row=dict(record.lmdeploy_columns),
        message=run.message,
        warnings=[*measurement.warnings, *filter(None, [measurement.save_error])],
        notes=list(measurement.sample.notes) if measurement.sample is not None else [],
        snapshot=run.snapshot(),
        flags=run_flags(record.metrics, record.environment.get("cpu_count")),
        cache_start=record.cache_start,
    )


def result_from_history(history: History, run_id: str) -> RunResult:
    """Rebuild an ended run from the history; HistoryError when the run is not there or lacks its table."""
    row = history.row(run_id)
    if row is None:
        raise HistoryError(f"There is no run {run_id} in this server's runs or in {history.csv_path}.")
    status = row.get("status", "")
    return RunResult(
        run_id=run_id,
        status=status,
        config=history.config(run_id),
        requests=None if status == RunState.FAILED and not history.measured(run_id) else history.requests(run_id),
        duration_s=_float(row.get("duration_s")),
        lmdeploy_row=lmdeploy_row_of(row),
        message=row.get("error", ""),
        history_row=row,
        flags=run_flags(row, row.get("env_cpu_count")),
        cache_start=row.get("cache_start", ""),
    )


def _float(cell: str | None) -> float:
    try:
        return float(cell)
    except (TypeError, ValueError):
        return math.nan
