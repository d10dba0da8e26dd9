"""How a run against a server ends, said for what it is: answers that stop at EOS where the server was not asked to
ignore it are served, not failed or short; a server asked to ignore EOS that stops there anyway is named; and a
server that shuts down mid-run reads as a server that went away, not as requests that failed one by one. Real runs
through the runner against aiohttp servers on 127.0.0.1 (tests/openai_server.py)."""

from __future__ import annotations

import asyncio
import itertools

import pytest
from aiohttp import web
from openai_server import add_openai_routes, answer_as_prompted, answering_in_turn, serving
from server_runs import server_run

from bench_core.engines.openai_client import WENT_AWAY
from bench_core.engines.openai_request import EOS_DESPITE_IGNORE

pytestmark = pytest.mark.slow  # real runs: seconds each


def test_answers_that_stop_at_eos_on_a_server_not_asked_to_ignore_it_are_served(tmp_path):
    """The default server kind sends no ignore_eos (`transformers serve`, llama.cpp, any OpenAI server): an answer
    that ends with finish_reason "stop" before max_tokens is a whole answer, so the run is finished, not partial."""
    with serving(answering_in_turn(["short"] * 4)) as url:
        run = server_run(tmp_path, url)

    assert run.state == "finished", run.message
    table = run.record.requests
    assert table["status"].tolist() == ["success"] * 4
    assert (table["output_len"] == 4).all()  # half the 8 asked: where the server stopped
    summary = run.record.metrics
    assert (summary["failed"], summary["incomplete"]) == (0, 0)


def test_a_server_asked_to_ignore_eos_that_stops_there_anyway_is_named_so(tmp_path):
    with serving(answering_in_turn(["short", "ok", "short", "ok"])) as url:
        run = server_run(tmp_path, url, server_kind="vllm")

    assert run.state == "partial"
    assert run.message == f"2 of 4 requests came back short of their token limit (stop: {EOS_DESPITE_IGNORE}: 2)"
    assert run.record.requests["status"].tolist() == ["incomplete", "success", "incomplete", "success"]


def shutting_down_after(answers: int, runners: list[web.AppRunner]) -> web.Application:
    """A server that, once it has answered `answers` requests whole, shuts down gracefully: it stops listening and
    closes its idle connections, as uvicorn and aiohttp do on SIGTERM."""
    arrived = itertools.count(1)

    async def answer(request: web.Request, endpoint: str) -> web.StreamResponse:
        response = await answer_as_prompted(request, endpoint, "ok")
        if next(arrived) == answers:
            asyncio.get_running_loop().call_soon(lambda: asyncio.ensure_future(runners[0].cleanup()))
        return response

    return add_openai_routes(web.Application(), answer)


def test_a_server_that_shuts_down_mid_run_reads_as_a_server_that_went_away(tmp_path):
    runners: list[web.AppRunner] = []
    with serving(shutting_down_after(2, runners), runners) as url:
        run = server_run(tmp_path, url, num_prompts=6)

    # The server stops once it has answered two; those sent while it was stopping may still be answered.
    assert run.state == "partial"
    failed = [reason for reason in run.record.requests["reason"] if reason.startswith("error: ")]
    assert 1 <= len(failed) <= 4, run.message
    assert run.message.startswith(f"{len(failed)} of 6 requests failed (error: {WENT_AWAY} "), run.message
    assert all(reason.startswith(f"error: {WENT_AWAY} ") for reason in failed), failed
    assert "is the server running?" not in run.message


def test_a_503_from_a_server_that_answered_before_says_it_went_away(tmp_path):
    async def unavailable(request: web.Request, endpoint: str) -> web.StreamResponse:
        return web.json_response({"error": {"message": "Server is shutting down"}}, status=503)

    answers = itertools.chain([answer_as_prompted], itertools.repeat(unavailable))
    app = add_openai_routes(web.Application(), lambda request, endpoint: next(answers)(request, endpoint))
    with serving(app) as url:
        run = server_run(tmp_path, url, num_prompts=3)

    assert run.state == "partial"
    assert f"{WENT_AWAY} or is overloaded (HTTP 503 Service Unavailable" in run.message, run.message
    assert "Server is shutting down" in run.message
