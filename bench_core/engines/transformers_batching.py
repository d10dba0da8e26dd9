"""Runs one batch of requests through transformers' continuous-batching manager and reports events.

A manager is created per run with a KV cache sized for that run (see `cache_blocks_for`), and at
most `max_in_flight` requests are handed to it at a time; the next one goes in when one finishes,
as LMDeploy's `max_batch_size` behaves.
Per-token times are the engine's own `perf_counter` stamps.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from ..config import EngineConfig, GenerationSettings
from ..load.datasets import SampledRequest
from ..models.resolve import last_line
from .base import EngineEvent

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
    engine: EngineConfig, model, prompts: Sequence[list[int]], requests: Sequence[SampledRequest], max_in_flight: int
) -> int:
    """KV cache blocks for this run: the configured number, else enough for `max_in_flight` of the longest
    request, capped by what the device can spare but never below one longest request.

    transformers would otherwise take most of the memory it sees: gigabytes of host RAM on CPU, 90% of
    a GPU, and a fresh manager (one per run) would allocate all of it again each time.
    """
    if engine.num_blocks is not None:
        return engine.num_blocks
    page = engine.cache_block_seq_len
    longest = max((len(ids) + r.output_len for ids, r in zip(prompts, requests)), default=1)
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


class ContinuousBatchRun:
    """One `Engine.stream()` call on the continuous-batching path."""

    def __init__(
        self,
        model,
        engine: EngineConfig,
        eos_ids: set[int],
        requests: Sequence[SampledRequest],
        prompts: Sequence[list[int]],
        generation: GenerationSettings,
        max_in_flight: int,
        stream_output: bool,
    ) -> None:
        self._model = model
        self._engine = engine
        self._eos_ids = eos_ids
        self._requests = requests
        self._prompts = prompts
        self._generation = generation
        self._max_in_flight = max(1, max_in_flight)
        self._stream_output = stream_output
        self.num_blocks = cache_blocks_for(engine, model, prompts, requests, self._max_in_flight)

    def events(self, cancel: threading.Event) -> Iterator[EngineEvent]:
        manager = self._model.init_continuous_batching(
            generation_config=self._generation_config(), continuous_batching_config=self._cache_config()
        )
        manager.start()
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
        if not ids:
            yield EngineEvent(index, "finish", time.perf_counter(), 0, "error", "The prompt encodes to no tokens.")
            return
        needed = math.ceil((len(ids) + output_len) / self._engine.cache_block_seq_len)
        if needed > self.num_blocks:  # transformers would stop its whole loop on it, failing every request
            message = (
                f"The request needs {needed} KV cache blocks but the cache has {self.num_blocks}; "
                "raise num_blocks or leave it empty."
            )
            yield EngineEvent(index, "finish", time.perf_counter(), 0, "error", message)
            return
        request_id = f"r{index}"
        in_flight[request_id] = _InFlight(index, output_len)
        manager.add_request(
            ids,
            request_id=request_id,
            max_new_tokens=output_len,
            streaming=self._stream_output,
            record_timestamps=True,
            eos_token_id=-1 if self._generation.ignore_eos else sorted(self._eos_ids) or -1,
        )

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
        fatal = manager.background_thread_status.fatal_error
        message = f"The generation loop stopped: {last_line(fatal) if fatal else 'no reason given'}"
        for request in in_flight.values():
            yield EngineEvent(request.index, "finish", time.perf_counter(), request.n_tokens, "error", message)
        for index in not_admitted:
            yield EngineEvent(index, "finish", time.perf_counter(), 0, "error", message)

    def _generation_config(self):
        from transformers import GenerationConfig

        return GenerationConfig(
            max_new_tokens=max((r.output_len for r in self._requests), default=1),
            eos_token_id=-1 if self._generation.ignore_eos else sorted(self._eos_ids) or -1,
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
