"""Every setting of a run, declared once (see settings.py for what a declaration holds and who reads it).

The order is the record's: each part's settings in the order of its history columns. Engine knobs carry
LMDeploy's names, defaults, groups and rules (its `ArgumentHelper` and the `__post_init__` checks of its engine
configs); a knob's `engine_fields` name the field of TurbomindEngineConfig / PytorchEngineConfig it feeds.
A backend named in `backends` is a name its module declares (the engines registry); a rule that needs the
machine (GPUs visible, compute capability) or several knobs at once lives with that backend's validation.
"""

from __future__ import annotations

import logging
import math

from ..states import LoadPattern
from .settings import MAX_WHOLE_NUMBER, Bounds, Part, Setting, Widget, by_name, part_settings

MAX_SEED = 2**32 - 1  # the largest seed NumPy takes
# The ranges of what a user types, beyond which no run could be meant (and a sample would not fit in memory):
MAX_TOKENS = 2**24  # a length, a context or a block in tokens: above any model's context window
MAX_PROMPTS = 1_000_000  # prompts in one run, requests in flight at once
MAX_REQUEST_RATE = 1_000_000.0  # requests per second, and a load a capacity search probes
MAX_CLIENT_PROCESSES = 1024
MAX_IMAGES = 64  # images in one request
MAX_IMAGE_SIDE = 8192  # pixels on either side of an image: 64 Mpixels, 192 MiB of RGB before encoding
DAY_S = 86_400.0
MAX_THINK_S = 3600.0  # between two turns of a conversation
# A schedule (a trace's, or the arrivals at a request rate) that sends its last request later than a day after
# the start asks to be confirmed (allow_long_schedule); none may be longer than MAX_SCHEDULE_S.
LONG_SCHEDULE_S = DAY_S
MAX_SCHEDULE_S = 30 * DAY_S
WARMUP_START = 2  # the dashboard's warm-up, on by default (README, "Warm-up"); LMDeploy's scripts warm up none
# LMDeploy's rule for random lengths (load.datasets.random_length_bounds), which vLLM's users read otherwise.
RANGE_RATIO_RULE = (
    "Each request's input and output lengths are drawn uniformly from [max(1, int(len x ratio)), len], "
    "as LMDeploy draws them: 0.0 gives 1..len, not fixed lengths (vLLM's reading); 1.0 gives fixed "
    "lengths."
)
# The shared-prefix order that shows what prefix caching does: a group's first prompt, then its followers.
LEADERS_FIRST = "leaders-first"
IMAGE_RESOLUTIONS = {"4k": (3840, 2160), "1080p": (1920, 1080), "720p": (1280, 720), "360p": (640, 360)}
MAX_TURNS = 8  # turns per multi-turn session; each turn's TTFT is a history column
LOAD_PATTERNS = tuple(LoadPattern)
CHAT_LIMIT_FIELDS = ("max_tokens", "max_completion_tokens", "both")
# cache_state: the prefix cache's state asked for at a run's start; a run records the one it got (CACHE_UNKNOWN
# where nothing could reset it).
CACHE_AUTO, CACHE_COLD, CACHE_WARM, CACHE_UNKNOWN = "auto", "cold", "warm", "unknown"
AUTO_SERVER_KIND = "auto"  # server_kind: detected from what the server says (engines/server_identity.py)
LMDEPLOY = ("turbomind", "pytorch")
LMDEPLOY_SPECULATIVE_METHODS = (None, "eagle", "eagle3", "deepseek_mtp", "hy3_mtp", "qwen3_5_mtp")
TURBOMIND, PYTORCH, TRANSFORMERS, SERVER = ("turbomind",), ("pytorch",), ("transformers",), ("openai",)
# LMDeploy's --log-level choices: the logging levels' names, with the REQUEST level (15, between DEBUG and INFO:
# request payloads) that lmdeploy.utils registers on import.
LOG_LEVELS = (*logging.getLevelNamesMapping(), "REQUEST")
QUANT_POLICIES = {"none": 0, "int4": 4, "int8": 8, "fp8": 16, "fp8_e4m3": 16, "fp8_e5m2": 17, "turbo_quant": 42}

# Engine knob groups, as LMDeploy's CLI groups them (sidebar expanders, CLI argument groups).
SHARED_GROUP = "Shared engine"
TURBOMIND_GROUP = "TurboMind engine"
PYTORCH_GROUP = "PyTorch engine"
SPECULATIVE_GROUP = "Speculative decoding"
TRANSFORMERS_GROUP = "Transformers engine"
SERVER_GROUP = "OpenAI-compatible server"


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


def image_size(text: str) -> tuple[int, int]:
    """(width, height) of profile_restful_api.py's --image-resolution: a preset (4k, 1080p, 720p, 360p) or a custom
    HEIGHTxWIDTH, as it reads it (1080x1920 is 1920 wide); ValueError for anything else."""
    preset = IMAGE_RESOLUTIONS.get(str(text).strip().lower())
    if preset is not None:
        return preset
    height, _, width = str(text).strip().lower().partition("x")
    if height.isdigit() and width.isdigit():
        if 1 <= int(height) <= MAX_IMAGE_SIDE and 1 <= int(width) <= MAX_IMAGE_SIDE:
            return int(width), int(height)
        raise ValueError(
            f"The image resolution {text} is too large to make: each side must be from 1 to {MAX_IMAGE_SIDE:,} "
            f"pixels (4k is 2160x3840)."
        )
    raise ValueError(
        f"Unsupported image resolution '{text}': choose 4k, 1080p, 720p, 360p or HEIGHTxWIDTH (e.g. 1080x1920)."
    )


def _image_resolution(text: str) -> str:
    image_size(text)
    return str(text).strip().lower()


def _count(
    name: str,
    default: int,
    label: str,
    unit: str,
    step: int,
    widget_label: str,
    **options,
) -> Setting:
    """A workload's sweepable whole number of at least 1 (a length in tokens, a number of groups)."""
    return Setting(
        name,
        Part.DATASET,
        int,
        default,
        per_dataset=True,
        label=label,
        unit=unit,
        sweepable=True,
        bounds=Bounds(low=1, high=MAX_TOKENS if unit == "tokens" else MAX_PROMPTS),
        widget=Widget(step=step),
        widget_label=widget_label,
        **options,
    )


def _knob(name: str, group: str, backends: tuple[str, ...], kind: type, default, help: str, **options) -> Setting:
    options.setdefault("widget", Widget(step=0.05, format="%.2f") if kind is float else Widget())
    return Setting(
        name, Part.ENGINE, kind, default, help=help, group=group, backends=backends, sweepable=True, **options
    )


def _both(field: str) -> dict[str, str]:
    """A knob both of LMDeploy's engine configs take under one name."""
    return {"turbomind": field, "pytorch": field}


