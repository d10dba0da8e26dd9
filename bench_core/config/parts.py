# Generated from bench_core/config/catalog.py by `python -m bench_core.config.generate_parts`. Do not edit:
# change the catalog and run it again (tests/test_config_parts.py fails while they disagree).
"""The parts of a RunConfig, one field per setting of the catalog (see run_config.py)."""

import math
from dataclasses import dataclass, field


@dataclass
class EngineConfig:
    """Everything that needs the engine to be (re)loaded when it changes. The API key lives only in memory: it never
    reaches config.json or the history.
    """

    backend: str = "transformers"
    model: str = "builtin:smollm2-135m"
    trust_remote_code: bool = False
    tp: int = 1
    cache_max_entry_count: float = 0.8
    session_len: int | None = None
    cache_block_seq_len: int = 64
    enable_prefix_caching: bool = False
    dp: int = 1
    ep: int = 1
    max_prefill_token_num: int = 8192
    cp: int = 1
    model_format: str = "hf"
    quant_policy: int = 0
    num_tokens_per_iter: int = 0
    max_prefill_iters: int = 1
    communicator: str = "nccl"
    async_: int = 1
    device: str = "cuda"
    eager_mode: bool = False
    enable_return_routed_experts: bool = False
    distributed_executor_backend: str | None = None
    dllm_block_length: int | None = None
    dllm_unmasking_strategy: str = "low_confidence_dynamic"
    dllm_denoising_steps: int | None = None
    dllm_confidence_threshold: float = 0.85
    speculative_algorithm: str | None = None
    speculative_draft_model: str | None = None
    speculative_num_draft_tokens: int = 1
    log_level: str = "WARNING"
    dtype: str = "auto"
    torch_device: str = "auto"
    decode_path: str = "auto"
    num_blocks: int | None = None
    max_batch_tokens: int = 1024
    base_url: str = ""
    api_key: str | None = field(default=None, repr=False)
    endpoint: str = "completions"
    server_kind: str = "auto"
    chat_limit_field: str = "max_completion_tokens"
    tokenizer: str = ""
    extra_request_body: str = ""
    server_settings: str = ""
    read_timeout_s: float = 300.0
    server_metrics: bool = True
    server_metrics_interval_s: float = 1.0
    proxy_env: bool = True
    ca_bundle: str = ""
    insecure: bool = False


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
    image_count: int = 1
    image_resolution: str = "1080p"
    image_format: str = "jpeg"
    image_content: str = "random"
    prefix_len: int = 256
    prefix_groups: int = 4
    suffix_len: int = 32
    prefix_share: float = 1.0
    prefix_order: str = "leaders-first"
    output_len: int = 128
    turns: int = 4
    multi_turn_answers: str = "model"
    think_time_s: float = 0.0
    trace_block_len: int = 512
    keep_outputs: bool = False
    drift_baseline: str = ""
    quality_set: str = ""


@dataclass
class LoadConfig:
    """How requests are offered to the engine (see README, "What is measured": timing semantics)."""

    load_pattern: str = "batch"
    concurrency: int = 256
    stream_output: bool = False
    request_rate: float = math.inf
    burstiness: float = 1.0
    exact_rate_arrivals: bool = False
    max_concurrency: int | None = None
    warmup_requests: int = 0
    cache_state: str = "auto"
    trace_speedup: float = 1.0
    duration_s: float | None = None
    allow_long_schedule: bool = False
    client_processes: int = 1
    skip_tokenize: bool = False
    skip_detokenize: bool = False
    cancel_rate: float = 0.0
    use_uvloop: bool = False
    window_warmup_s: float | None = None
    window_cooldown_s: float | None = None
    time_slice_s: float | None = None


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
