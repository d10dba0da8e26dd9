"""The history's index: the runs in SQLite (Python's sqlite3, WAL), built from the run folders.

Each run is one row of `runs` and one of `cells`: its cells as written (`cells`, JSON: what row() and the history.csv
export give back verbatim), and one typed column per history column, for the pages to load, filter and sort. A column
gets its type the first time it holds a value, from its name (the text columns of the settings and identity, LMDeploy's
number columns) or else from that value: whole numbers, numbers, True/False, text. A cell that does not fit its
column's type (a hand edit, a foreign import) is kept in `cells` and reads as missing in the typed column, as it always
has. `columns` keeps the order of the columns as history.csv writes them, and `meta` the schema version and a write
counter that tells a reader its table changed.

SQLite's own transactions make the writers of two dashboards and a CLI safe together (every write is one
`BEGIN IMMEDIATE` transaction; readers never wait in WAL mode), and whatever a writer does with the history inside its
transaction (history.csv's export) happens one writer at a time. The typed table is read through ADBC's SQLite driver,
straight into Arrow columns: sqlite3's row-by-row tuples and pandas' typing of them took seconds for a year of runs.
The index holds nothing the folders do not: a lost or outdated index is rebuilt from them (History.reindex).
"""

from __future__ import annotations

import contextlib
import math
import shutil
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Mapping
from enum import StrEnum
from pathlib import Path

import adbc_driver_sqlite.dbapi as adbc_sqlite
import numpy as np
import orjson
import pandas as pd
import pyarrow as pa

from ..errors import HistoryError

INDEX_FILE = "history.sqlite"
SCHEMA_VERSION = 1
BUSY_TIMEOUT_S = 60.0  # how long a writer waits for another one's transaction
# ADBC types each column from its first batch of rows: one batch for the whole table (and the runs that writers add
# meanwhile), so a column whose first rows are empty is typed by the rows that are not.
_BATCH_MARGIN_ROWS = 100_000
_EXACT_FLOAT_INT = 2**53  # whole numbers up to this are exact as floats, and fit int64
_MISSING_CELLS = ("", "-")  # what the history and LMDeploy write for a value they have not got
_BOOL_CELLS = {"True": 1.0, "False": 0.0}


class ColumnType(StrEnum):
    """What a history column holds, as loaded: `load` gives int64, float64, boolean and str columns."""

    INTEGER = "integer"
    NUMBER = "number"
    BOOL = "bool"
    TEXT = "text"


_DECLARED = {ColumnType.INTEGER: "REAL", ColumnType.NUMBER: "REAL", ColumnType.BOOL: "REAL", ColumnType.TEXT: "TEXT"}


def number_cell(cell: str) -> float | None:
    """The number a cell holds, or None for one that holds none (text, empty, '-')."""
    try:
        value = float(cell)
    except ValueError:
        return None
    return None if math.isnan(value) else value


