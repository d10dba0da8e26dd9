"""LMDeploy's `turbomind` and `pytorch` engines, built with `lmdeploy.pipeline` and driven through it as
benchmark/profile_pipeline_api.py drives it.

The pipeline gets the configs of lmdeploy_configs.py, text prompts go in with `do_preprocess=False`, and a request's
status comes from `Response.finish_reason`. Playground prompts (`complete()`) take the chat path instead:
`do_preprocess=True`, EOS honoured, sampling as asked. What ran is recorded, a silent TurboMind-to-PyTorch
fallback included.

Load patterns:
- batch: one `stream_infer` call (stream) or one batch call (non-stream) holding every prompt, as the
  script does; the pipeline's own semaphore (max_batch_size) admits them in order. Non-stream results
  arrive only when all requests are done, so each request ticks once, at the end, as in LMDeploy.
- concurrency: N worker threads, each sending one prompt at a time through the same sync API and
  taking the next when it is done (profile_throughput.py's workers). This is sound because every
  sync call only schedules coroutines on the pipeline's event-loop thread with
  `run_coroutine_threadsafe` and reads its own private queue: engine state is touched by that thread
  alone. The pipeline is bound to the sync API for its lifetime, so the async `generate` API is not used.
- requests that say when they go (a trace's times, multi-turn turns after the one they follow: load.schedule):
  the same N workers, each taking the next request once it is due, whatever the pattern.

A request's cached prompt tokens are Response.cached_tokens, where LMDeploy's Response has the field. Images (the
image dataset) go as LMDeploy's GPT-4V-style messages, text and image_url parts, through the chat template
(do_preprocess=True), the input its vision-language pipelines document; that path was not run here (no GPU).

Nothing here imports lmdeploy, torch or transformers at module level: the backend (lmdeploy_engine.py) imports
this module, and validating its knobs works without them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ..config import EngineConfig, GenerationSettings, LoadConfig
from ..errors import ConfigError, ModelError
from ..load.datasets import SampledRequest
from ..load.playground import Conversation, PlaygroundResult, prompt_preview
from ..load.schedule import SendSchedule
from ..models.resolve import last_line
from ..states import LoadPattern
from .base import Engine, EngineEvent, EngineInfo, finish_in_schedule
from .event_pump import ABORT_EVERY_S, POLL_S, pump_events
from .lmdeploy_configs import (
    build_chat_generation_config,
    build_engine_config,
    build_generation_configs,
    build_speculative_config,
)

# ---- loading ------------------------------------------------------------------------------------


def turbomind_fallback_reason(model_path: str, trust_remote_code: bool) -> str | None:
    """Why `lmdeploy.pipeline` would silently run the PyTorch engine when TurboMind is asked for
    (LMDeploy's own autoget_backend checks, whose warning the script's log level hides); None if it would not."""
    from lmdeploy import turbomind

    if not turbomind.is_available():
        detail = getattr(turbomind, "_import_error", None)
        return "TurboMind's compiled library cannot be loaded" + (f" ({last_line(detail)})" if detail else "")
    from lmdeploy.turbomind.supported_models import is_supported

    if not is_supported(model_path, trust_remote_code=trust_remote_code):
        return "TurboMind does not support this model's architecture"
    return None


def build_engine(engine: EngineConfig, load: LoadConfig) -> LMDeployEngine:
    """Build the pipeline as profile_pipeline_api.py does; raises ConfigError or ModelError with one sentence."""
    from lmdeploy import pipeline
    from transformers import AutoTokenizer

    model_path = local_model_path(engine.model)
    os.environ["TM_LOG_LEVEL"] = engine.log_level
    try:
        backend_config = build_engine_config(engine, load)
    except (AssertionError, ValueError) as exc:
        raise ConfigError(f"LMDeploy rejects these engine settings: {last_line(exc)}.") from exc
    try:
        fallback = (
            turbomind_fallback_reason(model_path, engine.trust_remote_code) if engine.backend == "turbomind" else None
        )
        pipe = pipeline(
            model_path,
            backend_config=backend_config,
            log_level="ERROR",
            speculative_config=build_speculative_config(engine),
            trust_remote_code=engine.trust_remote_code,
        )
        tokenizer = AutoTokenizer.from_pretrained(model_path, trust_remote_code=engine.trust_remote_code)
    except Exception as exc:
        raise ModelError(
            f"LMDeploy could not load '{engine.model}' on the {engine.backend} backend: "
            f"{type(exc).__name__}: {last_line(exc)}"
        ) from exc
    info = engine_info(engine, model_path, pipe.backend_config, fallback)
    return LMDeployEngine(pipe, tokenizer, info, max_batch_size=load.concurrency)


def local_model_path(name: str) -> str:
    """What LMDeploy is handed as the model: our cache's folder for a built-in or synthetic name, else the name."""
    from ..models.resolve import CACHED_MODEL_PREFIXES, resolve_model

    if name.startswith(CACHED_MODEL_PREFIXES):  # built (or found) in our cache, as the other engines do
        return resolve_model(name)
    return name  # a local folder or a hub id, handed to LMDeploy as the script does


