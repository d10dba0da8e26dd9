"""Reading CSV files for import into the history: LMDeploy's three benchmark scripts and our own history.

The format is told by the header. `profile_pipeline_api.py` and `profile_throughput.py` both write
through `Profiler.save_csv` and so share one header; only the file name (their defaults are
`profile_pipeline_api.csv` and `profile_throughput.csv`) can tell them apart. `profile_restful_api.py`
writes `request_rate` instead of `bs` and `num_prompts`. Original cells are kept verbatim ('-' for
metrics that were not measured, 'inf' when nothing succeeded); loading turns them into numbers. The
history keeps one spelling of each metric (the catalog's): LMDeploy's names that differ from ours
(`duration`, `mean_e2e_latency_ms`) are read as ours (`single_spelling`), in imports and in history files
written before the history kept one spelling.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..config import RunConfig
from ..csvstore import spreadsheet_text
from ..errors import HistoryError
from ..measure.catalog import HISTORY_METRIC_COLUMNS, LEGACY_COLUMNS, LMDEPLOY_COLUMNS
from ..states import LoadPattern

SAVE_CSV_HYPERPARAMS = (
    "backend",
    "bs",
    "dataset_name",
    "sharegpt_output_len",
    "random_input_len",
    "random_output_len",
    "random_range_ratio",
    "num_prompts",
)


def lmdeploy_hyperparams(config: RunConfig) -> list[tuple[str, Any]]:
    """The hyperparameter columns profile_pipeline_api.py writes before the Profiler's (SAVE_CSV_HYPERPARAMS),
    in its order, for this run: each the setting of its name, but LMDeploy's batch size."""
    load = config.load
    # A request-rate run has no batch size, only an optional cap on requests in flight.
    bs = load.max_concurrency if load.load_pattern == LoadPattern.REQUEST_RATE else load.concurrency
    return [(column, bs if column == "bs" else config.value(column)) for column in SAVE_CSV_HYPERPARAMS]


# The columns of `Profiler.save_csv` as the two offline scripts call it.
SAVE_CSV_COLUMNS = SAVE_CSV_HYPERPARAMS + LMDEPLOY_COLUMNS
# The history's first columns: the same, each metric in the history's spelling.
HISTORY_LEAD_COLUMNS = SAVE_CSV_HYPERPARAMS + HISTORY_METRIC_COLUMNS
RESTFUL_COLUMNS = (
    "backend",
    "dataset_name",
    "sharegpt_output_len",
    "random_input_len",
    "random_output_len",
    "random_range_ratio",
    "request_rate",
    *LMDEPLOY_COLUMNS,
)
_TEXT_COLUMNS = {"backend", "dataset_name"}
# LMDeploy's columns that hold numbers, in whichever of its CSVs they appear, under either spelling.
NUMBER_COLUMNS = frozenset(SAVE_CSV_COLUMNS + RESTFUL_COLUMNS + HISTORY_METRIC_COLUMNS) - _TEXT_COLUMNS
# Cells LMDeploy writes for numbers it has not got: None as '', unmeasured stream metrics as '-'.
_MISSING_CELLS = {"", "-"}

PIPELINE_SCRIPT = "profile_pipeline_api.py"
THROUGHPUT_SCRIPT = "profile_throughput.py"
RESTFUL_SCRIPT = "profile_restful_api.py"
HISTORY_SOURCE = "history"


@dataclass
class ParsedCsv:
    """A CSV read for import: which script wrote it, under which timing semantics, and its rows."""

    source: str
    load_pattern: str
    header: list[str]
    rows: list[dict[str, str]]


