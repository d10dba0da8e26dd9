"""The "machine busy" rule (hardware/contention.py) on constructed telemetry tables, its columns in the history row,
and the sweep results that carry it to the charts."""

from __future__ import annotations

import math
from os import cpu_count as os_cpu_count

import pandas as pd
import pytest

from bench_core.config import DatasetConfig, EngineConfig, LoadConfig, RunConfig
from bench_core.hardware.client_bound import CLIENT_BOUND_RUNS, LAG_COLUMN
from bench_core.hardware.contention import (
    BUSY_PREFIX,
    BUSY_RUNS,
    BUSY_SHARE_COLUMN,
    OTHER_CORES_COLUMN,
    busy_note,
    busy_runs,
    contention_summary,
    machine_busy,
)
from bench_core.hardware.run_flags import flag_tags
from bench_core.hardware.telemetry import (
    CALLER,
    CPU_CORES,
    CPU_COUNT,
    CPU_PERCENT,
    MACHINE,
    PROCESS,
    Sample,
    samples_frame,
)
from bench_core.measure.catalog import telemetry_columns
from bench_core.store.history import run_metrics
from bench_core.views.tables import describe_column, quantity_table

STEP_S = 0.1


def telemetry(machine_percent, engine_cores, cores: int = 2, caller_cores=None) -> pd.DataFrame:
    """Samples every STEP_S from 0: the machine's busy percent and the engine's cores per interval (a list each, the
    engine's first sample having no interval behind it, as the sampler's), the core count first."""
    rows = [Sample(0.0, MACHINE, CPU_COUNT, float(cores))] if cores else []
    for i, percent in enumerate(machine_percent):
        t = i * STEP_S
        rows.append(Sample(t, MACHINE, CPU_PERCENT, percent))
        if i:
            rows.append(Sample(t, PROCESS, CPU_CORES, engine_cores[i]))
            if caller_cores is not None:
                rows.append(Sample(t, CALLER, CPU_CORES, caller_cores[i]))
    return samples_frame(rows)


def test_an_engine_starved_by_other_processes_is_flagged_with_their_numbers():
    # The case: the machine at 100% of 2 cores, the engine with 0.24 of them.
    frame = telemetry([100.0] * 51, [0.24] * 51)
    summary = contention_summary(frame, 0.0, 5.0)
    assert summary["mean_other_cpu_cores"] == pytest.approx(1.76)
    assert summary["machine_busy_share"] == pytest.approx(1.0)
    columns = telemetry_columns(summary)
    assert machine_busy(columns[BUSY_SHARE_COLUMN])
    assert busy_note(columns, "2") == (
        "machine busy: other processes used 1.8 of 2 CPU cores during this run and "
        "saturated the machine 100% of the time: its numbers are not the engine's "
        "alone."
    )


def test_an_engine_busy_on_its_own_machine_is_not_flagged():
    frame = telemetry([100.0] * 51, [1.97] * 51)
    summary = contention_summary(frame, 0.0, 5.0)
    assert summary["mean_other_cpu_cores"] == pytest.approx(0.03)
    assert summary["machine_busy_share"] == 0.0
    assert busy_note(telemetry_columns(summary), "2") is None


def test_the_dashboard_following_its_engine_worker_counts_as_ours_not_as_another_process():
    frame = telemetry([100.0] * 51, [1.2] * 51, caller_cores=[0.75] * 51)
    summary = contention_summary(frame, 0.0, 5.0)
    assert summary["mean_other_cpu_cores"] == pytest.approx(0.05)
    assert not machine_busy(summary["machine_busy_share"])


def test_the_share_is_of_the_run_s_time_inside_its_window():
    # A hog for the first 2 of 10 s: a fifth of the run, below the flag; the window of its last 4 s sees none.
    percent = [100.0 if i <= 20 else 40.0 for i in range(101)]
    frame = telemetry(percent, [0.3] * 101)
    whole = contention_summary(frame, 0.0, 10.0)
    assert whole["machine_busy_share"] == pytest.approx(0.2)
    assert not machine_busy(whole["machine_busy_share"])
    assert contention_summary(frame, 6.0, 10.0)["machine_busy_share"] == 0.0
    # The same hog for half the run is flagged, and the mean says what the others took on average.
    half = telemetry([100.0 if i <= 50 else 40.0 for i in range(101)], [0.3] * 101)
    summary = contention_summary(half, 0.0, 10.0)
    assert summary["machine_busy_share"] == pytest.approx(0.5) and machine_busy(summary["machine_busy_share"])
    assert summary["mean_other_cpu_cores"] == pytest.approx((1.7 + 0.5) / 2)


