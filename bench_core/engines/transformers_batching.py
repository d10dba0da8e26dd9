"""Runs one batch of requests through transformers' continuous-batching manager and reports events.

A manager is created per run with a KV cache sized for that run (see `cache_blocks_for`), and at
most `max_in_flight` requests are handed to it at a time; the next one goes in when one finishes,
as LMDeploy's `max_batch_size` behaves.
Per-token times are the engine's own `perf_counter` stamps.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass

from ..config import EngineConfig, GenerationSettings
from ..load.datasets import SampledRequest
from ..models.resolve import last_line
from .base import EngineEvent
from .engine_api import InstanceOutput

# The KV cache on CPU shares RAM with everything else, so a cache sized for the batch is capped at this.
CPU_CACHE_BUDGET_BYTES = 2 * 1024**3
# On a GPU the cap is this share of the free memory, leaving room for activations and logits.
GPU_CACHE_FRACTION = 0.5
# How often the loop wakes up to look at `cancel` while it waits for the engine.
POLL_S = 0.05
# How long a finished or cancelled run waits for the manager's thread to end.
STOP_TIMEOUT_S = 5.0


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

    def _refusal(self, ids: Sequence[int], output_len: int) -> str | None:
        """Why the manager must not be given this request: transformers would stop its whole loop on a request the
        cache cannot hold, failing every request."""
        if not ids:
            return "The prompt encodes to no tokens."
        needed = math.ceil((len(ids) + output_len) / self._engine.cache_block_seq_len)
        if needed > self.num_blocks:
            return (f"The request needs {needed} KV cache blocks but the cache has {self.num_blocks}; "
                    "raise num_blocks or leave it empty.")
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
            # LMDeploy's prefix caching is off by default; keep the embedded engine comparable.
            allow_block_sharing=False,
        )


class ContinuousBatchRun(_ManagedBatch):
    """One `Engine.stream()` call on the continuous-batching path: requests handed in as slots free."""

    def __init__(self, model, engine: EngineConfig, eos_ids: set[int], requests: Sequence[SampledRequest],
                 prompts: Sequence[list[int]], generation: GenerationSettings, max_in_flight: int,
                 stream_output: bool) -> None:
        super().__init__(model, engine, eos_ids, requests, [len(ids) for ids in prompts], generation, max_in_flight,
                         stream_output)
        self._prompts = prompts

    def events(self, cancel: threading.Event) -> Iterator[EngineEvent]:
        manager = self._start_manager()
        try:
            yield from self._drive(manager, cancel)
        finally:
            manager.stop(block=True, timeout=STOP_TIMEOUT_S, hard_stop=True)

    def _drive(self, manager, cancel: threading.Event) -> Iterator[EngineEvent]:
        in_flight: dict[str, _InFlight] = {}
        next_index = 0
        while next_index < len(self._requests) or in_flight:
            if not manager.is_running():
                # Its thread died: deliver what it reported before dying, then fail everything left.
                while (output := manager.get_result(timeout=0)) is not None:
                    if output.request_id in in_flight:
                        yield from self._on_output(output, in_flight)
                yield from self._fail_all(manager, in_flight, range(next_index, len(self._requests)))
                return
            while len(in_flight) < self._max_in_flight and next_index < len(self._requests):
                yield from self._submit(manager, next_index, in_flight)
                next_index += 1
            if cancel.is_set():
                for request_id, request in in_flight.items():
                    manager.cancel_request(request_id)
                    yield EngineEvent(request.index, "finish", time.perf_counter(), request.n_tokens, "abort")
                return
            output = manager.get_result(timeout=POLL_S)
            if output is not None and output.request_id in in_flight:
                yield from self._on_output(output, in_flight)

    def _submit(self, manager, index: int, in_flight: dict[str, _InFlight]) -> Iterator[EngineEvent]:
        ids = self._prompts[index]
        output_len = self._requests[index].output_len
        yield EngineEvent(index, "admit", time.perf_counter())
        if problem := self._refusal(ids, output_len):
            yield EngineEvent(index, "finish", time.perf_counter(), 0, "error", problem)
            return
        request_id = f"r{index}"
        in_flight[request_id] = _InFlight(index, output_len)
        manager.add_request(ids, request_id=request_id, max_new_tokens=output_len, streaming=self._stream_output,
                            record_timestamps=True, eos_token_id=self._eos())

    def _on_output(self, output, in_flight: dict[str, _InFlight]) -> Iterator[EngineEvent]:
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
            yield EngineEvent(request.index, "finish", end, count, "error", last_line(output.error))
        else:
            reason = "length" if count >= request.output_len else "stop"
            yield EngineEvent(request.index, "finish", end, count, reason, token_ids=output.generated_tokens)

    def _fail_all(self, manager, in_flight: dict[str, _InFlight], not_admitted: range) -> Iterator[EngineEvent]:
        """The manager's thread died: every request left ends with its error, never-admitted ones included."""
        message = self._death(manager)
        for request in in_flight.values():
            yield EngineEvent(request.index, "finish", time.perf_counter(), request.n_tokens, "error", message)
        for index in not_admitted:
            yield EngineEvent(index, "finish", time.perf_counter(), 0, "error", message)


class ContinuousBatchingInstances(_ManagedBatch):
    """transformers' continuous-batching manager behind LMDeploy's engine instance API, for the engine_api drive
    (engine_api.py): one manager for the run serves every worker, and each request's outputs are delivered to the
    event loop that sent it (`register_result_handler`), where `async_stream_infer` yields the new ids. The drive
    bounds what is in flight to its worker count; `start()` and `stop()` bracket the run."""

    def __init__(self, model, engine: EngineConfig, eos_ids: set[int], requests: Sequence[SampledRequest],
                 generation: GenerationSettings, max_in_flight: int, stream_output: bool) -> None:
        # Sized before the prompts are encoded (that is measured): a prompt re-encoded from the random dataset's
        # text may come out a little longer than its target, so a block is kept for it.
        lens = [len(r.input_ids) if r.input_ids is not None else r.input_len + engine.cache_block_seq_len
                for r in requests]
        super().__init__(model, engine, eos_ids, requests, lens, generation, max_in_flight, stream_output)
        self._manager = None

    def start(self) -> None:
        self._manager = self._start_manager()

    def stop(self) -> None:
        if self._manager is not None:
            self._manager.stop(block=True, timeout=STOP_TIMEOUT_S, hard_stop=True)

    def create_instance(self) -> ContinuousBatchingInstances:
        return self  # session ids keep the streams apart: every worker's are its own

    async def async_stream_infer(self, session_id: int, input_ids: list[int], gen_config: int,
                                 stream_output: bool) -> AsyncIterator[InstanceOutput]:
        """Stream one request of `gen_config` (its output length) new tokens: InstanceOutputs of the new ids, the
        last one saying how it ended. Closed before its end, the request is cancelled in the manager."""
        manager = self._manager
        if problem := self._refusal(input_ids, gen_config):
            yield InstanceOutput([], "error", problem)
            return
        results: asyncio.Queue = asyncio.Queue()
        request_id = f"s{session_id}"
        manager.register_result_handler(request_id, results.put_nowait)
        manager.add_request(list(input_ids), request_id=request_id, max_new_tokens=gen_config,
                            streaming=stream_output, eos_token_id=self._eos())
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
