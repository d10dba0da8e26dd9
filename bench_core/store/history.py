"""The run history: one CSV row per run, a folder per run, and import of LMDeploy's own CSVs.

`<root>/history.csv` starts with the columns LMDeploy's `Profiler.save_csv` writes, in its order, each
metric under the catalog's single spelling (`duration_s`, `mean_e2e_ms`: full floats; LMDeploy's names and
formats are only in its own export, `lmdeploy_row`); then run identity, every setting, the profiler's
other metrics, the engine (`engine_*`) and the machine (`env_*`). Files written when the history kept
LMDeploy's spellings beside ours read as if they had one (history_import.single_spelling).
Every write goes through `csvstore`: atomic, locked, union header.
`<root>/runs/<run_id>/` holds `config.json`, `environment.json`, `requests.parquet` and `row.json` (the row, cell
for cell), written before the CSV row so that a row never points at a folder that is not there, and so that a
folder whose row is missing (a crash in between, or a folder moved back from `unsaved-results`) gets exactly its
row back. While a run measures, its folder holds its journal (store.journal): the requests finished so far.
Every read goes through one check (`_read`): a history without its key columns is refused, and rows that do
not parse are moved, as written, to `<root>/history.quarantine.csv`. What it read is kept, indexed by run id,
until the file changes (history_index). `tidy` also puts back the runs a crash left out of the CSV, records the
runs a killed process left in their journal, and removes half-written leftovers (see history_leftovers); what it
did is in `notices`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import secrets
import shutil
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from .. import csvstore
from ..config import SETTINGS, RunConfig, applied_engine_settings, client_in_workers
from ..engines import backend
from ..engines import server_metrics as server_samples
from ..engines.base import EngineInfo
from ..errors import HistoryError
from ..hardware.client_bound import client_summary
from ..hardware.contention import contention_summary
from ..hardware.telemetry import telemetry_summary
from ..measure import metrics
from ..measure.catalog import lmdeploy_row, server_columns, telemetry_columns
from ..measure.profiler import Session, rebuilt_profiler
from ..models.resolve import ModelRecord, describe_model
from ..redact import redact
from ..states import IMPORTED, RunState, measured_state
from . import leftovers as history_leftovers
from .history_import import (
    HISTORY_LEAD_COLUMNS,
    HISTORY_SOURCE,
    NUMBER_COLUMNS,
    SAVE_CSV_HYPERPARAMS,
    check_numbers,
    is_number,
    lmdeploy_hyperparams,
    parse_import,
)
from .history_index import SIDECAR_FILE, Snapshot, file_key, read_sidecar, write_sidecar
from .journal import JOURNAL_FILE, FolderLock, RunJournal, read_journal

RESULTS_ENV = "BENCH_STUDIO_RESULTS"
_RUN_ID_MAX = 100  # characters; a run id names a folder, and file names end at 255 bytes
_RUN_ID = re.compile(rf"^[A-Za-z0-9][A-Za-z0-9_.-]{{0,{_RUN_ID_MAX - 1}}}\Z")
_RUN_ID_RULE = f"run ids are 1 to {_RUN_ID_MAX} letters, digits, '-', '_' and '.', starting with a letter or digit"
# Columns kept as text even when their cells look numeric: names, times and versions ("12.10" is not 12.1).
_TEXT_COLUMNS = {
    "run_id",
    "started_at",
    "finished_at",
    "imported_at",
    "recovered_at",
    "status",
    "label",
    "source",
    "source_file",
    "error",
    "sweep_id",
    "percentiles",
    "failure_reasons",
    "output_len_sources",
    *(setting.key for setting in SETTINGS if setting.kind is str),
}
ENVIRONMENT_PREFIX = "env_"  # a run's environment.json keys, as history columns
_TEXT_PREFIXES = (ENVIRONMENT_PREFIX, "engine_")
_MISSING_CELLS = {"", "-"}
_NUMBER_TYPES = {np.dtype("int64"), np.dtype("float64")}  # what pd.to_numeric makes of a column
REQUESTS_FILE = "requests.parquet"
TELEMETRY_FILE = "telemetry.parquet"
SERVER_METRICS_FILE = "server_metrics.parquet"
ROOFLINE_FILE = "roofline.json"
CONFIG_FILE = "config.json"
ENVIRONMENT_FILE = "environment.json"
ROW_FILE = "row.json"
# The columns without which rows cannot be told apart: every row from every path (runs, LMDeploy imports,
# imported histories) has them, and delete, compare and the run folders are keyed by them.
KEY_COLUMNS = ("run_id",)
QUARANTINE_FILE = "history.quarantine.csv"


@dataclass
class RunRecord:
    """Everything the history keeps about one run; built by the runner when the run ends."""

    run_id: str
    started_at: str  # ISO 8601, local time with its UTC offset
    status: str  # "finished" | "partial" (some requests failed) | "failed" (none succeeded, or before measuring) | "cancelled"
    config: RunConfig
    # LMDeploy's save_csv row as the Profiler formats it, hyperparameters first: for its export, not the history.
    lmdeploy_columns: dict[str, Any] = field(default_factory=dict)
    # Flat summary from the Profiler, written under exactly these keys.
    metrics: dict[str, Any] = field(default_factory=dict)
    engine_info: EngineInfo | None = None
    environment: dict[str, str] = field(default_factory=dict)
    # The profiler's request table: one row per request, with `itl_s` as a list of floats.
    requests: pd.DataFrame | None = None
    error: str = ""
    finished_at: str = ""
    load_seconds: float | None = None  # sampling, loading or reusing the engine, warm-up: before the measured run
    warmup_seconds: float | None = None  # the warm-up requests' part of it; None: none were sent
    sweep_id: str = ""
    sweep_repeat: int | None = None  # the run's 0-based repeat index within its sweep point
    model: ModelRecord | None = None  # where the model came from; random weights are labelled on the pages
    telemetry: pd.DataFrame | None = None  # hardware samples (telemetry.py's table), time_s since the start
    server_metrics: pd.DataFrame | None = None  # the server's raw /metrics samples (server_metrics.py), time_s too
    roofline: dict | None = None  # roofline.roofline_record, or {"unavailable": why}
    recovered_at: str = ""  # when a start rebuilt the run from what its folder held (History.tidy)


def new_run_id() -> str:
    """Sortable by start time and readable, e.g. 20261130-081530-ab12."""
    return f"{datetime.now():%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


def local_now_iso() -> str:
    """Now as ISO 8601 in local time with its offset, the form `started_at` uses."""
    return datetime.now().astimezone().isoformat(timespec="seconds")


class History:
    """The history under `root` (default: $BENCH_STUDIO_RESULTS, else ./results)."""

    def __init__(self, root: str | os.PathLike | None = None):
        self.root = Path(root or os.environ.get(RESULTS_ENV) or "results")
        self.csv_path = self.root / "history.csv"
        self.quarantine_path = self.root / QUARANTINE_FILE
        self.runs_dir = self.root / "runs"
        self.notices: list[str] = []  # what reading or tidying did to the files, for the user to hear once
        self._tidied = False
        self._journals: dict[str, RunJournal] = {}  # of the runs measuring now, by run id, until `record` ends them
        self._snapshot: Snapshot | None = None  # the file as last read
        self._reading = threading.Lock()

    def take_notices(self) -> list[str]:
        """The notices not yet taken, one line each; taking them empties the list."""
        notices, self.notices = self.notices, []
        return notices

    def _read(self, rows: bool = True) -> Snapshot:
        """history.csv in the single spelling of each metric, after moving the rows that do not parse to the
        quarantine file; without `rows`, its rows may be left unparsed (known clean, their run ids known). A header
        without KEY_COLUMNS raises HistoryColumnsError and leaves the file alone. Unchanged since the last read,
        the file is not read again; grown by appended rows, only they are parsed (history_index)."""
        with self._reading:  # the dashboard's one History serves every session's script thread, and its downloads
            return self._read_once(rows)

    def _read_once(self, rows: bool) -> Snapshot:
        key = file_key(self.csv_path)
        known = self._snapshot
        if known is not None and known.rows is None and rows:
            known = None
        if known is not None and key is not None and key == known.key:
            return known
        if known is None and not rows and key is not None:
            known = read_sidecar(self.root / SIDECAR_FILE)
        snapshot = None
        if known is not None:
            with contextlib.suppress(OSError):  # the full read below says what is wrong
                snapshot = known.grown(self.csv_path.read_bytes(), _has_run_id)
        if snapshot is None:
            table = csvstore.read_clean_table(self.csv_path, self.quarantine_path, KEY_COLUMNS, keep=_has_run_id)
            self._notice_moved(table.moved)
            snapshot = Snapshot.parsed(table)
        # The key was taken before the bytes were read: a write in between leaves a key that differs next time.
        snapshot.key = key if key is not None and key[2] == snapshot.size else None
        self._snapshot = snapshot
        return snapshot

    def _save_index(self) -> None:
        """After a write that changed the file: the sidecar describes the file as it now is, for the next process to
        start from. Only writes update it: reading a history changes no file. A cache: what goes wrong here is no
        failure of the write."""
        with contextlib.suppress(HistoryError, OSError):
            snapshot = self._read(rows=False)
            if snapshot.size:
                write_sidecar(self.root / SIDECAR_FILE, snapshot)

    def _notice_moved(self, moved: list[int]) -> None:
        if moved:
            lines = ", ".join(str(number) for number in moved)
            self.notices.append(
                f"{len(moved)} damaged row(s) of {self.csv_path} (line(s) {lines}: cut short, garbled, "
                f"not UTF-8 or without a run id) were moved, as they were, to {self.quarantine_path}; "
                "the other rows are untouched."
            )

    def tidy(self) -> None:
        """On start, once per History: quarantine damaged rows, put back the runs a crash (or a move) left out of the
        CSV, record as cancelled the runs whose process was killed while they measured, and remove the leftovers of
        interrupted writes; each kind of change is one line in `notices`. A folder whose writer still holds its lock
        (store.journal) is a run in progress, however old: left alone. Once is enough: a crash leaves its leftovers
        for the next start, and every read quarantines damaged rows anyway."""
        if self._tidied:
            return
        self._tidied = True
        leftovers = history_leftovers.find(self.root, self.runs_dir, set(self._read(rows=False).run_ids))
        claims = {
            folder: lock
            for folder in leftovers.folders
            if _RUN_ID.match(folder.name)  # others are not ours
            and (lock := FolderLock.claim(folder)) is not None
        }
        if claims:  # a writer may have recorded its run between the read and the claim
            recorded = set(self._read(rows=False).run_ids)
            for folder in [folder for folder in claims if folder.name in recorded]:
                claims.pop(folder).release()
        found = history_leftovers.Recovered()
        try:  # the rows go in before the locks go: another start that takes one finds its row
            for folder in claims:
                self._recover(folder, found)
            if found.rows:
                csvstore.append_rows(self.csv_path, found.rows)
            removed = history_leftovers.remove([*leftovers.tmp_files, *found.unusable])
        finally:
            for lock in claims.values():
                lock.release()
        if notice := history_leftovers.describe(self.runs_dir, found, removed):
            self.notices.append(notice)

    def _recover(self, folder: Path, found: history_leftovers.Recovered) -> None:
        """Note in `found` what the folder of a run without a row gives back, its writer gone (the caller holds its
        lock)."""
        if (row := _row_of(folder)) is not None:
            found.rows.append(row)
            found.put_back.append(folder.name)
            (folder / JOURNAL_FILE).unlink(missing_ok=True)
        elif (record := _journaled_record(folder)) is not None:
            try:  # as `record` writes a run, under the lock that `tidy` holds
                self._write_run(folder, record)
            except (OSError, HistoryError):  # a folder or history that takes no write now: left for a later start
                return
            found.journaled.append(folder.name)
        elif (row := _recovered_row(folder)) is not None:
            found.rows.append(row)
            found.rebuilt.append(folder.name)
        else:
            found.unusable.append(folder)

    def journal(self, record: RunRecord, t_start: float, lengths: list[tuple[int, int]]) -> RunJournal:
        """Start the journal of a run that measures now (store.journal): `record` holds what is known before its
        requests (settings, engine, machine, load time), `t_start` is its clock's start (perf_counter), `lengths`
        each request's sampled input and output length. `record` ends it; so does `close_journal`."""
        header = {
            "record": _record_state(record),
            "t_start": t_start,
            "wall_start": time.time() - (time.perf_counter() - t_start),
            "lengths": lengths,
        }
        journal = self._journals[record.run_id] = RunJournal(self.run_dir(record.run_id), header)
        return journal

    def close_journal(self, run_id: str) -> None:
        """Stop the journal of a run that `record` did not take (it was kept elsewhere, or not at all): the file
        stays, for the next start, where its folder does."""
        if (journal := self._journals.pop(run_id, None)) is not None:
            journal.end().release()

    def run_dir(self, run_id: str) -> Path:
        if not _RUN_ID.match(run_id or ""):
            raise HistoryError(f"'{_shortened(run_id)}' is not a run id; {_RUN_ID_RULE}.")
        return self.runs_dir / run_id

    def check_writable(self) -> None:
        """HistoryError unless runs can be recorded here: the folders made, the history appended to."""
        csvstore.check_folder_writable(self.root)
        csvstore.check_folder_writable(self.runs_dir)
        csvstore.check_csv_writable(self.csv_path)

    def record(self, record: RunRecord) -> None:
        """Write the run's folder, then its CSV row, its writer's lock held; a history refused by `_read` gets
        neither. The run's journal, if it has one, is removed once the row is in."""
        folder = self.run_dir(record.run_id)
        self._read(rows=False)
        journal = self._journals.pop(record.run_id, None)
        lock = journal.end() if journal is not None else FolderLock.hold(folder)
        try:
            self._write_run(folder, record)
        finally:
            lock.release()

    def _write_run(self, folder: Path, record: RunRecord) -> None:
        flat_config = redact(record.config.to_flat_dict())
        nested_config = redact(
            {**dataclasses.asdict(record.config), "engine": applied_engine_settings(record.config.engine)}
        )
        _write_json(folder / CONFIG_FILE, {"flat": flat_config, "nested": nested_config})
        _write_json(folder / ENVIRONMENT_FILE, redact(record.environment))
        if record.requests is not None:
            _write_parquet(folder / REQUESTS_FILE, _redacted_texts(record.requests))
        if record.telemetry is not None:
            _write_parquet(folder / TELEMETRY_FILE, record.telemetry)
        if record.server_metrics is not None:
            _write_parquet(folder / SERVER_METRICS_FILE, record.server_metrics)
        if record.roofline is not None:
            _write_json(folder / ROOFLINE_FILE, record.roofline)
        row = history_row(record)
        _write_json(folder / ROW_FILE, {key: csvstore.cell_text(value) for key, value in row.items()})
        csvstore.append_row(self.csv_path, row)
        (folder / JOURNAL_FILE).unlink(missing_ok=True)
        self._save_index()

    def load(self) -> pd.DataFrame:
        """All rows; numbers as numbers, '-' and empty cells as NaN, names and versions as text."""
        snapshot = self._read()
        if not snapshot.header:
            return pd.DataFrame(columns=[*HISTORY_LEAD_COLUMNS, "run_id", "started_at", "status", "label", "model"])
        if snapshot.frame is None:
            snapshot.frame = _typed_frame(snapshot.header, snapshot.rows, snapshot.earlier_frame)
        return snapshot.frame.copy()  # the caller's to change; the snapshot's stays as read

    def measured(self, run_id: str) -> bool:
        """Whether the run has a per-request table (runs that failed before measuring and imports have none)."""
        return (self.run_dir(run_id) / REQUESTS_FILE).exists()

    def requests(self, run_id: str) -> pd.DataFrame:
        path = self.run_dir(run_id) / REQUESTS_FILE
        if not path.exists():
            raise HistoryError(f"Run {run_id} has no per-request table (imported runs keep only their summary row).")
        try:
            return pd.read_parquet(path)
        except (OSError, pa.ArrowException) as exc:
            raise HistoryError(f"The per-request table of run {run_id} is unreadable ({exc}).") from exc

    def telemetry(self, run_id: str) -> pd.DataFrame | None:
        """The run's hardware samples (telemetry.py's table); None for runs recorded without them."""
        return self._samples(run_id, TELEMETRY_FILE, "telemetry")

    def server_metrics(self, run_id: str) -> pd.DataFrame | None:
        """The server's raw metrics samples of the run (server_metrics.py's table); None for runs without them."""
        return self._samples(run_id, SERVER_METRICS_FILE, "server metrics")

    def _samples(self, run_id: str, file_name: str, what: str) -> pd.DataFrame | None:
        path = self.run_dir(run_id) / file_name
        if not path.exists():
            return None
        try:
            return pd.read_parquet(path)
        except (OSError, pa.ArrowException) as exc:
            raise HistoryError(f"The {what} of run {run_id} is unreadable ({exc}).") from exc

    def roofline(self, run_id: str) -> dict | None:
        """The run's roofline record (roofline.roofline_record); None for runs recorded without one."""
        path = self.run_dir(run_id) / ROOFLINE_FILE
        if not path.exists():
            return None
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise HistoryError(f"The roofline verdict of run {run_id} is unreadable ({exc}).") from exc

    def config(self, run_id: str) -> RunConfig:
        """The run's settings, from its config.json, or from its row when only the row was imported."""
        path = self.run_dir(run_id) / CONFIG_FILE
        if path.exists():
            try:
                return RunConfig.from_flat_dict(json.loads(path.read_text(encoding="utf-8"))["flat"])
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise HistoryError(f"The saved configuration of run {run_id} is unreadable ({exc}).") from exc
        row = self.row(run_id)
        if row is None:
            raise HistoryError(f"There is no run {run_id} in {self.csv_path}.")
        if not row.get("model"):
            raise HistoryError(f"Run {run_id} was imported from {row.get('source') or 'a CSV'} without its settings.")
        return RunConfig.from_flat_dict(row)

    def row(self, run_id: str) -> dict[str, str] | None:
        """The run's row, every cell as written; None when the history has no such run."""
        row = self._read().row(run_id)
        return None if row is None else dict(row)

    def delete(self, run_ids: Iterable[str]) -> int:
        """Remove these runs' rows and folders; returns how many rows were removed."""
        doomed = set(run_ids)
        folders = [self.run_dir(run_id) for run_id in doomed]
        removed = 0
        if self.csv_path.exists():
            self._read(rows=False)
            removed = csvstore.rewrite(self.csv_path, lambda row: row.get("run_id") not in doomed)
            if removed:
                self._save_index()
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)
        return removed

    def import_csv(self, source: str | os.PathLike | bytes, name: str = "") -> list[str]:
        """Add the rows of a CSV from LMDeploy's scripts or of another history; returns the new run ids.

        Rows from another history whose run id is already here are skipped. Nothing is written unless
        the whole file is valid.
        """
        if isinstance(source, bytes):
            data, name = source, name or "the uploaded file"
        else:
            name = name or Path(source).name
            try:
                data = Path(source).read_bytes()
            except OSError as exc:
                raise HistoryError(f"Cannot read {source}: {exc.strerror or exc}.") from exc
        parsed = parse_import(data, name)
        existing_rows = self._read().rows
        taken = {row.get("run_id", "") for row in existing_rows}
        if parsed.source == HISTORY_SOURCE:
            both = [*existing_rows, *parsed.rows]
            check_numbers(
                parsed,
                name,
                [col for col in parsed.header if _is_number_column(col, (row.get(col, "") for row in both))],
            )
            new_rows = _new_history_rows(parsed.rows, taken, name)
        else:
            imported_at = local_now_iso()
            new_rows = []
            for original in parsed.rows:
                run_id = _unused_run_id(taken)
                new_rows.append(_imported_row(original, run_id, parsed.source, parsed.load_pattern, name, imported_at))
        if new_rows:
            csvstore.append_rows(self.csv_path, new_rows)
            self._save_index()
        return [row["run_id"] for row in new_rows]

    def lmdeploy_row(self, run_id: str) -> dict[str, Any]:
        """The run's row as LMDeploy's save_csv writes it (its names, order and formats), from the history row."""
        row = self.row(run_id)
        if row is None:
            raise HistoryError(f"There is no run {run_id} in {self.csv_path}.")
        return lmdeploy_row_of(row)

    def to_csv_bytes(self, run_ids: Iterable[str] | None = None) -> bytes:
        """The history file, or only the rows of `run_ids`, as CSV bytes for a download."""
        snapshot = self._read()
        rows = snapshot.rows
        if run_ids is not None:
            wanted = set(run_ids)
            rows = [row for row in rows if row.get("run_id") in wanted]
        return csvstore.table_bytes(snapshot.header, rows) if snapshot.header else b""


