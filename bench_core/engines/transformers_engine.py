"""The embedded default engine: a Hugging Face `transformers` model in this process, on CPU or a GPU.

Requests go through transformers' continuous-batching manager (transformers_batching.py), created
per `stream()` call so that a new concurrency or cache size never reloads the model. Where that API
is missing, `model.generate` serves one request at a time (transformers_generate.py). Benchmark prompts
are encoded as they are, with no chat template, as LMDeploy's script does with `do_preprocess=False`;
playground prompts (`complete()`) go through the model's chat template and the same two paths. The engine_api
load pattern drives the same manager through LMDeploy's instance API (engine_api.py), so its flags work here
for real: token ids in, outputs detokenized or not, requests cancelled part way.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import threading
import time
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from ..config import EngineConfig, GenerationSettings, LoadConfig
from ..errors import ConfigError, ModelError
from ..load.datasets import SampledRequest
from ..load.playground import Conversation, PlaygroundResult, prompt_preview
from ..load.schedule import SendSchedule
from ..models.resolve import last_line, resolve_model
from ..states import LoadPattern
from .base import Backend, Engine, EngineEvent, EngineInfo
from .engine_api import EngineAPIDrive, IncrementalText, InstanceAPI, instance_outcome
from .gpu_probe import gpu_facts
from .transformers_batching import ContinuousBatchingInstances, ContinuousBatchRun
from .transformers_generate import generate_one_by_one

THREADS_ENV = "BENCH_STUDIO_TORCH_THREADS"
# transformers refuses pages under 4 tokens; past a few thousand every request holds a mostly empty block.
PAGE_SIZE_RANGE = (4, 8192)


class TransformersBackend(Backend):
    """The embedded engine: a transformers model in this process."""

    names = ("transformers",)
    order = 1
    # A request rate too (open loop): the embedded engine takes each request when the arrival process says it comes.
    load_patterns = (
        LoadPattern.BATCH,
        LoadPattern.CONCURRENCY,
        LoadPattern.ENGINE_API,
        LoadPattern.REQUEST_RATE,
        LoadPattern.TRACE,
    )

    @classmethod
    def gpus(cls, engine: EngineConfig) -> int:
        """One on cuda; "auto" holds none, so where no GPU is given it runs on the CPU."""
        return int(engine.torch_device == "cuda")

    @classmethod
    def availability(cls, backend: str) -> str | None:
        """None when torch and transformers can be imported, else what to install."""
        missing = [name for name in ("torch", "transformers") if importlib.util.find_spec(name) is None]
        if missing:
            return f"The transformers engine needs {' and '.join(missing)}: pip install -r requirements.txt"
        return None

    @classmethod
    def validate(cls, engine: EngineConfig, load: LoadConfig) -> list[str]:
        """Problems with the transformers engine's knobs beyond each one's own bounds and choices, each a sentence
        for the user: a GPU asked for where there is none, a page size the engine cannot use."""
        problems: list[str] = []
        if engine.torch_device == "cuda" and not gpu_facts().cuda:
            problems.append("The torch device 'cuda' was asked for but torch sees no GPU here; choose cpu or auto.")
        low, high = PAGE_SIZE_RANGE
        if not low <= engine.cache_block_seq_len <= high:
            problems.append(f"The KV cache block size (page size) must be between {low} and {high} tokens.")
        if load.load_pattern == LoadPattern.ENGINE_API and engine.speculative_algorithm:
            problems.append(
                "Speculative decoding by prompt lookup runs through transformers' generate(), which the engine API "
                "load pattern does not drive; choose the batch or concurrency pattern."
            )
        elif load.load_pattern == LoadPattern.ENGINE_API and engine.decode_path == "generate":
            problems.append(
                "The generate decode path is transformers' generate(), which the engine API load pattern does not "
                "drive; choose the batch or concurrency pattern."
            )
        return problems

    @classmethod
    def settings_key(cls, engine: EngineConfig, load: LoadConfig) -> tuple:
        """The weights and the KV cache sizing and sharing the engine was loaded with (a run's cache knobs must be
        the ones it ran with); the load settings apply per `stream()` call."""
        return (
            engine.model,
            engine.dtype,
            engine.torch_device,
            engine.trust_remote_code,
            engine.num_blocks,
            engine.cache_block_seq_len,
            engine.max_batch_tokens,
            engine.enable_prefix_caching,
            engine.speculative_algorithm,
            engine.speculative_num_draft_tokens,
            engine.decode_path,
        )

    @classmethod
    def load(cls, engine: EngineConfig, load: LoadConfig) -> Engine:
        return TransformersEngine(engine)


def torch_threads() -> int:
    """Torch CPU threads: $BENCH_STUDIO_TORCH_THREADS, else 1 (steady under load, leaves a core to the UI)."""
    value = os.environ.get(THREADS_ENV, "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else 1


def has_continuous_batching(model) -> bool:
    """Whether this transformers version offers the continuous-batching manager (detected by feature)."""
    import transformers

    return hasattr(model, "init_continuous_batching") and hasattr(transformers, "ContinuousBatchingConfig")


def _resolve_device(torch_device: str) -> str:
    """At load time, where torch is imported anyway."""
    if torch_device == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return torch_device


def _resolve_dtype(dtype: str, device: str):
    """The dtype argument for from_pretrained: on a GPU "auto" keeps the checkpoint's own."""
    import torch

    if dtype != "auto":
        return getattr(torch, dtype)
    if device == "cuda":
        return "auto"
    return torch.bfloat16 if _cpu_has_native_bfloat16() else torch.float32