def engine_info(engine: EngineConfig, model_path: str, built, fallback_reason: str | None) -> EngineInfo:
    """What actually ran, from the engine config LMDeploy `built` it with. A TurboMind request served by a
    PytorchEngineConfig is a silent fallback."""
    from lmdeploy.messages import PytorchEngineConfig

    ran = "pytorch" if isinstance(built, PytorchEngineConfig) else "turbomind"
    backend, notes = ran, []
    if ran != engine.backend:
        reason = fallback_reason or "reason not reported by LMDeploy"
        backend = f"pytorch (fell back from turbomind: {reason})"
        notes.append(f"LMDeploy silently ran the PyTorch engine instead of TurboMind: {reason}.")
    if ran == "turbomind" and engine.speculative_algorithm:
        notes.append("TurboMind ignores speculative decoding (LMDeploy only warns); this run used none.")
    if getattr(built, "session_len", None):
        notes.append(f"session_len {built.session_len}")
    return EngineInfo(
        backend=backend,
        model=engine.model,
        model_path=model_path,
        dtype=_dtype(built, model_path, engine.trust_remote_code),
        device=_device_name(engine.tp),
        versions=_versions(),
        notes=notes,
    )


def _dtype(built, model_path: str, trust_remote_code: bool) -> str:
    dtype = getattr(built, "dtype", "auto")
    if dtype != "auto":
        return str(dtype)
    try:
        from transformers import AutoConfig

        checkpoint = getattr(AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code), "dtype", None)
    except Exception:
        checkpoint = None
    return f"auto (checkpoint {str(checkpoint).removeprefix('torch.')})" if checkpoint else "auto"


def _device_name(tp: int) -> str:
    try:
        import torch

        name = torch.cuda.get_device_name(0)
    except Exception:
        return "unknown GPU"
    return f"{tp} x {name}" if tp > 1 else name


def _versions() -> dict[str, str]:
    versions = {}
    for package in ("lmdeploy", "torch", "transformers"):
        try:
            versions[package] = str(importlib.import_module(package).__version__)
        except Exception:
            versions[package] = "unknown"
    try:
        import torch

        versions["cuda"] = torch.version.cuda or "none"
    except Exception:
        versions["cuda"] = "unknown"
    return versions


# ---- the engine ---------------------------------------------------------------------------------


