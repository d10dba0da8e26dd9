"""The LMDeploy engines: knob validation, the configs handed to LMDeploy's real classes, backend
detection, and how pipeline responses become engine events.

Building a real pipeline needs an NVIDIA GPU; the event tests use StandInPipelineForNoGPU, which
replaces only the CUDA engine and yields LMDeploy's real Response objects. No test here measures speed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import threading
import time
from types import SimpleNamespace

import pytest

from bench_core.config import EngineConfig, GenerationSettings, LoadConfig, RunConfig, engine_config_fields, knobs_for
from bench_core.config.catalog import SPECULATIVE_GROUP
from bench_core.engines import lmdeploy_engine, run_config_problems
from bench_core.engines.base import EngineInfo
from bench_core.engines.lmdeploy_configs import build_engine_config, build_generation_configs, build_speculative_config
from bench_core.engines.lmdeploy_engine import LMDeployBackend
from bench_core.engines.lmdeploy_pipeline import LMDeployEngine, engine_info, turbomind_fallback_reason
from bench_core.errors import ConfigError
from bench_core.load.datasets import SampledRequest

needs_lmdeploy = pytest.mark.skipif(
    importlib.util.find_spec("lmdeploy") is None,
    reason="lmdeploy is not installed here (it belongs to the GPU environment, requirements-gpu.txt)",
)


def turbomind(**knobs) -> EngineConfig:
    return EngineConfig(backend="turbomind", **knobs)


def pytorch(**knobs) -> EngineConfig:
    return EngineConfig(backend="pytorch", **knobs)


@pytest.fixture
def no_gpu_facts(monkeypatch):
    """Validation as on a machine where torch sees no GPU (as here), whatever the test machine has."""
    monkeypatch.setattr(lmdeploy_engine, "_gpu_facts", lambda: None)


# ---- validation -----------------------------------------------------------------------------------


def problems_of(engine: EngineConfig, load: LoadConfig) -> list[str]:
    """Everything validation says of these settings (each knob's own bounds, then LMDeploy's rules), but not
    that this machine lacks LMDeploy or a GPU."""
    return run_config_problems(RunConfig(engine=engine, load=load))


def test_default_knobs_are_valid_for_both_backends(no_gpu_facts):
    assert problems_of(turbomind(), LoadConfig()) == []
    assert problems_of(pytorch(), LoadConfig()) == []


@pytest.mark.parametrize(
    "engine, flag",
    [
        (turbomind(tp=3), "--tp"),
        (turbomind(tp=0), "--tp"),
        (pytorch(cache_max_entry_count=1.0), "--cache-max-entry-count"),
        (turbomind(cache_block_seq_len=96), "--cache-block-seq-len"),
        (pytorch(cache_block_seq_len=24), "--cache-block-seq-len"),
        (turbomind(quant_policy=16), "--quant-policy"),
        (turbomind(model_format="safetensors"), "--model-format"),
        (turbomind(communicator="mpi"), "--communicator"),
        (turbomind(async_=2), "--async"),
        (turbomind(num_tokens_per_iter=-1), "--num-tokens-per-iter"),
        (turbomind(max_prefill_iters=0), "--max-prefill-iters"),
        (pytorch(device="tpu"), "--device"),
        (pytorch(speculative_algorithm="medusa"), "--speculative-algorithm"),
        (pytorch(speculative_algorithm="eagle3"), "--speculative-draft-model"),
        (
            pytorch(speculative_algorithm="deepseek_mtp", speculative_num_draft_tokens=0),
            "--speculative-num-draft-tokens",
        ),
        (turbomind(session_len=0), "--session-len"),
        (turbomind(log_level="LOUD"), "--log-level"),
    ],
)
def test_each_problem_is_one_sentence_naming_its_flag(no_gpu_facts, engine, flag):
    problems = problems_of(engine, LoadConfig())
    assert len(problems) == 1
    assert flag in problems[0] and problems[0].endswith(".")


def test_zero_concurrency_is_rejected(no_gpu_facts):
    assert problems_of(turbomind(), LoadConfig(concurrency=0)) == [
        "--concurrency must be a whole number from 1 to 1,000,000; got 0."
    ]


def test_mtp_methods_need_no_draft_model_but_eagle_does(no_gpu_facts):
    assert problems_of(pytorch(speculative_algorithm="deepseek_mtp"), LoadConfig()) == []
    assert problems_of(pytorch(speculative_algorithm="eagle", speculative_draft_model="/d"), LoadConfig()) == []
    assert problems_of(pytorch(speculative_algorithm="eagle"), LoadConfig()) != []


def test_a_draft_model_without_a_method_is_reported(no_gpu_facts):
    assert problems_of(pytorch(speculative_draft_model="/draft"), LoadConfig()) != []


def test_turbomind_block_length_follows_the_compute_capability_when_a_gpu_is_visible(monkeypatch):
    monkeypatch.setattr(lmdeploy_engine, "_gpu_facts", lambda: (2, 8.0))
    assert problems_of(turbomind(cache_block_seq_len=96), LoadConfig()) == []
    monkeypatch.setattr(lmdeploy_engine, "_gpu_facts", lambda: (2, 7.5))
    assert problems_of(turbomind(cache_block_seq_len=96), LoadConfig()) != []


def test_tensor_parallelism_cannot_exceed_the_visible_gpus(monkeypatch):
    monkeypatch.setattr(lmdeploy_engine, "_gpu_facts", lambda: (2, 9.0))
    assert problems_of(turbomind(tp=2), LoadConfig()) == []
    [problem] = problems_of(turbomind(tp=4), LoadConfig())
    assert "2 are visible" in problem


def test_both_load_patterns_are_accepted(no_gpu_facts):
    assert problems_of(turbomind(), LoadConfig(load_pattern="concurrency")) == []


# ---- the configs LMDeploy receives --------------------------------------------------------------

# (engine, concurrency, our validate accepts, LMDeploy's config classes accept, why they may differ)
VALIDATION_CASES = [
    (turbomind(), 256, True, True, ""),
    (turbomind(tp=0), 256, False, False, ""),
    (turbomind(cache_max_entry_count=0.0), 256, False, False, ""),
    (turbomind(cache_max_entry_count=1.5), 256, True, True, ""),
    (turbomind(quant_policy=16), 256, False, False, ""),
    (turbomind(quant_policy=17), 256, False, False, ""),
    (turbomind(quant_policy=3), 256, False, False, ""),
    (turbomind(quant_policy=42), 256, True, True, ""),
    (turbomind(num_tokens_per_iter=-1), 256, False, False, ""),
    (turbomind(async_=2), 256, False, False, ""),
    (turbomind(tp=3), 256, False, True, "--tp help: 'Should be 2^n'"),
    (turbomind(cache_block_seq_len=48), 256, False, True, "TurboMind's block rule is in the help text only"),
    (turbomind(communicator="mpi"), 256, False, True, "argparse choices"),
    (turbomind(model_format="safetensors"), 256, False, True, "argparse choices"),
    (turbomind(max_prefill_iters=0), 256, False, True, "a split prefill needs at least one pass"),
    (turbomind(session_len=0), 256, False, True, "not checked until the engine is built"),
    (turbomind(), 0, False, True, "TurboMind.__init__ asserts max_batch_size > 0"),
    (pytorch(), 256, True, True, ""),
    (pytorch(tp=0), 256, False, False, ""),
    (pytorch(cache_max_entry_count=1.0), 256, False, False, ""),
    (pytorch(cache_max_entry_count=0.0), 256, False, False, ""),
    (pytorch(cache_block_seq_len=48), 256, False, False, ""),
    (pytorch(cache_block_seq_len=8), 256, False, False, ""),
    (pytorch(cache_block_seq_len=16), 256, True, True, ""),
    (pytorch(cache_block_seq_len=128), 256, True, True, ""),
    (pytorch(device="tpu"), 256, False, False, ""),
    (pytorch(quant_policy=16), 256, True, True, ""),
    (pytorch(quant_policy=3), 256, False, False, ""),
    (pytorch(quant_policy=8, device="maca"), 256, False, False, ""),
    (pytorch(), 0, False, True, "the PyTorch EngineChecker exits on max_batch_size <= 0"),
    (turbomind(tp=2, cp=2, dp=2, ep=2), 256, True, True, ""),
    (turbomind(cp=2), 256, False, True, "--cp help: 'tp must be a multiple of cp'; the layout is derived later"),
    (turbomind(dp=0), 256, False, True, "TurboMind asserts dp >= 1 when it derives its parallel layout"),
    (turbomind(ep=0), 256, False, False, ""),
    (turbomind(log_level="REQUEST"), 256, True, True, ""),
    (pytorch(tp=2, dp=2), 256, True, True, ""),
    (pytorch(dp=0), 256, False, False, ""),
    (pytorch(ep=0), 256, False, False, ""),
    (pytorch(dp=2), 256, False, True, "ConfigBuilder resets dp to 1 when tp and ep are 1 (a warning only)"),
    (pytorch(tp=4, dp=3), 256, False, True, "DistConfig asserts that dp divides the world size"),
    (pytorch(distributed_executor_backend="ray"), 256, True, True, ""),
    (pytorch(distributed_executor_backend="slurm"), 256, False, True, "argparse choices"),
    (
        pytorch(
            dllm_block_length=32,
            dllm_denoising_steps=8,
            dllm_unmasking_strategy="sequential",
            dllm_confidence_threshold=0.9,
        ),
        256,
        True,
        True,
        "",
    ),
    (pytorch(dllm_block_length=0), 256, False, True, "a block of no tokens"),
    (pytorch(dllm_denoising_steps=0), 256, False, True, "no denoising step"),
    (pytorch(dllm_unmasking_strategy="random"), 256, False, True, "argparse choices"),
    (pytorch(dllm_confidence_threshold=1.5), 256, False, True, "a confidence is between 0 and 1"),
    (pytorch(dllm_block_length=64), 256, False, True, "ConfigBuilder shrinks max_batch_size to fit (a warning only)"),
]


def _lmdeploy_accepts(engine: EngineConfig, load: LoadConfig) -> bool:
    try:
        build_engine_config(engine, load)
    except (AssertionError, ValueError):  # pydantic's ValidationError is a ValueError
        return False
    return True


@needs_lmdeploy
@pytest.mark.parametrize("engine, concurrency, ours, theirs, why", VALIDATION_CASES)
def test_lmdeploy_accepts_whatever_validate_accepts(no_gpu_facts, engine, concurrency, ours, theirs, why):
    load = LoadConfig(concurrency=concurrency)
    assert (problems_of(engine, load) == []) is ours
    assert _lmdeploy_accepts(engine, load) is theirs
    assert ours <= theirs  # never accept what LMDeploy rejects; stricter only for a stated reason
    assert ours == theirs or why


KNOBS = dict(
    tp=2,
    cache_max_entry_count=0.5,
    session_len=4096,
    cache_block_seq_len=128,
    enable_prefix_caching=True,
    model_format="awq",
    quant_policy=8,
    num_tokens_per_iter=2048,
    max_prefill_iters=4,
    communicator="cuda-ipc",
    async_=0,
    device="ascend",
    eager_mode=True,
    enable_return_routed_experts=True,
)


@needs_lmdeploy
def test_turbomind_config_is_what_profile_pipeline_api_builds():
    from lmdeploy.messages import TurbomindEngineConfig

    args = SimpleNamespace(**KNOBS, concurrency=64)
    expected = TurbomindEngineConfig(  # profile_pipeline_api.py main(), backend turbomind
        max_batch_size=args.concurrency,
        tp=args.tp,
        cache_max_entry_count=args.cache_max_entry_count,
        session_len=args.session_len,
        cache_block_seq_len=args.cache_block_seq_len,
        model_format=args.model_format,
        quant_policy=args.quant_policy,
        num_tokens_per_iter=args.num_tokens_per_iter,
        max_prefill_iters=args.max_prefill_iters,
        enable_prefix_caching=args.enable_prefix_caching,
        communicator=args.communicator,
        enable_metrics=False,
        async_=args.async_,
    )
    ours = build_engine_config(turbomind(**KNOBS), LoadConfig(concurrency=64))
    assert type(ours) is TurbomindEngineConfig
    for f in dataclasses.fields(expected):
        assert getattr(ours, f.name) == getattr(expected, f.name), f.name


@needs_lmdeploy
def test_pytorch_config_is_what_profile_pipeline_api_builds_at_the_default_quant_policy():
    from lmdeploy.messages import PytorchEngineConfig

    args = SimpleNamespace(**{**KNOBS, "quant_policy": 0}, concurrency=64)
    expected = PytorchEngineConfig(  # profile_pipeline_api.py main(), backend pytorch
        cache_max_entry_count=args.cache_max_entry_count,
        session_len=args.session_len,
        block_size=args.cache_block_seq_len,
        max_batch_size=args.concurrency,
        tp=args.tp,
        device_type=args.device,
        thread_safe=False,
        eager_mode=args.eager_mode,
        enable_prefix_caching=args.enable_prefix_caching,
        enable_return_routed_experts=args.enable_return_routed_experts,
    )
    ours = build_engine_config(pytorch(**{**KNOBS, "quant_policy": 0}), LoadConfig(concurrency=64))
    assert type(ours) is PytorchEngineConfig
    for f in dataclasses.fields(expected):
        assert getattr(ours, f.name) == getattr(expected, f.name), f.name


# A value other than its default for every engine knob of LMDeploy's configs, all of them accepted at once.
OTHER_VALUES = dict(
    KNOBS,
    dp=2,
    ep=2,
    cp=2,
    dtype="bfloat16",
    max_prefill_token_num=4096,
    distributed_executor_backend="ray",
    dllm_block_length=32,
    dllm_unmasking_strategy="sequential",
    dllm_denoising_steps=8,
    dllm_confidence_threshold=0.9,
)


@needs_lmdeploy
@pytest.mark.parametrize("backend", ["turbomind", "pytorch"])
def test_each_knob_reaches_its_field_of_lmdeploys_own_config_class(backend):
    from lmdeploy.messages import PytorchEngineConfig, TurbomindEngineConfig

    config_class = TurbomindEngineConfig if backend == "turbomind" else PytorchEngineConfig
    declared = {field.name: field.default for field in dataclasses.fields(config_class)}
    fields = engine_config_fields(backend)
    assert set(fields.values()) <= set(declared)  # every field named is one of LMDeploy's
    knobs = {knob.name: knob for knob in knobs_for(backend)}
    chosen = {name: OTHER_VALUES[name] for name in fields}
    assert all(chosen[name] != knobs[name].default for name in fields)  # each value shows which field it reached
    assert all(
        knobs[name].default == declared[field] or name in ("model_format", "cache_block_seq_len")
        for name, field in fields.items()
    )  # the scripts' defaults: hf, and block 64 for PyTorch too
    built = build_engine_config(EngineConfig(backend=backend, **chosen), LoadConfig())
    assert {field: getattr(built, field) for field in fields.values()} == {fields[n]: v for n, v in chosen.items()}


@needs_lmdeploy
def test_engine_api_configs_are_what_profile_throughput_builds():
    from lmdeploy.messages import PytorchEngineConfig, TurbomindEngineConfig

    args = SimpleNamespace(**OTHER_VALUES, concurrency=64)
    expected = TurbomindEngineConfig(  # profile_throughput.py main(), backend turbomind
        max_batch_size=args.concurrency // args.dp,
        tp=args.tp,
        dp=args.dp,
        cp=args.cp,
        cache_max_entry_count=args.cache_max_entry_count,
        cache_block_seq_len=args.cache_block_seq_len,
        model_format=args.model_format,
        quant_policy=args.quant_policy,
        num_tokens_per_iter=args.num_tokens_per_iter,
        max_prefill_iters=args.max_prefill_iters,
        async_=args.async_,
        enable_prefix_caching=args.enable_prefix_caching,
        dtype=args.dtype,
        communicator=args.communicator,
    )
    theirs = {
        name: OTHER_VALUES[name]
        for name in (
            "tp",
            "dp",
            "cp",
            "cache_max_entry_count",
            "cache_block_seq_len",
            "model_format",
            "quant_policy",
            "num_tokens_per_iter",
            "max_prefill_iters",
            "async_",
            "enable_prefix_caching",
            "dtype",
            "communicator",
        )
    }
    engine_api = LoadConfig(load_pattern="engine_api", concurrency=64)
    ours = build_engine_config(turbomind(**theirs), engine_api)
    for f in dataclasses.fields(expected):
        assert getattr(ours, f.name) == getattr(expected, f.name), f.name

    expected = PytorchEngineConfig(  # profile_throughput.py main(), backend pytorch
        cache_max_entry_count=args.cache_max_entry_count,
        block_size=args.cache_block_seq_len,
        max_batch_size=args.concurrency,
        tp=args.tp,
        device_type=args.device,
        eager_mode=args.eager_mode,
        enable_prefix_caching=args.enable_prefix_caching,
        quant_policy=args.quant_policy,
        dtype=args.dtype,
        distributed_executor_backend=args.distributed_executor_backend,
        dllm_block_length=args.dllm_block_length,
        dllm_unmasking_strategy=args.dllm_unmasking_strategy,
        dllm_denoising_steps=args.dllm_denoising_steps,
        dllm_confidence_threshold=args.dllm_confidence_threshold,
    )
    theirs = {
        name: OTHER_VALUES[name]
        for name in (
            "cache_max_entry_count",
            "cache_block_seq_len",
            "tp",
            "device",
            "eager_mode",
            "enable_prefix_caching",
            "quant_policy",
            "dtype",
            "distributed_executor_backend",
            "dllm_block_length",
            "dllm_unmasking_strategy",
            "dllm_denoising_steps",
            "dllm_confidence_threshold",
        )
    }
    ours = build_engine_config(pytorch(**theirs), engine_api)
    for f in dataclasses.fields(expected):
        assert getattr(ours, f.name) == getattr(expected, f.name), f.name


@pytest.mark.parametrize("backend", ["turbomind", "pytorch"])
def test_every_engine_knob_names_its_field_of_the_engine_config(backend):
    speculative = {knob.name for knob in knobs_for(backend) if knob.group == SPECULATIVE_GROUP}  # their own config
    assert set(engine_config_fields(backend)) == {knob.name for knob in knobs_for(backend)} - speculative


@needs_lmdeploy
def test_pytorch_engine_also_gets_the_kv_cache_quant_policy():
    assert build_engine_config(pytorch(quant_policy=8), LoadConfig()).quant_policy == 8


@needs_lmdeploy
def test_speculative_config_is_what_get_speculative_config_builds():
    from lmdeploy.messages import SpeculativeConfig

    engine = pytorch(speculative_algorithm="eagle3", speculative_draft_model="/draft", speculative_num_draft_tokens=3)
    assert build_speculative_config(engine) == SpeculativeConfig(
        method="eagle3", model="/draft", num_speculative_tokens=3
    )
    assert build_speculative_config(pytorch()) is None


@needs_lmdeploy
def test_generation_is_greedy_ignores_eos_and_asks_for_each_requests_output_length():
    from lmdeploy.messages import GenerationConfig

    requests = [SampledRequest("a", 4, 7), SampledRequest("b", 5, 9)]
    settings = GenerationSettings(ignore_eos=False, do_sample=True, temperature=0.5, top_p=0.9, top_k=3)
    configs = build_generation_configs(requests, settings, return_routed_experts=False)
    assert configs == [
        GenerationConfig(
            temperature=0.5,
            top_p=0.9,
            top_k=3,
            ignore_eos=True,
            do_sample=False,
            return_routed_experts=False,
            max_new_tokens=n,
        )
        for n in (7, 9)
    ]


@needs_lmdeploy
def test_out_of_range_sampling_settings_are_a_config_error():
    with pytest.raises(ConfigError, match="--top-p"):
        build_generation_configs([SampledRequest("a", 4, 4)], GenerationSettings(top_p=1.5), False)


def test_settings_key_changes_with_every_engine_input_but_not_with_other_backends_knobs():
    base = LMDeployBackend.settings_key(turbomind(), LoadConfig())
    assert LMDeployBackend.settings_key(turbomind(), LoadConfig()) == base
    assert LMDeployBackend.settings_key(turbomind(), LoadConfig(concurrency=8)) != base
    assert LMDeployBackend.settings_key(turbomind(), LoadConfig(load_pattern="concurrency")) != base
    assert LMDeployBackend.settings_key(turbomind(quant_policy=8), LoadConfig()) != base
    assert LMDeployBackend.settings_key(turbomind(speculative_num_draft_tokens=2), LoadConfig()) != base
    assert LMDeployBackend.settings_key(turbomind(log_level="ERROR"), LoadConfig()) != base
    assert LMDeployBackend.settings_key(turbomind(dtype="bfloat16"), LoadConfig()) != base  # TurboMind's dtype too
    assert LMDeployBackend.settings_key(turbomind(device="ascend", max_batch_tokens=8), LoadConfig()) == base
    assert LMDeployBackend.settings_key(turbomind(), LoadConfig(stream_output=True)) == base


# ---- availability and the silent TurboMind fallback -------------------------------------------


@pytest.mark.slow
def test_without_a_gpu_the_backends_say_so():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    LMDeployBackend.availability.cache_clear()
    for backend in ("turbomind", "pytorch"):
        message = LMDeployBackend.availability(backend) or ""
        assert "NVIDIA GPU" in message and backend in message


def test_without_lmdeploy_the_message_points_to_the_gpu_requirements(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "lmdeploy" else real_find_spec(name, *a)
    )
    LMDeployBackend.availability.cache_clear()
    try:
        assert "requirements-gpu.txt" in LMDeployBackend.availability("turbomind")
    finally:
        LMDeployBackend.availability.cache_clear()


@needs_lmdeploy
def test_fallback_reason_names_a_turbomind_library_that_cannot_load(tiny_model_path):
    from lmdeploy import turbomind as tm

    if tm.is_available():
        pytest.skip("TurboMind loads on this machine")
    reason = turbomind_fallback_reason(tiny_model_path, trust_remote_code=False)
    assert reason.startswith("TurboMind's compiled library cannot be loaded")


@needs_lmdeploy
def test_a_pytorch_engine_behind_a_turbomind_request_is_recorded_as_a_fallback(tiny_model_path):
    from lmdeploy.messages import PytorchEngineConfig, TurbomindEngineConfig

    fell_back = PytorchEngineConfig(session_len=2048)  # the config the pipeline was built with
    info = engine_info(turbomind(model="builtin:tiny-llama"), tiny_model_path, fell_back, "no TurboMind kernels")
    assert info.backend == "pytorch (fell back from turbomind: no TurboMind kernels)"
    assert any("instead of TurboMind" in note for note in info.notes)
    assert "session_len 2048" in info.notes
    assert set(info.versions) == {"lmdeploy", "torch", "transformers", "cuda"}

    assert engine_info(turbomind(), tiny_model_path, TurbomindEngineConfig(), None).backend == "turbomind"


# ---- events from the pipeline -------------------------------------------------------------------


@dataclasses.dataclass(eq=False)
class StandInSession:
    """The fields of lmdeploy.serve.managers.Session that a request's life touches here."""

    session_id: int
    epoch: int | None = None
    aborted: bool = False


