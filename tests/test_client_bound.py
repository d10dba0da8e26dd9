"""Whether the client kept up (hardware/client_bound.py): the event-loop lag sampled on the HTTP client's loop
(engines/loop_lag.py), the client processes' CPU, and the "client bound" flag a run gets from them, in the CLI's
warnings and the history, on constructed telemetry and on real `restful` runs against the scripted server on
127.0.0.1, once with the client's loop blocked by a callback that sleeps on it, and against a flooding server in
processes of its own (tests/flood_server.py) from two client processes. What the real runs assert is behaviour: the
figures reach the history row from the samples they are made of, a loop the test blocks is flagged, and the CLI
warns exactly when a row is flagged; never that this machine is fast enough for a rate (whether one client process
can hold 125k events/s and two can is a performance target: bench/bench_client_processes.py measures it)."""

from __future__ import annotations

import asyncio
import math
import time

import pandas as pd
import pytest
from flood_server import flooding_server
from own_loop import run_on_own_loop
from scripted_server import restful_argv, scripted_server  # noqa: F401 (fixture)
from test_contention import _config, _requests

from bench_core.cli import main
from bench_core.engines.loop_lag import INTERVAL_S, LoopLag
from bench_core.engines.openai_client import ClientRun
from bench_core.hardware.client_bound import (
    CLIENT_CORES_COLUMN,
    CLIENT_PREFIX,
    LAG_COLUMN,
    LAG_LIMIT_MS,
    SATURATED_COLUMN,
    SATURATED_SHARE,
    SPREAD_ADVICE,
    client_bound,
    client_note,
    client_summary,
)
from bench_core.hardware.run_flags import flag_tags, run_flags
from bench_core.hardware.telemetry import (
    CLIENT_LOOP,
    CLIENT_WORKER,
    CPU_CORES,
    CPU_COUNT,
    LOOP_LAG_S,
    MACHINE,
    PROCESS,
    Sample,
    samples_frame,
    series,
    time_weighted_mean,
    with_loop_lag,
)
from bench_core.measure.catalog import METRICS, telemetry_columns
from bench_core.store.history import History, run_metrics
from bench_core.views.run_charts import telemetry_over_time

STEP_S = 0.1
BLOCK_S = 0.015  # what the blocking callback sleeps on the client's loop for every event it hands on


def _telemetry(
    client_cores: list[float], lags_s: list[float] = (), workers_cores: list[list[float]] = ()
) -> pd.DataFrame:
    """The client's process at `client_cores[i]` over (i-1, i] * STEP_S (its worker processes at
    `workers_cores[w][i]`, where given), and its loop's lateness samples (one per STEP_S) where given."""
    rows = [Sample(0.0, MACHINE, CPU_COUNT, 2.0)]
    rows += [Sample(i * STEP_S, PROCESS, CPU_CORES, cores) for i, cores in enumerate(client_cores)]
    for worker, cores_of in enumerate(workers_cores):
        rows += [Sample(i * STEP_S, CLIENT_WORKER.format(worker), CPU_CORES, c) for i, c in enumerate(cores_of)]
    frame = samples_frame(rows)
    return with_loop_lag(frame, [(i * STEP_S, lag) for i, lag in enumerate(lags_s)])


# ---- the loop-lag sampler on a real event loop -------------------------------------------------


LOOP_BLOCKS = 10
LOOP_BLOCK_S = 0.05  # what each blocking callback holds the loop for


