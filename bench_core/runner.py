"""Benchmark runs in a background thread, one at a time per process, the others waiting in a queue.

A run goes queued -> loading -> running -> finished | failed | cancelled. Loading samples the
requests (with the model's tokenizer) before the engine is touched, so a bad dataset fails in
seconds; the engine is then loaded, or reused when its settings are unchanged. Engine events become
profiler ticks here, and only here, so every engine is measured the same way. Whatever ends a run,
what was measured is kept and, once the run has started, recorded in the history.
"""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass, field
from datetime import datetime

from .config import RunConfig, check_run_config, lmdeploy_hyperparams
from .datasets import Sample, sample_requests
from .engines import Engine, EngineInfo, engine_settings_key, load_engine
from .environment import collect_environment
from .errors import BenchError
from .history import History, RunRecord, new_run_id
from .models import load_tokenizer
from .profiler import LiveSnapshot, Profiler, Session

log = logging.getLogger(__name__)

QUEUED, LOADING, RUNNING = "queued", "loading", "running"
FINISHED, FAILED, CANCELLED = "finished", "failed", "cancelled"
ACTIVE_STATES = (QUEUED, LOADING, RUNNING)
# A request counts as served when the engine stopped it for length or for EOS; the profiler then
# tells complete from incomplete by comparing the tokens produced with the tokens asked for.
SERVED_REASONS = ("length", "stop")


@dataclass
class Run:
    """One benchmark: its settings, where it stands, and what it measured so far."""

    run_id: str
    config: RunConfig
    state: str = QUEUED
    message: str = ""
    warnings: list[str] = field(default_factory=list)
    created_at: str = field(default_factory=lambda: datetime.now().astimezone().isoformat(timespec="seconds"))
    sample: Sample | None = None
    profiler: Profiler | None = None
    engine_info: EngineInfo | None = None
    record: RunRecord | None = None
    user_error: bool = False
    cancel_event: threading.Event = field(default_factory=threading.Event, repr=False)
    done_event: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES

    def cancel(self) -> None:
        """Stop the run within a second; what was measured so far is kept."""
        self.cancel_event.set()

    def wait(self, timeout: float | None = None) -> bool:
        """True once the run has ended."""
        return self.done_event.wait(timeout)

    def snapshot(self) -> LiveSnapshot | None:
        return self.profiler.live_snapshot() if self.profiler is not None else None


