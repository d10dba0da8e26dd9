"""What a benchmark run is asked to do: engine, dataset, load and generation settings.

One `RunConfig` travels from the sidebar or the CLI flags to the runner and into the history. The
engine knobs are described once, in `ENGINE_KNOBS`, with LMDeploy's names, defaults and CLI groups;
the CLI builds its flags and the dashboard its widgets from that table. Generic checks live here;
the backend-specific rules (LMDeploy's) live with the engines, and `engines.check_run_config` runs both.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from ..models.synthetic import synthetic_name_problems

LMDEPLOY_BACKENDS = ("turbomind", "pytorch")
IN_PROCESS_BACKENDS = ("turbomind", "pytorch", "transformers")
SERVER_BACKEND = "openai"  # any OpenAI-compatible HTTP server
BACKENDS = (*IN_PROCESS_BACKENDS, SERVER_BACKEND)
LOAD_PATTERNS = ("batch", "concurrency", "request_rate")
DATASET_NAMES = ("sharegpt", "random")
MAX_SEED = 2**32 - 1  # the largest seed NumPy takes
DEFAULT_PERCENTILES = (50, 75, 95, 99)


@dataclass
class EngineConfig:
    """Everything that needs the engine to be (re)loaded when it changes."""

    backend: str = "transformers"
    model: str = "builtin:smollm2-135m"
    trust_remote_code: bool = False
    # LMDeploy, shared by both of its engines
    tp: int = 1
    cache_max_entry_count: float = 0.8
    session_len: int | None = None
    cache_block_seq_len: int = 64
    enable_prefix_caching: bool = False
    # TurboMind
    model_format: str = "hf"
    quant_policy: int = 0
    num_tokens_per_iter: int = 0
    max_prefill_iters: int = 1
    communicator: str = "nccl"
    async_: int = 1
    # LMDeploy's PyTorch engine
    device: str = "cuda"
    eager_mode: bool = False
    enable_return_routed_experts: bool = False
    # Speculative decoding (LMDeploy)
    speculative_algorithm: str | None = None
    speculative_draft_model: str | None = None
    speculative_num_draft_tokens: int = 1
    log_level: str = "WARNING"
    # The embedded transformers engine
    dtype: str = "auto"
    torch_device: str = "auto"
    num_blocks: int | None = None
    max_batch_tokens: int = 1024
    # An OpenAI-compatible server. The API key lives only in memory: to_flat_dict leaves it out, so it
    # never reaches config.json or the history (None: $OPENAI_API_KEY, read when requests are sent).
    base_url: str = ""
    api_key: str | None = field(default=None, repr=False)
    endpoint: str = "completions"
    server_kind: str = "openai"
    tokenizer: str = ""
    extra_request_body: str = ""  # a JSON object merged into every request body
    read_timeout_s: float = 300.0


@dataclass
class DatasetConfig:
    """Which prompts to send, sampled with LMDeploy's rules."""

    dataset: str = "builtin:sharegpt"
    dataset_name: str = "sharegpt"
    num_prompts: int = 5000
    seed: int = 0
    sharegpt_output_len: int | None = None
    random_input_len: int | None = None
    random_output_len: int | None = None
    random_range_ratio: float = 0.0


@dataclass
class LoadConfig:
    """How requests are offered to the engine (see README, "What is measured": timing semantics)."""

    load_pattern: str = "batch"
    concurrency: int = 256
    stream_output: bool = False
    # The request_rate pattern (OpenAI-compatible servers): vLLM's arrival process and limits.
    request_rate: float = math.inf  # requests/s; inf sends every request at once
    burstiness: float = 1.0  # gamma shape: 1 is Poisson, lower is burstier
    # Arrivals are drawn as profile_restful_api.py draws them from the dataset's seed; this rescales the
    # gaps so the schedule offers exactly the requested rate (vLLM's conditioned Poisson process).
    exact_rate_arrivals: bool = False
    max_concurrency: int | None = None
    warmup_requests: int = 0  # sent before the measurement, not measured
    duration_s: float | None = None  # end the run after this long (requests in flight are cancelled); None: send every request


@dataclass
class GenerationSettings:
    """Sampling settings. LMDeploy's pipeline script forces greedy decoding whatever these say."""

    ignore_eos: bool = True
    do_sample: bool = False
    temperature: float = 0.8
    top_p: float = 0.8
    top_k: int = 1


