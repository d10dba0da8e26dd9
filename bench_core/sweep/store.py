"""A sweep's records: its plan, saved as JSON, and which of its runs the history holds.

The plan is saved under `<history root>/sweeps/<sweep_id>.json` before the first run, atomically, and without its
credentials (a server URL's user-info, secret values of the request body are masked, as in the history); a resume
asks for them again (`with_credentials`). How a history row
ties back to its sweep (the runner writes both columns): `sweep_id`, and `sweep_repeat`, the 0-based
repeat index. The point itself needs no column of its own: the history keeps every flat config key, so
the swept settings are the row's own columns. From these, `remaining` gives the runs a resume still has
to do, in this process or after a restart, `point_repeats` where each point of a sweep with a target stands (how
many more runs it is due), a tune's trials (`trials_of`, its journal beside its plan), and `past_sweeps` lists every saved sweep with its progress.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd

from .. import csvstore
from ..config import RunConfig, setting
from ..errors import ConfigError, HistoryError
from ..measure.catalog import with_derived
from ..redact import MASK, redact, redact_text
from ..states import RunState
from ..store.history import History
from .plan import PlannedRun, SweepPlan, parse_server_settings
from .precision import PointPrecision, judge
from .tune import TRIAL_COLUMNS

SWEEP_ID = "sweep_id"
SWEEP_REPEAT = "sweep_repeat"
SWEEPS_FOLDER = "sweeps"
SERVERS_FOLDER = "servers"  # under SWEEPS_FOLDER: a record of each server a sweep runs (sweep.server)
SERVER_SETTINGS = "server_settings"
_SWEEP_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")  # a file name: 100 characters at most
# The settings that may carry a credential: their saved form is masked.
CREDENTIAL_SETTINGS = ("base_url", "extra_request_body")


def plan_path(history: History, sweep_id: str) -> Path:
    if not _SWEEP_ID.match(sweep_id or ""):
        raise HistoryError(
            f"'{redact_text(str(sweep_id))[:40]}' is not a sweep id; sweep ids hold up to 100 letters, "
            "digits, '-', '_' and '.'."
        )
    return history.root / SWEEPS_FOLDER / f"{sweep_id}.json"


def server_records(history: History) -> Path:
    """The folder where a sweep notes each server it runs, for a later sweep to find one that outlived it."""
    return history.root / SWEEPS_FOLDER / SERVERS_FOLDER


def save_plan(history: History, plan: SweepPlan) -> None:
    path = plan_path(history, plan.sweep_id)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        csvstore.replace_bytes(path, (json.dumps(redact(plan.to_dict()), indent=2) + "\n").encode("utf-8"))
    except OSError as exc:
        raise HistoryError(f"Cannot save the sweep plan to {path}: {exc.strerror or exc}.") from exc


def with_credentials(plan: SweepPlan, given: Mapping[str, str]) -> SweepPlan:
    """`plan` with the credentials its saved form masked put back from `given` (setting name -> the value as the
    user gives it again: a URL with its user-info, a request body with its keys); ConfigError naming what is
    still needed. A given value counts only where it masks to the saved one: the same server, the same body."""
    restored = copy.deepcopy(plan.base)
    missing = []
    for name in CREDENTIAL_SETTINGS:
        saved = getattr(restored.engine, name)
        if MASK not in saved:
            continue
        again = given.get(name) or ""
        if again and redact_text(again) == saved:
            setattr(restored.engine, name, again)
        else:
            missing.append(setting(name).cli_flag)
    if missing:
        raise ConfigError(
            f"Sweep {plan.sweep_id} was started with credentials in {' and '.join(missing)}, which its "
            f"saved plan does not keep: resume it with {' and '.join(missing)} given again."
        )
    return dataclasses.replace(plan, base=restored)


def load_plan(history: History, sweep_id: str) -> SweepPlan:
    path = plan_path(history, sweep_id)
    if not path.exists():
        raise HistoryError(f"There is no sweep {sweep_id} in {path.parent} (its plan file {path.name} is missing).")
    try:
        return SweepPlan.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError, ConfigError) as exc:  # ConfigError: a value now refused
        raise HistoryError(f"The plan of sweep {sweep_id} ({path}) is unreadable ({exc}).") from exc


# A find-max sweep's probes, one row each as it ends: the point (its server settings as JSON), the load, whether it
# met the target, its SLO attainment, its run and why it stopped early ("" where it ran to its end). A resume replays
# them instead of running them again; the Sweep page charts them.
PROBE_COLUMNS = ("point", "load", "met", "attainment", "run_id", "stopped_early")


def probe_journal_path(history: History, sweep_id: str) -> Path:
    return plan_path(history, sweep_id).with_suffix(".probes.csv")


def append_probe(history: History, sweep_id: str, probe: Mapping[str, Any]) -> None:
    _append_journal(probe_journal_path(history, sweep_id), "probe", probe, PROBE_COLUMNS)


def _append_journal(path: Path, what: str, row: Mapping[str, Any], columns: tuple[str, ...]) -> None:
    try:
        csvstore.append_row(path, {column: row[column] for column in columns})
    except OSError as exc:
        raise HistoryError(f"Cannot note the {what} in {path}: {exc.strerror or exc}.") from exc


def trial_journal_path(history: History, sweep_id: str) -> Path:
    return plan_path(history, sweep_id).with_suffix(".trials.csv")


def append_trial(history: History, sweep_id: str, trial: Mapping[str, Any]) -> None:
    """Note a tune's ended trial (tune.TRIAL_COLUMNS): a resume replays it rather than running it again."""
    _append_journal(trial_journal_path(history, sweep_id), "trial", trial, TRIAL_COLUMNS)


