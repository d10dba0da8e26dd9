"""Runs a sweep: its plan's remaining runs through the Runner's queue, with progress, cancel and resume.

A driver thread submits the next run only once the previous one has ended, so other runs and playground
jobs can take their turn between a sweep's runs, and a cancel never leaves the sweep's runs queued. The
runner keeps its loaded engine while the engine settings stay the same, and the plan orders its runs
so that they seldom change (`SweepPlan.points`): a load or dataset change reuses the engine, an engine
setting change reloads it.

The plan is saved (sweep_store) before the first run, and every run lands in the history with the sweep's
id and its repeat index; `resume_sweep` rebuilds the plan and runs only what has not finished yet
(`sweep_store.remaining`), in this process or after a restart.

A plan with a server command starts each run's server first (sweep.server), its log in the run's folder, and stops
it once the run has ended, whatever ended it: a server that exits or never answers fails that run only, recorded
with the end of its log. A find-max plan (FindMaxRun) searches each point for the highest load meeting the SLO
(sweep.find_max), noting each probe in the sweep's journal, which a resume replays. A plan with a target
(PreciseSweepRun) repeats each point until its margin of error is within it or the cap stops it (sweep.precision),
deciding from the history after each run, as a resume does. A tune (TuneRun) asks optuna for each trial's point
(sweep.tune), runs it, and tells it the trial's means and how far they are from its bounds; its journal of trials is
what a resume replays.
"""

from __future__ import annotations

import copy
import json
import math
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..engines import engine_settings_key
from ..errors import BenchError, ConfigError
from ..measure.catalog import find_column, with_derived
from ..measure.profiler import Session, certainly_outside_slo, served_latencies
from ..run.observer import JobObserver
from ..run.runner import Run, Runner, drift_baseline_for
from ..states import RunState
from ..store.history import History, new_run_id
from . import find_max, tune
from .plan import PlannedRun, SweepPlan, describe_point
from .precision import judge
from .server import EXIT_GRACE_S, SERVER_LOG, ServerFailed, ServerProcess, free_port, leftover_servers
from .store import (
    PointRepeats,
    append_probe,
    append_trial,
    load_plan,
    most_runs,
    point_repeats,
    point_text,
    probes_of,
    remaining,
    save_plan,
    server_records,
    trials_of,
    with_credentials,
)

FAILURES_SHOWN = 3  # the distinct reasons a failed probe's message quotes


@dataclass(frozen=True)
class SweepProgress:
    """Where a sweep stands. `finished` counts the runs finished before a resume too; `skipped` runs were
    not tried because a run with the same engine settings could not start (its engine would fail again)."""

    state: str  # running | finished | failed | cancelled
    total: int
    finished: int
    failed: int
    skipped: int
    current: str  # the point and repeat in the queue or running, "" when none
    current_run_id: str
    errors: tuple[str, ...]  # why runs failed, each message once
    most: bool = False  # `total` is the most the sweep may run (a target decides how many it does)

    @property
    def ended(self) -> int:
        """Runs that need no more work: the numerator of the sweep's progress bar."""
        return self.finished + self.failed + self.skipped

    @property
    def message(self) -> str:
        """What an ended sweep left undone and why; "" while it runs or when every run finished."""
        if self.state == RunState.RUNNING:
            return ""
        parts = []
        if self.failed:
            parts.append(f"{self.failed} run(s) failed" + (f": {' '.join(self.errors)}" if self.errors else "."))
        if self.skipped:
            parts.append(f"{self.skipped} run(s) skipped after a run with the same engine settings failed to start.")
        if self.finished < self.total:
            parts.append(
                f"{self.finished} of {'at most ' if self.most else ''}{self.total} runs finished; resume the sweep "
                f"to run {'up to ' if self.most else 'the other '}{self.total - self.finished}"
                f"{' more' if self.most else ''}."
            )
        return " ".join(parts)


