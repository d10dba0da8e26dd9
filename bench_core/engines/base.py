"""The contract every backend keeps: a `Backend` class answers for a kind of engine before any is
loaded, and the `Engine` it loads runs requests.

An engine takes sampled requests and reports what happens to each of them as `EngineEvent`s:
when it is admitted to the engine, each time its cumulative output token count grows, and how it
finished. The runner turns events into profiler ticks; engines never compute metrics.
Requests say when they may go (load.schedule.SendSchedule, which every engine's driver keeps): under the trace
pattern at their timestamps, and a multi-turn turn only after the turn it follows, whose answer it may repeat.
`complete()` serves the playground instead: chat prompts in, texts out, EOS honoured.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from ..config import EngineConfig, GenerationSettings, LoadConfig
from ..errors import BenchError, ConfigError
from ..load.datasets import SampledRequest

if TYPE_CHECKING:
    from .server_metrics import MetricsScraper
from ..load.playground import Conversation, PlaygroundResult
from ..load.schedule import SendSchedule
from ..models.window import model_context_window
from ..states import SERVED_REASONS, LoadPattern

EventKind = Literal["admit", "tokens", "finish", "end", "counted"]


@dataclass(slots=True)  # not frozen: a frozen __init__ costs 5x, and engines make one per token
class EngineEvent:
    """Something that happened to request `index` at `ts` (seconds, `time.perf_counter` clock).

    - "admit": the engine took the request into a batch slot (a worker picked it up).
    - "tokens": `n_tokens` output tokens exist so far (cumulative). One event may carry the ticks that came
      before its own in the same network read, oldest first (`earlier_ts`, `earlier_ns`): an HTTP client
      reads many server-sent events at once, and one event per read rather than per tick is what keeps the
      hand-off to the runner cheap. Whoever times ticks takes those first (`ticks()`).
    - "finish": the request ended; `finish_reason` is "length", "stop", "error" or "abort",
      and `message` says why for errors. `token_ids` are the generated ids where the engine has them
      (`complete()` decodes them); `text` is the answer where the engine has it as text (an HTTP client); the runner
      keeps either only where the run keeps its answers (measure/quality.py). `extra` holds per-request facts the
      engine alone knows (an HTTP server's usage count, say), kept as columns of the request table.
      A finish_reason of NOT_SENT marks a request the engine never sent (a duration ended): it
      stays unfinished, with `message` as its reason. RUN_ENDED marks one the engine stopped because
      the run ended (its duration was up), CANCELLED_BY_LOAD one the load cancelled on purpose (the engine
      API's cancel rate): both counted cancelled, not failed, with `message` as the reason. `length_status` is
      the engine's own verdict on a served request's length where its token count cannot give it
      (metrics.request_status): SUCCESS for a server that said it stopped at the limit without counting its
      tokens, OVERRUN for one that produced more than asked; "" leaves it to the count.
    - "end": the run's clock stops at `ts` (its `index` means nothing): what an engine yields after it is its own
      work, done outside the measured window (an HTTP client's retokenizing of the answers). An engine that yields
      none has its clock stopped when its events end.
    - "counted": more columns (`extra`) and the input length of a request that finished before the "end", from
      counts the engine made after it.
    - `input_len` of an "admit", a "finish" or a "counted" is the prompt's length where the engine knows it better
      than the sample (a turn that repeats the model's answer, built only when sent); 0: the request's own. The prompt tokens an engine found in its prefix cache are
      `extra["cached_tokens"]` of the "finish", where the engine reports them.
    """

    index: int
    kind: EventKind
    ts: float
    n_tokens: int = 0
    finish_reason: str = ""
    message: str = ""
    token_ids: Sequence[int] = ()
    text: str | None = None
    extra: Mapping[str, Any] | None = None
    length_status: str = ""
    input_len: int = 0
    earlier_ts: Sequence[float] = ()
    earlier_ns: Sequence[int] = ()

    def ticks(self) -> list[tuple[float, int]]:
        """(ts, n_tokens) of every tick this "tokens" event carries, its own last."""
        return [*zip(self.earlier_ts, self.earlier_ns), (self.ts, self.n_tokens)]


NOT_SENT = "not_sent"
RUN_ENDED = "run_ended"
CANCELLED_BY_LOAD = "cancelled_by_load"
NOT_SENT_AFTER_FAILURE = "not sent: the turn before it in its session failed"


def finish_in_schedule(schedule: SendSchedule, finish: EngineEvent, answer: str | None = None) -> list[EngineEvent]:
    """A request's "finish" told to the run's schedule (its next turn is due after it, with `answer` where that turn
    repeats it), with when it was due and sent as its columns where the schedule kept that, then a NOT_SENT finish
    for each turn that will never be sent because this one failed."""
    if columns := schedule.send_columns(finish.index, finish.ts):
        finish.extra = {**(finish.extra or {}), **columns}
    dropped = schedule.finish(finish.index, finish.ts, finish.finish_reason in SERVED_REASONS, answer)
    return [
        finish,
        *(EngineEvent(index, "finish", finish.ts, 0, NOT_SENT, NOT_SENT_AFTER_FAILURE) for index in dropped),
    ]


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


@dataclass(frozen=True)
class CacheStart:
    """What the prefix cache held when a run's clock started, as the run records it (its cache_start column):
    cold (nothing cached), warm (what earlier requests left) or unknown, and in one line why, where that is not the
    state the run asked for."""

    state: str  # CACHE_COLD, CACHE_WARM or CACHE_UNKNOWN
    note: str = ""


class Engine(ABC):
    """A loaded model behind one backend. Reused across runs while its settings are unchanged."""

    info: EngineInfo
    # True where the engine builds its prefix cache for each stream() (the embedded engine): a run starts cold.
    cache_per_run: ClassVar[bool] = False
    # True where `reset_prefix_cache` may drop the cache in place; an in-process engine without a way is reloaded.
    resets_prefix_cache: ClassVar[bool] = False

    @property
    @abstractmethod
    def tokenizer(self):
        """The Hugging Face tokenizer of the model, used to sample and measure prompts."""

    def encode(self, prompt: str) -> list[int]:
        """The prompt's token ids as this engine encodes a prompt handed to it as ids (skip tokenize: before the
        clock starts)."""
        return list(self.tokenizer.encode(prompt))

    @abstractmethod
    def stream(
        self,
        requests: Sequence[SampledRequest],
        generation: GenerationSettings,
        load: LoadConfig,
        cancel: threading.Event,
    ) -> Iterator[EngineEvent]:
        """Run all requests as `load` offers them (its pattern; at most `load.concurrency` at once) and as they
        say (none before it is due, nor a turn before the one it follows has finished: load.schedule), yielding
        their events as they happen.

        Every request ends with exactly one "finish" event, unless `cancel` is set, in which case
        the engine stops within a second and requests still running end with "abort". A turn never sent because
        the one it follows failed ends NOT_SENT.
        Without `load.stream_output` a request yields a single "tokens" event, when it is complete.
        """

    def warmup(
        self,
        requests: Sequence[SampledRequest],
        generation: GenerationSettings,
        load: LoadConfig,
        cancel: threading.Event,
    ) -> None:
        """Run `load.warmup_requests` unmeasured requests (the first prompts, again from the first when there are
        fewer) through `stream()` as the run will send its own; the runner calls this after loading the engine,
        before its clock starts. A warm-up request that fails raises a BenchError: nothing is measured then."""
        count = load.warmup_requests
        if not count or not requests:
            return
        chosen = [requests[i % len(requests)] for i in range(count)]
        for event in self.stream(chosen, generation, load, cancel):
            if event.kind == "finish" and event.finish_reason not in SERVED_REASONS and not cancel.is_set():
                because = f"{event.finish_reason}: {event.message}" if event.message else event.finish_reason
                raise BenchError(f"A warm-up request failed ({because}), so nothing was measured.")

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

    def reset_prefix_cache(self) -> str:
        """Drop every prompt prefix the engine holds cached, before a cold run's clock starts: "" when done, else
        why it could not, in one line. Only an engine that `resets_prefix_cache` is asked."""
        return f"the {self.info.backend} engine has no way to drop its prefix cache"

    def metrics_scraper(self) -> MetricsScraper | None:
        """What reads the engine's own metrics during a run (a server's /metrics), not yet started; None by
        default."""
        return None

    def client_pids(self) -> list[int]:
        """The processes this engine's client sends from besides this one (engines/client_workers.py), for the
        telemetry to sample; none by default."""
        return []

    def loop_lag(self) -> list[tuple[float, float]]:
        """How late the client's event loop woke during the last `stream()` (loop_lag.py: perf_counter time, seconds
        late), where this engine is a client with one; none by default."""
        return []

    def close(self) -> None:  # noqa: B027 (a default: an engine that holds nothing need not override it)
        """Release the model and any threads or devices it holds."""


@dataclass(frozen=True)
class RunSize:
    """The dataset size and load a new run on a backend starts from (the sidebar's first values). `name` keys the
    widgets: a backend of another run size starts them at its own values, not at the last one's."""

    name: str
    num_prompts: int
    concurrency: int
    stream_output: bool
    sharegpt_output_len: int | None


# A first run on a CPU must end within 2 minutes on 2 busy cores, SmolLM2's conversion included. Measured with an
# empty cache through the CLI, two CPU hogs and another session's tests running (load 3.8-4.6): 16 ShareGPT
# prompts x 64 tokens at concurrency 8, streamed, took 236 s; 8 prompts took 96 s (quiet: 16 prompts, 70 s).
CPU_RUN_SIZE = RunSize("cpu", num_prompts=8, concurrency=8, stream_output=True, sharegpt_output_len=64)


class Backend(ABC):
    """A kind of engine, registered under `names` by defining it in a module of this package named
    `*_engine` (the registry in `engines/__init__.py`). It answers for its own facts, before anything loads: so
    the module imports its heavy libraries (torch, lmdeploy, transformers...) only where it loads or runs. Its settings
    are the catalog's that name it among their backends (config/catalog.py: config imports no engine)."""

    names: ClassVar[tuple[str, ...]]
    order: ClassVar[int] = 100  # where it is listed among the backends (the sidebar, --backend's choices), lowest first
    # False for an engine reached over the network (a server): its process, GPUs and model code are not ours.
    in_process: ClassVar[bool] = True
    # True when prompts are sampled with the loaded engine's tokenizer, so the engine loads first.
    tokenizer_from_engine: ClassVar[bool] = False
    # False when the engine names its own model (a server serves one); a run then needs none.
    needs_model: ClassVar[bool] = True
    # The load patterns it can offer requests in, and the one a run starts from (its LMDeploy script's).
    load_patterns: ClassVar[tuple[str, ...]] = (
        LoadPattern.BATCH,
        LoadPattern.CONCURRENCY,
        LoadPattern.ENGINE_API,
        LoadPattern.TRACE,
    )
    load_pattern: ClassVar[str] = LoadPattern.BATCH
    run_size: ClassVar[RunSize] = CPU_RUN_SIZE
    # Whether its engine takes images with a prompt (a vision model's), for the image dataset.
    takes_images: ClassVar[bool] = False

    @classmethod
    def gpus(cls, engine: EngineConfig) -> int:
        """The GPUs a run of `engine` holds alone (a sweep on a cluster reserves them)."""
        return 0

    @classmethod
    def context_window(cls, engine: EngineConfig) -> int | None:
        """Tokens of context the engine gives a request; None when unknown (the model's config unreadable)."""
        return model_context_window(engine.model)

    @classmethod
    @abstractmethod
    def availability(cls, backend: str) -> str | None:
        """None when `backend` can run on this machine, else the reason it cannot, for the user. Never raises."""

    @classmethod
    def install_facts(cls) -> dict[str, str]:
        """What `doctor` says of this backend's install beyond the packages' versions (a compiled extension, say)."""
        return {}

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
