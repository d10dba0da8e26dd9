"""The server's own Prometheus metrics: LMDeploy's and vLLM's pages (written by prometheus_client, as those servers
write them) read as one set, scraped during real runs against tests/metrics_server.py, kept in the run folder and
drawn on the Run page's time axis; a server without them is one line and the run goes on."""

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import psutil
import pytest
from metrics_server import (
    CACHED_TOKENS_PER_REQUEST,
    FIRST_TOKEN_S,
    HUGE_NAME,
    PROMPT_TOKENS_PER_REQUEST,
    SLOTS,
    SPEC_ACCEPTED_BY_POSITION,
    SPEC_ACCEPTED_PER_REQUEST,
    SPEC_DRAFT_TOKENS_PER_REQUEST,
    SPEC_DRAFTS_PER_REQUEST,
    ServerState,
    metrics_server,  # noqa: F401 (fixture)
    slow_metrics_server,  # noqa: F401 (fixture)
)

from bench_core.cli import build_parser, main
from bench_core.cli.restful import config_for_rate
from bench_core.config import DatasetConfig, EngineConfig, LoadConfig, RunConfig
from bench_core.engines.metrics_reader import ReaderConfig, read_page, reader_command
from bench_core.engines.server_metrics import (
    KNOWN_NAMES,
    PEAK_KV_CACHE_USAGE,
    MetricsScraper,
    acceptance_by_position,
    raw_frame,
    run_summary,
    unified_series,
)
from bench_core.measure.catalog import acceptance_by_position as positions_of
from bench_core.measure.catalog import server_columns
from bench_core.run.observer import JobObserver
from bench_core.run.runner import Runner
from bench_core.store.history import SERVER_METRICS_FILE, History
from bench_core.views.figures import NO_DATA
from bench_core.views.server_charts import (
    client_ttft_by_interval,
    ended_server_metrics,
    server_metrics_over_time,
)
from bench_core.views.tables import quantity_table

ROOT = Path(__file__).resolve().parent.parent


def read_of(state: ServerState, time_s: float) -> list[tuple]:
    return [(time_s, *sample) for sample in read_page(state.page(), KNOWN_NAMES).samples]


def by_metric(series) -> dict[str, list[float]]:
    return {key: part["value"].tolist() for key, part in series.groupby("metric")}


@pytest.mark.parametrize("flavour", ["lmdeploy", "vllm", "sglang"])
def test_lmdeploys_vllms_and_sglangs_names_read_as_one_set(flavour):
    state = ServerState(flavour)
    before = read_of(state, 10.0)
    state.running.set(2)
    state.waiting.set(3)
    state.usage.set(0.5)
    for _ in range(2):
        state.served()
    for ttft, queue in ((0.1, 0.0), (0.3, 0.4)):
        state.ttft.observe(ttft)
        state.queue.observe(queue)
    state.e2e.observe(1.5)
    state.drafted()
    series = unified_series(raw_frame(before + read_of(state, 12.0)))

    at_second = {key: values[-1] for key, values in by_metric(series[series["time_s"] == 12.0]).items()}
    assert at_second == pytest.approx(
        {
            "running": 2,
            "waiting": 3,
            "kv_cache_usage": 0.5,
            "prefix_hit_rate": CACHED_TOKENS_PER_REQUEST / PROMPT_TOKENS_PER_REQUEST,
            "cached_tokens_per_s": 2 * CACHED_TOKENS_PER_REQUEST / 2.0,  # over the 2 s between the reads
            "spec_accept_length": 1 + 6 / 4,
            "spec_accept_rate": SPEC_ACCEPTED_PER_REQUEST / SPEC_DRAFT_TOKENS_PER_REQUEST,
            "server_ttft_s": 0.2,
            "server_queue_s": 0.2,
            "server_e2e_s": 1.5,
        }
    )
    # The first read has no interval before it: only what a gauge says on its own.
    assert set(series.loc[series["time_s"] == 10.0, "metric"]) <= {
        "running",
        "waiting",
        "kv_cache_usage",
        "prefix_hit_rate",
        "spec_accept_length",
        "spec_accept_rate",
    }