def parse_import(data: bytes, name: str) -> ParsedCsv:
    """Read and check a CSV for import; any problem is one HistoryError sentence naming the file."""
    header, rows = _read_csv(data, name)
    if "run_id" in header:  # the history checks its own number columns: it knows which they are
        return ParsedCsv(HISTORY_SOURCE, "", *single_spelling(header, rows))
    if set(header) == set(RESTFUL_COLUMNS):
        parsed = ParsedCsv(RESTFUL_SCRIPT, "request_rate", header, rows)
    elif tuple(header[-len(LMDEPLOY_COLUMNS) :]) == LMDEPLOY_COLUMNS and len(header) > len(LMDEPLOY_COLUMNS):
        source, load_pattern = _offline_script(name)
        parsed = ParsedCsv(source, load_pattern, header, rows)
    else:
        raise HistoryError(
            f"{name} is not a CSV written by LMDeploy's benchmark scripts or by this app: "
            f"its header starts with {', '.join(header[:4])}."
        )
    check_numbers(parsed, name, [col for col in header if col in NUMBER_COLUMNS])
    parsed.header, parsed.rows = single_spelling(parsed.header, parsed.rows)
    return parsed


def single_spelling(header: list[str], rows: list[dict[str, str]]) -> tuple[list[str], list[dict[str, str]]]:
    """The table with LMDeploy's spellings of our metrics (LEGACY_COLUMNS) read as ours: a row's value under
    our name stays; an empty one takes the value under LMDeploy's name, so nothing recorded is lost."""
    legacy = [old for old in LEGACY_COLUMNS if old in header]
    if not legacy:
        return header, rows
    renamed = {old: LEGACY_COLUMNS[old] for old in legacy}
    single_header = list(dict.fromkeys(renamed.get(col, col) for col in header))
    single_rows = []
    for row in rows:
        single = {col: cell for col, cell in row.items() if col not in renamed}
        for old, new in renamed.items():
            if single.get(new, "") == "":
                single[new] = row.get(old, "")
        single_rows.append(single)
    return single_header, single_rows


def _read_csv(data: bytes, name: str) -> tuple[list[str], list[dict[str, str]]]:
    try:
        text = data.decode("utf-8-sig")
        reader = csv.reader(io.StringIO(text, newline=""))
        table = [[spreadsheet_text(cell) for cell in cells] for cells in reader if cells]
    except (UnicodeDecodeError, csv.Error) as exc:
        raise HistoryError(f"{name} is not a readable CSV file ({exc}).") from exc
    if not table:
        raise HistoryError(f"{name} is empty; there is nothing to import.")
    header, body = [cell.strip() for cell in table[0]], table[1:]
    if len(set(header)) != len(header):
        raise HistoryError(f"{name} has a header with repeated column names, so its rows cannot be matched to columns.")
    if not body:
        raise HistoryError(f"{name} has a header but no rows; there is nothing to import.")
    for line_number, cells in enumerate(body, start=2):
        if len(cells) != len(header):
            raise HistoryError(
                f"Line {line_number} of {name} has {len(cells)} cells but the header has {len(header)} columns "
                "(LMDeploy appends rows without checking the header, so settings may have changed between runs)."
            )
    return header, [dict(zip(header, cells)) for cells in body]


def _offline_script(name: str) -> tuple[str, str]:
    """Which offline script wrote a save_csv file, from its name; they write identical headers."""
    lowered = name.lower()
    if "throughput" in lowered:
        return THROUGHPUT_SCRIPT, "concurrency"
    if "pipeline" in lowered:
        return PIPELINE_SCRIPT, "batch"
    return f"{PIPELINE_SCRIPT} or {THROUGHPUT_SCRIPT}", ""


def check_numbers(parsed: ParsedCsv, name: str, columns: Iterable[str]) -> None:
    """HistoryError naming the first line and column of `columns` whose cell is not a number (nor '' or '-'):
    imported, it would turn the whole column into text."""
    columns = list(columns)
    for line_number, row in enumerate(parsed.rows, start=2):
        for col in columns:
            cell = row[col].strip()
            if cell not in _MISSING_CELLS and not is_number(cell):
                raise HistoryError(
                    f"Line {line_number} of {name}: '{col}' holds '{cell}', which is not a number; "
                    "nothing was imported."
                )


def is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True
