"""The openai engine through the real runner: `transformers serve` on the tiny Llama for real runs, our
misbehaving server (tests/openai_server.py) for every way a request can fail, one request at a time."""

import json
import logging
import math

import pytest
from openai_server import CHUNK_GAP_S, free_port, misbehaving_server, transformers_server  # noqa: F401 (fixtures)

from bench_core.config import DatasetConfig, EngineConfig, LoadConfig, RunConfig
from bench_core.engines import check_run_config
from bench_core.errors import ConfigError
from bench_core.load.arrivals import achieved_rate
from bench_core.load.datasets import Sample, SampledRequest
from bench_core.run import runner as runner_module
from bench_core.run.runner import Runner
from bench_core.store.history import History

# Each test here runs a real engine, server, app script or process for seconds: not in the fast suite.
pytestmark = pytest.mark.slow

SECRET = "sk-never-write-me-0123456789"


def server_config(base_url: str, num_prompts: int = 8, output_len: int = 8, **load) -> RunConfig:
    return RunConfig(
        engine=EngineConfig(
            backend="openai",
            model="",
            base_url=base_url,
            server_kind="transformers",
            tokenizer="builtin:tiny-llama",
            api_key=SECRET,
        ),
        dataset=DatasetConfig(dataset="builtin:sample", num_prompts=num_prompts, sharegpt_output_len=output_len),
        load=LoadConfig(**{"load_pattern": "request_rate", "stream_output": True, **load}),
    )


def run_to_end(runner: Runner, config: RunConfig):
    run = runner.submit(config)
    assert run.wait(60)
    return run


@pytest.fixture
def history(tmp_path):
    return History(tmp_path / "results")


@pytest.fixture
def runner(history):
    runner = Runner(history)
    yield runner
    runner.shutdown()


def test_a_request_rate_run_records_exact_lengths_both_token_counts_and_the_load_achieved(
    transformers_server, runner, history, tiny_model_path, caplog
):
    caplog.set_level(logging.DEBUG)
    config = server_config(transformers_server, request_rate=40.0, burstiness=0.5, max_concurrency=4, warmup_requests=1)
    run = run_to_end(runner, config)

    assert run.state == "finished", run.message
    assert run.measurement.engine_info.model == tiny_model_path  # discovered from /v1/models
    table = run.record.requests
    assert table["status"].tolist() == ["success"] * 8
    assert (table["output_len"] == 8).all()
    assert (table["usage_output_len"] == 8).all()
    assert (table["retokenized_output_len"] > 0).all()
    assert not table["length_mismatch"].any()
    assert (table["sent_s"] >= table["scheduled_s"]).all()
    assert table["ttft_s"].notna().all() and table["itl_s"].map(len).eq(7).all()  # a gap per SSE event
    summary = run.record.metrics
    assert summary["total_output_tokens"] == 64
    assert summary["total_output_tokens_retokenized"] == table["retokenized_output_len"].sum()
    assert summary["length_mismatches"] == 0
    assert 0 < summary["achieved_rate"] <= achieved_rate(table["scheduled_s"]) * 1.01  # late sends only lower it
    assert 1 <= summary["peak_in_flight"] <= 4

    row = history.load().set_index("run_id").loc[run.run_id]
    assert (row["backend"], row["request_rate"], row["max_concurrency"], row["completed"]) == ("openai", 40.0, 4, 8)
    files = [history.csv_path, *(history.run_dir(run.run_id)).iterdir()]
    for path in files:
        assert SECRET.encode() not in path.read_bytes(), path
    assert SECRET not in caplog.text
    assert SECRET not in repr(run.config)


