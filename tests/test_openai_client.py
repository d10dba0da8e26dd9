"""The OpenAI-compatible client: SSE parsing, payloads, and runs against real servers on 127.0.0.1.

`transformers serve` (tiny Llama, continuous batching) answers the real runs; a small misbehaving
server of our own (tests/openai_server.py) answers 500s, stalls, cuts streams and sends errors.
"""

import asyncio
import copy
import dataclasses
import json
import threading
import time
from collections import Counter

import pytest
from aiohttp import web
from openai_server import (  # noqa: F401 (fixtures)
    API_KEY,
    CHUNK_GAP_S,
    REUSE_PORTS,
    TOKENS_BEFORE_CUT,
    add_openai_routes,
    free_port,
    misbehaving_server,
    serving,
    transformers_server,
)
from scripted_server import PAIRED, TEXT_EVENTS, scripted_server  # noqa: F401 (fixture)

from bench_core.config import GenerationSettings
from bench_core.engines import openai_stream
from bench_core.engines.base import RUN_ENDED
from bench_core.engines.openai_client import ServerError, discover_model, run_requests
from bench_core.engines.openai_request import (
    RequestResult,
    ServerSpec,
    api_root,
    build_payload,
    count_prompt,
    overrun_advice,
    retokenize,
    sampling_fields,
)
from bench_core.engines.openai_stream import SSEMessage, SSEParser, StreamReader
from bench_core.errors import ConfigError
from bench_core.load.arrivals import achieved_rate
from bench_core.load.datasets import SampledRequest
from bench_core.states import RequestStatus

OVERRUN, SUCCESS = RequestStatus.OVERRUN, RequestStatus.SUCCESS

STREAM = (
    b": keep-alive ping\r\n\r\n"
    b'data: {"choices":[{"index":0,"delta":{"role":"assistant"}}]}\r\n\r\n'
    b'data: {"choices":[{"index":0,"delta":{"content":"caf\xc3\xa9"}}]}\n\n'
    b"id: 7\nretry: 100\n"
    b'data: {"choices":[{"index":0,"delta":{"content":"!"},"finish_reason":"length"}]}\n\n'
    b'data: {"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":2}}\n\n'
    b'event: error\ndata: {"message": "late"}\n\n'
    b"data: [DONE]\n\n"
)


def feed_split(chunks: list[bytes]) -> list[SSEMessage]:
    parser = SSEParser()
    messages = [m for chunk in chunks for m in parser.feed(chunk)]
    return messages + parser.close()


def read_all(messages) -> StreamReader:
    reader = StreamReader()
    for message in messages:
        reader.read_message(message)
    return reader


def data(body: dict) -> SSEMessage:
    return SSEMessage(json.dumps(body).encode())


def requests_for(prompts, output_len: int = 8) -> list[SampledRequest]:
    return [SampledRequest(prompt, 4, output_len) for prompt in prompts]


def finished(spec: ServerSpec, model: str, requests, **load):
    """Run to the end; return (events, results)."""
    run = run_requests(spec, model, requests, **load)
    events = list(run.events())
    return events, run.results, run


def finishes(events):
    return {e.index: e for e in events if e.kind == "finish"}


def ticks(events, index: int | None = None) -> list[tuple[float, int]]:
    """(ts, n_tokens) of every tick, in order: a "tokens" event carries those of one network read."""
    return [tick for e in events if e.kind == "tokens" and index in (None, e.index) for tick in e.ticks()]


# --- SSE parsing and stream reading: pure, no server --------------------------------------------


def test_sse_messages_are_the_same_wherever_the_byte_stream_is_cut():
    whole = feed_split([STREAM])
    assert [m.event for m in whole] == ["message"] * 4 + ["error", "message"]  # the ping carries no data
    for cut in range(1, len(STREAM)):
        assert feed_split([STREAM[:cut], STREAM[cut:]]) == whole, f"cut at byte {cut}"
    assert feed_split([STREAM[i : i + 1] for i in range(len(STREAM))]) == whole


def test_crlf_lines_comments_ids_and_retries_leave_only_the_data():
    messages = feed_split([STREAM])
    assert messages[0].data == b'{"choices":[{"index":0,"delta":{"role":"assistant"}}]}'
    assert all(not m.data.endswith(b"\r") for m in messages)


def test_nothing_after_done_counts():
    text = b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'
    reader = read_all(feed_split([text, b"data: [DONE]\n\n", text, text, b'event: error\ndata: {"x": 1}\n\n']))
    assert (reader.n_tokens, reader.text_parts, reader.error) == (1, ["a"], None)


def test_a_last_event_without_its_blank_line_is_still_read():
    assert feed_split([b"data: [DONE]"]) == [SSEMessage(b"[DONE]")]


def test_cr_only_lines_give_the_events_lf_lines_give_wherever_the_stream_is_cut():
    lf = STREAM.replace(b"\r\n", b"\n")
    cr = lf.replace(b"\n", b"\r")
    whole = feed_split([lf])
    for cut in range(1, len(cr)):
        assert feed_split([cr[:cut], cr[cut:]]) == whole, f"cut at byte {cut}"


