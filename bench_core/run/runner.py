"""Benchmark runs in a background thread, one at a time per process, the others waiting in a queue.

A run moves through its lifecycle (lifecycle.py) from queued to finished, partial (some requests failed),
failed (none succeeded, or the run broke) or cancelled. Loading samples the requests (with the model's
tokenizer) before the engine is touched, so a bad dataset fails in seconds; the engine is then loaded, or
reused when its settings are unchanged, and warmed up. `Run.phase` says which step is under way. Engine
events become profiler ticks here, and only here, so every engine is measured the same way; a run with
observers publishes its live snapshot and finished requests to them every PUBLISH_EVERY_S while it measures.
Whatever ends a run, what was measured is kept and, once the run has started, recorded (aggregated once,
here, where it was measured) and saved in the history; so is a run that failed before measuring, with its
reason.

Playground jobs (chat prompts answered once, `submit_playground`) wait in the same queue and use the
same cached engine, so one thing at a time holds the accelerator; they are not recorded.
"""

from __future__ import annotations

import copy
import dataclasses
import gc
import logging
import queue
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pandas as pd

from ..config import EngineConfig, GenerationSettings, LoadConfig, RunConfig
from ..config.catalog import CACHE_AUTO, CACHE_COLD, CACHE_UNKNOWN, CACHE_WARM
from ..config.catalog import setting as catalog_setting
from ..engines import (
    Engine,
    EngineInfo,
    backend,
    check_run_config,
    engine_settings_key,
    load_engine,
    tokenizer_from_engine,
)
from ..engines.base import CANCELLED_BY_LOAD, NOT_SENT, RUN_ENDED, CacheStart
from ..errors import BenchError, ConfigError, ModelError
from ..hardware import roofline
from ..hardware.environment import collect_environment
from ..hardware.telemetry import TelemetrySampler, with_loop_lag
from ..load.cancellation import cancel_points
from ..load.datasets import Sample, SampledRequest, load_quality_set, sample_requests
from ..load.playground import Conversation, check_request
from ..load.workload import with_workload_columns
from ..measure import metrics
from ..measure.profiler import Profiler, Session, new_profiler
from ..measure.quality import DriftBaseline, OutputJudge, baseline_differences, stored_outputs
from ..measure.time_left import PastPace, past_pace, past_pace_columns
from ..models.resolve import cache_dir, describe_model, first_use_phase, load_tokenizer, resolve_model
from ..redact import redact_text, remember_secrets
from ..states import MEASURED, SERVED_REASONS, LoadPattern, RequestStatus, RunState, measured_state
from ..store.history import History, RunRecord, local_now_iso, new_run_id, run_metrics
from ..store.history_import import lmdeploy_hyperparams
from ..store.journal import RunJournal
from . import preflight
from .lifecycle import Job, PlaygroundJob, Run
from .observer import JobObserver

log = logging.getLogger(__name__)

# The failure reasons a run's message quotes, most frequent first.
REASONS_QUOTED = 3
# A request's clock starts when the engine takes it (a worker, an HTTP send, a trace's time), not at t0; so does a
# turn's that follows another, whatever the pattern.
TICK_AT_ADMISSION = (LoadPattern.CONCURRENCY, LoadPattern.ENGINE_API, LoadPattern.REQUEST_RATE, LoadPattern.TRACE)
# The reason an engine gives a request it stopped because of a cancel.
ABORT = "abort"
PUBLISH_EVERY_S = 0.25  # how often a measuring run with observers tells them its snapshot and finished requests


def drift_baseline_for(config: RunConfig, history: History | None) -> DriftBaseline | None:
    """The answers of `config`'s --drift-baseline run in `history` (None: it names none). A run not in the history,
    or one that kept no answers, is a ConfigError: refused before anything runs."""
    run_id = config.dataset.drift_baseline
    if not run_id:
        return None
    if history is None:
        raise ConfigError("--drift-baseline reads the baseline run from the history; this run has none.")
    if not history.run_dir(run_id).is_dir():
        raise ConfigError(f"--drift-baseline: run {run_id} is not in {history.root}.")
    table = history.requests(run_id)
    answers = stored_outputs(table)
    if answers is None:
        raise ConfigError(f"Run {run_id} kept no answers to compare with; run it again with --keep-outputs.")
    return DriftBaseline(run_id, tuple(answers), tuple(int(n) for n in table["input_len"]))