def history_row(record: RunRecord) -> dict[str, Any]:
    """The CSV row of a run, in column order; a key already filled by an earlier group keeps its value."""
    row: dict[str, Any] = dict.fromkeys(HISTORY_LEAD_COLUMNS)
    row.update(lmdeploy_hyperparams(record.config))
    identity = {
        "run_id": record.run_id,
        "started_at": record.started_at,
        "finished_at": record.finished_at,
        "status": record.status,
        "label": record.config.label,
        "model": record.config.engine.model,
        "sweep_id": record.sweep_id,
        "sweep_repeat": record.sweep_repeat,
        "error": record.error,
        "load_seconds": record.load_seconds,
        "warmup_seconds": record.warmup_seconds,
    }
    groups = [
        identity,
        _model_columns(record.model),
        record.config.to_flat_dict(),
        record.metrics,
        _roofline_columns(record.roofline),
        _engine_columns(record.engine_info),
    ]
    groups.append({f"{ENVIRONMENT_PREFIX}{key}": value for key, value in record.environment.items()})
    for group in groups:
        for key, value in group.items():
            if row.get(key) in (None, ""):
                row[key] = value
    if record.recovered_at:
        row["recovered_at"] = record.recovered_at
    return {key: _cell_value(value) for key, value in redact(row).items()}


