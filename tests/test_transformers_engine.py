"""The embedded transformers engine, generating real tokens with the built-in tiny Llama on CPU."""

import gc
import json
import logging
import shutil
import threading
import time
from collections import Counter, defaultdict
from dataclasses import replace

import pytest

from bench_core.config import EngineConfig, GenerationSettings, LoadConfig
from bench_core.engines import engine_settings_key, transformers_engine, validate_engine_config
from bench_core.errors import ModelError
from bench_core.load.datasets import SampledRequest

# Each test here runs a real engine, server, app script or process for seconds: not in the fast suite.
pytestmark = pytest.mark.slow

OUTPUT_LENS = [1, 7, 30, 3, 18, 12, 25, 5]
PROMPTS = [
    "def main():\n    return 0",
    "The quick brown fox jumps over the lazy dog. " * 3,
    "import os",
    "Once upon a time",
    "class Parser:\n    pass\n" * 4,
    "x = 1",
    "Hello, world!",
    "for i in range(10): print(i)",
]


def _requests(output_lens=OUTPUT_LENS) -> list[SampledRequest]:
    return [SampledRequest(PROMPTS[i % len(PROMPTS)], 0, n) for i, n in enumerate(output_lens)]


def _run(engine, requests, concurrency=3, stream_output=True, generation=None, cancel=None):
    load = LoadConfig(concurrency=concurrency, stream_output=stream_output)
    return list(engine.stream(requests, generation or GenerationSettings(), load, cancel or threading.Event()))


def _by_request(events) -> dict[int, list]:
    per_request = defaultdict(list)
    for event in events:
        per_request[event.index].append(event)
    return per_request


@pytest.fixture(scope="module")
def batching_engine(tiny_model_path):
    engine = transformers_engine.TransformersBackend.load(EngineConfig(model=tiny_model_path), LoadConfig())
    # As the Runner holds a loaded engine (Runner._engine_for): frozen for the cyclic collector, which transformers
    # runs at the end of every batch and which would walk the model each time.
    gc.freeze()
    yield engine
    gc.unfreeze()
    engine.close()


@pytest.fixture(scope="module")
def generate_engine(tiny_model_path):
    engine = transformers_engine.TransformersEngine(EngineConfig(model=tiny_model_path), continuous_batching=False)
    yield engine
    engine.close()


@pytest.fixture(params=["continuous batching", "generate"])
def engine(request, batching_engine, generate_engine):
    return batching_engine if request.param == "continuous batching" else generate_engine


def test_every_request_produces_exactly_its_output_length_with_ignore_eos(engine):
    finishes = {e.index: e for e in _run(engine, _requests()) if e.kind == "finish"}
    assert {i: (e.n_tokens, e.finish_reason) for i, e in finishes.items()} == {
        i: (n, "length") for i, n in enumerate(OUTPUT_LENS)
    }


def test_events_of_a_request_come_in_order_with_monotonic_timestamps(engine):
    per_request = _by_request(_run(engine, _requests()))
    for index, events in per_request.items():
        kinds = [e.kind for e in events]
        assert kinds == ["admit"] + ["tokens"] * OUTPUT_LENS[index] + ["finish"]
        assert [e.n_tokens for e in events if e.kind == "tokens"] == list(range(1, OUTPUT_LENS[index] + 1))
        stamps = [e.ts for e in events]
        assert stamps == sorted(stamps)
        assert stamps[0] < stamps[1], "the first token comes after the admission"


def test_never_more_requests_in_the_engine_than_max_in_flight(engine):
    events = _run(engine, _requests(), concurrency=3)
    running, most = 0, 0
    for event in events:
        running += {"admit": 1, "finish": -1}.get(event.kind, 0)
        most = max(most, running)
    assert running == 0
    if engine.continuous_batching:
        assert most == 3
    else:
        assert most == 1  # the generate path serves one request at a time


def test_without_stream_output_a_request_reports_its_tokens_once_at_the_end(engine):
    per_request = _by_request(_run(engine, _requests(), stream_output=False))
    for index, events in per_request.items():
        assert [(e.kind, e.n_tokens) for e in events[1:]] == [
            ("tokens", OUTPUT_LENS[index]),
            ("finish", OUTPUT_LENS[index]),
        ]
        assert events[0].ts < events[1].ts <= events[2].ts


def test_cancel_stops_at_the_step_in_progress_and_aborts_the_running_requests(engine):
    cancel = threading.Event()
    requests = _requests([1500] * 4)
    cancelled_at = None
    events = []
    for event in engine.stream(requests, GenerationSettings(), LoadConfig(concurrency=2, stream_output=True), cancel):
        events.append(event)
        if event.kind == "tokens" and event.n_tokens == 5 and cancelled_at is None:
            cancel.set()
            cancelled_at = time.perf_counter()
    # The engine stopped at the step in progress, by its own token stamps: after the cancel a request gets at most
    # that step's token, and on the generate path (which checks for a stop before it hands a token over) the next
    # one's; never a run of tokens, though each request had some 1,495 left.
    after_cancel = Counter(e.index for e in events if e.kind == "tokens" and e.ts > cancelled_at)
    assert all(n <= 2 for n in after_cancel.values()), after_cancel
    per_request = _by_request(events)
    for events_of_one in per_request.values():
        finishes = [e for e in events_of_one if e.kind == "finish"]
        assert [e.finish_reason for e in finishes] == ["abort"]
        assert finishes[0].n_tokens < 1500
    assert len(per_request) == (2 if engine.continuous_batching else 1)