class Runner:
    """Executes submitted runs in order on one background thread and keeps the loaded engine."""

    def __init__(self, history: History | None = None, caller_pid: int | None = None):
        self.history = history
        # The process following this runner's runs from outside (the dashboard beside its engine worker): its CPU is
        # ours, not another process's, when judging whether the machine was busy (hardware/contention.py).
        self.caller_pid = caller_pid
        self._jobs: dict[str, Run | PlaygroundJob] = {}  # insertion order is queue order
        self._queue: queue.Queue[Run | PlaygroundJob | None] = queue.Queue()
        self._lock = threading.Lock()
        self._engine: Engine | None = None
        self._engine_key: tuple | None = None
        self._engine_settings: tuple[EngineConfig, LoadConfig] | None = None
        self._engine_served = False  # whether the engine in memory has run requests since it was loaded
        self._thread: threading.Thread | None = None

    # ---- public API -------------------------------------------------------------------------

    def submit(
        self,
        config: RunConfig | preflight.Preflighted,
        sweep_id: str = "",
        sweep_repeat: int | None = None,
        observers: Sequence[JobObserver] = (),
        run_id: str = "",
    ) -> Run:
        """Check `config` (`preflight.check_run`: ConfigError with every problem; a config that passed it already is
        not checked again) and queue the run, heard by `observers` from its first move; a sweep's runs carry its id
        and their repeat index into the history. `run_id`: one chosen before (a sweep's server writes its log into the
        run's folder before the run is submitted)."""
        config = (config if isinstance(config, preflight.Preflighted) else preflight.check_run(config)).config
        run = Run(
            run_id=run_id or new_run_id(),
            config=config,
            sweep_id=sweep_id,
            sweep_repeat=sweep_repeat,
            baseline=drift_baseline_for(config, self.history),
            observers=list(observers),
        )
        run.measurement.pace = self._past_pace(config)
        self.enqueue(run)
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
        self.enqueue(job)
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
        if job.state != RunState.QUEUED:
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

    def _past_pace(self, config: RunConfig) -> PastPace | None:
        """What this runner's history says of runs like `config`'s; None without a history, or with one that
        cannot be read now (the run goes on: its time left waits for its own output then)."""
        if self.history is None:
            return None
        try:
            return past_pace(self.history.load(columns=past_pace_columns(config)), config)
        except (BenchError, OSError) as exc:
            log.warning("No past pace for the time left: %s", exc)
            return None

    def _job(self, job_id: str) -> Run | PlaygroundJob | None:
        with self._lock:
            return self._jobs.get(job_id)

    def enqueue(self, job: Run | PlaygroundJob) -> None:
        """Queue a job that is already checked (`submit` and `submit_playground` check theirs)."""
        engine = job.config.engine if isinstance(job, Run) else job.engine
        # Here, not in submit: an engine process queues its jobs without submitting them.
        remember_secrets(engine.base_url, engine.extra_request_body, engine.api_key)
        with self._lock:
            self._jobs[job.run_id if isinstance(job, Run) else job.job_id] = job
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
            if not job.claim():  # cancelled while queued: it has ended already
                continue
            try:
                if isinstance(job, Run):
                    if self.history is not None:
                        job.observers.append(_Journaling(self.history))
                    self._guarded(job, self._benchmark, f"run {job.run_id}")
                    self.keep(job)
                else:
                    self._guarded(job, self._complete, f"playground job {job.job_id}")
            finally:
                job.close()

    def _guarded(self, job: Job, body: Callable, name: str) -> None:
        """Run `body(job)`; any error ends the job as failed, never the worker."""
        try:
            body(job)
        except BenchError as exc:
            self._fail(job, name, str(exc), user_error=True, refused=exc.refuses_input)  # it masks credentials itself
        except Exception as exc:  # an engine bug must end this job, not the process
            log.exception("%s failed", name)
            self._fail(job, name, redact_text(f"{type(exc).__name__}: {exc}"))
            self._release_engine()  # it may be left in a broken state

    @staticmethod
    def _fail(job: Job, name: str, message: str, user_error: bool = False, refused: bool = False) -> None:
        if job.ended:  # what broke came after the end (an observer, say): the job keeps its end
            log.error("%s broke after it ended %s: %s", name, job.state, message)
        else:
            job.move(RunState.FAILED, message, user_error=user_error, refused=refused)

    def _benchmark(self, run: Run) -> None:
        measurement = run.measurement
        started = time.perf_counter()
        try:
            self._prepare(run)
            cold = asked_cache_state(run.config) == CACHE_COLD
            engine = self._engine
            assert engine is not None and measurement.sample is not None, "_prepare loaded and sampled"
            if (
                cold
                and run.config.engine.enable_prefix_caching
                and self._engine_served
                and not (engine.cache_per_run or engine.resets_prefix_cache or run.config.load.warmup_requests)
            ):
                # An engine here with no way to drop its cache starts cold only as a new one, and only without a
                # warm-up, which would fill it again.
                self._release_engine()
                self._engine_for(run.config.engine, run.config.load, run)
            if not run.cancel_event.is_set():
                assert self._engine is not None, "loaded again where it was released"
                run.describe("warming up")
                warming = time.perf_counter()
                self._engine_served |= bool(run.config.load.warmup_requests)
                self._engine.warmup(
                    measurement.sample.requests, run.config.generation, run.config.load, run.cancel_event
                )
                if run.config.load.warmup_requests:
                    measurement.warmup_seconds = time.perf_counter() - warming
                measurement.cache_start = self._start_cache(run.config, cold)
                if measurement.cache_start.note:
                    measurement.warnings.append(measurement.cache_start.note)
        finally:
            measurement.load_seconds = time.perf_counter() - started
        if run.cancel_event.is_set():
            run.move(RunState.CANCELLED, "Cancelled while loading.")
            return
        measurement.environment = collect_environment(measurement.engine_info)
        run.move(RunState.RUNNING, phase="measuring")
        self._measure(run)
        if run.cancel_event.is_set():
            run.move(RunState.CANCELLED)
        else:
            assert measurement.profiler is not None, "_measure made it"
            measurement.profiler.compute_metrics()
            run.move(*measured_outcome(measurement.profiler, run.config.load))

    def _start_cache(self, config: RunConfig, cold: bool) -> CacheStart:
        """Drop the prefix cache where the run asks for a cold one and the engine can, and say what it holds now."""
        engine, warmed = self._engine, config.load.warmup_requests
        assert engine is not None, "loaded"
        if engine.cache_per_run:
            said = config.load.cache_state == CACHE_WARM and config.engine.enable_prefix_caching
            return CacheStart(
                CACHE_COLD,
                f"Prefix cache: cold, not warm: the {config.engine.backend} engine builds its cache for each run, "
                "so nothing carries over."
                if said
                else "",
            )
        if caching_knob.applies(backend=config.engine.backend) and not config.engine.enable_prefix_caching:
            return CacheStart(CACHE_COLD)  # an engine here that caches no prefix
        if not cold:  # a server's cache is what its other clients left too
            served = self._engine_served or not backend(config.engine.backend).in_process
            return CacheStart(CACHE_WARM if served else CACHE_COLD)
        if engine.resets_prefix_cache:
            why = engine.reset_prefix_cache()
            return (
                CacheStart(CACHE_UNKNOWN, f"Prefix cache state at the start unknown: {why}.")
                if why
                else CacheStart(CACHE_COLD)
            )
        if warmed:
            return CacheStart(
                CACHE_WARM,
                f"Prefix cache: warm, not cold: the {config.engine.backend} engine has no way to drop what its "
                f"{warmed} warm-up request(s) (and any earlier run) cached; without a warm-up it is reloaded and "
                "starts cold.",
            )
        return CacheStart(CACHE_COLD)

    def _complete(self, job: PlaygroundJob) -> None:
        # The load settings of the engine in memory, so that the same engine settings reuse it; but prompts are
        # answered through a pipeline, not the engine API's bare engine.
        load = self._engine_settings[1] if self._engine_settings is not None else LoadConfig()
        if load.load_pattern == LoadPattern.ENGINE_API:
            load = LoadConfig(concurrency=load.concurrency)
        engine = self._engine_for(job.engine, load)
        job.engine_info = engine.info
        if job.cancel_event.is_set():
            job.move(RunState.CANCELLED, "Cancelled while loading.")
            return
        job.move(RunState.RUNNING)
        self._engine_served = True
        for result in engine.complete(job.conversations, job.generation, job.max_new_tokens, job.cancel_event):
            job.answer(result)
        job.move(RunState.CANCELLED if job.cancel_event.is_set() else RunState.FINISHED)

    def _prepare(self, run: Run) -> None:
        config, measurement = run.config, run.measurement
        model = config.engine.model
        if tokenizer_from_engine(config.engine.backend):
            self._engine_for(config.engine, config.load, run)
        if self._engine is not None and self._engine_key == engine_settings_key(config.engine, config.load):
            tokenizer = self._engine.tokenizer
        else:
            if phase := first_use_phase(model):
                run.describe(phase)
                resolve_model(model)
            run.describe(f"loading the tokenizer of {model}")
            tokenizer = load_tokenizer(model, config.engine.trust_remote_code)
        run.describe(f"sampling {config.dataset.num_prompts:,} prompts from {config.dataset.dataset}")
        measurement.sample = sample_requests(config.dataset, tokenizer)
        measurement.warnings.extend(measurement.sample.warnings)
        if not measurement.sample.requests:
            raise BenchError("The dataset gave no request to send.")
        preflight.check_requests(measurement.sample.requests, config.engine)
        preflight.check_schedule(measurement.sample.requests, config.load)
        measurement.judge = self._output_judge(run)
        measurement.engine_info = self._engine_for(config.engine, config.load, run).info

    def _output_judge(self, run: Run) -> OutputJudge | None:
        """What the run's answers are kept for: a drift baseline's answers, a quality set's references; None where
        the run keeps none. A baseline that may not be comparable is told in the run's warnings."""
        dataset, measurement = run.config.dataset, run.measurement
        if not (dataset.keep_outputs or dataset.drift_baseline or dataset.quality_set):
            return None
        # Carried from where the run was submitted; read here where this runner has the history (a run enqueued bare).
        baseline = run.baseline or drift_baseline_for(run.config, self.history)
        if baseline is not None:
            assert measurement.sample is not None, "judged once sampled"
            measurement.warnings.extend(
                baseline_differences(
                    baseline.run_id,
                    baseline.input_lens,
                    [request.input_len for request in measurement.sample.requests],
                    run.config.generation.do_sample,
                )
            )
        items = load_quality_set(dataset.quality_set) if dataset.quality_set else None
        return OutputJudge(None if baseline is None else baseline.answers, items)

    def _engine_for(self, engine: EngineConfig, load: LoadConfig, run: Run | None = None) -> Engine:
        key = engine_settings_key(engine, load)
        if self._engine is None or key != self._engine_key:
            self._release_engine()
            if run is not None:
                run.describe(f"loading {engine.model} on the {engine.backend} engine")
            self._engine = load_engine(engine, load)
            self._engine_key, self._engine_settings = key, (engine, load)
            self._engine_served = False
            # What is loaded now (torch, the model, its tokenizer: some 340k objects) lives as long as the engine.
            # Frozen, the cyclic collector stops walking it: a full collection took 0.3-0.4 s, a stall in a run's
            # tokens whenever Python chose to run one, and transformers runs one at the end of every batch.
            gc.freeze()
        return self._engine

    def _release_engine(self) -> None:
        if self._engine is not None:
            engine, self._engine, self._engine_key, self._engine_settings = self._engine, None, None, None
            try:
                engine.close()
            except Exception:
                log.exception("closing the engine failed")
            gc.unfreeze()  # so that what the engine leaves can be collected

    def _measure(self, run: Run) -> None:
        config, measurement = run.config, run.measurement
        assert self._engine is not None and measurement.sample is not None, "prepared"
        requests = measurement.sample.requests
        if config.load.load_pattern == LoadPattern.ENGINE_API:
            requests = engine_api_requests(measurement.sample, config.load, self._engine)
        profiler = new_profiler(config)
        sessions = [profiler.new_session(r.input_len, r.output_len) for r in requests]
        measurement.profiler = profiler
        tick_at_admission = config.load.load_pattern in TICK_AT_ADMISSION
        # This process runs the engine (or its client).
        sampler = measurement.sampler = TelemetrySampler(
            caller_pid=self.caller_pid, client_pids=self._engine.client_pids()
        ).start()
        measurement.loop_lag = self._engine.loop_lag
        # A server's GPUs are its own business (it may be elsewhere); an engine here on a GPU should be seen.
        if (
            sampler.gpu_note
            and backend(config.engine.backend).in_process
            and not self._engine.info.device.startswith("cpu")
        ):
            measurement.warnings.append(sampler.gpu_note)
        scraper = measurement.scraper = self._engine.metrics_scraper()
        if scraper is not None:
            scraper.start()
            # Its first read is the baseline of the server's counters over the run, so the clock starts after it: a
            # page that does not come whole within the read's timeout is a failed read, and the run starts without it.
            # What the read found is told with the run's other warnings, at its end.
            scraper.wait_for_first_read(run.cancel_event)
        profiler.start()
        ticks_at_admission = [tick_at_admission or r.follows is not None for r in requests]
        for session, at_admission in zip(sessions, ticks_at_admission):
            if not at_admission:  # LMDeploy's pipeline semantics: every request starts at t0
                session.tick(0)
        # A request rate draws its arrivals as profile_restful_api.py does, after sampling.
        by_rate = config.load.load_pattern == LoadPattern.REQUEST_RATE
        arrivals = {"arrival_seed": measurement.sample.arrival_rng} if by_rate else {}
        try:
            events = self._engine.stream(requests, config.generation, config.load, run.cancel_event, **arrivals)
        except BaseException:
            sampler.stop()  # its thread would sample on, and NVML stay open, for nothing
            if scraper is not None:
                scraper.stop()
            raise
        publishing = _Publishing(run) if run.observers else None
        self._engine_served = True
        judge = measurement.judge
        answers: dict[int, tuple[Sequence[int], str | None] | None] = {}  # the served requests' answers, where kept
        try:
            for event in events:
                if event.kind == "end":  # the engine's own work from here on is not the run's
                    profiler.finish(event.ts)
                    continue
                session = sessions[event.index]
                if event.input_len:  # a count the engine knows better than the sample (a prompt built when sent)
                    session.input_len = event.input_len
                if event.kind == "tokens":
                    if event.earlier_ts:
                        session.tick_many(event.earlier_ts, event.earlier_ns)
                    session.tick_at(event.n_tokens, event.ts)
                elif event.kind == "admit":
                    session.admit(event.ts)
                    if ticks_at_admission[event.index]:
                        session.tick_at(0, event.ts)
                elif event.kind == "counted":
                    session.extra = {**(session.extra or {}), **(event.extra or {})}
                elif event.kind == "finish" and event.finish_reason == NOT_SENT:
                    session.reason = event.message  # never sent: it stays unfinished
                elif event.kind == "finish" and event.finish_reason in (RUN_ENDED, CANCELLED_BY_LOAD):
                    session.finish(Session.CANCELLED, event.message, event.ts, event.extra)
                elif event.kind == "finish" and event.finish_reason == ABORT and run.cancel_event.is_set():
                    session.finish(Session.CANCELLED, "cancelled", event.ts, event.extra)
                elif event.kind == "finish":
                    status = Session.SUCCESS if event.finish_reason in SERVED_REASONS else Session.FAIL
                    if judge is not None and status == Session.SUCCESS:
                        # An engine that counted tokens but handed over no answer: nothing to keep, not an empty one.
                        handed = bool(event.token_ids) or event.text is not None or not event.n_tokens
                        answers[event.index] = (event.token_ids, event.text) if handed else None
                    reason = event.finish_reason + (f": {redact_text(event.message)}" if event.message else "")
                    session.finish(status, reason, event.ts, event.extra, event.length_status)
        finally:
            if run.cancel_event.is_set():  # what was waiting or never sent was cancelled too
                for session in sessions:
                    if session.status == Session.UNKNOWN:
                        session.finish(Session.CANCELLED, session.reason or "cancelled")
            if profiler.t_finish is None:
                profiler.finish()
            samples = with_loop_lag(sampler.stop(), self._engine.loop_lag())
            measurement.telemetry = samples.assign(time_s=samples["time_s"] - profiler.t_start)
            if scraper is not None:
                raw = scraper.stop()
                measurement.warnings.extend(scraper.warnings)  # one line each, and the run is kept without them
                if raw is not None:
                    measurement.server_metrics = raw.assign(time_s=raw["time_s"] - profiler.t_start)
            if publishing is not None:
                publishing.end()
        if judge is not None:
            self._judge(judge, sessions, answers)
            unanswered = sum(answer is None for answer in answers.values())
            if unanswered:
                measurement.warnings.append(
                    f"The {config.engine.backend} engine handed over no answer for {unanswered} served requests: "
                    "they have no drift or score (the embedded engine and servers hand theirs over)."
                )

    def _judge(
        self,
        judge: OutputJudge,
        sessions: list[Session],
        answers: dict[int, tuple[Sequence[int], str | None] | None],
    ) -> None:
        """Each request's answer, drift and score as columns of its row, after the clock: an answer's ids are
        decoded, or its text encoded, here (an engine hands over whichever it has)."""
        assert self._engine is not None, "judged by the engine that answered"
        tokenizer = self._engine.tokenizer
        for index, session in enumerate(sessions):
            ids, text = answers.get(index) or (None, None)
            if ids is not None and text is None:
                text = tokenizer.decode(list(ids), skip_special_tokens=True)
            if ids is not None and not ids and text:
                ids = tokenizer.encode(text, add_special_tokens=False)
            kept = judge.columns(index, ids, text)
            session.extra = {**(session.extra or {}), **kept}

    def keep(self, run: Run) -> None:
        """Record what the run measured, where no record came with it, and save the record in this runner's
        history, if it has one. A run cancelled before measuring has nothing to keep, nor one whose input was
        refused (a typo is not a run); one that failed otherwise before measuring is recorded with what was tried."""
        measurement = run.measurement
        if run.refused and not measurement.measured:
            return
        if measurement.record is None and (measurement.profiler is not None or run.state == RunState.FAILED):
            try:
                measurement.record = self.record(run)
            except Exception as exc:  # a bug in summing up must neither end the worker nor pass for a saved run
                log.exception("run %s could not be recorded", run.run_id)
                measurement.save_error = redact_text(
                    f"The run's record could not be made ({type(exc).__name__}: {exc}); nothing of it is saved."
                )
                return
        if measurement.record is not None and self.history is not None:
            self.save(run)

    def record(self, run: Run) -> RunRecord:
        """The run's RunRecord, from what it measured: its metrics aggregated here, once."""
        measurement, config = run.measurement, run.config
        profiler = measurement.profiler
        measured = profiler is not None
        requests = None
        if profiler is not None:  # the dataset's facts of each request (its session, turn, prefix group) beside it
            sampled = measurement.sample.requests if measurement.sample is not None else []
            requests = with_workload_columns(profiler.request_table(), sampled)
        summary = (
            run_metrics(config, requests, profiler.elapsed_time, measurement.telemetry, measurement.server_metrics)
            if profiler is not None
            else {}
        )
        environment = measurement.environment
        if environment is None:
            environment = collect_environment(measurement.engine_info)
        return RunRecord(
            run_id=run.run_id,
            started_at=run.created_at,
            status=run.state if run.ended else RunState.FAILED,
            config=config,
            lmdeploy_columns=profiler.lmdeploy_csv_row(lmdeploy_hyperparams(config), summary)
            if profiler is not None
            else {},
            metrics=summary,
            engine_info=measurement.engine_info,
            environment=environment,
            requests=requests,
            model=describe_model(config.engine.model),
            telemetry=measurement.telemetry if measured else None,
            server_metrics=measurement.server_metrics if measured else None,
            roofline=run_roofline(config, measurement.engine_info, environment, summary, requests)
            if measured and run.state in MEASURED
            else None,
            error=run.message,
            finished_at=local_now_iso(),
            load_seconds=measurement.load_seconds,
            warmup_seconds=measurement.warmup_seconds,
            cache_start=measurement.cache_start.state if measurement.cache_start is not None else "",
            sweep_id=run.sweep_id,
            sweep_repeat=run.sweep_repeat,
        )

    def save(self, run: Run) -> None:
        """Record the run in the history; where that fails, in the first fallback folder that takes it,
        and say so in its `save_error`. Whatever the history raises, the run is kept and the failure told."""
        assert self.history is not None and run.record is not None, "a recorded run, of a runner with a history"
        try:
            self.history.record(run.record)
            return
        except Exception as exc:
            problem = f"The run was not saved in {self.history.root} ({_reason(exc)})"
        for root in unsaved_results_folders():
            try:
                History(root).record(run.record)
            except Exception as exc:
                problem += f"; nor in {root} ({_reason(exc)})"
                continue
            # A folder written before the history row failed would be a run folder without its row.
            shutil.rmtree(self.history.runs_dir / run.run_id, ignore_errors=True)
            run.measurement.save_error = (
                f"{problem}; it is kept in {root} instead (history.csv and runs/{run.run_id}/)."
            )
            return
        run.measurement.save_error = f"{problem}; nothing of it is on disk."


