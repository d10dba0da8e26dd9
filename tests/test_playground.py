"""Playground core: prompt files, result exports, Engine.complete on the real tiny model, and runner jobs."""

import csv
import io
import json
import shutil
import threading
from types import SimpleNamespace

import pytest
from test_runner import tiny_config

from bench_core.config import EngineConfig, GenerationSettings
from bench_core.engines import transformers_engine
from bench_core.errors import ConfigError, DatasetError
from bench_core.load.playground import (
    PlaygroundResult,
    check_request,
    parse_prompt_file,
    prompts_from_text,
    results_to_csv_bytes,
    results_to_jsonl_bytes,
)
from bench_core.run.runner import Runner
from bench_core.store.history import History

USER = "user"


def user(text):
    return [{"role": USER, "content": text}]


# ---- prompt files --------------------------------------------------------------------------------


def test_typed_text_gives_one_user_message_per_non_blank_line():
    assert prompts_from_text("first\n\n  second  \n") == [user("first"), user("second")]


def test_a_text_file_is_one_prompt_per_line():
    assert parse_prompt_file("p.txt", "\ufeffa\nb\n".encode()) == [user("a"), user("b")]


def test_a_csv_file_reads_its_prompt_column_whatever_the_case():
    data = b'id,Prompt\n1,"Hello, world"\n2,\n3,"two\nlines"\n'
    assert parse_prompt_file("p.csv", data) == [user("Hello, world"), user("two\nlines")]


def test_jsonl_records_hold_a_prompt_or_messages():
    lines = [
        {"prompt": "plain"},
        {"messages": [{"role": "system", "content": "Be brief"}, {"role": "user", "content": "hi"}]},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "parts"}, {"type": "image_url"}]}]},
    ]
    data = "\n".join(json.dumps(line) for line in lines).encode()
    assert parse_prompt_file("p.jsonl", data) == [
        user("plain"),
        [{"role": "system", "content": "Be brief"}, {"role": "user", "content": "hi"}],
        user("parts"),
    ]


def test_a_json_file_is_a_list_of_openai_style_conversations():
    conversations = [
        [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}],
        "bare prompt",
    ]
    parsed = parse_prompt_file("chats.JSON", json.dumps(conversations).encode())
    assert parsed == [conversations[0], user("bare prompt")]


@pytest.mark.parametrize(
    "name, data, message",
    [
        ("p.pdf", b"%PDF", "use .txt, .csv, .jsonl, .json"),
        ("p.txt", b"\xff\xfe\x00", "not UTF-8"),
        ("p.txt", b"\n \n", "holds no prompt"),
        ("p.csv", b"question\nwhat?\n", "no 'prompt' column"),
        ("p.jsonl", b'{"prompt": "ok"}\n{"prompt": \n', "Line 2 of p.jsonl is not valid JSON"),
        ("p.jsonl", b'{"text": "no prompt key"}\n', "Line 1 of p.jsonl is neither a prompt nor a conversation"),
        ("p.json", b'{"messages": []}', "must hold a JSON list"),
        ("p.json", b'[[{"role": "robot", "content": "x"}]]', "role 'robot'"),
        ("p.json", b'[[{"role": "user", "content": 5}]]', "no text content"),
        ("p.json", b"[[]]", "Item 1 of p.json is neither"),
    ],
)
def test_a_bad_prompt_file_is_one_sentence_naming_the_problem(name, data, message):
    with pytest.raises(DatasetError, match=message):
        parse_prompt_file(name, data)


def test_a_request_with_nothing_to_run_or_impossible_sampling_is_refused_with_every_problem():
    bad = GenerationSettings(do_sample=True, temperature=0.0, top_p=1.5, top_k=-1)
    with pytest.raises(ConfigError) as error:
        check_request([], bad, 0)
    for part in ("no prompt", "at least 1", "temperature", "top_p", "top_k"):
        assert part in str(error.value)
    check_request([user("x")], GenerationSettings(do_sample=False, temperature=0.0), 1)  # greedy ignores them


# ---- exports -------------------------------------------------------------------------------------