def test_the_engine_can_run_again_after_a_cancel(batching_engine):
    cancel = threading.Event()
    cancel.set()
    _run(batching_engine, _requests(), cancel=cancel)
    finishes = [e for e in _run(batching_engine, _requests([4, 6])) if e.kind == "finish"]
    assert sorted((e.n_tokens, e.finish_reason) for e in finishes) == [(4, "length"), (6, "length")]


def test_concurrency_can_change_between_runs_of_one_loaded_model(batching_engine):
    for concurrency in (1, 5):
        finishes = [e for e in _run(batching_engine, _requests([6, 6, 6]), concurrency) if e.kind == "finish"]
        assert sorted(e.n_tokens for e in finishes) == [6, 6, 6]


def test_a_request_larger_than_a_configured_cache_ends_with_an_error(tiny_model_path):
    engine = transformers_engine.TransformersBackend.load(
        EngineConfig(model=tiny_model_path, num_blocks=2, cache_block_seq_len=16), LoadConfig()
    )
    finishes = {e.index: e for e in _run(engine, _requests([4, 40])) if e.kind == "finish"}
    assert (finishes[0].n_tokens, finishes[0].finish_reason) == (4, "length")
    assert finishes[1].finish_reason == "error"
    assert "KV cache blocks" in finishes[1].message


def test_a_small_cache_serves_requests_in_turn(tiny_model_path):
    # Room for one request at a time (2 blocks of 16 tokens each); five may be in flight.
    engine = transformers_engine.TransformersBackend.load(
        EngineConfig(model=tiny_model_path, num_blocks=3, cache_block_seq_len=16), LoadConfig()
    )
    requests = [SampledRequest("x = 1", 0, 20) for _ in range(5)]
    finishes = [e for e in _run(engine, requests, concurrency=5) if e.kind == "finish"]
    assert sorted((e.n_tokens, e.finish_reason) for e in finishes) == [(20, "length")] * 5


def test_an_exception_inside_generation_ends_requests_with_error(engine, monkeypatch):
    def broken_forward(*args, **kwargs):
        raise RuntimeError("simulated kernel failure\nout of cheese")

    monkeypatch.setattr(engine._model, "forward", broken_forward)
    events = _run(engine, _requests([3, 3, 3, 3]), concurrency=2)
    finishes = [e for e in events if e.kind == "finish"]
    assert sorted(e.index for e in finishes) == [0, 1, 2, 3]
    assert all(e.finish_reason == "error" and "out of cheese" in e.message for e in finishes)
    assert all("\n" not in e.message for e in finishes)