ENGINE = (
    Setting(
        "backend",
        Part.ENGINE,
        str,
        "transformers",
        widget=None,
        cli_help="turbomind or pytorch (LMDeploy, NVIDIA GPU), or transformers (embedded, CPU or GPU)",
    ),
    Setting("model", Part.ENGINE, str, "builtin:smollm2-135m", widget=None),
    Setting(
        "trust_remote_code",
        Part.ENGINE,
        bool,
        False,
        widget_label="Trust remote code",
        help="Let the model's own code run (a server's: its tokenizer's).",
        cli_help="trust remote code when loading hf models",
    ),
    _knob(
        "tp",
        SHARED_GROUP,
        LMDEPLOY,
        int,
        1,
        "GPU number used in tensor parallelism.",
        rule="a power of 2, at most the GPUs present",
        bounds=Bounds(low=1),
        label="Tensor parallelism",
        unit="GPUs",
        engine_fields=_both("tp"),
    ),
    _knob(
        "cache_max_entry_count",
        SHARED_GROUP,
        LMDEPLOY,
        float,
        0.8,
        "Fraction of free GPU memory used for the KV cache.",
        rule="TurboMind: > 0; PyTorch: between 0 and 1, exclusive",
        bounds=Bounds(low=0.0, low_open=True, high=MAX_WHOLE_NUMBER),
        label="KV cache share of free GPU memory",
        unit="fraction",
        engine_fields=_both("cache_max_entry_count"),
    ),
    _knob(
        "session_len",
        SHARED_GROUP,
        LMDEPLOY,
        int,
        None,
        "Maximum session length in tokens; empty means the model's own limit.",
        optional=True,
        rule="> 0 when set",
        bounds=Bounds(low=1, high=MAX_TOKENS),
        label="Session length",
        unit="tokens",
        engine_fields=_both("session_len"),
    ),
    _knob(
        "cache_block_seq_len",
        SHARED_GROUP,
        (*LMDEPLOY, *TRANSFORMERS),
        int,
        64,
        "Tokens per KV cache block (PyTorch: block_size; transformers: page size).",
        rule="TurboMind: a multiple of 32 (compute capability >= 8.0) or 64; PyTorch: a power of 2, >= 16",
        bounds=Bounds(low=1, high=MAX_TOKENS),
        label="KV cache block length",
        unit="tokens",
        engine_fields={"turbomind": "cache_block_seq_len", "pytorch": "block_size"},
    ),
    # transformers' continuous batching shares the KV cache blocks of equal prompt prefixes (allow_block_sharing).
    _knob(
        "enable_prefix_caching",
        SHARED_GROUP,
        (*LMDEPLOY, *TRANSFORMERS),
        bool,
        False,
        "Reuse the KV cache of shared prompt prefixes.",
        rule="transformers: whole KV cache blocks only (cache_block_seq_len tokens each), never a prompt's last token",
        engine_fields=_both("enable_prefix_caching"),
    ),
    _knob(
        "dp",
        SHARED_GROUP,
        LMDEPLOY,
        int,
        1,
        "Data parallelism: engine replicas, each taking its share of the batch.",
        rule=">= 1; PyTorch: only with --tp or --ep above 1 (LMDeploy resets it to 1 otherwise)",
        bounds=Bounds(low=1),
        label="Data parallelism",
        unit="replicas",
        engine_fields=_both("dp"),
    ),
    _knob(
        "ep",
        SHARED_GROUP,
        LMDEPLOY,
        int,
        1,
        "Expert parallelism: GPUs the experts of a mixture-of-experts model are spread over.",
        rule=">= 1",
        bounds=Bounds(low=1),
        label="Expert parallelism",
        unit="GPUs",
        engine_fields=_both("ep"),
    ),
    _knob(
        "max_prefill_token_num",
        SHARED_GROUP,
        LMDEPLOY,
        int,
        8192,
        "Prompt tokens one prefill step takes at most; a longer prompt is prefilled in chunks.",
        rule=">= 0",
        bounds=Bounds(low=0, high=MAX_TOKENS),
        label="Max prefill tokens per step",
        unit="tokens",
        engine_fields=_both("max_prefill_token_num"),
    ),
    _knob(
        "cp",
        TURBOMIND_GROUP,
        TURBOMIND,
        int,
        1,
        "Context parallelism of attention: GPUs a sequence's attention is split over.",
        rule=">= 1; --tp must be a multiple of it",
        bounds=Bounds(low=1),
        label="Context parallelism",
        unit="GPUs",
        engine_fields={"turbomind": "cp"},
    ),
    _knob(
        "model_format",
        TURBOMIND_GROUP,
        TURBOMIND,
        str,
        "hf",
        "Format of the checkpoint; pass the real one for quantized models.",
        choices=("hf", "awq", "gptq", "compressed-tensors", "fp8", "mxfp4"),
        engine_fields={"turbomind": "model_format"},
    ),
    _knob(
        "quant_policy",
        TURBOMIND_GROUP,
        LMDEPLOY,
        int,
        0,
        "KV cache quantization: 0 none, 4 int4, 8 int8, 16 fp8, 17 fp8_e5m2, 42 turbo_quant.",
        choices=(0, 4, 8, 16, 17, 42),
        choice_message="{flag} must be one of {choices}; got {value}.",
        rule="TurboMind rejects 16 and 17",
        text_parser=parse_quant_policy,
        label="KV cache quantization policy",
        engine_fields=_both("quant_policy"),
    ),
    _knob(
        "num_tokens_per_iter",
        TURBOMIND_GROUP,
        TURBOMIND,
        int,
        0,
        "Tokens processed per forward pass (0: engine default).",
        rule=">= 0",
        bounds=Bounds(low=0, high=MAX_TOKENS),
        label="Tokens per forward pass",
        unit="tokens",
        engine_fields={"turbomind": "num_tokens_per_iter"},
    ),
    _knob(
        "max_prefill_iters",
        TURBOMIND_GROUP,
        TURBOMIND,
        int,
        1,
        "Forward passes a long prefill may be split into.",
        rule=">= 1",
        bounds=Bounds(low=1),
        label="Max prefill passes",
        unit="passes",
        engine_fields={"turbomind": "max_prefill_iters"},
    ),
    _knob(
        "communicator",
        TURBOMIND_GROUP,
        TURBOMIND,
        str,
        "nccl",
        "Communication backend for tensor parallelism.",
        choices=("nccl", "native", "cuda-ipc"),
        engine_fields={"turbomind": "communicator"},
    ),
    _knob(
        "async_",
        TURBOMIND_GROUP,
        TURBOMIND,
        int,
        1,
        "Run the engine asynchronously (1) or not (0).",
        choices=(0, 1),
        engine_fields={"turbomind": "async_"},
    ),
    _knob(
        "device",
        PYTORCH_GROUP,
        PYTORCH,
        str,
        "cuda",
        "Device type of the PyTorch engine.",
        choices=("cuda", "ascend", "maca", "camb"),
        engine_fields={"pytorch": "device_type"},
    ),
    _knob(
        "eager_mode",
        PYTORCH_GROUP,
        PYTORCH,
        bool,
        False,
        "Disable CUDA graphs (eager execution).",
        engine_fields={"pytorch": "eager_mode"},
    ),
    _knob(
        "enable_return_routed_experts",
        PYTORCH_GROUP,
        PYTORCH,
        bool,
        False,
        "Return routed experts of MoE models.",
        engine_fields={"pytorch": "enable_return_routed_experts"},
    ),
    _knob(
        "distributed_executor_backend",
        PYTORCH_GROUP,
        PYTORCH,
        str,
        None,
        "How the PyTorch engine runs its ranks: uni (one process), mp (processes) or ray; empty: LMDeploy chooses.",
        optional=True,
        choices=(None, "uni", "mp", "ray"),
        engine_fields={"pytorch": "distributed_executor_backend"},
    ),
    # Diffusion LLMs (block diffusion models such as SDAR): how a block of tokens is unmasked.
    _knob(
        "dllm_block_length",
        PYTORCH_GROUP,
        PYTORCH,
        int,
        None,
        "Block length of a diffusion LLM; empty: the model's.",
        optional=True,
        rule="> 0 when set; with -c, at most --max-prefill-token-num tokens",
        bounds=Bounds(low=1, high=MAX_TOKENS),
        label="Diffusion block length",
        unit="tokens",
        engine_fields={"pytorch": "dllm_block_length"},
    ),
    _knob(
        "dllm_unmasking_strategy",
        PYTORCH_GROUP,
        PYTORCH,
        str,
        "low_confidence_dynamic",
        "How a diffusion LLM unmasks the tokens of a block.",
        choices=("low_confidence_dynamic", "low_confidence_static", "sequential"),
        engine_fields={"pytorch": "dllm_unmasking_strategy"},
    ),
    _knob(
        "dllm_denoising_steps",
        PYTORCH_GROUP,
        PYTORCH,
        int,
        None,
        "Denoising steps per block of a diffusion LLM; empty: the model's.",
        optional=True,
        rule="> 0 when set",
        bounds=Bounds(low=1),
        label="Diffusion denoising steps",
        unit="steps",
        engine_fields={"pytorch": "dllm_denoising_steps"},
    ),
    _knob(
        "dllm_confidence_threshold",
        PYTORCH_GROUP,
        PYTORCH,
        float,
        0.85,
        "Confidence above which a diffusion LLM unmasks a token (low_confidence_dynamic).",
        rule="between 0 and 1",
        bounds=Bounds(low=0.0, high=1.0),
        label="Diffusion confidence threshold",
        engine_fields={"pytorch": "dllm_confidence_threshold"},
    ),
    # The speculative knobs go to LMDeploy's speculative config, not its engine config; the embedded engine drafts
    # by prompt lookup (n-grams of the prompt), which needs no draft model and runs on a CPU.
    _knob(
        "speculative_algorithm",
        SPECULATIVE_GROUP,
        (*LMDEPLOY, *TRANSFORMERS),
        str,
        None,
        "Speculative decoding method; empty means off. transformers: prompt_lookup, through generate() one "
        "request at a time.",
        optional=True,
        choices=(*LMDEPLOY_SPECULATIVE_METHODS, "prompt_lookup"),
        backend_choices={
            **dict.fromkeys(LMDEPLOY, LMDEPLOY_SPECULATIVE_METHODS),
            "transformers": (None, "prompt_lookup"),
        },
    ),
    _knob("speculative_draft_model", SPECULATIVE_GROUP, LMDEPLOY, str, None, "Path of the draft model.", optional=True),
    _knob(
        "speculative_num_draft_tokens",
        SPECULATIVE_GROUP,
        (*LMDEPLOY, *TRANSFORMERS),
        int,
        1,
        "Tokens the draft model proposes per step.",
        rule=">= 1",
        bounds=Bounds(low=1),
        label="Draft tokens per step",
        unit="tokens",
    ),
    # How a run is reported, not what it measures: every in-process backend takes the flag, LMDeploy heeds it.
    Setting(
        "log_level",
        Part.ENGINE,
        str,
        "WARNING",
        choices=LOG_LEVELS,
        compared=False,
        widget=None,
        cli_help="LMDeploy's log level",
    ),
    _knob(
        "dtype",
        SHARED_GROUP,
        (*LMDEPLOY, *TRANSFORMERS),
        str,
        "auto",
        "Weights dtype; auto: the checkpoint's own (LMDeploy: bfloat16 where supported, else float16; transformers on "
        "CPU: bfloat16 with native bf16, else float32). Quantized checkpoints keep theirs.",
        choices=("auto", "float32", "bfloat16", "float16"),
        choice_message="Unknown dtype '{value}'; choose one of {choices}.",
        backend_choices={backend: ("auto", "float16", "bfloat16") for backend in LMDEPLOY},
        engine_fields=_both("dtype"),
        rule="turbomind and pytorch: auto, float16 or bfloat16",
    ),
    _knob(
        "torch_device",
        TRANSFORMERS_GROUP,
        TRANSFORMERS,
        str,
        "auto",
        "Where the model runs; auto: CUDA when present, else CPU.",
        choices=("auto", "cpu", "cuda"),
        choice_message="Unknown torch device '{value}'; choose one of {choices}.",
    ),
    # Speculation runs through generate() (transformers drafts nowhere else); its fair baseline is the same path
    # with speculation off, not continuous batching (--against-no-speculation).
    _knob(
        "decode_path",
        TRANSFORMERS_GROUP,
        TRANSFORMERS,
        str,
        "auto",
        "How the engine decodes; auto: continuous batching where this transformers has it, generate() with "
        "speculation; generate: transformers' generate(), one request at a time, the path speculation takes.",
        choices=("auto", "generate"),
        label="Decode path",
    ),
    _knob(
        "num_blocks",
        TRANSFORMERS_GROUP,
        TRANSFORMERS,
        int,
        None,
        "KV cache blocks; empty sizes the cache for the batch.",
        optional=True,
        rule="> 0 when set",
        label="KV cache blocks",
        unit="blocks",
        bounds=Bounds(low=1, note="Leave it empty to size the cache for the batch."),
        widget=Widget(placeholder="empty: automatic"),
    ),
    _knob(
        "max_batch_tokens",
        TRANSFORMERS_GROUP,
        TRANSFORMERS,
        int,
        1024,
        "Tokens per continuous-batching step.",
        rule="> 0",
        bounds=Bounds(low=1, high=MAX_TOKENS),
        label="Tokens per batching step",
        unit="tokens",
    ),
    _knob(
        "base_url",
        SERVER_GROUP,
        SERVER,
        str,
        "",
        "Address of the server, with or without /v1.",
        rule="http:// or https://, e.g. http://127.0.0.1:23333",
    ),
    # A credential: it lives only in memory (None: $OPENAI_API_KEY, read when requests are sent).
    Setting("api_key", Part.ENGINE, str, None, optional=True, secret=True, compared=False, widget=None),
    _knob(
        "endpoint",
        SERVER_GROUP,
        SERVER,
        str,
        "completions",
        "completions: /v1/completions; chat: /v1/chat/completions; generate: SGLang's native /generate (its "
        "answers carry each request's speculative acceptance).",
        choices=("completions", "chat", "generate"),
    ),
    _knob(
        "server_kind",
        SERVER_GROUP,
        SERVER,
        str,
        AUTO_SERVER_KIND,
        "Which server it is, so ignore_eos is sent the way it accepts. auto: detected from its /v1/models answer "
        "and Server header (the run's notes say what was found); openai: any other, ignore_eos not sent.",
        choices=(AUTO_SERVER_KIND, "lmdeploy", "vllm", "sglang", "transformers", "openai"),
    ),
    # profile_restful_api.py asks a chat server for max_completion_tokens; some (llama.cpp's) heed only max_tokens.
    _knob(
        "chat_limit_field",
        SERVER_GROUP,
        SERVER,
        str,
        "max_completion_tokens",
        "The field of a chat request that limits its output tokens (the completions endpoint has only max_tokens).",
        choices=CHAT_LIMIT_FIELDS,
        rule="max_tokens, max_completion_tokens or both",
    ),
    _knob(
        "tokenizer",
        SERVER_GROUP,
        SERVER,
        str,
        "",
        "Tokenizer for sampling prompts and retokenizing answers; empty: the model's.",
    ),
    _knob(
        "extra_request_body",
        SERVER_GROUP,
        SERVER,
        str,
        "",
        'JSON object merged into every request body, last: it overrides any field sent (README, "The request '
        'body"), such as the temperature 0.0 sent when not sampling.',
        rule='a JSON object, e.g. {"temperature": 0}',
    ),
    # Not ours to set: the values `sweep restful --server-cmd` put into the server's command line, recorded so that a
    # run says which server it measured (run_diff, the compare table and a sweep's points read it).
    Setting(
        "server_settings",
        Part.ENGINE,
        str,
        "",
        backends=SERVER,
        group=SERVER_GROUP,
        widget=None,
        label="Server settings",
        help="The settings of the server's command line that `sweep restful --server-cmd` started it with, as a "
        "JSON object; empty for a server started elsewhere.",
    ),
    _knob(
        "read_timeout_s",
        SERVER_GROUP,
        SERVER,
        float,
        300.0,
        "Seconds a request may wait for its next token (the first included) before it fails with a read timeout; "
        "keep-alive comments do not count.",
        rule="> 0",
        bounds=Bounds(low=0.0, low_open=True, high=DAY_S),
        flags=("--timeout",),  # profile_restful_api.py's
    ),
    # How a server run is watched, not what it measures: its own Prometheus metrics, read beside ours.
    Setting(
        "server_metrics",
        Part.ENGINE,
        bool,
        True,
        group=SERVER_GROUP,
        backends=SERVER,
        compared=False,
        help="Read the server's Prometheus metrics (GET /metrics) during the run: running and waiting requests, "
        "KV-cache usage, prefix hits, server-side latencies.",
        flags=("--no-server-metrics",),
        widget_label="Read the server's /metrics",
        cli_help="do not read the server's Prometheus /metrics during the run",
    ),
    Setting(
        "server_metrics_interval_s",
        Part.ENGINE,
        float,
        1.0,
        group=SERVER_GROUP,
        backends=SERVER,
        compared=False,
        label="Server metrics interval",
        unit="s",
        rule="> 0",
        bounds=Bounds(low=0.0, low_open=True, high=3600.0),
        help="Seconds between two reads of the server's /metrics.",
        flags=("--server-metrics-interval",),
        widget=Widget(step=0.5),
        widget_label="Server metrics every (s)",
        cli_help="seconds between two reads of the server's Prometheus /metrics",
    ),
    # How the client reaches the server (bench_core/engines/http_stream.py's NetworkPolicy), for every request alike.
    Setting(
        "proxy_env",
        Part.ENGINE,
        bool,
        True,
        group=SERVER_GROUP,
        backends=SERVER,
        compared=False,
        label="Proxies from the environment",
        help="Reach the server through the proxy that http_proxy / https_proxy name (no_proxy excepted), as curl "
        "does; a server on this machine is always reached directly.",
        flags=("--no-proxy-env",),
        widget_label="Use the environment's proxy",
        cli_help="ignore http_proxy, https_proxy and no_proxy: connect to the server directly",
    ),
    Setting(
        "ca_bundle",
        Part.ENGINE,
        str,
        "",
        group=SERVER_GROUP,
        backends=SERVER,
        compared=False,
        label="CA bundle",
        help="A PEM file of the certificate authorities an https:// server is checked against, instead of the "
        "system's.",
        flags=("--ca-bundle",),
        widget_label="CA bundle (PEM file)",
        cli_help="a PEM file of the certificate authorities to check an https:// server against (default: the "
        "system's)",
    ),
    Setting(
        "insecure",
        Part.ENGINE,
        bool,
        False,
        group=SERVER_GROUP,
        backends=SERVER,
        compared=False,
        label="Skip TLS verification",
        help="Accept any certificate from an https:// server (a self-signed one): the connection is encrypted "
        "but not authenticated.",
        flags=("--insecure",),
        widget_label="Skip TLS certificate checks",
        cli_help="accept any certificate from an https:// server",
    ),
)

