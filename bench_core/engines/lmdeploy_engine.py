"""The LMDeploy backend, `turbomind` and `pytorch`: whether LMDeploy can run here, LMDeploy's rules for the
knobs, and which settings a built pipeline can be reused for; none of that needs lmdeploy or a GPU.

The configs handed to LMDeploy are built in lmdeploy_configs.py, and the pipeline is built and driven in
lmdeploy_pipeline.py. None of these modules imports lmdeploy or torch at module level: validation works
without them.
"""

from __future__ import annotations

import functools
import importlib.util

from ..config import DatasetConfig, EngineConfig, LoadConfig, knobs_for, setting
from ..models.resolve import last_line
from .base import Backend, RunSize
from .gpu_probe import gpu_facts
from .lmdeploy_pipeline import LMDeployEngine, build_engine

TURBOMIND_FP8_POLICIES = (16, 17)
# Eagle heads are separate checkpoints; the MTP methods draft with the target model's own layers.
DRAFT_MODEL_METHODS = ("eagle", "eagle3")
INSTALL_HINT = "install requirements-gpu.txt in its own environment (see README, 'GPU install')"


class LMDeployBackend(Backend):
    """LMDeploy's two engines, one backend name each. Nothing here needs lmdeploy or a GPU but `load`."""

    names = ("turbomind", "pytorch")
    order = 0
    takes_images = True  # a vision-language model's pipeline (LMDeploy refuses images for a text-only one)
    # LMDeploy's scripts' own sizes: the run a GPU user compares with theirs.
    run_size = RunSize("lmdeploy", num_prompts=DatasetConfig.num_prompts, concurrency=LoadConfig.concurrency,
                       stream_output=LoadConfig.stream_output, sharegpt_output_len=DatasetConfig.sharegpt_output_len)

    @classmethod
    def gpus(cls, engine: EngineConfig) -> int:
        return engine.tp  # one per tensor-parallel rank

    @classmethod
    def context_window(cls, engine: EngineConfig) -> int | None:
        """session_len when set: the window LMDeploy's engines then give a request."""
        return engine.session_len or super().context_window(engine)

    @classmethod
    @functools.cache
    def availability(cls, backend: str) -> str | None:
        """None when LMDeploy can run `backend` here, else one sentence saying what is missing. Never raises."""
        try:
            if importlib.util.find_spec("lmdeploy") is None:
                return f"The {backend} backend needs LMDeploy, which is not installed: {INSTALL_HINT}."
            facts = gpu_facts()
            if not facts.cuda:
                return (
                    f"The {backend} backend needs an NVIDIA GPU with CUDA, and torch here sees none "
                    "(torch.cuda.is_available() is False); use the transformers backend on this machine."
                )
            if facts.lmdeploy_error is not None:
                return f"LMDeploy is installed but cannot be imported ({facts.lmdeploy_error}); {INSTALL_HINT}."
        except Exception as exc:  # a broken install can fail in many ways; availability must not raise
            return f"LMDeploy cannot be checked ({type(exc).__name__}: {last_line(exc)}); {INSTALL_HINT}."
        return None

    @classmethod
    def validate(cls, engine: EngineConfig, load: LoadConfig) -> list[str]:
        """LMDeploy's rules for these knobs beyond each one's own bounds and choices (the catalog's): those that
        depend on the engine, on the GPUs here, or on several knobs at once (its config checks and its engines'
        later asserts), one sentence per problem naming the flag. Needs neither lmdeploy nor a GPU."""
        turbomind = engine.backend == "turbomind"
        problems = _shared_problems(engine, turbomind)
        problems += _turbomind_problems(engine) if turbomind else _pytorch_problems(engine)
        return problems + _speculative_problems(engine)

    @classmethod
    def settings_key(cls, engine: EngineConfig, load: LoadConfig) -> tuple:
        """Every knob the pipeline is built from, its max_batch_size, and the load pattern: a run of another
        pattern gets a freshly built pipeline, as each of LMDeploy's scripts builds its own."""
        knobs = tuple((knob.name, getattr(engine, knob.name)) for knob in knobs_for(engine.backend))
        return (
            engine.model,
            engine.trust_remote_code,
            engine.log_level,
            *knobs,
            ("max_batch_size", load.concurrency),
            ("load_pattern", load.load_pattern),
        )

    @classmethod
    def load(cls, engine: EngineConfig, load: LoadConfig) -> LMDeployEngine:
        return build_engine(engine, load)


def _gpu_facts() -> tuple[int, float] | None:
    """(visible GPU count, lowest compute capability) when torch can tell, else None."""
    capabilities = gpu_facts().capabilities
    if not capabilities:
        return None
    return len(capabilities), min(major + minor / 10 for major, minor in capabilities)


# ---- validation ---------------------------------------------------------------------------------

def _flag(name: str) -> str:
    return setting(name).cli_flag


def _shared_problems(engine: EngineConfig, turbomind: bool) -> list[str]:
    problems = []
    tp = engine.tp
    if tp < 1 or tp & (tp - 1):
        problems.append(f"{_flag('tp')} must be a power of 2 (1, 2, 4, 8, ...); got {tp}.")
    elif (facts := _gpu_facts()) is not None and tp > facts[0]:
        problems.append(f"{_flag('tp')} {tp} needs {tp} GPUs but {facts[0]} are visible.")
    ratio = engine.cache_max_entry_count
    if turbomind and not ratio > 0:
        problems.append(f"{_flag('cache_max_entry_count')} must be greater than 0 for TurboMind; got {ratio}.")
    if not turbomind and not 0 < ratio < 1:
        problems.append(
            f"{_flag('cache_max_entry_count')} must be between 0 and 1 (exclusive) for the PyTorch engine; got {ratio}."
        )
    return problems


def _turbomind_problems(engine: EngineConfig) -> list[str]:
    problems = []
    block = engine.cache_block_seq_len
    facts = _gpu_facts()
    step = 32 if facts is not None and facts[1] >= 8.0 else 64
    if block < 1 or block % step:
        where = "on this GPU" if facts is not None else "(64 unless a GPU of compute capability 8.0 or newer is visible)"
        problems.append(
            f"{_flag('cache_block_seq_len')} must be a positive multiple of {step} for TurboMind {where}; got {block}."
        )
    if engine.quant_policy in TURBOMIND_FP8_POLICIES:
        problems.append(
            f"TurboMind does not support FP8 KV cache ({_flag('quant_policy')} {engine.quant_policy}); "
            "use 0, 4, 8 or 42, or the pytorch backend."
        )
    return problems


def _pytorch_problems(engine: EngineConfig) -> list[str]:
    problems = []
    block = engine.cache_block_seq_len
    if block < 16 or block & (block - 1):
        problems.append(
            f"{_flag('cache_block_seq_len')} (block_size) must be a power of 2 of at least 16 "
            f"for the PyTorch engine; got {block}."
        )
    if engine.quant_policy > 0 and engine.device not in ("cuda", "ascend"):
        problems.append(f"KV cache quantization ({_flag('quant_policy')}) works only on cuda and ascend devices.")
    return problems


def _speculative_problems(engine: EngineConfig) -> list[str]:
    method, draft = engine.speculative_algorithm, engine.speculative_draft_model
    if method is None and draft:
        return [f"{_flag('speculative_draft_model')} is set but {_flag('speculative_algorithm')} is empty."]
    if method in DRAFT_MODEL_METHODS and not draft:
        return [f"Speculative method '{method}' needs a draft model ({_flag('speculative_draft_model')})."]
    return []