def test_every_bad_answer_is_a_counted_failure_and_the_run_goes_on(misbehaving_server, runner, monkeypatch):
    prompts = ["ok", "status500", "slow", "cut", "error-event", "short", "ok"]
    requests = [SampledRequest(prompt, 4, 6) for prompt in prompts]
    # The server acts on the prompt's exact text, shorter than any ShareGPT sample: hand the runner these.
    monkeypatch.setattr(runner_module, "sample_requests", lambda dataset, tokenizer: Sample(requests, 28, 42))
    config = server_config(misbehaving_server, num_prompts=len(prompts), output_len=6)
    # A kind that is sent ignore_eos: the "short" answer's EOS then cuts it short.
    config.engine.model, config.engine.server_kind, config.engine.read_timeout_s = "m", "vllm", 1.0
    run = run_to_end(runner, config)

    # Some requests succeeded, five did not (four failed, one came back short): partial, with the reasons.
    assert run.state == "partial", run.message
    assert run.message.startswith("5 of 7 requests failed or came back short of their token limit (error: ")
    table = run.record.requests.set_index(run.record.requests.index.map(dict(enumerate(prompts))))
    assert table.loc["ok", "status"].tolist() == ["success", "success"]
    assert "HTTP 500" in table.loc["status500", "reason"] and "the engine crashed" in table.loc["status500", "reason"]
    assert "read timeout" in table.loc["slow", "reason"]
    assert "cut after 3 tokens" in table.loc["cut", "reason"]
    assert "out of memory" in table.loc["error-event", "reason"]
    assert table.loc[["status500", "slow", "cut", "error-event"], "status"].eq("failed").all()
    assert (table.loc["short", "status"], table.loc["short", "output_len"]) == ("incomplete", 3)
    assert bool(table.loc["short", "length_mismatch"])
    summary = run.record.metrics
    assert (summary["completed"], summary["failed"], summary["incomplete"], summary["length_mismatches"]) == (
        2,
        4,
        1,
        1,
    )


def run_prompts(runner, monkeypatch, url: str, prompts: list[str], output_len: int = 8):
    """A chat run of these prompts against the misbehaving server, which acts on each one's exact text."""
    requests = [SampledRequest(prompt, 4, output_len) for prompt in prompts]
    monkeypatch.setattr(runner_module, "sample_requests", lambda dataset, tokenizer: Sample(requests, 28, 42))
    config = server_config(url, num_prompts=len(prompts), output_len=output_len)
    config.engine.model, config.engine.server_kind, config.engine.endpoint = "m", "vllm", "chat"
    run = run_to_end(runner, config)
    assert run.state == "finished", run.message
    return run.record.requests.set_index(run.record.requests.index.map(dict(enumerate(prompts)))), run.record.metrics


def test_ttft_is_the_first_answer_text_and_the_first_reasoning_chunk_is_a_metric_of_its_own(
    misbehaving_server, runner, monkeypatch
):
    table, summary = run_prompts(runner, monkeypatch, misbehaving_server, ["reasoning", "reasoning", "thinking"])
    answered = table.loc["reasoning"]
    # Four reasoning chunks 10 ms apart, then four of answer: TTFT at the answer, ITL between its chunks only.
    assert (answered["ttft_s"] == answered["first_answer_s"]).all()
    # The first answer chunk is written four gaps after the request arrived, the first reasoning chunk at once: no
    # TTFT from the send is shorter, however busy the machine (a gap between the two ticks would not hold: a client
    # held up at the start reads the reasoning and the answer in one go).
    assert (answered["ttft_s"] >= 4 * CHUNK_GAP_S).all() and (answered["ttft_s"] > answered["first_reasoning_s"]).all()
    assert answered["itl_s"].map(len).tolist() == [3, 3]
    assert (answered["output_len"] == 8).all()
    # A request that never answered is timed by its reasoning, the only output it has; first_answer_s says so.
    thought = table.loc["thinking"]
    assert math.isnan(thought["first_answer_s"]) and thought["ttft_s"] == thought["first_reasoning_s"]
    assert (len(thought["itl_s"]), thought["output_len"], thought["status"]) == (7, 8, "success")
    assert summary["mean_ttft_reasoning_ms"] == pytest.approx(table["first_reasoning_s"].mean() * 1000)
    assert summary["p99_ttft_reasoning_ms"] == pytest.approx(table["first_reasoning_s"].quantile(0.99) * 1000)
    assert summary["mean_ttft_ms"] == pytest.approx(table["ttft_s"].mean() * 1000)


def test_a_run_without_reasoning_reports_no_reasoning_time(misbehaving_server, runner, history, monkeypatch):
    table, summary = run_prompts(runner, monkeypatch, misbehaving_server, ["ok", "ok"])
    assert table["first_reasoning_s"].isna().all()
    assert math.isnan(summary["mean_ttft_reasoning_ms"]) and summary["mean_ttft_ms"] > 0
    assert history.load()["mean_ttft_reasoning_ms"].isna().all()  # an empty cell: not reported, never 0