def test_a_cr_only_event_is_given_when_its_blank_line_arrives_not_a_chunk_later():
    parser = SSEParser()
    assert parser.feed(b"data: a\r\r") == [SSEMessage(b"a")]
    assert parser.feed(b"\ndata: b\r\n\r") == [SSEMessage(b"b")]  # that LF ended the CR line before it
    assert parser.feed(b"\n") == [] and parser.close() == []


def test_a_long_event_in_many_chunks_is_scanned_about_twice_and_one_too_long_is_refused(monkeypatch):
    scanned = []
    line_ends = openai_stream._lines_as_lf  # every byte the parser looks at for line ends goes through it

    def counted(data: bytes) -> bytes:
        scanned.append(len(data))
        return line_ends(data)

    monkeypatch.setattr(openai_stream, "_lines_as_lf", counted)
    parser = SSEParser()
    body = b'data: {"choices":[{"index":0,"delta":{"content":"' + b"x" * 1_000_000 + b'"}}]}'
    chunks = [body[i : i + 1000] for i in range(0, len(body), 1000)]
    assert all(parser.feed(chunk) == [] for chunk in chunks)
    (message,) = parser.feed(b"\n\n")
    assert message.data == body[6:]
    assert sum(scanned) < 2.1 * len(body)  # each chunk and the joined event once: linear (was 1,000 x here)
    with pytest.raises(openai_stream.EventTooLarge, match="longer than 16 MiB"):
        for _ in range(17 * 1024):
            parser.feed(b"x" * 1024)


def test_an_event_that_is_not_utf8_is_named_as_such():
    reader = read_all([SSEMessage(b'{"choices":[{"delta":{"content":"\xff"}}]}')])
    assert reader.error.startswith("the server sent an event that is not UTF-8 (invalid start byte at byte 33)")


def test_empty_deltas_and_the_usage_only_chunk_add_no_tokens_but_usage_is_kept():
    reader = read_all(feed_split([STREAM])[:4])
    assert reader.n_tokens == 2
    assert "".join(reader.text_parts) == "café!"
    assert (reader.usage_completion_tokens, reader.usage_prompt_tokens) == (2, 4)
    assert reader.finish() == ("length", "")


def test_done_alone_ends_a_stream_as_stop():
    reader = read_all([data({"choices": [{"text": "a"}]}), SSEMessage(b"[DONE]")])
    assert reader.finish() == ("stop", "")


def test_per_chunk_usage_counts_tokens_when_the_server_sends_it():
    reader = read_all([data({"choices": [{"text": "ab"}], "usage": {"completion_tokens": 3}})])
    assert reader.n_tokens == 3


def test_usage_says_whether_it_came_at_the_end_or_with_each_chunk():
    final = read_all([data({"choices": [{"text": "a"}]}), data({"choices": [], "usage": {"completion_tokens": 2}})])
    per_chunk = read_all([data({"choices": [{"text": "ab"}], "usage": {"completion_tokens": 3}})])
    on_the_last_text = read_all(
        [data({"choices": [{"text": "a", "finish_reason": "length"}], "usage": {"completion_tokens": 4}})]
    )
    none = read_all([data({"choices": [{"text": "a", "finish_reason": "length"}]})])
    assert [r.usage_source for r in (final, per_chunk, on_the_last_text, none)] == [
        "usage",
        "chunk usage",
        "usage",
        None,
    ]


def served(finish_reason="length", requested=8, chunks=6, usage=None, usage_source=None, retokenized=None):
    return RequestResult(
        0,
        requested,
        0.0,
        sent_ts=1.0,
        n_tokens=chunks,
        usage_completion_tokens=usage,
        usage_source=usage_source,
        retokenized_tokens=retokenized,
        finish_reason=finish_reason,
    )


@pytest.mark.parametrize(
    "result, count, source",
    [
        (served(usage=8, usage_source="usage", retokenized=7), 8, "usage"),
        (served(usage=8, usage_source="chunk usage", retokenized=7), 8, "chunk usage"),
        (served(retokenized=5), 8, "limit (length stop)"),  # the server's own count, whatever ours says
        (served("stop", retokenized=5), 5, "retokenized"),
        (served("stop"), 6, "chunks"),
        (served("error", chunks=0, retokenized=0), 0, None),  # nothing came to count
    ],
)
def test_the_output_count_is_the_best_there_is_and_says_where_it_came_from(result, count, source):
    assert (result.output_tokens, result.output_source) == (count, source)


def test_a_chat_prompt_is_counted_in_the_tokenizers_template_and_without_one_as_its_text(tiny_tokenizer):
    request = SampledRequest("hello there", 4, 8)
    sent = RequestResult(0, 8, 0.0, sent_ts=1.0)
    text = tiny_tokenizer.apply_chat_template(
        [{"role": "user", "content": "hello there"}], add_generation_prompt=True, tokenize=False
    )
    templated = len(tiny_tokenizer.encode(text, add_special_tokens=False))
    assert templated > len(tiny_tokenizer.encode("hello there"))
    assert count_prompt(sent, request, tiny_tokenizer, chat=True) == templated
    assert count_prompt(sent, request, tiny_tokenizer, chat=False) == 4  # completions: the request's own length
    refusing = copy.deepcopy(tiny_tokenizer)
    refusing.chat_template = "{{ raise_exception('no such roles here') }}"
    assert count_prompt(sent, request, refusing, chat=True) == 4  # the run keeps a count, not a traceback
    refusing.chat_template = None
    assert count_prompt(sent, request, refusing, chat=True) == 4