RESULTS = [
    PlaygroundResult(1, "second", "ok", 12, 3, "stop", 0.01, 0.05),
    PlaygroundResult(0, "first", 'a, "quoted"\nanswer', 10, 8, "length", 0.02, 0.09),
    PlaygroundResult(2, "third", "", 9, 0, "abort", None, 0.1, "cancelled"),
]


def test_csv_export_is_in_prompt_order_and_round_trips_the_text():
    rows = list(csv.DictReader(io.StringIO(results_to_csv_bytes(RESULTS).decode())))
    assert [row["index"] for row in rows] == ["0", "1", "2"]
    assert rows[0]["text"] == 'a, "quoted"\nanswer'
    assert rows[2]["ttft_s"] == "" and rows[2]["error"] == "cancelled"


def test_jsonl_export_is_one_object_per_prompt_with_null_for_unmeasured_times():
    rows = [json.loads(line) for line in results_to_jsonl_bytes(RESULTS).decode().splitlines()]
    assert [row["prompt"] for row in rows] == ["first", "second", "third"]
    assert rows[2]["ttft_s"] is None and rows[0]["output_tokens"] == 8


# ---- Engine.complete on the tiny model -----------------------------------------------------------

CONVERSATIONS = [user("Hello there"), [{"role": "system", "content": "Be brief"}, {"role": "user", "content": "2+2?"}]]


@pytest.fixture(scope="module", params=[True, False], ids=["continuous-batching", "generate"])
def engine(request, tiny_model_path):
    engine = transformers_engine.TransformersEngine(
        EngineConfig(model=tiny_model_path), continuous_batching=request.param
    )
    yield engine
    engine.close()


def complete(engine, conversations=CONVERSATIONS, max_new_tokens=5, generation=None):
    results = engine.complete(conversations, generation or GenerationSettings(), max_new_tokens, threading.Event())
    return sorted(results, key=lambda r: r.index)


@pytest.mark.slow
def test_complete_applies_the_chat_template_and_counts_its_tokens(engine, tiny_tokenizer):
    results = complete(engine)
    templated = [
        tiny_tokenizer.apply_chat_template(c, add_generation_prompt=True, return_dict=False) for c in CONVERSATIONS
    ]
    assert [r.input_tokens for r in results] == [len(ids) for ids in templated]
    assert [r.input_tokens for r in results] != [len(tiny_tokenizer.encode(c[-1]["content"])) for c in CONVERSATIONS]
    assert [r.prompt for r in results] == ["Hello there", "2+2?"]


@pytest.mark.slow
def test_complete_stops_at_max_new_tokens_and_times_each_answer(engine):
    # The tiny model's greedy answers never reach its EOS (<|im_end|>) within a few tokens.
    for result in complete(engine, max_new_tokens=5):
        assert (result.output_tokens, result.finish_reason, result.error) == (5, "length", "")
        assert 0 < result.ttft_s <= result.total_s


