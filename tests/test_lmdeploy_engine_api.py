"""LMDeploy's engines on the engine_api load pattern: what each request is sent with through the engine instance
API (`create_instance()`, `async_stream_infer`), as benchmark/profile_throughput.py sends it, and how the outputs
become engine events.

Building TurboMind or the PyTorch engine needs an NVIDIA GPU; StandInEngineForNoGPU replaces only that engine:
its instances record every call and yield LMDeploy's real EngineOutput objects. The tokenizer is LMDeploy's own,
on the tiny Llama. No test here measures speed, and the stand-in produces no benchmark number.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import threading

import pytest
from test_lmdeploy_engine import cancelled_after_three_tokens

from bench_core.config import EngineConfig, GenerationSettings, LoadConfig
from bench_core.engines.base import CANCELLED_BY_LOAD, EngineInfo
from bench_core.engines.engine_api import SPEC_COLUMNS
from bench_core.load.datasets import SampledRequest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("lmdeploy") is None,
    reason="lmdeploy is not installed here (requirements-lmdeploy-reference.txt)",
)


class StandInInstanceForNoGPU:
    """An engine instance's async_stream_infer: one token per output (status SUCCESS), then a final FINISH with
    no new ids, as the PyTorch engine answers; a request of no tokens gets INPUT_LENGTH_ERROR. Every call and
    every stream closed before its end is recorded; with `spec`, each output carries LMDeploy's speculative
    accounting."""

    def __init__(self, engine: StandInEngineForNoGPU):
        self.engine = engine

    async def async_stream_infer(self, session_id, input_ids, gen_config=None, stream_output=False, **kwargs):
        from lmdeploy.messages import EngineOutput, RequestMetrics, ResponseType

        engine = self.engine
        engine.calls.append(
            dict(session_id=session_id, input_ids=input_ids, gen_config=gen_config, stream_output=stream_output)
        )
        engine.running += 1
        engine.peak = max(engine.peak, engine.running)
        finished = False
        try:
            if gen_config.max_new_tokens < 1:
                finished = True
                yield EngineOutput(ResponseType.INPUT_LENGTH_ERROR, [])
                return
            spec = RequestMetrics(spec_info=engine.spec) if engine.spec else None
            for n in range(gen_config.max_new_tokens):
                await asyncio.sleep(engine.token_delay_s)
                if stream_output:
                    yield EngineOutput(ResponseType.SUCCESS, [100 + n], req_metrics=spec)
            last = [] if stream_output else [100 + n for n in range(gen_config.max_new_tokens)]
            finished = True
            yield EngineOutput(ResponseType.FINISH, last, req_metrics=spec)
        finally:
            engine.running -= 1
            if not finished:
                engine.closed_early.append(session_id)


class StandInEngineForNoGPU:
    """Stands in for TurboMind / the PyTorch engine: `create_instance()` only. Measures nothing."""

    def __init__(self, token_delay_s: float = 0.0, spec: dict | None = None):
        self.token_delay_s, self.spec = token_delay_s, spec
        self.calls: list[dict] = []
        self.instances = 0
        self.running = self.peak = 0
        self.closed_early: list[int] = []

    def create_instance(self, cuda_stream_id=0):
        self.instances += 1
        return StandInInstanceForNoGPU(self)


class CountingTokenizer:
    """LMDeploy's Tokenizer, counting its incremental detokenizing."""

    def __init__(self, tokenizer):
        self.inner, self.detokenized = tokenizer, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def __call__(self, text):
        return self.inner(text)

    def detokenize_incrementally(self, *args, **kwargs):
        self.detokenized += 1
        return self.inner.detokenize_incrementally(*args, **kwargs)


@pytest.fixture
def tokenizer(tiny_model_path):
    from lmdeploy.tokenizer import Tokenizer

    return CountingTokenizer(Tokenizer(tiny_model_path))


def _engine(tokenizer, **stand_in):
    from bench_core.engines.lmdeploy_instance import LMDeployInstanceEngine

    built = StandInEngineForNoGPU(**stand_in)
    return LMDeployInstanceEngine(built, tokenizer, EngineInfo("pytorch", "m", "/m", "auto", "stand-in")), built


