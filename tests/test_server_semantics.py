"""What `restful` measures on a server that notes when it did what, next to profile_restful_api.py's definitions.

The scripted server (tests/scripted_server.py) sends, per request: the first token, 32 more chunks one write
each (two of them in one write), then the usage chunk and [DONE] in one last write; it keeps when the request
arrived and when each write began (`scripted_server.SERVED`, on the client's clock). So TTFT runs to the first
token's write, ITL has 32 gaps (the gap between the two events of one write next to nothing), our E2E and TPOT
end at the last text (as vLLM's), LMDeploy's at the last line.

Each time is checked against what the server did, never against its nominal schedule, which a busy machine
delays on both sides (under 8 CPU hogs on 2 cores the server wrote up to 100 ms late, and the client read up to
120 ms after a write). What holds however busy the machine: no byte is read before its write began and the
client stamps its send before the server sees the request, so each of the client's times from its send is at
least the server's time from the arrival to the write of the event the definition names; and the client's
numbers agree with each other exactly where one definition is made of others (E2E = TTFT + the ITL gaps). A
definition that took the wrong event breaks one of the two: one ending too early falls below the server's
time, one ending too late (at the last line instead of the last text) breaks an exact sum.
"""

import csv
import json
import urllib.error
import urllib.request
from types import SimpleNamespace