# Each position's accepted tokens over the drafts: 3/4, 2/4, 1/4 of them.
BY_POSITION = [count / SPEC_DRAFTS_PER_REQUEST for count in SPEC_ACCEPTED_BY_POSITION]


@pytest.mark.parametrize("flavour, by_position", [("vllm", BY_POSITION), ("lmdeploy", BY_POSITION), ("sglang", None)])
def test_vllms_per_position_counters_and_sglangs_gauges_give_the_same_acceptance_metrics(flavour, by_position):
    """vLLM and LMDeploy count drafts, draft tokens and accepted tokens per position (from 0), each under its own
    prefix: the run's rates of positions 1..k are the counters' growth over it. SGLang serves only its mean
    acceptance length and rate (sglang:spec_accept_length and sglang:spec_accept_rate, gauges: its metrics collector
    has no per-position counter): no positions."""
    state = ServerState(flavour)
    state.drafted()  # before the run: the first read is the counters' baseline
    reads = read_of(state, 0.0)
    for time_s in (1.0, 2.0):
        state.drafted()
        reads += read_of(state, time_s)
    summary = run_summary(raw_frame(reads))
    columns = server_columns(summary)
    assert columns["mean_spec_accept_length"] == pytest.approx(1 + SPEC_ACCEPTED_PER_REQUEST / SPEC_DRAFTS_PER_REQUEST)
    assert columns["server_spec_acceptance_rate"] == pytest.approx(
        SPEC_ACCEPTED_PER_REQUEST / SPEC_DRAFT_TOKENS_PER_REQUEST
    )
    if by_position is None:
        assert "spec_acceptance_by_position" not in columns and positions_of(columns) is None
    else:
        assert json.loads(columns["spec_acceptance_by_position"]) == pytest.approx(by_position)
        assert positions_of(columns) == pytest.approx(by_position)


def test_per_position_acceptance_is_none_without_drafts_or_after_a_counter_reset():
    state = ServerState("vllm")
    state.drafted()
    first = read_of(state, 0.0)
    quiet = read_of(state, 1.0)
    assert acceptance_by_position(raw_frame(first + quiet)) is None  # nothing drafted over the run
    reset = [(2.0, name, labels, 0.0 if "_total" in name else value) for _, name, labels, value in quiet]
    assert acceptance_by_position(raw_frame(first + reset)) is None


def test_llama_cpps_names_read_into_the_same_set_from_a_page_without_labels():
    """llama-server --metrics: running and deferred requests, KV-cache usage (older builds), the prompt tokens it
    found cached beside those it processed, which leave the cached out, and the tokens it predicted; no histograms."""
    state = ServerState("llamacpp")
    before = read_of(state, 10.0)
    state.running.set(2)
    state.waiting.set(3)
    state.usage.set(0.5)
    for _ in range(2):
        state.served()
    state.predicted.inc(10)
    page = state.page().decode()
    assert "llamacpp:requests_processing 2.0\n" in page and "{" not in page  # no labels
    series = unified_series(raw_frame(before + read_of(state, 12.0)))

    at_second = {key: values[-1] for key, values in by_metric(series[series["time_s"] == 12.0]).items()}
    assert at_second == pytest.approx(
        {
            "running": 2,
            "waiting": 3,
            "kv_cache_usage": 0.5,
            "prefix_hit_rate": CACHED_TOKENS_PER_REQUEST / PROMPT_TOKENS_PER_REQUEST,
            "cached_tokens_per_s": 2 * CACHED_TOKENS_PER_REQUEST / 2.0,
            # the prompt tokens it processed, the cached left out, and those it generated
            "prompt_tokens_per_s": 2 * (PROMPT_TOKENS_PER_REQUEST - CACHED_TOKENS_PER_REQUEST) / 2.0,
            "generation_tokens_per_s": 10 / 2.0,
        }
    )
    assert run_summary(raw_frame(before + read_of(state, 12.0)))["prefix_hit_rate"] == pytest.approx(
        CACHED_TOKENS_PER_REQUEST / PROMPT_TOKENS_PER_REQUEST
    )


