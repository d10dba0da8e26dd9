"""Telemetry: real psutil sampling of real processes, and the summaries on constructed samples."""

import importlib.util
import os
import subprocess
import sys
import threading
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

READY = "ready"  # what a child prints once its interpreter is up and its memory taken: the test waits for it
BUSY_WITH_300_MB = f"data = b'x' * 300_000_000\nprint({READY!r}, flush=True)\nwhile True:\n    pass\n"
SPINNING = f"print({READY!r}, flush=True)\nwhile True:\n    pass\n"
IDLE = f"import time\nprint({READY!r}, flush=True)\ntime.sleep(60)\n"
INTERVAL_S = 0.05


@pytest.fixture
def child():
    started = []

    def start(code: str) -> subprocess.Popen:
        """The child running `code`, returned once it says it is ready: its start-up is behind it, however long a busy
        machine made that."""
        process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        started.append(process)
        assert process.stdout.readline().strip() == READY
        return process

    yield start
    for process in started:
        process.kill()
        process.wait()


def _sample(pid: int, seconds: float) -> tuple[pd.DataFrame, float, float]:
    sampler = TelemetrySampler(pid=pid, interval_s=INTERVAL_S, gpus=False)
    begin = time.perf_counter()
    sampler.start()
    time.sleep(seconds)
    frame = sampler.stop()
    return frame, begin, time.perf_counter()


def _cpu_seconds(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def _turns(stop: threading.Event, turns: list[float]) -> None:
    """A bare thread that wakes every INTERVAL_S until `stop`, as the sampler's thread does, and counts its turns."""
    while not stop.wait(INTERVAL_S):
        turns.append(time.perf_counter())


def test_a_busy_process_shows_its_core_in_use_and_its_memory(child):
    busy = child(BUSY_WITH_300_MB)
    stop, turns = threading.Event(), []
    ticker = threading.Thread(target=_turns, args=(stop, turns))
    ticker.start()
    cpu_before = _cpu_seconds(busy.pid)
    frame, begin, end = _sample(busy.pid, 1.5)
    # What the kernel says the child used, over the whole sampling: how much of a core it got on a shared machine.
    core_share = (_cpu_seconds(busy.pid) - cpu_before) / (end - begin)
    stop.set()
    ticker.join()
    rss_times = telemetry.series(frame, PROCESS, RSS_BYTES)[0]
    print(
        f"\nthe child got {core_share:.2f} of a core; {len(rss_times)} samples, a bare thread waking as often "
        f"{len(turns)} turns"
    )
    # Sampled at the start, at the stop and in between, as often as a thread that only wakes got turns beside it
    # (at least half as often: each sample also reads the process and the machine), and never faster than asked.
    assert len(rss_times) >= 2 + len(turns) // 2
    assert (np.diff(rss_times)[:-1] >= INTERVAL_S).all()  # the last is the stop's, whenever it came
    summary = telemetry.telemetry_summary(frame, begin, end, output_tokens=0)
    assert core_share > 0.0
    assert summary["mean_process_cpu_cores"] == pytest.approx(core_share, rel=0.2)
    assert summary["peak_process_rss_bytes"] > 300_000_000
    # The machine is at least as busy as the child keeps it (most of it: the two are read at slightly different
    # instants), and never more than all of it.
    child_percent = 100 * summary["mean_process_cpu_cores"] / psutil.cpu_count()
    assert 0.9 * child_percent <= summary["mean_machine_cpu_percent"] <= 100  # timing-safe: all of the machine
    assert summary["energy_j"] is None and summary["mean_gpu_util_percent"] is None
    assert frame["time_s"].is_monotonic_increasing and frame["time_s"].between(begin, end).all()


def test_an_idle_process_uses_almost_no_cpu(child):
    idle, spinning = child(IDLE), child(SPINNING)
    samplers = [TelemetrySampler(pid=pid, interval_s=INTERVAL_S, gpus=False) for pid in (idle.pid, spinning.pid)]
    begin = time.perf_counter()
    for sampler in samplers:
        sampler.start()
    time.sleep(1.0)
    idle_frame, spinning_frame = (sampler.stop() for sampler in samplers)
    end = time.perf_counter()
    idle_cores, spinning_cores = (
        telemetry.mean_across_sources(frame, CPU_CORES, begin, end, [PROCESS]) for frame in (idle_frame, spinning_frame)
    )
    print(f"\nsleeping child {idle_cores:.3f} cores, spinning child beside it {spinning_cores:.3f}")
    # Less than a tenth of what a spinning child sampled over the same second uses, however much of a core a shared
    # machine gave that one.
    assert spinning_cores > 0.0 and idle_cores < spinning_cores / 10
    assert telemetry.peak(idle_frame, RSS_BYTES, begin, end) < 100_000_000  # timing-safe: a memory figure


def test_a_process_that_exits_stops_being_sampled_while_the_machine_still_is(child):
    short = child(IDLE)
    sampler = TelemetrySampler(pid=short.pid, interval_s=INTERVAL_S, gpus=False).start()
    time.sleep(0.3)
    short.kill()
    os.waitid(os.P_PID, short.pid, os.WEXITED | os.WNOWAIT)  # it has exited, and is left unreaped: a zombie
    gone = time.perf_counter()
    time.sleep(0.3)
    frame = sampler.stop()
    last_process = telemetry.series(frame, PROCESS, RSS_BYTES)[0].max()
    last_machine = telemetry.series(frame, MACHINE, CPU_PERCENT)[0].max()
    # Sampled until it was gone, and no longer; the machine until the stop.
    assert last_process < gone < last_machine


def test_a_run_shorter_than_the_interval_still_has_the_process_cpu_and_memory_over_its_window():
    # The sampler's thread never wakes (an hour's interval): only the samples at start and stop are taken, as when a
    # short run on a busy machine gives that thread no turn. The first interval's mean stands at both its ends.
    sampler = TelemetrySampler(interval_s=3600, gpus=False).start()
    begin = time.perf_counter()
    spun = time.process_time()
    while time.process_time() - spun < 0.05:
        pass
    end = time.perf_counter()
    frame = sampler.stop()
    times, cores = telemetry.series(frame, PROCESS, CPU_CORES)
    assert len(times) == 2 and cores[0] == cores[1] > 0 and times[0] <= begin and end <= times[1]
    assert telemetry.mean_across_sources(frame, CPU_CORES, begin, end, [PROCESS]) == pytest.approx(cores[0])
    assert telemetry.peak(frame, RSS_BYTES, begin, end) > 0  # its memory too, from the samples around the window
    assert frame["time_s"].is_monotonic_increasing


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
    # A window between two samples reads the series where it cuts it: gpu0 falls from 40 to 20 GB over 0.9-1.0 s.
    assert telemetry.peak(samples, GPU_MEMORY_BYTES, 0.91, 0.92) == pytest.approx(38e9)
    assert telemetry.peak(samples, GPU_MEMORY_BYTES, 20.0, 30.0) is None


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