def run_metrics(
    config: RunConfig,
    requests: pd.DataFrame,
    duration_s: float,
    telemetry: pd.DataFrame | None = None,
    server_metrics: pd.DataFrame | None = None,
) -> dict[str, Any]:
    """A run's summary for its row: the metrics of its request table over `duration_s`, with its telemetry and its
    server's metrics where it has them; aggregated where the run is recorded (Runner.record) or rebuilt."""
    summary = metrics.run_summary(requests, duration_s, config.percentiles, config.load.stream_output, config.slo)
    if telemetry is not None:
        sampled = telemetry_summary(telemetry, 0.0, duration_s, summary["total_output_tokens"])
        # A server's engine is a process we do not sample: its own CPU would read as other processes' (contention.py).
        if backend(config.engine.backend).in_process:
            sampled.update(contention_summary(telemetry, 0.0, duration_s))
        else:  # whether the client kept up: this process, or the worker processes it sent from (client_bound.py)
            sampled.update(client_summary(telemetry, 0.0, duration_s, client_in_workers(config.load.client_processes)))
        summary.update(telemetry_columns(sampled))
    if server_metrics is not None:
        summary.update(server_columns(server_samples.run_summary(server_metrics)))
    return summary


def _has_run_id(row: dict[str, str]) -> bool:
    return bool(_RUN_ID.match(row.get("run_id", "")))


