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

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from ..config import SETTINGS as CATALOG
from ..config import Part
from ..config import Setting as Declared
from ..config.catalog import OUTPUT_LENGTHS
from ..engines import backends, in_process_backends
from ..load import output_length, takes
from ..states import IMPORTED
from .tables import describe_column, run_names

NOT_APPLICABLE = "n/a"
NOT_RECORDED = "not recorded"
DEFAULT = "default"
NOT_SET = "not set"
_Row = Mapping[str, Any]


class Where(NamedTuple):
    """What decides whether a setting means something for a row: its backend, load pattern and dataset (None:
    unknown). A history holds few of them, so each setting is judged once per one of them, not once per row."""

    backend: Any
    load_pattern: Any
    dataset_name: Any

    @classmethod
    def of_rows(cls, rows: Sequence[_Row]) -> list[Where]:
        cells = [tuple(row.get(column) for column in cls._fields) for row in rows]
        distinct = {key: cls(*map(_normalised, key)) for key in set(cells)}
        return [distinct[key] for key in cells]


@dataclass(frozen=True)
class Setting:
    """A history column that is a run setting, and the rows it means something for."""

    name: str
    applies: Callable[[Where], bool]
    unset: str = DEFAULT  # a cell left empty: the setting's default, or for an SLO threshold, none


def _always(where: Where) -> bool:
    return True


def _applies(declared: Declared) -> Callable[[Where], bool]:
    """Where the declaration says the setting means something; a row whose backend, load pattern or dataset is
    unknown (an import) is not ruled out."""

    def applies(where: Where) -> bool:
        return declared.applies(backend=where.backend, load_pattern=where.load_pattern) and (
            where.dataset_name is None or takes(where.dataset_name, declared)
        )

    return applies


# One setting for the output length a run asked for, whichever dataset it used (the catalog's declaration of each
# dataset's output length): a random run of 256 tokens and a ShareGPT run fixed at 32 differ in it.
OUTPUT_LENGTH = "output_length"
_OUTPUT_LENGTH_COLUMNS = tuple(declared.key for declared in OUTPUT_LENGTHS)
# A model's own code runs in process only: a server's tokenizer code is not the run's.
_IN_PROCESS_ONLY = ("trust_remote_code",)


def _has_output_length(where: Where) -> bool:
    """A dataset with an output length setting; a trace's records carry their own."""
    return output_length(where.dataset_name) is not None


def _in_process(where: Where) -> bool:
    name = where.backend
    return name is None or name in in_process_backends() or name not in backends()


def _setting(declared: Declared) -> Setting:
    if declared.name in _IN_PROCESS_ONLY:
        return Setting(declared.name, _in_process)
    # An SLO left empty sets no threshold: "default" read as if one had been applied.
    return Setting(declared.key, _applies(declared), NOT_SET if declared.part == Part.SLO else DEFAULT)


def _of(part: Part) -> list[Setting]:
    settings = []
    for declared in CATALOG:
        if declared.part != part or not declared.compared or declared.secret:
            continue
        if declared.output_length:
            continue
        settings.append(_setting(declared))
        if declared.name == "dataset_name":  # the datasets' output lengths, as one, after the dataset's name
            settings.append(Setting(OUTPUT_LENGTH, _has_output_length))
    return settings


# In the order a reader thinks of a run: what ran, on which prompts, under which load, with which knobs.
_FIRST = ("model", "backend")
SETTINGS: tuple[Setting, ...] = (
    Setting("model", _always),
    Setting("backend", _always),
    *_of(Part.DATASET),
    *_of(Part.LOAD),
    Setting("cache_start", _always, NOT_RECORDED),  # the state the run started with, whatever it asked
    *(setting for setting in _of(Part.ENGINE) if setting.name not in _FIRST),
    *_of(Part.GENERATION),
    *_of(Part.SLO),
)
SETTING_NAMES = tuple(setting.name for setting in SETTINGS)
_BY_NAME = {setting.name: setting for setting in SETTINGS}


def setting_cells(runs: pd.DataFrame, names: Sequence[str] = SETTING_NAMES) -> dict[str, list[Any]]:
    """Per setting, one cell per run: its value (ints for whole numbers, None for our own run's default),
    or NOT_APPLICABLE / NOT_RECORDED."""
    rows = runs[_columns_read(runs, names)].to_dict("records")
    wheres = Where.of_rows(rows)
    cells: dict[str, list[Any]] = {}
    for name in names:
        applies, column = _BY_NAME[name].applies, cells.setdefault(name, [])
        verdicts = {where: applies(where) for where in set(wheres)}
        for row, where in zip(rows, wheres):
            value = _normalised(row.get(_column_of(name, row)))
            if not verdicts[where]:
                column.append(NOT_APPLICABLE)
            elif value is None and _is_imported(row):
                column.append(NOT_RECORDED)
            else:
                column.append(value)
    return cells