def _is_whole(cell: str, value: float) -> bool:
    return value.is_integer() and cell.strip().lstrip("+-").isdigit()


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class RunIndex:
    """The index at `path`. `text_column(name)` says which columns are text whatever their cells hold."""

    def __init__(self, path: Path, text_column: Callable[[str], bool]):
        self.path = path
        self._text_column = text_column

    # Reading

    def exists(self) -> bool:
        """Whether the index is there, in this schema version (an older one is rebuilt, as a missing one is)."""
        if not self.path.is_file():
            return False
        try:
            with self._connection() as db:
                found = db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
        except (sqlite3.Error, HistoryError):
            return False
        return found is not None and found[0] == SCHEMA_VERSION

    def generation(self) -> int:
        """A number that changes with every write to the index: a reader's table is current while it holds."""
        with self._connection() as db:
            return int(db.execute("SELECT value FROM meta WHERE key = 'generation'").fetchone()[0])

    def header(self) -> list[str]:
        """The history's columns, in history.csv's order."""
        with self._connection() as db:
            return _header(db)

    def run_ids(self) -> set[str]:
        with self._connection() as db:
            return {run_id for (run_id,) in db.execute("SELECT run_id FROM runs")}

    def column_types(self) -> dict[str, ColumnType]:
        """The type of each column that has held a value."""
        with self._connection() as db:
            found = db.execute("SELECT name, type FROM columns WHERE type IS NOT NULL").fetchall()
        return {name: ColumnType(kind) for name, kind in found}

    def row(self, run_id: str) -> dict[str, str] | None:
        """The run's cells as written; None when the index has no such run."""
        with self._connection() as db:
            found = db.execute("SELECT cells FROM cells WHERE run_id = ?", (run_id,)).fetchone()
        return None if found is None else orjson.loads(found[0])

    def rows(self, run_ids: Iterable[str] | None = None) -> tuple[list[str], list[dict[str, str]]]:
        """The header and the rows (of `run_ids`, else all), cells as written, in the order they were recorded."""
        with self._connection() as db:
            header = _header(db)
            cells = db.execute(_CELLS_IN_ORDER).fetchall()
        wanted = None if run_ids is None else set(run_ids)
        return header, [orjson.loads(text) for run_id, text in cells if wanted is None or run_id in wanted]

    def frame(self, columns: Iterable[str] | None = None, run_ids: Iterable[str] | None = None) -> pd.DataFrame:
        """Every run (of `run_ids`, when given), one row each in the order recorded, one column per history column (of
        `columns` the history has, with run_id, when given): numbers as int64 (whole numbers that fit, no cell missing
        among the rows read) or float64 (missing as NaN), True/False as boolean, the rest as str (missing as '')."""
        with self._connection() as db:
            header = _header(db)
            if columns is not None:
                wanted = {"run_id", *columns}
                header = [name for name in header if name in wanted]
            types = dict(db.execute("SELECT name, type FROM columns WHERE type IS NOT NULL").fetchall())
            (count,) = db.execute("SELECT count(*) FROM runs").fetchone()
        typed = [name for name in header if name in types]
        select = ", ".join(["run_id", *(_quoted(f"c:{name}") for name in typed)])
        # The runs asked for go to SQLite as one JSON array: its unique index on run_id finds them.
        where, parameters = ("", None) if run_ids is None else (_OF_RUN_IDS, (orjson.dumps(list(run_ids)).decode(),))
        try:
            with adbc_sqlite.connect(str(self.path)) as connection, connection.cursor() as cursor:
                # ADBC's connection waits for no lock: a reader that meets a writer's checkpoint would fail at once
                # with "database is locked" (a page drawn beside two writers did), where sqlite3's waits.
                cursor.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
                cursor.fetchall()
                cursor.adbc_statement.set_options(**{"adbc.sqlite.query.batch_rows": str(count + _BATCH_MARGIN_ROWS)})
                cursor.execute(f"SELECT {select} FROM runs{where} ORDER BY seq", parameters)
                table = cursor.fetch_arrow_table()
        except Exception as exc:  # ADBC's errors are OSError or its own Error classes, by driver version
            raise HistoryError(f"Cannot read the history's index {self.path}: {exc}") from exc
        arrays = dict(zip(["run_id", *typed], table.columns))
        rows = table.num_rows
        loaded: dict[str, pd.Series | np.ndarray] = {}
        for name in header:
            if name == "run_id":
                loaded[name] = _loaded(arrays["run_id"], ColumnType.TEXT, rows)
            elif name in types:
                loaded[name] = _loaded(arrays[name], ColumnType(types[name]), rows)
            else:  # no value yet: a text column of empty cells, else a number column of NaN
                loaded[name] = (
                    _texts(pa.nulls(rows, pa.large_string())) if self._text_column(name) else np.full(rows, np.nan)
                )
        return pd.DataFrame(loaded, index=pd.RangeIndex(rows))

    # Writing

    @contextlib.contextmanager
    def writing(self) -> Iterator[IndexWriter]:
        """One write transaction: what the writer does inside it is one writer's at a time, and all of it is in the
        index, or none of it (an exception rolls it back and passes on)."""
        with self._connection() as db:
            try:
                db.execute("BEGIN IMMEDIATE")
                _create(db)
                writer = IndexWriter(db, self._text_column)
                yield writer
                db.execute("UPDATE meta SET value = value + 1 WHERE key = 'generation'")
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise

    @contextlib.contextmanager
    def _connection(self) -> Iterator[sqlite3.Connection]:
        try:
            db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        except sqlite3.Error as exc:
            raise HistoryError(f"Cannot open the history's index {self.path}: {exc}.") from exc
        try:
            db.execute("PRAGMA journal_mode = WAL")
            yield db
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                raise HistoryError(f"The history's index {self.path} is not built yet.") from exc
            raise HistoryError(f"Cannot use the history's index {self.path}: {exc}{self._room(exc)}.") from exc
        except sqlite3.Error as exc:
            raise HistoryError(f"Cannot use the history's index {self.path}: {exc}{self._room(exc)}.") from exc
        finally:
            db.close()

    def _room(self, exc: sqlite3.Error) -> str:
        """For a failed read or write of the disk, the room its file system has left: SQLite says "disk I/O error"
        where a full disk refused its shared-memory file."""
        if not getattr(exc, "sqlite_errorname", "").startswith(("SQLITE_IOERR", "SQLITE_FULL")):
            return ""
        try:
            free = shutil.disk_usage(self.path.parent).free
        except OSError:
            return ""
        return f" ({free:,} bytes free on its disk)"