class StandInPipelineForNoGPU:
    """Replaces only LMDeploy's CUDA engine: offers the Pipeline's sync API (stream_infer, the batch
    call, sessions, AsyncEngine.stop_all_session on an event-loop thread) and yields real
    lmdeploy.messages.Response objects, one token per chunk then a final chunk, as the pipeline does.
    Requests run one after another; it measures nothing."""

    def __init__(self, backend_config, token_delay_s: float = 0.0):
        self.backend_config = backend_config
        self.token_delay_s = token_delay_s
        self.calls: list[dict] = []
        self.batch_returned_at: float | None = None
        self.cached_tokens = 0  # what each Response says of the prompt's tokens found in the prefix cache
        self._ids = iter(range(10**9))
        self._running: set = set()
        loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=loop.run_forever, daemon=True)
        self._loop_thread.start()
        self.session_mgr = SimpleNamespace(loop=loop)
        self.async_engine = SimpleNamespace(epoch=0, stop_all_session=self._stop_all_session)

    async def _stop_all_session(self):
        """As AsyncEngine: a new epoch (queued sessions stamped earlier are dropped) and running ones aborted."""
        self.async_engine.epoch += 1
        for session in list(self._running):
            session.aborted = True

    def session(self):
        return StandInSession(next(self._ids))

    def stream_infer(self, prompts, sessions=None, gen_config=None, do_preprocess=True):
        self.calls.append(dict(prompts=prompts, gen_config=gen_config, do_preprocess=do_preprocess, stream=True))
        for index, (session, config) in enumerate(zip(sessions, gen_config)):
            yield from self._generate(index, session, config)

    def __call__(self, prompts, gen_config=None, do_preprocess=True, sessions=None):
        from lmdeploy.messages import Response

        self.calls.append(dict(prompts=prompts, gen_config=gen_config, do_preprocess=do_preprocess, stream=False))
        results = []
        for index, (session, config) in enumerate(zip(sessions, gen_config)):
            *_, last = self._generate(index, session, config)
            results.append(  # the whole answer, as Pipeline.infer extends the chunks into one Response
                Response(
                    text="x" * last.generate_token_len,
                    token_ids=list(range(1, last.generate_token_len + 1)),
                    generate_token_len=last.generate_token_len,
                    input_token_len=4,
                    finish_reason=last.finish_reason,
                    index=index,
                    error_message=last.error_message,
                )
            )
        self.batch_returned_at = time.perf_counter()
        return results

    def _generate(self, index, session, config):
        from lmdeploy.messages import Response

        if config.max_new_tokens < 1:  # what AsyncEngine.preprocess answers
            yield Response(
                text="",
                generate_token_len=0,
                input_token_len=0,
                finish_reason="error",
                index=index,
                error_code="invalid_request",
                error_message=f"max_new_tokens must be at least 1, got {config.max_new_tokens}.",
            )
            return
        if session.epoch is not None and session.epoch != self.async_engine.epoch:  # stale: dropped unstarted
            yield Response(text="", generate_token_len=0, input_token_len=4, finish_reason="abort", index=index)
            return
        self._running.add(session)
        try:
            n = 0
            while n < config.max_new_tokens and not session.aborted:
                time.sleep(self.token_delay_s)
                n += 1
                yield Response(
                    text="x",
                    generate_token_len=n,
                    input_token_len=4,
                    token_ids=[n],
                    index=index,
                    cached_tokens=self.cached_tokens,
                )
            reason = "abort" if session.aborted else "length"
            yield Response(
                text="",
                generate_token_len=n,
                input_token_len=4,
                finish_reason=reason,
                index=index,
                cached_tokens=self.cached_tokens,
            )
        finally:
            self._running.discard(session)

    def close(self):
        self.session_mgr.loop.call_soon_threadsafe(self.session_mgr.loop.stop)
        self._loop_thread.join(timeout=5)


