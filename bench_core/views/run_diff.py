"""What differs between runs: the settings (model, backend, dataset, prompts, output length, load, every
engine and generation knob, the SLO) whose values are not the same across a set of history rows.

A setting counts only where it means something. An engine knob means nothing on a backend that does not
use it (a CPU run records TurboMind's knobs as empty), a random input length nothing on ShareGPT prompts,
a request rate nothing outside the request_rate pattern; such a cell is "n/a" and is never a difference.
An LMDeploy row imported from its CSV records few settings: what it lacks is "not recorded", unknown
rather than different. An empty cell of our own run is the setting's default (no session length cap, the
dataset's own output lengths), a value like any other.

Pure functions on history rows (`History.load()`); no I/O, no streamlit.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from ..config import ENGINE_KNOBS, SERVER_BACKEND, DatasetConfig, EngineConfig, GenerationSettings, LoadConfig
from ..states import IMPORTED
from .tables import describe_column, run_names

NOT_APPLICABLE = "n/a"
NOT_RECORDED = "not recorded"
DEFAULT = "default"
# Not compared: a credential and how a run is reported. LoadConfig's `duration_s` (a time limit) shares its
# name with the measured benchmark duration, the history column that holds the latter.
_NOT_SETTINGS = {"api_key", "log_level", "duration_s"}
_Row = Mapping[str, Any]


@dataclass(frozen=True)
class Setting:
    """A history column that is a run setting, and the rows it means something for."""

    name: str
    applies: Callable[[_Row], bool]


def _always(row: _Row) -> bool:
    return True


def _with_cell(column: str, values: tuple[str, ...]) -> Callable[[_Row], bool]:
    """Applies where `column` holds one of `values`, or is unknown (then nothing rules it out)."""
    def applies(row: _Row) -> bool:
        cell = _normalised(row.get(column))
        return cell is None or cell in values
    return applies


_BY_RATE = ("request_rate",)
_AT_ONCE = ("batch", "concurrency")
_KNOB_BACKENDS = {knob.name: knob.backends for knob in ENGINE_KNOBS}
_LOAD_APPLIES = {
    "concurrency": _with_cell("load_pattern", _AT_ONCE),
    **{name: _with_cell("load_pattern", _BY_RATE)
       for name in ("request_rate", "burstiness", "exact_rate_arrivals", "max_concurrency")},
}
_DATASET_APPLIES = {name: _with_cell("dataset_name", ("random",)) for name in ("random_input_len", "random_range_ratio")}
# One setting for the output length a run asked for, whichever dataset it used: a random run of 256 tokens
# and a ShareGPT run fixed at 32 differ in it.
OUTPUT_LENGTH = "output_length"
_OUTPUT_LENGTH_COLUMNS = {"random": "random_output_len", "sharegpt": "sharegpt_output_len"}


def _fields(part: type) -> list[str]:
    return [f.name for f in dataclasses.fields(part) if f.name not in _NOT_SETTINGS]


def _dataset_settings() -> list[Setting]:
    """The dataset's fields, its two output lengths as the one OUTPUT_LENGTH after the dataset's name."""
    settings = []
    for name in _fields(DatasetConfig):
        if name in _OUTPUT_LENGTH_COLUMNS.values():
            continue
        settings.append(Setting(name, _DATASET_APPLIES.get(name, _always)))
        if name == "dataset_name":
            settings.append(Setting(OUTPUT_LENGTH, _always))
    return settings


def _engine_setting(name: str) -> Setting:
    if name in _KNOB_BACKENDS:
        return Setting(name, _with_cell("backend", _KNOB_BACKENDS[name]))
    if name == "trust_remote_code":  # loads the model's own code: in-process engines only
        return Setting(name, lambda row: _normalised(row.get("backend")) != SERVER_BACKEND)
    return Setting(name, _always)


# In the order a reader thinks of a run: what ran, on which prompts, under which load, with which knobs.
SETTINGS: tuple[Setting, ...] = (
    Setting("model", _always),
    Setting("backend", _always),
    *_dataset_settings(),
    *(Setting(name, _LOAD_APPLIES.get(name, _always)) for name in _fields(LoadConfig)),
    *(_engine_setting(name) for name in _fields(EngineConfig) if name not in ("model", "backend")),
    *(Setting(name, _always) for name in _fields(GenerationSettings)),
    *(Setting(f"slo_{name}_s", _always) for name in ("ttft", "tpot", "e2e")),
)
SETTING_NAMES = tuple(setting.name for setting in SETTINGS)
_BY_NAME = {setting.name: setting for setting in SETTINGS}


def setting_cells(runs: pd.DataFrame, names: Sequence[str] = SETTING_NAMES) -> dict[str, list[Any]]:
    """Per setting, one cell per run: its value (ints for whole numbers, None for our own run's default),
    or NOT_APPLICABLE / NOT_RECORDED."""
    context = ["status", "backend", "dataset_name", "load_pattern", *_OUTPUT_LENGTH_COLUMNS.values()]
    rows = runs[list(dict.fromkeys(name for name in (*context, *names) if name in runs))].to_dict("records")
    cells: dict[str, list[Any]] = {}
    for name in names:
        applies, column = _BY_NAME[name].applies, cells.setdefault(name, [])
        for row in rows:
            value = _normalised(row.get(_column_of(name, row)))
            if not applies(row):
                column.append(NOT_APPLICABLE)
            elif value is None and _is_imported(row):
                column.append(NOT_RECORDED)
            else:
                column.append(value)
    return cells


def differing_settings(runs: pd.DataFrame) -> list[str]:
    """The settings that differ between `runs`, in `SETTINGS` order: those with more than one value among
    the runs they apply to and that recorded them. Empty for a single run or repeats of one configuration."""
    return [name for name, column in setting_cells(runs).items() if len({_key(cell) for cell in _known(column)}) > 1]


def differences(runs: pd.DataFrame, names: Sequence[str]) -> pd.DataFrame:
    """The settings `names` (titled with their unit) against the runs (one text column per run, named by
    `tables.run_names`): what a reader compares first."""
    cells = setting_cells(runs, names)
    table = pd.DataFrame([[show(cell) for cell in cells[name]] for name in names],
                         index=[_title(name) for name in names], columns=run_names(runs), dtype=object)
    table.index.name = "setting"
    return table


def default_setting(runs: pd.DataFrame, names: Sequence[str]) -> str | None:
    """The setting to chart across, among the differing `names`: the one taking the most values (the one
    varied, where runs over a range of it were picked), numbers (a scale) before text, earliest on a tie;
    None when nothing differs."""
    cells = setting_cells(runs, names)

    def rank(name: str) -> tuple[int, bool]:
        known = _known(cells[name])
        numeric = all(isinstance(cell, (int, float)) and not isinstance(cell, bool) for cell in known)
        return len({_key(cell) for cell in known}), numeric

    return max(names, key=rank) if names else None


def repeat_groups(runs: pd.DataFrame, differing: list[str] | None = None) -> list[int]:
    """A group number per run: runs with the same value of every differing setting (`differing`, when the caller
    has worked them out already) are repeats of one configuration and share a number (0, 1, ... in order of
    first appearance)."""
    names = differing_settings(runs) if differing is None else differing
    cells = setting_cells(runs, names)
    keys = list(zip(*(map(_key, cells[name]) for name in names))) if names else [()] * len(runs)
    numbers: dict[tuple, int] = {}
    return [numbers.setdefault(key, len(numbers)) for key in keys]


def with_output_length(runs: pd.DataFrame) -> pd.DataFrame:
    """The rows with an OUTPUT_LENGTH column, as text ("256", DEFAULT for ShareGPT's own lengths), to show
    in a table or chart across (numbers as a scale when every run has one)."""
    return runs.assign(**{OUTPUT_LENGTH: [show(cell) for cell in setting_cells(runs, [OUTPUT_LENGTH])[OUTPUT_LENGTH]]})


def point_labels(runs: pd.DataFrame, names: Sequence[str]) -> list[str]:
    """Per run, its values of the settings `names` as "Concurrency 4, Dtype bfloat16": a point's label."""
    cells = setting_cells(runs, names)
    parts = [[f"{describe_column(name).label} {show(cell)}" for cell in cells[name]] for name in names]
    return [", ".join(values) for values in zip(*parts)] if parts else [""] * len(runs)


def show(cell: Any) -> str:
    """A setting's cell as text: 4 rather than 4.0, yes/no for flags, DEFAULT for an empty one."""
    if cell is None:
        return DEFAULT
    if isinstance(cell, bool):
        return "yes" if cell else "no"
    if isinstance(cell, float):
        return f"{cell:g}"
    return str(cell)


def _title(name: str) -> str:
    return describe_column(name).title.strip()  # "Async", not "Async " (async_)


def _column_of(name: str, row: _Row) -> str:
    """The history column holding a setting for this row: OUTPUT_LENGTH reads the dataset's own length column."""
    if name != OUTPUT_LENGTH:
        return name
    return _OUTPUT_LENGTH_COLUMNS.get(_normalised(row.get("dataset_name")), "sharegpt_output_len")


def _known(column: list[Any]) -> list[Any]:
    return [cell for cell in column if cell not in (NOT_APPLICABLE, NOT_RECORDED)]


def _is_imported(row: _Row) -> bool:
    return _normalised(row.get("status")) == IMPORTED


def _normalised(value: Any) -> Any:
    """A history cell as a comparable value: None when empty, ints for whole numbers, text stripped."""
    if value is None or value is pd.NA or value is pd.NaT:
        return None
    if pd.api.types.is_bool(value):
        return bool(value)
    if isinstance(value, (int, float)) or pd.api.types.is_number(value):
        number = float(value)
        if math.isnan(number):
            return None
        return int(number) if number.is_integer() else number
    text = str(value).strip()
    return text or None


def _key(cell: Any) -> tuple[str, str]:
    """A hashable key that keeps True apart from 1 and "4" apart from 4."""
    return type(cell).__name__, repr(cell)
