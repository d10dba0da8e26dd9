"""The steady-state window and the time slices (measure/window.py): the pure functions on request tables whose every
tick is placed by the test, then a replayed trace against a scripted server whose TTFT follows its load."""

from __future__ import annotations

import asyncio
import json
import math

import numpy as np
import pandas as pd
import pytest
from aiohttp import web
from openai_server import add_openai_routes, serving
from restful_cli import restful
from scripted_server import NEVER_THAT_LATE_S  # a busy machine's lag is no unit slip

from bench_core.measure import metrics
from bench_core.measure.window import (
    MAX_TIME_SLICES,
    SteadyLoad,
    Window,
    request_times,
    steady_window,
    time_slices,
    window_facts,
)
from bench_core.states import RequestStatus
from bench_core.views import report, run_charts

TOKENS = 10  # each scripted request's output: its first token at its TTFT, then one every GAP_S
GAP_S = 0.1


def request_table(sends: list[float], ttfts: list[float], sent_column: bool = True) -> pd.DataFrame:
    """Completed streamed requests, each sent at its time and answering TOKENS tokens: the first after its TTFT,
    the rest GAP_S apart; as Profiler.request_table lays them out (with a client's sent_s/ended_s, or without)."""
    sends_a, ttft = np.asarray(sends, dtype=float), np.asarray(ttfts, dtype=float)
    e2e = ttft + (TOKENS - 1) * GAP_S
    n = len(sends)
    table = pd.DataFrame(
        {
            "input_len": [100] * n,
            "req_output_len": [TOKENS] * n,
            "output_len": [TOKENS] * n,
            "status": [RequestStatus.SUCCESS] * n,
            "reason": [""] * n,
            "ttft_s": ttft,
            "tpot_s": (e2e - ttft) / (TOKENS - 1),
            "e2e_s": e2e,
            "itl_s": pd.Series([np.full(TOKENS - 1, GAP_S) for _ in range(n)], dtype=object),
            "tokens_per_tick": pd.Series([np.ones(TOKENS, dtype=np.int64) for _ in range(n)], dtype=object),
            "n_ticks": [TOKENS + 1] * n,
            "start_s": sends_a,
            "finish_s": sends_a + e2e,
        }
    )
    if sent_column:
        table["scheduled_s"], table["sent_s"], table["ended_s"] = sends_a, sends_a, sends_a + e2e
    return table


# A trace whose first and last 5 s are sparse (a request every 2.5 s, alone) and whose middle 5 s are dense (one
# every 0.25 s, each waiting 0.5 s for its first token as a loaded server makes it): the schedule of the end-to-end
# test below.
SPARSE_HEAD = [0.0, 2.5]
DENSE = [5.1 + 0.25 * k for k in range(20)]
SPARSE_TAIL = [12.5, 16.0]
ALONE_TTFT, LOADED_TTFT = 0.05, 0.5


def trace_table() -> pd.DataFrame:
    ttfts = [ALONE_TTFT] * 2 + [ALONE_TTFT] + [LOADED_TTFT] * 19 + [ALONE_TTFT] * 2
    return request_table(SPARSE_HEAD + DENSE + SPARSE_TAIL, ttfts)


def test_a_closed_loop_window_runs_from_the_concurrency_reached_to_the_first_end_after_the_last_send():
    # 2 workers: sends at 0 and 1, then each next at an end (every request lasts 1.5 s here).
    sends = [0.0, 1.0, 1.5, 2.5, 3.0, 4.0]
    table = request_table(sends, [0.6] * 6)  # e2e 0.6 + 0.9 = 1.5
    window = steady_window(table["sent_s"].to_numpy(), table["ended_s"].to_numpy(), 5.5, SteadyLoad(2))
    assert window == Window(1.0, 4.5)  # 2 in flight from the second send; the request sent at 3.0 ends at 4.5