DATASET = (
    Setting("dataset", Part.DATASET, str, "builtin:sharegpt", widget=None),
    Setting(
        "dataset_name",
        Part.DATASET,
        str,
        "sharegpt",
        help="sharegpt: the conversations' own lengths; random: lengths you choose; shared-prefix: groups of prompts "
        "opening with one prefix; multi-turn: conversations whose every turn resends the ones before; trace: a "
        "Mooncake trace file replayed; custom: your JSON/JSONL prompts; image: random text with images "
        "(servers' chat endpoint).",
        widget=Widget(style="radio"),
        widget_label="Dataset",
        cli_help="sharegpt: real conversations; random: lengths drawn at random, text from the dataset; "
        "shared-prefix, multi-turn, trace, custom, image: see the README",
    ),
    Setting(
        "num_prompts",
        Part.DATASET,
        int,
        5000,
        label="Number of prompts",
        unit="prompts",
        sweepable=True,
        bounds=Bounds(low=1, high=MAX_PROMPTS),
        widget=Widget(step=1),
        widget_label="Number of prompts",
        flags=("-n", "--num-prompts"),
        cli_help="number of prompts to process",
    ),
    Setting(
        "seed",
        Part.DATASET,
        int,
        0,
        bounds=Bounds(low=0, high=MAX_SEED),
        widget=Widget(step=1),
        widget_label="Seed",
        cli_help="seed used in sampling prompts from the dataset",
    ),
    Setting(
        "sharegpt_output_len",
        Part.DATASET,
        int,
        None,
        optional=True,
        per_dataset=True,
        sweepable=True,
        label="ShareGPT output length",
        unit="tokens",
        bounds=Bounds(low=4, high=MAX_TOKENS, note="LMDeploy's least is 4."),
        help="--sharegpt-output-len: every request (every turn) generates this many tokens.",
        output_length=True,
        widget=Widget(step=1, placeholder="empty: each conversation's own"),
        widget_label="Fixed output length (tokens)",
        cli_help="fixed output length for every request, instead of the dataset's",
    ),
    Setting(
        "random_input_len",
        Part.DATASET,
        int,
        None,
        optional=True,
        per_dataset=True,
        sweepable=True,
        label="Random input length",
        unit="tokens",
        bounds=Bounds(low=1, high=MAX_TOKENS),
        widget=Widget(step=1, start=128),
        widget_label="Input length",
        cli_help="input tokens per request (random and image datasets)",
    ),
    Setting(
        "random_output_len",
        Part.DATASET,
        int,
        None,
        optional=True,
        per_dataset=True,
        sweepable=True,
        label="Random output length",
        unit="tokens",
        output_length=True,
        bounds=Bounds(low=1, high=MAX_TOKENS),
        widget=Widget(step=1, start=128),
        widget_label="Output length",
        cli_help="output tokens per request (random and image datasets)",
    ),
    Setting(
        "random_range_ratio",
        Part.DATASET,
        float,
        0.0,
        per_dataset=True,
        bounds=Bounds(low=0.0, high=1.0),
        help=RANGE_RATIO_RULE,
        widget=Widget(style="slider", step=0.05),
        widget_label="Range ratio",
        cli_help=f"{RANGE_RATIO_RULE} Random and image datasets.",
    ),
    # profile_restful_api.py's image dataset.
    Setting(
        "image_count",
        Part.DATASET,
        int,
        1,
        per_dataset=True,
        label="Images per request",
        unit="images",
        bounds=Bounds(low=1, high=MAX_IMAGES),
        widget=Widget(step=1),
        widget_label="Images per request",
        cli_help="number of images per request (only available with the image dataset)",
    ),
    Setting(
        "image_resolution",
        Part.DATASET,
        str,
        "1080p",
        per_dataset=True,
        text_parser=_image_resolution,
        label="Image resolution",
        rule="4k, 1080p, 720p, 360p or HEIGHTxWIDTH",
        widget_label="Image resolution",
        help="A preset (4k, 1080p, 720p, 360p) or HEIGHTxWIDTH, e.g. 1080x1920.",
        cli_help="resolution of images for the image dataset: 4k/1080p/720p/360p or custom 'heightxwidth' "
        "(e.g., 1080x1920)",
    ),
    Setting(
        "image_format",
        Part.DATASET,
        str,
        "jpeg",
        per_dataset=True,
        choices=("jpeg", "png"),
        label="Image format",
        widget_label="Image format",
        cli_help="format of images for the image dataset",
    ),
    Setting(
        "image_content",
        Part.DATASET,
        str,
        "random",
        per_dataset=True,
        choices=("random", "blank"),
        label="Image content",
        widget_label="Image content",
        help="random: noise pixels; blank: a white image.",
        cli_help="content of images for the image dataset: random pixels or blank (white)",
    ),
    # Shared prefixes (vLLM's prefix_repetition, SGLang's generated-shared-prefix).
    _count(
        "prefix_len",
        256,
        "Shared prefix length",
        "tokens",
        16,
        "Prefix length (tokens)",
        help="Tokens of ShareGPT text every prompt of a group opens with.",
        cli_help="tokens of the prefix the prompts of a group share (shared-prefix dataset)",
    ),
    _count(
        "prefix_groups",
        4,
        "Prefix groups",
        "prefixes",
        1,
        "Prefix groups",
        help="How many different prefixes the prompts share.",
        cli_help="number of different shared prefixes (shared-prefix dataset)",
    ),
    _count(
        "suffix_len",
        32,
        "Suffix length",
        "tokens",
        8,
        "Suffix length (tokens)",
        help="Tokens of each prompt's own text after its prefix.",
        cli_help="tokens of each prompt's own text after the prefix (shared-prefix dataset)",
    ),
    Setting(
        "prefix_share",
        Part.DATASET,
        float,
        1.0,
        per_dataset=True,
        label="Prefix reuse share",
        unit="fraction",
        sweepable=True,
        bounds=Bounds(low=0.0, high=1.0),
        widget=Widget(style="slider", step=0.05),
        widget_label="Share of prompts reusing a prefix",
        help="The share of prompts that open with their group's prefix; the others open with a prefix of their "
        "own of the same length, so 0 sends the same lengths with nothing to reuse.",
        cli_help="share of the prompts that reuse their group's prefix; the rest get a prefix of their own, same "
        "length (shared-prefix dataset)",
    ),
    Setting(
        "prefix_order",
        Part.DATASET,
        str,
        LEADERS_FIRST,
        per_dataset=True,
        choices=(LEADERS_FIRST, "interleaved", "grouped", "random"),
        label="Arrival order",
        widget_label="Arrival order",
        help="leaders-first: each group's first prompt goes first and the group's others once it has finished, so "
        "they find its prefix cached (a group whose first prompt fails sends no others); interleaved: one prompt "
        "of each group in turn; grouped: a group's prompts one after another; random: shuffled. The last three "
        "send every prompt as the load offers it, at once in a batch.",
        cli_help="the order prompts are sent in: leaders-first (the default: each group's first prompt, then its "
        "others once it has finished, so they find its prefix cached), interleaved (group after group, one each), "
        "grouped, or random (shared-prefix dataset)",
    ),
    _count(
        "output_len",
        128,
        "Output length",
        "tokens",
        8,
        "Output length (tokens)",
        help="Tokens each request generates (custom: those of records without output_len or max_tokens; a quality "
        "set's prompts too).",
        cli_help="output tokens per request (shared-prefix; custom: for records without output_len or max_tokens; "
        "--quality-set)",
        output_length=True,
    ),
    # Multi-turn sessions (vLLM's benchmarks/multi_turn, GuideLLM's turns).
    Setting(
        "turns",
        Part.DATASET,
        int,
        4,
        per_dataset=True,
        label="Turns per session",
        unit="turns",
        sweepable=True,
        bounds=Bounds(low=2, high=MAX_TURNS),
        widget=Widget(step=1),
        widget_label="Turns per session",
        help="User turns of each conversation sent; conversations with fewer are skipped. The number of prompts "
        "counts sessions.",
        cli_help=f"turns per session, 2 to {MAX_TURNS}: conversations with fewer are skipped, and -n counts "
        "sessions (multi-turn dataset)",
    ),
    Setting(
        "multi_turn_answers",
        Part.DATASET,
        str,
        "model",
        per_dataset=True,
        choices=("model", "dataset"),
        label="Previous answers",
        widget_label="Previous answers in each prompt",
        help="model: the answers the model gave in this run (each turn waits for the previous one); dataset: the "
        "conversation's own answers.",
        cli_help="the answers a turn's prompt repeats: the model's own from this run, or the dataset's "
        "(multi-turn dataset)",
    ),
    Setting(
        "think_time_s",
        Part.DATASET,
        float,
        0.0,
        per_dataset=True,
        label="Think time",
        unit="s",
        sweepable=True,
        bounds=Bounds(low=0.0, high=MAX_THINK_S),
        widget=Widget(step=0.5, format="%.2f"),
        widget_label="Think time between turns (s)",
        help="How long a user waits after an answer before sending the next turn.",
        flags=("--think-time",),
        cli_help="seconds between an answer and the session's next turn (multi-turn dataset)",
    ),
    # Mooncake traces.
    Setting(
        "trace_block_len",
        Part.DATASET,
        int,
        512,
        per_dataset=True,
        label="Trace block length",
        unit="tokens",
        bounds=Bounds(low=1, high=MAX_TOKENS),
        widget=Widget(step=64),
        widget_label="Tokens per hash id",
        help="Tokens one hash id of the trace stands for (Mooncake's traces: 512).",
        cli_help="tokens each hash id stands for; equal ids give identical blocks (trace dataset; Mooncake: 512)",
    ),
    # The quality guard (measure/quality.py): the answers kept, compared with a baseline's, scored against references.
    Setting(
        "keep_outputs",
        Part.DATASET,
        bool,
        False,
        compared=False,
        widget=Widget(),
        widget_label="Keep the answers",
        help="Keep every answer's token ids and text in the run's request table (requests.parquet), so that a "
        "later run can be checked against this one's answers; a drift baseline or a quality set keeps them anyway.",
        cli_help="keep every answer's token ids and text in the run's request table (a drift baseline for later runs)",
    ),
    Setting(
        "drift_baseline",
        Part.DATASET,
        str,
        "",
        compared=False,
        widget=Widget(),
        widget_label="Drift baseline run",
        help="A run id whose kept answers to the same prompts this run's are compared with, request by request "
        "(drift metrics); both greedy (temperature 0 or no sampling), so a difference is the engine's.",
        cli_help="RUN_ID of a run with kept answers to the same prompts, greedy: this run's drift from it",
    ),
    Setting(
        "quality_set",
        Part.DATASET,
        str,
        "",
        widget=Widget(placeholder="builtin:quality or /path/to/set.jsonl"),
        widget_label="Quality set",
        help="A JSONL file of {prompt, reference, scorer} records (scorer: exact, contains, regex or number): its "
        "prompts are the run's, its references score the answers (accuracy).",
        cli_help="JSONL of prompt, reference and scorer (exact, contains, regex, number) records: the run's prompts, "
        "its accuracy; builtin:quality for the bundled set",
    ),
)

