"""profile_throughput.py's way of driving an engine, through its instance API: the engine_api load pattern.

LMDeploy's engines offer it themselves (`create_instance()`, then `async_stream_infer` per request); the embedded
engine offers the same two calls over transformers' continuous batching (transformers_batching). Workers are
coroutines on one event loop, in a thread of their own (uvloop's loop with `use_uvloop`), min(concurrency,
requests) of them; each creates its own instance and takes the next request when its last is done, its session
ids starting at its number and stepping by the worker count. Per request, as their script's `_inference`:

- "admit" when a worker picks it up: the request's clock starts there (the runner ticks 0), before tokenizing;
- token ids go in: the request's own `input_ids` where they were encoded before the clock (skip tokenize), else
  they are encoded now, inside the measurement;
- each output carries the new ids (a delta): the count grows by them, they are detokenized incrementally (unless
  skip detokenize) and a "tokens" event is stamped on receipt, one per output as their script ticks;
- past its `cancel_after` tokens (the cancel rate) the worker stops reading and closes the stream, which cancels
  it in the engine; with fewer tokens than asked it ends CANCELLED_BY_LOAD: cancelled, not failed;
- otherwise it ends when the stream does: "length" or "stop" by its tokens, or the engine's error in its words
  (their script records every request as a success and leaves errors to show as short outputs).

Speculative decoding's accounting, where an engine reports it per output (LMDeploy's PyTorch engine with
enable_metrics: `req_metrics.spec_info`), is summed per request into the finish event's extras. A cancel (or a
reader that stops early) cancels every worker: the request each was reading ends "abort", its stream closed.
"""

from __future__ import annotations

import asyncio
import collections
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..config import LoadConfig
from ..load.datasets import SampledRequest
from ..models.resolve import last_line
from .base import CANCELLED_BY_LOAD, EngineEvent
from .event_pump import pump_events

# Per-request columns of speculative decoding's accounting (LMDeploy's SpeculativeDecodingStats, summed per request):
# steps that drafted, tokens drafted, drafted tokens accepted.
SPEC_COLUMNS = ("spec_drafts", "spec_draft_tokens", "spec_accepted_tokens")
ENGINE_POSITION_COLUMN = "spec_accepted_by_position"  # a request's accepted draft tokens per draft position (JSON)
DONE = "done"  # an outcome: the engine ended the request itself (length or stop, told by its tokens)
# Tokens of the prompt decoded again with each new output, so that a word split across tokens reads whole.
DETOKENIZE_CONTEXT = 5


@dataclass(frozen=True)
class InstanceAPI:
    """What the drive needs of an engine: `engine.create_instance()`; `encode(prompt)` as it tokenizes inside the
    measurement; `detokenizer(prompt_ids)`, a function of each output's new ids; the `gen_config` each request is
    sent with; `outcome(output)`: (DONE, "") or (reason, message) on the output that ends a stream, None on the
    others; and the engine's name, for messages."""

    engine: Any
    encode: Callable[[str], list[int]]
    detokenizer: Callable[[list[int]], Callable[[Sequence[int]], str]]
    gen_config: Callable[[SampledRequest], Any]
    outcome: Callable[[Any], tuple[str, str] | None]
    name: str


@dataclass(slots=True)
class InstanceOutput:
    """One output of an instance stream in LMDeploy's shape (EngineOutput): the new ids, and on the last one how the
    request ended ("finish" or "error", with a message)."""

    token_ids: list[int]
    status: str = ""
    message: str = ""
    req_metrics: Any = None


def instance_outcome(output: InstanceOutput) -> tuple[str, str] | None:
    """The end an InstanceOutput tells (see InstanceAPI.outcome)."""
    if not output.status:
        return None
    return (DONE, "") if output.status == "finish" else ("error", output.message)


class IncrementalText:
    """A Hugging Face tokenizer's text of a growing id sequence, a piece per new ids: the last few tokens already
    shown are decoded again with the new ones, so a word or a character split across tokens comes out whole, and a
    piece ending in a partial character waits for the rest."""

    def __init__(self, tokenizer, prompt_ids: Sequence[int]):
        self._tokenizer = tokenizer
        self._ids = list(prompt_ids)
        self._shown = len(self._ids)  # ids whose text is out
        self._context = max(self._shown - DETOKENIZE_CONTEXT, 0)

    def __call__(self, new_ids: Sequence[int]) -> str:
        self._ids.extend(new_ids)
        decode = self._tokenizer.decode
        before = decode(self._ids[self._context : self._shown], skip_special_tokens=True)
        after = decode(self._ids[self._context :], skip_special_tokens=True)
        if after.endswith("\ufffd"):
            return ""
        self._context, self._shown = self._shown, len(self._ids)
        return after[len(before) :]