def test_a_batch_window_ends_when_its_queue_has_emptied():
    # Every request sent at 0 (ticked at t0, as LMDeploy's batch), 2 served at a time, each for 1.5 s: the queued
    # ones take a slot at 1.5, 1.6, 3.0 and 3.1, the last two run to 4.5 and 4.6.
    ends = np.array([1.5, 1.6, 3.0, 3.1, 4.5, 4.6])
    window = steady_window(np.zeros(6), ends, 4.6, SteadyLoad(2))
    assert window == Window(0.0, 4.5)  # 2 served until the first end once the queue has emptied


def test_an_open_loop_window_starts_at_its_mean_in_flight_and_ends_at_its_last_send():
    table = trace_table()
    window = steady_window(table["sent_s"].to_numpy(), table["ended_s"].to_numpy(), 17.0, SteadyLoad(None))
    # Alone a request is 1 in flight; the dense phase keeps 2 to 6 in flight, so the mean (1.96) is first reached by
    # the dense phase's second send. No arrival comes after the last send: the window ends there.
    assert window == Window(pytest.approx(DENSE[1]), SPARSE_TAIL[-1])


def test_the_users_warmup_and_cooldown_place_the_window_and_what_falls_in_it_is_counted():
    table = trace_table()
    duration = 16.0 + ALONE_TTFT + (TOKENS - 1) * GAP_S  # the last answer's end
    load = SteadyLoad(None, warmup_s=5.0, cooldown_s=5.0)
    window = steady_window(table["sent_s"].to_numpy(), table["ended_s"].to_numpy(), duration, load)
    assert window == Window(5.0, pytest.approx(duration - 5.0))
    facts = window_facts(request_times(table), window, stream_output=True)
    assert facts.sent == 20 and facts.ended == 20  # the dense phase, all of it: its last token at 11.15 < 11.95
    assert facts.output_tokens == 20 * TOKENS
    assert facts.ttft_s.mean() == pytest.approx((ALONE_TTFT + 19 * LOADED_TTFT) / 20)


def test_the_summary_keeps_the_whole_runs_figures_and_puts_the_windows_beside_them():
    table = trace_table()
    duration = 16.0 + ALONE_TTFT + (TOKENS - 1) * GAP_S
    whole = metrics.run_summary(table, duration, [50, 99], True)
    load = SteadyLoad(None, warmup_s=5.0, cooldown_s=5.0, slice_s=5.0)
    both = metrics.run_summary(table, duration, [50, 99], True, steady=load)
    assert {key: both[key] for key in whole} == whole  # nothing of the whole run's changes
    assert both["output_throughput"] == pytest.approx(24 * TOKENS / duration)
    assert both["steady_output_throughput"] == pytest.approx(20 * TOKENS / (duration - 10.0))
    assert both["steady_request_throughput"] == pytest.approx(20 / (duration - 10.0))
    assert both["mean_ttft_ms"] == pytest.approx((5 * ALONE_TTFT + 19 * LOADED_TTFT) / 24 * 1000)
    assert both["steady_mean_ttft_ms"] == pytest.approx((ALONE_TTFT + 19 * LOADED_TTFT) / 20 * 1000)
    assert both["steady_requests"] == 20
    assert both["steady_window_start_s"] == 5.0
    # Slices of 5 s: 2 sent alone; the 20 dense ones; none; 2 alone (the last one 1.95 s long).
    slices = both["time_slices"].split("; ")
    assert [part.split(":")[0] for part in slices] == ["0-5 s", "5-10 s", "10-15 s", "15-16.95 s"]
    assert slices[0].startswith("0-5 s: 2 sent, 4.0 tok/s, TTFT 50 ms")
    assert slices[2].startswith("10-15 s: 1 sent")


def test_slices_share_no_instant_and_the_last_one_keeps_the_runs_end():
    table = request_table([0.0, 1.0, 2.0], [0.5, 0.5, 0.5])  # every request 1.4 s
    slices = time_slices(request_times(table), 3.4, 1.0, stream_output=True)
    assert [part.sent for part in slices] == [1, 1, 1, 0]  # the request sent at 1.0 is the second slice's only
    # Ticks at send + 0.5, + 0.6, ... + 1.4: the last request's at 2.5 ... 3.4, the run's end, in the last slice.
    assert [part.output_tokens for part in slices] == [5, 10, 10, 5]
    assert [part.mean_ttft_s for part in slices][:3] == [0.5, 0.5, 0.5] and math.isnan(slices[3].mean_ttft_s)
    assert slices[-1].window == Window(3.0, pytest.approx(3.4))


