"""Runs one batch of requests through transformers' continuous-batching manager and reports events.

A manager is created per run with a KV cache sized for that run (see `cache_blocks_for`), and at
most `max_in_flight` requests are handed to it at a time, each once it is due (load.schedule: at its trace
time, or after the turn it follows); the next one goes in when one finishes, as LMDeploy's `max_batch_size`
behaves. Per-token times are the engine's own `perf_counter` stamps.

With `enable_prefix_caching` the manager shares the KV cache blocks of equal prompt prefixes (transformers'
`allow_block_sharing`: whole blocks only, and finished requests' blocks stay cached until memory runs short), so
a prompt that opens like an earlier one skips prefilling those blocks. The prompt tokens each request found
cached are read where transformers matches them (`PrefixHits`); off, a request finds none.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..config import EngineConfig, GenerationSettings
from ..load.datasets import SampledRequest
from ..load.schedule import SendSchedule
from ..models.resolve import last_line
from .base import EngineEvent, finish_in_schedule
from .engine_api import InstanceOutput

# The KV cache on CPU shares RAM with everything else, so a cache sized for the batch is capped at this.
CPU_CACHE_BUDGET_BYTES = 2 * 1024**3
# On a GPU the cap is this share of the free memory, leaving room for activations and logits.
GPU_CACHE_FRACTION = 0.5
# How often the loop wakes up to look at `cancel` while it waits for the engine.
POLL_S = 0.05
# How long a finished or cancelled run waits for the manager's thread to end.
STOP_TIMEOUT_S = 5.0
# How long a new manager may take to set up its cache before requests go in without cache-hit counts.
SETUP_TIMEOUT_S = 30.0


def _not_an_early_stop(record: logging.LogRecord) -> bool:
    # transformers warns when a manager stops before its thread built the batch processor, as a run cancelled
    # (Ctrl-C) in its first instant does: an ordinary end here, and the CLI's promise is one line on stderr.
    return "Batch processor was not initialized" not in record.getMessage()


logging.getLogger("ContinuousBatchingLogger").addFilter(_not_an_early_stop)


@dataclass
class _InFlight:
    """A request handed to the manager and not finished yet."""

    index: int
    output_len: int
    n_tokens: int = 0
    last_ts: float = 0.0


def kv_block_bytes(model, page_size: int) -> int:
    """Bytes of one cache block: keys and values of `page_size` tokens in every layer."""
    text = model.config.get_text_config()
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    return 2 * text.num_hidden_layers * kv_heads * head_dim * page_size * model.dtype.itemsize


def cache_blocks_for(
    engine: EngineConfig, model, input_lens: Sequence[int], requests: Sequence[SampledRequest], max_in_flight: int
) -> int:
    """KV cache blocks for this run: the configured number, else enough for `max_in_flight` of the longest
    request (its prompt's `input_lens` and its output), capped by what the device can spare but never below one
    longest request.

    transformers would otherwise take most of the memory it sees: gigabytes of host RAM on CPU, 90% of
    a GPU, and a fresh manager (one per run) would allocate all of it again each time.
    """
    if engine.num_blocks is not None:
        return engine.num_blocks
    page = engine.cache_block_seq_len
    longest = max((n_ids + r.output_len for n_ids, r in zip(input_lens, requests)), default=1)
    per_request = math.ceil(longest / page) + 1  # +1: a request's last token may open a new block
    wanted = per_request * max(1, min(max_in_flight, len(requests)))
    affordable = _cache_budget_bytes(model.device) // kv_block_bytes(model, page)
    return max(per_request, min(wanted, affordable))


def _cache_budget_bytes(device) -> int:
    if device.type != "cuda":
        return CPU_CACHE_BUDGET_BYTES
    import torch

    free, _total = torch.cuda.mem_get_info(device)
    return int(free * GPU_CACHE_FRACTION)


class PrefixHits:
    """The prompt tokens transformers' cache served each request, by request id: read from its prefix search
    (`PagedAttentionCache.search_prefix_match`, wrapped on the manager's cache once its thread has made it).
    That is private API, probed: where it is missing the hits are not known (`known` is False) and no count is
    reported, never a made-up 0."""

    def __init__(self, manager, sharing: bool) -> None:
        self.by_request: dict[str, int] = {}
        self.known = not sharing  # without sharing nothing is ever served from the cache
        if sharing:
            self.known = self._watch(manager)

    def _watch(self, manager) -> bool:
        deadline = time.perf_counter() + SETUP_TIMEOUT_S
        while getattr(manager, "batch_processor", None) is None:
            if not manager.is_running() or time.perf_counter() > deadline:
                return False
            time.sleep(0.005)
        cache = getattr(manager.batch_processor, "cache", None)
        search = getattr(cache, "search_prefix_match", None)
        if cache is None or search is None:
            return False

        def counted(request_id: str, prompt_ids: list[int]) -> int:
            found = search(request_id, prompt_ids)
            self.by_request[request_id] = found
            return found

        cache.search_prefix_match = counted
        return True

    def extra(self, request_id: str) -> dict | None:
        return {"cached_tokens": float(self.by_request.get(request_id, 0))} if self.known else None


class _ManagedBatch:
    """A run's continuous-batching manager: its generation and cache configs, sized for the run's requests."""

    def __init__(
        self,
        model,
        engine: EngineConfig,
        eos_ids: set[int],
        requests: Sequence[SampledRequest],
        input_lens: Sequence[int],
        generation: GenerationSettings,
        max_in_flight: int,
        stream_output: bool,
    ) -> None:
        self._model = model
        self._engine = engine
        self._eos_ids = eos_ids
        self._requests = requests
        self._generation = generation
        self._max_in_flight = max(1, max_in_flight)
        self._stream_output = stream_output
        self.num_blocks = cache_blocks_for(engine, model, input_lens, requests, self._max_in_flight)

    def _start_manager(self):
        manager = self._model.init_continuous_batching(
            generation_config=self._generation_config(), continuous_batching_config=self._cache_config()
        )
        manager.start()
        return manager

    def _refusal(self, ids: Sequence[int] | None, output_len: int) -> str | None:
        """Why the manager must not be given this request: transformers would stop its whole loop on a request the
        cache cannot hold, failing every request."""
        if not ids:
            return "The prompt encodes to no tokens."
        needed = math.ceil((len(ids) + output_len) / self._engine.cache_block_seq_len)
        if needed > self.num_blocks:
            return (
                f"The request needs {needed} KV cache blocks but the cache has {self.num_blocks}; "
                "raise num_blocks or leave it empty."
            )
        return None

    def _eos(self) -> int | list[int]:
        return -1 if self._generation.ignore_eos else sorted(self._eos_ids) or -1

    @staticmethod
    def _death(manager) -> str:
        fatal = manager.background_thread_status.fatal_error
        return f"The generation loop stopped: {last_line(fatal) if fatal else 'no reason given'}"

    def _generation_config(self):
        from transformers import GenerationConfig

        return GenerationConfig(
            max_new_tokens=max((r.output_len for r in self._requests), default=1),
            eos_token_id=self._eos(),
            **sampling_kwargs(self._generation),
        )

    def _cache_config(self):
        from transformers import ContinuousBatchingConfig

        return ContinuousBatchingConfig(
            page_size=self._engine.cache_block_seq_len,
            num_blocks=self.num_blocks,
            max_batch_tokens=self._engine.max_batch_tokens,
            max_requests_per_batch=self._max_in_flight,
            # Off by default, as LMDeploy's prefix caching is, so the engines stay comparable.
            allow_block_sharing=self._engine.enable_prefix_caching,
        )


class ContinuousBatchRun(_ManagedBatch):
    """One `Engine.stream()` call on the continuous-batching path. `prompts` are the requests' token ids (None
    where a prompt is built only when sent: `encode` makes them then); `decode` turns an answer into the text a
    later turn repeats."""

    def __init__(
        self,
        model,
        engine: EngineConfig,
        eos_ids: set[int],
        requests: Sequence[SampledRequest],
        prompts: Sequence[list[int] | None],
        generation: GenerationSettings,
        max_in_flight: int,
        stream_output: bool,
        schedule: SendSchedule | None = None,
        encode: Callable[[str], list[int]] | None = None,
        decode: Callable[[Sequence[int]], str] | None = None,
    ) -> None:
        input_lens = [request.input_len if ids is None else len(ids) for ids, request in zip(prompts, requests)]
        super().__init__(model, engine, eos_ids, requests, input_lens, generation, max_in_flight, stream_output)
        self._prompts = prompts
        self._schedule = schedule or SendSchedule(requests)
        self._encode, self._decode = encode, decode

    def events(self, cancel: threading.Event) -> Iterator[EngineEvent]:
        manager = self._start_manager()
        try:
            hits = PrefixHits(manager, self._engine.enable_prefix_caching)
            yield from self._drive(manager, hits, cancel)
        finally:
            manager.stop(block=True, timeout=STOP_TIMEOUT_S, hard_stop=True)

    def _drive(self, manager, hits: PrefixHits, cancel: threading.Event) -> Iterator[EngineEvent]:
        schedule = self._schedule
        schedule.start(time.perf_counter())
        in_flight: dict[str, _InFlight] = {}
        while schedule.pending() or in_flight:
            if not manager.is_running():
                # Its thread died: deliver what it reported before dying, then fail everything left.
                while (output := manager.get_result(timeout=0)) is not None:
                    if output.request_id in in_flight:
                        yield from self._on_output(output, in_flight, hits)
                yield from self._fail_all(manager, in_flight)
                return
            now = time.perf_counter()
            while len(in_flight) < self._max_in_flight and (index := schedule.next_due(now)) is not None:
                yield from self._submit(manager, index, in_flight)
            if cancel.is_set():
                for request_id, request in in_flight.items():
                    manager.cancel_request(request_id)
                    yield EngineEvent(request.index, "finish", time.perf_counter(), request.n_tokens, "abort")
                return
            if not in_flight and schedule.wait_s(now) == math.inf:
                return  # what is left waits on requests that will never end: none, as the schedule drops those
            room = len(in_flight) < self._max_in_flight
            output = manager.get_result(timeout=min(POLL_S, schedule.wait_s(now)) if room else POLL_S)
            if output is not None and output.request_id in in_flight:
                yield from self._on_output(output, in_flight, hits)

    def _submit(self, manager, index: int, in_flight: dict[str, _InFlight]) -> Iterator[EngineEvent]:
        outgoing = self._schedule.take(index, time.perf_counter())
        built = None
        if outgoing.built:
            assert self._encode is not None, "a prompt built when sent comes with `encode`"
            built = self._encode(outgoing.prompt)
        ids = self._prompts[index] if built is None else built
        output_len = self._requests[index].output_len
        yield EngineEvent(index, "admit", time.perf_counter(), input_len=0 if built is None else len(built))
        if problem := self._refusal(ids, output_len):
            yield from self._ended(index, "error", problem)
            return
        request_id = f"r{index}"
        in_flight[request_id] = _InFlight(index, output_len)
        manager.add_request(
            ids,
            request_id=request_id,
            max_new_tokens=output_len,
            streaming=self._stream_output,
            record_timestamps=True,
            eos_token_id=self._eos(),
        )

    def _ended(
        self,
        index: int,
        reason: str,
        message: str,
        ts: float | None = None,
        n_tokens: int = 0,
        token_ids: Sequence[int] = (),
        extra: dict | None = None,
    ) -> list[EngineEvent]:
        ts = time.perf_counter() if ts is None else ts
        answer = self._decode(token_ids) if self._decode and self._schedule.wants_answer(index) else None
        finish = EngineEvent(index, "finish", ts, n_tokens, reason, message, token_ids=token_ids, extra=extra)
        return finish_in_schedule(self._schedule, finish, answer)

    def _on_output(self, output, in_flight: dict[str, _InFlight], hits: PrefixHits) -> Iterator[EngineEvent]:
        request = in_flight[output.request_id]
        count = len(output.generated_tokens)
        stamps = output.timestamps or []
        if self._stream_output or output.is_finished():
            first_new = request.n_tokens + 1 if self._stream_output else count
            for n in range(max(first_new, 1), count + 1):
                ts = max(stamps[n - 1] if n <= len(stamps) else time.perf_counter(), request.last_ts)
                request.n_tokens, request.last_ts = n, ts
                yield EngineEvent(request.index, "tokens", ts, n)
        if not output.is_finished():
            return
        del in_flight[output.request_id]
        # The engine stamps the end (perf_counter) when the request reaches a terminal state; a request that
        # failed before it started has no stamp.
        end = max(output.lifespan[1] if output.lifespan[1] > 0 else time.perf_counter(), request.last_ts)
        if output.error is not None:
            yield from self._ended(request.index, "error", last_line(output.error), end, count)
        else:
            reason = "length" if count >= request.output_len else "stop"
            yield from self._ended(
                request.index, reason, "", end, count, output.generated_tokens, hits.extra(output.request_id)
            )

    def _fail_all(self, manager, in_flight: dict[str, _InFlight]) -> Iterator[EngineEvent]:
        """The manager's thread died: every request left ends with its error, those not sent yet included."""
        message = self._death(manager)
        now = time.perf_counter()
        for request in in_flight.values():
            yield EngineEvent(request.index, "finish", now, request.n_tokens, "error", message)
        for index in self._schedule.untaken():
            yield EngineEvent(index, "finish", now, 0, "error", message)


class ContinuousBatchingInstances(_ManagedBatch):
    """transformers' continuous-batching manager behind LMDeploy's engine instance API, for the engine_api drive
    (engine_api.py): one manager for the run serves every worker, and each request's outputs are delivered to the
    event loop that sent it (`register_result_handler`), where `async_stream_infer` yields the new ids. The drive
    bounds what is in flight to its worker count; `start()` and `stop()` bracket the run."""

    def __init__(
        self,
        model,
        engine: EngineConfig,
        eos_ids: set[int],
        requests: Sequence[SampledRequest],
        generation: GenerationSettings,
        max_in_flight: int,
        stream_output: bool,
    ) -> None:
        # Sized before the prompts are encoded (that is measured): a prompt re-encoded from the random dataset's
        # text may come out a little longer than its target, so a block is kept for it.
        lens = [
            len(r.input_ids) if r.input_ids is not None else r.input_len + engine.cache_block_seq_len for r in requests
        ]
        super().__init__(model, engine, eos_ids, requests, lens, generation, max_in_flight, stream_output)
        self._manager: Any = None  # transformers' ContinuousBatchingManager, once started

    def start(self) -> None:
        self._manager = self._start_manager()

    def stop(self) -> None:
        if self._manager is not None:
            self._manager.stop(block=True, timeout=STOP_TIMEOUT_S, hard_stop=True)

    def create_instance(self) -> ContinuousBatchingInstances:
        return self  # session ids keep the streams apart: every worker's are its own

    async def async_stream_infer(
        self, session_id: int, input_ids: list[int], gen_config: int, stream_output: bool
    ) -> AsyncIterator[InstanceOutput]:
        """Stream one request of `gen_config` (its output length) new tokens: InstanceOutputs of the new ids, the
        last one saying how it ended. Closed before its end, the request is cancelled in the manager."""
        manager = self._manager
        if problem := self._refusal(input_ids, gen_config):
            yield InstanceOutput([], "error", problem)
            return
        results: asyncio.Queue = asyncio.Queue()
        request_id = f"s{session_id}"
        manager.register_result_handler(request_id, results.put_nowait)
        manager.add_request(
            list(input_ids),
            request_id=request_id,
            max_new_tokens=gen_config,
            streaming=stream_output,
            eos_token_id=self._eos(),
        )
        sent, finished = 0, False
        try:
            while not finished:
                try:
                    output = await asyncio.wait_for(results.get(), POLL_S)
                except TimeoutError:
                    if not manager.is_running():
                        finished = True
                        yield InstanceOutput([], "error", self._death(manager))
                    continue
                tokens = output.generated_tokens
                new, sent, finished = list(tokens[sent:]), len(tokens), output.is_finished()
                if not finished:
                    yield InstanceOutput(new)
                elif output.error is not None:
                    yield InstanceOutput(new, "error", last_line(output.error))
                else:
                    yield InstanceOutput(new, "finish")
        finally:
            if not finished:
                manager.cancel_request(request_id)


def sampling_kwargs(generation: GenerationSettings) -> dict:
    """GenerationConfig arguments for greedy decoding, or sampling with the run's settings."""
    if not generation.do_sample:
        return {"do_sample": False}
    return {
        "do_sample": True,
        "temperature": generation.temperature,
        "top_p": generation.top_p,
        "top_k": generation.top_k,
    }