def _lateness(blocking: bool) -> list[tuple[float, float]]:
    async def work():
        await asyncio.sleep(0)  # the sampler's task starts, and sets its first timer, before the first block
        for _ in range(LOOP_BLOCKS):
            if blocking:
                time.sleep(LOOP_BLOCK_S)  # a callback that blocks the loop, as a slow parser or a stray sync call would
            await asyncio.sleep(0.02)

    lag = LoopLag()
    run_on_own_loop(lag.around(work()))  # as the client's loop is
    return lag.samples


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def test_a_blocked_loop_is_seen_late_by_about_as_long_as_it_was_blocked():
    blocked, free = _lateness(blocking=True), _lateness(blocking=False)
    late_blocked, late_free = [late for _, late in blocked], [late for _, late in free]
    print(
        f"\nblocked: mean {1000 * _mean(late_blocked):.1f} ms, max {1000 * max(late_blocked):.1f} ms over "
        f"{len(blocked)} samples; free: mean {1000 * _mean(late_free):.1f} ms, max {1000 * max(late_free):.1f} ms over "
        f"{len(free)} samples"
    )
    # Each block holds back the sampler's timer, due at most one interval after the block began: every block shows as
    # a sample at least the block less one interval late. A busy machine only makes the samples later.
    assert sum(late >= LOOP_BLOCK_S - INTERVAL_S for late in late_blocked) >= LOOP_BLOCKS
    # With at most three samples to a 70 ms round (one after the block, two in the 20 ms between), such a loop is
    # late on average by more than the flag's limit: what the injected blocks make it, however fast the machine.
    assert _mean(late_blocked) >= LAG_LIMIT_MS / 1000
    # The same work without the blocks, measured beside it: the blocks' samples stand at least half a block above the
    # free loop's mean.
    assert _mean(sorted(late_blocked)[-LOOP_BLOCKS:]) - _mean(late_free) >= LOOP_BLOCK_S / 2
    # A sample is how much later than asked the timer woke: never more than the time since the previous sample less
    # the interval asked (a lateness that counted the interval itself would read a free loop as 10 ms late).
    for samples in (blocked, free):
        for (before, _), (woke, late) in zip(samples, samples[1:]):
            assert 0.0 <= late <= max(0.0, woke - before - INTERVAL_S) + 1e-9, (before, woke, late)


# ---- the rule on constructed telemetry ---------------------------------------------------------


def test_a_late_loop_flags_a_server_run_with_its_numbers_and_the_way_to_spread_the_load():
    summary = run_metrics(_config("openai"), _requests(), 5.0, _telemetry([0.3] * 51, [0.025] * 51))
    assert summary[LAG_COLUMN] == pytest.approx(25.0)
    assert summary[METRICS["max_loop_lag_ms"].column()] == pytest.approx(25.0)
    assert summary[CLIENT_CORES_COLUMN] == pytest.approx(0.3) and summary[SATURATED_COLUMN] == 0.0
    assert client_bound(summary)
    note = client_note(summary)
    assert note.startswith(
        f"{CLIENT_PREFIX}: the benchmark's client could not keep up during this run: its event "
        "loop woke 25.0 ms late on average (limit 10 ms)"
    )
    assert note.endswith(f"{SPREAD_ADVICE}.") and "--client-processes N" in note


def test_a_client_at_a_full_core_for_most_of_the_run_is_flagged_however_punctual_its_loop():
    summary = run_metrics(_config("openai"), _requests(), 5.0, _telemetry([0.2] * 11 + [1.0] * 40, [0.001] * 51))
    assert summary[SATURATED_COLUMN] == pytest.approx(0.8) and summary[SATURATED_COLUMN] >= SATURATED_SHARE
    assert client_bound(summary) and "its busiest process used 0.9 cores or more 80% of the time" in client_note(
        summary
    )


def _in_workers(processes: int = 2):
    config = _config("openai")
    config.load.client_processes = processes
    return config


def test_a_worker_at_a_full_core_flags_the_run_and_the_client_cpu_is_all_its_processes_together():
    # This process merges at 0.2 cores; worker 0 is at a full core for the last 80 % of the run, worker 1 idles.
    telemetry = _telemetry([0.2] * 51, [0.001] * 51, [[0.5] * 11 + [1.0] * 40, [0.3] * 51])
    summary = run_metrics(_in_workers(), _requests(), 5.0, telemetry)
    assert summary[SATURATED_COLUMN] == pytest.approx(0.8)
    # The means are the telemetry's (trapezoids): worker 0 climbs from 0.5 to 1.0 over 1.0-1.1 s.
    assert summary[CLIENT_CORES_COLUMN] == pytest.approx(0.2 + 0.3 + (0.5 * 1.0 + 0.75 * 0.1 + 1.0 * 3.9) / 5)
    assert client_bound(summary) and "its busiest process used 0.9 cores or more 80% of the time" in client_note(
        summary
    )


