"""`python -m bench_core restful` end to end against `transformers serve` on the tiny Llama."""

import csv
import math

import numpy as np
import pandas as pd
import pytest
from openai_server import (  # noqa: F401 (fixture)
    answering_in_turn,
    free_port,
    recording_app,
    serving,
    transformers_server,
)

from bench_core.cli import build_parser, main
from bench_core.cli.common import EXIT_FAILED, EXIT_PARTIAL
from bench_core.cli.restful import _rate_range, print_result, rates, restful_csv_row
from bench_core.config import RunConfig
from bench_core.measure import metrics
from bench_core.measure.catalog import BEYOND_LMDEPLOY
from bench_core.store.history import History
from bench_core.store.history_import import RESTFUL_COLUMNS

# Each test here runs a real engine, server, app script or process for seconds: not in the fast suite.
pytestmark = pytest.mark.slow

SECRET = "sk-cli-secret-0123456789"


def restful(url: str, tmp_path, *flags: str) -> int:
    return main(
        [
            "restful",
            "--backend",
            "transformers",
            "--base-url",
            url,
            "--tokenizer",
            "builtin:tiny-llama",
            "--dataset-path",
            "builtin:sample",
            "--num-prompts",
            "6",
            "--sharegpt-output-len",
            "8",
            "--output-file",
            str(tmp_path / "out.csv"),
            "--results",
            str(tmp_path / "results"),
            *flags,
        ]
    )


def csv_rows(path) -> tuple[list[str], list[dict]]:
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        return reader.fieldnames, list(reader)


def test_a_run_prints_their_box_appends_their_csv_row_and_lands_in_the_history(
    transformers_server, tmp_path, capsys, monkeypatch
):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    assert (
        restful(transformers_server, tmp_path, "--request-rate", "50", "--max-concurrency", "4", "--percentiles", "90")
        == 0
    )
    out = capsys.readouterr().out
    assert out.splitlines()[0] == f"{' Serving Benchmark Result ':=^50}"
    assert "Successful requests:                     6" in out
    assert "Total generated tokens:                  48" in out
    for row in (
        "Total generated tokens (retokenized):",
        "P99 TTFT (ms):",
        "Median ITL (ms):",
        "P90 TPOT (ms):",
        "Std ITL (ms):",
        "Achieved send rate (req/s):",
        "Length mismatches:                       0",
        *(
            f"Mean {metric.row_title}:" for metric in BEYOND_LMDEPLOY if metric.key != "request_acceptance_rate"
        ),  # drafted tokens only
    ):  # every catalog metric LMDeploy lacks
        assert row in out

    header, rows = csv_rows(tmp_path / "out.csv")
    assert header == list(RESTFUL_COLUMNS)
    assert (rows[0]["backend"], rows[0]["request_rate"], rows[0]["completed"], rows[0]["total_output_tokens"]) == (
        "transformers",
        "50.0",
        "6",
        "48",
    )
    history = History(tmp_path / "results")
    stored = history.load()
    assert (stored["backend"].tolist(), stored["server_kind"].tolist(), stored["completed"].tolist()) == (
        ["openai"],
        ["transformers"],
        [6],
    )
    assert len(History(tmp_path / "imported").import_csv(tmp_path / "out.csv")) == 1  # their columns import
    run_dir = history.run_dir(stored["run_id"][0])
    for path in [history.csv_path, tmp_path / "out.csv", *run_dir.iterdir()]:
        assert SECRET.encode() not in path.read_bytes(), path


def test_multi_runs_once_per_listed_rate_and_appends_a_row_each(transformers_server, tmp_path, capsys):
    assert restful(transformers_server, tmp_path, "--request-rate-list", "20,40", "--disable-warmup") == 0
    _, rows = csv_rows(tmp_path / "out.csv")
    assert [row["request_rate"] for row in rows] == ["20.0", "40.0"]
    assert capsys.readouterr().out.count("Serving Benchmark Result") == 2
    assert History(tmp_path / "results").load()["request_rate"].tolist() == [20.0, 40.0]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("2,34,2", [float(r) for r in range(2, 34, 2)]),
        ("0.5,2,0.5", [0.5, 1.0, 1.5]),
        ("1,2,4,8", [1.0, 2.0, 4.0, 8.0]),
        ("3", [3.0]),
    ],
)
def test_a_rate_range_of_three_values_is_a_range_as_theirs_and_other_counts_a_list(text, expected):
    assert _rate_range(text) == expected


def build_rates(argv: list[str]) -> list[float]:
    return rates(build_parser().parse_args(argv))