def test_a_run_cut_into_more_slices_than_are_kept_says_so():
    table = request_table([0.0], [0.5])
    summary = metrics.run_summary(table, 1.4, [50], True, steady=SteadyLoad(1, slice_s=1.4 / (MAX_TIME_SLICES + 1)))
    parts = summary["time_slices"].split("; ")
    assert len(parts) == MAX_TIME_SLICES + 1 and parts[-1] == f"the first 1,000 of {MAX_TIME_SLICES + 1:,} slices"


def test_a_table_without_a_clients_send_times_uses_the_first_and_last_ticks():
    table = request_table([0.0, 1.0, 1.5, 2.5, 3.0, 4.0], [0.6] * 6, sent_column=False)
    facts = metrics.run_summary(table, 5.5, [50], True, steady=SteadyLoad(2))
    assert (facts["steady_window_start_s"], facts["steady_window_end_s"]) == (1.0, 4.5)


def test_a_run_without_a_window_reports_none_and_an_unstreamed_one_no_ttft():
    table = request_table([0.0], [0.5])
    summary = metrics.run_summary(table, 1.4, [50], False, steady=SteadyLoad(None, warmup_s=2.0))
    assert "steady_output_throughput" not in summary  # a warm-up past the run's end leaves no window
    summary = metrics.run_summary(table, 1.4, [50], False, steady=SteadyLoad(1))
    assert math.isnan(summary["steady_mean_ttft_ms"]) and summary["steady_mean_e2e_ms"] == pytest.approx(1400)


# ---- a replayed trace against a server whose TTFT follows its load ---------------------------------------------


def loaded_server(chosen: list[float]) -> web.Application:
    """A completions server that answers TOKENS tokens GAP_S apart, its first after ALONE_TTFT when no other request
    is in flight when one arrives, else after LOADED_TTFT (a busy engine queues the newcomer's prefill). `chosen`
    gets the TTFT it took for each request, in the order they arrived."""
    in_flight = 0

    async def answer(request: web.Request, endpoint: str) -> web.StreamResponse:
        nonlocal in_flight
        await request.json()
        ttft = ALONE_TTFT if in_flight == 0 else LOADED_TTFT
        chosen.append(ttft)
        in_flight += 1
        try:
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            await asyncio.sleep(ttft)
            for i in range(TOKENS):
                if i:
                    await asyncio.sleep(GAP_S)
                choice = {"index": 0, "text": " tok", "finish_reason": None if i < TOKENS - 1 else "length"}
                usage = {"prompt_tokens": 16, "completion_tokens": TOKENS, "total_tokens": TOKENS + 16}
                body = {"choices": [choice]} | ({"usage": usage} if i == TOKENS - 1 else {})
                await response.write(b"data: " + json.dumps(body).encode() + b"\n\n")
            await response.write(b"data: [DONE]\n\n")
            return response
        finally:
            in_flight -= 1

    return add_openai_routes(web.Application(), answer)


