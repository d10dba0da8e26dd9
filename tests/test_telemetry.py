"""Telemetry: real psutil sampling of real processes, and the summaries on constructed samples."""

import importlib.util
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import psutil
import pytest

from bench_core.hardware import telemetry
from bench_core.hardware.telemetry import (
    CPU_CORES,
    CPU_PERCENT,
    GPU_MEMORY_BYTES,
    GPU_UTIL_PERCENT,
    MACHINE,
    POWER_W,
    PROCESS,
    RSS_BYTES,
    Sample,
    TelemetrySampler,
    samples_frame,
)

BUSY_WITH_300_MB = "data = b'x' * 300_000_000\nwhile True:\n    pass\n"
IDLE = "import time\ntime.sleep(60)\n"


@pytest.fixture
def child():
    started = []

    def start(code: str) -> subprocess.Popen:
        process = subprocess.Popen([sys.executable, "-c", code])
        started.append(process)
        return process

    yield start
    for process in started:
        process.kill()
        process.wait()


def _sample(pid: int, seconds: float) -> tuple[pd.DataFrame, float, float]:
    sampler = TelemetrySampler(pid=pid, interval_s=0.05, gpus=False)
    begin = time.perf_counter()
    sampler.start()
    time.sleep(seconds)
    frame = sampler.stop()
    return frame, begin, time.perf_counter()


def _values(frame: pd.DataFrame, source: str, metric: str) -> np.ndarray:
    return telemetry.series(frame, source, metric)[1]


def _cpu_seconds(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def test_a_busy_process_shows_its_core_in_use_and_its_memory(child):
    busy = child(BUSY_WITH_300_MB)
    time.sleep(0.5)  # past the interpreter's start and the 300 MB allocation
    cpu_before = _cpu_seconds(busy.pid)
    frame, begin, end = _sample(busy.pid, 1.5)
    # What the kernel says the child used, over the whole sampling: how much of a core it got on a shared machine.
    core_share = (_cpu_seconds(busy.pid) - cpu_before) / (end - begin)
    assert len(_values(frame, PROCESS, RSS_BYTES)) >= 15
    summary = telemetry.telemetry_summary(frame, begin, end, output_tokens=0)
    assert core_share > 0.1
    assert summary["mean_process_cpu_cores"] == pytest.approx(core_share, abs=0.15)
    assert summary["peak_process_rss_bytes"] > 300_000_000
    # The machine is at least as busy as the child keeps it.
    assert 100 * core_share / psutil.cpu_count() - 10 <= summary["mean_machine_cpu_percent"] <= 100
    assert summary["energy_j"] is None and summary["mean_gpu_util_percent"] is None
    assert frame["time_s"].is_monotonic_increasing and frame["time_s"].between(begin, end).all()


def test_an_idle_process_uses_almost_no_cpu(child):
    idle = child(IDLE)
    time.sleep(0.3)
    frame, begin, end = _sample(idle.pid, 1.0)
    assert telemetry.mean_across_sources(frame, CPU_CORES, begin, end, [PROCESS]) < 0.05
    assert telemetry.peak(frame, RSS_BYTES, begin, end) < 100_000_000


def test_a_process_that_exits_stops_being_sampled_while_the_machine_still_is(child):
    short = child("import time\ntime.sleep(0.4)\n")
    frame, _, _ = _sample(short.pid, 1.2)
    last_process = telemetry.series(frame, PROCESS, RSS_BYTES)[0].max()
    last_machine = telemetry.series(frame, MACHINE, CPU_PERCENT)[0].max()
    assert last_machine - last_process > 0.4


def test_the_samples_can_be_read_while_sampling():
    with TelemetrySampler(interval_s=0.02, gpus=False) as sampler:
        time.sleep(0.3)
        so_far = sampler.samples()
        assert list(so_far.columns) == ["time_s", "source", "metric", "value"] and len(so_far) > 5


@pytest.mark.skipif(importlib.util.find_spec("pynvml") is not None, reason="NVML's package is installed here")
def test_without_nvidia_ml_py_gpu_telemetry_says_why_and_the_rest_is_sampled():
    assert "nvidia-ml-py package is not installed" in telemetry.gpu_telemetry_unavailable()
    sampler = TelemetrySampler(interval_s=0.02)
    assert sampler.gpu_note == telemetry.gpu_telemetry_unavailable()
    sampler.start()
    time.sleep(0.1)
    frame = sampler.stop()
    assert set(frame["source"]) == {PROCESS, MACHINE}


def test_the_samples_table_round_trips_through_parquet(tmp_path):
    frame = samples_frame([Sample(2.0, "gpu0", POWER_W, 250.5), Sample(1.0, PROCESS, RSS_BYTES, 1e9)])
    assert list(frame["time_s"]) == [1.0, 2.0]
    frame.to_parquet(tmp_path / telemetry.TELEMETRY_FILE)
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / telemetry.TELEMETRY_FILE), frame)