class _Publishing:
    """Publishes a measuring run to its observers every PUBLISH_EVERY_S from a thread of its own, and once more
    at `end`, when every request has its final status."""

    def __init__(self, run: Run):
        self.run, self.ending = run, threading.Event()
        self.thread = threading.Thread(target=self._publish, name=f"publish-{run.run_id}", daemon=True)
        self.thread.start()

    def _publish(self) -> None:
        while not self.ending.wait(PUBLISH_EVERY_S):
            self.run.publish()

    def end(self) -> None:
        self.ending.set()
        self.thread.join()
        self.run.publish()


class _Journaling(JobObserver):
    """Keeps a measuring run's journal in its history (store.journal) from the requests published as finished, so
    that a kill of this process (SIGKILL, where no cleanup runs) leaves them for the next start to record. It hears
    them where they reach the process that records the run: from the profiler here, on the publishing thread, or
    from the worker process's pipe (remote.Mirror); the run's own loop never waits for it."""

    def __init__(self, history: History):
        self.history = history
        self.journal: RunJournal | None = None
        self.broken = False

    def on_requests(self, run: Run, finished: dict[int, Session]) -> None:
        if self.broken:
            return
        try:
            if self.journal is None:
                assert run.measurement.sample is not None and run.clock_start is not None, "finished while measuring"
                lengths = [(r.input_len, r.output_len) for r in run.measurement.sample.requests]
                self.journal = self.history.journal(_started_record(run), run.clock_start, lengths)
            self.journal.add(finished)
        except OSError as exc:  # the run goes on; only a kill would lose it now
            self.broken = True
            run.measurement.warnings.append(
                f"The run's journal could not be written ({_reason(exc)}): had this "
                "process been killed, what it measured would have been lost."
            )

    def on_record(self, run: Run, record: RunRecord | None) -> None:
        self.history.close_journal(run.run_id)