# Where a concurrency bounds what is in flight; where requests come at a rate; where workers drive the engine API.
AT_ONCE = (LoadPattern.BATCH, LoadPattern.CONCURRENCY, LoadPattern.ENGINE_API)
BY_RATE, BY_ENGINE_API = (LoadPattern.REQUEST_RATE,), (LoadPattern.ENGINE_API,)
# A trace's timestamps say when each request goes; concurrency is then the most in flight (an engine's batch).
CAPPED = (*AT_ONCE, LoadPattern.TRACE)

LOAD = (
    Setting(
        "load_pattern",
        Part.LOAD,
        str,
        "batch",
        choices=LOAD_PATTERNS,
        choice_help={
            LoadPattern.BATCH: "LMDeploy's profile_pipeline_api.py: every prompt is submitted at once and concurrency bounds "
            "the batch, so TTFT includes queueing.",
            LoadPattern.CONCURRENCY: "profile_throughput.py's N workers through the pipeline API: a request's clock starts "
            "when a worker picks it up; tokenizing and detokenizing are the pipeline's.",
            LoadPattern.ENGINE_API: "profile_throughput.py itself: N workers on the engine's instance API; a request's "
            "clock starts when a worker picks it up, then it is tokenized (or its ids go in "
            "with skip tokenize), and its output is detokenized unless skipped.",
            LoadPattern.REQUEST_RATE: "profile_restful_api.py / vLLM: requests arrive at a rate (Poisson, or gamma with a "
            "burstiness factor), optionally capped by a max concurrency; a request's clock starts "
            "when it is sent.",
            LoadPattern.TRACE: "A trace replayed (the trace dataset): each request goes at its timestamp, divided "
            "by the speed-up, at most concurrency at once; its clock starts when it is sent.",
        },
        choice_labels={
            LoadPattern.BATCH: "pipeline batch",
            LoadPattern.CONCURRENCY: "pipeline concurrency",
            LoadPattern.ENGINE_API: "engine API",
            LoadPattern.REQUEST_RATE: "request rate",
            LoadPattern.TRACE: "trace replay",
        },
        choice_message="Unknown load pattern '{value}'; choose {choices}.",
        widget=None,
        flags=("--load",),
        cli_help="batch: every request starts at t0 and waits for a slot (LMDeploy's pipeline); concurrency: a "
        "request starts when a worker picks it up (profile_throughput.py); request_rate: requests arrive "
        "at --request-rate, open loop; trace: each request starts at its trace timestamp (--dataset-name "
        "trace); None: request_rate where --request-rate is given, else batch",
    ),
    Setting(
        "concurrency",
        Part.LOAD,
        int,
        256,
        load_patterns=CAPPED,
        label="Concurrency",
        unit="requests",
        sweepable=True,
        bounds=Bounds(low=1, high=MAX_PROMPTS),
        help="Requests in flight at once; LMDeploy's engines take it as max_batch_size.",
        widget=Widget(step=1),
        widget_label="Concurrency",
        flags=("-c", "--concurrency"),
        cli_help="requests in flight at once; LMDeploy's engines also take it as max_batch_size",
    ),
    Setting(
        "stream_output",
        Part.LOAD,
        bool,
        False,
        help="Needed for TTFT, ITL and tokens per tick.",
        widget_label="Stream output",
        cli_help="stream tokens (needed for TTFT, ITL and tokens-per-tick statistics)",
    ),
    # The request_rate pattern (servers and the embedded engine): vLLM's arrival process and limits.
    Setting(
        "request_rate",
        Part.LOAD,
        float,
        math.inf,
        load_patterns=BY_RATE,
        label="Request rate",
        unit="req/s",
        sweepable=True,
        allow_inf=True,  # inf sends every request at once
        bounds=Bounds(low=0.0, low_open=True, high=MAX_REQUEST_RATE, note="inf sends every request at once."),
        widget=Widget(step=1.0, placeholder="empty: inf, every request at once"),
        widget_label="Request rate (req/s)",
        cli_help="requests per second; inf sends every request at once, otherwise Poisson (see --burstiness)",
    ),
    Setting(
        "burstiness",
        Part.LOAD,
        float,
        1.0,
        load_patterns=BY_RATE,
        label="Burstiness",
        unit="gamma shape",
        allow_inf=True,  # inf: every gap the same, a constant rate
        bounds=Bounds(low=0.0, low_open=True, high=1000.0, note="1 is a Poisson process."),
        help="Gamma shape of the gaps between requests: 1 is Poisson, below 1 burstier, above 1 more regular.",
        widget=Widget(step=0.1),
        widget_label="Burstiness",
        cli_help="gamma shape of the arrival gaps (vLLM): 1 Poisson, below 1 burstier, above 1 more regular",
    ),
    # Arrivals are drawn as profile_restful_api.py draws them from the dataset's seed; this rescales the gaps so
    # the schedule offers exactly the requested rate (vLLM's conditioned Poisson process).
    Setting(
        "exact_rate_arrivals",
        Part.LOAD,
        bool,
        False,
        load_patterns=BY_RATE,
        help="Rescale the drawn gaps so the requests take exactly (N - 1) / rate seconds (vLLM). Unchecked: drawn "
        "from the seed as LMDeploy's profile_restful_api.py draws them.",
        widget_label="Exact-rate arrivals",
        cli_help="rescale the drawn gaps so the schedule offers exactly --request-rate (vLLM); default: drawn from "
        "--seed as profile_restful_api.py draws them",
    ),
    Setting(
        "max_concurrency",
        Part.LOAD,
        int,
        None,
        optional=True,
        load_patterns=BY_RATE,
        label="Max concurrency",
        unit="requests",
        bounds=Bounds(low=1, high=MAX_PROMPTS),
        widget=Widget(step=1, placeholder="empty: no limit"),
        widget_label="Max concurrency (requests)",
        cli_help="most requests in flight at once (vLLM); default: no limit",
        sweepable=True,
    ),
    # Every pattern warms up after the engine loads and before the clock starts (Engine.warmup).
    Setting(
        "warmup_requests",
        Part.LOAD,
        int,
        0,
        label="Warm-up requests",
        unit="requests",
        widget_label="Warm up before measuring",
        bounds=Bounds(low=0, high=MAX_PROMPTS),
        help="Requests sent after the engine loads and before the clock starts, not measured: the first N prompts "
        "(a server: the first prompt N times, as vLLM).",
        widget=Widget(style="switch", step=1, start=WARMUP_START),
        cli_help="unmeasured warm-up requests (the first N prompts), run after the engine loads and before the "
        "clock starts; 0: none, as LMDeploy's scripts",
    ),
    # What the prefix cache holds when the clock starts. An engine is reused between runs while its settings stay,
    # and a server keeps its cache, so without a reset a run can start with an earlier run's prefixes cached
    # (engines/base.py's Engine.reset_prefix_cache; the runner records the state it started with, cache_start).
    Setting(
        "cache_state",
        Part.LOAD,
        str,
        CACHE_AUTO,
        choices=(CACHE_AUTO, CACHE_COLD, CACHE_WARM),
        choice_help={
            CACHE_AUTO: "cold where the engine's prefix caching is on, else warm.",
            CACHE_COLD: "drop the prefix cache after the warm-up, before the clock starts: a server's reset "
            "endpoint (vLLM, SGLang), an in-process engine reloaded where it has no reset; where nothing can, "
            "the run says its state is unknown.",
            CACHE_WARM: "keep whatever earlier runs left cached, as before this setting existed.",
        },
        label="Cache state asked",
        sweepable=True,
        help="What the prefix cache holds when measuring starts. cold: dropped first (a server's reset endpoint, "
        "or the engine reloaded); warm: what earlier runs left; auto: cold where prefix caching is on. Each run "
        "records the state it started with.",
        widget_label="Prefix cache before measuring",
        cli_help="the prefix cache when the clock starts: cold drops it first (vLLM's /reset_prefix_cache, "
        "SGLang's /flush_cache, an in-process engine reloaded), warm keeps what earlier runs left, auto (the "
        "default) is cold where --enable-prefix-caching is on",
    ),
    Setting(
        "trace_speedup",
        Part.LOAD,
        float,
        1.0,
        load_patterns=(LoadPattern.TRACE,),
        label="Trace speed-up",
        unit="x",
        sweepable=True,
        bounds=Bounds(low=0.0, low_open=True, high=1e6),
        widget=Widget(step=0.5, format="%.2f"),
        widget_label="Trace speed-up (x)",
        help="The trace's timestamps are divided by this: 2 replays it twice as fast; 1 keeps its schedule.",
        cli_help="divide the trace's timestamps by this (2: twice as fast); 1 keeps the trace's schedule",
    ),
    # A time limit: it ends the run (requests in flight are cancelled); None sends every request. Not compared:
    # the history's duration_s column holds the benchmark's measured duration.
    Setting(
        "duration_s",
        Part.LOAD,
        float,
        None,
        optional=True,
        load_patterns=BY_RATE,
        backends=("openai",),
        compared=False,
        bounds=Bounds(low=0.0, low_open=True, high=MAX_SCHEDULE_S),
        help="End the run after this long: requests not sent stay unfinished, those in flight are cancelled.",
        widget=Widget(step=10.0, placeholder="empty: send every prompt"),
        widget_label="Duration (s)",
        flags=("--duration",),
        cli_help="end the run after this many seconds: unsent requests stay unfinished, "
        "those in flight are cancelled; a warm-up request waits no longer than "
        "this for a token",
    ),
    # A schedule that sends its last request more than a day after the start is refused unless confirmed: a rate or
    # a trace typed in the wrong unit would otherwise hold the run (and a sweep) for days without a word.
    Setting(
        "allow_long_schedule",
        Part.LOAD,
        bool,
        False,
        load_patterns=(LoadPattern.REQUEST_RATE, LoadPattern.TRACE),
        compared=False,
        help=f"Run a schedule that sends its last request more than a day after the start (at most "
        f"{MAX_SCHEDULE_S / DAY_S:.0f} days): a low request rate over many prompts, or a long trace.",
        widget_label="Allow a schedule longer than a day",
        cli_help="run a schedule that sends its last request more than a day after the start (a low request rate "
        f"over many prompts, a long trace); at most {MAX_SCHEDULE_S / DAY_S:.0f} days",
    ),
    # One asyncio process saturates near 80k events/s on one core; more processes split the requests of one
    # schedule (engines/client_workers.py). 1 is the one-process client, unchanged.
    Setting(
        "client_processes",
        Part.LOAD,
        int,
        1,
        backends=("openai",),
        label="Client processes",
        unit="processes",
        bounds=Bounds(low=1, high=MAX_CLIENT_PROCESSES),
        help="Send the requests from this many processes, each with its own event loop and connections, on one "
        "arrival schedule drawn from the seed; a max concurrency is split between them. For a server that "
        "answers faster than one client process can read.",
        widget=Widget(step=1),
        widget_label="Client processes",
        cli_help="send from this many worker processes, each with its own event loop and connection pool, on "
        "one arrival schedule from --seed (--max-concurrency is split between them)",
    ),
    # What profile_throughput.py's workers do around each request, on the engine API.
    Setting(
        "skip_tokenize",
        Part.LOAD,
        bool,
        False,
        load_patterns=BY_ENGINE_API,
        help="Encode the prompts before the clock starts, so token ids go in and tokenizing is not measured.",
        widget_label="Skip tokenize (token ids in)",
        cli_help="pre-tokenize the prompts before the clock starts: token ids go in",
    ),
    Setting(
        "skip_detokenize",
        Part.LOAD,
        bool,
        False,
        load_patterns=BY_ENGINE_API,
        help="Leave the output as token ids: nothing is detokenized while measuring.",
        widget_label="Skip detokenize (no text out)",
        cli_help="skip detokenizing the output tokens",
    ),
    Setting(
        "cancel_rate",
        Part.LOAD,
        float,
        0.0,
        load_patterns=BY_ENGINE_API,
        label="Cancel rate",
        unit="fraction",
        bounds=Bounds(low=0.0, high=1.0),
        help="The share of requests, drawn from the seed as profile_throughput.py draws it, cancelled part way "
        "through; counted as cancelled, not failed.",
        widget=Widget(style="slider", step=0.05),
        widget_label="Cancel rate",
        cli_help="probability that a request is cancelled mid-generation, drawn from --seed as "
        "profile_throughput.py draws it; such requests count as cancelled, not failed",
    ),
    Setting(
        "use_uvloop",
        Part.LOAD,
        bool,
        False,
        load_patterns=BY_ENGINE_API,
        help="Run the workers on uvloop's event loop instead of asyncio's (needs the uvloop package).",
        widget_label="uvloop event loop",
        cli_help="run the workers on uvloop's event loop (pip install uvloop)",
    ),
    # The steady window's edges where the user sets them (measure/window.py); unset, they are found from the
    # requests in flight. They change the steady-window metrics only, never the whole run's.
    Setting(
        "window_warmup_s",
        Part.LOAD,
        float,
        None,
        optional=True,
        label="Steady window warm-up",
        unit="s",
        bounds=Bounds(low=0.0, high=MAX_SCHEDULE_S),
        help="Start the steady window this many seconds after the run's start; empty: when the requests in flight "
        "first reach their target (the concurrency; at a rate or a trace, their mean).",
        widget=Widget(step=1.0, placeholder="empty: when the load reaches its target"),
        widget_label="Steady window from (s)",
        flags=("--warmup-seconds",),
        cli_help="start the steady window this many seconds into the run; default: when the requests in flight "
        "first reach their target (the concurrency; at a rate or a trace, their mean)",
    ),
    Setting(
        "window_cooldown_s",
        Part.LOAD,
        float,
        None,
        optional=True,
        label="Steady window cool-down",
        unit="s",
        bounds=Bounds(low=0.0, high=MAX_SCHEDULE_S),
        help="End the steady window this many seconds before the run's end; empty: at the last request sent.",
        widget=Widget(step=1.0, placeholder="empty: at the last request sent"),
        widget_label="Steady window cool-down (s)",
        flags=("--cooldown-seconds",),
        cli_help="end the steady window this many seconds before the run's end; default: at the last request sent",
    ),
    Setting(
        "time_slice_s",
        Part.LOAD,
        float,
        None,
        optional=True,
        label="Time slice",
        unit="s",
        bounds=Bounds(low=0.0, low_open=True, high=MAX_SCHEDULE_S),
        help="Report the run's throughput and TTFT per slice of this many seconds; empty: no slices.",
        widget=Widget(step=1.0, placeholder="empty: no slices"),
        widget_label="Time slices of (s)",
        flags=("--time-slice",),
        cli_help="report throughput and TTFT per slice of this many seconds of the run",
    ),
)