@pytest.mark.parametrize(
    "result, status, mismatch",
    [
        (served(retokenized=7), SUCCESS, False),  # stopped for length, nothing to say otherwise: as long as asked
        (served(retokenized=9), SUCCESS, False),  # ...even where the text recounts to more
        (served(chunks=9, retokenized=9), OVERRUN, True),  # more chunks than tokens asked: past the limit for sure
        (served(usage=9, usage_source="usage"), OVERRUN, True),
        (served("stop", chunks=30, retokenized=30), OVERRUN, True),  # ran on to its own EOS
        (served("stop", retokenized=7), "", True),  # short of it, by EOS: left to the count (incomplete)
        # ...unless the server was not asked to ignore EOS: where it stopped is where the answer ends
        (dataclasses.replace(served("stop", retokenized=7), eos_ends_answer=True), SUCCESS, False),
        (dataclasses.replace(served("stop", chunks=30), eos_ends_answer=True), OVERRUN, True),
        (served(usage=6, usage_source="usage"), "", True),  # the server's own count: short is short
        (served(usage=8, usage_source="usage"), "", False),
        (served(chunks=0, retokenized=0), "", True),  # nothing came
        (served("error", retokenized=3), "", False),
    ],
)
def test_a_served_requests_length_is_judged_by_what_the_server_said_and_counted(result, status, mismatch):
    assert (result.length_status, result.length_mismatch) == (status, mismatch)


def test_reasoning_content_counts_as_output_but_not_as_answer_text():
    reader = read_all(
        [
            data({"choices": [{"delta": {"reasoning_content": "think"}}]}),
            data({"choices": [{"delta": {"content": "yes"}}]}),
        ]
    )
    assert reader.n_tokens == 2
    assert reader.text_parts == ["yes"]
    assert reader.reasoning_parts == ["think"]


@pytest.mark.parametrize(
    "message, expected",
    [
        (SSEMessage(b'{"message": "KV cache full"}', event="error"), "error event: KV cache full"),
        (data({"error": {"message": "out of memory", "code": 500}}), "reported an error: out of memory"),
        (data({"object": "error", "message": "bad prompt"}), "reported an error: bad prompt"),
        (SSEMessage(b"{not json"), "not JSON"),
    ],
)
def test_an_error_mid_stream_ends_the_request_with_the_servers_words(message, expected):
    reader = read_all([data({"choices": [{"text": "a"}]}), message])
    reason, text = reader.finish()
    assert reason == "error"
    assert expected in text
    assert reader.n_tokens == 1


def test_a_stream_that_stops_without_finishing_is_an_error():
    reason, message = read_all([data({"choices": [{"text": "a"}]})]).finish()
    assert reason == "error"
    assert "ended before the server finished" in message


@pytest.mark.parametrize(
    "body, text, tokens, error",
    [
        ({"id": "c", "usage": {"completion_tokens": 5}, "choices": [{"text": "a"}]}, "a", 5, None),  # usage first
        ({"id": "c", "meta": {"choices": []}, "choices": [{"text": "a"}]}, "a", 1, None),  # a nested "choices" first
        ({"id": "c", "object": "error", "message": "boom", "choices": []}, "", 0, "boom"),
        (
            {"id": "c", "choices": [{"text": '"choices": x'}], "usage": {"completion_tokens": 2}},
            '"choices": x',
            2,
            None,
        ),
    ],
)
def test_a_chunk_is_read_the_same_whatever_its_fields_before_choices(body, text, tokens, error):
    reader = read_all([data(body)])
    assert ("".join(reader.text_parts), reader.n_tokens) == (text, tokens)
    assert (reader.error is None) if error is None else (error in reader.error)


def test_an_unusual_finish_reason_is_served_with_a_note():
    assert read_all([data({"choices": [{"text": "a", "finish_reason": "content_filter"}]})]).finish() == (
        "stop",
        "the server's finish_reason was 'content_filter'",
    )


def deep(levels: int) -> list:
    """A list `levels` deep: past Python's recursion limit, repr() and json.loads raise RecursionError."""
    nested: list = []
    for _ in range(levels):
        nested = [nested]
    return nested