def test_the_merging_process_at_a_full_core_is_the_client_limit_too():
    telemetry = _telemetry([1.0] * 51, [0.001] * 51, [[0.4] * 51, [0.4] * 51])
    assert run_metrics(_in_workers(), _requests(), 5.0, telemetry)[SATURATED_COLUMN] == pytest.approx(1.0)


def test_workers_that_each_had_cpu_to_spare_are_not_flagged_though_they_add_up_to_more_than_a_core():
    telemetry = _telemetry([0.3] * 51, [0.001] * 51, [[0.7] * 51, [0.7] * 51])
    summary = run_metrics(_in_workers(), _requests(), 5.0, telemetry)
    assert summary[CLIENT_CORES_COLUMN] == pytest.approx(1.7) and summary[SATURATED_COLUMN] == 0.0
    assert not client_bound(summary)


def test_a_worker_run_without_its_workers_cpu_makes_no_claim_and_a_one_process_run_ignores_strangers():
    # Recorded before the workers were sampled: this process alone is not the client.
    assert client_summary(_telemetry([1.0] * 51), 0.0, 5.0, in_workers=True) == {
        "mean_client_cpu_cores": None,
        "client_saturated_share": None,
    }
    one_process = client_summary(_telemetry([0.3] * 51, workers_cores=[[1.0] * 51]), 0.0, 5.0)
    assert one_process == {"mean_client_cpu_cores": pytest.approx(0.3), "client_saturated_share": 0.0}


def test_a_client_that_kept_up_is_not_flagged():
    summary = run_metrics(_config("openai"), _requests(), 5.0, _telemetry([0.4] * 51, [0.002] * 51))
    assert summary[LAG_COLUMN] == pytest.approx(2.0) and not client_bound(summary) and client_note(summary) is None
    assert run_flags(summary, "2") == []


def test_an_engine_in_this_process_has_no_client_to_judge():
    summary = run_metrics(_config("transformers"), _requests(), 5.0, _telemetry([1.0] * 51))
    assert CLIENT_CORES_COLUMN not in summary and SATURATED_COLUMN not in summary and LAG_COLUMN not in summary


def test_the_lag_outside_the_measured_window_does_not_count():
    frame = _telemetry([0.3] * 51, [0.5] * 3)  # a stall at 0-0.2 s, before a window that starts at 1 s
    assert client_summary(frame, 1.0, 5.0)["client_saturated_share"] == 0.0
    assert telemetry_columns({"mean_loop_lag_s": None}) == {}
    assert (
        run_metrics(_config("openai"), _requests(), 5.0, frame.assign(time_s=frame["time_s"] - 1.0)).get(LAG_COLUMN)
        is None
    )


def test_history_rows_without_the_columns_read_as_not_flagged_and_flagged_rows_say_both_flags():
    rows = pd.DataFrame(
        {
            "run_id": ["old", "late", "both"],
            "env_cpu_count": ["2", "2", "2"],
            LAG_COLUMN: [math.nan, 30.0, 12.0],
            SATURATED_COLUMN: [math.nan, 0.1, 0.9],
            "machine_busy_share": [math.nan, 0.0, 0.9],
            "other_cpu_cores": [math.nan, 0.0, 1.2],
        }
    )
    assert flag_tags(rows).tolist() == ["", CLIENT_PREFIX, f"machine busy, {CLIENT_PREFIX}"]
    notes = [run_flags(row, row["env_cpu_count"]) for _, row in rows.iterrows()]
    assert notes[0] == []
    assert notes[1][0].startswith(f"{CLIENT_PREFIX}: ") and "30.0 ms late" in notes[1][0]
    assert notes[2][0].startswith("machine busy: other processes used 1.2 of 2 CPU cores")
    assert notes[2][1].startswith(f"{CLIENT_PREFIX}: ")
    assert flag_tags(rows[["run_id"]]).tolist() == ["", "", ""]


def test_the_telemetry_chart_has_a_panel_for_the_loop_lag():
    fig = telemetry_over_time(_telemetry([0.3] * 11, [0.004] * 11))
    titles = [annotation.text for annotation in fig.layout.annotations]
    assert "Client event-loop lag (ms)" in titles
    lag_trace = next(trace for trace in fig.data if trace.legendgroup == CLIENT_LOOP)
    assert max(lag_trace.y) == pytest.approx(4.0)