@dataclass
class SLO:
    """Optional service-level thresholds in seconds; a request is good when it meets all that are set."""

    ttft: float | None = None
    tpot: float | None = None
    e2e: float | None = None


@dataclass
class RunConfig:
    engine: EngineConfig = field(default_factory=EngineConfig)
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    load: LoadConfig = field(default_factory=LoadConfig)
    generation: GenerationSettings = field(default_factory=GenerationSettings)
    slo: SLO = field(default_factory=SLO)
    label: str = ""
    percentiles: tuple[float, ...] = DEFAULT_PERCENTILES

    def to_flat_dict(self) -> dict[str, Any]:
        """One level of keys, as history columns and config.json use them (field names are unique)."""
        flat: dict[str, Any] = applied_engine_settings(self.engine)
        for part_name in ("dataset", "load", "generation"):
            flat.update(dataclasses.asdict(getattr(self, part_name)))
        del flat["api_key"]  # a credential: never written anywhere
        flat.update({f"slo_{k}_s": v for k, v in dataclasses.asdict(self.slo).items()})
        flat["label"] = self.label
        flat["percentiles"] = ",".join(_format_number(p) for p in self.percentiles)
        return flat

    @classmethod
    def from_flat_dict(cls, flat: dict[str, Any]) -> RunConfig:
        """Inverse of `to_flat_dict`; unknown keys are ignored, missing ones take defaults, and so do knobs
        that do not apply to the backend (older rows recorded LMDeploy's defaults for every backend)."""
        backend = str(flat.get("backend") or "")
        ignored = {knob.name for knob in ENGINE_KNOBS if backend and backend not in knob.backends}

        def part(part_cls):
            kwargs = {}
            for f in dataclasses.fields(part_cls):
                if f.name in flat and f.name not in ignored:
                    kwargs[f.name] = _coerce(flat[f.name], f.default)
            return part_cls(**kwargs)

        slo = SLO(**{k: _coerce(flat.get(f"slo_{k}_s"), None) for k in ("ttft", "tpot", "e2e")})
        percentiles = flat.get("percentiles") or DEFAULT_PERCENTILES
        if isinstance(percentiles, str):
            percentiles = tuple(float(p) for p in percentiles.split(",") if p.strip())
        return cls(
            engine=part(EngineConfig),
            dataset=part(DatasetConfig),
            load=part(LoadConfig),
            generation=part(GenerationSettings),
            slo=slo,
            label=str(flat.get("label") or ""),
            percentiles=tuple(percentiles),
        )


def _format_number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _is_missing(value: Any) -> bool:
    return value is None or value == "" or (isinstance(value, float) and math.isnan(value))


def _coerce(value: Any, default: Any) -> Any:
    """Turn a value read back from CSV or JSON into the type of the field's default."""
    if _is_missing(value):
        return None if default is None else default
    if isinstance(default, bool):
        return value if isinstance(value, bool) else str(value).strip().lower() in ("1", "true", "yes")
    if isinstance(default, int):
        return int(float(value))
    if isinstance(default, float):
        return float(value)
    if default is None:
        if isinstance(value, str):
            try:
                number = float(value)
            except ValueError:
                return value
            return int(number) if number.is_integer() and "." not in value else number
        return value
    return type(default)(value)


@dataclass(frozen=True)
class Knob:
    """One engine setting as LMDeploy's CLI presents it, for flags, widgets and validation."""

    name: str
    group: str
    backends: tuple[str, ...]
    help: str
    choices: tuple[Any, ...] | None = None
    constraint: str = ""

    @property
    def flag(self) -> str:
        return "--" + self.name.rstrip("_").replace("_", "-")

    @property
    def default(self) -> Any:
        return {f.name: f.default for f in dataclasses.fields(EngineConfig)}[self.name]

    def not_applicable(self, backend: str) -> str:
        """Why this knob cannot be set for `backend`, naming the flag and the backends that use it."""
        names = list(self.backends)
        backends = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
        return (f"{self.flag} applies to the {backends} backend{'s' if len(names) > 1 else ''} only, "
                f"not to {backend}.")


SHARED = "Shared engine"
TURBOMIND = "TurboMind engine"
PYTORCH = "PyTorch engine"
SPECULATIVE = "Speculative decoding"
TRANSFORMERS = "Transformers engine"
OPENAI_SERVER = "OpenAI-compatible server"
LMD = LMDEPLOY_BACKENDS

