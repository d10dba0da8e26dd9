"""What a run against a server counts, and over what time: the run's clock stops at the client's last byte, and our own
work on the answers (retokenizing) comes after it; a request the server says stopped for length counts the tokens
asked, whatever our tokenizer makes of its text, with our count kept beside it; the input count and the hit rate are
in the server's units; and a request's wait for a free slot is not counted as lateness. Real runs through the runner
against aiohttp servers on 127.0.0.1 (tests/openai_server.py, tests/scripted_server.py) that keep their own
timeline."""

from __future__ import annotations

import time

import pytest
from aiohttp import web
from openai_server import add_openai_routes, answer_as_prompted, serving, sse_chunk
from scripted_server import LAST_LINE_S, TEXT_EVENTS, scripted_server  # noqa: F401 (fixture)
from server_runs import server_run

from bench_core.engines.openai_stream import LIMIT

pytestmark = pytest.mark.slow  # real runs: seconds each

ASKED = 8
LONG_TEXT = "A" * 512 * 1024  # one event our tokenizer takes long to count: a word with no merges to shortcut it
ODD_PIECE = " zqxjk"  # one token of the server's, five of the built-in tiny Llama's


def answering(behaviours: list[str], ends: list[float] | None = None) -> web.Application:
    """The n-th request to arrive answered as `behaviours[n]`: "long" (one event of LONG_TEXT, usage, "length"),
    "long-no-usage" (the same without usage, stopped at EOS), "odd" (ASKED pieces of ODD_PIECE, no usage, "length"),
    else as openai_server answers that behaviour. `ends` gets, for the two "long" ones, the server's perf_counter time
    as its last chunk's write began (perf_counter is one clock for every thread and process of the machine): no
    client reads that chunk before it, whereas a stamp taken after the write can follow the client's read of it on
    a busy machine."""
    arrived = iter(behaviours)

    async def answer(request: web.Request, endpoint: str) -> web.StreamResponse:
        behaviour = next(arrived)
        if behaviour not in ("long", "long-no-usage", "odd"):
            return await answer_as_prompted(request, endpoint, behaviour)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        if behaviour == "odd":
            for _ in range(ASKED):
                await response.write(sse_chunk(endpoint, text=ODD_PIECE))
            await response.write(sse_chunk(endpoint, finish_reason="length"))
        else:
            await response.write(sse_chunk(endpoint, text=LONG_TEXT))
            usage = {"prompt_tokens": 3, "completion_tokens": ASKED, "total_tokens": ASKED + 3}
            last = {"finish_reason": "length", "usage": usage} if behaviour == "long" else {"finish_reason": "stop"}
            if ends is not None:
                ends.append(time.perf_counter())
            await response.write(sse_chunk(endpoint, **last))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    return add_openai_routes(web.Application(), answer)


def test_the_runs_clock_stops_at_the_last_answers_last_byte_and_our_counting_comes_after(tmp_path):
    """Retokenizing a long answer takes this client longer than the server took to send it: none of it is the run's."""
    server_ends: list[float] = []
    with serving(answering(["long", "long-no-usage"], server_ends)) as url:
        run = server_run(tmp_path, url, num_prompts=2, output_len=ASKED)

    assert run.state == "finished", run.message
    profiler = run.profiler
    last_byte = max(session.finish_time for session in profiler.sessions)  # the client's read of it
    assert max(server_ends) <= last_byte
    assert profiler.t_finish == last_byte
    assert run.record.metrics["duration_s"] == pytest.approx(last_byte - profiler.t_start, abs=1e-9)
    table = run.record.requests
    long_count = table["retokenized_output_len"].iloc[1]
    assert long_count > ASKED  # our count was made, after the clock, for both answers
    assert table["retokenized_output_len"].tolist() == [long_count, long_count]
    assert table["output_len"].tolist() == [ASKED, long_count]  # the server's usage; ours where it sent none
    assert table["output_len_source"].tolist() == ["usage", "retokenized"]


