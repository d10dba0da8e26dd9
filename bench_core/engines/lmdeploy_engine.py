"""The LMDeploy backend, `turbomind` and `pytorch`: whether LMDeploy can run here, LMDeploy's rules for the
knobs, and which settings a built pipeline can be reused for; none of that needs lmdeploy or a GPU.

The configs handed to LMDeploy are built in lmdeploy_configs.py, the pipeline is built and driven in
lmdeploy_pipeline.py, and the engine itself, for the engine_api load pattern, in lmdeploy_instance.py. None of
these modules imports lmdeploy or torch at module level: validation works without them.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import subprocess
import sys
from pathlib import Path

from ..config import DatasetConfig, EngineConfig, LoadConfig, knobs_for, setting
from ..models.resolve import last_line
from ..states import LoadPattern
from .base import Backend, Engine, RunSize
from .gpu_probe import gpu_facts
from .lmdeploy_instance import build_instance_engine
from .lmdeploy_pipeline import build_engine

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
    run_size = RunSize(
        "lmdeploy",
        num_prompts=DatasetConfig.num_prompts,
        concurrency=LoadConfig.concurrency,
        stream_output=LoadConfig.stream_output,
        sharegpt_output_len=DatasetConfig.sharegpt_output_len,
    )

    @classmethod
    def gpus(cls, engine: EngineConfig) -> int:
        """TurboMind: dp x tp x gcd(cp, ep), the most its parallel layout takes; PyTorch: its world size, ep where
        experts are spread, else tp."""
        dp, tp, ep = engine.dp, engine.tp, engine.ep
        if engine.backend == "turbomind":
            return dp * tp * math.gcd(engine.cp, ep)
        return ep if ep > 1 else tp

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
    def install_facts(cls) -> dict[str, str]:
        return {"TurboMind extension": turbomind_extension()}

    @classmethod
    def validate(cls, engine: EngineConfig, load: LoadConfig) -> list[str]:
        """LMDeploy's rules for these knobs beyond each one's own bounds and choices (the catalog's): those that
        depend on the engine, on the GPUs here, or on several knobs at once (its config checks and its engines'
        later asserts), one sentence per problem naming the flag. Needs neither lmdeploy nor a GPU."""
        turbomind = engine.backend == "turbomind"
        problems = _shared_problems(engine, turbomind)
        problems += _turbomind_problems(engine, load) if turbomind else _pytorch_problems(engine, load)
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
    def load(cls, engine: EngineConfig, load: LoadConfig) -> Engine:
        """The pipeline profile_pipeline_api.py builds, or for the engine API the engine profile_throughput.py
        builds."""
        if load.load_pattern == LoadPattern.ENGINE_API:
            return build_instance_engine(engine, load)
        return build_engine(engine, load)


# Loads TurboMind's compiled extension on its own, in a child process: not lmdeploy (which imports torch), and
# nothing of it stays in this process.
_LOAD_EXTENSION = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("_turbomind", sys.argv[1])
spec.loader.exec_module(importlib.util.module_from_spec(spec))
"""


def turbomind_extension() -> str:
    """Whether LMDeploy's TurboMind extension (turbomind/_turbomind*.so) is there and loads, in words."""
    spec = importlib.util.find_spec("lmdeploy")
    if spec is None or not spec.submodule_search_locations:
        return "none (lmdeploy is not installed)"
    found = sorted(Path(spec.submodule_search_locations[0], "turbomind").glob("_turbomind*.so"))
    if not found:
        return "not in this lmdeploy build (no turbomind/_turbomind*.so): the turbomind backend cannot run"
    try:
        done = subprocess.run(
            [sys.executable, "-c", _LOAD_EXTENSION, str(found[0])], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{found[0].name}, not checked ({type(exc).__name__})"
    if done.returncode == 0:
        return f"{found[0].name}, loads"
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    return f"{found[0].name}, does not load ({lines[-1].strip() if lines else f'exit code {done.returncode}'})"


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
    elif (facts := _gpu_facts()) is not None and (needed := LMDeployBackend.gpus(engine)) > facts[0]:
        problems.append(
            f"{_flag('tp')} {tp} with {_flag('dp')} {engine.dp} and {_flag('ep')} {engine.ep} needs "
            f"{needed} GPUs but {facts[0]} are visible."
            if needed != tp
            else f"{_flag('tp')} {tp} needs {tp} GPUs but {facts[0]} are visible."
        )
    ratio = engine.cache_max_entry_count
    if turbomind and not ratio > 0:
        problems.append(f"{_flag('cache_max_entry_count')} must be greater than 0 for TurboMind; got {ratio}.")
    if not turbomind and not 0 < ratio < 1:
        problems.append(
            f"{_flag('cache_max_entry_count')} must be between 0 and 1 (exclusive) for the PyTorch engine; got {ratio}."
        )
    return problems


def _turbomind_problems(engine: EngineConfig, load: LoadConfig) -> list[str]:
    problems = []
    tp, cp = engine.tp, engine.cp
    if cp > 0 and tp % cp:  # cp 0: its own bound says so
        problems.append(f"{_flag('tp')} must be a multiple of {_flag('cp')} for TurboMind; got tp {tp}, cp {cp}.")
    if load.load_pattern == LoadPattern.ENGINE_API and load.concurrency < engine.dp:
        problems.append(
            f"TurboMind's engine API takes max_batch_size = concurrency // {_flag('dp')} (as "
            f"profile_throughput.py), so -c must be at least {engine.dp}; got {load.concurrency}."
        )
    block = engine.cache_block_seq_len
    facts = _gpu_facts()
    step = 32 if facts is not None and facts[1] >= 8.0 else 64
    if block < 1 or block % step:
        where = (
            "on this GPU" if facts is not None else "(64 unless a GPU of compute capability 8.0 or newer is visible)"
        )
        problems.append(
            f"{_flag('cache_block_seq_len')} must be a positive multiple of {step} for TurboMind {where}; got {block}."
        )
    if engine.quant_policy in TURBOMIND_FP8_POLICIES:
        problems.append(
            f"TurboMind does not support FP8 KV cache ({_flag('quant_policy')} {engine.quant_policy}); "
            "use 0, 4, 8 or 42, or the pytorch backend."
        )
    return problems


def _pytorch_problems(engine: EngineConfig, load: LoadConfig) -> list[str]:
    problems = []
    dp, world = engine.dp, LMDeployBackend.gpus(engine)
    if dp > 1 and world == 1:
        problems.append(
            f"{_flag('dp')} {dp} needs {_flag('tp')} or {_flag('ep')} above 1 on the PyTorch engine "
            "(LMDeploy would run it with dp 1)."
        )
    elif dp > 0 and world % dp:  # dp 0: its own bound says so
        problems.append(
            f"{_flag('dp')} {dp} must divide the PyTorch engine's GPUs ({_flag('ep')} when above 1, "
            f"else {_flag('tp')}): {world}."
        )
    block = engine.dllm_block_length
    if block is not None and block * load.concurrency > engine.max_prefill_token_num:
        problems.append(
            f"{_flag('dllm_block_length')} {block} x concurrency {load.concurrency} exceeds "
            f"{_flag('max_prefill_token_num')} {engine.max_prefill_token_num}: LMDeploy would shrink the "
            f"batch to {engine.max_prefill_token_num // block}; lower -c or raise "
            f"{_flag('max_prefill_token_num')}."
        )
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