ENGINE_KNOBS: tuple[Knob, ...] = (
    Knob("tp", SHARED, LMD, "GPU number used in tensor parallelism.", constraint="a power of 2, at most the GPUs present"),
    Knob("cache_max_entry_count", SHARED, LMD, "Fraction of free GPU memory used for the KV cache.",
         constraint="TurboMind: > 0; PyTorch: between 0 and 1, exclusive"),
    Knob("session_len", SHARED, LMD, "Maximum session length in tokens; empty means the model's own limit.",
         constraint="> 0 when set"),
    Knob("cache_block_seq_len", SHARED, LMD + ("transformers",),
         "Tokens per KV cache block (PyTorch: block_size; transformers: page size).",
         constraint="TurboMind: a multiple of 32 (compute capability >= 8.0) or 64; PyTorch: a power of 2, >= 16"),
    Knob("enable_prefix_caching", SHARED, LMD, "Reuse the KV cache of shared prompt prefixes."),
    Knob("model_format", TURBOMIND, ("turbomind",), "Format of the checkpoint; pass the real one for quantized models.",
         choices=("hf", "awq", "gptq", "compressed-tensors", "fp8", "mxfp4")),
    Knob("quant_policy", TURBOMIND, LMD, "KV cache quantization: 0 none, 4 int4, 8 int8, 16 fp8, 17 fp8_e5m2, 42 turbo_quant.",
         choices=(0, 4, 8, 16, 17, 42), constraint="TurboMind rejects 16 and 17"),
    Knob("num_tokens_per_iter", TURBOMIND, ("turbomind",), "Tokens processed per forward pass (0: engine default).",
         constraint=">= 0"),
    Knob("max_prefill_iters", TURBOMIND, ("turbomind",), "Forward passes a long prefill may be split into.",
         constraint=">= 1"),
    Knob("communicator", TURBOMIND, ("turbomind",), "Communication backend for tensor parallelism.",
         choices=("nccl", "native", "cuda-ipc")),
    Knob("async_", TURBOMIND, ("turbomind",), "Run the engine asynchronously (1) or not (0).", choices=(0, 1)),
    Knob("device", PYTORCH, ("pytorch",), "Device type of the PyTorch engine.", choices=("cuda", "ascend", "maca", "camb")),
    Knob("eager_mode", PYTORCH, ("pytorch",), "Disable CUDA graphs (eager execution)."),
    Knob("enable_return_routed_experts", PYTORCH, ("pytorch",), "Return routed experts of MoE models."),
    Knob("speculative_algorithm", SPECULATIVE, LMD, "Speculative decoding method; empty means off.",
         choices=(None, "eagle", "eagle3", "deepseek_mtp", "hy3_mtp", "qwen3_5_mtp")),
    Knob("speculative_draft_model", SPECULATIVE, LMD, "Path of the draft model."),
    Knob("speculative_num_draft_tokens", SPECULATIVE, LMD, "Tokens the draft model proposes per step.", constraint=">= 1"),
    Knob("dtype", TRANSFORMERS, ("transformers",), "Weights dtype; auto: bfloat16 on CPUs with native bf16, else float32; the checkpoint's own on GPU.",
         choices=("auto", "float32", "bfloat16", "float16")),
    Knob("torch_device", TRANSFORMERS, ("transformers",), "Where the model runs; auto: CUDA when present, else CPU.",
         choices=("auto", "cpu", "cuda")),
    Knob("num_blocks", TRANSFORMERS, ("transformers",), "KV cache blocks; empty sizes the cache for the batch.",
         constraint="> 0 when set"),
    Knob("max_batch_tokens", TRANSFORMERS, ("transformers",), "Tokens per continuous-batching step.", constraint="> 0"),
    Knob("base_url", OPENAI_SERVER, (SERVER_BACKEND,), "Address of the server, with or without /v1.",
         constraint="http:// or https://, e.g. http://127.0.0.1:23333"),
    Knob("endpoint", OPENAI_SERVER, (SERVER_BACKEND,), "completions: /v1/completions; chat: /v1/chat/completions.",
         choices=("completions", "chat")),
    Knob("server_kind", OPENAI_SERVER, (SERVER_BACKEND,),
         "Which server it is, so ignore_eos is sent the way it accepts (openai: any other, not sent).",
         choices=("lmdeploy", "vllm", "sglang", "transformers", "openai")),
    Knob("tokenizer", OPENAI_SERVER, (SERVER_BACKEND,),
         "Tokenizer for sampling prompts and retokenizing answers; empty: the model's."),
    Knob("extra_request_body", OPENAI_SERVER, (SERVER_BACKEND,), "JSON object merged into every request body.",
         constraint='a JSON object, e.g. {"temperature": 0}'),
    Knob("read_timeout_s", OPENAI_SERVER, (SERVER_BACKEND,),
         "Seconds a request may wait for its next token (the first included) before it fails with a read timeout; "
         "keep-alive comments do not count.", constraint="> 0"),
)