def test_an_interval_without_observations_or_after_a_counter_reset_has_no_value():
    state = ServerState("lmdeploy")
    state.served()
    state.ttft.observe(0.2)
    first = read_of(state, 0.0)
    later = [row for row in read_of(state, 1.0)]  # nothing observed in between
    reset = [(2.0, name, labels, 0.0 if name.endswith("_total") else value) for _, name, labels, value in later]
    series = by_metric(unified_series(raw_frame(first + later + reset)))
    assert "server_ttft_s" not in series  # no TTFT observed between any two reads
    assert series["cached_tokens_per_s"] == [0.0]  # 0 in the quiet second; the reset's interval has none


def test_the_runs_figures_take_counters_and_histograms_over_the_whole_run_and_gauges_over_its_reads():
    state = ServerState("vllm")
    reads = read_of(state, 0.0)
    for time_s, waiting, usage, ttfts in ((1.0, 4, 1.0, (0.1, 0.2, 0.6)), (2.0, 0, 0.5, ()), (3.0, 2, 0.0, (0.3,))):
        state.waiting.set(waiting)
        state.usage.set(usage)
        for ttft in ttfts:
            state.ttft.observe(ttft)
            state.served()
        reads += read_of(state, time_s)
    summary = run_summary(raw_frame(reads))
    assert summary["server_ttft_s"] == pytest.approx((0.1 + 0.2 + 0.6 + 0.3) / 4)  # not the mean of interval means
    # The gauges over the reads after the first, which is taken before the clock starts.
    assert summary["waiting"] == pytest.approx((4 + 0 + 2) / 3) and summary[PEAK_KV_CACHE_USAGE] == 1.0
    assert summary["prefix_hit_rate"] == pytest.approx(CACHED_TOKENS_PER_REQUEST / PROMPT_TOKENS_PER_REQUEST)
    assert "spec_accept_length" not in summary and "server_e2e_s" not in summary  # nothing drafted or ended
    assert run_summary(raw_frame([])) == {}


def test_a_page_that_is_not_prometheus_text_is_refused():
    with pytest.raises(ValueError, match="not Prometheus text"):
        read_page(b"<html>\n<body>{{{ 1 2 3</body>\n", KNOWN_NAMES)


@pytest.mark.parametrize(
    "flavour, reason",
    [
        ("no-metrics", "answered HTTP 404 Not Found"),
        ("garbled", "is not Prometheus text"),
        ("unknown", "has none of the LMDeploy, vLLM, SGLang or llama.cpp metrics"),
    ],
)
def test_a_server_without_metrics_we_read_is_one_sentence_and_nothing_is_scraped(metrics_server, flavour, reason):
    scraper = MetricsScraper(f"{metrics_server}/{flavour}/metrics", 0.1)
    scraper.start()
    assert scraper.stop() is None
    (why_not,) = scraper.warnings
    assert why_not.startswith("No server metrics for this run: ") and reason in why_not
    assert "\n" not in why_not and len(why_not) < 300


def test_the_reader_parses_the_lines_of_our_names_as_prometheus_client_does():
    from prometheus_client.parser import text_string_to_metric_families

    state = ServerState("vllm")
    state.served()
    state.ttft.observe(0.3)
    state.usage.set(float("nan"))
    page = state.page() + b'vllm:num_requests_waiting{model_name="a \\"quoted\\" \\\\ {brace} \\n",x=""} +Inf\n'
    expected = [
        (sample.name, json.dumps(sample.labels, sort_keys=True), sample.value)
        for family in text_string_to_metric_families(page.decode())
        for sample in family.samples
        if sample.name in KNOWN_NAMES
    ]
    read = read_page(page, KNOWN_NAMES)
    assert read.crowded == [] and sorted(map(str, read.samples)) == sorted(map(str, expected))
    assert ("vllm:num_requests_waiting", json.dumps({"model_name": 'a "quoted" \\ {brace} \n', "x": ""}), np.inf) in (
        read.samples
    )