class SweepRun:
    """A sweep being run in this process: its plan, the runs submitted so far, and its progress."""

    def __init__(self, plan: SweepPlan, runner: Runner, todo: list[PlannedRun]):
        self.plan = plan
        self.runner = runner
        self._planned = len(plan.points())
        self.finished_before = self._planned - len(todo)
        self.runs: list[tuple[PlannedRun, Run]] = []
        self._todo = todo
        self._skipped: list[PlannedRun] = []
        self._failed_engines: set[tuple] = set()  # engine settings keys whose engine could not start
        self._errors: list[str] = []
        self._current: tuple[PlannedRun, Run] | None = None
        self._interrupted = False  # a search (capacity, tune) whose run was interrupted: it stops as cancelled
        self._cancel = threading.Event()
        self._done = threading.Event()
        self._lock = threading.Lock()
        # Servers an earlier sweep here started that outlived it, named before this one starts its own.
        self.leftover_servers = leftover_servers(server_records(_history_of(runner))) if plan.server_cmd else []
        threading.Thread(target=self._drive, name=f"sweep-{plan.sweep_id}", daemon=True).start()

    @property
    def sweep_id(self) -> str:
        return self.plan.sweep_id

    @property
    def total(self) -> int:
        """The runs the plan holds, those finished before this process included."""
        return self._planned

    @property
    def active(self) -> bool:
        return not self._done.is_set()

    def cancel(self) -> None:
        """Stop the sweep: its running run stops within a second (keeping what it measured), nothing
        more is submitted. The finished runs stay in the history, so the sweep can be resumed."""
        with self._lock:
            self._cancel.set()
            current = self._current
        if current is not None:
            current[1].cancel()

    def wait(self, timeout: float | None = None) -> bool:
        """True once the sweep has ended."""
        return self._done.wait(timeout)

    def point_states(self) -> list:
        """Where each run is and how it stands: only a cluster sweep has more to say than `progress`."""
        return []

    def progress(self) -> SweepProgress:
        with self._lock:
            runs, current, skipped, errors = list(self.runs), self._current, len(self._skipped), list(self._errors)
        states = [run.state for _, run in runs]
        finished = self.finished_before + states.count(RunState.FINISHED)
        failed = states.count(RunState.FAILED) + states.count(
            RunState.PARTIAL
        )  # a point with failed requests is not done
        if self.active:
            state = RunState.RUNNING
        elif self._cancel.is_set() or RunState.CANCELLED in states:
            state = RunState.CANCELLED
        elif failed or skipped:
            state = RunState.FAILED
        else:
            state = RunState.FINISHED
        label, run_id = self._now(current)
        most = self.plan.precision is not None
        return SweepProgress(state, self.total, finished, failed, skipped, label, run_id, tuple(errors), most)

    def _searched_state(self, erred: bool) -> RunState:
        """A search's state (a capacity search's, a tune's): its runs end early by design, so only a cancel, an
        interrupt or an error makes it other than finished."""
        if self.active:
            return RunState.RUNNING
        if self._cancel.is_set() or self._interrupted:
            return RunState.CANCELLED
        return RunState.FAILED if erred else RunState.FINISHED

    def _now(self, current: tuple[PlannedRun, Run] | None) -> tuple[str, str]:
        """What the progress names as under way: the point and the id of the run in the queue or running."""
        if current is None or not current[1].active:
            return "", ""
        return self.describe(current[0]), current[1].run_id

    def describe(self, planned: PlannedRun) -> str:
        """ "concurrency=2 · repeat 1/3" (the repeat only when the plan repeats its points)."""
        return describe_point(planned.values) + self.plan.repeat_text(planned.repeat)

    def _drive(self) -> None:
        try:
            self._run_all()
        except BenchError as exc:  # the runner refused a run: the plan was checked, so the machine changed
            self._note_failure(str(exc), None)
        finally:
            self._done.set()

    def _run_all(self) -> None:
        for planned in self._todo:
            if not self._run_planned(planned):
                return

    def _run_planned(self, planned: PlannedRun) -> bool:
        """Run `planned`, unless its engine settings already failed to start; False once the sweep is cancelled (by
        the user, here or elsewhere, or by a shutdown)."""
        if self._skip(planned):
            return True
        run = self._run(planned)
        return run is not None and run.state != RunState.CANCELLED

    def _run(self, planned: PlannedRun, observers: tuple[JobObserver, ...] = ()) -> Run | None:
        """Run one planned run to its end (with its own server where the plan has a server command) and note its
        failure; None when the sweep was cancelled before it was submitted."""
        if self.plan.server_cmd:
            return self._run_with_server(planned, observers)
        with self._lock:
            if self._cancel.is_set():
                return None
            run = self._submit(planned, planned.config, observers)
        self._wait(run)
        self._note_end(planned, run)
        return run

    def _wait(self, run: Run) -> None:
        run.wait()

    def _submit(self, planned: PlannedRun, config, observers, run_id: str = "") -> Run:
        """Queue the run (under the lock: a cancel in between would leave it queued)."""
        run = self.runner.submit(
            config, sweep_id=self.sweep_id, sweep_repeat=planned.repeat, observers=observers, run_id=run_id
        )
        self._current = (planned, run)
        self.runs.append(self._current)
        return run

    def _note_end(self, planned: PlannedRun, run: Run, server_said: str = "") -> None:
        if run.state in (RunState.FAILED, RunState.PARTIAL):
            # Failed before measuring: the same engine settings (or dataset) would fail again.
            self._note_failure(
                f"{run.message}{server_said}", None if run.measurement.measured else engine_key_of(planned)
            )

    def _run_with_server(self, planned: PlannedRun, observers: tuple[JobObserver, ...]) -> Run | None:
        """Start the run's server on a free port, wait until it answers, run, stop the server. A server that exits
        or never answers is the run's failure, recorded with its log's last lines; a cancel while it starts
        records nothing."""
        history = _history_of(self.runner)
        run_id = new_run_id()
        port = free_port()
        config = copy.deepcopy(planned.config)
        config.engine.base_url = f"http://127.0.0.1:{port}"
        server = ServerProcess(
            self.plan.server_command(config, port),
            history.run_dir(run_id) / SERVER_LOG,
            port,
            server_records(history),
            self.sweep_id,
        )
        try:
            try:
                server.start()
                engine = config.engine
                up = server.wait_ready(
                    engine.base_url, engine.api_key, self.plan.server_start_timeout_s, self._cancel, engine.model
                )
                if up and not engine.model:  # the history names the model the server serves
                    from ..engines.openai_client import discover_model
                    from ..engines.openai_engine import network_policy

                    engine.model = discover_model(engine.base_url, engine.api_key, network=network_policy(engine))
            except (ServerFailed, BenchError) as exc:
                return self._server_failed(planned, config, run_id, str(exc))
            with self._lock:
                if not up or self._cancel.is_set():
                    server.stop()
                    shutil.rmtree(history.run_dir(run_id), ignore_errors=True)  # no run: the folder would be a leftover
                    return None
                run = self._submit(planned, config, observers, run_id)
            self._wait(run)
            # A server that died cut its requests at once, and its guard says how it ended a moment later: a run whose
            # requests failed waits that moment, so that its error names the exit rather than only the cut requests.
            failed = run.state in (RunState.FAILED, RunState.PARTIAL)
            code = server.exit_code(wait_s=EXIT_GRACE_S if failed else 0.0)
            self._note_end(
                planned,
                run,
                "" if code is None else f" The server exited with code {code} during the run.{server.log_tail()}",
            )
            return run
        finally:
            server.stop()

    def _server_failed(self, planned: PlannedRun, config, run_id: str, message: str) -> Run:
        """Record the run a server that did not come up made impossible, as failed with `message`."""
        run = Run(run_id=run_id, config=config, sweep_id=self.sweep_id, sweep_repeat=planned.repeat)
        run.move(RunState.FAILED, message)
        self.runner.keep(run)
        run.close()
        with self._lock:
            self.runs.append((planned, run))
        self._note_failure(message, None)
        return run

    def _skip(self, planned: PlannedRun) -> bool:
        """True (and counted) for a run whose engine settings already failed to start in this sweep: a
        model that does not load or a knob value that does not fit would fail every such run again."""
        with self._lock:
            if engine_key_of(planned) in self._failed_engines:
                self._skipped.append(planned)
                return True
        return False

    def _note_failure(self, message: str, engine_that_failed: tuple | None) -> None:
        """Keep a failure's message once; remember engine settings that could not start a run."""
        with self._lock:
            if engine_that_failed is not None:
                self._failed_engines.add(engine_that_failed)
            if message and message not in self._errors:
                self._errors.append(message)