import numpy as np
import pytest
import scripted_server as scripted
from scripted_server import (  # noqa: F401 (fixture)
    CHUNK_GAP_S,
    PAIRED,
    TEXT_EVENTS,
    assert_never_before_the_server,
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
EXACT = 1e-9  # seconds: two of the client's numbers made of the same timestamps (a different tick is microseconds off)
# The events of one write are read in one network read: their ticks are a parse apart, far closer than any two
# of the server's writes (CHUNK_GAP_S); a tick taken at another read would be a write's gap away.
ONE_READ_S = CHUNK_GAP_S / 2


def restful(url: str, folder, *flags: str) -> SimpleNamespace:
    """One `restful` run of N requests; its per-request table, history row, CSV row, printed box and what the
    server did for each of its requests (`scripted_server.Served`)."""
    scripted.SERVED.clear()
    code = main(restful_argv(url, folder, N, *flags))
    served = list(scripted.SERVED)
    history = History(folder / "results")
    row = history.load().iloc[-1]
    csv_row = None  # a run where no request succeeded writes no row
    if (folder / "out.csv").exists():
        with open(folder / "out.csv", newline="") as f:
            csv_row = list(csv.DictReader(f))[-1]
    return SimpleNamespace(code=code, table=history.requests(row["run_id"]), summary=row, csv=csv_row, served=served)


def text_ticks(table) -> np.ndarray:
    """Per request (rows), when the client ticked each text event (columns), in seconds from its send: its TTFT,
    then its ITL gaps added on."""
    return np.array([ttft + np.concatenate([[0.0], np.cumsum(itl)]) for ttft, itl in table[["ttft_s", "itl_s"]].values])


def server_times(served, written) -> np.ndarray:
    """Per request the server handled, seconds from its arrival to `written(request)` (a write's start)."""
    return np.array([written(request) - request.arrived for request in served])


@pytest.fixture(scope="module")
def timed_run(scripted_server, tmp_path_factory):
    return restful(scripted_server, tmp_path_factory.mktemp("timed"))


@pytest.fixture(scope="module")
def usage_only_run(scripted_server, tmp_path_factory):
    return restful(scripted_server + "/usage-only", tmp_path_factory.mktemp("usage-only"))


def test_ttft_runs_to_the_first_text_and_itl_has_one_gap_per_sse_event(timed_run):
    table = timed_run.table
    assert timed_run.code == 0 and (table["status"] == "success").all() and len(timed_run.served) == N
    for itl in table["itl_s"]:
        assert len(itl) == TEXT_EVENTS - 1  # the two events of one write are two gaps, not one...
        assert 0 <= itl[PAIRED] < ONE_READ_S  # ...the second of them next to nothing
    # Each event's tick (the first: the TTFT) comes after the write that carried it: the TTFT runs to the first
    # token's write (not the response's headers, sent at the arrival), each gap ends at its own event's write.
    text_written = [lambda request, event=event: request.text_written(event) for event in range(TEXT_EVENTS)]
    assert_never_before_the_server(
        text_ticks(table), np.stack([server_times(timed_run.served, written) for written in text_written], axis=1)
    )
    every_gap_ms = np.concatenate(table["itl_s"].to_list()) * 1000
    assert timed_run.summary["mean_itl_ms"] == pytest.approx(every_gap_ms.mean(), rel=EXACT)
    assert float(timed_run.csv["mean_itl_ms"]) == pytest.approx(every_gap_ms.mean(), rel=EXACT)


def test_each_request_records_both_ends_last_text_and_last_line(timed_run):
    table, served = timed_run.table, timed_run.served
    ttft, e2e, last_line = (table[c].to_numpy() for c in ("ttft_s", "e2e_s", "e2e_last_line_s"))
    # ours ends at the last text's tick: the first token's and every gap after it, to the microsecond...
    assert e2e == pytest.approx(text_ticks(table)[:, -1], abs=EXACT)
    assert_never_before_the_server(e2e, server_times(served, lambda request: request.text_written(TEXT_EVENTS - 1)))
    # ...LMDeploy's at the last line, read after it and no earlier than the server wrote it, before the body ended
    assert (last_line > e2e).all()
    assert_never_before_the_server(last_line, server_times(served, lambda request: request.last_line_written))
    assert (last_line < (table["ended_s"] - table["sent_s"]).to_numpy()).all()
    assert table["tpot_s"].to_numpy() == pytest.approx((e2e - ttft) / (TEXT_EVENTS - 1), abs=EXACT)


def tpot_to_last_line_s(table) -> np.ndarray:
    """profile_restful_api.py's TPOT: from the first token to the last line, over the tokens after the first."""
    return (table["e2e_last_line_s"] - table["ttft_s"]).to_numpy() / (table["output_len"].to_numpy() - 1)


def test_our_columns_end_at_the_last_text_and_lmdeploys_at_the_last_line(timed_run):
    summary, row, table = timed_run.summary, timed_run.csv, timed_run.table
    assert summary["mean_e2e_ms"] == pytest.approx(table["e2e_s"].mean() * 1000, rel=EXACT)
    assert summary["mean_tpot_ms"] == pytest.approx(table["tpot_s"].mean() * 1000, rel=EXACT)
    assert summary["mean_e2e_last_line_ms"] == pytest.approx(table["e2e_last_line_s"].mean() * 1000, rel=EXACT)
    assert summary["mean_tpot_last_line_ms"] == pytest.approx(tpot_to_last_line_s(table).mean() * 1000, rel=EXACT)
    assert summary["mean_e2e_last_line_ms"] > summary["mean_e2e_ms"]  # two ends, so the columns below tell them apart
    # profile_restful_api.py's CSV columns hold its definitions
    assert float(row["mean_e2e_latency_ms"]) == pytest.approx(summary["mean_e2e_last_line_ms"], rel=EXACT)
    assert float(row["mean_tpot_ms"]) == pytest.approx(summary["mean_tpot_last_line_ms"], rel=EXACT)
    assert float(row["mean_ttft_ms"]) == pytest.approx(table["ttft_s"].mean() * 1000, rel=EXACT)


def test_the_box_prints_lmdeploys_e2e_and_our_rows_name_their_end(scripted_server, tmp_path, capsys):
    run = restful(scripted_server, tmp_path)
    out = capsys.readouterr().out
    box_e2e = float(out.split("Mean E2E Latency (ms):")[1].split()[0])
    ours_e2e = float(out.split("Mean E2E to last text (ms):")[1].split()[0])
    assert box_e2e == pytest.approx(run.summary["mean_e2e_last_line_ms"], abs=0.01)
    assert ours_e2e == pytest.approx(run.summary["mean_e2e_ms"], abs=0.01)
    assert "Mean TPOT to last text (ms):" in out


def test_the_run_pages_latency_table_shows_both_ends(timed_run):
    summary, requests = timed_run.summary, timed_run.table
    table = percentile_table(summary.to_dict(), (50, 99), stream_output=True)
    assert table.loc["End-to-end latency (ms)", "mean"] == pytest.approx(summary["mean_e2e_ms"], rel=EXACT)
    assert table.loc["E2E to last line (LMDeploy) (ms)", "mean"] == pytest.approx(
        summary["mean_e2e_last_line_ms"], rel=EXACT
    )
    assert table.loc["TPOT to last line (LMDeploy) (ms)", "P50"] == pytest.approx(
        np.percentile(tpot_to_last_line_s(requests), 50) * 1000, rel=EXACT
    )


def test_unstreamed_lmdeploys_tpot_divides_the_whole_latency(scripted_server, tmp_path):
    run = restful(scripted_server, tmp_path, "--disable-stream")
    assert run.summary["completed"] == N
    latency = run.table["e2e_last_line_s"].to_numpy()
    assert_never_before_the_server(latency, server_times(run.served, lambda request: request.last_line_written))
    assert float(run.csv["mean_e2e_latency_ms"]) == pytest.approx(latency.mean() * 1000, rel=EXACT)
    # its completions client never sets a TTFT without a stream: TPOT = latency / (tokens - 1)
    assert float(run.csv["mean_tpot_ms"]) == pytest.approx(float(run.csv["mean_e2e_latency_ms"]) / (TEXT_EVENTS - 1))


def test_a_request_with_usage_but_no_text_counts_its_tokens_and_says_so(usage_only_run):
    table, summary, served = usage_only_run.table, usage_only_run.summary, usage_only_run.served
    assert usage_only_run.code == 0
    assert (summary["completed"], summary["incomplete"], summary["total_output_tokens"]) == (N, 0, N * TEXT_EVENTS)
    assert table["status"].tolist() == ["success"] * N
    assert table["output_len"].tolist() == [TEXT_EVENTS] * N
    assert table["usage_only"].tolist() == [True] * N
    ttft, e2e, last_line = (table[c].to_numpy() for c in ("ttft_s", "e2e_s", "e2e_last_line_s"))
    # the TTFT is the stream's first byte: after the first chunk's write, long before the usage's
    assert_never_before_the_server(ttft, server_times(served, lambda request: request.text_written(0)))
    assert (ttft < e2e).all()
    # no text: both ends are at the usage's tick, when the last line was read
    assert_never_before_the_server(e2e, server_times(served, lambda request: request.last_line_written))
    assert e2e == pytest.approx(last_line, abs=EXACT)
    for first, end, itl in zip(ttft, e2e, table["itl_s"]):  # the one gap the stream shows: its first byte to its usage
        assert itl == pytest.approx([end - first], abs=EXACT)
    assert summary["mean_tpot_last_line_ms"] == pytest.approx(tpot_to_last_line_s(table).mean() * 1000, rel=EXACT)


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