class LMDeployEngine(Engine):
    """A built LMDeploy pipeline. Takes any object with the Pipeline's sync API, so the event mapping
    can be exercised without a GPU."""

    def __init__(self, pipe, tokenizer, info: EngineInfo, max_batch_size: int):
        self._pipe = pipe
        self._tokenizer = tokenizer
        self.info = info
        self.max_batch_size = max_batch_size
        self._return_routed_experts = bool(getattr(pipe.backend_config, "enable_return_routed_experts", False))

    @property
    def tokenizer(self):
        return self._tokenizer

    def stream(
        self,
        requests: Sequence[SampledRequest],
        generation: GenerationSettings,
        load: LoadConfig,
        cancel: threading.Event,
    ) -> Iterator[EngineEvent]:
        if load.concurrency > self.max_batch_size:
            raise ValueError(
                f"concurrency {load.concurrency} exceeds the engine's max_batch_size {self.max_batch_size}"
            )
        schedule = SendSchedule(requests, load)
        drive = _PipelineDrive(
            self._pipe,
            [_pipeline_prompt(request) for request in requests],
            build_generation_configs(requests, generation, self._return_routed_experts),
            load.stream_output,
            schedule,
            encode=self._tokenizer.encode if self._tokenizer is not None else None,
        )
        if not schedule.plain:
            drive.start_scheduled(load.concurrency, cancel)
        elif load.load_pattern == LoadPattern.CONCURRENCY:
            drive.start_workers(load.concurrency, cancel)
        else:
            drive.start_batch()
        return drive.events(cancel)

    def complete(
        self,
        conversations: Sequence[Conversation],
        generation: GenerationSettings,
        max_new_tokens: int,
        cancel: threading.Event,
    ) -> Iterator[PlaygroundResult]:
        gen_config = build_chat_generation_config(generation, max_new_tokens)
        started = time.perf_counter()
        # LMDeploy renders each conversation with the model's chat template (do_preprocess=True).
        outputs = self._pipe.stream_infer(list(conversations), gen_config=gen_config, do_preprocess=True)
        return self._chat_results(outputs, conversations, started, cancel)

    def _chat_results(
        self, outputs, conversations, started: float, cancel: threading.Event
    ) -> Iterator[PlaygroundResult]:
        """Merge each prompt's streamed deltas (Response.extend) and yield it when it has a finish reason.
        Cancel is looked at between chunks: LMDeploy then aborts every prompt, which ends the stream."""
        merged: dict[int, Any] = {}  # LMDeploy's Response, by prompt
        first_token_at: dict[int, float] = {}
        stopped = False
        for out in outputs:
            now = time.perf_counter()
            if out.generate_token_len:
                first_token_at.setdefault(out.index, now)
            merged[out.index] = merged[out.index].extend(out) if out.index in merged else out
            if out.finish_reason is not None:
                done, first = merged.pop(out.index), first_token_at.get(out.index)
                yield PlaygroundResult(
                    index=out.index,
                    prompt=prompt_preview(conversations[out.index]),
                    text=done.text,
                    input_tokens=done.input_token_len,
                    output_tokens=done.generate_token_len,
                    finish_reason=done.finish_reason,
                    ttft_s=None if first is None else first - started,
                    total_s=now - started,
                    error=done.error_message or "",
                )
            if cancel.is_set() and not stopped:
                stop_all_sessions(self._pipe)
                stopped = True

    def close(self) -> None:
        self._pipe.close()


def stop_all_sessions(pipe) -> None:
    """AsyncEngine.stop_all_session on the pipeline's loop: bumps the epoch and aborts every session."""
    future = asyncio.run_coroutine_threadsafe(pipe.async_engine.stop_all_session(), pipe.session_mgr.loop)
    concurrent.futures.wait([future], timeout=ABORT_EVERY_S)


def _pipeline_prompt(request: SampledRequest):
    """What the pipeline is given for a request: its text, or with images LMDeploy's GPT-4V-style messages."""
    if not request.images:
        return request.prompt
    parts = [
        {"type": "text", "text": request.prompt},
        *({"type": "image_url", "image_url": {"url": uri}} for uri in request.images),
    ]
    return [{"role": "user", "content": parts}]