class PreciseSweepRun(SweepRun):
    """A sweep with a target (sweep.precision): in each engine group, its planned rounds (the least repeats, those a
    resume has left), then rounds over the group's points still short of the target, until each reaches it or the cap.
    Where a point stands is read from the history after each run, as a resume reads it. A point whose run did not
    finish here (failed, partial, skipped, its server down, not saved) is not repeated again in this pass: a resume
    tries it again."""

    def __init__(self, plan: SweepPlan, runner: Runner, todo: list[PlannedRun]):
        self._history = _history_of(runner)
        self._points: list[PointRepeats] = point_repeats(plan, self._history.load())
        self._left_out: set[str] = set()  # point_text of the points not repeated again in this pass
        super().__init__(plan, runner, todo)
        self.finished_before = sum(point.standing.runs for point in self._points)

    @property
    def total(self) -> int:
        """The most runs the sweep may have: the settled points' runs and the cap for each other point."""
        with self._lock:
            points = list(self._points)
        return most_runs(self.plan, points)

    def _run_all(self) -> None:
        for group in self.plan.engine_groups():
            mine = {point_text(values) for values in group}
            # A resume past the planned rounds has none left: it goes on with the rounds the target adds.
            due = [planned for planned in self._todo if point_text(planned.values) in mine] or self._next_round(group)
            while due:
                for planned in due:
                    if not self._run_planned(planned):
                        return
                due = self._next_round(group)

    def _run_planned(self, planned: PlannedRun) -> bool:
        ran_before = len(self.runs)  # only this thread adds runs
        going_on = super()._run_planned(planned)
        if not any(
            run.state == RunState.FINISHED and not run.measurement.save_error for _, run in self.runs[ran_before:]
        ):
            self._left_out.add(point_text(planned.values))
        points = point_repeats(self.plan, self._history.load())
        with self._lock:
            self._points = points
        return going_on

    def _next_round(self, group: list[dict]) -> list[PlannedRun]:
        """One more run of each of the group's points still short of the target, in the group's order."""
        with self._lock:
            standing = {point_text(point.values): point for point in self._points}
        due = [
            standing[point_text(values)]
            for values in group
            if not standing[point_text(values)].standing.settled and point_text(values) not in self._left_out
        ]
        return [
            PlannedRun(point.values, point.next_repeat, self.plan.config_at(point.values, point.next_repeat))
            for point in due
        ]