def test_greedy_generation_stops_at_eos_unless_ignored(tiny_model_path, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # A copy of the tiny model whose EOS is the token greedy decoding picks first for this prompt.
    prompt = "def main():"
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    with torch.inference_mode():
        first = int(model(torch.tensor([tokenizer.encode(prompt)])).logits[0, -1].argmax())
    folder = tmp_path / "tiny-eos"
    shutil.copytree(tiny_model_path, folder)
    for name in ("config.json", "generation_config.json"):
        config = json.loads((folder / name).read_text())
        config["eos_token_id"] = first
        (folder / name).write_text(json.dumps(config))

    greedy = GenerationSettings(ignore_eos=False, do_sample=False)
    requests = [SampledRequest(prompt, 0, 10)]
    for continuous_batching in (True, False):
        engine = transformers_engine.TransformersEngine(
            EngineConfig(model=str(folder), dtype="float32"), continuous_batching=continuous_batching
        )
        stopped = [e for e in _run(engine, requests, generation=greedy) if e.kind == "finish"]
        assert [(e.n_tokens, e.finish_reason) for e in stopped] == [(1, "stop")]
        ignored = [e for e in _run(engine, requests, generation=replace(greedy, ignore_eos=True)) if e.kind == "finish"]
        assert [(e.n_tokens, e.finish_reason) for e in ignored] == [(10, "length")]


def test_engine_info_says_what_ran(batching_engine, generate_engine, tiny_model_path):
    info = batching_engine.info
    assert (info.backend, info.model_path, info.device) == ("transformers", tiny_model_path, "cpu")
    assert info.dtype in ("float32", "bfloat16")
    assert set(info.versions) == {"torch", "transformers"}
    assert any("continuous batching" in note for note in info.notes)
    assert "torch threads: 1" in info.notes
    assert any("generate fallback" in note for note in generate_engine.info.notes)


def test_the_thread_count_comes_from_the_environment(monkeypatch):
    assert transformers_engine.torch_threads() == 1
    monkeypatch.setenv("BENCH_STUDIO_TORCH_THREADS", "3")
    assert transformers_engine.torch_threads() == 3


def test_concurrency_keeps_the_engine_and_cache_sizing_reloads_it():
    engine = EngineConfig(model="builtin:tiny-llama")
    key = engine_settings_key(engine, LoadConfig(concurrency=1))
    assert engine_settings_key(engine, LoadConfig(concurrency=64, stream_output=True)) == key
    for cache_sizing in (
        {"num_blocks": 8},
        {"max_batch_tokens": 64},
        {"cache_block_seq_len": 32},
        {"enable_prefix_caching": True},
    ):
        assert engine_settings_key(replace(engine, **cache_sizing), LoadConfig()) != key
    assert engine_settings_key(replace(engine, dtype="float32"), LoadConfig()) != key
    assert engine_settings_key(replace(engine, model="builtin:smollm2-135m"), LoadConfig()) != key


@pytest.mark.parametrize(
    "change, expected",
    [
        ({"dtype": "int3"}, "Unknown dtype 'int3'"),
        ({"torch_device": "tpu"}, "Unknown torch device 'tpu'"),
        ({"num_blocks": 0}, "--num-blocks must be a whole number from 1 to 2,147,483,647; got 0"),
        ({"max_batch_tokens": 0}, "--max-batch-tokens must be a whole number from 1 to 16,777,216; got 0"),
        ({"cache_block_seq_len": 2}, "between 4 and 8192"),
    ],
)
def test_validation_explains_each_bad_knob(change, expected):
    problems = validate_engine_config(replace(EngineConfig(), **change), LoadConfig())
    assert len(problems) == 1 and expected in problems[0]


def test_default_knobs_are_valid():
    assert validate_engine_config(EngineConfig(), LoadConfig()) == []


def test_asking_for_cuda_without_a_gpu_is_refused():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    (problem,) = transformers_engine.TransformersBackend.validate(EngineConfig(torch_device="cuda"), LoadConfig())
    assert "no GPU" in problem


def test_the_engine_is_available_here():
    assert transformers_engine.TransformersBackend.availability("transformers") is None


def test_a_folder_that_is_no_model_is_one_model_error(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "no-such-architecture"}')
    with pytest.raises(ModelError) as caught:
        transformers_engine.TransformersBackend.load(EngineConfig(model=str(tmp_path)), LoadConfig())
    assert str(tmp_path) in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.slow
def test_smollm2_loads_generates_and_has_a_chat_template():
    engine = transformers_engine.TransformersBackend.load(EngineConfig(model="builtin:smollm2-135m"), LoadConfig())
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = engine.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert prompt.startswith("<|im_start|>") and prompt.endswith("<|im_start|>assistant\n")
    finishes = [e for e in _run(engine, [SampledRequest(prompt, 0, 8)] * 2, concurrency=2) if e.kind == "finish"]
    assert [(e.n_tokens, e.finish_reason) for e in finishes] == [(8, "length")] * 2
    assert engine.info.model_path.endswith("smollm2-135m-instruct-bf16-v2")


def test_the_cache_holds_max_in_flight_of_the_longest_request_within_a_budget(batching_engine, monkeypatch):
    from bench_core.engines import transformers_batching

    model = batching_engine._model
    engine = EngineConfig(cache_block_seq_len=16)
    requests = [SampledRequest("", 0, 30), SampledRequest("", 0, 10), SampledRequest("", 0, 5)]
    prompts = [10, 60, 3]  # prompt lengths: the longest request is 70 tokens, 5 blocks, plus one spare
    assert transformers_batching.cache_blocks_for(engine, model, prompts, requests, 2) == 2 * 6
    assert transformers_batching.cache_blocks_for(engine, model, prompts, requests, 50) == 3 * 6
    assert transformers_batching.cache_blocks_for(replace(engine, num_blocks=4), model, prompts, requests, 2) == 4
    block = transformers_batching.kv_block_bytes(model, 16)
    monkeypatch.setattr(transformers_batching, "CPU_CACHE_BUDGET_BYTES", 8 * block)
    assert transformers_batching.cache_blocks_for(engine, model, prompts, requests, 50) == 8
    monkeypatch.setattr(transformers_batching, "CPU_CACHE_BUDGET_BYTES", block)
    assert transformers_batching.cache_blocks_for(engine, model, prompts, requests, 50) == 6


def test_transformers_warning_of_a_manager_stopped_before_it_began_is_not_printed():
    # Ctrl-C in a run's first instant stops the manager before its thread built the batch processor; transformers
    # then warns on stderr, breaking the CLI's one-line promise. Its own logger says it, as transformers would.
    from transformers.generation.continuous_batching.utils import logger

    import bench_core.engines.transformers_batching  # noqa: F401 (installs the filter)

    heard: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: heard.append(record.getMessage())
    logger.addHandler(handler)  # beside its own handler: the one to stderr sees what this one sees
    try:
        logger.warning("\nBatch processor was not initialized.")
        logger.warning("a warning that matters")
    finally:
        logger.removeHandler(handler)
    assert heard == ["a warning that matters"]