def _engine(max_batch_size=4, token_delay_s=0.0, tokenizer=None):
    from lmdeploy.messages import TurbomindEngineConfig

    pipe = StandInPipelineForNoGPU(TurbomindEngineConfig(max_batch_size=max_batch_size), token_delay_s)
    info = EngineInfo("turbomind", "m", "/m", "auto", "stand-in")
    return LMDeployEngine(pipe, tokenizer=tokenizer, info=info, max_batch_size=max_batch_size), pipe


def _run(engine, requests, stream_output, concurrency=4, load_pattern="batch", cancel=None):
    load = LoadConfig(load_pattern=load_pattern, concurrency=concurrency, stream_output=stream_output)
    events = list(engine.stream(requests, GenerationSettings(), load, cancel or threading.Event()))
    engine.close()
    return events


def _by_request(events):
    grouped = {}
    for event in events:
        grouped.setdefault(event.index, []).append(event)
    return grouped


REQUESTS = [SampledRequest(f"prompt {i}", 4, 3 + i) for i in range(3)]


@needs_lmdeploy
def test_a_turn_goes_after_the_one_it_follows_with_its_answer_and_the_responses_cached_tokens(tiny_tokenizer):
    engine, pipe = _engine(tokenizer=tiny_tokenizer)
    pipe.cached_tokens = 2
    question = {"role": "user", "content": "a"}
    first = SampledRequest("User: a\n\nAssistant:", 4, 3, messages=(question,), session=0)
    second = SampledRequest(
        "estimate",
        9,
        2,
        messages=(question, {"role": "assistant", "content": "dataset's"}, {"role": "user", "content": "b"}),
        session=0,
        turn=1,
        follows=0,
        think_s=0.05,
        builds_on_answer=True,
    )
    events = _run(engine, [first, second], stream_output=True)
    # the second turn repeats the answer the (stand-in) engine gave, "xxx", not the dataset's
    assert [call["prompts"] for call in pipe.calls] == [
        ["User: a\n\nAssistant:"],
        ["User: a\n\nAssistant: xxx\n\nUser: b\n\nAssistant:"],
    ]
    finishes = {e.index: e for e in events if e.kind == "finish"}
    admitted = {e.index: e for e in events if e.kind == "admit"}
    assert admitted[1].ts >= finishes[0].ts + 0.05  # after the answer and the think time
    # the built prompt measured when sent; the first turn keeps its sampled length
    assert (admitted[0].input_len, admitted[1].input_len) == (
        0,
        len(tiny_tokenizer.encode(pipe.calls[1]["prompts"][0])),
    )
    assert [finishes[i].extra for i in (0, 1)] == [{"cached_tokens": 2.0}] * 2


