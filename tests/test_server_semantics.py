"""What `restful` measures on a server with exact, known timings, next to profile_restful_api.py's definitions.

The scripted server (tests/scripted_server.py) sends, per request: the first token at 200 ms, 32 more
chunks 20 ms apart (two of them in one write) up to 840 ms, then the usage chunk and [DONE] at 890 ms.
So TTFT is 200 ms, ITL 32 gaps of mean 20 ms (one of them near zero), TPOT 20 ms and E2E 840 ms to the
last text (ours, vLLM's); LMDeploy's script ends at the last line: E2E 890 ms, TPOT 690 / 32 ms.
"""

import csv
import json
import urllib.error
import urllib.request
from types import SimpleNamespace

import numpy as np
import pytest
from scripted_server import (  # noqa: F401 (fixture)
    CHUNK_GAP_S,
    FIRST_TOKEN_S,
    LAST_LINE_S,
    LAST_TEXT_S,
    TEXT_EVENTS,
    USAGE_AFTER_S,
    restful_argv,
    scripted_server,
)

from bench_core.cli import main
from bench_core.config import DatasetConfig
from bench_core.engines.openai_request import ServerSpec, build_payload
from bench_core.load.arrivals import send_offsets
from bench_core.load.datasets import sample_requests
from bench_core.store.history import History
from bench_core.views.tables import percentile_table

# Each test here runs a real engine, server, app script or process for seconds: not in the fast suite.
pytestmark = pytest.mark.slow

N = 4
CLOCK_S = 0.025  # sending to the server's clock start, plus scheduling on a busy 2-core machine
JITTER_S = 0.010  # between two writes of one stream, both on the server's clock
GAP_S = 0.001  # a mean over 32 gaps, or the gap between two events of one write
TPOT_LAST_LINE_S = (LAST_LINE_S - FIRST_TOKEN_S) / (TEXT_EVENTS - 1)


def restful(url: str, folder, *flags: str) -> SimpleNamespace:
    """One `restful` run of N requests; its per-request table, history row, CSV row and printed box."""
    code = main(restful_argv(url, folder, N, *flags))
    history = History(folder / "results")
    row = history.load().iloc[-1]
    csv_row = None  # a run where no request succeeded writes no row
    if (folder / "out.csv").exists():
        with open(folder / "out.csv", newline="") as f:
            csv_row = list(csv.DictReader(f))[-1]
    return SimpleNamespace(code=code, table=history.requests(row["run_id"]), summary=row, csv=csv_row)


@pytest.fixture(scope="module")
def timed_run(scripted_server, tmp_path_factory):
    return restful(scripted_server, tmp_path_factory.mktemp("timed"))


@pytest.fixture(scope="module")
def usage_only_run(scripted_server, tmp_path_factory):
    return restful(scripted_server + "/usage-only", tmp_path_factory.mktemp("usage-only"))


def test_ttft_runs_to_the_first_text_and_itl_has_one_gap_per_sse_event(timed_run):
    table = timed_run.table
    assert timed_run.code == 0 and (table["status"] == "success").all()
    assert table["ttft_s"].to_numpy() == pytest.approx(FIRST_TOKEN_S, abs=CLOCK_S)
    for itl in table["itl_s"]:
        assert len(itl) == TEXT_EVENTS - 1  # the two events of one write are two gaps, not one
        assert np.sort(itl)[0] < GAP_S  # ...the second of them next to nothing
        assert np.mean(itl) == pytest.approx(CHUNK_GAP_S, abs=GAP_S)
    assert timed_run.summary["mean_itl_ms"] == pytest.approx(CHUNK_GAP_S * 1000, abs=GAP_S * 1000)
    assert float(timed_run.csv["mean_itl_ms"]) == pytest.approx(CHUNK_GAP_S * 1000, abs=GAP_S * 1000)


def test_each_request_records_both_ends_last_text_and_last_line(timed_run):
    table = timed_run.table
    assert table["e2e_s"].to_numpy() == pytest.approx(LAST_TEXT_S, abs=CLOCK_S)
    assert table["e2e_last_line_s"].to_numpy() == pytest.approx(LAST_LINE_S, abs=CLOCK_S)
    assert (table["e2e_last_line_s"] - table["e2e_s"]).to_numpy() == pytest.approx(USAGE_AFTER_S, abs=JITTER_S)
    assert table["tpot_s"].to_numpy() == pytest.approx(CHUNK_GAP_S, abs=GAP_S)