def _constructed() -> pd.DataFrame:
    """Two GPUs sampled every 0.1 s for 10 s: gpu0 at a steady 300 W, gpu1 ramping from 100 to 300 W."""
    times = np.round(np.arange(0, 10.0001, 0.1), 6)
    rows = [Sample(t, "gpu0", POWER_W, 300.0) for t in times]
    rows += [Sample(t, "gpu1", POWER_W, 100.0 + 20.0 * t) for t in times]
    rows += [Sample(t, "gpu0", GPU_MEMORY_BYTES, 40e9 if t < 1 else 20e9) for t in times]
    rows += [Sample(t, "gpu1", GPU_MEMORY_BYTES, 30e9) for t in times]
    return samples_frame(rows)


def test_energy_is_power_integrated_over_the_window_and_summed_over_gpus():
    samples = _constructed()
    # gpu0: 300 W x 5 s; gpu1: the integral of 100 + 20 t from 2 to 7 = 500 + 450.
    assert telemetry.energy_joules(samples, 2.0, 7.0) == pytest.approx(1500 + 950)
    # A window cut between samples interpolates at its ends: 300 x 4.9 + (100 x 4.9 + 10 x (6.95^2 - 2.05^2)).
    assert telemetry.energy_joules(samples, 2.05, 6.95) == pytest.approx(1470 + 490 + 10 * (6.95**2 - 2.05**2))
    assert telemetry.mean_power_watts(samples, 2.0, 7.0) == pytest.approx(300 + 190)
    assert telemetry.energy_per_output_token(2450.0, 1000) == pytest.approx(2.45)


def test_a_window_longer_than_the_samples_counts_only_what_was_measured():
    samples = _constructed()
    assert telemetry.energy_joules(samples, -5.0, 1.0) == pytest.approx(300 + 110)
    assert telemetry.energy_joules(samples, 20.0, 30.0) is None


def test_peak_memory_is_the_fullest_gpu_inside_the_window():
    samples = _constructed()
    assert telemetry.peak(samples, GPU_MEMORY_BYTES, 0.0, 10.0) == 40e9
    assert telemetry.peak(samples, GPU_MEMORY_BYTES, 2.0, 10.0) == 30e9


def test_utilisation_is_averaged_over_time_not_over_samples():
    # Sparse samples at 0 % for 5 s, then dense samples at 100 % for 5 s: half the time busy, not 99 %.
    idle = [Sample(float(t), "gpu0", GPU_UTIL_PERCENT, 0.0) for t in range(5)] + [
        Sample(4.999, "gpu0", GPU_UTIL_PERCENT, 0.0)
    ]
    busy = [Sample(5.0 + i / 100, "gpu0", GPU_UTIL_PERCENT, 100.0) for i in range(501)]
    samples = samples_frame(idle + busy)
    assert samples["value"].mean() > 98
    assert telemetry.mean_across_sources(samples, GPU_UTIL_PERCENT, 0.0, 10.0) == pytest.approx(50.0, abs=0.1)


def test_nothing_measured_gives_none_not_zero():
    empty = samples_frame([])
    summary = telemetry.telemetry_summary(empty, 0.0, 1.0, output_tokens=100)
    assert set(summary.values()) == {None}
    assert telemetry.energy_per_output_token(100.0, 0) is None
