"""JSON Lines whose strings hold characters that Python's str.splitlines() takes for line ends (reliability round 4,
n19): U+2028, U+2029, U+0085, a form feed, a vertical tab, the file, group and record separators. Writers that keep
non-ASCII text (ensure_ascii=False) leave the first three raw; lax ones leave the others. A line ends at "\\n" alone,
so each such record is read whole, in ShareGPT JSONL, custom-prompt and trace files (one reader), and in the
playground's prompt files; each kind then runs through the restful CLI against a real server on 127.0.0.1."""

from __future__ import annotations

import json

import pytest
from llama_server import NEVER, llama_handler
from raw_http_server import RawServer
from restful_cli import restful

from bench_core.load.datasets import load_conversations, load_records
from bench_core.load.playground import parse_prompt_file

# Each test here runs a real engine, server, app script or process for seconds: not in the fast suite.
pytestmark = pytest.mark.slow

SPLITLINES_ENDS = {
    "U+2028": "\u2028",
    "U+2029": "\u2029",
    "U+0085": "\x85",
    "form feed": "\f",
    "vertical tab": "\v",
    "U+001C": "\x1c",
    "U+001D": "\x1d",
    "U+001E": "\x1e",
}
HOLE = "@HOLE@"  # where a record's text takes the character raw, as json.dumps would escape it


def text_with(char: str) -> str:
    return f"first line of a prompt{char}second line of the same prompt"


def jsonl(records: list[dict], char: str, line_end: str = "\n") -> bytes:
    """JSON Lines, each record's HOLE replaced by `char` unescaped."""
    lines = (json.dumps(record, ensure_ascii=False).replace(HOLE, char) for record in records)
    return "".join(line + line_end for line in lines).encode("utf-8")


def sharegpt_records(n: int) -> list[dict]:
    return [
        {"conversations": [{"from": "human", "value": text_with(HOLE)}, {"from": "gpt", "value": f"answer {i} " * 4}]}
        for i in range(n)
    ]


def custom_records(n: int) -> list[dict]:
    return [{"prompt": text_with(HOLE), "output_len": 4} for _ in range(n)]


def trace_records(n: int) -> list[dict]:
    # Mooncake's records carry fields the replay does not read; a string among them is where the character sits.
    return [
        {"timestamp": 10 * i, "input_length": 24, "output_length": 4, "hash_ids": [i], "note": text_with(HOLE)}
        for i in range(n)
    ]


@pytest.mark.parametrize("line_end", ["\n", "\r\n"], ids=["LF", "CRLF"])
@pytest.mark.parametrize("char", SPLITLINES_ENDS.values(), ids=SPLITLINES_ENDS.keys())
def test_a_string_holding_a_splitlines_line_end_is_read_whole_in_each_kind_of_file(tmp_path, char, line_end):
    expected = text_with(char)
    path = tmp_path / "data.jsonl"

    path.write_bytes(jsonl(sharegpt_records(3), char, line_end))
    assert load_conversations(str(path)).pairs == [(expected, f"answer {i} " * 4) for i in range(3)]

    for records, key in ((custom_records(3), "prompt"), (trace_records(3), "note")):
        path.write_bytes(jsonl(records, char, line_end))
        read = load_records(str(path))
        assert [line for line, _ in read.records] == [1, 2, 3] and not read.notes
        assert [record[key] for _, record in read.records] == [expected] * 3

    prompts = parse_prompt_file("prompts.jsonl", jsonl(custom_records(3), char, line_end))
    assert prompts == [[{"role": "user", "content": expected}]] * 3


DATASETS = {
    "sharegpt": (sharegpt_records, ["--dataset-name", "sharegpt", "--sharegpt-output-len", "4"]),
    "custom": (custom_records, ["--dataset-name", "custom", "--request-rate", "inf"]),
    "trace": (trace_records, ["--dataset-name", "trace", "--trace-block-len", "16"]),
}


@pytest.mark.parametrize("kind", DATASETS)
def test_a_run_reads_every_record_of_such_a_file_and_sends_the_text_as_written(tmp_path, capsys, kind):
    make, flags = DATASETS[kind]
    chars = list(SPLITLINES_ENDS.values())
    path = tmp_path / f"{kind}.jsonl"
    path.write_bytes(b"".join(jsonl(make(1), char) for char in chars))
    with RawServer(llama_handler(NEVER)) as server:
        run = restful(
            server.url, tmp_path, capsys, "--dataset-path", str(path), *flags, prompts=len(chars), output_len=None
        )
        sent = [request.json() for request in server.log if request.method == "POST"]
    assert run.code == 0, run.err
    assert "Traceback" not in run.lines
    assert run.summary["completed"] == len(chars)
    if kind != "trace":  # a trace's prompts are ShareGPT text of its lengths; its records' strings are not sent
        assert sorted(body["prompt"] for body in sent) == sorted(text_with(char) for char in chars)