# Sampling settings. LMDeploy's pipeline script forces greedy decoding whatever these say; their ranges are the ones
# LMDeploy's GenerationConfig asserts (lmdeploy/messages.py, __post_init__), checked with validation.sampling_problems.
GENERATION = (
    Setting(
        "ignore_eos",
        Part.GENERATION,
        bool,
        True,
        help="Generate exactly the requested number of tokens.",
        widget_label="Ignore EOS",
    ),
    Setting("do_sample", Part.GENERATION, bool, False, widget_label="Sample"),
    Setting(
        "temperature",
        Part.GENERATION,
        float,
        0.8,
        rule="between 0 and 2",
        bounds=Bounds(low=0, high=2),
        widget=Widget(step=0.1),
        widget_label="Temperature",
        flags=("-temp", "--temperature"),
        cli_help="sampling temperature (LMDeploy's engines decode greedily)",
    ),
    Setting(
        "top_p",
        Part.GENERATION,
        float,
        0.8,
        rule="between 0 and 1",
        bounds=Bounds(low=0, high=1),
        widget=Widget(step=0.05),
        widget_label="Top p",
        cli_help="top-p sampling (LMDeploy's engines decode greedily)",
    ),
    Setting(
        "top_k",
        Part.GENERATION,
        int,
        1,
        rule="0 (no limit) or more",
        bounds=Bounds(low=0, note="0 is no limit."),
        widget=Widget(step=1),
        widget_label="Top k",
        cli_help="top-k sampling (LMDeploy's engines decode greedily)",
    ),
)


