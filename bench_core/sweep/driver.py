"""Runs a sweep: its plan's remaining runs through the Runner's queue, with progress, cancel and resume.

A driver thread submits the next run only once the previous one has ended, so other runs and playground
jobs can take their turn between a sweep's runs, and a cancel never leaves the sweep's runs queued. The
runner keeps its loaded engine while the engine settings stay the same, and the plan orders its runs
so that they seldom change (`SweepPlan.points`): a load or dataset change reuses the engine, an engine
setting change reloads it.

The plan is saved (sweep_store) before the first run, and every run lands in the history with the sweep's
id and its repeat index; `resume_sweep` rebuilds the plan and runs only what has not finished yet
(`sweep_store.remaining`), in this process or after a restart.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ..engines import engine_settings_key
from ..errors import BenchError
from ..store.history import History
from ..states import RunState
from ..run.runner import Run, Runner
from .plan import PlannedRun, SweepPlan, describe_point
from .store import load_plan, remaining, save_plan, with_credentials


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
            parts.append(f"{self.finished} of {self.total} runs finished; resume the sweep to run the other "
                         f"{self.total - self.finished}.")
        return " ".join(parts)


class SweepRun:
    """A sweep being run in this process: its plan, the runs submitted so far, and its progress."""

    def __init__(self, plan: SweepPlan, runner: Runner, todo: list[PlannedRun]):
        self.plan = plan
        self.runner = runner
        self.total = len(plan.points())
        self.finished_before = self.total - len(todo)
        self.runs: list[tuple[PlannedRun, Run]] = []
        self._todo = todo
        self._skipped: list[PlannedRun] = []
        self._failed_engines: set[tuple] = set()  # engine settings keys whose engine could not start
        self._errors: list[str] = []
        self._current: tuple[PlannedRun, Run] | None = None
        self._cancel = threading.Event()
        self._done = threading.Event()
        self._lock = threading.Lock()
        threading.Thread(target=self._drive, name=f"sweep-{plan.sweep_id}", daemon=True).start()

    @property
    def sweep_id(self) -> str:
        return self.plan.sweep_id

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
        failed = states.count(RunState.FAILED) + states.count(RunState.PARTIAL)  # a point with failed requests is not done
        if self.active:
            state = RunState.RUNNING
        elif self._cancel.is_set() or RunState.CANCELLED in states:
            state = RunState.CANCELLED
        elif failed or skipped:
            state = RunState.FAILED
        else:
            state = RunState.FINISHED
        label, run_id = self._now(current)
        return SweepProgress(state, self.total, finished, failed, skipped, label, run_id, tuple(errors))

    def _now(self, current: tuple[PlannedRun, Run] | None) -> tuple[str, str]:
        """What the progress names as under way: the point and the id of the run in the queue or running."""
        if current is None or not current[1].active:
            return "", ""
        return self.describe(current[0]), current[1].run_id

    def describe(self, planned: PlannedRun) -> str:
        """"concurrency=2 · repeat 1/3" (the repeat only when the plan repeats its points)."""
        repeat = f" · repeat {planned.repeat + 1}/{self.plan.repeats}" if self.plan.repeats > 1 else ""
        return describe_point(planned.values) + repeat

    def _drive(self) -> None:
        try:
            for planned in self._todo:
                if self._skip(planned):
                    continue
                with self._lock:
                    if self._cancel.is_set():
                        return
                    run = self.runner.submit(planned.config, sweep_id=self.sweep_id, sweep_repeat=planned.repeat)
                    self._current = (planned, run)
                    self.runs.append(self._current)
                run.wait()
                if run.state == RunState.CANCELLED:  # by the user, on this page or elsewhere, or by a shutdown
                    return
                if run.state in (RunState.FAILED, RunState.PARTIAL):
                    # Failed before measuring: the same engine settings (or dataset) would fail again.
                    self._note_failure(run.message, None if run.measurement.measured else engine_key_of(planned))
        except BenchError as exc:  # the runner refused a run: the plan was checked, so the machine changed
            self._note_failure(str(exc), None)
        finally:
            self._done.set()

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


def engine_key_of(planned: PlannedRun) -> tuple:
    """The engine settings a planned run loads: runs with equal keys share one engine load."""
    return engine_settings_key(planned.config.engine, planned.config.load)


# How a sweep's remaining runs are run: SweepRun (here, through the runner) or another driver with its
# constructor's first three arguments, such as sweep_cluster's (on a Ray cluster).
Launch = Callable[[SweepPlan, Runner, list[PlannedRun]], SweepRun]


def start_sweep(runner: Runner, plan: SweepPlan, launch: Launch = SweepRun) -> SweepRun:
    """Check every point (one ConfigError naming each impossible one), save the plan, start the runs."""
    history = _history_of(runner)
    plan.check(runs_here=launch is SweepRun)
    save_plan(history, plan)
    return launch(plan, runner, remaining(plan, history.load()))


def resume_sweep(runner: Runner, sweep_id: str, launch: Launch = SweepRun,
                 credentials: Mapping[str, str] | None = None) -> SweepRun:
    """Run what a saved sweep has not finished yet; a complete sweep ends at once as finished. `credentials`: the
    values of the settings whose credentials the saved plan masked (store.with_credentials)."""
    history = _history_of(runner)
    plan = with_credentials(load_plan(history, sweep_id), credentials or {})
    plan.check(runs_here=launch is SweepRun)
    return launch(plan, runner, remaining(plan, history.load()))


def _history_of(runner: Runner) -> History:
    if runner.history is None:
        raise ValueError("A sweep needs a runner with a history: resume reads its finished runs from there.")
    return runner.history