class Runner:
    """Executes submitted runs in order on one background thread and keeps the loaded engine."""

    def __init__(self, history: History | None = None):
        self.history = history
        self._runs: dict[str, Run] = {}
        self._queue: queue.Queue[Run | None] = queue.Queue()
        self._lock = threading.Lock()
        self._engine: Engine | None = None
        self._engine_key: tuple | None = None
        self._thread: threading.Thread | None = None

    # ---- public API -------------------------------------------------------------------------

    def submit(self, config: RunConfig) -> Run:
        """Validate `config` (raises ConfigError with every problem) and queue the run."""
        check_run_config(config)
        run = Run(run_id=new_run_id(), config=config)
        with self._lock:
            self._runs[run.run_id] = run
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._work, name="bench-runner", daemon=True)
                self._thread.start()
        self._queue.put(run)
        return run

    def get(self, run_id: str) -> Run | None:
        with self._lock:
            return self._runs.get(run_id)

    def runs(self) -> list[Run]:
        with self._lock:
            return list(self._runs.values())

    def queue_position(self, run: Run) -> int:
        """How many runs are ahead of a queued `run`, the executing one included (0 otherwise)."""
        if run.state != QUEUED:
            return 0
        ahead = 0
        with self._lock:
            for other in self._runs.values():  # insertion order is queue order
                if other is run:
                    break
                ahead += other.active
        return ahead

    def shutdown(self, timeout: float = 10.0) -> None:
        """Cancel every run, stop the worker and release the engine."""
        for run in self.runs():
            run.cancel()
        self._queue.put(None)
        if self._thread is not None:
            self._thread.join(timeout)
        self._release_engine()

    # ---- worker -----------------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            run = self._queue.get()
            if run is None:
                return
            try:
                self._execute(run)
            finally:
                run.done_event.set()

    def _execute(self, run: Run) -> None:
        if run.cancel_event.is_set():
            run.state, run.message = CANCELLED, "Cancelled before it started."
            return
        try:
            run.state = LOADING
            self._prepare(run)
            if run.cancel_event.is_set():
                run.state, run.message = CANCELLED, "Cancelled while loading."
                return
            run.state = RUNNING
            self._measure(run)
            run.state = CANCELLED if run.cancel_event.is_set() else FINISHED
        except BenchError as exc:
            run.state, run.message, run.user_error = FAILED, str(exc), True
        except Exception as exc:  # an engine bug must end this run, not the process
            log.exception("run %s failed", run.run_id)
            run.state, run.message = FAILED, f"{type(exc).__name__}: {exc}"
            self._release_engine()  # it may be left in a broken state
        if run.profiler is not None:
            self._record(run)

    def _prepare(self, run: Run) -> None:
        config = run.config
        tokenizer = (
            self._engine.tokenizer
            if self._engine is not None and self._engine_key == engine_settings_key(config.engine, config.load)
            else load_tokenizer(config.engine.model, config.engine.trust_remote_code)
        )
        run.sample = sample_requests(config.dataset, tokenizer)
        run.warnings.extend(run.sample.warnings)
        if not run.sample.requests:
            raise BenchError("The dataset gave no request to send.")
        run.engine_info = self._engine_for(config).info

    def _engine_for(self, config: RunConfig) -> Engine:
        key = engine_settings_key(config.engine, config.load)
        if self._engine is None or key != self._engine_key:
            self._release_engine()
            self._engine = load_engine(config.engine, config.load)
            self._engine_key = key
        return self._engine

    def _release_engine(self) -> None:
        if self._engine is not None:
            engine, self._engine, self._engine_key = self._engine, None, None
            try:
                engine.close()
            except Exception:
                log.exception("closing the engine failed")

    def _measure(self, run: Run) -> None:
        config, requests = run.config, run.sample.requests
        profiler = Profiler(config.load.stream_output, list(config.percentiles), slo=config.slo)
        sessions = [profiler.new_session(r.input_len, r.output_len) for r in requests]
        run.profiler = profiler
        tick_at_admission = config.load.load_pattern == "concurrency"
        profiler.start()
        if not tick_at_admission:  # LMDeploy's pipeline semantics: every request starts at t0
            for session in sessions:
                session.tick(0)
        events = self._engine.stream(
            requests,
            config.generation,
            max_in_flight=config.load.concurrency,
            stream_output=config.load.stream_output,
            cancel=run.cancel_event,
        )
        try:
            for event in events:
                session = sessions[event.index]
                if event.kind == "tokens":
                    session.tick(event.n_tokens, event.ts)
                elif event.kind == "admit":
                    if tick_at_admission:
                        session.tick(0, event.ts)
                elif event.kind == "finish":
                    status = Session.SUCCESS if event.finish_reason in SERVED_REASONS else Session.FAIL
                    reason = event.finish_reason + (f": {event.message}" if event.message else "")
                    session.finish(status, reason, event.ts)
        finally:
            profiler.finish()
            if run.cancel_event.is_set():
                for session in sessions:
                    if session.status == Session.UNKNOWN:
                        session.reason = "cancelled"

    def _record(self, run: Run) -> None:
        profiler, config = run.profiler, run.config
        profiler.compute_metrics()
        run.record = RunRecord(
            run_id=run.run_id,
            started_at=run.created_at,
            status=run.state if run.state in (FINISHED, FAILED, CANCELLED) else FAILED,
            config=config,
            lmdeploy_columns=profiler.lmdeploy_csv_row(lmdeploy_hyperparams(config)),
            metrics=profiler.summary(config.slo),
            engine_info=run.engine_info,
            environment=collect_environment(run.engine_info),
            requests=profiler.request_table(),
            error=run.message,
        )
        if self.history is not None:
            try:
                self.history.record(run.record)
            except BenchError as exc:
                run.warnings.append(f"The run could not be saved to the history: {exc}")

