"""What LMDeploy's configs are built from the knobs, as benchmark/profile_pipeline_api.py builds them: the engine
config (max_batch_size is the concurrency), the speculative config, and one
`GenerationConfig(ignore_eos=True, do_sample=False, max_new_tokens=output_len)` per request plus the script's
top_p/top_k/temperature; the playground's chat config honours EOS and samples as asked. The engine_api load
pattern builds them as benchmark/profile_throughput.py does: TurboMind's max_batch_size is concurrency // dp,
enable_metrics keeps the configs' default (on: the PyTorch engine then reports speculative acceptance), and each
request's `GenerationConfig(max_new_tokens, temperature, top_p, top_k, ignore_eos=True)` hands the sampling
settings to the engine.

lmdeploy is imported inside the builders only: the keyword arguments are known without it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ..config import EngineConfig, GenerationSettings, LoadConfig, engine_config_fields
from ..errors import ConfigError
from ..load.datasets import SampledRequest
from ..states import LoadPattern

# What the script fixes whatever the knobs say (max_batch_size, the concurrency, comes from the load).
FIXED_FIELDS = {"turbomind": {"enable_metrics": False}, "pytorch": {"thread_safe": False}}


def engine_config_kwargs(engine: EngineConfig, load: LoadConfig) -> dict:
    """The keyword arguments of `engine.backend`'s engine config: each knob under the field its declaration names
    for that engine (the speculative knobs go to `build_speculative_config` instead)."""
    fields = {field: getattr(engine, knob) for knob, field in engine_config_fields(engine.backend).items()}
    if load.load_pattern == LoadPattern.ENGINE_API:
        turbomind = engine.backend == "turbomind"
        return {"max_batch_size": load.concurrency // engine.dp if turbomind else load.concurrency, **fields}
    return {"max_batch_size": load.concurrency, **fields, **FIXED_FIELDS[engine.backend]}


def build_engine_config(engine: EngineConfig, load: LoadConfig):
    """The TurbomindEngineConfig or PytorchEngineConfig profile_pipeline_api.py's main() builds.

    One addition: the PyTorch engine also gets `quant_policy` (the script passes it to TurboMind
    only, silently dropping a KV cache quantization the user asked for; profile_throughput.py and
    `lmdeploy serve` pass it to both). At the default 0 the two configs are identical.
    """
    from lmdeploy.messages import PytorchEngineConfig, TurbomindEngineConfig

    config_class = TurbomindEngineConfig if engine.backend == "turbomind" else PytorchEngineConfig
    return config_class(**engine_config_kwargs(engine, load))


def build_speculative_config(engine: EngineConfig):
    """LMDeploy's own `get_speculative_config`, fed our knobs under its argument names."""
    from types import SimpleNamespace

    from lmdeploy.cli.utils import get_speculative_config

    return get_speculative_config(
        SimpleNamespace(
            speculative_algorithm=engine.speculative_algorithm,
            speculative_draft_model=engine.speculative_draft_model,
            speculative_num_draft_tokens=engine.speculative_num_draft_tokens,
        )
    )


def build_generation_configs(
    requests: Sequence[SampledRequest], generation: GenerationSettings, return_routed_experts: bool
) -> list:
    """One GenerationConfig per request, as the script makes them: EOS ignored and greedy, whatever
    `generation.ignore_eos` and `generation.do_sample` say; LMDeploy then forces top_k=1."""
    return [
        _generation_config(
            generation,
            ignore_eos=True,
            do_sample=False,
            return_routed_experts=return_routed_experts,
            max_new_tokens=request.output_len,
        )
        for request in requests
    ]


def build_engine_api_generation_config(request: SampledRequest, generation: GenerationSettings):
    """profile_throughput.py's GenerationConfig for one request: EOS ignored, its output length, and the sampling
    settings for the engine itself (top_k 1 is greedy on both engines); without sampling, greedy."""
    top_k = generation.top_k if generation.do_sample else 1
    return _generation_config(
        dataclasses.replace(generation, top_k=top_k), max_new_tokens=request.output_len, ignore_eos=True
    )


def build_chat_generation_config(generation: GenerationSettings, max_new_tokens: int):
    """The playground's GenerationConfig: stops at EOS, samples when asked, special tokens left out of the text."""
    return _generation_config(
        generation,
        ignore_eos=False,
        do_sample=generation.do_sample,
        max_new_tokens=max_new_tokens,
        skip_special_tokens=True,
    )


def _generation_config(generation: GenerationSettings, **fields):
    from lmdeploy.messages import GenerationConfig

    try:
        return GenerationConfig(
            temperature=generation.temperature, top_p=generation.top_p, top_k=generation.top_k, **fields
        )
    except AssertionError as exc:  # GenerationConfig asserts its ranges without a message
        raise ConfigError(
            "LMDeploy rejects these sampling settings: --top-p must be within 0..1, --top-k at least 0 "
            f"and --temperature within 0..2 (got {generation.top_p}, {generation.top_k}, {generation.temperature})."
        ) from exc