@needs_lmdeploy
def test_stream_output_ticks_cumulative_tokens_and_finishes_each_request_once():
    engine, pipe = _engine()
    events = _run(engine, REQUESTS, stream_output=True)
    assert pipe.calls[0]["do_preprocess"] is False and pipe.calls[0]["stream"] is True
    assert len(pipe.calls) == 1  # one call holding every prompt, as the script
    admits = [e for e in events if e.kind == "admit"]
    assert len({e.ts for e in admits}) == 1  # all submitted at once
    for request, (_, evs) in zip(REQUESTS, sorted(_by_request(events).items())):
        kinds = [e.kind for e in evs]
        assert kinds[0] == "admit" and kinds[-1] == "finish" and kinds.count("finish") == 1
        counts = [e.n_tokens for e in evs if e.kind == "tokens"]
        assert counts == sorted(counts) and counts[-1] == request.output_len
        assert evs[-1].finish_reason == "length"


@needs_lmdeploy
def test_without_stream_output_every_request_ticks_once_after_the_whole_batch_returned():
    engine, pipe = _engine()
    events = _run(engine, REQUESTS, stream_output=False)
    assert pipe.calls == [
        dict(
            prompts=[r.prompt for r in REQUESTS],
            gen_config=pipe.calls[0]["gen_config"],
            do_preprocess=False,
            stream=False,
        )
    ]
    for index, evs in _by_request(events).items():
        assert [e.kind for e in evs] == ["admit", "tokens", "finish"]
        assert evs[1].n_tokens == REQUESTS[index].output_len
        assert evs[1].ts >= pipe.batch_returned_at