def _slo(name: str, label: str) -> Setting:
    return Setting(
        name,
        Part.SLO,
        float,
        None,
        optional=True,
        label=f"SLO on {label}",
        unit="s",
        history_key=f"slo_{name}_s",
        typed_scale=0.001,
        flags=(f"--slo-{name}-ms",),
        cli_help=f"goodput threshold on {name.upper()} in ms; a request is good when it meets all set",
        bounds=Bounds(low=0.0, low_open=True, high=DAY_S),
        widget=Widget(step=10.0, placeholder="not set", key=f"slo_{name}_ms"),
        widget_label=f"{name.upper()} at most (ms)",
    )


# Optional service-level thresholds in seconds (typed in ms); a request is good when it meets all that are set.
SLO_SETTINGS = (_slo("ttft", "TTFT"), _slo("tpot", "TPOT"), _slo("e2e", "end-to-end latency"))


def _sweep(name: str, kind: type, default, bounds: Bounds | None, cli_help: str, **options) -> Setting:
    """A sweep's own setting; its widget, where it has one, is the Sweep page's (the sidebar draws none)."""
    options.setdefault("widget", None)
    return Setting(name, Part.SWEEP, kind, default, bounds=bounds, cli_help=cli_help, **options)


# How a sweep runs its points and searches for a capacity (`sweep`'s own flags): not a part of a run.
SWEEP_SETTINGS = (
    _sweep(
        "repeats",
        int,
        1,
        Bounds(low=1, high=1000),
        "runs per point (2 or more give a spread); with --target-moe, the fewest (3 at least: a 95% interval needs 3)",
    ),
    # Repeats until the answer is clear (GuideLLM's target_moe): a point runs again until the 95% interval of its
    # mean is within this fraction of the mean, or --max-repeats stops it.
    _sweep(
        "target_moe",
        float,
        None,
        Bounds(low=0.0, low_open=True, high=1.0),
        "repeat each point until the 95% interval of its mean --target-moe-metric is within this fraction of the "
        "mean (0.05: +/-5%), or --max-repeats stops it",
        optional=True,
        label="Target margin of error",
        unit="fraction",
        widget=Widget(step=0.01, placeholder="none: --repeats runs per point"),
    ),
    _sweep(
        "max_repeats",
        int,
        10,
        Bounds(low=1, high=1000),
        "with --target-moe: the most runs a point gets before the sweep stops repeating it, its target not reached",
        label="Runs per point at most",
    ),
    # Output throughput by default: every run measures it (streamed or not, on every backend), it is the figure a
    # tuning decision is judged by first, and a whole run's aggregate, whose run-to-run spread is what repeats reduce.
    _sweep(
        "target_moe_metric",
        str,
        "output_throughput",
        None,
        "with --target-moe: the metric whose margin of error decides the repeats (a sweep metric's history column)",
        label="Metric of the target",
    ),
    _sweep(
        "server_start_timeout_s",
        float,
        600.0,  # a large model's first load (weights from disk, kernels compiled) takes minutes
        Bounds(low=0.0, low_open=True, high=DAY_S),
        "seconds a started server has to answer GET /v1/models before its run fails",
        flags=("--server-start-timeout",),
        label="Server start timeout",
        unit="s",
        widget=Widget(step=30.0, format="%.0f"),
    ),
    _sweep(
        "goodput_target",
        float,
        0.9,
        Bounds(low=0.0, low_open=True, high=1.0),
        "with --find-max: the fraction of requests that must meet every --slo-* threshold",
        label="Goodput target",
        unit="fraction",
        widget=Widget(step=0.05),
    ),
    # A load the search probes: a request rate or a concurrency.
    _sweep(
        "find_max_start",
        float,
        None,
        Bounds(low=0.001, high=MAX_REQUEST_RATE),
        "with --find-max: the first load probed; default 1 (req/s or requests in flight)",
        optional=True,
        label="First load probed",
        widget=Widget(step=1.0),
    ),
    _sweep(
        "find_max_precision",
        float,
        0.1,
        Bounds(low=0.001, high=1.0),
        "with --find-max: stop once the highest load meeting the target and the lowest missing it are this close, "
        "relative to the first (0.1: within 10%); a concurrency also stops at neighbouring whole numbers",
        label="Precision",
        unit="fraction",
        widget=Widget(step=0.05),
    ),
    _sweep(
        "find_max_limit",
        float,
        None,
        Bounds(low=0.001, high=MAX_REQUEST_RATE),
        "with --find-max: the highest load probed; default --num-prompts for max_concurrency, 1024 x the start "
        "for request_rate",
        optional=True,
        label="Highest load probed",
        widget=Widget(step=1.0),
    ),
    # A budget that ends a search nothing else would. 40 probes: from the default start to its default limit a search
    # doubles 11 times and bisects 4 times to within 10%, which leaves room for a finer precision or a longer range.
    _sweep(
        "find_max_probes",
        int,
        40,
        Bounds(low=1, high=1000),
        "with --find-max: the most probes a point's search runs before it stops where it is",
        label="Most probes",
    ),
    # A backstop, not a pace: one probe of 1,000 requests at 1 req/s takes 17 minutes, a whole search hours.
    _sweep(
        "find_max_time_s",
        float,
        DAY_S,
        Bounds(low=0.0, low_open=True, high=7 * DAY_S),
        "with --find-max: the seconds a point's search may take; the probe under way then is stopped",
        flags=("--find-max-time",),
        label="Time budget",
        unit="s",
        widget=Widget(step=60.0, format="%.0f"),
    ),
    _sweep(
        "cpus_per_point",
        int,
        1,
        Bounds(low=1, high=1024),
        "with --ray-address: CPU cores each point holds alone (GPU points also hold their engine's GPUs, tp of them)",
    ),
    _sweep(
        "retries",
        int,
        0,
        Bounds(low=0, high=100),
        "with --ray-address: run a point again, up to N times, when its worker died",
    ),
)