@pytest.mark.parametrize(
    "body, said",
    [
        (b'{"choices":[{"text":"a"}],"usage":{"completion_tokens":Infinity}}', "not JSON (unexpected character"),
        (
            b'{"choices":[{"text":"a"}],"usage":{"completion_tokens":-1}}',
            "usage.completion_tokens this client cannot count: -1",
        ),
        (
            b'{"choices":[{"text":"a"}],"usage":{"completion_tokens":1e30}}',
            "usage.completion_tokens this client cannot count: 1e+30",
        ),
        (
            b'{"choices":[{"text":"a"}],"usage":{"completion_tokens":"12"}}',
            "usage.completion_tokens this client cannot count: '12'",
        ),
        (
            b'{"choices":[{"text":"a"}],"usage":{"completion_tokens":true}}',
            "usage.completion_tokens this client cannot count: True",
        ),
        (b'{"choices":[{"text":"a"}],"usage":{"completion_tokens":2147483648}}', "cannot count: 2147483648"),
        (
            b'{"choices":[],"usage":{"prompt_tokens":-5,"completion_tokens":3}}',
            "usage.prompt_tokens this client cannot count: -5",
        ),
        (
            b'{"choices":[],"usage":{"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":1.5}}}',
            "usage.prompt_tokens_details.cached_tokens this client cannot count: 1.5",
        ),
        (b'{"choices":[],"usage":[3]}', "a usage that is not an object: [3]"),
        (b'{"choices":[{"text":7}]}', "a choices[0].text that is not a string: 7"),
        (b'{"choices":[{"delta":{"content":["a"]}}]}', "a choices[0].delta.content that is not a string: ['a']"),
        (
            b'{"choices":[{"delta":{"reasoning_content":5}}]}',
            "a choices[0].delta.reasoning_content that is not a string: 5",
        ),
        (b'{"choices":[{"message":"hi"}]}', "a choices[0].message that is not an object: 'hi'"),
        (b'{"choices":[["a"]]}', "choices that are not a list of objects: [['a']]"),
        (b'{"choices":{"text":"a"}}', "choices that are not a list of objects: {'text': 'a'}"),
        (b'{"choices":[{"text":"a","finish_reason":1}]}', "a choices[0].finish_reason that is not a string: 1"),
        (b"[1, 2]", "the server sent JSON that is not an object: [1, 2]"),
        (b"[" * 5000, "not JSON (depth limit exceeded"),
        (b'{"a":' * 100_000 + b"1" + b"}" * 100_000, "not JSON (depth limit exceeded"),
        (b'{"choices":[{"text":"\xff"}]}', "not UTF-8 (invalid start byte at byte 21)"),
    ],
)
@pytest.mark.parametrize("streamed", [True, False])
def test_a_value_this_client_cannot_read_fails_the_request_saying_what_it_was(body, said, streamed):
    reader = StreamReader()
    if streamed:
        reader.read_message(SSEMessage(body))
    else:
        reader.read_json(body)
    reason, message = reader.finish()
    assert reason == "error"
    assert said in message
    assert len(message) < 500


def test_a_count_sent_as_a_whole_float_is_read_as_that_count():
    reader = read_all(
        [data({"choices": [{"text": "a", "finish_reason": "length"}], "usage": {"completion_tokens": 5.0}})]
    )
    assert (reader.finish(), reader.n_tokens, reader.usage_completion_tokens) == (("length", ""), 5, 5)


@pytest.mark.parametrize(
    "body, shown",
    [
        (b"[" * 5000, "[" * openai_stream.ERROR_BODY_CHARS),
        ("[" * 5000, "[" * openai_stream.ERROR_BODY_CHARS),
        (b'{"error":' * 100_000 + b"1" + b"}" * 100_000, '{"error":' * 33 + '{"e'),
        (b"\xff\xfe overloaded", "\ufffd\ufffd overloaded"),
        (b'{"message": "' + b"x" * 20_000_000 + b'"}', "x" * openai_stream.ERROR_BODY_CHARS),
        ({"error": {"message": deep(100_000)}}, "[[[[[[[...]]]]]]]"),
        (
            {"detail": [{"loc": ["body", "ignore_eos"], "msg": "Extra"}]},
            "[{'loc': ['body', 'ignore_eos'], 'msg': 'Extra'}]",
        ),
        ({"code": deep(100_000)}, "{'code': [[[[[[...]]]]]]}"),
    ],
)
def test_an_error_body_is_shown_short_whatever_it_holds(body, shown):
    assert openai_stream.error_text(body) == shown


# --- payloads and addresses ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "kind, expected",
    [
        ("lmdeploy", {"ignore_eos": True}),
        ("vllm", {"ignore_eos": True}),
        ("sglang", {"ignore_eos": True}),
        ("transformers", {"generation_config": json.dumps({"eos_token_id": -1, "max_new_tokens": 16})}),
        ("openai", {}),
    ],
)
def test_ignore_eos_is_sent_the_way_each_server_takes_it(kind, expected):
    payload = build_payload(ServerSpec("http://h:1", server_kind=kind), "m", "hi", 16, ignore_eos=True)
    extra = {k: payload[k] for k in ("ignore_eos", "generation_config") if k in payload}
    assert extra == expected
    assert "ignore_eos" not in build_payload(
        ServerSpec("http://h:1", server_kind=kind), "m", "hi", 16, ignore_eos=False
    )


@pytest.mark.parametrize(
    "field, sent",
    [
        ("max_completion_tokens", {"max_completion_tokens": 16}),
        ("max_tokens", {"max_tokens": 16}),
        ("both", {"max_tokens": 16, "max_completion_tokens": 16}),
    ],
)
def test_a_chat_request_sends_its_limit_in_the_field_asked(field, sent):
    chat = build_payload(ServerSpec("http://h:1", endpoint="chat", chat_limit_field=field), "m", "hi", 16, False)
    assert {key: chat[key] for key in ("max_tokens", "max_completion_tokens") if key in chat} == sent
    plain = build_payload(ServerSpec("http://h:1", chat_limit_field=field), "m", "hi", 16, False)
    assert (plain["max_tokens"], "max_completion_tokens" in plain) == (16, False)  # completions have one field