def test_an_explicit_rate_list_of_three_is_a_list_and_implies_multi():
    assert build_rates(["restful", "--request-rate-list", "1,2,4"]) == [1.0, 2.0, 4.0]
    assert build_rates(["restful", "--request-rate", "7"]) == [7.0]
    assert build_rates(["restful", "--multi", "--request-rate-range", "1,2,4"]) == [1.0]


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--extra-request-body", "{oops"], "not valid JSON"),
        (["--max-concurrency", "0"], "--max-concurrency must be a whole number from 1 to 1,000,000; got 0."),
        (["--request-rate", "0"], "--request-rate must be a number above 0 and at most 1,000,000, or inf; got 0."),
    ],
)
def test_bad_input_is_one_line_on_stderr_exit_2_and_nothing_written(tmp_path, capsys, flags, message):
    assert restful(f"http://127.0.0.1:{free_port()}", tmp_path, *flags) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out.csv").exists() and not (tmp_path / "results").exists()


@pytest.mark.parametrize("model_flags", [[], ["--model", "m"]])
def test_a_server_that_is_down_is_one_line_exit_2_and_nothing_written(tmp_path, capsys, model_flags):
    assert restful(f"http://127.0.0.1:{free_port()}", tmp_path, *model_flags) == 2
    err = capsys.readouterr().err
    assert "Cannot reach" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out.csv").exists() and not (tmp_path / "results").exists()


def lmdeploy_body(endpoint: str, prompt: str, output_len: int) -> dict:
    """What profile_restful_api.py's request functions post with their default flags (reference 4.2)."""
    if endpoint == "chat":
        return {
            "model": "m",
            "messages": [{"role": "user", "content": prompt}],
            "temperature": 0.0,
            "max_completion_tokens": output_len,
            "stream": True,
            "ignore_eos": True,
        }
    return {
        "model": "m",
        "prompt": prompt,
        "temperature": 0.0,
        "best_of": 1,
        "max_tokens": output_len,
        "stream": True,
        "ignore_eos": True,
    }


def restful_at(url: str, tmp_path, backend: str, num_prompts: int, *flags: str) -> int:
    """A restful run of `num_prompts` four-token requests against the test server at `url`, model "m"."""
    return main(
        [
            "restful",
            "--backend",
            backend,
            "--base-url",
            url,
            "--model",
            "m",
            "--tokenizer",
            "builtin:tiny-llama",
            "--dataset-path",
            "builtin:sample",
            "--num-prompts",
            str(num_prompts),
            "--sharegpt-output-len",
            "4",
            "--disable-warmup",
            "--results",
            str(tmp_path / "results"),
            *flags,
        ]
    )


def sent_bodies(tmp_path, backend: str, *flags: str) -> list[dict]:
    """The bodies a two-request restful run against the lmdeploy-like test server posts."""
    bodies: list[dict] = []
    with serving(recording_app(bodies)) as url:
        assert restful_at(url, tmp_path, backend, 2, "--output-file", "", *flags) == 0
    assert len(bodies) == 2
    return bodies


def test_odd_answers_fail_their_requests_and_the_run_is_shown_and_recorded(tmp_path, capsys):
    answers = ["ok", "infinite-usage", "ok", "number-text", "deep-500", "ok"]
    with serving(answering_in_turn(answers)) as url:
        code = restful_at(url, tmp_path, "vllm", len(answers), "--output-file", str(tmp_path / "out.csv"))
    out, err = capsys.readouterr()
    assert code == EXIT_PARTIAL, err
    assert "Successful requests:                     3" in out
    assert "Failed requests:                         3" in out
    for said in ("not JSON", "a choices[0].text that is not a string: 7", "HTTP 500 Internal Server Error"):
        assert said in out
    stored = History(tmp_path / "results").load()
    assert (stored["completed"].tolist(), stored["failed"].tolist()) == ([3], [3])
    assert csv_rows(tmp_path / "out.csv")[1][0]["completed"] == "3"


def test_a_run_whose_every_answer_was_odd_says_so_and_fails(tmp_path, capsys):
    with serving(answering_in_turn(["deep-500", "number-text", "infinite-usage"])) as url:
        code = restful_at(url, tmp_path, "vllm", 3, "--output-file", str(tmp_path / "out.csv"))
    out, err = capsys.readouterr()
    assert code == EXIT_FAILED, err
    assert "Successful requests:                     0" in out
    assert "\nerror: No request succeeded (error: HTTP 500 Internal Server Error from " in err
    assert "Traceback" not in out + err