@dataclass
class Capacity:
    """What a find-max search found at one point (its server settings): the probes in order (load, met, SLO
    attainment, run id, why it stopped early) and the highest load that met the target."""

    point: dict
    probes: list[dict] = field(default_factory=list)
    # why the search stopped before its end: a probe that could not run, a server that failed its requests, the
    # search's budget spent
    error: str = ""

    @property
    def search_probes(self) -> list[find_max.Probe]:
        return [find_max.Probe(p["load"], p["met"]) for p in self.probes]

    @property
    def found(self) -> float | None:
        return find_max.found(self.search_probes)

    @property
    def lowest_missed(self) -> float | None:
        """The lowest load that missed the target (None: none did); every load above `found` that missed is above it."""
        return find_max.bounds(self.search_probes)[1]

    def runs_at(self, load: float | None) -> list[str]:
        return [p["run_id"] for p in self.probes if p["load"] == load]


class FindMaxRun(SweepRun):
    """A find-max sweep: for each point of its axes (server settings; one point without any), probes loads as
    `find_max.next_load` says until the search ends. A probe stops early once so many of its requests missed the
    SLO that the target cannot be met any more (TargetWatch); it counts as not meeting it."""

    def __init__(self, plan: SweepPlan, runner: Runner, todo: list[PlannedRun]):
        self.capacities: list[Capacity] = []
        self._deadline = math.inf  # the search's time budget ends then (time.monotonic)
        self._out_of_time = False
        self._journal = probes_of(_history_of(runner), plan.sweep_id)
        super().__init__(plan, runner, [])
        self.finished_before = 0

    @property
    def total(self) -> int:
        """The probes so far, and the one under way or left undone: the search decides how many there are."""
        probes = sum(len(capacity.probes) for capacity in self.capacities)
        stopped = any(capacity.error for capacity in self.capacities)  # a resume goes on from there
        pending = not hasattr(self, "_done") or self.active or self._interrupted or self._cancel.is_set() or stopped
        return probes + (1 if pending else 0)

    def progress(self) -> SweepProgress:
        """Probes count as runs; a probe stopped early is one that ended, not a cancel."""
        with self._lock:
            finished = sum(len(capacity.probes) for capacity in self.capacities)
            errors = tuple(dict.fromkeys(capacity.error for capacity in self.capacities if capacity.error))
            errors = errors or tuple(self._errors)  # a probe the runner refused (_drive) has no capacity error
            label, run_id = self._now(self._current)
        state = self._searched_state(bool(errors))
        return SweepProgress(state, self.total, finished, len(errors), 0, label, run_id, errors)

    def _run_all(self) -> None:
        search = self.plan.find_max
        for point in self.plan.grid():
            capacity = Capacity(point)
            with self._lock:
                self.capacities.append(capacity)
            self._deadline, self._out_of_time, probed = time.monotonic() + search.max_time_s, False, 0
            while (load := find_max.next_load(search, capacity.search_probes)) is not None:
                probe: dict | str | None = self._replayed(point, load)
                if probe is None:
                    probe = self._budget_spent(probed) or self._probe(point, load)
                    probed += 1
                if probe is None:
                    self._interrupted = True
                    return
                if isinstance(probe, str):
                    where = f" at {describe_point(point)}" if point else ""
                    capacity.error = f"The search{where} stopped: {probe.rstrip('.')}."
                    break
                capacity.probes.append(probe)

    def _budget_spent(self, probed: int) -> str:
        """Why the search may not go on ("" when it may): its time is up, or it has run `probed` probes, its most."""
        search = self.plan.find_max
        if time.monotonic() >= self._deadline:
            spent = f"{search.max_time_s:g} s (--find-max-time)"
        elif probed >= search.max_probes:
            spent = f"{search.max_probes} probes (--find-max-probes)"
        else:
            return ""
        return (
            f"it spent its budget of {spent} before it narrowed the highest load to within "
            f"{search.precision:.0%}; resuming the sweep goes on with as much again"
        )

    def _wait(self, run: Run) -> None:
        """Wait for a probe until the search's time budget ends, then stop it."""
        if not run.wait(max(0.0, self._deadline - time.monotonic())):
            self._out_of_time = True
            run.cancel()
            run.wait()

    def _replayed(self, point: dict, load: float) -> dict | None:
        """The journal's probe at this point and load, from an earlier pass of this sweep."""
        journal = self._journal
        same = journal[(journal["point"] == point_text(point)) & (journal["load"] == load)]
        if same.empty:
            return None
        row = same.iloc[-1]
        return {
            "load": load,
            "met": bool(row["met"]),
            "attainment": float(row["attainment"]),
            "run_id": row["run_id"],
            "stopped_early": row["stopped_early"],
        }

    def _probe(self, point: dict, load: float) -> dict | str | None:
        """One probe run: its journal entry; a string saying why it could not measure; None when cancelled."""
        values = {**point, self.plan.find_max.setting: load}
        planned = PlannedRun(values, 0, self.plan.config_at(values, 0))
        watch = TargetWatch(self.plan.find_max.target)
        try:
            run = self._run(planned, (watch,))
        except BenchError as exc:  # the runner refused the probe's settings: the search can go no further
            return str(exc)
        if run is None:
            return None
        if watch.failures:
            reasons = list(dict.fromkeys(watch.failures))
            return (
                f"the probe at {self.plan.find_max.setting} {load:g} ({run.run_id}) stopped when {len(watch.failures)} "
                f"of its {len(run.measurement.sample.requests)} requests failed, for the server's reasons rather "
                f"than the SLO's: {'; '.join(reasons[:FAILURES_SHOWN])}"
                + (f" (and {len(reasons) - FAILURES_SHOWN} other reasons)" if len(reasons) > FAILURES_SHOWN else "")
            )
        if self._out_of_time:
            return self._budget_spent(probed=0)
        if run.state == RunState.CANCELLED and not watch.stopped:
            return None
        record = run.measurement.record
        if not run.measurement.measured or record is None:
            return run.message or "the probe measured nothing"
        attainment = float(with_derived(pd.DataFrame([record.metrics]))["slo_attainment"].iloc[0])
        probe = {
            "load": load,
            "met": bool(not watch.stopped and attainment >= self.plan.find_max.target),
            "attainment": attainment,
            "run_id": run.run_id,
            "stopped_early": watch.stopped,
        }
        append_probe(_history_of(self.runner), self.sweep_id, {**probe, "point": point_text(point)})
        return probe