def test_a_length_stop_without_usage_counts_the_tokens_asked_and_keeps_ours_beside_it(tmp_path, tiny_tokenizer):
    ours = len(tiny_tokenizer.encode(ODD_PIECE * ASKED, add_special_tokens=False))
    assert ours > ASKED  # the server's tokenizer is not ours
    with serving(answering(["odd", "odd", "odd", "status500"])) as url:
        run = server_run(tmp_path, url, num_prompts=4, output_len=ASKED)

    table = run.record.requests
    assert table["status"].tolist() == ["success"] * 3 + ["failed"]
    assert table["output_len"].tolist()[:3] == [ASKED] * 3
    assert table["retokenized_output_len"].tolist()[:3] == [ours] * 3
    summary = run.record.metrics
    assert summary["total_output_tokens"] == 3 * ASKED
    assert summary["total_output_tokens_retokenized"] == 3 * ours
    assert summary["output_len_sources"] == f"{LIMIT}: 3"  # the failed request had no count to come from anywhere


SERVERS_OWN_EXTRA = 2  # tokens the server with a tokenizer of its own counts beyond the chat template


def counting_in_the_template(tokenizer, reports_prompt_tokens: bool, counts: list[int]) -> web.Application:
    """A chat server that counts each prompt as vLLM and llama.cpp do, in the tokenizer's chat template with the
    assistant's turn opened, and says half of it was cached. Where `reports_prompt_tokens` its usage says how many
    prompt tokens it counted, and its tokenizer is not quite ours: SERVERS_OWN_EXTRA more. `counts` keeps the count
    each request's cached tokens are a part of (the server's own)."""

    async def answer(request: web.Request, endpoint: str) -> web.StreamResponse:
        body = await request.json()
        text = tokenizer.apply_chat_template(body["messages"], add_generation_prompt=True, tokenize=False)
        count = len(tokenizer.encode(text, add_special_tokens=False)) + reports_prompt_tokens * SERVERS_OWN_EXTRA
        counts.append(count)
        usage = {"completion_tokens": ASKED, "prompt_tokens_details": {"cached_tokens": count // 2}}
        if reports_prompt_tokens:
            usage |= {"prompt_tokens": count, "total_tokens": count + ASKED}
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for _ in range(ASKED):
            await response.write(sse_chunk(endpoint, text=" tok"))
        await response.write(sse_chunk(endpoint, finish_reason="length", usage=usage))
        await response.write(b"data: [DONE]\n\n")
        return response

    return add_openai_routes(web.Application(), answer)


@pytest.mark.parametrize("reports_prompt_tokens", [False, True], ids=["template", "prompt_tokens"])
def test_chat_input_tokens_and_the_hit_rate_are_the_servers_own(tmp_path, tiny_tokenizer, reports_prompt_tokens):
    counts: list[int] = []
    with serving(counting_in_the_template(tiny_tokenizer, reports_prompt_tokens, counts)) as url:
        run = server_run(tmp_path, url, num_prompts=4, output_len=ASKED, endpoint="chat")

    assert run.state == "finished", run.message
    table = run.record.requests  # concurrency 1: the requests arrived in order
    assert table["input_len"].tolist() == counts
    templated = [count - reports_prompt_tokens * SERVERS_OWN_EXTRA for count in counts]
    assert table["tokenizer_input_len"].tolist() == templated  # ours, beside it
    assert (table["input_len"] > table["cached_tokens"]).all()
    summary = run.record.metrics
    assert summary["total_input_tokens"] == sum(counts)
    assert summary["prefix_cache_hit_rate"] == pytest.approx(sum(count // 2 for count in counts) / sum(counts))


def test_in_a_capped_closed_loop_the_wait_for_a_slot_is_its_own_metric_not_send_lag(tmp_path, scripted_server):
    """Concurrency 1: every request is due at once and waits for the answers before it (LAST_LINE_S each, on the
    scripted server's clock); that wait is the slot wait, and what is left of sent minus due is the lateness."""
    run = server_run(tmp_path, scripted_server, num_prompts=3, output_len=TEXT_EVENTS)

    assert run.state == "finished", run.message
    table = run.record.requests
    waits = table["slot_wait_s"].tolist()
    assert waits == sorted(waits) and waits[2] - waits[0] >= LAST_LINE_S  # each waited for more answers
    late = table["sent_s"] - table["scheduled_s"] - table["slot_wait_s"]
    summary = run.record.metrics
    assert summary["mean_slot_wait_ms"] == pytest.approx(1000 * table["slot_wait_s"].mean())
    assert summary["mean_send_lag_ms"] == pytest.approx(1000 * late.mean())
    assert summary["max_send_lag_ms"] < 1000 * LAST_LINE_S  # no answer's time is in it