class IndexWriter:
    """What a write transaction can do (RunIndex.writing)."""

    def __init__(self, db: sqlite3.Connection, text_column: Callable[[str], bool]):
        self._db = db
        self._text_column = text_column
        self._types: dict[str, ColumnType | None] = {
            name: None if kind is None else ColumnType(kind)
            for name, kind in db.execute("SELECT name, type FROM columns ORDER BY position")
        }

    def clear(self) -> None:
        """Remove every run and column (a rebuild starts from nothing)."""
        self._db.execute("DROP TABLE runs")
        self._db.execute("DELETE FROM cells")
        self._db.execute("DELETE FROM columns")
        _create(self._db)
        self._types = {}

    def put(self, rows: Iterable[Mapping[str, str]]) -> int:
        """Add the rows (cells as text, keyed by column; `run_id` among them), replacing any of the same run id;
        returns how many it replaced."""
        replaced = 0
        for row in rows:
            values = {}
            for name, cell in row.items():
                column_type = self._column(name, cell)
                if column_type is not None:
                    values[f"c:{name}"] = _stored(cell, column_type)
            # A row put again keeps its place (its seq): the order of the rows stays the order in which their
            # columns came, which a rebuild from history.csv's order gives back.
            found = self._db.execute("SELECT seq FROM runs WHERE run_id = ?", (row["run_id"],)).fetchone()
            replaced += self._delete(row["run_id"])
            names = ["seq", "run_id", *values]
            self._db.execute(
                f"INSERT INTO runs ({', '.join(map(_quoted, names))}) VALUES ({', '.join('?' * len(names))})",
                (found[0] if found else None, row["run_id"], *values.values()),
            )
            self._db.execute(
                "INSERT INTO cells (run_id, cells) VALUES (?, ?)", (row["run_id"], orjson.dumps(dict(row)))
            )
        return replaced

    def delete(self, run_ids: Iterable[str]) -> int:
        """Remove these runs; how many there were."""
        return sum(self._delete(run_id) for run_id in run_ids)

    def _delete(self, run_id: str) -> int:
        self._db.execute("DELETE FROM cells WHERE run_id = ?", (run_id,))
        return self._db.execute("DELETE FROM runs WHERE run_id = ?", (run_id,)).rowcount

    def rows(self) -> tuple[list[str], list[dict[str, str]]]:
        """The header and every row as this transaction sees them (for the history.csv export it writes)."""
        header = _header(self._db)
        return header, [orjson.loads(text) for _, text in self._db.execute(_CELLS_IN_ORDER)]

    def header(self) -> list[str]:
        return _header(self._db)

    def run_ids(self) -> set[str]:
        return {run_id for (run_id,) in self._db.execute("SELECT run_id FROM runs")}

    def meta(self, key: str) -> str | None:
        found = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if found is None else str(found[0])

    def set_meta(self, key: str, value: str) -> None:
        self._db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))

    def _column(self, name: str, cell: str) -> ColumnType | None:
        """The column's type, made known (and its typed column added) by its first value; None while it has none."""
        if name not in self._types:
            self._db.execute("INSERT INTO columns (name, position) VALUES (?, ?)", (name, len(self._types)))
            self._types[name] = None
        known = self._types[name]
        if name == "run_id":
            return None
        if known is None:
            if cell in _MISSING_CELLS:
                return None
            known = self._types[name] = self._first_type(name, cell)
            self._db.execute(f"ALTER TABLE runs ADD COLUMN {_quoted(f'c:{name}')} {_DECLARED[known]}")
            self._db.execute("UPDATE columns SET type = ? WHERE name = ?", (known.value, name))
        elif known == ColumnType.INTEGER and (value := number_cell(cell)) is not None and not _is_whole(cell, value):
            known = self._types[name] = ColumnType.NUMBER  # whole numbers so far, and now a fraction: numbers
            self._db.execute("UPDATE columns SET type = ? WHERE name = ?", (known.value, name))
        return known

    def _first_type(self, name: str, cell: str) -> ColumnType:
        if self._text_column(name):
            return ColumnType.TEXT
        if cell in _BOOL_CELLS:
            return ColumnType.BOOL
        try:
            value = float(cell)  # 'nan' and 'inf' too: a number column's cells
        except ValueError:
            return ColumnType.TEXT
        return ColumnType.INTEGER if _is_whole(cell, value) else ColumnType.NUMBER


