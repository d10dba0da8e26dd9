"""tests/load_server.py's speculative mode, run as its own process: each decoding step drafts K tokens and accepts a
scripted number of them, its tokens go out as one chunk, vLLM's speculative counters count them, and a step costs
more the more requests are in flight, the drafted tokens included. The expected counts come from the rule as the
server's docstring states it, written again here."""

from __future__ import annotations

import contextlib
import http.client
import json
import math
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from restful_cli import restful

from bench_core.measure.catalog import acceptance_by_position
from bench_core.sweep.server import free_port

SERVER = Path(__file__).resolve().parent / "load_server.py"
RATES = (0.8, 0.6, 0.4, 0.2)
OUTPUT_LEN = 20  # tokens a request asks: the first, then 7 decoding steps at these rates, the last one cut short
GOLDEN = (math.sqrt(5) - 1) / 2


def chunk_sizes(output_len: int, rates: tuple[float, ...]) -> list[int]:
    """The tokens in each chunk of a request's stream: the prefill's one, then 1 + accepted per decoding step, the
    accepted ones the positions whose rate is above the step's point of the golden-ratio sequence."""
    sizes, step = [1], 0
    while sum(sizes) < output_len:
        step += 1
        point = step * GOLDEN - math.floor(step * GOLDEN)
        sizes.append(min(1 + len([rate for rate in rates if point < rate]), output_len - sum(sizes)))
    return sizes


def accepted_by_position(output_len: int, rates: tuple[float, ...]) -> tuple[int, list[int]]:
    """A request's drafts (one per decoding step, its last one too) and accepted tokens per position from 0."""
    steps = len(chunk_sizes(output_len, rates)) - 1
    points = [step * GOLDEN - math.floor(step * GOLDEN) for step in range(1, steps + 1)]
    return steps, [sum(point < rate for point in points) for rate in rates]


@contextlib.contextmanager
def load_server(*flags: str) -> Iterator[str]:
    """tests/load_server.py with `flags` on a free port, until the block ends: yields its base URL."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, str(SERVER), "--port", str(port), *flags], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 60
        while server.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                connection.request("GET", "/v1/models")
                if connection.getresponse().status == 200:
                    break
            time.sleep(0.1)
        assert server.poll() is None, server.communicate()[1]
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(10)


def speculating(token_delay_ms: float = 5, step_ms_per_request: float = 0, rates=RATES) -> list[str]:
    return [
        *("--token-delay-ms", str(token_delay_ms), "--step-ms-per-request", str(step_ms_per_request)),
        *("--draft-tokens", str(len(rates)), "--acceptance", ",".join(map(str, rates))),
    ]


def get(url: str, path: str) -> tuple[int, str]:
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    connection.request("GET", path)
    response = connection.getresponse()
    return response.status, response.read().decode()


def stream(url: str, max_tokens: int) -> list[dict]:
    """A streamed completion's chunks, after checking that [DONE] ends them."""
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    body = {"model": "load-test", "prompt": "hi", "max_tokens": max_tokens, "stream": True}
    connection.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    events = [
        line.removeprefix("data: ")
        for line in connection.getresponse().read().decode().split("\n\n")
        if line.startswith("data: ")
    ]
    assert events[-1] == "[DONE]"
    return [json.loads(event) for event in events[:-1]]


def texts(chunks: list[dict]) -> list[str]:
    return [chunk["choices"][0]["text"] for chunk in chunks]