# ---- real runs: restful against the scripted server --------------------------------------------


def _number(row: pd.Series, column: str) -> float:
    """The row's figure, NaN where it has none (the assertions say what is missing)."""
    return float(row.get(column, math.nan))


def _restful(url: str, folder, capsys, *flags: str) -> tuple[int, pd.Series, str]:
    """One `restful` run of 8 requests: its exit code, history row and stderr (its client's figures printed)."""
    code = main(restful_argv(url, folder, 8, *flags))
    row, err = History(folder / "results").load().iloc[-1], capsys.readouterr().err
    with capsys.disabled():
        print(
            f"\nclient at {' '.join(flags)}: mean loop lag {_number(row, LAG_COLUMN):.2f} ms, max "
            f"{_number(row, 'max_loop_lag_ms'):.1f} ms, CPU {_number(row, CLIENT_CORES_COLUMN):.2f} cores, at a full "
            f"core {_number(row, SATURATED_COLUMN):.0%} of the run"
        )
    return code, row, err


@pytest.fixture
def blocked_client_loop(monkeypatch):
    """Every event the client hands on sleeps BLOCK_S on its event loop first: a client too slow for its load."""
    handed_on = ClientRun._emit

    def slow_emit(self, event):
        time.sleep(BLOCK_S)
        handed_on(self, event)

    monkeypatch.setattr(ClientRun, "_emit", slow_emit)


@pytest.mark.slow  # a CLI run against a real server
def test_a_run_whose_client_cannot_hold_its_rate_is_flagged_client_bound(
    scripted_server, tmp_path, capsys, blocked_client_loop
):
    code, row, err = _restful(scripted_server, tmp_path, capsys, "--request-rate", "40")
    assert code == 0, err
    assert float(row[LAG_COLUMN]) >= LAG_LIMIT_MS and float(row["max_loop_lag_ms"]) >= 1000 * BLOCK_S
    note = client_note(row)
    assert note is not None and f"warning: {note}" in err.splitlines()
    assert flag_tags(row.to_frame().T).iloc[0] == CLIENT_PREFIX


def _warned_exactly_when_flagged(row: pd.Series, err: str) -> None:
    """The CLI's warning says the row's flag, with its numbers, when the row is flagged, and nothing of it when not."""
    note = client_note(row)
    if client_bound(row):
        assert note is not None and f"warning: {note}" in err.splitlines()
    else:
        assert note is None and CLIENT_PREFIX not in err


def _loop_lag_ms(telemetry: pd.DataFrame, duration_s: float) -> list[float]:
    """The client loops' lateness samples inside the run's window, in ms."""
    times, lags = series(telemetry, CLIENT_LOOP, LOOP_LAG_S)
    return [1000 * lag for time_s, lag in zip(times, lags) if 0.0 <= time_s <= duration_s]


@pytest.mark.slow  # a CLI run against a real server
def test_a_modest_run_is_measured_from_its_samples_and_warned_of_exactly_when_its_numbers_flag_it(
    scripted_server, tmp_path, capsys
):
    # Whether it is flagged is this machine's business (a loaded one makes any loop late): not asserted.
    code, row, err = _restful(scripted_server, tmp_path, capsys, "--request-rate", "10")
    assert code == 0, err
    telemetry, duration = History(tmp_path / "results").telemetry(row["run_id"]), float(row["duration_s"])
    lags = _loop_lag_ms(telemetry, duration)
    assert lags and _number(row, LAG_COLUMN) == pytest.approx(sum(lags) / len(lags))
    assert _number(row, "max_loop_lag_ms") == pytest.approx(max(lags))
    client_cores = time_weighted_mean(*series(telemetry, PROCESS, CPU_CORES), 0.0, duration)
    assert _number(row, CLIENT_CORES_COLUMN) == pytest.approx(client_cores) and client_cores > 0.0
    assert 0.0 <= _number(row, SATURATED_COLUMN) <= 1.0
    _warned_exactly_when_flagged(row, err)