SETTINGS: tuple[Setting, ...] = (*ENGINE, *DATASET, *LOAD, *GENERATION, *SLO_SETTINGS)
BY_NAME = by_name(SETTINGS)
SWEEP_BY_NAME = by_name(SWEEP_SETTINGS)
BY_KEY = {setting.key: setting for setting in SETTINGS}
KNOBS: tuple[Setting, ...] = tuple(setting for setting in ENGINE if setting.is_knob)
# The settings a sweep may vary, as a user reaches for them: the engine's knobs, the load, the dataset's sizes.
SWEEPABLE: tuple[str, ...] = tuple(setting.name for setting in (*KNOBS, *LOAD, *DATASET) if setting.sweepable)


def setting(name: str) -> Setting:
    """The setting called `name` (a run's, else a sweep's); KeyError for a name no declaration has."""
    return BY_NAME[name] if name in BY_NAME else SWEEP_BY_NAME[name]


# The settings that fix how many tokens a request generates: a dataset names one of them at most as its
# `output_length` (a trace's records carry their own lengths).
OUTPUT_LENGTHS: tuple[Setting, ...] = tuple(setting for setting in DATASET if setting.output_length)


def of_part(part: Part) -> tuple[Setting, ...]:
    return part_settings((*SETTINGS, *SWEEP_SETTINGS), part)


def knobs_for(backend: str) -> tuple[Setting, ...]:
    return tuple(knob for knob in KNOBS if knob.applies(backend=backend))


def engine_config_fields(backend: str) -> dict[str, str]:
    """Knob name -> the field of `backend`'s own engine config it feeds (LMDeploy's TurbomindEngineConfig or
    PytorchEngineConfig), for the knobs that backend's config takes."""
    return {knob.name: knob.engine_fields[backend] for knob in KNOBS if backend in knob.engine_fields}