class TargetWatch(JobObserver):
    """Stops a probe once more of its requests missed the SLO than the target allows: it can no longer meet it. A
    request that failed (an HTTP error, a refused connection, a stream cut short) says nothing of the load the server
    bears within the SLO, only that something is wrong with it: the probe stops at the first, noting why
    (`failures`)."""

    def __init__(self, target: float):
        self.target = target
        self.stopped = ""
        self.failures: list[str] = []
        self._outside = 0

    def on_requests(self, run, finished) -> None:
        if self.stopped or self.failures or run.cancel_event.is_set():  # what ends once it is cancelled says nothing
            return
        self.failures = [session.reason for session in finished.values() if session.status == Session.FAIL]
        if self.failures:
            run.cancel()
            return
        self._outside += certainly_outside_slo(list(finished.values()), run.config.slo)
        total = len(run.measurement.sample.requests)
        allowed = math.floor((1 - self.target) * total + 1e-9)
        if self._outside > allowed:
            self.stopped = (
                f"{self._outside} of {total} requests missed the SLO, more than the target allows ({allowed})"
            )
            run.cancel()


class TuneRun(SweepRun):
    """A tune: trial after trial, the point optuna's TPE proposes (the study rebuilt from the journal's trials first,
    on a resume), run `repeats` times, or until the plan's target (sweep.precision); a trial whose run already
    breaks a bound for sure stops there (BoundWatch). Progress counts trials, up to the budget or the space's size.
    A point proposed again is told its measured values without running."""

    def __init__(self, plan: SweepPlan, runner: Runner, todo: list[PlannedRun]):
        self._history = _history_of(runner)
        assert plan.tune is not None, "only a tune's plan is tuned"
        self.tune = plan.tune
        self.trials = tune.trials_with_values(trials_of(self._history, plan.sweep_id), self._history.load(), plan.tune)
        self.budget = min(plan.tune.trials, tune.space_size(plan.axes))
        self.trials_before = len(self.trials)
        self.stop_reason = ""  # why the tune ended short of its budget, "" where it did not
        super().__init__(plan, runner, [])
        self.finished_before = 0

    @property
    def total(self) -> int:
        return self.budget

    def progress(self) -> SweepProgress:
        """Trials count as runs; a trial stopped early is one that ended, not a cancel."""
        with self._lock:
            ended = len(self.trials)
            errors = tuple(self._errors)
            label, run_id = self._now(self._current)
        state = self._searched_state(bool(errors))
        failed = sum(1 for trial in self.trials if math.isnan(trial.objective(self.tune)))
        return SweepProgress(state, self.budget, ended - failed, failed, 0, label, run_id, errors)

    def _run_all(self) -> None:
        study = tune.new_study(self.tune)
        tune.replay(study, self.plan.axes, self.tune, self.trials)
        space = tune.distributions(self.plan.axes)
        proposed_again = 0
        while len(self.trials) < self.budget:
            asked = study.ask(space)
            point = {axis.name: asked.params[axis.name] for axis in self.plan.axes}
            known = next((trial for trial in self.trials if trial.point == point), None)
            if known is not None:
                tune.record_trial(study, asked, self.tune, known)
                proposed_again += 1
                if proposed_again >= tune.MOST_REPEATED_PROPOSALS:
                    self.stop_reason = (
                        f"the search proposed only points it had measured, {proposed_again} times in a row: it has "
                        "nothing new to try"
                    )
                    return
                continue
            proposed_again = 0
            measured = self._trial(len(self.trials), point)
            if measured is None:
                self._interrupted = True
                return
            with self._lock:
                self.trials.append(measured)
            tune.record_trial(study, asked, self.tune, measured)

    def _trial(self, number: int, point: dict) -> tune.Trial | None:
        """Run one trial: its runs until its repeats (or target) are done, a run fails or a bound breaks for sure;
        journal it and return it with its values; None when cancelled."""
        run_ids: list[str] = []
        stopped = ""
        repeat = 0
        while True:
            planned = PlannedRun(point, repeat, self.plan.config_at(point, repeat))
            if engine_key_of(planned) in self._failed_engines:
                stopped = "its engine settings failed to start in an earlier trial"
                break
            watch = BoundWatch(self.tune.bounds)
            try:
                run = self._run(planned, (watch,))
            except BenchError as exc:  # the runner refused the point's settings
                self._note_failure(str(exc), None)
                break
            if run is None or (run.state == RunState.CANCELLED and not watch.stopped):
                return None
            run_ids.append(run.run_id)
            if watch.stopped:
                stopped = watch.stopped
                break
            repeat += 1
            if run.state != RunState.FINISHED or not self._more_repeats(run_ids, repeat):
                break
        record = {"number": number, "point": json.dumps(point), "runs": " ".join(run_ids), "stopped_early": stopped}
        append_trial(self._history, self.sweep_id, record)
        return tune.trials_with_values(pd.DataFrame([record]), self._history.load(), self.tune)[0]

    def _more_repeats(self, run_ids: list[str], repeats: int) -> bool:
        """Whether the trial runs again: short of the plan's repeats, or, with a target, short of it and of the cap."""
        precision = self.plan.precision
        if precision is None:
            return repeats < self.plan.repeats
        rows = with_derived(self._history.load())
        mine = rows[rows["run_id"].astype(str).isin(run_ids) & (rows["status"].astype(str) == RunState.FINISHED)]
        values = pd.to_numeric(mine[precision.metric], errors="coerce") if precision.metric in mine else []
        return not judge(list(values), len(mine), precision, self.plan.repeats).settled