def _started_record(run: Run) -> RunRecord:
    """What the record of a run that measures now holds before its requests (the journal's first line)."""
    measurement = run.measurement
    return RunRecord(
        run_id=run.run_id,
        started_at=run.created_at,
        status=RunState.RUNNING,
        config=run.config,
        engine_info=measurement.engine_info,
        environment=measurement.environment or {},
        load_seconds=measurement.load_seconds,
        warmup_seconds=measurement.warmup_seconds,
        cache_start=measurement.cache_start.state if measurement.cache_start is not None else "",
        sweep_id=run.sweep_id,
        sweep_repeat=run.sweep_repeat,
    )


caching_knob = catalog_setting("enable_prefix_caching")


def asked_cache_state(config: RunConfig) -> str:
    """The prefix cache a run asks to start with, cold or warm: auto is cold where the engine's prefix caching is
    on (a sweep's every point and repeat then starts alike), warm elsewhere."""
    if config.load.cache_state == CACHE_AUTO:
        return CACHE_COLD if config.engine.enable_prefix_caching else CACHE_WARM
    return config.load.cache_state


def unsaved_results_folders() -> Iterator[Path]:
    """Where a run that its history would not take is kept, in order of preference: our cache's folder, else a
    new private one in the temporary folder (mkdtemp: a name no other user can take first, readable by us alone)."""
    yield cache_dir() / "unsaved-results"
    try:
        yield Path(tempfile.mkdtemp(prefix="llm-bench-studio-unsaved-results-"))
    except OSError:  # no temporary folder either: the run's save error says nothing of it is on disk
        return