def test_a_run_the_engine_failed_before_any_request_ended_is_shown_without_its_http_timings(capsys):
    # The server's timings (to the stream's last line) come with each request's end: where the engine failed before
    # any ended, the request table has none of them, and the box and the CSV row say "not measured".
    one_unfinished = pd.DataFrame(
        {
            "index": [0],
            "input_len": [10],
            "req_output_len": [4],
            "output_len": [0],
            "status": ["unfinished"],
            "reason": ["unfinished"],
            "ttft_s": [math.nan],
            "tpot_s": [math.nan],
            "e2e_s": [math.nan],
            "itl_s": [np.array([])],
            "tokens_per_tick": [np.array([], dtype=np.int64)],
            "n_ticks": [0],
            "start_s": [0.0],
            "finish_s": [math.nan],
        }
    )
    config = RunConfig()
    summary = metrics.run_summary(one_unfinished, 1.0, [50, 75, 95, 99], stream_output=True)
    assert "mean_e2e_last_line_ms" not in summary
    print_result("vllm", config, summary)
    out = capsys.readouterr().out
    assert "Mean E2E Latency (ms):                   -" in out and "P99 TPOT (ms):                           -" in out
    row = restful_csv_row("vllm", config, summary)
    assert math.isnan(row["mean_e2e_latency_ms"]) and math.isnan(row["mean_tpot_ms"])


@pytest.mark.parametrize("backend, endpoint", [("lmdeploy", "completions"), ("lmdeploy-chat", "chat")])
def test_by_default_each_request_is_the_body_lmdeploy_sends_with_the_usage_asked_for(tmp_path, backend, endpoint):
    for body in sent_bodies(tmp_path, backend):
        prompt = body["messages"][0]["content"] if endpoint == "chat" else body["prompt"]
        assert body == {**lmdeploy_body(endpoint, prompt, 4), "stream_options": {"include_usage": True}}
    assert History(tmp_path / "results").load()["do_sample"].tolist() == [False]


def test_the_sampling_flags_send_their_fields_and_are_recorded(tmp_path):
    bodies = sent_bodies(tmp_path, "lmdeploy", "--temperature", "0.7", "--top-p", "0.9", "--top-k", "20")
    for body in bodies:
        assert {key: body[key] for key in ("temperature", "top_p", "top_k", "best_of")} == {
            "temperature": 0.7,
            "top_p": 0.9,
            "top_k": 20,
            "best_of": 1,
        }
    row = History(tmp_path / "results").load().iloc[0]
    assert (row["do_sample"], row["temperature"], row["top_p"], row["top_k"]) == (True, 0.7, 0.9, 20)
    top_p_alone = sent_bodies(tmp_path, "lmdeploy-chat", "--top-p", "0.5")[0]  # at temperature 0: greedy
    assert (top_p_alone["temperature"], "top_p" in top_p_alone, "top_k" in top_p_alone) == (0.0, False, False)


def test_the_extra_request_body_overrides_every_field_we_send(tmp_path):
    extra = '{"temperature": 0.3, "best_of": 2, "top_k": -1, "ignore_eos": false}'
    for body in sent_bodies(tmp_path, "vllm", "--temperature", "0.7", "--extra-request-body", extra):
        assert {key: body[key] for key in ("temperature", "top_p", "top_k", "best_of", "ignore_eos")} == {
            "temperature": 0.3,
            "top_p": 1.0,
            "top_k": -1,
            "best_of": 2,
            "ignore_eos": False,
        }


def test_a_sweep_over_request_rate_runs_each_rate_against_the_server(transformers_server, tmp_path, capsys):
    code = main(
        [
            "sweep",
            "restful",
            "--backend",
            "transformers",
            "--base-url",
            transformers_server,
            "--tokenizer",
            "builtin:tiny-llama",
            "--dataset-path",
            "builtin:sample",
            "--num-prompts",
            "4",
            "--sharegpt-output-len",
            "8",
            "--disable-warmup",
            "--results",
            str(tmp_path / "results"),
            "--sweep",
            "request_rate=20,inf",
        ]
    )
    assert code == 0, capsys.readouterr().err
    runs = History(tmp_path / "results").load()
    assert sorted(runs["request_rate"].tolist()) == [20.0, float("inf")]
    assert set(runs["status"]) == {"finished"} and runs["sweep_id"].nunique() == 1
    assert runs["completed"].tolist() == [4, 4]
    assert "Sweep sweep-" in capsys.readouterr().out