class BoundWatch(JobObserver):
    """Stops a tune's run once one of its bounds is broken whatever its remaining requests do (tune.broken_for_sure,
    over the latencies of the requests served so far); `stopped` says which."""

    def __init__(self, bounds: tuple[tune.Bound, ...]):
        self.bounds = bounds
        self.stopped = ""
        self._seen: dict[str, list[float]] = {column: [] for column in tune.EARLY_METRICS.values()}

    def on_requests(self, run, finished) -> None:
        if self.stopped or not self.bounds or run.cancel_event.is_set():
            return
        for column, values in served_latencies(list(finished.values())).items():
            self._seen[column].extend(values.tolist())
        total = len(run.measurement.sample.requests)
        for bound in self.bounds:
            found = find_column(bound.metric)
            column = tune.EARLY_METRICS.get(found[0].key) if found else None
            if column and tune.broken_for_sure(bound, np.asarray(self._seen[column]), total):
                self.stopped = f"{bound} broken for sure after {len(self._seen[column])} of {total} requests"
                run.cancel()
                return


def engine_key_of(planned: PlannedRun) -> tuple:
    """The engine settings a planned run loads: runs with equal keys share one engine load."""
    return engine_settings_key(planned.config.engine, planned.config.load)


# How a sweep's remaining runs are run: SweepRun (here, through the runner) or another driver with its
# constructor's first three arguments, such as sweep_cluster's (on a Ray cluster).
Launch = Callable[[SweepPlan, Runner, list[PlannedRun]], SweepRun]