@pytest.mark.parametrize(
    "endpoint, field, advice",
    [
        (
            "chat",
            "max_completion_tokens",
            "the server seems to ignore max_completion_tokens: send max_tokens with "
            "--chat-limit-field max_tokens (or both)",
        ),
        (
            "chat",
            "max_tokens",
            "the server seems to ignore max_tokens: send max_completion_tokens with "
            "--chat-limit-field max_completion_tokens (or both)",
        ),
        ("chat", "both", "the server seems to ignore both max_tokens and max_completion_tokens"),
        ("completions", "both", "the server seems to ignore max_tokens, the completions endpoint's only limit"),
    ],
)
def test_an_overrun_names_the_field_the_server_ignores_and_the_flag_that_sends_another(endpoint, field, advice):
    assert overrun_advice(ServerSpec("http://h:1", endpoint=endpoint, chat_limit_field=field)) == (
        f"more tokens than asked: {advice}"
    )


def test_chat_and_completions_payloads_ask_for_the_length_and_usage():
    chat = build_payload(ServerSpec("http://h:1", endpoint="chat"), "m", "hi", 16, False)
    assert chat["messages"] == [{"role": "user", "content": "hi"}]
    assert chat["max_completion_tokens"] == 16
    assert chat["stream_options"] == {"include_usage": True}
    plain = build_payload(ServerSpec("http://h:1", stream=False), "m", "hi", 16, False)
    assert (plain["prompt"], plain["max_tokens"], plain["stream"]) == ("hi", 16, False)
    assert "stream_options" not in plain


def test_the_extra_body_overrides_the_payload():
    spec = ServerSpec("http://h:1", server_kind="vllm", extra_body={"ignore_eos": False, "temperature": 0.0})
    payload = build_payload(spec, "m", "hi", 16, True)
    assert (payload["ignore_eos"], payload["temperature"]) == (False, 0.0)


@pytest.mark.parametrize(
    "kind, sent",
    [
        ("lmdeploy", {"temperature": 0.7, "top_p": 0.9, "top_k": 20}),
        ("vllm", {"temperature": 0.7, "top_p": 0.9, "top_k": 20}),
        ("sglang", {"temperature": 0.7, "top_p": 0.9, "top_k": 20}),
        ("transformers", {"temperature": 0.7, "top_p": 0.9}),
        ("openai", {"temperature": 0.7, "top_p": 0.9}),
    ],
)
def test_a_sampling_run_sends_its_sampling_fields_and_a_greedy_one_temperature_0(kind, sent):
    sampling = GenerationSettings(do_sample=True, temperature=0.7, top_p=0.9, top_k=20)
    assert sampling_fields(sampling, kind) == sent
    assert sampling_fields(GenerationSettings(temperature=0.7, top_p=0.9, top_k=20), kind) is None
    chat = build_payload(
        ServerSpec("http://h:1", server_kind=kind, endpoint="chat", sampling=sent), "m", "hi", 16, False
    )
    assert ({key: chat[key] for key in ("temperature", "top_p", "top_k") if key in chat}, "best_of" in chat) == (
        sent,
        False,
    )
    greedy = build_payload(ServerSpec("http://h:1", server_kind=kind), "m", "hi", 16, False)
    assert ({key: greedy[key] for key in ("temperature", "top_p", "top_k") if key in greedy}, greedy["best_of"]) == (
        {"temperature": 0.0},
        1,
    )


def test_transformers_serve_samples_under_the_generation_config_that_ignores_eos():
    sampling = {"temperature": 0.7, "top_p": 0.9}
    sampled = build_payload(
        ServerSpec("http://h:1", server_kind="transformers", sampling=sampling), "m", "hi", 16, True
    )
    assert json.loads(sampled["generation_config"]) == {"eos_token_id": -1, "max_new_tokens": 16, "do_sample": True}
    greedy = build_payload(ServerSpec("http://h:1", server_kind="transformers"), "m", "hi", 16, True)
    assert json.loads(greedy["generation_config"]) == {"eos_token_id": -1, "max_new_tokens": 16}


@pytest.mark.parametrize("url", ["http://h:1", "http://h:1/", "http://h:1/v1", "http://h:1/v1/"])
def test_the_base_url_may_be_written_with_or_without_v1(url):
    assert ServerSpec(url).url == "http://h:1/v1/completions"
    assert api_root(url) == "http://h:1"


@pytest.mark.parametrize(
    "fields",
    [
        {"base_url": "h:1"},
        {"endpoint": "embeddings"},
        {"server_kind": "tgi"},
        {"read_timeout_s": 0},
        {"chat_limit_field": "n_predict"},
    ],
)
def test_impossible_server_settings_are_refused_with_a_clear_message(fields):
    with pytest.raises(ConfigError):
        ServerSpec(**{"base_url": "http://h:1", **fields})


def test_the_api_key_never_shows_in_the_spec():
    assert "sk-" not in repr(ServerSpec("http://h:1", api_key="sk-hidden"))