def trials_of(history: History, sweep_id: str) -> pd.DataFrame:
    """A tune's trials in the order they ended, as tune.trials_with_values reads them."""
    _, rows = csvstore.read_table(trial_journal_path(history, sweep_id))
    frame = pd.DataFrame(rows, columns=list(TRIAL_COLUMNS))
    frame["number"] = pd.to_numeric(frame["number"], errors="coerce")
    return frame.dropna(subset=["number"]).fillna({"stopped_early": "", "runs": ""}).reset_index(drop=True)


def point_text(point: Mapping[str, Any]) -> str:
    """A find-max point (its server settings) as the journal's point column spells it."""
    return json.dumps(dict(point), sort_keys=True)


def probes_of(history: History, sweep_id: str) -> pd.DataFrame:
    """The sweep's probes in the order they ran, typed (load and attainment numbers, met a bool)."""
    _, rows = csvstore.read_table(probe_journal_path(history, sweep_id))
    frame = pd.DataFrame(rows, columns=list(PROBE_COLUMNS))
    frame["load"] = pd.to_numeric(frame["load"], errors="coerce")
    frame["attainment"] = pd.to_numeric(frame["attainment"], errors="coerce")
    frame["met"] = frame["met"].astype(str).str.lower() == "true"
    return frame.fillna({"stopped_early": ""})


def finished_runs(history_runs: pd.DataFrame, plan: SweepPlan) -> pd.DataFrame:
    """The history rows (`History.load()`) of the plan's finished runs, numbered from 0; a swept server setting
    becomes a column of its own, read from the row's server_settings."""
    # An empty or older history lacks some of these columns: they come back empty, never as a KeyError.
    columns = [SWEEP_ID, SWEEP_REPEAT, "status", SERVER_SETTINGS, *(axis.name for axis in plan.axes)]
    frame = history_runs.reindex(columns=list(dict.fromkeys([*history_runs.columns, *columns])))
    mine = (frame[SWEEP_ID].astype(str) == plan.sweep_id) & (frame["status"].astype(str) == RunState.FINISHED)
    frame = frame[mine].reset_index(drop=True)
    for axis in plan.axes:
        if axis.server:
            frame[axis.name] = pd.Series(
                [_server_settings(cell).get(axis.name) for cell in frame[SERVER_SETTINGS]],
                index=frame.index,
                dtype=object,
            )
    return frame


def remaining(plan: SweepPlan, history_runs: pd.DataFrame) -> list[PlannedRun]:
    """The plan's runs not yet done, in plan order. A run is done when the history has a finished
    row with the plan's sweep id, the same repeat index and the point's values in its setting columns."""
    done: set[tuple] = set()
    for _, row in finished_runs(history_runs, plan).iterrows():
        repeat = pd.to_numeric(row[SWEEP_REPEAT], errors="coerce")
        if pd.notna(repeat):
            done.add((_point_key(_point_of_row(plan, row)), int(repeat)))
    return [run for run in plan.points() if (_point_key(run.values), run.repeat) not in done]


class PointRepeats(NamedTuple):
    """A point of a sweep with a target: where it stands (precision.judge over its finished runs) and the repeat index
    its next run takes."""

    values: dict[str, Any]
    standing: PointPrecision
    next_repeat: int


