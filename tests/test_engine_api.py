"""The engine_api load pattern (profile_throughput.py's) on the embedded transformers engine, for real on CPU with
the tiny Llama: token ids in, outputs detokenized or not, the cancel rate drawn from the seed as their script draws
it and counted as cancelled, workers bounded by min(concurrency, requests); and the runner keeping what it prepares
(ids, cancel points) out of the clock."""

from __future__ import annotations

import random
import threading
from collections import Counter

import pytest

from bench_core.config import DatasetConfig, EngineConfig, GenerationSettings, LoadConfig, RunConfig
from bench_core.engines import transformers_engine
from bench_core.engines.base import CANCELLED_BY_LOAD
from bench_core.engines.engine_api import IncrementalText
from bench_core.load.cancellation import cancel_points
from bench_core.load.datasets import SampledRequest, load_conversations, sample_requests
from bench_core.run.runner import Runner, engine_api_requests

# Each test here runs a real engine, server, app script or process for seconds: not in the fast suite.
pytestmark = pytest.mark.slow


class CountingTokenizer:
    """The engine's tokenizer, counting what is encoded and decoded."""

    def __init__(self, tokenizer):
        self.inner, self.calls = tokenizer, Counter()

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def encode(self, *args, **kwargs):
        self.calls["encode"] += 1
        return self.inner.encode(*args, **kwargs)

    def decode(self, *args, **kwargs):
        self.calls["decode"] += 1
        return self.inner.decode(*args, **kwargs)


@pytest.fixture(scope="module")
def engine(tiny_model_path):
    engine = transformers_engine.TransformersBackend.load(EngineConfig(model=tiny_model_path), LoadConfig())
    yield engine
    engine.close()


@pytest.fixture
def counting(engine, monkeypatch):
    tokenizer = CountingTokenizer(engine._tokenizer)
    monkeypatch.setattr(engine, "_tokenizer", tokenizer)
    return tokenizer


def _stream(engine, requests, **load):
    load = LoadConfig(load_pattern="engine_api", **{"concurrency": 3, "stream_output": True, **load})
    return list(engine.stream(requests, GenerationSettings(), load, threading.Event()))


PROMPTS = ["def main():\n    return 0", "The quick brown fox jumps over the lazy dog.", "import os", "x = 1"]
REQUESTS = [SampledRequest(PROMPTS[i % 4], 0, n) for i, n in enumerate((5, 9, 3, 12, 7))]


def test_prompts_are_tokenized_in_the_measurement_and_outputs_detokenized(engine, counting):
    events = _stream(engine, REQUESTS)
    assert counting.calls["encode"] == len(REQUESTS)
    assert counting.calls["decode"] > 0
    finishes = {e.index: e for e in events if e.kind == "finish"}
    assert {i: (e.n_tokens, e.finish_reason) for i, e in finishes.items()} == {
        i: (r.output_len, "length") for i, r in enumerate(REQUESTS)
    }


def test_ids_in_and_no_detokenize_leave_the_tokenizer_alone(engine, counting):
    requests = [SampledRequest(r.prompt, 0, r.output_len, input_ids=tuple(engine.encode(r.prompt))) for r in REQUESTS]
    counting.calls.clear()
    events = _stream(engine, requests, skip_detokenize=True)
    assert counting.calls == Counter()
    assert sorted((e.index, e.n_tokens) for e in events if e.kind == "finish") == [
        (i, r.output_len) for i, r in enumerate(requests)
    ]


def test_workers_are_min_of_concurrency_and_requests_each_taking_the_next_when_done(engine):
    in_flight, peak = 0, 0
    for event in _stream(engine, REQUESTS, concurrency=2):
        in_flight += {"admit": 1, "finish": -1}.get(event.kind, 0)
        peak = max(peak, in_flight)
    assert peak == 2
    assert max(e.index for e in _stream(engine, REQUESTS[:2], concurrency=64) if e.kind == "admit") == 1


def test_streamed_ticks_count_up_and_unstreamed_arrive_once(engine):
    streamed = [e.n_tokens for e in _stream(engine, REQUESTS[3:4]) if e.kind == "tokens"]
    assert streamed == sorted(streamed) and streamed[-1] == 12 and len(streamed) > 1
    assert [e.n_tokens for e in _stream(engine, REQUESTS[3:4], stream_output=False) if e.kind == "tokens"] == [12]