def test_a_machine_not_saturated_is_not_flagged_however_much_others_use():
    frame = telemetry([80.0] * 51, [0.1] * 51)  # others hold 1.5 of 2 cores, but the engine could have had more
    assert contention_summary(frame, 0.0, 5.0)["machine_busy_share"] == 0.0


@pytest.mark.parametrize(
    "frame",
    [
        samples_frame([]),
        telemetry([100.0] * 51, [0.24] * 51, cores=0),  # telemetry recorded before the core count was sampled
        samples_frame(
            [
                Sample(0.0, MACHINE, CPU_COUNT, 2.0),
                *(Sample(i * STEP_S, MACHINE, CPU_PERCENT, 100.0) for i in range(51)),
            ]
        ),  # no engine samples
    ],
    ids=["no samples", "no core count", "no engine samples"],
)
def test_without_the_telemetry_to_tell_nothing_is_claimed(frame):
    summary = contention_summary(frame, 0.0, 5.0)
    assert summary == {"mean_other_cpu_cores": None, "machine_busy_share": None}
    columns = telemetry_columns(summary)
    assert columns == {} and busy_note(columns, "2") is None


def _config(backend: str) -> RunConfig:
    engine = (
        EngineConfig(backend="transformers", model="builtin:tiny-llama")
        if backend == "transformers"
        else EngineConfig(backend=backend, model="m", base_url="http://127.0.0.1:9")
    )
    return RunConfig(engine=engine, dataset=DatasetConfig(dataset="builtin:sample"), load=LoadConfig())


def _requests() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "index": [0],
            "status": ["success"],
            "reason": ["stop"],
            "input_len": [4],
            "output_len": [3],
            "req_output_len": [3],
            "ttft_s": [0.5],
            "tpot_s": [0.1],
            "e2e_s": [0.7],
            "itl_s": [[0.1, 0.1]],
            "tokens_per_tick": [[1, 1, 1]],
        }
    )


def test_the_history_row_of_an_in_process_run_carries_the_flag_and_its_table_names_it():
    frame = telemetry([100.0] * 51, [0.24] * 51)
    summary = run_metrics(_config("transformers"), _requests(), 5.0, frame)
    assert summary[OTHER_CORES_COLUMN] == pytest.approx(1.76) and summary[BUSY_SHARE_COLUMN] == pytest.approx(1.0)
    shown = quantity_table(summary, "sampled").set_index("quantity")
    assert shown.loc["Other processes' CPU", "value"] == pytest.approx(1.76)
    assert shown.loc["Run time saturated by other processes", "unit"] == "fraction"
    assert describe_column(BUSY_SHARE_COLUMN).label == "Run time saturated by other processes"


def test_a_server_run_is_not_judged_its_engine_is_a_process_we_do_not_sample():
    frame = telemetry([100.0] * 51, [0.24] * 51)  # the client's process: the server's work reads as the machine's
    summary = run_metrics(_config("openai"), _requests(), 5.0, frame)
    assert OTHER_CORES_COLUMN not in summary and BUSY_SHARE_COLUMN not in summary


def test_history_rows_without_the_columns_read_as_not_flagged():
    rows = pd.DataFrame(
        {
            "run_id": ["old", "busy", "calm"],
            "env_cpu_count": ["2", "2", "2"],
            BUSY_SHARE_COLUMN: [math.nan, 0.9, 0.1],
            OTHER_CORES_COLUMN: [math.nan, 1.5, 0.2],
        }
    )
    assert busy_runs(rows).tolist() == [False, True, False]
    assert busy_runs(rows.drop(columns=[BUSY_SHARE_COLUMN])).tolist() == [False, False, False]
    assert flag_tags(rows).tolist() == ["", BUSY_PREFIX, ""]
    assert busy_note(rows.iloc[1], rows.iloc[1]["env_cpu_count"]).startswith(
        "machine busy: other processes used 1.5 of 2 CPU cores"
    )


