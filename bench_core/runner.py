"""Benchmark runs in a background thread, one at a time per process, the others waiting in a queue.

A run goes queued -> loading -> running -> finished | failed | cancelled. Loading samples the
requests (with the model's tokenizer) before the engine is touched, so a bad dataset fails in
seconds; the engine is then loaded, or reused when its settings are unchanged. Engine events become
profiler ticks here, and only here, so every engine is measured the same way. Whatever ends a run,
what was measured is kept and, once the run has started, recorded in the history.

Playground jobs (chat prompts answered once, `submit_playground`) wait in the same queue and use the
same cached engine, so one thing at a time holds the accelerator; they are not recorded.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from .config import EngineConfig, GenerationSettings, LoadConfig, RunConfig, check_run_config, lmdeploy_hyperparams
from .datasets import Sample, sample_requests
from .engines import Engine, EngineInfo, engine_settings_key, load_engine, tokenizer_from_engine
from .engines.base import NOT_SENT
from .environment import collect_environment
from .errors import BenchError
from .history import History, RunRecord, new_run_id
from .models import load_tokenizer
from .playground import Conversation, PlaygroundResult, check_request
from .profiler import LiveSnapshot, Profiler, Session

log = logging.getLogger(__name__)

QUEUED, LOADING, RUNNING = "queued", "loading", "running"
FINISHED, FAILED, CANCELLED = "finished", "failed", "cancelled"
# A request counts as served when the engine stopped it for length or for EOS; the profiler then
# tells complete from incomplete by comparing the tokens produced with the tokens asked for.
SERVED_REASONS = ("length", "stop")
# A request's clock starts when the engine takes it (a worker, or an HTTP send), not at t0.
TICK_AT_ADMISSION = ("concurrency", "request_rate")


# Guards the one transition two threads race for: a queued job either starts or is cancelled.
_START_LOCK = threading.Lock()


class _Job:
    """What benchmark runs and playground jobs share: a state, a cancel flag and a done flag."""

    state: str
    cancel_event: threading.Event
    done_event: threading.Event

    @property
    def active(self) -> bool:
        """Until the job has ended AND what it measured is recorded: a view never sees an ended job
        without its results."""
        return not self.done_event.is_set()

    def cancel(self) -> None:
        """Stop within a second; what was done so far is kept. A queued job ends at once."""
        self.cancel_event.set()
        with _START_LOCK:
            if self.state == QUEUED:
                self.state, self.message = CANCELLED, "Cancelled before it started."
                self.done_event.set()

    def claim(self) -> bool:
        """Move a queued job to loading for the worker; False when it was cancelled first."""
        with _START_LOCK:
            if self.state != QUEUED:
                return False
            self.state = LOADING
            return True

    def wait(self, timeout: float | None = None) -> bool:
        """True once the job has ended."""
        return self.done_event.wait(timeout)


@dataclass
class Run(_Job):
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
    sweep_id: str = ""  # set for the runs of a sweep, with their 0-based repeat index
    sweep_repeat: int | None = None
    cancel_event: threading.Event = field(default_factory=threading.Event, repr=False)
    done_event: threading.Event = field(default_factory=threading.Event, repr=False)

    def snapshot(self) -> LiveSnapshot | None:
        return self.profiler.live_snapshot() if self.profiler is not None else None


@dataclass
class PlaygroundJob(_Job):
    """Chat prompts answered once by the engine; `results` grows as prompts finish (any order)."""

    job_id: str
    engine: EngineConfig
    conversations: list[Conversation]
    generation: GenerationSettings
    max_new_tokens: int
    state: str = QUEUED
    message: str = ""
    results: list[PlaygroundResult] = field(default_factory=list)
    engine_info: EngineInfo | None = None
    user_error: bool = False
    cancel_event: threading.Event = field(default_factory=threading.Event, repr=False)
    done_event: threading.Event = field(default_factory=threading.Event, repr=False)


class Runner:
    """Executes submitted runs in order on one background thread and keeps the loaded engine."""

    def __init__(self, history: History | None = None):
        self.history = history
        self._jobs: dict[str, Run | PlaygroundJob] = {}  # insertion order is queue order
        self._queue: queue.Queue[Run | PlaygroundJob | None] = queue.Queue()
        self._lock = threading.Lock()
        self._engine: Engine | None = None
        self._engine_key: tuple | None = None
        self._engine_settings: tuple[EngineConfig, LoadConfig] | None = None
        self._thread: threading.Thread | None = None

    # ---- public API -------------------------------------------------------------------------

    def submit(self, config: RunConfig, sweep_id: str = "", sweep_repeat: int | None = None) -> Run:
        """Validate `config` (raises ConfigError with every problem) and queue the run; a sweep's runs
        carry its id and their repeat index into the history."""
        check_run_config(config)
        run = Run(run_id=new_run_id(), config=config, sweep_id=sweep_id, sweep_repeat=sweep_repeat)
        self._enqueue(run.run_id, run)
        return run

    def submit_playground(
        self,
        engine: EngineConfig,
        conversations: Sequence[Conversation],
        generation: GenerationSettings,
        max_new_tokens: int,
    ) -> PlaygroundJob:
        """Check the prompts, settings and engine (a ConfigError says what is wrong), then queue the job."""
        check_request(conversations, generation, max_new_tokens)
        check_run_config(RunConfig(engine=engine))  # the engine part: backend, model, knobs
        job = PlaygroundJob(new_run_id(), engine, list(conversations), generation, max_new_tokens)
        self._enqueue(job.job_id, job)
        return job

    def get(self, run_id: str) -> Run | None:
        job = self._job(run_id)
        return job if isinstance(job, Run) else None

    def get_playground(self, job_id: str) -> PlaygroundJob | None:
        job = self._job(job_id)
        return job if isinstance(job, PlaygroundJob) else None

    def runs(self) -> list[Run]:
        with self._lock:
            return [job for job in self._jobs.values() if isinstance(job, Run)]

    def loaded_engine(self) -> EngineConfig | None:
        """The settings of the engine in memory, if any: a playground job with these reuses it."""
        settings = self._engine_settings
        return settings[0] if settings is not None else None

    def queue_position(self, job: Run | PlaygroundJob) -> int:
        """How many runs and jobs are ahead of a queued `job`, the executing one included (0 otherwise)."""
        if job.state != QUEUED:
            return 0
        ahead = 0
        with self._lock:
            for other in self._jobs.values():
                if other is job:
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

    def _job(self, job_id: str) -> Run | PlaygroundJob | None:
        with self._lock:
            return self._jobs.get(job_id)

    def _enqueue(self, job_id: str, job: Run | PlaygroundJob) -> None:
        with self._lock:
            self._jobs[job_id] = job
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._work, name="bench-runner", daemon=True)
                self._thread.start()
        self._queue.put(job)

    # ---- worker -----------------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            if not job.claim():
                continue
            try:
                if isinstance(job, Run):
                    self._execute(job)
                else:
                    self._guarded(job, self._complete, f"playground job {job.job_id}")
            finally:
                job.done_event.set()

    def _execute(self, run: Run) -> None:
        self._guarded(run, self._benchmark, f"run {run.run_id}")
        if run.profiler is not None:
            self._record(run)

    def _guarded(self, job: _Job, body: Callable, name: str) -> None:
        """Run `body(job)`; any error ends the job as failed, never the worker."""
        try:
            body(job)
        except BenchError as exc:
            job.state, job.message, job.user_error = FAILED, str(exc), True
        except Exception as exc:  # an engine bug must end this job, not the process
            log.exception("%s failed", name)
            job.state, job.message = FAILED, f"{type(exc).__name__}: {exc}"
            self._release_engine()  # it may be left in a broken state

    def _benchmark(self, run: Run) -> None:
        self._prepare(run)
        if run.cancel_event.is_set():
            run.state, run.message = CANCELLED, "Cancelled while loading."
            return
        run.state = RUNNING
        self._measure(run)
        run.state = CANCELLED if run.cancel_event.is_set() else FINISHED

    def _complete(self, job: PlaygroundJob) -> None:
        # The load settings of the engine in memory, so that the same engine settings reuse it.
        load = self._engine_settings[1] if self._engine_settings is not None else LoadConfig()
        engine = self._engine_for(job.engine, load)
        job.engine_info = engine.info
        if job.cancel_event.is_set():
            job.state, job.message = CANCELLED, "Cancelled while loading."
            return
        job.state = RUNNING
        for result in engine.complete(job.conversations, job.generation, job.max_new_tokens, job.cancel_event):
            job.results.append(result)
        job.state = CANCELLED if job.cancel_event.is_set() else FINISHED

    def _prepare(self, run: Run) -> None:
        config = run.config
        if tokenizer_from_engine(config.engine.backend):
            self._engine_for(config.engine, config.load)
        tokenizer = (
            self._engine.tokenizer
            if self._engine is not None and self._engine_key == engine_settings_key(config.engine, config.load)
            else load_tokenizer(config.engine.model, config.engine.trust_remote_code)
        )
        run.sample = sample_requests(config.dataset, tokenizer)
        run.warnings.extend(run.sample.warnings)
        if not run.sample.requests:
            raise BenchError("The dataset gave no request to send.")
        run.engine_info = self._engine_for(config.engine, config.load).info

    def _engine_for(self, engine: EngineConfig, load: LoadConfig) -> Engine:
        key = engine_settings_key(engine, load)
        if self._engine is None or key != self._engine_key:
            self._release_engine()
            self._engine = load_engine(engine, load)
            self._engine_key, self._engine_settings = key, (engine, load)
        return self._engine

    def _release_engine(self) -> None:
        if self._engine is not None:
            engine, self._engine, self._engine_key, self._engine_settings = self._engine, None, None, None
            try:
                engine.close()
            except Exception:
                log.exception("closing the engine failed")

    def _measure(self, run: Run) -> None:
        config, requests = run.config, run.sample.requests
        self._engine.warmup(requests, config.generation, run.cancel_event)  # before the clock starts
        if run.cancel_event.is_set():  # during the warm-up: nothing was measured
            return
        profiler = Profiler(config.load.stream_output, list(config.percentiles), slo=config.slo)
        sessions = [profiler.new_session(r.input_len, r.output_len) for r in requests]
        run.profiler = profiler
        tick_at_admission = config.load.load_pattern in TICK_AT_ADMISSION
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
                elif event.kind == "finish" and event.finish_reason == NOT_SENT:
                    session.reason = event.message  # never sent: it stays unfinished
                elif event.kind == "finish":
                    status = Session.SUCCESS if event.finish_reason in SERVED_REASONS else Session.FAIL
                    reason = event.finish_reason + (f": {event.message}" if event.message else "")
                    session.finish(status, reason, event.ts, event.extra)
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
            sweep_id=run.sweep_id,
            sweep_repeat=run.sweep_repeat,
        )
        if self.history is not None:
            try:
                self.history.record(run.record)
            except BenchError as exc:
                run.warnings.append(f"The run could not be saved to the history: {exc}")