def test_a_request_is_cancelled_past_its_point_and_the_engine_serves_on(engine):
    requests = [
        SampledRequest("x = 1", 0, 20, cancel_after=4),
        SampledRequest("import os", 0, 6, cancel_after=5),
        SampledRequest("Hello", 0, 8),
    ]
    finishes = {e.index: e for e in _stream(engine, requests) if e.kind == "finish"}
    assert finishes[0].finish_reason == CANCELLED_BY_LOAD and 5 <= finishes[0].n_tokens < 20
    assert (finishes[1].finish_reason, finishes[1].n_tokens) == ("length", 6)  # past 5 of 6 is the last: complete
    assert (finishes[2].finish_reason, finishes[2].n_tokens) == ("length", 8)


def test_the_text_comes_out_whole_piece_by_piece(tiny_tokenizer):
    prompt = tiny_tokenizer.encode("Once upon a time")
    output = tiny_tokenizer.encode(" there was a naïve café — déjà vu, 数据 ✓", add_special_tokens=False)
    text = IncrementalText(tiny_tokenizer, prompt)
    pieces = [text([token]) for token in output]
    assert "".join(pieces) == tiny_tokenizer.decode(output, skip_special_tokens=True)
    assert all("\ufffd" not in piece for piece in pieces)


def _their_cancel_draws(pairs: int, output_lens, rate: float, seed: int) -> list[int]:
    """profile_throughput.py's draws: `random` seeded in main(), one shuffle of the dataset when sampling, then
    process_request's draws per request (run on the global generator, as theirs, and put back after)."""
    saved = random.getstate()
    try:
        random.seed(seed)
        random.shuffle(list(range(pairs)))
        points = []
        for output_len in output_lens:
            cancel_after = output_len + 1
            if rate > 0 and random.random() < rate:
                cancel_after = random.randint(0, cancel_after)
            points.append(cancel_after)
        return points
    finally:
        random.setstate(saved)


@pytest.mark.parametrize("seed", [0, 7])
def test_the_cancel_points_are_profile_throughputs_for_the_same_seed(tiny_tokenizer, seed):
    sample = sample_requests(DatasetConfig(dataset="builtin:sample", num_prompts=40, seed=seed), tiny_tokenizer)
    pairs = len(load_conversations("builtin:sample").pairs)
    lens = [r.output_len for r in sample.requests]
    ours = cancel_points(lens, 0.25, sample.cancel_rng)
    assert [n + 1 if point is None else point for point, n in zip(ours, lens)] == _their_cancel_draws(
        pairs, lens, 0.25, seed
    )
    assert cancel_points(lens, 0.0, random.Random(1)) == [None] * len(lens)


def test_the_run_prepares_ids_and_cancel_points_before_the_clock(engine, tiny_tokenizer):
    sample = sample_requests(DatasetConfig(dataset="builtin:sample", num_prompts=6, seed=1), tiny_tokenizer)
    load = LoadConfig(load_pattern="engine_api", skip_tokenize=True, cancel_rate=1.0)
    first, again = engine_api_requests(sample, load, engine), engine_api_requests(sample, load, engine)
    assert first == again  # the plan does not move on: the sample's generator is copied
    assert all(r.input_ids == tuple(engine.encode(r.prompt)) and r.cancel_after is not None for r in first)
    plain = engine_api_requests(sample, LoadConfig(load_pattern="engine_api"), engine)
    assert all(r.input_ids is None and r.cancel_after is None for r in plain)


def test_a_cancel_rate_run_counts_its_cancelled_requests_as_cancelled_not_failed(tiny_model_path, tiny_tokenizer):
    dataset = DatasetConfig(dataset="builtin:sample", num_prompts=24, seed=0, sharegpt_output_len=16)
    config = RunConfig(
        engine=EngineConfig(backend="transformers", model=tiny_model_path, dtype="float32"),
        dataset=dataset,
        load=LoadConfig(
            load_pattern="engine_api",
            concurrency=4,
            stream_output=True,
            cancel_rate=0.25,
            skip_tokenize=True,
            skip_detokenize=True,
        ),
    )
    runner = Runner()
    try:
        run = runner.submit(config)
        assert run.wait(300)
        summary = runner.record(run).metrics
    finally:
        runner.shutdown()
    sample = sample_requests(dataset, tiny_tokenizer)
    planned = cancel_points([r.output_len for r in sample.requests], 0.25, sample.cancel_rng)
    cut_short = sum(point is not None and point <= 16 - 2 for point in planned)  # the draws that truncate
    assert 2 <= cut_short <= 10  # near a quarter of 24: the plan is a fair draw
    assert run.state == "finished", run.message
    assert (summary["cancelled"], summary["failed"], summary["incomplete"]) == (cut_short, 0, 0)
    assert summary["completed"] == 24 - cut_short
    assert summary["mean_ttft_ms"] > 0  # streamed: TTFT measured