def test_the_history_table_shows_the_flag_right_after_the_status():
    from dashboard.history_view import FLAGS_COLUMN, table_view

    rows = pd.DataFrame(
        {
            "run_id": ["late", "calm"],
            "status": ["finished", "finished"],
            "backend": ["openai"] * 2,
            "env_cpu_count": ["2", "2"],
            LAG_COLUMN: [30.0, 1.0],
            SATURATED_COLUMN: [0.0, 0.0],
        }
    )
    view = table_view(rows).set_index("run_id")
    assert list(view.columns).index(FLAGS_COLUMN) == list(view.columns).index("status") + 1
    assert view.loc["late", FLAGS_COLUMN] == CLIENT_PREFIX and view.loc["calm", FLAGS_COLUMN] == ""


# ---- real runs: a flooding server, read from two client processes ---------------------------

FLOOD_RATE = 50  # requests per second ...
FLOOD_TOKENS = 2500  # ... each this many one-token events: 125k events/s asked
FLOOD_PROMPTS = 100  # 2 s of sending
WORKERS = [CLIENT_WORKER.format(0), CLIENT_WORKER.format(1)]


@pytest.mark.slow  # a CLI run of seconds against a server in processes of its own
def test_a_run_from_two_client_processes_records_each_ones_cpu_and_judges_them_together(tmp_path, capsys):
    """Each worker process reads its share of the streams: its CPU is sampled through the run, the client's CPU is
    this process's (it merges) and the workers' together, their loops' lateness comes back with their events, and
    the CLI warns of the client exactly when those numbers flag the run. Whether they flag it is this machine's speed
    and load (docs/performance.md): bench/bench_client_processes.py measures one process against two side by side."""
    flags = ["--request-rate", str(FLOOD_RATE), "--client-processes", "2"]
    with flooding_server() as (url, _):
        code = main(restful_argv(url, tmp_path, FLOOD_PROMPTS, *flags, output_len=FLOOD_TOKENS))
    history = History(tmp_path / "results")
    row, err = history.load().iloc[-1], capsys.readouterr().err
    assert code == 0, err
    telemetry, duration = history.telemetry(row["run_id"]), float(row["duration_s"])
    cores = {
        source: time_weighted_mean(*series(telemetry, source, CPU_CORES), 0.0, duration)
        for source in [PROCESS, *WORKERS]
    }
    with capsys.disabled():
        print(
            f"\n2 client processes at {FLOOD_RATE * FLOOD_TOKENS:,} events/s asked: "
            f"{float(row['output_throughput']):,.0f} tokens/s, mean loop lag {_number(row, LAG_COLUMN):.1f} ms, "
            f"busiest process at a full core {_number(row, SATURATED_COLUMN):.0%} of the run, CPU cores by process "
            + ", ".join(f"{source} {value or math.nan:.2f}" for source, value in cores.items())
        )
    assert all(cores[worker] is not None and cores[worker] > 0.0 for worker in WORKERS), cores
    assert _number(row, CLIENT_CORES_COLUMN) == pytest.approx(sum(cores.values()))
    lags = _loop_lag_ms(telemetry, duration)
    assert lags and _number(row, LAG_COLUMN) == pytest.approx(sum(lags) / len(lags))
    assert 0.0 <= _number(row, SATURATED_COLUMN) <= 1.0
    _warned_exactly_when_flagged(row, err)


def test_a_running_server_run_is_judged_for_its_client_on_its_last_minute_and_an_engine_here_is_not():
    from bench_core.hardware.run_flags import live_run_flags

    late = _telemetry([1.0] * 51, [0.02] * 51)
    (note,) = live_run_flags(late, in_process=False, in_workers=False)
    assert note.startswith(f"{CLIENT_PREFIX}: the benchmark's client could not keep up during the last minute: its ")
    assert "woke 20.0 ms late" in note and "used 0.9 cores or more 100% of the time" in note
    assert live_run_flags(late, in_process=True, in_workers=False) == []  # no machine CPU: not judged busy either
    assert live_run_flags(_telemetry([0.3] * 51, [0.001] * 51), in_process=False, in_workers=False) == []
    assert live_run_flags(None, in_process=False, in_workers=True) == []