def test_a_sweep_point_counts_its_runs_on_a_busy_machine():
    from bench_core.sweep import results as sweep_results
    from bench_core.sweep.plan import SweepPlan, parse_sweep_arg

    base = RunConfig(
        engine=EngineConfig(backend="transformers", model="builtin:tiny-llama"),
        dataset=DatasetConfig(dataset="builtin:sample"),
        load=LoadConfig(),
    )
    plan = SweepPlan("s1", base, (parse_sweep_arg("concurrency=1,2"),), repeats=2)
    rows = pd.DataFrame(
        {
            "run_id": list("abcd"),
            "sweep_id": "s1",
            "sweep_repeat": [0.0, 1.0, 0.0, 1.0],
            "status": "finished",
            "concurrency": [1.0, 1.0, 2.0, 2.0],
            "output_throughput": [10.0, 11.0, 20.0, 9.0],
            BUSY_SHARE_COLUMN: [0.0, 0.1, 0.0, 0.8],
        }
    )
    runs = sweep_results.sweep_runs(rows, plan)
    statistics = sweep_results.point_statistics(runs, plan, ("output_throughput",))
    assert statistics[BUSY_RUNS].tolist() == [0, 1]
    means = sweep_results.point_means(runs, plan, ("output_throughput",))
    assert means[BUSY_RUNS].tolist() == [0, 1]
    assert "runs on a busy machine" in sweep_results.statistics_for_display(statistics).columns
    # Each flag counted apart: none of these four rows says anything of its client.
    assert statistics[CLIENT_BOUND_RUNS].tolist() == [0, 0] and means[CLIENT_BOUND_RUNS].tolist() == [0, 0]
    flooded = sweep_results.sweep_runs(rows.assign(**{LAG_COLUMN: [30.0, 1.0, 1.0, 12.0]}), plan)
    assert sweep_results.point_means(flooded, plan, ("output_throughput",))[CLIENT_BOUND_RUNS].tolist() == [1, 1]
    shown = sweep_results.statistics_for_display(statistics).columns
    assert "runs whose client could not keep up" in shown


def test_a_caller_process_is_sampled_and_counted_as_ours():
    import subprocess
    import time

    from bench_core.hardware.telemetry import TelemetrySampler

    hog = subprocess.Popen(["yes"], stdout=subprocess.DEVNULL)  # stands for the dashboard following the worker
    try:
        sampler = TelemetrySampler(caller_pid=hog.pid, gpus=False, interval_s=0.05).start()
        time.sleep(1.5)
        frame = sampler.stop()
    finally:
        hog.kill()
        hog.wait()
    caller = frame[(frame["source"] == CALLER) & (frame["metric"] == CPU_CORES)]["value"]
    assert len(caller) >= 10 and caller.mean() > 0.2
    assert frame.loc[frame["metric"] == CPU_COUNT, "value"].tolist() == [float(os_cpu_count())]
    end = float(frame["time_s"].max())
    start = float(frame["time_s"].min())
    with_caller = contention_summary(frame, start, end)["mean_other_cpu_cores"]
    as_stranger = contention_summary(frame[frame["source"] != CALLER], start, end)["mean_other_cpu_cores"]
    assert as_stranger - with_caller > 0.5 * caller.mean()


@pytest.mark.slow
def test_the_engine_worker_samples_the_process_that_follows_it(tiny_model_path):
    from bench_core.run.engine_process import ProcessRunner

    runner = ProcessRunner()
    try:
        run = runner.submit(
            RunConfig(
                engine=EngineConfig(backend="transformers", model="builtin:tiny-llama"),
                dataset=DatasetConfig(dataset="builtin:sample", num_prompts=2, sharegpt_output_len=4),
                load=LoadConfig(concurrency=2),
            )
        )
        assert run.wait(120) and run.state == "finished", run.message
    finally:
        runner.shutdown()
    assert {PROCESS, CALLER, MACHINE} <= set(run.record.telemetry["source"])


def test_a_running_run_is_judged_on_its_last_minute_whose_window_keeps_the_core_count():
    import time

    from bench_core.hardware.contention import live_busy_note
    from bench_core.hardware.telemetry import TelemetrySampler

    sampler = TelemetrySampler(gpus=False, interval_s=0.02).start()
    time.sleep(0.2)
    later = time.perf_counter()
    time.sleep(0.2)
    window = sampler.samples(since_s=later)
    sampler.stop()
    assert window["time_s"].iloc[1] >= later and window.loc[window["metric"] == CPU_COUNT].shape[0] == 1
    assert live_busy_note(telemetry([100.0] * 51, [0.24] * 51)) == (
        "machine busy: other processes used 1.8 of 2 CPU cores during the last minute and saturated the machine 100% "
        "of the time: its numbers are not the engine's alone."
    )
    assert live_busy_note(telemetry([100.0] * 51, [1.97] * 51)) is None and live_busy_note(None) is None