QUANT_POLICIES = {"none": 0, "int4": 4, "int8": 8, "fp8": 16, "fp8_e4m3": 16, "fp8_e5m2": 17, "turbo_quant": 42}


def parse_quant_policy(text: str | int) -> int:
    """LMDeploy's --quant-policy spelling: a policy name (any case) or its number."""
    value = QUANT_POLICIES.get(str(text).strip().lower(), text)
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = None
    if number not in set(QUANT_POLICIES.values()):
        names = "/".join(QUANT_POLICIES)
        raise ValueError(f"invalid quant_policy {text!r}: use {names} or 0/4/8/16/17/42")
    return number


def knobs_for(backend: str) -> tuple[Knob, ...]:
    return tuple(k for k in ENGINE_KNOBS if backend in k.backends)


def applied_engine_settings(engine: EngineConfig) -> dict[str, Any]:
    """The engine's fields as recorded: knobs that do not apply to its backend are None (left empty),
    so a CPU run's row does not claim device=cuda or a KV cache fraction it never used."""
    settings = dataclasses.asdict(engine)
    for knob in ENGINE_KNOBS:
        if engine.backend not in knob.backends:
            settings[knob.name] = None
    return settings


def inapplicable_knob_problems(engine: EngineConfig) -> list[str]:
    """One sentence per knob set away from its default although the backend does not use it."""
    return [knob.not_applicable(engine.backend) for knob in ENGINE_KNOBS
            if engine.backend not in knob.backends and getattr(engine, knob.name) != knob.default]


def validate_run_config(config: RunConfig) -> list[str]:
    """Backend-independent problems, each a sentence for the user. Empty when the run may start."""
    problems: list[str] = []
    eng, data, load, slo = config.engine, config.dataset, config.load, config.slo
    if eng.backend not in BACKENDS:
        problems.append(f"Unknown backend '{eng.backend}'; choose one of {', '.join(BACKENDS)}.")
    else:
        problems.extend(inapplicable_knob_problems(eng))
    if not str(eng.model).strip() and eng.backend != SERVER_BACKEND:  # a server names its own model
        problems.append("No model given: pass a local path, a hub id or a built-in model such as builtin:tiny-llama.")
    problems.extend(synthetic_name_problems(str(eng.model)))
    if data.dataset_name not in DATASET_NAMES:
        problems.append(f"Unknown dataset name '{data.dataset_name}'; choose sharegpt or random.")
    if data.num_prompts < 1:
        problems.append("The number of prompts must be at least 1.")
    if data.dataset_name == "sharegpt":
        if data.random_input_len is not None or data.random_output_len is not None:
            problems.append("--random-input-len and --random-output-len apply to the random dataset only.")
        if data.sharegpt_output_len is not None and data.sharegpt_output_len < 4:
            problems.append("The fixed ShareGPT output length must be at least 4 tokens (as in LMDeploy).")
    if data.dataset_name == "random":
        if data.random_input_len is None or data.random_output_len is None:
            problems.append("The random dataset needs both --random-input-len and --random-output-len.")
        else:
            if data.random_input_len < 1:
                problems.append("The random input length must be at least 1 token.")
            if data.random_output_len < 1:
                problems.append("The random output length must be at least 1 token.")
        if data.sharegpt_output_len is not None:
            problems.append("--sharegpt-output-len applies to the sharegpt dataset only.")
    if not 0.0 <= data.random_range_ratio <= 1.0:
        problems.append("The random range ratio must be between 0 and 1.")
    if not 0 <= data.seed <= MAX_SEED:  # LMDeploy's scripts seed NumPy with it too, which refuses others
        problems.append(f"The seed must be a whole number from 0 to {MAX_SEED}, not {data.seed}.")
    if load.load_pattern not in LOAD_PATTERNS:
        problems.append(f"Unknown load pattern '{load.load_pattern}'; choose {', '.join(LOAD_PATTERNS)}.")
    if load.load_pattern == "request_rate" and eng.backend != SERVER_BACKEND:
        problems.append("The request_rate load pattern sends requests over HTTP: choose the openai backend.")
    problems.extend(_request_rate_problems(load))
    problems.extend(generation_problems(config.generation))
    if load.concurrency < 1:
        problems.append("Concurrency must be at least 1.")
    for name, value in dataclasses.asdict(slo).items():
        if value is not None and not value > 0:
            problems.append(f"The {name.upper()} threshold must be a positive number of seconds.")
    if not config.percentiles or any(not 0 <= p <= 100 for p in config.percentiles):
        problems.append("Percentiles must be numbers between 0 and 100.")
    return problems