def _stored(cell: str, column_type: ColumnType) -> float | str | None:
    """A cell as its typed column holds it: None (missing) where it holds no value of that type."""
    if column_type == ColumnType.TEXT:
        return cell
    if column_type == ColumnType.BOOL:
        return _BOOL_CELLS.get(cell)
    return number_cell(cell)


def _loaded(values: pa.ChunkedArray, column_type: ColumnType, rows: int) -> pd.Series | np.ndarray:
    """A typed column as `frame` gives it. ADBC types a column without a value among the rows read as int64."""
    if column_type == ColumnType.TEXT:
        return _texts(values if pa.types.is_string(values.type) else pa.nulls(rows, pa.large_string()))
    numbers = values.to_numpy(zero_copy_only=False).astype(float, copy=False)
    if column_type == ColumnType.NUMBER:
        return numbers
    present = ~np.isnan(numbers)
    if column_type == ColumnType.BOOL:
        return pd.Series(numbers == 1.0, dtype="boolean").mask(~present)
    if column_type == ColumnType.INTEGER and present.all() and (np.abs(numbers) <= _EXACT_FLOAT_INT).all():
        return numbers.astype(np.int64)
    return numbers


def _texts(values: pa.Array | pa.ChunkedArray) -> pd.Series:
    """A text column as pandas' str, missing cells as '': built on the Arrow strings as they are, where
    `to_pandas()` took ten times as long for the same column."""
    return pd.Series(pd.arrays.ArrowStringArray(values.fill_null(""), dtype=_TEXT))


_TEXT = pd.StringDtype("pyarrow", na_value=np.nan)  # pandas' str
_OF_RUN_IDS = " WHERE run_id IN (SELECT value FROM json_each(?))"
_CELLS_IN_ORDER = "SELECT runs.run_id, cells.cells FROM runs JOIN cells USING (run_id) ORDER BY runs.seq"


def _header(db: sqlite3.Connection) -> list[str]:
    return [name for (name,) in db.execute("SELECT name FROM columns ORDER BY position")]


def _create(db: sqlite3.Connection) -> None:
    db.execute("CREATE TABLE IF NOT EXISTS runs (seq INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL UNIQUE)")
    # Apart from the typed columns: a scan of those reads typed values only, not a row's text spilled over pages.
    db.execute("CREATE TABLE IF NOT EXISTS cells (run_id TEXT PRIMARY KEY, cells BLOB NOT NULL)")
    db.execute("CREATE TABLE IF NOT EXISTS columns (name TEXT PRIMARY KEY, position INTEGER NOT NULL, type TEXT)")
    db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value)")
    db.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('schema', ?)", (SCHEMA_VERSION,))
    db.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('generation', 0)")