@needs_lmdeploy
@pytest.mark.parametrize("stream_output", [True, False])
def test_each_finish_hands_over_the_answer_lmdeploy_gave_streamed_or_not(stream_output):
    """What a run keeps for its drift and score (--keep-outputs): the chunks' ids and text, joined."""
    engine, _ = _engine()
    finishes = {e.index: e for e in _run(engine, REQUESTS, stream_output=stream_output) if e.kind == "finish"}
    for index, request in enumerate(REQUESTS):
        assert list(finishes[index].token_ids) == list(range(1, request.output_len + 1))
        assert finishes[index].text == "x" * request.output_len
        assert finishes[index].n_tokens == request.output_len


@needs_lmdeploy
def test_a_request_lmdeploy_rejects_finishes_with_error_and_its_message():
    engine, _ = _engine()
    events = _run(engine, [SampledRequest("p", 4, 0), SampledRequest("q", 4, 2)], stream_output=True)
    finishes = {e.index: e for e in events if e.kind == "finish"}
    assert finishes[0].finish_reason == "error"
    assert finishes[0].message == "max_new_tokens must be at least 1, got 0."
    assert finishes[1].finish_reason == "length"


@needs_lmdeploy
@pytest.mark.parametrize("stream_output", [True, False])
def test_concurrency_workers_admit_a_request_only_when_a_slot_frees(stream_output):
    engine, pipe = _engine(token_delay_s=0.002)
    requests = [SampledRequest(f"p{i}", 4, 5) for i in range(6)]
    events = _run(engine, requests, stream_output, concurrency=2, load_pattern="concurrency")
    in_flight, peak = 0, 0
    for event in events:
        in_flight += {"admit": 1, "finish": -1}.get(event.kind, 0)
        peak = max(peak, in_flight)
    assert peak == 2
    assert sorted(e.index for e in events if e.kind == "finish") == list(range(6))
    assert all(len(call["prompts"]) == 1 and call["do_preprocess"] is False for call in pipe.calls)
    first_finish = next(i for i, e in enumerate(events) if e.kind == "finish")
    third_admit = [i for i, e in enumerate(events) if e.kind == "admit"][2]
    assert third_admit > first_finish