def start_sweep(runner: Runner, plan: SweepPlan, launch: Launch = SweepRun) -> SweepRun:
    """Check every point (one ConfigError naming each impossible one), save the plan, start the runs."""
    history = _history_of(runner)
    launch = _launch_for(plan, launch)
    plan.check(runs_here=launch in (SweepRun, FindMaxRun, PreciseSweepRun, TuneRun))
    drift_baseline_for(plan.base, history)  # a baseline not in this history, or without answers: refused now
    save_plan(history, plan)
    return launch(plan, runner, remaining(plan, history.load()))


def resume_sweep(
    runner: Runner, sweep_id: str, launch: Launch = SweepRun, credentials: Mapping[str, str] | None = None
) -> SweepRun:
    """Run what a saved sweep has not finished yet; a complete sweep ends at once as finished. `credentials`: the
    values of the settings whose credentials the saved plan masked (store.with_credentials)."""
    history = _history_of(runner)
    plan = with_credentials(load_plan(history, sweep_id), credentials or {})
    launch = _launch_for(plan, launch)
    plan.check(runs_here=launch in (SweepRun, FindMaxRun, PreciseSweepRun, TuneRun))
    drift_baseline_for(plan.base, history)
    return launch(plan, runner, remaining(plan, history.load()))


def _launch_for(plan: SweepPlan, launch: Launch) -> Launch:
    """FindMaxRun for a find-max plan, PreciseSweepRun for one with a target; a server command, a search or a target
    runs here only (it starts its servers here; it decides each run from the last)."""
    if (plan.find_max or plan.server_cmd or plan.precision or plan.tune) and launch is not SweepRun:
        raise ConfigError("A sweep with --server-cmd, --find-max or --target-moe runs here: drop --ray-address.")
    if plan.tune:
        return TuneRun
    if plan.find_max:
        return FindMaxRun
    return PreciseSweepRun if plan.precision else launch


def _history_of(runner: Runner) -> History:
    if runner.history is None:
        raise ValueError("A sweep needs a runner with a history: resume reads its finished runs from there.")
    return runner.history