def _reason(exc: Exception) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror
    return str(exc) if isinstance(exc, BenchError) else f"{type(exc).__name__}: {exc}"


def run_roofline(
    config: RunConfig, info: EngineInfo | None, environment: dict[str, str], summary: dict, requests: pd.DataFrame
) -> dict:
    """The run's roofline record (roofline.roofline_record), or {"unavailable": why} where the model or the
    device allows none (a server's model, a GPU whose peaks are not known)."""
    ok = requests["status"].to_numpy(dtype=object) == RequestStatus.SUCCESS
    load = config.load
    by_rate = load.load_pattern == LoadPattern.REQUEST_RATE
    batch_limit = (load.max_concurrency or len(requests)) if by_rate else load.concurrency
    numbers = roofline.RunNumbers(
        output_tokens_per_s=summary["output_throughput"],
        input_tokens_per_s=summary["input_throughput"],
        batch=float(max(1, min(batch_limit, int(ok.sum())))),
        mean_context_len=roofline.mean_decode_context(requests["input_len"][ok], requests["output_len"][ok]),
        streamed=load.stream_output,
        mean_tokens_per_tick=_finite_or_none(summary.get("mean_tokens_per_tick")),
        gpu_util_percent=summary.get("mean_gpu_util_percent"),
    )
    try:
        if info is None:
            raise ModelError("the engine did not say what it loaded")
        model_config = roofline.read_model_config(info.model_path)
        device, device_note = roofline.device_peak(info.device, environment.get("gpu_name", ""), cache_dir())
        return roofline.roofline_record(model_config, info.dtype, device, device_note, numbers)
    except ModelError as exc:
        return {"unavailable": str(exc)}