@dataclass
class _SpecCount:
    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0

    def add(self, output) -> None:
        info = getattr(getattr(output, "req_metrics", None), "spec_info", None)
        if info:
            self.drafts += 1
            self.draft_tokens += int(info["num_draft_tokens"])
            self.accepted_tokens += int(info["num_accepted_tokens"])

    def extra(self) -> dict[str, int] | None:
        return dict(zip(SPEC_COLUMNS, (self.drafts, self.draft_tokens, self.accepted_tokens))) if self.drafts else None


@dataclass
class EngineAPIDrive:
    """One `Engine.stream()` call on the engine API (see the module's docstring)."""

    api: InstanceAPI
    requests: Sequence[SampledRequest]
    load: LoadConfig
    events_queue: queue.Queue = field(default_factory=queue.Queue)
    _stopped: threading.Event = field(default_factory=threading.Event)
    _loop: asyncio.AbstractEventLoop | None = None
    _tasks: list = field(default_factory=list)

    def events(self, cancel: threading.Event) -> Iterator[EngineEvent]:
        threading.Thread(target=self._run, name="engine-api-workers", daemon=True).start()
        return pump_events(self.events_queue, 1, cancel, self._stop, self.api.name)

    # -- the workers' thread --

    def _run(self) -> None:
        try:
            with asyncio.Runner(loop_factory=_uvloop_factory() if self.load.use_uvloop else None) as runner:
                runner.run(self._main())
        finally:
            self.events_queue.put(None)

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        todo = collections.deque(range(len(self.requests)))
        workers = min(self.load.concurrency, len(self.requests))
        self._tasks = [asyncio.ensure_future(self._worker(number, workers, todo)) for number in range(workers)]
        if self._stopped.is_set():  # stopped before the loop could hear it
            self._cancel_tasks()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _worker(self, number: int, workers: int, todo: collections.deque) -> None:
        instance = self.api.engine.create_instance()
        session_id = number
        while todo and not self._stopped.is_set():
            await self._request(instance, session_id, todo.popleft())
            session_id += workers

    async def _request(self, instance, session_id: int, index: int) -> None:
        request, put = self.requests[index], self.events_queue.put
        put(EngineEvent(index, "admit", time.perf_counter()))
        n_tokens, ended, spec = 0, None, _SpecCount()
        answer: list[int] = []  # its ids, handed over on the finish (the runner keeps them where the run asks)
        try:
            ids = list(request.input_ids) if request.input_ids is not None else self.api.encode(request.prompt)
            text = None if self.load.skip_detokenize else self.api.detokenizer(ids)
            stream = instance.async_stream_infer(
                session_id,
                input_ids=ids,
                gen_config=self.api.gen_config(request),
                stream_output=self.load.stream_output,
            )
            try:
                async for output in stream:
                    n_tokens += len(output.token_ids)
                    answer.extend(output.token_ids)
                    if text is not None:
                        text(output.token_ids)
                    spec.add(output)
                    put(EngineEvent(index, "tokens", time.perf_counter(), n_tokens))
                    if request.cancel_after is not None and n_tokens > request.cancel_after:
                        if n_tokens < request.output_len:
                            ended = (
                                CANCELLED_BY_LOAD,
                                f"cancelled after {n_tokens} of {request.output_len} tokens (cancel rate)",
                            )
                        break
                    ended = self.api.outcome(output) or ended
            finally:
                await stream.aclose()
        except asyncio.CancelledError:
            put(EngineEvent(index, "finish", time.perf_counter(), n_tokens, "abort", extra=spec.extra()))
            raise
        except Exception as exc:  # the engine's or its tokenizer's error: this request's, not the run's
            ended = ("error", f"{type(exc).__name__}: {last_line(exc)}")
        reason, message = ended if ended is not None and ended[0] != DONE else ("", "")
        reason = reason or ("length" if n_tokens >= request.output_len else "stop")
        put(
            EngineEvent(
                index, "finish", time.perf_counter(), n_tokens, reason, message, token_ids=answer, extra=spec.extra()
            )
        )

    # -- any thread --

    def _stop(self) -> None:
        self._stopped.set()
        loop = self._loop
        if loop is not None:
            try:
                loop.call_soon_threadsafe(self._cancel_tasks)
            except RuntimeError:  # the loop has closed: every worker is done
                pass

    def _cancel_tasks(self) -> None:
        for task in self._tasks:
            task.cancel()


def _uvloop_factory():
    import uvloop

    return uvloop.new_event_loop


def uvloop_problem(load: LoadConfig) -> str | None:
    """Why `use_uvloop` cannot be honoured here (uvloop not installed); None when it can or is not asked for."""
    import importlib.util

    if load.use_uvloop and importlib.util.find_spec("uvloop") is None:
        return "--use-uvloop needs the uvloop package, which is not installed here: pip install uvloop."
    return None