def test_a_server_that_is_down_fails_each_request_so_the_run_fails_with_the_reason(runner):
    config = server_config(f"http://127.0.0.1:{free_port()}", num_prompts=3)
    config.engine.model = "m"
    run = run_to_end(runner, config)
    assert run.state == "failed" and run.message.startswith("No request succeeded (error: ")
    assert "cannot connect" in run.message
    assert run.record.metrics["failed"] == 3
    assert run.record.requests["reason"].str.contains("cannot connect").all()


def test_a_server_that_is_down_with_no_model_named_fails_at_loading_with_one_message(runner, history):
    run = run_to_end(runner, server_config(f"http://127.0.0.1:{free_port()}"))
    assert (run.state, run.user_error) == ("failed", True)
    assert "Cannot reach" in run.message and "Is the server running" in run.message
    assert history.load()[["status", "error"]].values.tolist() == [["failed", run.message]]


def test_a_duration_leaves_the_requests_it_cut_off_unfinished_not_failed(misbehaving_server, runner):
    config = server_config(misbehaving_server, num_prompts=20, output_len=4, request_rate=10.0, duration_s=0.5)
    config.engine.model, config.engine.server_kind = "m", "openai"
    run = run_to_end(runner, config)
    table = run.record.requests
    unsent = table[table["status"] == "unfinished"]
    assert len(unsent) > 0 and (table["status"] == "success").sum() > 0
    assert unsent["reason"].str.contains("duration had ended").all()
    assert run.record.metrics["failed"] == 0


def test_a_failed_warm_up_stops_the_run_before_anything_is_measured(runner, history):
    config = server_config(f"http://127.0.0.1:{free_port()}", warmup_requests=1)
    config.engine.model = "m"
    run = run_to_end(runner, config)
    assert run.state == "failed" and "warm-up request failed" in run.message
    assert run.profiler is None and history.load()["status"].tolist() == ["failed"]


@pytest.mark.parametrize(
    "engine, load, expected",
    [
        ({"base_url": ""}, {}, "No server URL"),
        ({"base_url": "localhost:8000"}, {}, "must start with http://"),
        ({"base_url": "http://[::1"}, {}, r"cannot be read \(Invalid IPv6 URL\)"),
        ({"base_url": "http://127.0.0.1:99999"}, {}, "cannot be read .Port out of range"),
        ({"base_url": "http://:8000"}, {}, "names no host"),
        ({"extra_request_body": "{not json"}, {}, "not valid JSON"),
        ({"extra_request_body": "[1]"}, {}, "must be a JSON object"),
        ({"endpoint": "embeddings"}, {}, "--endpoint must be one of completions, chat, generate; got 'embeddings'"),
        ({"endpoint": "generate", "server_kind": "vllm"}, {}, "is SGLang.s native /generate API: set the server kind"),
        ({}, {"request_rate": 0.0}, "--request-rate must be a number above 0 and at most 1,000,000, or inf; got 0"),
        ({}, {"burstiness": -1.0}, "--burstiness must be a number above 0 and at most 1,000, or inf; got -1"),
        ({}, {"max_concurrency": 0}, "--max-concurrency must be a whole number from 1 to 1,000,000; got 0"),
        ({}, {"duration_s": 0.0}, "--duration must be a number above 0 and at most 2,592,000; got 0"),
    ],
)
def test_impossible_server_or_load_settings_are_refused_before_the_run(engine, load, expected):
    config = server_config("http://127.0.0.1:9", **load)
    for name, value in engine.items():
        setattr(config.engine, name, value)
    with pytest.raises(ConfigError, match=expected):
        check_run_config(config)


def test_the_request_rate_pattern_needs_a_server_or_the_embedded_engine():
    config = RunConfig(
        engine=EngineConfig(backend="pytorch", model="builtin:tiny-llama"), load=LoadConfig(load_pattern="request_rate")
    )
    with pytest.raises(ConfigError, match="The request_rate load pattern is not offered by the pytorch backend"):
        check_run_config(config)
    config.engine.backend = "transformers"
    check_run_config(config)


def test_the_api_key_is_left_out_of_the_flat_config_and_an_empty_model_is_allowed():
    config = server_config("http://127.0.0.1:9")
    flat = config.to_flat_dict()
    assert "api_key" not in flat and SECRET not in json.dumps(flat, default=str)
    assert math.isinf(RunConfig.from_flat_dict(flat).load.request_rate)
    check_run_config(config)  # no model named: the server's is used