def samples(page: str, name: str) -> dict[tuple, float]:
    """The values of the sample `name` on a Prometheus page (parsed by prometheus_client), by their labels."""
    return {
        tuple(sorted(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(page)
        for sample in family.samples
        if sample.name == name
    }


def test_the_expected_rule_is_not_the_rates_themselves():
    """The run below can only tell the scripted counts from the nominal rates if they differ."""
    drafts, accepted = accepted_by_position(OUTPUT_LEN, RATES)
    assert chunk_sizes(OUTPUT_LEN, RATES) == [1, 2, 4, 1, 3, 5, 2, 2]  # the 7th step accepted 2, but 2 were left
    assert (drafts, accepted) == (7, [6, 4, 3, 1])
    assert [count / drafts for count in accepted] != pytest.approx(list(RATES), abs=0.01)


def test_a_stream_carries_one_chunk_per_step_of_its_accepted_tokens_and_the_counters_count_them():
    with load_server(*speculating()) as url:
        chunks = stream(url, OUTPUT_LEN)
        status, page = get(url, "/metrics")
    assert texts(chunks) == [" tok" * size for size in chunk_sizes(OUTPUT_LEN, RATES)] + [""]  # then the usage's
    assert chunks[-1]["usage"]["completion_tokens"] == OUTPUT_LEN
    drafts, accepted = accepted_by_position(OUTPUT_LEN, RATES)
    labels = (("engine", "0"), ("model_name", "load-test"))
    assert status == 200
    assert samples(page, "vllm:spec_decode_num_drafts_total") == {labels: drafts}
    assert samples(page, "vllm:spec_decode_num_draft_tokens_total") == {labels: drafts * len(RATES)}
    assert samples(page, "vllm:spec_decode_num_accepted_tokens_total") == {labels: sum(accepted)}
    assert samples(page, "vllm:spec_decode_num_accepted_tokens_per_pos_total") == {
        (*labels, ("position", str(position))): count for position, count in enumerate(accepted)
    }
    assert samples(page, "vllm:num_requests_running") == {labels: 0}


def test_without_draft_tokens_a_step_is_one_token_and_there_is_no_metrics_page():
    with load_server("--token-delay-ms", "1", "--step-ms-per-request", "1") as url:
        assert texts(stream(url, 5)) == [" tok"] * 5 + [""]
        assert get(url, "/metrics")[0] == 404


@pytest.mark.parametrize(
    "flags, said",
    [
        (["--draft-tokens", "2"], "--draft-tokens and --acceptance go together"),
        (["--draft-tokens", "2", "--acceptance", "0.5"], "--draft-tokens 2 takes 2 acceptance rates"),
        (["--draft-tokens", "2", "--acceptance", "0.5,0.7"], "may not increase"),
        (["--draft-tokens", "2", "--acceptance", "0.5,-0.1"], "each within 0 and 1"),
        (["--draft-tokens", "2", "--acceptance", "a,b"], "numbers separated by commas"),
    ],
)
def test_bad_speculation_flags_are_one_line_and_an_exit(flags, said):
    ran = subprocess.run(
        [sys.executable, str(SERVER), "--port", "1", *flags], capture_output=True, text=True, timeout=60
    )
    assert ran.returncode == 2
    (error,) = [line for line in ran.stderr.splitlines() if "error:" in line]
    assert said in error and "Traceback" not in ran.stderr


@pytest.mark.slow
def test_a_run_reads_the_scripted_acceptance_by_position_from_the_servers_counters(tmp_path, capsys):
    with load_server(*speculating()) as url:
        run = restful(
            url, tmp_path, capsys, "--backend", "vllm", "--max-concurrency", "1",
            "--server-metrics-interval", "0.2", prompts=4, output_len=OUTPUT_LEN,
        )  # fmt: skip
    assert run.code == 0, run.lines
    assert run.summary is not None
    drafts, accepted = accepted_by_position(OUTPUT_LEN, RATES)  # each request the same: the run's rates are one's
    assert acceptance_by_position(run.summary) == pytest.approx([count / drafts for count in accepted], abs=1e-4)
    assert run.summary["mean_spec_accept_length"] == pytest.approx(1 + sum(accepted) / drafts)
    assert run.summary["server_spec_acceptance_rate"] == pytest.approx(sum(accepted) / (drafts * len(RATES)))
    assert run.summary["total_output_tokens"] == 4 * OUTPUT_LEN


@pytest.mark.slow
def test_a_step_costs_more_with_more_requests_in_flight_and_more_draft_tokens(tmp_path, capsys):
    """A step costs D + S n (1 + K) ms on the server's own sleeps; what the machine adds only lengthens it, so the
    runs' TPOT is bounded below: at concurrency 1 by the cost at n = 1 (a server that left out the drafted tokens
    would be below it), at concurrency 8 by the cost at n = 4 (one that left out the load would be far below)."""
    delay_ms, per_request_ms = 5, 10
    steps = len(chunk_sizes(OUTPUT_LEN, RATES)) - 1

    def tpot_floor_ms(in_flight: int) -> float:
        return steps * (delay_ms + per_request_ms * in_flight * (1 + len(RATES))) / (OUTPUT_LEN - 1)

    tpot = {}
    with load_server(*speculating(delay_ms, per_request_ms)) as url:
        for concurrency in (1, 8):
            run = restful(
                url, tmp_path / str(concurrency), capsys, "--backend", "vllm",
                "--max-concurrency", str(concurrency), "--no-server-metrics", prompts=8, output_len=OUTPUT_LEN,
            )  # fmt: skip
            assert run.code == 0 and run.summary is not None, run.lines
            tpot[concurrency] = run.summary["mean_tpot_ms"]
    assert tpot[1] >= tpot_floor_ms(1)
    assert tpot[8] >= tpot_floor_ms(4) > 3 * tpot_floor_ms(1)
