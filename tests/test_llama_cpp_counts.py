"""Token counts on a server that sends no usage, as llama-cpp-python's (tests/llama_cpp_server.py): the tokens of
one UTF-8 character come in one chunk, the stream ends with finish_reason "length", and the chat limit the server
heeds is `max_tokens`, not the `max_completion_tokens` profile_restful_api.py sends.

The stream shape of llama-cpp-python 0.3.36 itself (pings, role chunk, folded characters, empty last chunk) is
replayed from tests/data/llama_cpp_python_chat.json. Counting chunks as tokens made such requests "incomplete" (fewer chunks than tokens asked) and dropped them from
every number; a chat run that asked for 16 tokens got 48 and called them successes.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import llama_cpp_server as server
import pytest
from llama_cpp_server import OWN_LENGTH, RECORDING, llama_cpp_server, pieces  # noqa: F401 (fixture)
from scripted_server import assert_never_before_the_server

from bench_core.cli import main
from bench_core.engines.openai_stream import LIMIT
from bench_core.store.history import History

# Each test here runs a real engine, server, app script or process for seconds: not in the fast suite.
pytestmark = pytest.mark.slow

N = 4
ASKED = 16


def restful(url: str, folder, capsys, *flags: str, asked: int = ASKED) -> SimpleNamespace:
    code = main(
        [
            "restful",
            "--base-url",
            url,
            "--model",
            "smollm2",
            "--tokenizer",
            "builtin:tiny-llama",
            "--dataset-path",
            "builtin:sample",
            "--num-prompts",
            str(N),
            "--sharegpt-output-len",
            str(asked),
            "--disable-warmup",
            "--output-file",
            "",
            "--results",
            str(folder / "results"),
            *flags,
        ]
    )
    out = capsys.readouterr()
    history = History(folder / "results")
    row = history.load().iloc[-1]
    return SimpleNamespace(code=code, table=history.requests(row["run_id"]), summary=row, out=out.out, err=out.err)


def test_the_servers_chunks_are_fewer_than_its_tokens_and_its_text_recounts_to_them(tiny_tokenizer):
    texts = pieces(ASKED)
    assert len(texts) < ASKED  # "é" is two tokens in one chunk
    assert len(tiny_tokenizer.encode("".join(texts), add_special_tokens=False)) == ASKED


def test_a_stream_without_usage_that_stops_for_length_is_complete_with_the_length_asked(
    llama_cpp_server, tmp_path, capsys
):
    run = restful(llama_cpp_server, tmp_path, capsys, "--backend", "lmdeploy")
    table = run.table
    assert run.code == 0
    assert table["status"].tolist() == ["success"] * N
    assert table["output_len"].tolist() == [ASKED] * N
    assert table["output_len_source"].tolist() == [LIMIT] * N
    assert table["retokenized_output_len"].tolist() == [ASKED] * N  # our count, beside it
    assert (table["n_ticks"] - 1 < ASKED).all()  # as chunks, every request would have come back short
    assert table["usage_output_len"].isna().all()
    summary = run.summary
    assert (summary["completed"], summary["incomplete"], summary["overrun"], summary["length_mismatches"]) == (
        N,
        0,
        0,
        0,
    )
    assert summary["total_output_tokens"] == N * ASKED
    assert summary["output_len_sources"] == f"{LIMIT}: {N}"
    assert f"Output counts from:                      {LIMIT}: {N}" in run.out


def test_a_chat_limit_the_server_ignores_is_named_with_the_flag_that_fixes_it(llama_cpp_server, tmp_path, capsys):
    ignored = restful(llama_cpp_server, tmp_path / "default", capsys, "--backend", "lmdeploy-chat")
    assert ignored.code == 1  # nothing was served as asked
    assert ignored.table["status"].tolist() == ["overrun"] * N
    assert ignored.table["output_len"].tolist() == [OWN_LENGTH] * N
    assert (ignored.summary["completed"], ignored.summary["overrun"]) == (0, N)
    advice = (
        "stop: more tokens than asked: the server seems to ignore max_completion_tokens: send max_tokens with "
        "--chat-limit-field max_tokens (or both)"
    )
    assert f"{advice}: {N}" in ignored.out  # the reasons under the counts
    assert advice in ignored.err  # and the run's message

    for field in ("max_tokens", "both"):
        fixed = restful(
            llama_cpp_server, tmp_path / field, capsys, "--backend", "lmdeploy-chat", "--chat-limit-field", field
        )
        assert fixed.code == 0, field
        assert fixed.table["status"].tolist() == ["success"] * N
        assert fixed.table["output_len"].tolist() == [ASKED] * N
        assert History(tmp_path / field / "results").config(fixed.summary["run_id"]).engine.chat_limit_field == field


def test_llama_cpp_pythons_stream_shape_reads_as_the_server_wrote_it(llama_cpp_server, tmp_path, capsys):
    recording = json.loads(RECORDING.read_text(encoding="utf-8"))
    asked = recording["request"]["max_tokens"]
    server.REPLAYED.clear()
    run = restful(
        llama_cpp_server + "/replay",
        tmp_path,
        capsys,
        "--backend",
        "lmdeploy-chat",
        "--chat-limit-field",
        "max_tokens",
        asked=asked,
    )
    table = run.table
    assert run.code == 0
    assert table["status"].tolist() == ["success"] * N
    assert table["output_len"].tolist() == [asked] * N  # it stopped for length
    assert table["retokenized_output_len"].tolist() == [recording["retokenized_tokens"]] * N
    assert table["output_len_source"].tolist() == [LIMIT] * N
    # one tick per chunk with text: the role chunk, the empty last chunk and the pings are none
    assert table["n_ticks"].tolist() == [1 + recording["text_chunks"]] * N
    # The TTFT runs to the first content chunk's write, not a ping's or the role chunk's (written 158 ms and more
    # before it): never before the server began that write, whenever a busy machine let it.
    first_text = next(i for i, (_, data) in enumerate(recording["writes"]) if '"content"' in data)
    first_text_written = [served.writes[first_text] - served.arrived for served in server.REPLAYED]
    assert_never_before_the_server(table["ttft_s"].to_numpy(), first_text_written)
