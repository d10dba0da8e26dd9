"""What a report of one ended run is made of, gathered from the run's record while this process holds it, else from
its history row and folder: the same parts the Run page reads, so the file shows what the page showed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ..config import SLO, RunConfig
from ..errors import HistoryError
from ..measure import metrics
from ..measure.window import steady_load
from .history import History, RunRecord, history_row


@dataclass(frozen=True)
class RunParts:
    run_id: str
    status: str
    message: str
    started_at: str
    config: RunConfig
    row: Mapping[str, Any]  # its history row: identity, settings, environment
    requests: pd.DataFrame | None  # None: it failed before measuring
    summary: Mapping[str, Any]  # recomputed from `requests` for the SLO asked
    duration_s: float
    values: Mapping[str, Any]  # the recorded summary (or row): telemetry's and the server's own figures
    telemetry: pd.DataFrame | None = None
    server_metrics: pd.DataFrame | None = None
    roofline: dict | None = None
    random_weights: bool = False
    warnings: Sequence[str] = field(default_factory=tuple)
    notes: Sequence[str] = field(default_factory=tuple)
    # (time_s, output tok/s, in flight) from the live tracker, which only a run in memory has.
    throughput: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None


@dataclass(frozen=True)
class RecordedRun:
    """Where an ended run's recorded parts are read: its RunRecord while this process holds it, else its history
    row and folder. Each part is read when asked for, so one that cannot be read (HistoryError) spoils only
    itself."""

    history: History
    run_id: str
    record: RunRecord | None = None

    def values(self) -> Mapping[str, Any]:
        """The recorded summary, else the history row ({} where the history has none)."""
        return self.record.metrics if self.record is not None else self.history.row(self.run_id) or {}

    def random_weights(self) -> bool:
        if self.record is not None:
            return self.record.model is not None and self.record.model.random_weights
        return self.values().get("model_random_weights") == "True"

    def telemetry(self) -> pd.DataFrame | None:
        return self.record.telemetry if self.record is not None else self.history.telemetry(self.run_id)

    def server_metrics(self) -> pd.DataFrame | None:
        return self.record.server_metrics if self.record is not None else self.history.server_metrics(self.run_id)

    def roofline(self) -> dict | None:
        return self.record.roofline if self.record is not None else self.history.roofline(self.run_id)


def run_parts(
    history: History,
    run_id: str,
    record: RunRecord | None = None,
    slo: SLO | None = None,
    warnings: Sequence[str] = (),
    notes: Sequence[str] = (),
    snapshot=None,
) -> RunParts:
    """The parts of run `run_id`: from `record` (its RunRecord, while this process holds it), else from `history`;
    goodput for `slo`, else for the SLO the run had. HistoryError when the history has no such run or cannot be
    read."""
    recorded = RecordedRun(history, run_id, record)
    if record is None:
        row = history.row(run_id)
        if row is None:
            raise HistoryError(f"There is no run {run_id} in {history.csv_path}.")
        config = history.config(run_id)
        requests = history.requests(run_id) if history.measured(run_id) else None
        status, message, started_at = row.get("status", ""), row.get("error", ""), row.get("started_at", "")
    else:
        config, requests = record.config, record.requests
        status, message, started_at = record.status, record.error, record.started_at
    values = recorded.values()
    duration_s = _float(values.get("duration_s"))
    summary = (
        {}
        if requests is None
        else metrics.run_summary(
            requests,
            duration_s,
            config.percentiles,
            config.load.stream_output,
            slo if metrics.slo_is_set(slo) else config.slo,
            steady_load(config),
        )
    )
    throughput = (
        None if snapshot is None else (snapshot.time_s, snapshot.output_tokens_per_s, snapshot.in_flight_over_time)
    )
    return RunParts(
        run_id,
        status,
        message,
        started_at,
        config,
        _typed_row(history, run_id, record),
        requests,
        summary,
        duration_s,
        values,
        recorded.telemetry(),
        recorded.server_metrics(),
        recorded.roofline(),
        recorded.random_weights(),
        tuple(warnings),
        tuple(notes),
        throughput,
    )


def _typed_row(history: History, run_id: str, record: RunRecord | None) -> dict[str, Any]:
    """The run's history row as History.load types it; a record's own row where the history could not keep it."""
    found = history.load(run_ids=[run_id])  # its row alone, where the whole table is not at hand
    if not found.empty:
        return found.iloc[0].to_dict()
    if record is None:
        raise HistoryError(f"There is no run {run_id} in {history.csv_path}.")
    return history_row(record)


def request_tables(
    history: History, runs: pd.DataFrame, names: Sequence[str]
) -> tuple[dict[str, pd.DataFrame], list[str]]:
    """The per-request tables of the history rows `runs`, by their `names`, and the names of those without one
    (imported LMDeploy rows, runs that failed before measuring)."""
    found, missing = {}, []
    for name, run_id in zip(names, runs["run_id"].astype(str)):
        try:
            found[name] = history.requests(run_id)
        except HistoryError:
            missing.append(name)
    return found, missing


def _float(cell: Any) -> float:
    try:
        return float(cell)
    except (TypeError, ValueError):
        return math.nan