def _events(engine, requests, cancel=None, generation=None, **load):
    load = LoadConfig(load_pattern="engine_api", **{"concurrency": 2, "stream_output": True, **load})
    return list(engine.stream(requests, generation or GenerationSettings(), load, cancel or threading.Event()))


REQUESTS = [SampledRequest(f"prompt number {i}", 4, 3 + i) for i in range(5)]


def test_each_request_goes_in_as_their_script_sends_it(tokenizer):
    from lmdeploy.messages import GenerationConfig

    engine, built = _engine(tokenizer)
    sampling = GenerationSettings(do_sample=True, temperature=0.5, top_p=0.9, top_k=3)
    events = _events(engine, REQUESTS, concurrency=2, generation=sampling)
    assert built.instances == 2  # one per worker, min(-c, requests)
    assert sorted(call["session_id"] for call in built.calls) == [0, 1, 2, 3, 4]  # worker i: sessions i, i + 2, ...
    by_prompt = {tuple(tokenizer(r.prompt).input_ids): r for r in REQUESTS}
    for call in built.calls:
        request = by_prompt[tuple(call["input_ids"])]  # encoded in the measurement, as tokenizer(prompt).input_ids
        assert call["gen_config"] == GenerationConfig(
            max_new_tokens=request.output_len, temperature=0.5, top_p=0.9, top_k=3, ignore_eos=True
        )
        assert call["stream_output"] is True
    assert tokenizer.detokenized == sum(r.output_len + 1 for r in REQUESTS)  # every output, the final one too
    finishes = {e.index: e for e in events if e.kind == "finish"}
    assert {i: (e.finish_reason, e.n_tokens) for i, e in finishes.items()} == {
        i: ("length", r.output_len) for i, r in enumerate(REQUESTS)
    }
    assert built.peak == 2 and built.closed_early == []


def test_without_sampling_the_engine_decodes_greedily(tokenizer):
    engine, built = _engine(tokenizer)
    _events(engine, REQUESTS[:1], generation=GenerationSettings(top_k=5, temperature=0.7))
    assert built.calls[0]["gen_config"].top_k == 1


def test_ids_encoded_before_the_clock_go_in_as_they_are_and_nothing_is_detokenized(tokenizer):
    engine, built = _engine(tokenizer)
    requests = [dataclasses.replace(r, input_ids=tuple(engine.encode(r.prompt))) for r in REQUESTS]
    _events(engine, requests, skip_detokenize=True)
    assert sorted(tuple(call["input_ids"]) for call in built.calls) == sorted(r.input_ids for r in requests)
    assert all(
        call["input_ids"] == list(tokenizer.inner.encode(r.prompt))
        for call, r in zip(sorted(built.calls, key=lambda c: c["session_id"]), requests)
    )
    assert tokenizer.detokenized == 0


def test_every_output_ticks_its_cumulative_count_the_first_at_admission(tokenizer):
    engine, _ = _engine(tokenizer)
    events = _events(engine, REQUESTS[:2], concurrency=1)
    kinds = [(e.index, e.kind, e.n_tokens) for e in events]
    assert kinds[:6] == [
        (0, "admit", 0),
        (0, "tokens", 1),
        (0, "tokens", 2),
        (0, "tokens", 3),
        (0, "tokens", 3),
        (0, "finish", 3),
    ]
    assert kinds[6] == (1, "admit", 0)  # a worker takes the next request when its last is done


def test_without_streaming_one_output_carries_every_token(tokenizer):
    engine, built = _engine(tokenizer)
    events = _events(engine, REQUESTS[:2], stream_output=False)
    assert {call["stream_output"] for call in built.calls} == {False}
    for index in (0, 1):
        assert [e.n_tokens for e in events if e.index == index and e.kind == "tokens"] == [REQUESTS[index].output_len]