def test_our_columns_end_at_the_last_text_and_lmdeploys_at_the_last_line(timed_run):
    summary, row = timed_run.summary, timed_run.csv
    assert summary["mean_e2e_ms"] == pytest.approx(LAST_TEXT_S * 1000, abs=CLOCK_S * 1000)
    assert summary["mean_tpot_ms"] == pytest.approx(CHUNK_GAP_S * 1000, abs=GAP_S * 1000)
    assert summary["mean_e2e_last_line_ms"] == pytest.approx(LAST_LINE_S * 1000, abs=CLOCK_S * 1000)
    assert summary["mean_tpot_last_line_ms"] == pytest.approx(TPOT_LAST_LINE_S * 1000, abs=GAP_S * 1000)
    # profile_restful_api.py's CSV columns hold its definitions
    assert float(row["mean_e2e_latency_ms"]) == pytest.approx(summary["mean_e2e_last_line_ms"])
    assert float(row["mean_tpot_ms"]) == pytest.approx(summary["mean_tpot_last_line_ms"])
    assert float(row["mean_ttft_ms"]) == pytest.approx(FIRST_TOKEN_S * 1000, abs=CLOCK_S * 1000)


def test_the_box_prints_lmdeploys_e2e_and_our_rows_name_their_end(scripted_server, tmp_path, capsys):
    run = restful(scripted_server, tmp_path)
    out = capsys.readouterr().out
    box_e2e = float(out.split("Mean E2E Latency (ms):")[1].split()[0])
    ours_e2e = float(out.split("Mean E2E to last text (ms):")[1].split()[0])
    assert box_e2e == pytest.approx(run.summary["mean_e2e_last_line_ms"], abs=0.01)
    assert ours_e2e == pytest.approx(run.summary["mean_e2e_ms"], abs=0.01)
    assert "Mean TPOT to last text (ms):" in out


def test_the_run_pages_latency_table_shows_both_ends(timed_run):
    table = percentile_table(timed_run.summary.to_dict(), (50, 99), stream_output=True)
    assert table.loc["End-to-end latency (ms)", "mean"] == pytest.approx(LAST_TEXT_S * 1000, abs=CLOCK_S * 1000)
    assert table.loc["E2E to last line (LMDeploy) (ms)", "mean"] == pytest.approx(
        LAST_LINE_S * 1000, abs=CLOCK_S * 1000
    )
    assert table.loc["TPOT to last line (LMDeploy) (ms)", "P50"] == pytest.approx(
        TPOT_LAST_LINE_S * 1000, abs=GAP_S * 1000
    )


def test_unstreamed_lmdeploys_tpot_divides_the_whole_latency(scripted_server, tmp_path):
    run = restful(scripted_server, tmp_path, "--disable-stream")
    assert run.summary["completed"] == N
    # its completions client never sets a TTFT without a stream: TPOT = latency / (tokens - 1)
    assert float(run.csv["mean_e2e_latency_ms"]) == pytest.approx(LAST_LINE_S * 1000, abs=CLOCK_S * 1000)
    assert float(run.csv["mean_tpot_ms"]) == pytest.approx(float(run.csv["mean_e2e_latency_ms"]) / (TEXT_EVENTS - 1))


def test_a_request_with_usage_but_no_text_counts_its_tokens_and_says_so(usage_only_run):
    table, summary = usage_only_run.table, usage_only_run.summary
    assert usage_only_run.code == 0
    assert (summary["completed"], summary["incomplete"], summary["total_output_tokens"]) == (N, 0, N * TEXT_EVENTS)
    assert table["status"].tolist() == ["success"] * N
    assert table["output_len"].tolist() == [TEXT_EVENTS] * N
    assert table["usage_only"].tolist() == [True] * N
    assert table["ttft_s"].to_numpy() == pytest.approx(FIRST_TOKEN_S, abs=CLOCK_S)  # the stream's first byte
    assert table["e2e_s"].to_numpy() == pytest.approx(LAST_LINE_S, abs=CLOCK_S)  # no text: both end at the usage
    assert table["e2e_last_line_s"].to_numpy() == pytest.approx(LAST_LINE_S, abs=CLOCK_S)
    for itl in table["itl_s"]:  # the one gap the stream shows: its first byte to its usage
        assert itl == pytest.approx([LAST_LINE_S - FIRST_TOKEN_S], abs=JITTER_S)
    assert summary["mean_tpot_last_line_ms"] == pytest.approx(TPOT_LAST_LINE_S * 1000, abs=GAP_S * 1000)