class _PipelineDrive:
    """One stream() call: helper threads feed the pipeline and stamp what comes back; the caller's
    thread reads their events from a queue and, on cancel, stops LMDeploy the way its api_server
    does (a new epoch drops every queued request, and running ones are aborted)."""

    def __init__(
        self,
        pipe,
        prompts: list,
        gen_configs: list,
        stream_output: bool,
        schedule: SendSchedule,
        encode: Callable[[str], list[int]] | None = None,
    ):
        """`encode` measures a prompt built when it is sent (a turn repeating the model's answer)."""
        self.pipe = pipe
        self.encode = encode
        self.prompts = prompts
        self.gen_configs = gen_configs
        self.stream_output = stream_output
        self.schedule = schedule
        self.sessions = [pipe.session() for _ in prompts]
        for session in self.sessions:  # stamped so that a cancel can drop requests still queued
            session.epoch = pipe.async_engine.epoch
        self.queue: queue.Queue[EngineEvent | None] = queue.Queue()
        self.threads = 0
        self.due = threading.Condition()  # guards the schedule; told when a request ends (its next turn is due)
        # Each request's answer so far, its ids and its text pieces: Response chunks carry what is new since the last
        # (a batch call's one Response, all of it). A later turn repeats the text; the runner keeps both where asked.
        self.answers: dict[int, tuple[list[int], list[str]]] = {}
        self.cached: dict[int, int] = {}

    # -- feeding (helper threads) --

    def start_batch(self) -> None:
        self._spawn(self._feed_batch)

    def start_workers(self, count: int, cancel: threading.Event) -> None:
        todo: queue.SimpleQueue[int] = queue.SimpleQueue()
        for index in range(len(self.prompts)):
            todo.put(index)
        for _ in range(min(count, len(self.prompts))):
            self._spawn(lambda: self._work(todo, cancel))

    def start_scheduled(self, count: int, cancel: threading.Event) -> None:
        self.schedule.start(time.perf_counter())
        for _ in range(min(count, len(self.prompts))):
            self._spawn(lambda: self._work_when_due(cancel))

    def _spawn(self, target: Callable[[], None]) -> None:
        def run() -> None:
            try:
                target()
            finally:
                self.queue.put(None)

        self.threads += 1
        threading.Thread(target=run, name="lmdeploy-feed", daemon=True).start()

    def _feed_batch(self) -> None:
        indices = list(range(len(self.prompts)))
        now = time.perf_counter()
        for index in indices:  # nothing about admission is observable: every request is submitted now
            self.queue.put(EngineEvent(index, "admit", now))
        self._send(indices)

    def _work(self, todo: queue.SimpleQueue, cancel: threading.Event) -> None:
        while not cancel.is_set():
            try:
                index = todo.get_nowait()
            except queue.Empty:
                return
            self.queue.put(EngineEvent(index, "admit", time.perf_counter()))
            self._send([index])

    def _work_when_due(self, cancel: threading.Event) -> None:
        """A worker of a schedule: the next request due, sent once it is, until none is left to send."""
        while not cancel.is_set():
            with self.due:
                index = self.schedule.next_due(time.perf_counter())
                if index is None:
                    if not self.schedule.pending():
                        return
                    self.due.wait(min(POLL_S, self.schedule.wait_s(time.perf_counter())))
                    continue
                outgoing = self.schedule.take(index)
            input_len = 0
            if outgoing.built:
                self.prompts[index] = outgoing.prompt
                input_len = len(self.encode(outgoing.prompt)) if self.encode is not None else 0
            self.queue.put(EngineEvent(index, "admit", time.perf_counter(), input_len=input_len))
            self._send([index])

    def _send(self, indices: list[int]) -> None:
        """Run these requests through the pipeline; Response.index is the position within this call."""
        prompts = [self.prompts[i] for i in indices]
        gen_configs = [self.gen_configs[i] for i in indices]
        sessions = [self.sessions[i] for i in indices]
        open_ = set(indices)
        message = "LMDeploy ended the request without a finish reason"
        templated = any(isinstance(prompt, list) for prompt in prompts)  # messages with images: the chat template
        try:
            if self.stream_output:
                outputs = self.pipe.stream_infer(
                    prompts, sessions=sessions, gen_config=gen_configs, do_preprocess=templated
                )
                for out in outputs:
                    self._emit(indices[out.index], out, open_)
            else:
                for out in self.pipe(prompts, gen_configs, do_preprocess=templated, sessions=sessions):
                    self._emit(indices[out.index], out, open_)
        except Exception as exc:  # the pipeline reports request errors as responses; this is anything else
            message = f"{type(exc).__name__}: {last_line(exc)}"
        now = time.perf_counter()
        for index in sorted(open_):
            self._finish(EngineEvent(index, "finish", now, finish_reason="error", message=message))

    def _emit(self, index: int, out, open_: set[int]) -> None:
        now = time.perf_counter()
        self.queue.put(EngineEvent(index, "tokens", now, n_tokens=out.generate_token_len))
        ids, pieces = self.answers.setdefault(index, ([], []))
        ids.extend(out.token_ids)
        if out.text:
            pieces.append(out.text)
        if getattr(out, "cached_tokens", None) is not None:
            self.cached[index] = max(self.cached.get(index, 0), int(out.cached_tokens))
        if out.finish_reason is not None:
            message = out.error_message or ""
            extra = {"cached_tokens": float(self.cached[index])} if index in self.cached else None
            self._finish(
                EngineEvent(
                    index,
                    "finish",
                    now,
                    out.generate_token_len,
                    finish_reason=out.finish_reason,
                    message=message,
                    extra=extra,
                )
            )
            open_.discard(index)

    def _finish(self, finish: EngineEvent) -> None:
        """Queue a request's finish and what it makes of the schedule (the turns it will never get to)."""
        ids, pieces = self.answers.pop(finish.index, ([], []))
        text = "".join(pieces)
        finish.token_ids, finish.text = ids, text or None  # no text (detokenizing skipped): the runner decodes the ids
        answer = text if self.schedule.wants_answer(finish.index) else None
        with self.due:
            events = finish_in_schedule(self.schedule, finish, answer)
            self.due.notify_all()
        for event in events:
            self.queue.put(event)

    # -- reading (the caller's thread) --

    def events(self, cancel: threading.Event) -> Iterator[EngineEvent]:
        return pump_events(self.queue, self.threads, cancel, lambda: stop_all_sessions(self.pipe), "LMDeploy")