def _request_rate_problems(load: LoadConfig) -> list[str]:
    problems = []
    if not load.request_rate > 0:
        problems.append("The request rate must be above 0 requests/s (inf sends every request at once).")
    if not load.burstiness > 0:
        problems.append("Burstiness must be above 0 (1 is a Poisson process).")
    if load.max_concurrency is not None and load.max_concurrency < 1:
        problems.append("Max concurrency must be at least 1 (or unset).")
    if load.warmup_requests < 0:
        problems.append("Warm-up requests must be 0 or more.")
    if load.duration_s is not None and not load.duration_s > 0:
        problems.append("The duration must be above 0 seconds (or unset).")
    return problems


# Settings no engine can generate with: name, lowest, highest, whether the lowest is allowed, the rule in words.
# The first four are the ranges LMDeploy's GenerationConfig asserts (lmdeploy/messages.py, __post_init__).
_SAMPLING_LIMITS = (
    ("temperature", 0, 2, True, "between 0 and 2"),
    ("top_p", 0, 1, True, "between 0 and 1"),
    ("top_k", 0, math.inf, True, "0 (no limit) or more"),
    ("min_p", 0, 1, True, "between 0 and 1"),
    ("repetition_penalty", 0, math.inf, False, "above 0"),
    ("max_tokens", 1, math.inf, True, "at least 1"),
    ("max_completion_tokens", 1, math.inf, True, "at least 1"),
    ("max_new_tokens", 1, math.inf, True, "at least 1"),
)


def sampling_problems(values: dict[str, Any], where: str = "") -> list[str]:
    """One sentence per sampling setting among `values` (by name) outside the range any engine accepts."""
    problems = []
    for name, lowest, highest, lowest_allowed, rule in _SAMPLING_LIMITS:
        if name not in values:
            continue
        value = values[name]
        number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan
        if not lowest <= number <= highest or (number == lowest and not lowest_allowed):
            problems.append(f"{where}{name} must be {rule} (got {value!r}).")
    return problems


def generation_problems(generation: GenerationSettings) -> list[str]:
    """The run's sampling settings that cannot be right: outside LMDeploy's ranges (asserted whatever
    do_sample says), or sampling with nothing to sample from."""
    problems = sampling_problems(dataclasses.asdict(generation))
    if generation.do_sample and generation.temperature == 0:
        problems.append("Sampling needs a temperature above 0 (turn sampling off for greedy decoding).")
    if generation.do_sample and generation.top_p == 0:
        problems.append("Sampling needs a top_p above 0 (turn sampling off for greedy decoding).")
    return problems


def lmdeploy_hyperparams(config: RunConfig) -> list[tuple[str, Any]]:
    """The hyperparameter columns profile_pipeline_api.py writes before the Profiler's, in its order."""
    data = config.dataset
    return [
        ("backend", config.engine.backend),
        # LMDeploy's batch size; a request-rate run has none, only an optional cap on requests in flight.
        ("bs", config.load.max_concurrency if config.load.load_pattern == "request_rate" else config.load.concurrency),
        ("dataset_name", data.dataset_name),
        ("sharegpt_output_len", data.sharegpt_output_len),
        ("random_input_len", data.random_input_len),
        ("random_output_len", data.random_output_len),
        ("random_range_ratio", data.random_range_ratio),
        ("num_prompts", data.num_prompts),
    ]