@pytest.mark.slow
def test_a_trace_sparse_at_both_ends_has_a_steady_window_of_its_dense_middle(tmp_path, capsys):
    sends = SPARSE_HEAD + DENSE + SPARSE_TAIL
    records = [
        {"timestamp": round(t * 1000), "input_length": 16, "output_length": TOKENS, "hash_ids": [n]}
        for n, t in enumerate(sends)
    ]
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps(record) + "\n" for record in records))
    chosen: list[float] = []
    with serving(loaded_server(chosen)) as url:
        run = restful(
            url,
            tmp_path,
            capsys,
            "--model",
            "loaded",
            "--dataset-name",
            "trace",
            "--dataset-path",
            str(trace),
            "--trace-block-len",
            "8",
            "--warmup-seconds",
            "5",
            "--cooldown-seconds",
            "5",
            "--time-slice",
            "5",
            prompts=len(sends),
            output_len=None,
        )
    assert run.code == 0, run.lines
    row = run.summary
    assert row["completed"] == 24 and row["steady_requests"] == 20  # the dense middle, sent from 5.1 s to 9.85 s
    # What the schedule implies: the run lasts until the last request's last token, 16 + 0.95 s (later on a busy
    # machine, by a lag, not seconds); the window is 5 s in and 5 s before that; every token of the dense middle
    # falls in it (its last at 9.85 + 1.4 s) and none of the sparse ends' (the first tail request's first at 12.55 s).
    # Those margins are most of a second; the throughputs are over the run's measured duration, not the nominal one.
    nominal = SPARSE_TAIL[-1] + ALONE_TTFT + (TOKENS - 1) * GAP_S
    duration = float(row["duration_s"])
    assert nominal <= duration < nominal + NEVER_THAT_LATE_S
    assert row["output_throughput"] == pytest.approx(24 * TOKENS / duration)
    assert row["steady_output_throughput"] == pytest.approx(20 * TOKENS / (duration - 10))
    assert row["steady_request_throughput"] == pytest.approx(20 / (duration - 10))
    # Alone a request's first token comes after 50 ms, with company after 500 ms: only the dense middle's first
    # request came alone. No first token is read before the server's wait for it ended; the steady mean is the
    # dense middle's own, the whole run's has the sparse ends' faster first tokens in it.
    assert chosen == [ALONE_TTFT] * 3 + [LOADED_TTFT] * 19 + [ALONE_TTFT] * 2
    ttft = run.table.sort_values("sent_s")["ttft_s"].to_numpy()
    assert ((ttft >= chosen) & (ttft < np.array(chosen) + NEVER_THAT_LATE_S)).all(), ttft - chosen
    assert row["mean_ttft_ms"] == pytest.approx(ttft.mean() * 1000)
    assert row["steady_mean_ttft_ms"] == pytest.approx(ttft[2:22].mean() * 1000)
    assert "Mean TTFT (steady window) (ms):" in run.out and "Output throughput (steady window) (tok/s):" in run.out
    slices = row["time_slices"].split("; ")
    assert [part.split(" sent")[0] for part in slices[:3]] == ["0-5 s: 2", "5-10 s: 20", "10-15 s: 1"]
    assert "Time slices:\n  0-5 s: 2 sent" in run.out


def test_the_throughput_chart_shades_the_steady_window_the_summary_holds():
    table = trace_table()
    duration = 16.0 + ALONE_TTFT + (TOKENS - 1) * GAP_S
    summary = metrics.run_summary(table, duration, [50], True, steady=SteadyLoad(None))
    span = run_charts.steady_span(summary)
    assert span == pytest.approx((DENSE[1], SPARSE_TAIL[-1]))
    time_s = np.arange(0.0, duration, 0.5)
    fig = run_charts.throughput_over_time(time_s, np.ones(time_s.size), np.ones(time_s.size), span)
    (shade,) = fig.layout.shapes
    assert (shade.type, shade.x0, shade.x1) == ("rect", span[0], span[1])
    assert fig.layout.annotations[-1].text == "steady window"
    assert run_charts.steady_span(metrics.run_summary(table, duration, [50], True)) is None  # no window asked for
    assert not run_charts.throughput_over_time(time_s, np.ones(time_s.size), np.ones(time_s.size)).layout.shapes


def test_historys_comparison_puts_the_steady_windows_figures_beside_the_whole_runs():
    runs = pd.DataFrame(
        {
            "run_id": ["a", "b"],
            "started_at": ["2026-12-05T03:00:00", "2026-12-05T03:01:00"],
            "concurrency": [4, 8],
            "output_throughput": [10.0, 12.0],
            "steady_output_throughput": [15.0, 20.0],
            "steady_mean_ttft_ms": [100.0, 150.0],
        }
    )
    table, _, _ = report.comparison_table(runs, ["concurrency"])
    rows = list(table.index)
    assert rows.index("Output throughput (steady window) (tok/s)") == rows.index("Output throughput (tok/s)") + 1
    assert table.loc["Mean TTFT (steady window) (ms)", "b"] == "150 (+50.0 %)"