def point_repeats(plan: SweepPlan, history_runs: pd.DataFrame) -> list[PointRepeats]:
    """Each point of `plan` (which has a target), in grid order, from the history's finished runs of the sweep: what
    a resume decides from, as the sweep in progress does."""
    assert plan.precision is not None, "only a sweep with a target repeats until it"
    rows = with_derived(finished_runs(history_runs, plan))
    keys = [_point_key(_point_of_row(plan, row)) for _, row in rows.iterrows()]
    metric = plan.precision.metric
    values = pd.to_numeric(rows[metric], errors="coerce") if metric in rows else pd.Series(float("nan"), rows.index)
    repeats = pd.to_numeric(rows[SWEEP_REPEAT], errors="coerce")
    points = []
    for point in plan.grid():
        mine = [key == _point_key(point) for key in keys]
        done = repeats[mine].dropna()
        next_repeat = max(int(done.max()) + 1 if len(done) else 0, plan.repeats)
        points.append(
            PointRepeats(point, judge(values[mine], int(sum(mine)), plan.precision, plan.repeats), next_repeat)
        )
    return points


def most_runs(plan: SweepPlan, points: list[PointRepeats]) -> int:
    """The most runs a sweep with a target may have in all: a settled point's, and the cap for each other point."""
    assert plan.precision is not None
    return sum(p.standing.runs if p.standing.settled else plan.precision.max_repeats for p in points)


def sweep_counts(history: History, plan: SweepPlan, history_runs: pd.DataFrame) -> tuple[int, int]:
    """How many of a saved sweep's runs have finished, and of how many: its planned runs; a search's probes that ended
    (the search decides how many there are); for a sweep with a target, the most it may run (`most_runs`)."""
    if plan.find_max:
        ended = len(probes_of(history, plan.sweep_id))
        return ended, ended
    if plan.tune:
        return len(trials_of(history, plan.sweep_id)), plan.tune.trials
    if plan.precision:
        points = point_repeats(plan, history_runs)
        return sum(point.standing.runs for point in points), most_runs(plan, points)
    total = len(plan.points())
    return total - len(remaining(plan, history_runs)), total


def past_sweeps(history: History, runs: pd.DataFrame) -> pd.DataFrame:
    """One row per sweep with a saved plan, newest first (sweep ids sort by start time): what it varied,
    on which model and backend, and how many of its runs have finished. `runs` is `history.load()`."""
    folder = history.root / SWEEPS_FOLDER
    ids = sorted((path.stem for path in folder.glob("*.json")), reverse=True) if folder.is_dir() else []
    rows = []
    for sweep_id in ids:
        try:
            plan = load_plan(history, sweep_id)
        except HistoryError:  # a broken plan file must not hide the other sweeps
            continue
        finished, total = sweep_counts(history, plan, runs)
        searched = [f"highest {plan.find_max.setting}"] if plan.find_max else []
        rows.append(
            {
                "sweep_id": sweep_id,
                "varies": " × ".join([*(axis.name for axis in plan.axes), *searched]),
                "values": "; ".join(", ".join(map(str, axis.values)) for axis in plan.axes),
                "repeats": plan.repeats
                if plan.precision is None
                else f"{plan.repeats} to {plan.precision.max_repeats}, until ±{plan.precision.target * 100:g}%",
                "model": plan.base.engine.model,
                "backend": plan.base.engine.backend,
                "finished": finished,
                "runs": total,
            }
        )
    return pd.DataFrame(
        rows, columns=["sweep_id", "varies", "values", "repeats", "model", "backend", "finished", "runs"]
    )


def _point_of_row(plan: SweepPlan, row: pd.Series) -> dict[str, Any]:
    """A history row's values of the swept settings, typed back as RunConfig types them (server settings as their
    JSON has them)."""
    flat = {axis.name: (None if pd.isna(row[axis.name]) else row[axis.name]) for axis in plan.axes if not axis.server}
    typed = plan.values_of(RunConfig.from_flat_dict(flat))
    return {axis.name: row[axis.name] if axis.server else typed[axis.name] for axis in plan.axes}


def _server_settings(cell: Any) -> dict[str, Any]:
    try:
        return parse_server_settings(cell) if isinstance(cell, str) else {}
    except (ValueError, TypeError):  # a hand-edited history: no settings rather than no history
        return {}


def _point_key(values: dict[str, Any]) -> tuple:
    return tuple(sorted(values.items()))