# --- real runs against transformers serve -------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_eight_requests_with_ignore_eos_come_back_exactly_as_long_as_asked(
    transformers_server, tiny_tokenizer, endpoint
):
    model = discover_model(transformers_server)
    spec = ServerSpec(transformers_server, endpoint=endpoint, server_kind="transformers")
    lengths = [4, 8, 12, 16, 4, 8, 12, 16]
    requests = [SampledRequest(f"Request {i} says hello", 6, n) for i, n in enumerate(lengths)]
    events, results, _ = finished(spec, model, requests, max_concurrency=8)

    assert [r.usage_completion_tokens for r in results] == lengths
    assert [r.finish_reason for r in results] == ["length"] * 8
    assert not any(r.length_mismatch for r in results)
    assert Counter(e.kind for e in events if e.kind != "tokens") == {"admit": 8, "finish": 8}
    for index, n in enumerate(lengths):
        counts = [tokens for _, tokens in ticks(events, index)]
        assert counts == sorted(set(counts))  # cumulative, growing
        assert counts[-1] == n  # one chunk per token: the count matches the server's usage
        assert finishes(events)[index].n_tokens == n
        assert results[index].sent_ts < results[index].first_answer_ts <= results[index].end_ts
    retokenize(results, tiny_tokenizer)
    assert all(r.retokenized_tokens > 0 for r in results)


def test_the_events_of_one_network_read_reach_the_reader_as_one_hand_off_each_with_its_own_time(scripted_server):
    # The scripted server writes chunk PAIRED late, in one write with the chunk after it; every other chunk alone.
    events, (result,), _ = finished(
        ServerSpec(scripted_server), "scripted", requests_for(["a"], output_len=TEXT_EVENTS)
    )
    batches = [e for e in events if e.kind == "tokens"]
    # One hand-off per network read, not one per token. A read may bring more than one write when the client is
    # scheduled late (on a busy machine), never less than one: so at most one batch per write, and the paired
    # write's two events always reach the reader together.
    assert len(batches) <= TEXT_EVENTS - 1
    paired = [e for e in batches if PAIRED + 1 in e.earlier_ns]
    assert len(paired) == 1 and paired[0].n_tokens >= PAIRED + 2
    for batch in batches:  # one timestamp per event, in order, even within one read
        assert list(batch.earlier_ts) == sorted(batch.earlier_ts) and all(ts < batch.ts for ts in batch.earlier_ts)
    times = [ts for ts, _ in ticks(events)]
    assert [tokens for _, tokens in ticks(events)] == list(range(1, TEXT_EVENTS + 1))
    assert times == sorted(set(times)) and times[0] == result.first_answer_ts


def test_answers_shorter_than_asked_are_flagged(misbehaving_server):
    _, results, _ = finished(ServerSpec(misbehaving_server), "m", requests_for(["short", "ok"], output_len=6))
    assert [(r.finish_reason, r.output_tokens) for r in results] == [("stop", 3), ("length", 6)]
    assert [r.length_mismatch for r in results] == [True, False]


@pytest.mark.slow
def test_a_wrong_model_name_is_the_servers_4xx_message_on_each_request(transformers_server):
    spec = ServerSpec(transformers_server, server_kind="transformers")
    _, results, _ = finished(spec, "no-such-model", requests_for(["a", "b"]))
    assert [r.finish_reason for r in results] == ["error", "error"]
    assert "HTTP 400" in results[0].message
    assert "no-such-model" in results[0].message


@pytest.mark.slow
def test_a_wrong_url_is_a_404_on_each_request(transformers_server):
    spec = ServerSpec(transformers_server + "/not-here")
    events, results, _ = finished(spec, "m", requests_for(["a", "b"]))
    assert all(r.finish_reason == "error" and "HTTP 404" in r.message for r in results)
    assert len(finishes(events)) == 2


@pytest.mark.slow
def test_the_model_is_discovered_from_v1_models(transformers_server, tiny_model_path):
    assert discover_model(transformers_server + "/v1/") == tiny_model_path


# --- failures, one request at a time --------------------------------------------------------------


def test_a_server_that_is_down_fails_every_request_with_a_clear_message():
    spec = ServerSpec(f"http://127.0.0.1:{free_port()}")
    events, results, _ = finished(spec, "m", requests_for(["a", "b", "c"]))
    assert [e.finish_reason for e in finishes(events).values()] == ["error"] * 3
    assert all("cannot connect" in r.message and "is the server running?" in r.message for r in results)
    with pytest.raises(ServerError, match="Cannot reach"):
        discover_model(spec.base_url, timeout_s=2)


def test_each_bad_answer_is_its_own_error_and_the_rest_of_the_run_goes_on(misbehaving_server):
    spec = ServerSpec(misbehaving_server, read_timeout_s=1.0)
    prompts = ["ok", "status500", "slow", "cut", "error-event", "ok"]
    events, results, _ = finished(spec, "m", requests_for(prompts))
    by_prompt = dict(zip(prompts, results))
    assert results[0].finish_reason == results[-1].finish_reason == "length"
    assert results[0].output_tokens == 8
    assert "HTTP 500" in by_prompt["status500"].message and "the engine crashed" in by_prompt["status500"].message
    assert "read timeout" in by_prompt["slow"].message
    assert "cut after 3 tokens" in by_prompt["cut"].message
    assert "out of memory" in by_prompt["error-event"].message
    for prompt in ("cut", "error-event"):  # tokens received before the failure are kept
        result = by_prompt[prompt]
        assert result.finish_reason == "error"
        assert result.n_tokens == TOKENS_BEFORE_CUT
        assert finishes(events)[result.index].n_tokens == TOKENS_BEFORE_CUT
    assert Counter(e.index for e in events if e.kind == "finish") == Counter(range(len(prompts)))