@pytest.mark.slow
def test_complete_stops_at_eos_even_when_asked_to_ignore_it(tiny_model_path, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # A copy of the tiny model whose EOS is the first token greedy decoding picks after the chat template.
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    ids = tokenizer.apply_chat_template(CONVERSATIONS[0], add_generation_prompt=True, return_dict=False)
    with torch.inference_mode():
        first = int(model(torch.tensor([ids])).logits[0, -1].argmax())
    folder = tmp_path / "tiny-eos"
    shutil.copytree(tiny_model_path, folder)
    for name in ("config.json", "generation_config.json"):
        config = json.loads((folder / name).read_text())
        config["eos_token_id"] = first
        (folder / name).write_text(json.dumps(config))

    for continuous_batching in (True, False):
        eos_engine = transformers_engine.TransformersEngine(
            EngineConfig(model=str(folder), dtype="float32"), continuous_batching=continuous_batching
        )
        (result,) = complete(
            eos_engine, [CONVERSATIONS[0]], max_new_tokens=10, generation=GenerationSettings(ignore_eos=True)
        )
        assert (result.output_tokens, result.finish_reason) == (1, "stop")
        assert result.text == tokenizer.decode([first], skip_special_tokens=True)


@pytest.mark.slow
def test_complete_samples_when_asked(engine):
    sampled = GenerationSettings(do_sample=True, temperature=1.5, top_p=1.0, top_k=0)
    results = complete(engine, [user("Once upon a time")] * 4, max_new_tokens=12, generation=sampled)
    assert len({r.text for r in results}) > 1  # 4 greedy answers would be identical


# ---- runner jobs ---------------------------------------------------------------------------------


@pytest.fixture
def runner(tmp_path, tiny_model_path):
    runner = Runner(History(tmp_path / "results"))
    yield runner
    runner.shutdown()


@pytest.mark.slow
def test_a_playground_job_waits_behind_a_run_reuses_its_engine_and_is_not_recorded(runner):
    run = runner.submit(tiny_config(num_prompts=16, output_len=32))
    job = runner.submit_playground(run.config.engine, [user("hi"), user("there")], GenerationSettings(), 4)
    assert job.state == "queued" and runner.queue_position(job) == 1
    assert run.wait(60) and job.wait(60)
    assert job.state == "finished", job.message
    assert job.engine_info is run.measurement.engine_info  # the same loaded engine
    assert sorted(r.index for r in job.results) == [0, 1]
    assert runner.loaded_engine() == run.config.engine
    assert list(runner.history.load()["run_id"]) == [run.run_id]
    assert runner.runs() == [run] and runner.get(job.job_id) is None and runner.get_playground(job.job_id) is job


def test_a_playground_job_is_checked_before_it_is_queued(runner):
    with pytest.raises(ConfigError, match="Unknown backend"):
        runner.submit_playground(EngineConfig(backend="vllm"), [user("x")], GenerationSettings(), 4)
    with pytest.raises(ConfigError, match="no prompt"):
        runner.submit_playground(EngineConfig(), [], GenerationSettings(), 4)


def test_a_cancelled_job_keeps_what_finished(runner):
    engine = tiny_config().engine
    job = runner.submit_playground(engine, [user("story")] * 64, GenerationSettings(), 2000)
    while job.state != "running" and not job.wait(0.01):
        pass
    job.cancel()
    assert job.wait(10)
    assert job.state == "cancelled"
    assert all(r.finish_reason in ("abort", "length", "stop") for r in job.results)


# ---- LMDeploy's chat path, with a stand-in for the pipeline (no GPU here) ------------------------


class ChatPipelineStandIn:
    """Streams real lmdeploy Responses as the pipeline's stream_infer does: deltas, prompts interleaved."""

    backend_config = SimpleNamespace()

    def __init__(self):
        self.calls = []

    def stream_infer(self, prompts, gen_config=None, do_preprocess=True):
        from lmdeploy.messages import Response

        self.calls.append(dict(prompts=prompts, gen_config=gen_config, do_preprocess=do_preprocess))
        yield Response(text="Hel", generate_token_len=1, input_token_len=20, index=1)
        yield Response(text="Par", generate_token_len=1, input_token_len=11, index=0)
        yield Response(text="lo", generate_token_len=2, input_token_len=20, index=1, finish_reason="stop")
        yield Response(text="is", generate_token_len=2, input_token_len=11, index=0, finish_reason="length")


def test_lmdeploy_complete_asks_for_the_chat_template_and_eos_and_merges_the_stream():
    pytest.importorskip("lmdeploy")
    from bench_core.engines.base import EngineInfo
    from bench_core.engines.lmdeploy_pipeline import LMDeployEngine

    pipe = ChatPipelineStandIn()
    engine = LMDeployEngine(pipe, None, EngineInfo("turbomind", "m", "/m", "auto", "gpu"), max_batch_size=8)
    sampled = GenerationSettings(ignore_eos=True, do_sample=True, temperature=0.5, top_p=0.9, top_k=20)
    results = list(engine.complete([user("capital of France?"), user("greet")], sampled, 2, threading.Event()))
    (call,) = pipe.calls
    assert call["do_preprocess"] is True
    config = call["gen_config"]
    assert (config.ignore_eos, config.do_sample, config.max_new_tokens, config.top_k) == (False, True, 2, 20)
    assert [(r.index, r.text, r.input_tokens, r.output_tokens, r.finish_reason) for r in results] == [
        (1, "Hello", 20, 2, "stop"),
        (0, "Paris", 11, 2, "length"),
    ]
    assert all(0 <= r.ttft_s <= r.total_s for r in results)
