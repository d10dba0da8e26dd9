"""The workloads of issue 22 run for real: on the embedded engine (the tiny Llama on transformers' continuous
batching, on CPU) through the runner, and with `restful` against servers on 127.0.0.1 (the scripted server, whose
usage reports cached prompt tokens and which notes when each request arrived; `transformers serve`)."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
import scripted_server as scripted
from openai_server import transformers_server  # noqa: F401 (fixture)
from scripted_server import (
    NEVER_THAT_LATE_S,  # a busy machine's lag is no unit slip
    scripted_server,  # noqa: F401 (fixture)
)

from bench_core.cli import main
from bench_core.config import DatasetConfig, EngineConfig, LoadConfig, RunConfig
from bench_core.run.runner import Runner
from bench_core.store.history import History

# Each test here runs a real engine, server, app script or process for seconds: not in the fast suite.
pytestmark = pytest.mark.slow


@pytest.fixture
def runner(tmp_path, tiny_model_path):
    runner = Runner(History(tmp_path / "results"))
    yield runner
    runner.shutdown()


def run_on_cpu(runner: Runner, dataset: DatasetConfig, load: LoadConfig | None = None, **engine):
    config = RunConfig(
        engine=EngineConfig(backend="transformers", model="builtin:tiny-llama", **engine),
        dataset=dataset,
        load=load or LoadConfig(concurrency=4, stream_output=True),
    )
    run = runner.submit(config)
    assert run.wait(300) and run.state == "finished", run.message
    row = runner.history.load().set_index("run_id").loc[run.run_id]
    return row, runner.history.requests(run.run_id)


def write_jsonl(path, records) -> str:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return str(path)


SHARED_PREFIX = DatasetConfig(
    dataset="builtin:sharegpt",
    dataset_name="shared-prefix",
    num_prompts=16,
    prefix_len=256,
    suffix_len=16,
    prefix_groups=2,
    output_len=4,
)


def test_prefix_caching_on_the_embedded_engine_serves_the_shared_prefixes_from_its_cache(runner):
    off, off_requests = run_on_cpu(runner, SHARED_PREFIX)
    on, on_requests = run_on_cpu(runner, SHARED_PREFIX, enable_prefix_caching=True)
    # Without sharing nothing is served from the cache: a true 0, not "not reported".
    assert off["prefix_cache_hit_rate"] == 0 and off_requests["cached_tokens"].eq(0).all()
    # With it, whole 64-token blocks of the prefix: every request after its group's first few (4 run at once)
    cached = on_requests["cached_tokens"].to_numpy()
    assert set(np.unique(cached)) <= {0, 64, 128, 192, 256} and (cached == 256).sum() >= 16 - 2 * 4
    assert on["total_cached_tokens"] == cached.sum() and 0.5 < on["prefix_cache_hit_rate"] < 1
    assert on["prefix_cache_hit_rate"] == pytest.approx(cached.sum() / on_requests["input_len"].sum())
    assert on_requests["prefix_group"].tolist() == [0, 1] * 8  # the dataset's facts beside the measurements


def test_by_default_each_groups_later_prompts_find_its_whole_prefix_cached_in_a_batch(runner):
    """The default shared-prefix order (leaders-first), every prompt submitted at once in a batch: with caching,
    each prompt after its group's first is served the group's 128-token prefix from the cache (two whole 64-token
    blocks), which its TTFT no longer prefills; without, none is."""
    dataset = DatasetConfig(
        dataset="builtin:sharegpt", dataset_name="shared-prefix", num_prompts=8, prefix_len=128, output_len=4
    )
    at_once = LoadConfig(concurrency=8, stream_output=True)
    off, off_requests = run_on_cpu(runner, dataset, at_once)
    on, on_requests = run_on_cpu(runner, dataset, at_once, enable_prefix_caching=True)
    followers = on_requests["prefix_group"].duplicated()  # a group's prompts after its first
    assert followers.sum() == 4
    assert on_requests.loc[followers, "cached_tokens"].eq(128).all()
    assert on_requests.loc[~followers, "cached_tokens"].eq(0).all()
    assert off_requests["cached_tokens"].eq(0).all() and off["prefix_cache_hit_rate"] == 0
    assert on["prefix_cache_hit_rate"] == pytest.approx(4 * 128 / on_requests["input_len"].sum())


def test_multi_turn_on_the_embedded_engine_resends_its_answers_and_reports_ttft_by_turn(runner):
    dataset = DatasetConfig(
        dataset="builtin:sample",
        dataset_name="multi-turn",
        num_prompts=3,
        turns=3,
        sharegpt_output_len=6,
        think_time_s=0.1,
    )
    row, requests = run_on_cpu(runner, dataset, enable_prefix_caching=True)
    assert len(requests) == 9 and requests["status"].eq("success").all()
    by_session = requests.sort_values(["session", "turn"]).groupby("session")
    for _, turns in by_session:
        starts, finishes, inputs = (turns[c].to_numpy() for c in ("start_s", "finish_s", "input_len"))
        assert (starts[1:] >= finishes[:-1] + 0.1 - 0.01).all()  # each turn after the answer and the think time
        # the prompt measured when sent: the conversation so far, the model's 6-token answers included
        assert (inputs[1:] > inputs[:-1] + 6).all()
    assert all(row[f"mean_ttft_turn{turn}_ms"] > 0 for turn in (1, 2, 3))
    assert math.isnan(row.get("mean_ttft_turn4_ms", math.nan))  # no fourth turn
    assert requests.loc[requests["turn"] > 0, "cached_tokens"].gt(0).any()  # later turns reuse earlier blocks


def test_a_trace_on_the_embedded_engine_starts_each_request_at_its_time(runner, tmp_path):
    times_ms = [0, 75, 150, 375]
    records = [{"timestamp": t, "input_length": 40, "output_length": 4, "hash_ids": [1]} for t in times_ms]
    dataset = DatasetConfig(
        dataset=write_jsonl(tmp_path / "trace.jsonl", records), dataset_name="trace", num_prompts=4, trace_block_len=32
    )
    load = LoadConfig(load_pattern="trace", concurrency=4, trace_speedup=0.5)
    _, requests = run_on_cpu(runner, dataset, load)
    due, started = np.array(times_ms) / 500, requests["start_s"].to_numpy()
    # The run's clock starts before the engine's schedule does, so no request starts before its time, however busy
    # the machine. The speed-up slows this trace down: replayed without it, or multiplied by it, every request after
    # the first would start early (by 75 ms and more), which no machine's load can hide.
    assert (started >= due).all(), started - due
    # Each in its own place in the trace; late, if the machine is busy, by a lag, not by seconds (a unit slip).
    assert started.argsort().tolist() == due.argsort().tolist()
    assert (started - due < NEVER_THAT_LATE_S).all(), started - due
    assert requests["shared_prefix_tokens"].tolist() == [0, 32, 32, 32]


def test_custom_prompts_run_on_the_embedded_engine_with_their_own_lengths(runner, tmp_path):
    records = [
        {"prompt": "Name three colours.", "output_len": 3},
        {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 5},
        {"prompt": "Count to ten."},
    ]
    dataset = DatasetConfig(
        dataset=write_jsonl(tmp_path / "mine.jsonl", records), dataset_name="custom", num_prompts=3, output_len=7
    )
    row, requests = run_on_cpu(runner, dataset)
    assert requests["output_len"].tolist() == [3, 5, 7] and row["completed"] == 3


# ---- restful ---------------------------------------------------------------------------------------------------


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
            "--output-file",
            "",
            "--results",
            str(tmp_path / "results"),
            "--disable-warmup",
            *flags,
        ]
    )


def scripted_restful(url: str, tmp_path, *flags: str) -> int:
    return restful(url, tmp_path, "--model", "scripted", *flags)  # the scripted server has no /v1/models


# The scripted server answers TEXT_EVENTS tokens, whatever is asked: asking that many, every request succeeds.
SCRIPTED_SHARED_PREFIX = (
    "--prefix-len",
    "32",
    "--suffix-len",
    "8",
    "--output-len",
    str(scripted.TEXT_EVENTS),
    "--request-rate",
    "inf",
)


def only_run(tmp_path):
    history = History(tmp_path / "results")
    (run_id,) = history.load()["run_id"]
    return history.load().iloc[0], history.requests(run_id)


def test_a_servers_cached_tokens_land_in_the_history(scripted_server, tmp_path, capsys):
    assert (
        scripted_restful(
            f"{scripted_server}/cached",
            tmp_path,
            "--dataset-name",
            "shared-prefix",
            "--num-prompts",
            "4",
            *SCRIPTED_SHARED_PREFIX,
        )
        == 0
    )
    row, requests = only_run(tmp_path)
    assert requests["cached_tokens"].tolist() == [scripted.CACHED_TOKENS] * 4
    assert row["total_cached_tokens"] == 4 * scripted.CACHED_TOKENS
    assert row["prefix_cache_hit_rate"] == pytest.approx(4 * scripted.CACHED_TOKENS / requests["input_len"].sum())
    assert "Prefix cache: 12 of " in capsys.readouterr().out


def test_a_server_that_says_nothing_of_its_cache_is_not_reported_never_zero(scripted_server, tmp_path, capsys):
    assert (
        scripted_restful(
            scripted_server, tmp_path, "--dataset-name", "shared-prefix", "--num-prompts", "2", *SCRIPTED_SHARED_PREFIX
        )
        == 0
    )
    row, requests = only_run(tmp_path)
    assert requests["cached_tokens"].isna().all() and math.isnan(row["prefix_cache_hit_rate"])
    assert "Prefix cache: not reported" in capsys.readouterr().out


def test_a_replayed_traces_send_times_measured_at_the_server_follow_the_trace(scripted_server, tmp_path):
    times_ms = [0, 120, 150, 400, 700, 710, 1000]
    records = [
        {"timestamp": 5000 + t, "input_length": 16, "output_length": scripted.TEXT_EVENTS, "hash_ids": [n % 2]}
        for n, t in enumerate(times_ms)
    ]
    scripted.SERVED.clear()
    assert (
        scripted_restful(
            f"{scripted_server}/cached",
            tmp_path,
            "--dataset-name",
            "trace",
            "--dataset-path",
            write_jsonl(tmp_path / "trace.jsonl", records),
            "--num-prompts",
            "7",
            "--trace-block-len",
            "8",
        )
        == 0
    )
    arrived = np.sort([request.arrived for request in scripted.SERVED])
    row, requests = only_run(tmp_path)
    assert row["load_pattern"] == "trace" and row["completed"] == 7 and len(arrived) == 7
    # The client sends each request at its time in the trace, never before it...
    assert np.sort(requests["scheduled_s"]) == pytest.approx(np.array(times_ms) / 1000, abs=1e-9)
    assert (requests["sent_s"] >= requests["scheduled_s"]).all()
    # ...and the server saw each one after the client's send, and at least FIRST_TOKEN_S before the client read its
    # first token (the server writes it no sooner), however late a busy machine made either: so some start of the
    # client's clock (t0, on the perf_counter the server reads too) puts every arrival in that window, as wide as the
    # run's own delays. Which request is which is not known, so the i-th arrival goes in the window of the i-th send
    # (if any pairing fits, this one does). Requests sent at once and stamped as the trace says leave no such t0.
    sent = requests["sent_s"].to_numpy()
    latest = sent + requests["ttft_s"].to_numpy() - scripted.FIRST_TOKEN_S
    assert (arrived - np.sort(latest)).max() <= (arrived - np.sort(sent)).min()


def test_a_trace_runs_requested_rate_is_the_traces_own_at_its_speed_up(scripted_server, tmp_path, capsys):
    records = [
        {"timestamp": t, "input_length": 16, "output_length": scripted.TEXT_EVENTS, "hash_ids": [n]}
        for n, t in enumerate((0, 500, 1000, 1500))  # 2 requests a second, 4 at speed-up 2
    ]
    trace = write_jsonl(tmp_path / "trace.jsonl", records)
    assert (
        scripted_restful(
            scripted_server,
            tmp_path,
            "--dataset-name",
            "trace",
            "--dataset-path",
            trace,
            "--num-prompts",
            "4",
            "--trace-block-len",
            "8",
            "--trace-speedup",
            "2",
        )
        == 0
    )
    row, _ = only_run(tmp_path)
    assert row["scheduled_rate"] == pytest.approx(4.0)
    out = capsys.readouterr().out
    assert re.search(r"^Traffic request rate: +4\.00 *$", out, re.MULTILINE), out
    assert re.search(r"^Requested rate \(req/s\): +4\.00 *$", out, re.MULTILINE), out


def trace_file(path) -> str:
    return write_jsonl(
        path / "trace.jsonl",
        [{"timestamp": 200 * n, "input_length": 40, "output_length": 4, "hash_ids": [0, n]} for n in range(4)],
    )


def custom_file(path) -> str:
    return write_jsonl(path / "mine.jsonl", [{"prompt": f"Count to {n}.", "max_tokens": 4} for n in range(4)])


AT_ONCE = ("--request-rate", "inf")  # a trace says when its requests go: a rate given with it is refused


@pytest.mark.parametrize(
    "flags",
    [
        lambda path: (
            "--dataset-name",
            "shared-prefix",
            "--prefix-len",
            "48",
            "--suffix-len",
            "8",
            "--output-len",
            "4",
            *AT_ONCE,
        ),
        lambda path: (
            "--dataset-name",
            "multi-turn",
            "--dataset-path",
            "builtin:sample",
            "--turns",
            "2",
            "--sharegpt-output-len",
            "4",
            *AT_ONCE,
        ),
        lambda path: ("--dataset-name", "trace", "--dataset-path", trace_file(path), "--trace-block-len", "16"),
        lambda path: ("--dataset-name", "custom", "--dataset-path", custom_file(path), *AT_ONCE),
    ],
    ids=["shared-prefix", "multi-turn", "trace", "custom"],
)
def test_restful_runs_each_workload_against_transformers_serve(transformers_server, tmp_path, flags):
    assert restful(transformers_server, tmp_path, "--num-prompts", "4", *flags(tmp_path)) == 0
    row, requests = only_run(tmp_path)
    assert requests["status"].eq("success").all() and row["completed"] == len(requests) >= 4