def test_a_server_that_refuses_ignore_eos_is_benchmarked_in_full(scripted_server, timed_run):
    # LMDeploy's script always sends ignore_eos; a server such as transformers serve answers 422 to it...
    lmdeploy_payload = build_payload(
        ServerSpec(scripted_server, server_kind="lmdeploy"), "scripted", "hi", 8, ignore_eos=True
    )
    request = urllib.request.Request(
        scripted_server + "/v1/completions",
        data=json.dumps(lmdeploy_payload).encode(),
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 422
    # ...while the transformers backend sends what it takes, and every request comes back as long as asked.
    assert (timed_run.code, timed_run.summary["completed"], timed_run.summary["length_mismatches"]) == (0, N, 0)


def lmdeploy_send_times(seed: int, n: int, rate: float, random_lens: list[tuple[int, float]] = ()) -> np.ndarray:
    """profile_restful_api.py's schedule, from its semantics: main() seeds numpy's global legacy generator
    with --seed; sampling the random dataset then draws its input and output lengths from it (randint,
    low max(int(len * ratio), 1), size n), ShareGPT draws only from `random`; get_request yields a
    request, then sleeps np.random.exponential(1 / rate) before yielding the next."""
    generator = np.random.RandomState(seed)  # the generator np.random.seed(seed) sets up
    for full_len, ratio in random_lens:
        generator.randint(max(int(full_len * ratio), 1), full_len + 1, size=n)
    times, t = [], 0.0
    for _ in range(n):
        times.append(t)
        t += generator.exponential(1.0 / rate)
    return np.array(times)


def test_the_reference_draw_took_lmdeploys_measured_time():
    assert lmdeploy_send_times(1, 64, 1.0)[-1] == pytest.approx(54.2, abs=0.05)  # its 63 gaps at rate 1, seed 1


@pytest.mark.parametrize("seed", [0, 1, 7, 2024])
def test_the_default_schedule_is_lmdeploys_draw_for_the_same_seed(tiny_tokenizer, seed):
    sharegpt = sample_requests(DatasetConfig("builtin:sample", "sharegpt", num_prompts=64, seed=seed), tiny_tokenizer)
    random_lengths = sample_requests(
        DatasetConfig(
            "builtin:sample",
            "random",
            num_prompts=64,
            seed=seed,
            random_input_len=32,
            random_output_len=16,
            random_range_ratio=0.5,
        ),
        tiny_tokenizer,
    )
    for sample, lens, rate in ((sharegpt, (), 1.0), (random_lengths, [(32, 0.5), (16, 0.5)], 8.0)):
        n = len(sample.requests)
        np.testing.assert_array_equal(
            send_offsets(n, rate, 1.0, sample.arrival_rng), lmdeploy_send_times(seed, n, rate, lens)
        )
        assert send_offsets(n, rate, 1.0, sample.arrival_rng)[-1] == send_offsets(n, rate, 1.0, sample.arrival_rng)[-1]


@pytest.mark.parametrize("seed", [1, 7])
def test_a_rate_sends_on_lmdeploys_schedule_for_the_same_seed(scripted_server, tmp_path, seed):
    run = restful(scripted_server, tmp_path, "--request-rate", "40", "--seed", str(seed))
    np.testing.assert_allclose(run.table["scheduled_s"], lmdeploy_send_times(seed, N, 40.0), rtol=0, atol=1e-12)
    assert run.summary["achieved_rate"] > 0  # the report keeps showing the rate achieved next to the one asked


def test_exact_rate_arrivals_rescale_the_draw_to_the_requested_rate(scripted_server, tmp_path):
    run = restful(scripted_server, tmp_path, "--request-rate", "40", "--seed", "1", "--exact-rate-arrivals")
    scheduled = run.table["scheduled_s"].to_numpy()
    assert scheduled[-1] == pytest.approx((N - 1) / 40.0)
    drawn = lmdeploy_send_times(1, N, 40.0)
    np.testing.assert_allclose(scheduled, drawn * (N - 1) / 40.0 / drawn[-1])
