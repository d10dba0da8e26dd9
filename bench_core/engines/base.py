"""The contract every backend keeps: a `Backend` class answers for a kind of engine before any is
loaded, and the `Engine` it loads runs requests.

An engine takes sampled requests and reports what happens to each of them as `EngineEvent`s:
when it is admitted to the engine, each time its cumulative output token count grows, and how it
finished. The runner turns events into profiler ticks; engines never compute metrics.
`complete()` serves the playground instead: chat prompts in, texts out, EOS honoured.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from ..config import EngineConfig, GenerationSettings, LoadConfig
from ..load.datasets import SampledRequest
from ..errors import ConfigError
from ..load.playground import Conversation, PlaygroundResult

EventKind = Literal["admit", "tokens", "finish"]


@dataclass(slots=True)  # not frozen: a frozen __init__ costs 5x, and engines make one per token
class EngineEvent:
    """Something that happened to request `index` at `ts` (seconds, `time.perf_counter` clock).

    - "admit": the engine took the request into a batch slot (a worker picked it up).
    - "tokens": `n_tokens` output tokens exist so far (cumulative).
    - "finish": the request ended; `finish_reason` is "length", "stop", "error" or "abort",
      and `message` says why for errors. `token_ids` are the generated ids where the engine has them
      (`complete()` decodes them); benchmarks ignore them. `extra` holds per-request facts the
      engine alone knows (an HTTP server's usage count, say), kept as columns of the request table.
      A finish_reason of NOT_SENT marks a request the engine never sent (a duration ended): it
      stays unfinished, with `message` as its reason. RUN_ENDED marks one the engine stopped because
      the run ended (its duration was up): counted cancelled, not failed.
    """

    index: int
    kind: EventKind
    ts: float
    n_tokens: int = 0
    finish_reason: str = ""
    message: str = ""
    token_ids: Sequence[int] = ()
    extra: Mapping[str, Any] | None = None


NOT_SENT = "not_sent"
RUN_ENDED = "run_ended"


@dataclass
class EngineInfo:
    """What actually ran, recorded with every run."""

    backend: str
    model: str
    model_path: str
    dtype: str
    device: str
    versions: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


class Engine(ABC):
    """A loaded model behind one backend. Reused across runs while its settings are unchanged."""

    info: EngineInfo

    @property
    @abstractmethod
    def tokenizer(self):
        """The Hugging Face tokenizer of the model, used to sample and measure prompts."""

    @abstractmethod
    def stream(
        self,
        requests: Sequence[SampledRequest],
        generation: GenerationSettings,
        load: LoadConfig,
        cancel: threading.Event,
    ) -> Iterator[EngineEvent]:
        """Run all requests as `load` offers them (its pattern; at most `load.concurrency` at once),
        yielding their events as they happen.

        Every request ends with exactly one "finish" event, unless `cancel` is set, in which case
        the engine stops within a second and requests still running end with "abort".
        Without `load.stream_output` a request yields a single "tokens" event, when it is complete.
        """

    def warmup(
        self, requests: Sequence[SampledRequest], generation: GenerationSettings, load: LoadConfig, cancel: threading.Event
    ) -> None:
        """Send unmeasured requests before the run (the runner calls this before its clock starts).

        Nothing by default; an engine that warms up raises a BenchError when the warm-up fails.
        """

    def complete(
        self,
        conversations: Sequence[Conversation],
        generation: GenerationSettings,
        max_new_tokens: int,
        cancel: threading.Event,
    ) -> Iterator[PlaygroundResult]:
        """Answer each conversation with the model's chat template applied, yielding results as they finish.

        Generation stops at EOS or after `max_new_tokens`, whatever `generation.ignore_eos` says; texts
        are decoded without special tokens. On `cancel` the prompts still running end with "abort".
        """
        raise ConfigError(f"The {self.info.backend} engine cannot run playground prompts.")

    def close(self) -> None:
        """Release the model and any threads or devices it holds."""


class Backend(ABC):
    """A kind of engine, registered under `names` by defining it in a module of this package named
    `*_engine` (the registry in `engines/__init__.py`). Everything is asked of the class, before anything loads: so
    the module imports its heavy libraries (torch, lmdeploy, aiohttp...) only where it loads or runs."""

    names: ClassVar[tuple[str, ...]]
    # True when prompts are sampled with the loaded engine's tokenizer, so the engine loads first.
    tokenizer_from_engine: ClassVar[bool] = False
    # False when the engine names its own model (a server serves one); a run then needs none.
    needs_model: ClassVar[bool] = True
    # The load patterns it can offer requests in (config.LOAD_PATTERNS).
    load_patterns: ClassVar[tuple[str, ...]] = ("batch", "concurrency")

    @classmethod
    @abstractmethod
    def availability(cls, backend: str) -> str | None:
        """None when `backend` can run on this machine, else the reason it cannot, for the user. Never raises."""

    @classmethod
    @abstractmethod
    def validate(cls, engine: EngineConfig, load: LoadConfig) -> list[str]:
        """Problems with this backend's knobs, each a sentence for the user."""

    @classmethod
    @abstractmethod
    def settings_key(cls, engine: EngineConfig, load: LoadConfig) -> tuple:
        """What the engine is built from: equal keys mean a loaded engine can be reused as it is."""

    @classmethod
    @abstractmethod
    def load(cls, engine: EngineConfig, load: LoadConfig) -> Engine:
        """Load the model; raises ConfigError or ModelError with one sentence."""
