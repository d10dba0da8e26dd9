"""Names and numbers from outside that once lost a run (reliability round 4, n03 and n10): a model id that no file
system takes as a path (a server lists one longer than a file name may be) is a server's model, recorded like any
other, and the results folder stays usable; a whole number beyond what a history column holds (a custom record's
output length of 10**30, a flag's) is refused before anything is sent or written, in one line, naming the record or
the flag and the range it takes. A real server on 127.0.0.1 (raw_http_server), the restful CLI in this process."""

from __future__ import annotations

import json

import pytest
from app_under_test import APP, shown
from llama_server import MODEL, NEVER, llama_handler
from raw_http_server import RawServer, respond_json
from restful_cli import restful
from streamlit.testing.v1 import AppTest

from bench_core.cli import main
from bench_core.store.history import RESULTS_ENV, History

# Each test here runs a real engine, server, app script or process for seconds: not in the fast suite.
pytestmark = pytest.mark.slow

BEYOND_ANY_COLUMN = 10**30
RANGE = "must be a whole number from 1 to 16,777,216"  # a length in tokens


@pytest.mark.parametrize("length", [300, 10_000])
def test_a_server_model_id_too_long_for_a_file_name_is_recorded_and_the_folder_takes_the_next_run(
    tmp_path, capsys, length
):
    served = "m" * length
    with RawServer(llama_handler(NEVER, model=served)) as server:
        hostile = restful(server.url, tmp_path, capsys, "--backend", "vllm", prompts=4, output_len=4)
        assert hostile.code == 0, hostile.err
        assert "Traceback" not in hostile.err
        assert hostile.summary["model"] == served and hostile.summary["completed"] == 4
        after = restful(server.url, tmp_path, capsys, "--backend", "vllm", "--model", MODEL, prompts=4, output_len=4)
        assert after.code == 0, after.err
    assert History(tmp_path / "results").load()["model"].tolist() == [served, MODEL]


def custom_dataset(folder) -> list[str]:
    path = folder / "mine.jsonl"
    records = [{"prompt": "hello", "output_len": 8}, {"prompt": "x", "output_len": BEYOND_ANY_COLUMN}]
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return ["--dataset-name", "custom", "--dataset-path", str(path)]


BIG = str(BEYOND_ANY_COLUMN)
REFUSED = {
    "custom record": (custom_dataset, f"line 2: the record is refused because its 'output_len' {RANGE}, not {BIG}"),
    "--num-prompts": (
        lambda _: ["--num-prompts", BIG],
        f"--num-prompts must be a whole number from 1 to 1,000,000; got {BEYOND_ANY_COLUMN:,}.",
    ),
    "--top-k": (lambda _: ["--top-k", BIG], f"top_k must be a whole number from 0 to 2,147,483,647 (got {BIG})."),
    "body max_tokens": (
        lambda _: ["--extra-request-body", json.dumps({"max_tokens": BEYOND_ANY_COLUMN})],
        f"In the extra request body, max_tokens must be a whole number from 1 to 2,147,483,647 (got {BIG}).",
    ),
}


def listing_only():
    """The llama-like server's model listing; every completion refused with HTTP 500, never streamed: nothing may be
    sent to it, and were a request asking 10**30 tokens sent, no test server could stream them."""
    listing = llama_handler(NEVER)

    async def handle(request, writer) -> bool:
        if request.method == "POST":
            await respond_json(writer, {"error": {"message": "nothing may be sent here"}}, 500)
            return True
        return await listing(request, writer)

    return handle


@pytest.mark.parametrize("flags, named", REFUSED.values(), ids=REFUSED)
def test_a_number_beyond_what_a_history_column_holds_exits_2_with_one_line_and_writes_nothing(
    tmp_path, capsys, flags, named
):
    argv = ["restful", "--backend", "vllm", "--model", MODEL, "--tokenizer", "builtin:tiny-llama", "--disable-warmup"]
    argv += ["--dataset-path", "builtin:sample", "--num-prompts", "2"]  # small; a case's flags below come last
    argv += ["--results", str(tmp_path / "results"), "--output-file", str(tmp_path / "out.csv")]
    with RawServer(listing_only()) as server:
        capsys.readouterr()
        code = main([*argv, "--base-url", server.url, *flags(tmp_path)])
        err = capsys.readouterr().err
        assert server.requests("POST") == []
    assert code == 2
    (line,) = err.splitlines()
    assert line.startswith("error: ") and named in line
    assert not (tmp_path / "results").exists() and not (tmp_path / "out.csv").exists()


def test_the_sidebar_refuses_a_custom_record_beyond_what_a_history_column_holds_in_one_line(
    fresh_dashboard, tmp_path, monkeypatch
):
    monkeypatch.setenv(RESULTS_ENV, str(tmp_path / "results"))
    path = custom_dataset(tmp_path)[-1]
    at = AppTest.from_file(APP, default_timeout=120).run()
    at.sidebar.selectbox(key="model_choice").select("builtin:tiny-llama")
    at.sidebar.radio(key="dataset_source").set_value("Path")
    at.sidebar.radio(key="dataset_name").set_value("custom").run()
    at.sidebar.text_input(key="dataset_path").input(path).run()
    at.button(key="sample_workload").click().run()
    assert not at.exception
    (error,) = at.error
    assert shown(error.value).startswith(
        f"Dataset {path}, line 2: the record is refused because its 'output_len' {RANGE}"
    )
    assert "\n" not in error.value