def _finite_or_none(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and value == value else None


def engine_api_requests(sample: Sample, load: LoadConfig, engine: Engine) -> list[SampledRequest]:
    """The requests of an engine_api run as its workers take them, made before the clock starts: with their ids
    where the prompts are tokenized now (skip tokenize), and with the cancel rate's points (drawn from a copy of
    the sample's generator, so the plan is the same however often it is made)."""
    requests = sample.requests
    points = cancel_points([r.output_len for r in requests], load.cancel_rate, copy.copy(sample.cancel_rng))
    return [
        dataclasses.replace(
            request, cancel_after=point, input_ids=tuple(engine.encode(request.prompt)) if load.skip_tokenize else None
        )
        for request, point in zip(requests, points)
    ]


def measured_outcome(profiler: Profiler, load: LoadConfig) -> tuple[RunState, str]:
    """The state of a run that ran to its end, and its message: failed when no request succeeded,
    partial when some failed, came back short or ran past their token limit, quoting the most frequent reasons."""
    reasons = metrics.format_reasons(dict(list(profiler.failure_reasons.items())[:REASONS_QUOTED]))
    if not reasons and profiler.cancelled:  # a run that ran to its end cancels what its load cut off on purpose
        reasons = (
            f"{profiler.cancelled} cancelled by the cancel rate {load.cancel_rate:g}"
            if load.load_pattern == LoadPattern.ENGINE_API and load.cancel_rate
            else f"{profiler.cancelled} cancelled in flight when the duration ended"
        )
    because = f" ({reasons})" if reasons else ""
    state = measured_state(profiler.success, profiler.failed, profiler.incomplete, profiler.overrun)
    if state == RunState.FAILED:
        return state, f"No request succeeded{because}"
    if state == RunState.PARTIAL:
        counts = (
            (profiler.failed, "failed"),
            (profiler.incomplete, "came back short of their token limit"),
            (profiler.overrun, "ran past their token limit"),
        )
        what = " or ".join(words for count, words in counts if count)
        return state, f"{sum(count for count, _ in counts)} of {len(profiler.sessions)} requests {what}{because}"
    return state, ""
