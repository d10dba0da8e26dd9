"""A job's lifecycle: the one state machine benchmark runs and playground jobs move through, and the handles
that hold it.

    queued --> loading --> running --> finished | partial | failed | cancelled
      |           +------------------> failed | cancelled
      +--> cancelled | failed

`TRANSITIONS` holds these moves and `Job.move` allows no other (IllegalTransition): an ended job never moves
again. A queued job fails only where its remote worker was lost before it started (remote.Mirror). While a job
stays in a state its phase (what loading is doing, for the user) may change.

A `Run` is a handle: its id, its config, cancel and done, and its state. What it learns and measures is its
`Measurement`: the sample, the engine, the profiler where it is measured, then the live snapshot and the record.

Each move and phase change, and what the run publishes while it measures (`Run.publish`), is told to the job's
observers (observer.JobObserver), in one order.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

import pandas as pd

from ..config import EngineConfig, GenerationSettings, RunConfig
from ..engines import EngineInfo
from ..engines.base import CacheStart
from ..hardware.telemetry import with_loop_lag
from ..load.datasets import Sample
from ..load.playground import Conversation, PlaygroundResult
from ..measure.live_snapshot import TELEMETRY_WINDOW_S, LiveSnapshot, with_server_metrics, with_telemetry
from ..measure.profiler import Profiler
from ..measure.quality import DriftBaseline, OutputJudge
from ..measure.time_left import PastPace
from ..states import RunState
from .observer import JobObserver, StateChange

if TYPE_CHECKING:
    from ..engines.server_metrics import MetricsScraper
    from ..hardware.telemetry import TelemetrySampler
    from ..store.history import RunRecord

TRANSITIONS: dict[RunState, frozenset[RunState]] = {
    RunState.QUEUED: frozenset({RunState.LOADING, RunState.CANCELLED, RunState.FAILED}),
    RunState.LOADING: frozenset({RunState.RUNNING, RunState.FAILED, RunState.CANCELLED}),
    RunState.RUNNING: frozenset({RunState.FINISHED, RunState.PARTIAL, RunState.FAILED, RunState.CANCELLED}),
    RunState.FINISHED: frozenset(),
    RunState.PARTIAL: frozenset(),
    RunState.FAILED: frozenset(),
    RunState.CANCELLED: frozenset(),
}


class IllegalTransition(RuntimeError):
    """A move the lifecycle does not allow: a bug in whoever asked for it."""


@dataclass(kw_only=True)
class Job:
    """What benchmark runs and playground jobs share: a state that moves only as TRANSITIONS allow, a cancel
    flag, a done flag, and the observers that hear of each move."""

    observers: list[JobObserver] = field(default_factory=list, repr=False)
    cancel_event: threading.Event = field(default_factory=threading.Event, repr=False)
    done_event: threading.Event = field(default_factory=threading.Event, repr=False)
    _status: StateChange = field(default=StateChange(RunState.QUEUED), init=False)
    # Moves and the calls that tell of them are serialised, so every observer hears them in one order.
    _lock: threading.RLock = field(default_factory=threading.RLock, init=False, repr=False)

    @property
    def state(self) -> RunState:
        return self._status.state

    @property
    def phase(self) -> str:
        return self._status.phase

    @property
    def message(self) -> str:
        return self._status.message

    @property
    def user_error(self) -> bool:
        return self._status.user_error

    @property
    def refused(self) -> bool:
        return self._status.refused

    @property
    def ended(self) -> bool:
        return not TRANSITIONS[self.state]

    @property
    def active(self) -> bool:
        """Until the job has ended AND what it measured is recorded: a view never sees an ended job
        without its results."""
        return not self.done_event.is_set()

    def move(
        self,
        state: RunState,
        message: str = "",
        *,
        phase: str | None = None,
        user_error: bool = False,
        refused: bool = False,
    ) -> None:
        """Move to `state`, saying why (`message`) and what it does now (`phase`, unchanged when None);
        IllegalTransition unless TRANSITIONS allow the move."""
        with self._lock:
            if state not in TRANSITIONS[self.state]:
                raise IllegalTransition(f"a job cannot move from {self.state} to {state}")
            self._set(StateChange(state, self.phase if phase is None else phase, message, user_error, refused))

    def describe(self, phase: str) -> None:
        """Say what the job is doing now, within its state."""
        with self._lock:
            if self.ended:
                raise IllegalTransition(f"a job that ended {self.state} does nothing more")
            self._set(replace(self._status, phase=phase))

    def claim(self) -> bool:
        """Move a queued job to loading for the worker; False when it was cancelled first."""
        with self._lock:
            if self.state != RunState.QUEUED:
                return False
            self.move(RunState.LOADING)
            return True

    def cancel(self) -> None:
        """Stop within a second; what was done so far is kept. A queued job ends at once."""
        self.cancel_event.set()
        with self._lock:
            if self.state != RunState.QUEUED:
                return
            self.move(RunState.CANCELLED, "Cancelled before it started.")
        self.close()

    def close(self) -> None:
        """Mark the ended job done: `wait` returns, views show its results."""
        self.done_event.set()

    def wait(self, timeout: float | None = None) -> bool:
        """True once the job has ended."""
        return self.done_event.wait(timeout)

    def _set(self, status: StateChange) -> None:
        self._status = status
        self.tell("on_state", status)

    def tell(self, callback: str, *args) -> None:
        """Call `callback` (a JobObserver method) of every observer, in order; remote.Mirror replays with it."""
        with self._lock:
            for observer in list(self.observers):
                getattr(observer, callback)(self, *args)


@dataclass
class Measurement:
    """What a run has learned and measured: set where it is measured, or by remote.Mirror from what the process
    that measures it told (that side has no profiler, sampler or telemetry then)."""

    warnings: list[str] = field(default_factory=list)
    sample: Sample | None = None
    engine_info: EngineInfo | None = None
    environment: dict[str, str] | None = None  # collected where the engine runs, once it is loaded
    load_seconds: float | None = None  # from leaving the queue to the start of the measurement
    warmup_seconds: float | None = None  # of which the warm-up requests took this long (None: none were sent)
    cache_start: CacheStart | None = None  # the prefix cache's state when the clock started (Runner._start_cache)
    judge: OutputJudge | None = field(default=None, repr=False)  # where the run keeps its answers (measure/quality.py)
    profiler: Profiler | None = None
    sampler: TelemetrySampler | None = field(default=None, repr=False)  # where the engine runs, from the measurement
    # The client loop's lateness so far (Engine.loop_lag, appended as it samples where the loop is in this process).
    loop_lag: Callable[[], list[tuple[float, float]]] | None = field(default=None, repr=False)
    telemetry: pd.DataFrame | None = None  # every hardware sample of the measurement, time_s since its start
    scraper: MetricsScraper | None = field(default=None, repr=False)  # a server's /metrics, where it has one
    server_metrics: pd.DataFrame | None = None  # the server's raw samples (server_metrics.py), time_s since the start
    live: LiveSnapshot | None = None  # the last snapshot the process that measures the run published
    pace: PastPace | None = None  # what past runs like it say, for its time left before its own output does
    # The remote profiler's start and finish (perf_counter, system-wide on Linux), as that process told (remote.Mirror).
    clock: tuple[float | None, float | None] = (None, None)
    record: RunRecord | None = None
    save_error: str = ""  # why the run is not in its history, and where it was kept instead

    @property
    def measured(self) -> bool:
        """Whether requests were measured: the run has a profiler here, or its record a request table."""
        return self.profiler is not None or (self.record is not None and self.record.requests is not None)


@dataclass
class Run(Job):
    """One benchmark's handle: its id and settings, its state, cancel and done; what it learns and measures is
    in `measurement`."""

    run_id: str
    config: RunConfig
    created_at: str = field(default_factory=lambda: datetime.now().astimezone().isoformat(timespec="seconds"))
    sweep_id: str = ""  # set for the runs of a sweep, with their 0-based repeat index
    sweep_repeat: int | None = None
    baseline: DriftBaseline | None = None  # its --drift-baseline's answers, read where it was submitted
    measurement: Measurement = field(default_factory=Measurement)
    _unpublished: list[int] | None = field(default=None, init=False, repr=False)  # sessions not told as finished

    def fields(self) -> dict[str, Any]:
        """What makes this run again in the process that runs it (the engine worker, a cluster's actor): `Run(**fields)`
        there, with that process's observers."""
        return dict(
            run_id=self.run_id,
            config=self.config,
            created_at=self.created_at,
            sweep_id=self.sweep_id,
            sweep_repeat=self.sweep_repeat,
            baseline=self.baseline,
        )

    @property
    def profiler(self) -> Profiler | None:
        return self.measurement.profiler

    @property
    def record(self) -> RunRecord | None:
        return self.measurement.record

    def snapshot(self) -> LiveSnapshot | None:
        """The run so far: the snapshot last published where it is measured elsewhere, else from its profiler."""
        measurement = self.measurement
        profiler, sampler = measurement.profiler, measurement.sampler
        if measurement.live is not None or profiler is None:
            return measurement.live
        snap = profiler.live_snapshot()
        if sampler is not None and profiler.t_start is not None:
            since_s = profiler.t_start + snap.elapsed_s - TELEMETRY_WINDOW_S
            recent = sampler.samples(since_s=since_s)
            if measurement.loop_lag is not None:
                lags = measurement.loop_lag()  # the client's loop appends to it meanwhile: what is there stays
                # From this run's start: until its stream begins, the engine's list is still the last run's. Only the
                # window is copied (a slice is atomic), not the run's whole list at every poll.
                first = bisect.bisect_left(lags, (max(since_s, profiler.t_start),))
                recent = with_loop_lag(recent, lags[first:])
            snap = with_telemetry(snap, recent, profiler.t_start)
        if measurement.scraper is not None and profiler.t_start is not None:
            series = measurement.scraper.series()
            if len(series):  # not before the first read has come, nor where the server has no metrics
                snap = with_server_metrics(snap, series, profiler.t_start)
        return snap

    @property
    def clock_start(self) -> float | None:
        """When the measurement started (perf_counter): its profiler's start, here or in the process that measures."""
        profiler = self.measurement.profiler
        return profiler.t_start if profiler is not None else self.measurement.clock[0]

    def publish(self) -> None:
        """Tell the observers the live snapshot, and the requests that finished since the last publish."""
        profiler = self.measurement.profiler
        assert profiler is not None, "published while it measures"
        sessions = profiler.sessions
        unpublished = range(len(sessions)) if self._unpublished is None else self._unpublished
        finished = {index: sessions[index] for index in unpublished if sessions[index].finished}
        self._unpublished = [index for index in unpublished if index not in finished]
        snapshot = self.snapshot()
        with self._lock:
            self.tell("on_snapshot", snapshot)
            if finished:
                self.tell("on_requests", finished)

    def close(self) -> None:
        self.tell("on_record", self.measurement.record)
        super().close()


@dataclass
class PlaygroundJob(Job):
    """Chat prompts answered once by the engine; `results` grows as prompts finish (any order)."""

    job_id: str
    engine: EngineConfig
    conversations: list[Conversation]
    generation: GenerationSettings
    max_new_tokens: int
    results: list[PlaygroundResult] = field(default_factory=list)
    engine_info: EngineInfo | None = None

    def answer(self, result: PlaygroundResult) -> None:
        """Keep a prompt's answer and tell the observers."""
        with self._lock:
            self.results.append(result)
            self.tell("on_answer", result)