def test_a_name_with_more_label_sets_than_a_read_keeps_is_left_out_and_the_rest_is_read():
    def page(label_sets: int) -> bytes:
        crowd = "".join(f'vllm:num_requests_running{{id="{i}"}} 1\n' for i in range(label_sets))
        return (
            '# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{model_name="m"} 0.5\n'
            f"# TYPE vllm:num_requests_running gauge\n{crowd}"
            'vllm:num_requests_waiting{model_name="m"} 3\nvllm:other{model_name="m"} 9\n'
        ).encode()

    left_out = read_page(page(11), KNOWN_NAMES, max_label_sets=10)
    assert left_out.crowded == ["vllm:num_requests_running"]
    assert [name for name, _, _ in left_out.samples] == ["vllm:kv_cache_usage_perc", "vllm:num_requests_waiting"]
    kept = read_page(page(10), KNOWN_NAMES, max_label_sets=10)
    assert kept.crowded == [] and len(kept.samples) == 12


def test_a_line_of_our_names_that_is_no_sample_fails_the_read():
    with pytest.raises(ValueError, match="not Prometheus text"):
        read_page(b'vllm:num_requests_running{model_name="m"} many\n', KNOWN_NAMES)
    assert read_page(b"process_cpu_seconds_total 12.5\n", KNOWN_NAMES).samples == []  # no name of ours: no fault


def test_the_reader_process_imports_neither_numpy_nor_pandas():
    python, *rest = reader_command()
    done = subprocess.run([python, "-X", "importtime", *rest], input="", capture_output=True, text=True, timeout=60)
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert done.returncode == 0 and "bench_core.engines.metrics_reader" in imported, done.stderr
    assert not {"numpy", "pandas", "torch", "bench_core.config"} & imported


def test_the_api_key_reaches_the_reader_on_its_stdin_never_its_command_line(metrics_server):
    secret = "sk-metrics-0123456789"
    scraper = MetricsScraper(f"{metrics_server}/vllm/metrics", 0.1, {"Authorization": f"Bearer {secret}"})
    scraper.start()
    try:
        (reader,) = [child for child in psutil.Process().children() if "metrics_reader" in " ".join(child.cmdline())]
        assert secret not in " ".join(reader.cmdline()) and secret not in str(reader.environ())
    finally:
        scraper.stop()
    assert not scraper.raw().empty


