"""The run history: a folder per run (the truth), an SQLite index of their rows, and history.csv as the file users open.

`<root>/runs/<run_id>/` holds `config.json`, `environment.json`, `requests.parquet` and `row.json` (the run's row,
cell for cell), each written whole, row.json last; then the row goes into the index (`<root>/history.sqlite`,
store.index), and history.csv is written from the index in the same transaction. While a run measures, its folder
holds its journal (store.journal): the requests finished so far. A folder without its row in the index (a crash in
between, a folder moved back from `unsaved-results`) gets exactly its row back at the next start (`tidy`), and a
missing index is rebuilt from the folders (`reindex`).
history.csv starts with the columns LMDeploy's `Profiler.save_csv` writes, in its order, each metric under the
catalog's single spelling (`duration_s`, `mean_e2e_ms`: full floats; LMDeploy's names and formats are only in its own
export, `lmdeploy_row`); then run identity, every setting, the profiler's other metrics, the engine (`engine_*`) and
the machine (`env_*`). It is an export: the history never reads it back, but for the rows of a history.csv written
before the index, which get their folder's row.json when the index is first built. Files written when the history
kept LMDeploy's spellings beside ours read as if they had one (history_import.single_spelling).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

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
from ..measure.window import steady_load
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
    lmdeploy_hyperparams,
    parse_import,
    single_spelling,
)
from .index import INDEX_FILE, ColumnType, IndexWriter, RunIndex, number_cell
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
REQUESTS_FILE = "requests.parquet"
TELEMETRY_FILE = "telemetry.parquet"
SERVER_METRICS_FILE = "server_metrics.parquet"
ROOFLINE_FILE = "roofline.json"
CONFIG_FILE = "config.json"
ENVIRONMENT_FILE = "environment.json"
ROW_FILE = "row.json"
EXPORT_META = "csv_export"  # index meta: history.csv's size and modification time as last written, and its columns


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
    # The prefix cache's state when the clock started: cold, warm or unknown; "" for a run recorded before it was
    # (or that never reached its start).
    cache_start: str = ""
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
        self.runs_dir = self.root / "runs"
        self.index = RunIndex(self.root / INDEX_FILE, _is_text_column)
        self.notices: list[str] = []  # what reading or tidying did to the files, for the user to hear once
        self._tidied = False
        self._indexed = False  # the index was found, or built, by this History
        self._journals: dict[str, RunJournal] = {}  # of the runs measuring now, by run id, until `record` ends them
        # The typed table, the index generation it is of, and the columns read (None: all of them).
        self._loaded: tuple[int, frozenset[str] | None, pd.DataFrame] | None = None
        self._reading = threading.Lock()  # the dashboard's one History serves every session's script thread
        self._csv_changes: list[_CsvChange] = []  # what the write under way did to history.csv (`_writing`)

    def take_notices(self) -> list[str]:
        """The notices not yet taken, one line each; taking them empties the list."""
        notices, self.notices = self.notices, []
        return notices

    def _ready(self) -> None:
        """Build the index from the run folders when it is missing (a new results folder, a deleted index, or one
        written before the history had an index: then its history.csv's rows without a folder get one first)."""
        if self._indexed:
            return
        if not self.index.exists():
            if not self.root.is_dir():  # nothing recorded yet; the first write makes the folder and the index
                return
            self.reindex(only_if_missing=True)
        self._indexed = True

    def reindex(self, only_if_missing: bool = False) -> int:
        """Rebuild the index from the run folders (each one's row.json); returns how many runs it holds. Rows of
        history.csv whose folder has no row.json (LMDeploy imports and runs recorded before the index, hand-added
        rows) get one first, so that they are in the folders from now on. With `only_if_missing`, an index that
        another process built meanwhile is left as it is."""
        with self._writing() as index:  # the folders read inside it: a run recorded meanwhile is not left out
            if only_if_missing and index.meta("built") is not None:
                return len(index.run_ids())
            adopted, unreadable = _adopt_csv_rows(self.csv_path, self.runs_dir)
            rows = _folder_rows(self.runs_dir)
            order = {row["run_id"]: position for position, row in enumerate(adopted.rows)}
            rows.sort(key=lambda row: (order.get(row["run_id"], len(order)), row.get("started_at", ""), row["run_id"]))
            index.clear()
            index.put(rows)
            index.set_meta("built", local_now_iso())
            if adopted.header and not unreadable:  # the file is as good as written by the index: the next write
                index.set_meta(EXPORT_META, _export_state(self.csv_path, adopted.header))  # appends or rewrites it
        self._indexed = True
        if rows or adopted.written:
            notice = f"Built the history's index ({self.index.path}) from {len(rows)} run folder(s) in {self.runs_dir}"
            if adopted.written:
                notice += (
                    f"; {len(adopted.written)} row(s) of {self.csv_path} without a folder (LMDeploy imports, older "
                    "runs) got one, with their row.json"
                )
            if unreadable:
                notice += f"; {unreadable} line(s) of {self.csv_path} could not be read as rows"
            self.notices.append(notice + ".")
        return len(rows)

    @contextlib.contextmanager
    def _writing(self):
        """One write to the index, history.csv's export included (RunIndex.writing). A write that fails, its
        commit included, leaves history.csv as it was, down to its modification time (`_CsvChange`): else the next
        write would take the file for one edited by hand. The typed table is read again after it."""
        changes: list[_CsvChange] = []
        self._csv_changes = changes
        try:
            with self.index.writing() as index:
                yield index
        except BaseException:
            for change in reversed(changes):
                change.undo()
            raise
        finally:
            self._loaded = None
        for change in changes:
            change.done()

    def _put_rows(self, rows: list[dict[str, str]]) -> None:
        """Add rows to the index, and to history.csv."""
        with self._writing() as index:
            replaced = index.put(rows)
            self._export(index, [] if replaced else rows)

    def _export(self, index: IndexWriter, added: list[dict[str, str]]) -> None:
        """Write history.csv from the index, inside its write transaction (one writer at a time): `added`, rows new
        to the index, are appended to the file as the index last wrote it, when its columns are the same; any other
        change rewrites it whole, atomically. A file changed since the index wrote it (an edit by hand, a file put in
        its place) is kept, as it was, under a new name, and said so: history.csv is the index's export, and edits to
        it are not read back."""
        header = index.header()
        written = index.meta(EXPORT_META)
        path = Path(os.path.realpath(self.csv_path))
        if path.exists() and (written is None or json.loads(written)[:2] != _file_state(path)):
            kept = self.root / f"history.edited-{datetime.now():%Y%m%d-%H%M%S}-{secrets.token_hex(2)}.csv"
            notice = (
                f"{self.csv_path} was changed outside the app since it was last written: it was kept as {kept}, "
                "and history.csv was written again from the history's index (edits to it are not read back; "
                "docs/history.md says how to bring rows in)."
            )
            self._csv_changes.append(_CsvChange.kept_aside(path, kept, self.notices, notice))
            written = None
        if added and written is not None and json.loads(written)[2] == _header_digest(header):
            self._csv_changes.append(_CsvChange.appended(path))
            csvstore.append_in_place(path, header, added)
        else:
            self._csv_changes.append(_CsvChange.replaced(path))
            header, rows = index.rows()
            csvstore.replace_bytes(path, csvstore.table_bytes(header, rows))
        index.set_meta(EXPORT_META, _export_state(path, header))

    def tidy(self) -> None:
        """On start, once per History: build the index if it is missing, put back the runs whose folder it does not
        have (a crash between the folder and the index, a folder moved back from `unsaved-results`), record as
        cancelled the runs whose process was killed while they measured, and remove the leftovers of interrupted
        writes; each kind of change is one line in `notices`. A folder whose writer still holds its lock
        (store.journal) is a run in progress, however old: left alone. Once is enough: a crash leaves its leftovers
        for the next start."""
        if self._tidied:
            return
        self._tidied = True
        self._ready()
        recorded = self.index.run_ids() if self._indexed else set()
        leftovers = history_leftovers.find(self.root, self.runs_dir, recorded)
        claims = {
            folder: lock
            for folder in leftovers.folders
            if _RUN_ID.match(folder.name)  # others are not ours
            and (lock := FolderLock.claim(folder)) is not None
        }
        if claims:  # a writer may have recorded its run between the read and the claim
            recorded = self.index.run_ids()
            for folder in [folder for folder in claims if folder.name in recorded]:
                claims.pop(folder).release()
        found = history_leftovers.Recovered()
        try:  # the rows go in before the locks go: another start that takes one finds its row
            for folder in claims:
                self._recover(folder, found)
            if found.rows:
                self._put_rows(found.rows)
            removed = history_leftovers.remove([*leftovers.tmp_files, *leftovers.deleted, *found.unusable])
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
            try:
                _write_json(folder / ROW_FILE, row)
            except OSError:
                return
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
        """HistoryError unless runs can be recorded here: the folders made, the index and history.csv written."""
        csvstore.check_folder_writable(self.root)
        csvstore.check_folder_writable(self.runs_dir)
        csvstore.check_csv_writable(self.csv_path)
        csvstore.check_csv_writable(self.index.path)

    def record(self, record: RunRecord) -> None:
        """Write the run's folder, then its row in the index and history.csv, its writer's lock held. The run's
        journal, if it has one, is removed once the row is in."""
        folder = self.run_dir(record.run_id)
        self._ready()
        journal = self._journals.pop(record.run_id, None)
        lock = journal.end() if journal is not None else FolderLock.hold(folder)
        try:
            self._write_run(folder, record)
        finally:
            lock.release()
            with contextlib.suppress(OSError):  # a folder left empty by a write that failed: not a run's
                folder.rmdir()

    def _write_run(self, folder: Path, record: RunRecord) -> None:
        """The run's files, each written whole (a write that fails takes back the files it wrote), row.json last;
        then its row."""
        flat_config = redact(record.config.to_flat_dict())
        nested_config = redact(
            {**dataclasses.asdict(record.config), "engine": applied_engine_settings(record.config.engine)}
        )
        row = row_cells(record)
        files: list[tuple[str, Any]] = [
            (CONFIG_FILE, {"flat": flat_config, "nested": nested_config}),
            (ENVIRONMENT_FILE, redact(record.environment)),
            (REQUESTS_FILE, None if record.requests is None else _redacted_texts(record.requests)),
            (TELEMETRY_FILE, record.telemetry),
            (SERVER_METRICS_FILE, record.server_metrics),
            (ROOFLINE_FILE, record.roofline),
            (ROW_FILE, row),
        ]
        written = []
        try:
            for name, content in files:
                if content is None:
                    continue
                path = folder / name
                (_write_parquet if isinstance(content, pd.DataFrame) else _write_json)(path, content)
                written.append(path)
            self._put_rows([row])
        except BaseException:
            for path in written:
                path.unlink(missing_ok=True)
            raise
        (folder / JOURNAL_FILE).unlink(missing_ok=True)

    def load(self, columns: Iterable[str] | None = None, run_ids: Iterable[str] | None = None) -> pd.DataFrame:
        """All rows; numbers as numbers, '-' and empty cells as NaN, names and versions as text (RunIndex.frame).
        With `columns`, only those the history has, and run_id; with `run_ids`, only those runs' rows, in the order
        recorded. The columns read are kept until the next write, for every page and session: a page's rerun reads
        nothing, and a read of other columns reads them with those kept. A few runs' rows are read alone, where the
        columns kept are not all asked for."""
        asked = None if columns is None else frozenset({"run_id", *columns})
        wanted_runs = None if run_ids is None else list(run_ids)
        with self._reading:
            self._ready()
            if not self._indexed:
                return _empty_history()
            generation = self.index.generation()  # a page's rerun asks only this, while nothing was written
            kept = self._loaded if self._loaded is not None and self._loaded[0] == generation else None
            kept_columns = None if kept is None else kept[1]
            holds = kept is not None and (kept_columns is None or (asked is not None and asked <= kept_columns))
            if wanted_runs is not None and not holds:
                frame = self.index.frame(columns, wanted_runs)
                return frame if len(frame.columns) else _empty_history()
            if kept is None or not holds:
                read = None if asked is None else asked | (kept_columns or frozenset())
                kept = self._loaded = (generation, read, self.index.frame(read))
            frame = kept[2]
        if not len(frame.columns):  # an index without a run yet
            return _empty_history()
        if asked is not None:
            frame = frame[[name for name in frame.columns if name in asked]]
        if wanted_runs is not None:
            frame = frame[frame["run_id"].isin(wanted_runs)].reset_index(drop=True)
        # The caller's to change, the one kept staying as read: pandas copies on write, so no copy until then.
        return frame.copy(deep=False)

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
            raise HistoryError(f"There is no run {run_id} in the history at {self.root}.")
        if not row.get("model"):
            raise HistoryError(f"Run {run_id} was imported from {row.get('source') or 'a CSV'} without its settings.")
        return RunConfig.from_flat_dict(row)

    def row(self, run_id: str) -> dict[str, str] | None:
        """The run's row, every cell as written; None when the history has no such run."""
        self._ready()
        return self.index.row(run_id) if self._indexed else None

    def delete(self, run_ids: Iterable[str]) -> int:
        """Remove these runs' rows and folders; returns how many rows were removed. The folders go out of the way
        first (renamed, then removed): a row whose folder is still there would be put back by the next start."""
        doomed = set(run_ids)
        folders = [self.run_dir(run_id) for run_id in doomed]
        self._ready()
        moved = []
        for folder in folders:
            trash = folder.with_name(f"{history_leftovers.DELETED_PREFIX}{folder.name}-{secrets.token_hex(2)}")
            with contextlib.suppress(FileNotFoundError):
                os.replace(folder, trash)
                moved.append((folder, trash))
        try:
            with self._writing() as index:
                removed = index.delete(doomed)
                if removed:
                    self._export(index, [])
        except BaseException:
            for folder, trash in moved:
                os.replace(trash, folder)
            raise
        history_leftovers.remove([trash for _, trash in moved])
        return removed

    def import_csv(self, source: str | os.PathLike | bytes, name: str = "") -> list[str]:
        """Add the rows of a CSV from LMDeploy's scripts or of another history; returns the new run ids.

        Rows from another history whose run id is already here are skipped. Nothing is written unless
        the whole file is valid. Each new row gets its folder, with its row.json, as a run of ours does.
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
        self._ready()
        taken = self.index.run_ids() if self._indexed else set()
        if parsed.source == HISTORY_SOURCE:
            types = self.index.column_types() if self._indexed else {}
            check_numbers(
                parsed,
                name,
                [col for col in parsed.header if _is_number_column(col, types, (row[col] for row in parsed.rows))],
            )
            new_rows = _new_history_rows(parsed.rows, taken, name)
        else:
            imported_at = local_now_iso()
            new_rows = []
            for original in parsed.rows:
                run_id = _unused_run_id(taken)
                new_rows.append(_imported_row(original, run_id, parsed.source, parsed.load_pattern, name, imported_at))
        for row in new_rows:
            _write_json(self.run_dir(row["run_id"]) / ROW_FILE, row)
        if new_rows:
            self._put_rows(new_rows)
        return [row["run_id"] for row in new_rows]

    def lmdeploy_row(self, run_id: str) -> dict[str, Any]:
        """The run's row as LMDeploy's save_csv writes it (its names, order and formats), from the history row."""
        row = self.row(run_id)
        if row is None:
            raise HistoryError(f"There is no run {run_id} in the history at {self.root}.")
        return lmdeploy_row_of(row)

    def to_csv_bytes(self, run_ids: Iterable[str] | None = None) -> bytes:
        """history.csv, or only the rows of `run_ids`, as CSV bytes for a download."""
        self._ready()
        if not self._indexed:
            return b""
        header, rows = self.index.rows(run_ids)
        return csvstore.table_bytes(header, rows) if header else b""


class _CsvChange:
    """One change to history.csv inside an index write, and how to take it back should the write fail."""

    def __init__(self, undo: Callable[[], None], done: Callable[[], None] = lambda: None):
        self._undo, self._done = undo, done

    def undo(self) -> None:
        with contextlib.suppress(OSError):  # what cannot be taken back stays: the next write keeps it aside
            self._undo()

    def done(self) -> None:
        with contextlib.suppress(OSError):
            self._done()

    @classmethod
    def appended(cls, path: Path) -> _CsvChange:
        """Rows to append: undone by cutting the file back, and giving it back its modification time."""
        before = os.stat(path)

        def undo() -> None:
            os.truncate(path, before.st_size)
            os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))

        return cls(undo)

    @classmethod
    def replaced(cls, path: Path) -> _CsvChange:
        """A whole new file: the old one kept under a second name (a hard link: no copy) until the write is in."""
        if not path.exists():
            return cls(lambda: path.unlink(missing_ok=True))
        old = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")  # what tidy removes, should a crash leave it
        os.link(path, old)

        def undo() -> None:
            if path.exists() and os.path.samefile(old, path):  # the new file never took its place
                old.unlink()  # (a rename between two links of one file does nothing: POSIX)
            else:
                os.replace(old, path)

        return cls(undo, old.unlink)

    @classmethod
    def kept_aside(cls, path: Path, kept: Path, notices: list[str], notice: str) -> _CsvChange:
        """The file moved to `kept`, and said in `notices`."""
        os.replace(path, kept)
        notices.append(notice)

        def undo() -> None:
            notices.remove(notice)
            os.replace(kept, path)

        return cls(undo)


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
        "cache_start": record.cache_start,
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


def row_cells(record: RunRecord) -> dict[str, str]:
    """The run's row as history.csv, row.json and the index hold it: every cell as text."""
    return {key: csvstore.cell_text(value) for key, value in history_row(record).items()}


def run_metrics(
    config: RunConfig,
    requests: pd.DataFrame,
    duration_s: float,
    telemetry: pd.DataFrame | None = None,
    server_metrics: pd.DataFrame | None = None,
) -> dict[str, Any]:
    """A run's summary for its row: the metrics of its request table over `duration_s`, with its telemetry and its
    server's metrics where it has them; aggregated where the run is recorded (Runner.record) or rebuilt."""
    summary = metrics.run_summary(
        requests, duration_s, config.percentiles, config.load.stream_output, config.slo, steady_load(config)
    )
    if telemetry is not None:
        sampled = telemetry_summary(telemetry, 0.0, duration_s, int(summary["total_output_tokens"]))
        # A server's engine is a process we do not sample: its own CPU would read as other processes' (contention.py).
        if backend(config.engine.backend).in_process:
            sampled.update(contention_summary(telemetry, 0.0, duration_s))
        else:  # whether the client kept up: this process, or the worker processes it sent from (client_bound.py)
            sampled.update(client_summary(telemetry, 0.0, duration_s, client_in_workers(config.load.client_processes)))
        summary.update(telemetry_columns(sampled))
    if server_metrics is not None:
        summary.update(server_columns(server_samples.run_summary(server_metrics)))
    return summary


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
            "cache_start": record.cache_start,
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
    last = max(session.finish_time for session in heard if session.finish_time is not None)  # set when finished is
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
        cache_start=state.get("cache_start", ""),
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
    return row_cells(record)


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
    value = number_cell(cell)
    if value is None:
        return float("nan")
    return int(cell) if cell.lstrip("-").isdigit() else value


def _is_text_column(name: str) -> bool:
    return name in _TEXT_COLUMNS or name.startswith(_TEXT_PREFIXES)


def _is_number_column(name: str, types: dict[str, ColumnType], cells: Iterable[str]) -> bool:
    """A column of numbers: LMDeploy's, one the index types as numbers, or any other that is not a text column and
    holds a number in `cells`."""
    if _is_text_column(name) or types.get(name) in (ColumnType.TEXT, ColumnType.BOOL):
        return False
    return name in NUMBER_COLUMNS or name in types or any(number_cell(cell) is not None for cell in cells)


@dataclass
class _Adopted:
    header: list[str] = field(default_factory=list)  # history.csv's, as the file spells it
    rows: list[dict[str, str]] = field(default_factory=list)  # history.csv's rows, in its order
    written: list[str] = field(default_factory=list)  # the run ids whose folder got a row.json from it


def _adopt_csv_rows(csv_path: Path, runs_dir: Path) -> tuple[_Adopted, int]:
    """Give each row of history.csv whose folder has no row.json one (the folders are the truth the index is built
    from); the rows it read, and how many lines it could not read as rows (cut short, garbled, not UTF-8, without
    a run id). The file itself is left as it is."""
    adopted = _Adopted()
    try:
        header, rows, unreadable = csvstore.read_rows(csv_path)
    except OSError:
        return adopted, 0
    if "run_id" not in header:
        return adopted, len(rows) + unreadable
    adopted.header = header
    header, rows = single_spelling(header, rows)
    for row in rows:
        if not _RUN_ID.match(row["run_id"]):
            unreadable += 1
            continue
        adopted.rows.append(row)
        folder = runs_dir / row["run_id"]
        if _row_of(folder) is None:
            _write_json(folder / ROW_FILE, row)
            adopted.written.append(row["run_id"])
    return adopted, unreadable


def _folder_rows(runs_dir: Path) -> list[dict[str, str]]:
    """The row.json of every run folder that has a readable one."""
    if not runs_dir.is_dir():
        return []
    return [
        row
        for entry in history_leftovers.entries(runs_dir)
        if _RUN_ID.match(entry.name) and (row := _row_of(Path(entry.path))) is not None
    ]


def _empty_history() -> pd.DataFrame:
    """What `load` gives before any run: no rows, and the columns every history has."""
    return pd.DataFrame(columns=[*HISTORY_LEAD_COLUMNS, "run_id", "started_at", "status", "label", "model"])


def _file_state(path: Path) -> list[int] | None:
    """What changes when a file is written (its size and modification time); None when there is no file."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return [st.st_size, st.st_mtime_ns]


def _header_digest(header: list[str]) -> str:
    return hashlib.sha1("\n".join(header).encode("utf-8", "surrogateescape"), usedforsecurity=False).hexdigest()


def _export_state(path: Path, header: list[str]) -> str:
    """What the index keeps of history.csv as it last wrote it: its file state and its columns."""
    return json.dumps([*(_file_state(path) or (None, None)), _header_digest(header)])


def _write_json(path: Path, payload: dict[str, Any]) -> None:
    text = json.dumps(payload, indent=2, default=str) + "\n"
    csvstore.replace_file(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def _write_parquet(path: Path, frame: pd.DataFrame) -> None:
    # One thread: pyarrow's column threads come from a pool that refuses work once the interpreter is shutting
    # down, which is when the dashboard records a run that its stop (SIGTERM, Ctrl-C) cancelled.
    table = pa.Table.from_pandas(frame, preserve_index=False, nthreads=1)
    csvstore.replace_file(path, lambda tmp: pq.write_table(table, tmp))