def applying(runs: pd.DataFrame, names: Sequence[str]) -> pd.DataFrame:
    """Per row and setting of `names`: whether the setting means something for that row (its backend, load pattern
    and dataset). Judged once per distinct one of those: a history holds few."""
    context = [column for column in Where._fields if column in runs]
    if context:
        groups = runs.groupby(context, dropna=False, sort=False).ngroup().to_numpy()
    else:
        groups = np.zeros(len(runs), dtype=int)
    firsts = runs.iloc[np.unique(groups, return_index=True)[1]][context].to_dict("records")
    wheres = Where.of_rows(firsts)  # in group order: np.unique sorts the group numbers
    verdicts = {name: np.array([_BY_NAME[name].applies(where) for where in wheres], dtype=bool) for name in names}
    return pd.DataFrame({name: verdict[groups] for name, verdict in verdicts.items()}, index=runs.index)


def _columns_read(runs: pd.DataFrame, names: Sequence[str]) -> list[str]:
    """The columns of `runs` that the cells of settings `names` depend on: theirs and those saying where they apply."""
    context = ["status", "backend", "dataset_name", "load_pattern", *_OUTPUT_LENGTH_COLUMNS]
    return list(dict.fromkeys(name for name in (*context, *names) if name in runs))


def differing_settings(runs: pd.DataFrame) -> list[str]:
    """The settings that differ between `runs`, in `SETTINGS` order: those with more than one value among
    the runs they apply to and that recorded them. Empty for a single run or repeats of one configuration.
    A cell depends on its own row only, so each distinct row counts once: a year of runs repeats a few setups."""
    columns = _columns_read(runs, SETTING_NAMES)
    distinct = runs.drop_duplicates(subset=columns) if columns else runs.iloc[:1]
    return [
        name for name, column in setting_cells(distinct).items() if len({_key(cell) for cell in _known(column)}) > 1
    ]


def differences(runs: pd.DataFrame, names: Sequence[str]) -> pd.DataFrame:
    """The settings `names` (titled with their unit) against the runs (one text column per run, named by
    `compared_names`): what a reader compares first."""
    cells = setting_cells(runs, names)
    table = pd.DataFrame(
        [[show(cell, _BY_NAME[name].unset) for cell in cells[name]] for name in names],
        index=[_title(name) for name in names],
        columns=compared_names(runs, names),
        dtype=object,
    )
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
    """The rows with an OUTPUT_LENGTH column, as text ("256", DEFAULT for ShareGPT's own lengths, NOT_APPLICABLE for a
    trace's), to show in a table or chart across (numbers as a scale when every run has one). Worked out once per
    distinct row of the columns it depends on, as `differing_settings` is."""
    columns = _columns_read(runs, [OUTPUT_LENGTH])
    if columns:
        groups = runs.groupby(columns, dropna=False, sort=False).ngroup()  # numbered in order of first appearance
    else:  # none of them recorded: one cell for every row
        groups = pd.Series(0, index=runs.index)
    firsts = runs.loc[~groups.duplicated()]
    shown = [show(cell) for cell in setting_cells(firsts, [OUTPUT_LENGTH])[OUTPUT_LENGTH]]
    return runs.assign(**{OUTPUT_LENGTH: [shown[group] for group in groups]})


def telling_settings(runs: pd.DataFrame, names: Sequence[str]) -> list[str]:
    """The fewest of the settings `names` that still tell apart every two runs differing in any of them, in
    `names` order: each in turn the one that splits the runs into the most groups (the earliest on a tie). Two
    runs at concurrency 2 and 8 on ShareGPT fixed at 16 tokens, among random-dataset runs, are told apart by
    their concurrency, not by their dataset and output length."""
    cells = setting_cells(runs, names)
    keys = {name: [_key(cell) for cell in cells[name]] for name in names}

    def groups(chosen: Sequence[str]) -> int:
        return len(set(zip(*(keys[name] for name in chosen)))) if chosen else 1

    chosen: list[str] = []
    while groups(chosen) < groups(names):
        chosen.append(max((name for name in names if name not in chosen), key=lambda name: groups([*chosen, name])))
    return [name for name in names if name in chosen]


def compared_names(runs: pd.DataFrame, names: Sequence[str]) -> list[str]:
    """A unique name per compared run: its values of the settings that tell it apart from the others (see
    `telling_settings`), then who it is (`tables.run_names`): "Concurrency 8 (run 20261201-101500-ab12)",
    "Concurrency 8 (tiny c8)"; who it is alone where `names` is empty (repeats of one configuration)."""
    ids = runs["run_id"].astype(str)
    who = [name if name != run_id else f"run {run_id}" for name, run_id in zip(run_names(runs), ids)]
    what = point_labels(runs, telling_settings(runs, names))
    return [f"{setting} ({run})" if setting else run for setting, run in zip(what, who)]


def point_labels(runs: pd.DataFrame, names: Sequence[str]) -> list[str]:
    """Per run, its values of the settings `names` as "Concurrency 4, Dtype bfloat16": a point's label."""
    cells = setting_cells(runs, names)
    parts = [
        [f"{describe_column(name).label} {show(cell, _BY_NAME[name].unset)}" for cell in cells[name]] for name in names
    ]
    return [", ".join(values) for values in zip(*parts)] if parts else [""] * len(runs)


def show(cell: Any, unset: str = DEFAULT) -> str:
    """A setting's cell as text: 4 rather than 4.0, yes/no for flags, `unset` for an empty one."""
    if cell is None:
        return unset
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
    declared = output_length(_normalised(row.get("dataset_name")))
    return declared.key if declared is not None else name


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