def start_reader(url: str, interval_s: float) -> subprocess.Popen:
    reader = subprocess.Popen(
        reader_command(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        # As a terminal's job gets it, whoever runs the tests: a test run in the background inherits SIGINT ignored,
        # which the reader keeps ignored (as it should), and Ctrl-C would then be no test of it.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    config = ReaderConfig(url, {}, interval_s, 5.0, 2**20, sorted(KNOWN_NAMES))
    reader.stdin.write(config.to_line())
    reader.stdin.flush()
    return reader


@pytest.mark.parametrize("end", ["parent gone", "ctrl-c"])
def test_the_reader_leaves_at_once_and_quietly_when_its_parent_is_gone_or_at_ctrl_c(metrics_server, end):
    reader = start_reader(f"{metrics_server}/vllm/metrics", 600.0)  # its next read would be in 10 minutes
    assert json.loads(reader.stdout.readline())["samples"]
    if end == "ctrl-c":
        reader.send_signal(signal.SIGINT)
    else:
        reader.stdin.close()  # what the parent's death does to it
    assert reader.wait(timeout=60) == (-signal.SIGINT if end == "ctrl-c" else 0)  # 60 s: a hang, not a speed
    assert reader.stderr.read() == b""  # no traceback


# ---- through the runner, the history and the Run page's figure --------------------------------------------------


def server_run(url: str, **engine) -> RunConfig:
    return RunConfig(
        engine=EngineConfig(
            backend="openai",
            model="tiny",
            base_url=url,
            server_kind="lmdeploy",
            tokenizer="builtin:tiny-llama",
            server_metrics_interval_s=0.1,
            **engine,
        ),
        dataset=DatasetConfig(dataset="builtin:sample", num_prompts=8, sharegpt_output_len=12),
        load=LoadConfig(load_pattern="request_rate", stream_output=True, max_concurrency=6),
    )


@pytest.fixture
def runner(tmp_path):
    runner = Runner(History(tmp_path / "results"))
    yield runner
    runner.shutdown()


@pytest.mark.slow
def test_a_server_run_keeps_the_servers_samples_and_they_show_its_queue(metrics_server, runner):
    run = runner.submit(server_run(f"{metrics_server}/lmdeploy"))
    assert run.wait(60) and run.state == "finished", run.message
    assert run.measurement.warnings == []

    stored = runner.history.server_metrics(run.run_id)
    assert (runner.history.run_dir(run.run_id) / SERVER_METRICS_FILE).exists()
    assert stored.equals(run.record.server_metrics)
    assert stored["time_s"].min() < 0 < stored["time_s"].max()  # a read before the clock started, one after it ended
    series = by_metric(unified_series(stored))
    # 6 requests in flight, 2 slots: the server ran at most 2 and had others waiting, and its KV usage followed.
    assert max(series["running"]) == SLOTS and max(series["waiting"]) >= 1 and max(series["kv_cache_usage"]) == 1.0
    assert max(series["server_queue_s"]) > 0
    # On the server's clock, each request's TTFT lies between the server's own sleep and what the client saw of it (the
    # interval means, not their mean: it weighs a lone request as much as an interval's crowd, unlike the client's).
    client_ttft = run.record.requests["ttft_s"]
    assert FIRST_TOKEN_S <= min(series["server_ttft_s"]) and max(series["server_ttft_s"]) <= client_ttft.max()

    # Summarised into catalog metrics, in the history row like any other, the gap beside them.
    row = runner.history.load().iloc[0]
    expected = (
        1.0,
        CACHED_TOKENS_PER_REQUEST / PROMPT_TOKENS_PER_REQUEST,
        1 + SPEC_ACCEPTED_PER_REQUEST / SPEC_DRAFTS_PER_REQUEST,
    )
    assert (row["peak_kv_cache_usage"], row["server_prefix_hit_rate"], row["mean_spec_accept_length"]) == expected
    assert row["mean_server_waiting"] > 0 and FIRST_TOKEN_S * 1000 <= row["mean_server_ttft_ms"] <= row["mean_ttft_ms"]
    served = quantity_table(row.to_dict(), "served").set_index("quantity")["value"]
    assert served["Client minus server TTFT"] == pytest.approx(row["mean_ttft_ms"] - row["mean_server_ttft_ms"])

    figure = ended_server_metrics(stored, run.record.requests, run.record.metrics["duration_s"])
    titles = [annotation.text for annotation in figure.layout.annotations]
    assert titles == [
        "KV cache and prefix hits (%)",
        "Requests on the server",
        "Latency, mean per interval (ms)",
        "Cached prompt tokens (tok/s)",
        "Speculative acceptance length (tokens/step)",
    ]
    names = {trace.name for trace in figure.data}
    assert {"Server TTFT", "Client TTFT", "Waiting requests", "KV-cache usage"} <= names
    assert tuple(figure.layout.xaxis.range) == (0, run.record.metrics["duration_s"])


def test_a_server_without_metrics_gives_one_warning_and_the_run_goes_on(metrics_server, runner):
    run = runner.submit(server_run(f"{metrics_server}/no-metrics"))
    assert run.wait(60) and run.state == "finished", run.message
    (warning,) = run.measurement.warnings
    assert warning.endswith(
        "answered HTTP 404 Not Found (LMDeploy's api_server serves them unless started with --disable-metrics)."
    )
    assert run.record.server_metrics is None and runner.history.server_metrics(run.run_id) is None


def test_reads_that_fail_mid_run_are_one_warning_with_the_last_reason_and_the_run_goes_on(metrics_server, runner):
    run = runner.submit(server_run(f"{metrics_server}/flaky"))
    assert run.wait(60) and run.state == "finished", run.message
    (warning,) = run.measurement.warnings
    assert re.fullmatch(
        r"\d+ reads of the server's /metrics failed, so the server metrics have gaps \(the last: "
        r"http://127\.0\.0\.1:\d+/flaky/metrics answered HTTP 500 Internal Server Error\.\)\.",
        warning,
    )
    assert len(unified_series(run.record.server_metrics)["time_s"].unique()) == 1  # the first read stands


@pytest.mark.slow
def test_credentials_in_the_url_are_sent_but_never_written(metrics_server, runner):
    url = metrics_server.replace("http://", "http://user:hunter2-secret@")
    run = runner.submit(server_run(f"{url}/no-metrics"))
    assert run.wait(60) and run.state == "finished", run.message
    (warning,) = run.measurement.warnings
    assert "answered HTTP 404" in warning and "hunter2-secret" not in warning
    run = runner.submit(server_run(f"{url}/lmdeploy"))
    assert run.wait(60) and run.state == "finished", run.message
    assert run.measurement.warnings == []
    for path in runner.history.run_dir(run.run_id).iterdir():
        assert b"hunter2-secret" not in path.read_bytes(), path


def test_turned_off_the_server_is_not_asked(metrics_server, runner):
    run = runner.submit(server_run(f"{metrics_server}/no-metrics", server_metrics=False))
    assert run.wait(60) and run.state == "finished", run.message
    assert run.measurement.warnings == [] and run.record.server_metrics is None


def test_the_live_snapshot_carries_the_series_so_far(metrics_server, runner):
    seen = []

    class Watching(JobObserver):
        def on_snapshot(self, run, snap):
            if snap is not None and snap.server_metrics is not None:
                seen.append(snap.server_metrics)

    run = runner.submit(server_run(f"{metrics_server}/vllm"), observers=[Watching()])
    assert run.wait(60) and run.state == "finished", run.message
    assert seen and {"running", "waiting", "kv_cache_usage"} <= set(seen[-1]["metric"])
    assert seen[-1]["time_s"].max() < run.record.metrics["duration_s"] + 1.0  # on the run's clock


def test_the_clients_ttft_is_averaged_over_the_requests_whose_first_token_came_between_two_reads():
    requests = pd.DataFrame(
        {
            "status": ["success", "success", "success", "failed", "success"],
            "start_s": [0.1, 0.5, 1.2, 0.2, 2.5],
            "ttft_s": [0.2, 0.4, 0.6, np.nan, 0.1],
        }
    )
    # First tokens at 0.3, 0.9, 1.8 and 2.6 s; reads at 0, 1 and 2 s: the last came after the last read.
    client = client_ttft_by_interval(requests, np.array([0.0, 1.0, 2.0]))
    assert client["time_s"].tolist() == [1.0, 2.0] and client["value"].tolist() == pytest.approx([0.3, 0.6])


def test_the_figure_says_so_when_there_is_nothing_to_draw():
    figure = server_metrics_over_time(None)
    assert not figure.data and figure.layout.annotations[0].text == NO_DATA


def test_restful_prints_the_servers_figures_below_its_box(metrics_server, tmp_path, capsys):
    assert (
        main(
            [
                "restful",
                "--backend",
                "lmdeploy",
                "--base-url",
                f"{metrics_server}/lmdeploy",
                "--model",
                "tiny",
                "--tokenizer",
                "builtin:tiny-llama",
                "--dataset-path",
                "builtin:sample",
                "--num-prompts",
                "6",
                "--sharegpt-output-len",
                "8",
                "--max-concurrency",
                "4",
                "--server-metrics-interval",
                "0.2",
                "--output-file",
                "",
                "--results",
                str(tmp_path / "results"),
            ]
        )
        == 0
    )
    captured = capsys.readouterr()
    (line,) = [line for line in captured.out.splitlines() if line.startswith("Server metrics: ")]
    assert "Peak KV-cache usage (server) 1 fraction" in line and "Client minus server TTFT" in line
    assert "warning" not in captured.err


@pytest.mark.parametrize(
    "flavour, backend, said",
    [("vllm", "vllm", "1: 0.75, 2: 0.5, 3: 0.25"), ("sglang", "sglang-oai", "not reported")],
)
def test_restful_prints_the_acceptance_by_draft_position_or_not_reported(
    metrics_server, tmp_path, capsys, flavour, backend, said
):
    args = ["restful", "--backend", backend, "--base-url", f"{metrics_server}/{flavour}", "--model", "tiny"]
    args += ["--tokenizer", "builtin:tiny-llama", "--dataset-path", "builtin:sample", "--num-prompts", "4"]
    args += ["--sharegpt-output-len", "4", "--server-metrics-interval", "0.2", "--output-file", ""]
    assert main([*args, "--results", str(tmp_path / "results")]) == 0
    captured = capsys.readouterr()
    assert f"Acceptance by draft position (server): {said}\n" in captured.out
    assert "Draft acceptance rate (server) 0.5 fraction" in captured.out


def test_restful_takes_the_off_switch_and_the_interval_from_the_catalog():
    parser = build_parser()
    on = config_for_rate(parser.parse_args(["restful"]), "http://h:1", "m", 1.0)
    off = config_for_rate(
        parser.parse_args(["restful", "--no-server-metrics", "--server-metrics-interval", "0.5"]),
        "http://h:1",
        "m",
        1.0,
    )
    assert (on.engine.server_metrics, on.engine.server_metrics_interval_s) == (True, 1.0)
    assert (off.engine.server_metrics, off.engine.server_metrics_interval_s) == (False, 0.5)


# ---- a slow or huge page costs its samples, never the run ----------------------------------------------------------


def restful_cli(url: str, tmp_path: Path, *flags: str) -> subprocess.CompletedProcess:
    """`python -m bench_core restful` against `url`: 6 requests of 8 tokens, recorded under tmp_path/results."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    command = [
        *(sys.executable, "-m", "bench_core", "restful", "--backend", "lmdeploy", "--base-url", url, "--model", "tiny"),
        *("--tokenizer", "builtin:tiny-llama", "--dataset-path", "builtin:sample", "--num-prompts", "6"),
        *("--sharegpt-output-len", "8", "--max-concurrency", "4", "--output-file", "", "--results", "results"),
        *flags,
    ]
    return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def the_run(tmp_path: Path) -> tuple[History, str]:
    history = History(tmp_path / "results")
    (run_id,) = history.load()["run_id"]
    return history, run_id


@pytest.mark.slow
def test_a_metrics_page_that_dribbles_costs_its_samples_not_the_run(slow_metrics_server, tmp_path):
    done = restful_cli(f"{slow_metrics_server.url}/dribble", tmp_path)
    assert done.returncode == 0, done.stderr
    history, run_id = the_run(tmp_path)
    assert history.requests(run_id)["status"].tolist() == ["success"] * 6
    assert history.server_metrics(run_id) is None
    (warning,) = [line for line in done.stderr.splitlines() if "/metrics" in line]
    assert warning.startswith("warning: No server metrics for this run: Cannot read http://127.0.0.1:")
    assert "/dribble/metrics" in warning
    assert not slow_metrics_server.dribbled_whole.is_set()  # the command ended without waiting for the page


@pytest.mark.slow
def test_a_huge_metrics_page_is_read_in_another_process_without_its_crowded_name(slow_metrics_server, tmp_path):
    # 5 s for a read (the interval's): reading 20 MB takes a fraction of it, on a busy machine too.
    done = restful_cli(f"{slow_metrics_server.url}/huge", tmp_path, "--server-metrics-interval", "5")
    assert done.returncode == 0, done.stderr
    history, run_id = the_run(tmp_path)
    assert history.requests(run_id)["status"].tolist() == ["success"] * 6
    read = set(unified_series(history.server_metrics(run_id))["metric"])
    assert {"running", "waiting"} <= read and "kv_cache_usage" not in read
    (warning,) = [line for line in done.stderr.splitlines() if HUGE_NAME in line]
    assert "more than 1,000 label sets" in warning and "KV-cache usage" in warning
    # The page was read by a child of the command's process, not by the process whose client sent the requests.
    (client,) = set(slow_metrics_server.completion_pids)
    readers = slow_metrics_server.metrics_pids
    assert readers and client not in readers
    assert {slow_metrics_server.parent_pids[reader] for reader in readers} == {client}
