"""The server's kind, detected from what it says (GET /v1/models' owned_by and load status, the Server header) when
the run leaves it to "auto", the default: the run's requests are then asked as that server takes them (ignore_eos),
its notes say what was detected and from what, and a kind the user chose wins."""

from __future__ import annotations

import pytest
from aiohttp import web
from openai_server import recording_app, serving, transformers_server  # noqa: F401 (fixture)
from server_runs import server_run

from bench_core.config import setting
from bench_core.engines.server_identity import identify_server, identity_from_answer


def listing(*entries: dict) -> dict:
    return {"object": "list", "data": [{"id": "m", "object": "model", **entry} for entry in entries]}


@pytest.mark.parametrize(
    "answer, header, kind, note",
    [
        (
            listing({"owned_by": "vllm"}),
            "uvicorn",
            "vllm",
            'server kind: vllm, detected from /v1/models (owned_by "vllm")',
        ),
        (listing({"owned_by": "sglang"}), "", "sglang", 'detected from /v1/models (owned_by "sglang")'),
        (listing({"owned_by": "lmdeploy"}), "", "lmdeploy", 'detected from /v1/models (owned_by "lmdeploy")'),
        (listing({"owned_by": "org"}), "LMDeploy/0.7", "lmdeploy", 'detected from the Server header ("LMDeploy/0.7")'),
        (
            listing({"owned_by": "local", "status": {"value": "loaded"}}),
            "uvicorn",
            "transformers",
            "detected from /v1/models (transformers serve's model load status)",
        ),
        (listing({"owned_by": "llamacpp"}), "llama.cpp", "openai", "server kind: openai (llama.cpp, which has no"),
        (listing({"owned_by": "openai"}), "", "openai", "neither /v1/models nor the Server header says"),
        ([1, 2], "", "openai", "neither /v1/models nor the Server header says"),  # not a listing: no sign
    ],
)
def test_the_kind_is_read_from_owned_by_the_server_header_or_the_load_status(answer, header, kind, note):
    identity = identity_from_answer(answer, header)
    assert identity.kind == kind
    assert note in identity.note


def test_auto_is_the_default_server_kind():
    assert setting("server_kind").default == "auto"


def models_app(bodies: list[dict], owned_by: str, server_header: str = "") -> web.Application:
    """recording_app with GET /v1/models answering as the server named."""

    async def models(request: web.Request) -> web.Response:
        response = web.json_response(listing({"owned_by": owned_by}))
        if server_header:
            response.headers["Server"] = server_header
        return response

    app = recording_app(bodies)
    app.router.add_get("/v1/models", models)
    return app


def run_against(tmp_path, url: str, **engine):
    """Two prompts of 4 tokens, the model left to the server's listing unless given."""
    return server_run(tmp_path, url, num_prompts=2, output_len=4, **{"model": "", **engine})


@pytest.mark.slow
def test_a_run_left_to_auto_asks_the_detected_kind_as_it_takes_it_and_says_so(tmp_path):
    bodies: list[dict] = []
    with serving(models_app(bodies, owned_by="vllm")) as url:
        run = run_against(tmp_path, url)

    assert run.state == "finished", run.message
    assert [body.get("ignore_eos") for body in bodies] == [True, True]  # vLLM takes the field
    info = run.measurement.engine_info
    assert 'server kind: vllm, detected from /v1/models (owned_by "vllm")' in info.notes
    assert info.device.startswith("vllm server at ")
    assert info.model == "m"  # the model it lists


@pytest.mark.slow
def test_the_kind_the_user_chose_wins_over_what_the_server_says(tmp_path):
    bodies: list[dict] = []
    with serving(models_app(bodies, owned_by="vllm")) as url:
        run = run_against(tmp_path, url, server_kind="openai")

    assert run.state == "finished", run.message
    assert [body.get("ignore_eos") for body in bodies] == [None, None]
    assert not any(note.startswith("server kind:") for note in run.measurement.engine_info.notes)


def test_the_server_header_names_the_kind_where_owned_by_does_not():
    with serving(models_app([], owned_by="someone", server_header="sglang-router/0.2")) as url:
        identity = identify_server(url)
    assert (identity.kind, identity.models) == ("sglang", ["m"])
    assert identity.note == 'server kind: sglang, detected from the Server header ("sglang-router/0.2")'


@pytest.mark.slow
def test_transformers_serve_left_to_auto_is_detected_and_its_run_finishes(transformers_server, tmp_path):
    """The run issue 39 saw: `transformers serve` with the default kind ended "partial: 5 of 16 requests failed". Its
    kind is now read from its models' load status, so ignore_eos goes in its generation_config and every answer is
    as long as asked."""
    run = run_against(tmp_path, transformers_server)

    assert run.state == "finished", run.message
    notes = run.measurement.engine_info.notes
    assert "server kind: transformers, detected from /v1/models (transformers serve's model load status)" in notes
    assert (run.record.requests["output_len"] == 4).all()