def test_an_odd_value_in_an_answer_fails_that_request_and_the_others_are_served(misbehaving_server):
    prompts = ["ok", "infinite-usage", "ok", "number-text", "deep-500", "ok"]
    events, results, _ = finished(ServerSpec(misbehaving_server), "m", requests_for(prompts))
    by_prompt = dict(zip(prompts, results))
    assert [r.finish_reason for r in results] == ["length", "error", "length", "error", "error", "length"]
    assert all(r.output_tokens == 8 and r.text == " tok" * 8 for r in results if r.finish_reason == "length")
    infinite, number = by_prompt["infinite-usage"].message, by_prompt["number-text"].message
    assert "not JSON" in infinite and '"completion_tokens": Infinity' in infinite
    assert number.startswith("the server sent a choices[0].text that is not a string: 7")
    deep_500 = by_prompt["deep-500"].message
    assert deep_500.startswith("HTTP 500 Internal Server Error from ") and deep_500.endswith("[" * 100)
    assert Counter(e.index for e in events if e.kind == "finish") == Counter(range(len(prompts)))


def test_reasoning_counts_as_output_but_the_first_tick_is_the_first_answer_text(misbehaving_server):
    spec = ServerSpec(misbehaving_server, endpoint="chat")
    events, results, _ = finished(spec, "m", requests_for(["reasoning"], output_len=8))
    result = results[0]
    assert (result.n_tokens, result.usage_completion_tokens) == (8, 8)
    assert result.reasoning_text == "hmm" * 4
    assert result.text == " tok" * 4
    # profile_restful_api.py's TTFT: the four reasoning chunks tick nothing, their tokens come with the answer's first
    answer_ticks = ticks(events)
    assert [tokens for _, tokens in answer_ticks] == [5, 6, 7, 8]
    assert answer_ticks[0][0] == result.first_answer_ts
    assert result.sent_ts < result.first_reasoning_ts < result.first_answer_ts
    # The server writes the first answer chunk four gaps after the request arrived (the first reasoning chunk at once):
    # no client reads it sooner after its send, however busy the machine. (A gap between the two ticks would not
    # hold: a client held up at the start reads the reasoning and the answer in one go.)
    assert result.first_answer_ts - result.sent_ts >= 4 * CHUNK_GAP_S
    assert result.reasoning_ticks == []  # held for an answer that came


def test_a_request_that_only_reasoned_keeps_its_reasoning_chunks_for_the_engine_to_tick(misbehaving_server):
    _, results, _ = finished(
        ServerSpec(misbehaving_server, endpoint="chat"), "m", requests_for(["thinking"], output_len=4)
    )
    result = results[0]
    assert (result.finish_reason, result.text, result.first_answer_ts) == ("length", "", None)
    assert [tokens for _, tokens in result.reasoning_ticks] == [1, 2, 3, 4]
    assert result.reasoning_ticks[0][0] == result.first_reasoning_ts


def test_an_answer_without_reasoning_has_no_reasoning_time(misbehaving_server):
    _, results, _ = finished(ServerSpec(misbehaving_server, endpoint="chat"), "m", requests_for(["ok"], output_len=4))
    assert (results[0].first_reasoning_ts, results[0].reasoning_ticks) == (None, [])