def _cpu_has_native_bfloat16() -> bool:
    """Whether the CPU computes in bfloat16 natively (AVX512-BF16 or AMX).

    Measured with SmolLM2-135M on such a CPU, 1 thread: bfloat16 decodes as fast as float32 or faster
    (batch 8: 50-83 against 37-53 tok/s; batch 1: 10-12 against 9-14) in three quarters of the memory
    (RSS 760 MB against 1,000 MB). Without those instructions bfloat16 matmuls are emulated and slow.
    """
    import torch

    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")  # private torch API: probe, never rely
    return any(getattr(torch.cpu, probe, lambda: False)() for probe in probes)


def _eos_token_ids(model, tokenizer) -> set[int]:
    """The ids that end a request when EOS is honoured: the generation config's, else the model's or tokenizer's."""
    candidates = (model.generation_config.eos_token_id, model.config.eos_token_id, tokenizer.eos_token_id)
    eos = next((c for c in candidates if c is not None), None)
    if eos is None:
        return set()
    return {int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])}


class TransformersEngine(Engine):
    """A transformers causal LM loaded once; each `stream()` call runs one batch of requests."""

    # Each stream() starts a continuous-batching manager with a KV cache of its own, dropped when it ends
    # (transformers_batching): no prefix outlives its run, nor the warm-up's.
    cache_per_run = True

    def __init__(self, engine: EngineConfig, *, continuous_batching: bool | None = None) -> None:
        """Load `engine.model`. `continuous_batching=False` forces the generate path; None uses
        continuous batching where this transformers version has it."""
        import torch
        import transformers
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self._engine = engine
        device = _resolve_device(engine.torch_device)
        if device == "cpu":
            torch.set_num_threads(torch_threads())
        path = resolve_model(engine.model)
        try:
            # resolve_model gave a complete local folder: nothing is fetched from here on.
            self._tokenizer = AutoTokenizer.from_pretrained(
                path, trust_remote_code=engine.trust_remote_code, local_files_only=True
            )
            model = AutoModelForCausalLM.from_pretrained(
                path,
                dtype=_resolve_dtype(engine.dtype, device),
                trust_remote_code=engine.trust_remote_code,
                local_files_only=True,
            )
            self._model = model.to(device).eval()  # type: ignore[arg-type]  # transformers' wrapper hides to()'s signature
        except Exception as exc:
            raise ModelError(f"Could not load model '{engine.model}' from {path}: {last_line(exc)}") from exc
        # transformers drafts only inside generate(), one sequence at a time: speculation, and its baseline, decode
        # there, one request at a time.
        generate_only = bool(engine.speculative_algorithm) or engine.decode_path == "generate"
        available = has_continuous_batching(self._model) and not generate_only
        self.continuous_batching = available if continuous_batching is None else continuous_batching and available
        self._eos_ids = _eos_token_ids(self._model, self._tokenizer)
        self._draft_tokens = engine.speculative_num_draft_tokens if engine.speculative_algorithm else None
        notes = [
            f"continuous batching (paged KV cache, page size {engine.cache_block_seq_len})"
            if self.continuous_batching
            else "generate fallback: one request at a time"
        ]
        if self._draft_tokens is not None:
            notes.append(f"speculative decoding: prompt lookup, {self._draft_tokens} draft tokens per step")
        if device == "cpu":
            notes.append(f"torch threads: {torch.get_num_threads()}")
        self.info = EngineInfo(
            backend="transformers",
            model=engine.model,
            model_path=path,
            dtype=str(self._model.dtype).removeprefix("torch."),
            device=str(self._model.device),
            versions={"torch": str(torch.__version__), "transformers": str(transformers.__version__)},
            notes=notes,
        )

    @property
    def tokenizer(self):
        return self._tokenizer

    def stream(
        self,
        requests: Sequence[SampledRequest],
        generation: GenerationSettings,
        load: LoadConfig,
        cancel: threading.Event,
        arrival_seed: int | np.random.RandomState = 0,
    ) -> Iterator[EngineEvent]:
        """`load.concurrency` requests run at once, each once it is due (load.schedule); the pattern otherwise
        only decides when a request's clock starts, which is the runner's business. Under a request rate, requests
        are due at the arrivals drawn from `arrival_seed` (as a server's client sends them), at most
        `load.max_concurrency` at once. Prompts are encoded before the run, but those built on an answer, when they
        are sent. The engine API drives the model as LMDeploy's engines are driven (engine_api.py)."""
        if load.load_pattern == LoadPattern.ENGINE_API:
            if not self.continuous_batching:
                raise ConfigError(
                    "The engine API load pattern needs transformers' continuous batching, which this "
                    "transformers version lacks; choose the batch or concurrency pattern."
                )
            return self._engine_api_events(requests, generation, load, cancel)
        prompts = [None if r.builds_on_answer else self._tokenizer.encode(r.prompt) for r in requests]
        if load.load_pattern == LoadPattern.REQUEST_RATE:
            schedule = SendSchedule.at_rate(
                requests, load.request_rate, load.burstiness, arrival_seed, load.exact_rate_arrivals
            )
            max_in_flight = load.max_concurrency or len(requests)
        else:
            schedule, max_in_flight = SendSchedule(requests, load), load.concurrency
        if not self.continuous_batching:
            return generate_one_by_one(
                self._model,
                self._tokenizer,
                self._eos_ids,
                requests,
                prompts,
                generation,
                load.stream_output,
                cancel,
                schedule,
                self._draft_tokens,
            )
        run = ContinuousBatchRun(
            self._model,
            self._engine,
            self._eos_ids,
            requests,
            prompts,
            generation,
            max_in_flight,
            load.stream_output,
            schedule,
            encode=self._tokenizer.encode,
            decode=self._answer_text,
        )
        return run.events(cancel)

    def _engine_api_events(
        self,
        requests: Sequence[SampledRequest],
        generation: GenerationSettings,
        load: LoadConfig,
        cancel: threading.Event,
    ) -> Iterator[EngineEvent]:
        batch = ContinuousBatchingInstances(
            self._model, self._engine, self._eos_ids, requests, generation, load.concurrency, load.stream_output
        )
        api = InstanceAPI(
            engine=batch,
            encode=self.encode,
            detokenizer=lambda prompt_ids: IncrementalText(self._tokenizer, prompt_ids),
            gen_config=lambda request: request.output_len,
            outcome=instance_outcome,
            name="The transformers engine",
        )
        batch.start()
        try:
            yield from EngineAPIDrive(api, requests, load).events(cancel)
        finally:
            batch.stop()

    def _answer_text(self, token_ids) -> str:
        return str(self._tokenizer.decode(list(token_ids), skip_special_tokens=True))  # one sequence: one str

    def complete(
        self,
        conversations: Sequence[Conversation],
        generation: GenerationSettings,
        max_new_tokens: int,
        cancel: threading.Event,
    ) -> Iterator[PlaygroundResult]:
        prompts = [self._chat_ids(conversation) for conversation in conversations]
        requests = [SampledRequest("", len(ids), max_new_tokens) for ids in prompts]
        chat = dataclasses.replace(generation, ignore_eos=False)
        started = time.perf_counter()
        if self.continuous_batching:
            run = ContinuousBatchRun(
                self._model, self._engine, self._eos_ids, requests, prompts, chat, len(requests), stream_output=True
            )
            events = run.events(cancel)
        else:
            events = generate_one_by_one(
                self._model,
                self._tokenizer,
                self._eos_ids,
                requests,
                prompts,
                chat,
                True,
                cancel,
                draft_tokens=self._draft_tokens,
            )
        return results_from_events(events, conversations, prompts, self._tokenizer, started)

    def _chat_ids(self, conversation: Conversation) -> list[int]:
        try:
            return list(
                self._tokenizer.apply_chat_template(conversation, add_generation_prompt=True, return_dict=False)
            )
        except Exception as exc:  # no template, or one that rejects these roles
            raise ModelError(
                f"The chat template of '{self._engine.model}' cannot render these prompts: {last_line(exc)}"
            ) from exc

    def close(self) -> None:
        self._model = None


def results_from_events(
    events: Iterable[EngineEvent],
    conversations: Sequence[Conversation],
    prompts: Sequence[list[int]],
    tokenizer,
    started: float,
) -> Iterator[PlaygroundResult]:
    """A result per finished request, timed from `started` (when the batch went in), text decoded."""
    first_token_at: dict[int, float] = {}
    for event in events:
        if event.kind == "tokens":
            first_token_at.setdefault(event.index, event.ts)
        elif event.kind == "finish":
            first = first_token_at.get(event.index)
            yield PlaygroundResult(
                index=event.index,
                prompt=prompt_preview(conversations[event.index]),
                text=tokenizer.decode(list(event.token_ids), skip_special_tokens=True),
                input_tokens=len(prompts[event.index]),
                output_tokens=event.n_tokens,
                finish_reason=event.finish_reason,
                ttft_s=None if first is None else first - started,
                total_s=event.ts - started,
                error=event.message,
            )