@needs_lmdeploy
@pytest.mark.parametrize("load_pattern", ["batch", "concurrency"])
def test_cancel_aborts_running_and_queued_requests_at_once(load_pattern):
    engine, _ = _engine(token_delay_s=0.005)
    admitted, finishes = cancelled_after_three_tokens(engine, 12, load_pattern)
    engine.close()
    assert sorted(e.index for e in finishes) == sorted(admitted)
    assert {e.finish_reason for e in finishes} == {"abort"}


CANCELLED_OUTPUT_LEN = 10_000  # tokens asked of each request cancelled: 50 s of the stand-ins' 5 ms tokens


def cancelled_after_three_tokens(engine, n_requests: int, load_pattern: str):
    """Stream requests of CANCELLED_OUTPUT_LEN tokens two at a time, cancel once one has 3 tokens, and check that
    the engine itself stopped them at once: none was ended by the reader giving up on an engine that does not stop
    (event_pump.CANCEL_GRACE_S), and none had generated a tenth of its tokens. The indexes admitted, and the finish
    events."""
    requests = [SampledRequest(f"p{i}", 4, CANCELLED_OUTPUT_LEN) for i in range(n_requests)]
    cancel, events = threading.Event(), []
    load = LoadConfig(load_pattern=load_pattern, concurrency=2, stream_output=True)
    for event in engine.stream(requests, GenerationSettings(), load, cancel):
        events.append(event)
        if event.kind == "tokens" and event.n_tokens == 3:
            cancel.set()
    finishes = [e for e in events if e.kind == "finish"]
    assert [e.message for e in finishes if "did not stop it" in e.message] == []
    assert max(e.n_tokens for e in events if e.kind == "tokens") < CANCELLED_OUTPUT_LEN // 10
    return {e.index for e in events if e.kind == "admit"}, finishes


@needs_lmdeploy
def test_one_built_pipeline_runs_whichever_load_pattern_stream_is_given():
    engine, pipe = _engine()
    batch = LoadConfig(load_pattern="batch", concurrency=2, stream_output=True)
    list(engine.stream(REQUESTS, GenerationSettings(), batch, threading.Event()))
    assert len(pipe.calls) == 1  # every prompt in one call
    list(
        engine.stream(
            REQUESTS, GenerationSettings(), dataclasses.replace(batch, load_pattern="concurrency"), threading.Event()
        )
    )
    engine.close()
    assert [len(call["prompts"]) for call in pipe.calls[1:]] == [1] * len(REQUESTS)  # a worker's call per prompt


@needs_lmdeploy
def test_more_in_flight_than_the_engine_was_built_for_is_refused():
    engine, _ = _engine(max_batch_size=2)
    with pytest.raises(ValueError):
        engine.stream(REQUESTS, GenerationSettings(), LoadConfig(concurrency=4, stream_output=True), threading.Event())
    engine.close()