def test_the_api_key_is_sent_as_a_bearer_header_and_kept_out_of_messages(misbehaving_server, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    _, results, _ = finished(ServerSpec(misbehaving_server, api_key="sk-wrong-key"), "m", requests_for(["auth"]))
    assert "HTTP 401" in results[0].message
    assert "sk-wrong-key" not in results[0].message
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    _, results, _ = finished(ServerSpec(misbehaving_server), "m", requests_for(["auth"]))
    assert results[0].finish_reason == "length"


# --- load: concurrency, rate, duration, warm-up, cancel -------------------------------------------


def test_max_concurrency_is_never_exceeded(misbehaving_server):
    events, _, run = finished(ServerSpec(misbehaving_server), "m", requests_for(["ok"] * 12), max_concurrency=3)
    in_flight, peak = 0, 0
    for event in events:  # the events come in the order they happened
        in_flight += {"admit": 1, "finish": -1}.get(event.kind, 0)
        peak = max(peak, in_flight)
    assert peak == 3  # 12 requests at once, 80 ms each: the cap is reached and held
    assert run.arrivals().peak_in_flight == 3


def test_connections_are_reused_across_requests(misbehaving_server):
    _, results, _ = finished(
        ServerSpec(misbehaving_server), "m", requests_for(["reuse"] * 12, output_len=2), max_concurrency=2
    )
    assert [r.finish_reason for r in results] == ["length"] * 12
    assert 1 <= len(REUSE_PORTS) <= 2  # one pooled connection per slot, not one per request


def test_requests_go_out_on_schedule_never_early(misbehaving_server):
    _, results, run = finished(
        ServerSpec(misbehaving_server), "m", requests_for(["ok"] * 6, output_len=2), request_rate=20.0, arrival_seed=1
    )
    assert [r.finish_reason for r in results] == ["length"] * 6
    assert all(r.sent_ts >= run.t0 + r.scheduled_s for r in results)
    report = run.arrivals()
    assert report.requested_rate == 20.0
    assert report.sent == 6
    assert (
        0 < report.achieved_rate <= achieved_rate([r.scheduled_s for r in results]) * 1.01
    )  # late sends only lower it


def test_a_duration_stops_sending_and_cancels_requests_still_in_flight(misbehaving_server):
    events, results, run = finished(
        ServerSpec(misbehaving_server), "m", requests_for(["ok"] * 40, output_len=2), request_rate=20.0, duration_s=0.5
    )
    sent = [r for r in results if r.sent_ts is not None]
    unsent = [r for r in results if r.sent_ts is None]
    assert sent and unsent
    assert all(r.finish_reason == "length" or (r.finish_reason == RUN_ENDED and r.end_ts >= run.t0 + 0.5) for r in sent)
    assert all(r.sent_ts < run.t0 + 0.5 for r in sent)
    assert all(r.finish_reason == "abort" and "duration had ended" in r.message for r in unsent)
    assert len(finishes(events)) == 40


def test_warm_ups_are_sent_first_and_not_measured(misbehaving_server):
    events, results, _ = finished(ServerSpec(misbehaving_server), "m", requests_for(["ok", "ok"]), warmup=2)
    assert sorted({e.index for e in events}) == [0, 1]
    assert len(results) == 2


def test_a_failed_warm_up_stops_the_run_with_one_message():
    run = run_requests(ServerSpec(f"http://127.0.0.1:{free_port()}"), "m", requests_for(["a", "b"]), warmup=1)
    with pytest.raises(ServerError, match="warm-up request failed.*cannot connect"):
        list(run.events())
    assert all(r.sent_ts is None for r in run.results)


HOLD_S = 60.0  # how long the held request's stream would go on: far past any cancel
TOKEN_CHUNK = b'data: {"choices": [{"index": 0, "text": " tok", "finish_reason": null}]}\n\n'
LAST_CHUNKS = b'data: {"choices": [{"index": 0, "text": "", "finish_reason": "length"}]}\n\ndata: [DONE]\n\n'


def holding_app(log: list[str], closed: threading.Event) -> web.Application:
    """A server that streams one token of the first request it gets, then holds that stream for HOLD_S before it
    finishes (any later request gets its token and its end at once). `log` says what it saw: "arrived" per request,
    then "closed" (the client went away: handler_cancellation) or "finished"."""

    async def answer(request: web.Request, endpoint: str) -> web.StreamResponse:
        held = not log
        log.append("arrived")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(TOKEN_CHUNK)
        try:
            await asyncio.sleep(HOLD_S if held else 0)
        except asyncio.CancelledError:
            log.append("closed")
            closed.set()
            raise
        await response.write(LAST_CHUNKS)
        log.append("finished")
        return response

    return add_openai_routes(web.Application(), answer)


def test_cancel_aborts_requests_in_flight_and_those_not_sent():
    # The first request is held by the server for HOLD_S; one slot, so the other four wait for it whenever they are
    # due (at 2 requests/s). Only the cancel can end the run before the hold does.
    log, closed, cancel = [], threading.Event(), threading.Event()
    with serving(holding_app(log, closed)) as url:
        run = run_requests(
            ServerSpec(url),
            "m",
            requests_for(["ok"] * 5, output_len=200),
            request_rate=2.0,
            max_concurrency=1,
            cancel=cancel,
        )
        events = []
        for event in run.events():
            events.append(event)
            if event.kind == "tokens" and not cancel.is_set():
                cancel.set()
                cancelled_at = time.perf_counter()
        ended, cancel_took = list(log), time.perf_counter() - cancelled_at  # when the run ended
        # The run ended while the server still held the stream: the cancel ended it, not the server; and in less
        # than a tenth of the time the hold would have taken.
        assert ended in (["arrived"], ["arrived", "closed"]), ended
        assert cancel_took < HOLD_S / 10  # timing-safe: a tenth of the hold the test's server sets
        assert closed.wait(HOLD_S / 2), log  # the cancel closed the held stream (a hung test's bound, not a speed)
    assert log == ["arrived", "closed"]  # and the server saw no request after the cancel
    assert [r.finish_reason for r in run.results] == ["abort"] * 5
    assert run.results[0].message == "cancelled" and run.results[0].n_tokens == 1
    assert all(r.message == "not sent: cancelled" for r in run.results[1:])
    assert len(finishes(events)) == 5


def test_a_server_streaming_past_the_limit_forever_is_read_up_to_a_bound_then_the_request_fails(misbehaving_server):
    _, (result,), _ = finished(ServerSpec(misbehaving_server), "m", requests_for(["forever"], output_len=8))
    assert result.finish_reason == "error" and 2 * 8 + 64 < result.n_tokens < 200  # chunks may bring several events
    assert (
        result.message == f"the server streamed {result.n_tokens} tokens for the 8 asked and went on: stopped reading"
    )


def test_text_after_done_is_not_counted_and_not_waited_for(misbehaving_server):
    _, (result,), _ = finished(ServerSpec(misbehaving_server), "m", requests_for(["after-done"], output_len=8))
    assert (result.finish_reason, result.n_tokens, result.text) == ("length", 8, " tok" * 8)


@pytest.mark.parametrize("load", [{"max_concurrency": 0}, {"warmup": -1}, {"duration_s": 0}, {"request_rate": 0}])
def test_impossible_load_settings_are_refused_before_anything_is_sent(load):
    with pytest.raises(ConfigError):
        run_requests(ServerSpec("http://127.0.0.1:9"), "m", requests_for(["a"]), **load)