@pytest.mark.parametrize("stream_output", [True, False])
def test_each_finish_hands_over_the_answers_ids_streamed_or_not(tokenizer, stream_output):
    """The ids a run keeps for its drift (--keep-outputs): every EngineOutput's new ids, in order."""
    engine, _ = _engine(tokenizer)
    events = _events(engine, REQUESTS[:3], stream_output=stream_output)
    finishes = {e.index: e for e in events if e.kind == "finish"}
    for index in range(3):
        assert list(finishes[index].token_ids) == [100 + n for n in range(REQUESTS[index].output_len)]


def test_a_request_past_its_cancel_point_is_closed_and_counted_cancelled(tokenizer):
    engine, built = _engine(tokenizer)
    requests = [
        SampledRequest("a", 4, 10, cancel_after=2),
        SampledRequest("b", 4, 10, cancel_after=9),
        SampledRequest("c", 4, 10, cancel_after=0),
    ]
    finishes = {e.index: e for e in _events(engine, requests, concurrency=3) if e.kind == "finish"}
    assert (finishes[0].finish_reason, finishes[0].n_tokens) == (CANCELLED_BY_LOAD, 3)  # read past 2 tokens: stop
    assert "3 of 10 tokens" in finishes[0].message
    assert (finishes[1].finish_reason, finishes[1].n_tokens) == ("length", 10)  # past 9 is the last token: complete
    assert (finishes[2].finish_reason, finishes[2].n_tokens) == (CANCELLED_BY_LOAD, 1)
    # Each stream was closed where its worker stopped reading, b's too (at its last token, before the engine's end).
    assert sorted(built.closed_early) == [0, 1, 2]


def test_an_engine_error_fails_its_request_in_lmdeploys_words(tokenizer):
    engine, _ = _engine(tokenizer)
    finishes = {
        e.index: e
        for e in _events(engine, [SampledRequest("a", 4, 0), SampledRequest("b", 4, 2)])
        if e.kind == "finish"
    }
    assert (finishes[0].finish_reason, finishes[0].message) == ("error", "LMDeploy answered INPUT_LENGTH_ERROR")
    assert finishes[1].finish_reason == "length"


def test_speculative_accounting_is_summed_per_request(tokenizer):
    engine, _ = _engine(tokenizer, spec={"num_draft_tokens": 3, "num_accepted_tokens": 2})
    finishes = {e.index: e for e in _events(engine, REQUESTS[:2]) if e.kind == "finish"}
    for index, event in finishes.items():
        outputs = REQUESTS[index].output_len + 1  # each token's output, then the final one
        assert event.extra == dict(zip(SPEC_COLUMNS, (outputs, 3 * outputs, 2 * outputs)))


def test_without_speculative_accounting_nothing_is_reported(tokenizer):
    engine, _ = _engine(tokenizer)
    assert all(e.extra is None for e in _events(engine, REQUESTS[:2]) if e.kind == "finish")


def test_a_cancel_aborts_the_requests_being_read_before_they_generate_much(tokenizer):
    engine, built = _engine(tokenizer, token_delay_s=0.005)
    admitted, finishes = cancelled_after_three_tokens(engine, 6, "engine_api")
    assert len(admitted) == 2 and sorted(e.index for e in finishes) == sorted(admitted)
    assert {e.finish_reason for e in finishes} == {"abort"} and len(built.closed_early) == 2


def test_the_engine_api_builds_the_engine_itself_not_a_pipeline(monkeypatch):
    from bench_core.engines import lmdeploy_engine

    built = []
    monkeypatch.setattr(lmdeploy_engine, "build_instance_engine", lambda *args: built.append("engine") or "engine")
    monkeypatch.setattr(lmdeploy_engine, "build_engine", lambda *args: built.append("pipeline") or "pipeline")
    engine = EngineConfig(backend="pytorch")
    lmdeploy_engine.LMDeployBackend.load(engine, LoadConfig(load_pattern="engine_api"))
    lmdeploy_engine.LMDeployBackend.load(engine, LoadConfig(load_pattern="concurrency"))
    assert built == ["engine", "pipeline"]