def _row_of(folder: Path) -> dict[str, str] | None:
    """The row a run's folder holds as it was written to the history (row.json); None without a readable one, or
    with one of another run (a folder copied under another name)."""
    try:
        row = json.loads((folder / ROW_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(row, dict) or row.get("run_id") != folder.name:
        return None
    return row


def _record_state(record: RunRecord) -> dict[str, Any]:
    """What a journal keeps of a run before its requests (History.journal), as JSON values, credentials masked."""
    return redact(
        {
            "started_at": record.started_at,
            "config": record.config.to_flat_dict(),
            "engine_info": dataclasses.asdict(record.engine_info) if record.engine_info is not None else None,
            "environment": record.environment,
            "load_seconds": record.load_seconds,
            "warmup_seconds": record.warmup_seconds,
            "sweep_id": record.sweep_id,
            "sweep_repeat": record.sweep_repeat,
        }
    )


# The reason a recovered run gives its requests that its journal does not have as finished.
UNHEARD = "not finished when last heard of: the process that recorded the run stopped"


def _journaled_record(folder: Path) -> RunRecord | None:
    """The record of a run whose process was killed while it measured, from its journal: cancelled, with the
    requests the journal has as finished, the others unfinished; its duration from the clock's start to the last of
    them (what came after was never heard of). None without a readable journal or a finished request in it. What
    the journal does not hold stays empty: telemetry, server metrics, roofline, the dataset's workload columns."""
    journal = read_journal(folder)
    if journal is None:
        return None
    header, finished = journal
    try:
        state, lengths = header["record"], header["lengths"]
        config = RunConfig.from_flat_dict(state["config"])
        t_start, wall_start = float(header["t_start"]), float(header["wall_start"])
        info = EngineInfo(**state["engine_info"]) if state["engine_info"] else None
    except (KeyError, TypeError, ValueError):
        return None
    sessions = [finished.get(index) or Session(*pair) for index, pair in enumerate(lengths)]
    heard = [session for session in sessions if session.finished]
    if not heard:
        return None
    last = max(session.finish_time for session in heard)
    for session in sessions:
        if not session.finished:
            session.reason = UNHEARD
    profiler = rebuilt_profiler(config, sessions, t_start, last)
    requests = profiler.request_table()
    summary = run_metrics(config, requests, profiler.elapsed_time)
    return RunRecord(
        run_id=folder.name,
        started_at=state["started_at"],
        status=RunState.CANCELLED,
        config=config,
        metrics=summary,
        engine_info=info,
        environment=state["environment"],
        requests=requests,
        model=describe_model(config.engine.model),
        error=(
            f"Recovered from its journal: the process that recorded it stopped while it measured, with "
            f"{len(heard)} of {len(sessions)} requests finished; its duration runs to the last of them."
        ),
        finished_at=datetime.fromtimestamp(wall_start + last - t_start).astimezone().isoformat(timespec="seconds"),
        load_seconds=state["load_seconds"],
        warmup_seconds=state["warmup_seconds"],
        sweep_id=state["sweep_id"],
        sweep_repeat=state["sweep_repeat"],
        recovered_at=local_now_iso(),
    )


def _recovered_row(folder: Path) -> dict[str, Any] | None:
    """The history row of a run whose folder has no row.json (written before runs had one), rebuilt from its
    config.json, environment.json, requests.parquet and, where it has them, its telemetry, server metrics and
    roofline; None when the first three are not all readable. Its duration is the last request's finish, the run's
    own end not being stored (history_leftovers.NOT_REBUILT says what else it lacks)."""
    try:
        config = RunConfig.from_flat_dict(json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8"))["flat"])
        environment = json.loads((folder / ENVIRONMENT_FILE).read_text(encoding="utf-8"))
        requests = pd.read_parquet(folder / REQUESTS_FILE)
        samples = {
            name: pd.read_parquet(folder / file) if (folder / file).exists() else None
            for name, file in (("telemetry", TELEMETRY_FILE), ("server_metrics", SERVER_METRICS_FILE))
        }
        roofline = (
            json.loads((folder / ROOFLINE_FILE).read_text(encoding="utf-8"))
            if (folder / ROOFLINE_FILE).exists()
            else None
        )
        summary = run_metrics(config, requests, float(requests["finish_s"].max()), **samples)
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException):
        return None
    record = RunRecord(
        run_id=folder.name,
        started_at=_started_at(folder.name),
        status=_recovered_status(summary),
        config=config,
        metrics=summary,
        environment=environment,
        model=describe_model(config.engine.model),
        roofline=roofline,
        recovered_at=local_now_iso(),
    )
    return history_row(record)


def _started_at(run_id: str) -> str:
    """The start time a run id from new_run_id carries, in `started_at`'s form; empty for other ids."""
    try:
        started = datetime.strptime(run_id[:15], "%Y%m%d-%H%M%S")
    except ValueError:
        return ""
    return started.astimezone().isoformat(timespec="seconds")


def lmdeploy_row_of(row: dict[str, str]) -> dict[str, Any]:
    """A history row (as `History.row` reads it) as LMDeploy's save_csv writes it: its names, order and formats."""
    return {
        **{col: row.get(col, "") for col in SAVE_CSV_HYPERPARAMS},
        **lmdeploy_row({col: _number_or_nan(row.get(col, "")) for col in HISTORY_LEAD_COLUMNS}),
    }


def _recovered_status(summary: dict[str, Any]) -> RunState:
    """A recovered run's status from its request counts, as the runner would have judged them; requests cut off
    read as a cancel (a run whose duration ended cuts some off too, which the counts cannot tell apart)."""
    if summary["cancelled"] or summary["unfinished"]:
        return RunState.CANCELLED
    return measured_state(summary["completed"], summary["failed"], summary["incomplete"], summary.get("overrun", 0))


def _model_columns(model: ModelRecord | None) -> dict[str, Any]:
    if model is None:
        return {}
    return {
        "model_kind": model.kind,
        "model_random_weights": model.random_weights,
        "model_parameters": model.parameters,
    }


def _roofline_columns(record: dict | None) -> dict[str, Any]:
    """The verdict and the shares of peak it rests on, so runs can be filtered and compared by them."""
    if not record or "bound" not in record:
        return {}
    numbers = record["numbers"]
    return {
        "roofline_bound": record["bound"],
        "roofline_bandwidth_share": numbers.get("bandwidth_share"),
        "roofline_compute_share": numbers.get("compute_share"),
    }


def _engine_columns(info: EngineInfo | None) -> dict[str, Any]:
    if info is None:
        return {}
    columns = {
        "engine_backend": info.backend,
        "engine_model": info.model,
        "engine_model_path": info.model_path,
        "engine_dtype": info.dtype,
        "engine_device": info.device,
        "engine_notes": "; ".join(info.notes),
    }
    columns.update({f"engine_version_{name}": version for name, version in info.versions.items()})
    return columns


def _imported_row(
    original: dict[str, str], run_id: str, source: str, load_pattern: str, file_name: str, imported_at: str
) -> dict[str, str]:
    """An LMDeploy row as a history row: LMDeploy's cells verbatim, plus what makes it comparable."""
    row = dict.fromkeys(HISTORY_LEAD_COLUMNS, "")
    row.update(original)
    row.update(
        run_id=run_id,
        status=IMPORTED,
        source=source,
        source_file=file_name,
        imported_at=imported_at,
        load_pattern=load_pattern,
    )
    if original.get("bs"):
        row["concurrency"] = original["bs"]
    return row


def _new_history_rows(rows: list[dict[str, str]], taken: set[str], name: str) -> list[dict[str, str]]:
    """Rows of another history whose run ids are not `taken` yet, verbatim but for any credentials."""
    new_rows = []
    for line_number, row in enumerate(rows, start=2):
        run_id = row["run_id"]
        if not _RUN_ID.match(run_id):
            raise HistoryError(
                f"Line {line_number} of {name} has '{_shortened(run_id)}' ({len(run_id)} characters) "
                f"as its run id, which is not one: {_RUN_ID_RULE}. Nothing was imported."
            )
        if run_id not in taken:
            taken.add(run_id)
            new_rows.append(redact(row))
    return new_rows


def _shortened(run_id: str, keep: int = 40) -> str:
    """A run id short enough to quote in a message."""
    return run_id if len(run_id) <= keep else f"{run_id[:keep]}..."


def _unused_run_id(taken: set[str]) -> str:
    run_id = new_run_id()
    while run_id in taken:
        run_id = new_run_id()
    taken.add(run_id)
    return run_id


def _redacted_texts(frame: pd.DataFrame) -> pd.DataFrame:
    """The request table with credentials masked in its text cells (a server's error may quote them)."""
    texts = [
        col
        for col in frame.select_dtypes(include=["object", "str"]).columns
        if frame[col].map(lambda cell: isinstance(cell, str)).any()
    ]
    return frame.assign(
        **{col: frame[col].map(lambda cell: redact(cell) if isinstance(cell, str) else cell) for col in texts}
    )


def _cell_value(value: Any) -> Any:
    """Containers (failure reasons by kind, say) become JSON text; everything else is written as is."""
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, default=str)
    return value


def _number_or_nan(cell: str) -> int | float:
    """A history cell as the number it was written from: an int stays an int; missing cells are NaN."""
    if cell in _MISSING_CELLS or not is_number(cell):
        return float("nan")
    return int(cell) if cell.lstrip("-").isdigit() else float(cell)


def _is_text_column(name: str) -> bool:
    return name in _TEXT_COLUMNS or name.startswith(_TEXT_PREFIXES)


def _is_number_column(name: str, cells: Iterable[str]) -> bool:
    """A column of numbers: LMDeploy's, or any other that is not a text column and holds a number in `cells`."""
    if _is_text_column(name):
        return False
    return name in NUMBER_COLUMNS or any(is_number(cell) for cell in cells)


def _typed_frame(header: list[str], rows: list[dict[str, str]], earlier: pd.DataFrame | None = None) -> pd.DataFrame:
    """The rows as `load` gives them. `earlier`, the typed first rows (before rows were appended), is kept when each
    column of the rows after it types as the whole column would: then typing all of them again gives the same table."""
    if earlier is not None and list(earlier.columns) == header:
        added = pd.DataFrame(rows[len(earlier) :], columns=header, dtype=object)
        typed = {col: _typed_like(col, added[col], earlier[col].dtype) for col in header}
        if all(column is not None for column in typed.values()):
            return pd.concat([earlier, pd.DataFrame(typed)], ignore_index=True)
    frame = pd.DataFrame(rows, columns=header, dtype=object)  # every row has every column
    return pd.DataFrame({col: _typed_column(col, frame[col]) for col in header})


def _typed_like(name: str, cells: pd.Series, dtype) -> pd.Series | None:
    """Cells appended to a column typed `dtype`, typed as the whole column would be; None where they could change
    its type. Missing cells change nothing; whole and real numbers together are real numbers."""
    if not _is_text_column(name) and cells.isin(_MISSING_CELLS).all():
        if dtype == "boolean":
            return pd.Series(pd.NA, index=cells.index, dtype="boolean")
        return pd.Series(np.nan, index=cells.index) if dtype in _NUMBER_TYPES else cells.astype(str)
    typed = _typed_column(name, cells)
    return typed if typed.dtype == dtype or {typed.dtype, dtype} <= _NUMBER_TYPES else None


def _typed_column(name: str, cells: pd.Series) -> pd.Series:
    """A column as loaded. In a number column, a cell that is not a number (left by an edit by hand; imports
    refuse them) reads as missing, so it cannot turn the whole column into text; the file keeps it."""
    if _is_text_column(name):
        return cells.astype(str)
    # A column holds few distinct values: test and parse those once, then spread them over the rows (parsing every
    # cell was most of the first read of a long history).
    positions: dict[Any, int] = {}
    codes = np.fromiter((positions.setdefault(cell, len(positions)) for cell in cells), np.intp, len(cells))
    distinct = pd.Index(list(positions), dtype=object)
    missing = distinct.isin(_MISSING_CELLS)
    present = distinct[~missing]
    if len(present) and set(present) <= {"True", "False"}:
        return pd.Series(cells == "True", dtype="boolean").mask(missing[codes])
    if not len(present) or _is_number_column(name, present):
        numbers = pd.to_numeric(pd.Series(distinct, dtype=object).where(~missing, None), errors="coerce")
        return pd.Series(numbers.to_numpy()[codes], index=cells.index, name=cells.name)
    return cells.astype(str)


def _write_json(path: Path, payload: dict[str, Any]) -> None:
    text = json.dumps(payload, indent=2, default=str) + "\n"
    csvstore.replace_file(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def _write_parquet(path: Path, frame: pd.DataFrame) -> None:
    # One thread: pyarrow's column threads come from a pool that refuses work once the interpreter is shutting
    # down, which is when the dashboard records a run that its stop (SIGTERM, Ctrl-C) cancelled.
    table = pa.Table.from_pandas(frame, preserve_index=False, nthreads=1)
    csvstore.replace_file(path, lambda tmp: pq.write_table(table, tmp))
