"""Hardware telemetry during a run: a sampler thread, the samples as a long table, and their summaries.

`TelemetrySampler` records, at a fixed rate (10 Hz by default), the engine process's CPU use and resident
memory, the CPU use of the process that follows the run from another one where there is one (the dashboard
beside its engine worker) and of each worker process an HTTP client sends from (engines/client_workers.py), the machine's CPU utilisation (and, once, its core count) and, where NVML answers
(the `nvidia-ml-py` package of the GPU install), each visible GPU's utilisation, memory used, power and SM
clock. Samples are rows (time_s, source, metric, value) with time on the `time.perf_counter` clock of the
engine's ticks, so a run's measured window selects them directly; `samples_frame` is the table stored next to
the per-request one. The summaries (time-weighted means, peaks, energy by the trapezoid rule) are pure functions of it.
"""

from __future__ import annotations

import bisect
import importlib.util
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
import pandas as pd
import psutil

SAMPLE_COLUMNS = ("time_s", "source", "metric", "value")
TELEMETRY_FILE = "telemetry.parquet"  # the per-run folder's sibling of requests.parquet
DEFAULT_INTERVAL_S = 0.1

PROCESS = "process"  # the engine's process
CALLER = "caller"  # the process that started the engine's worker and follows its runs (the dashboard): ours too
MACHINE = "machine"
CLIENT_WORKER = "client_worker{}"  # client_worker0, ...: the HTTP client's worker processes, where it sends from some
CLIENT_LOOP = "client_loop"  # the HTTP client's event loop: handed over by the client (engines/loop_lag.py), not polled
GPU_SOURCE = "gpu{}"  # gpu0, gpu1, ...: CUDA's numbering of the visible GPUs

# Metrics, each in the unit its name ends with.
CPU_CORES = "cpu_cores"  # CPU time per second of the process: 1.0 is one core busy all the time
RSS_BYTES = "rss_bytes"
CPU_PERCENT = "cpu_percent"  # the machine's CPUs busy, 0-100 over all cores
CPU_COUNT = "cpu_count"  # the machine's logical cores, the ones CPU_PERCENT is over: sampled once, at the start
GPU_UTIL_PERCENT = "gpu_util_percent"  # share of the last sample period in which a kernel ran (NVML's definition)
GPU_MEMORY_BYTES = "memory_used_bytes"
POWER_W = "power_w"
SM_CLOCK_MHZ = "sm_clock_mhz"
LOOP_LAG_S = "loop_lag_s"  # how much later than asked the client's loop woke

NVML_PACKAGE = "nvidia-ml-py"


class Sample(NamedTuple):
    time_s: float
    source: str
    metric: str
    value: float


def samples_frame(samples: list[Sample] | list[tuple]) -> pd.DataFrame:
    """The samples as a table with fixed column types (the parquet file's schema), in time order."""
    frame = pd.DataFrame.from_records(samples, columns=list(SAMPLE_COLUMNS))
    frame = frame.astype({"time_s": "float64", "source": "string", "metric": "string", "value": "float64"})
    return frame.sort_values("time_s", kind="stable").reset_index(drop=True)


def gpu_telemetry_unavailable() -> str | None:
    """None when NVML can be read here, else why not, as a sentence for the user."""
    reader, why_not = open_gpus()
    if reader is not None:
        reader.close()
    return why_not


def open_gpus() -> tuple[NvmlReader | None, str | None]:
    """A reader of the visible GPUs, or None and why not (no package, no driver, no GPU)."""
    if importlib.util.find_spec("pynvml") is None:
        return (
            None,
            f"No GPU telemetry: the {NVML_PACKAGE} package is not installed (it comes with requirements-gpu.txt).",
        )
    try:
        reader = NvmlReader()
    except Exception as exc:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...: no usable driver
        return None, f"No GPU telemetry: NVML did not start ({exc})."
    if not reader.handles:
        reader.close()
        return None, "No GPU telemetry: NVML sees no visible GPU."
    return reader, None


class NvmlReader:
    """NVML handles of the GPUs this process may use (CUDA_VISIBLE_DEVICES by index or UUID), read per sample."""

    def __init__(self) -> None:
        import pynvml

        self._nvml = pynvml
        pynvml.nvmlInit()
        try:
            self.handles = [self._handle(device) for device in _visible_devices(pynvml.nvmlDeviceGetCount())]
        except Exception:
            pynvml.nvmlShutdown()
            raise
        self._unsupported: set[tuple[int, str]] = set()

    def _handle(self, device: str):
        if device.isdigit():
            return self._nvml.nvmlDeviceGetHandleByIndex(int(device))
        return self._nvml.nvmlDeviceGetHandleByUUID(device)

    def read(self, now: float) -> list[Sample]:
        nvml = self._nvml
        readers: dict[str, Callable] = {
            GPU_UTIL_PERCENT: lambda h: nvml.nvmlDeviceGetUtilizationRates(h).gpu,
            GPU_MEMORY_BYTES: lambda h: nvml.nvmlDeviceGetMemoryInfo(h).used,
            POWER_W: lambda h: nvml.nvmlDeviceGetPowerUsage(h) / 1000.0,  # NVML answers in milliwatts
            SM_CLOCK_MHZ: lambda h: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM),
        }
        rows: list[Sample] = []
        for index, handle in enumerate(self.handles):
            for metric, read in readers.items():
                if (index, metric) in self._unsupported:
                    continue
                try:
                    rows.append(Sample(now, GPU_SOURCE.format(index), metric, float(read(handle))))
                except nvml.NVMLError:  # not supported on this board (power on some): stop asking
                    self._unsupported.add((index, metric))
        return rows

    def inventory(self) -> tuple[str, list[GpuMemory]]:
        """The driver's version and each visible GPU: its name, memory in all and memory free now."""
        nvml = self._nvml
        gpus = []
        for handle in self.handles:
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            gpus.append(GpuMemory(_text(nvml.nvmlDeviceGetName(handle)), memory.total, memory.free))
        return _text(nvml.nvmlSystemGetDriverVersion()), gpus

    def close(self) -> None:
        self._nvml.nvmlShutdown()


class GpuMemory(NamedTuple):
    name: str
    total_bytes: int
    free_bytes: int


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)  # older NVML bindings answer bytes


def gpu_inventory() -> tuple[str, list[GpuMemory], str | None]:
    """The driver's version and the visible GPUs with their free memory, from NVML; ("", [], why not) where NVML
    cannot answer."""
    reader, why_not = open_gpus()
    if reader is None:
        return "", [], why_not
    try:
        driver, gpus = reader.inventory()
    finally:
        reader.close()
    return driver, gpus, None


def _visible_devices(count: int) -> list[str]:
    """NVML numbers every GPU of the machine; CUDA_VISIBLE_DEVICES, when set, says which the engine sees."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        return [str(i) for i in range(count)]
    devices = [d.strip() for d in listed.split(",") if d.strip()]
    kept: list[str] = []
    for device in devices:  # CUDA stops at the first entry it cannot use
        if (device.isdigit() and int(device) >= count) or device.startswith("-"):
            break
        kept.append(device)
    return kept


class TelemetrySampler:
    """Samples `pid` (default: this process), the `caller_pid` process where one is given, the client's worker
    processes `client_pids` (CPU only), the machine and the visible GPUs every `interval_s` seconds in a daemon thread, from `start()` to `stop()`; a sample is taken at
    both ends so the run's window is covered.

    A process that exits stops being sampled (the rest goes on); GPU telemetry is skipped, with the reason in
    `gpu_note`, where NVML cannot be read.
    """

    def __init__(
        self,
        pid: int | None = None,
        interval_s: float = DEFAULT_INTERVAL_S,
        gpus: bool = True,
        clock: Callable[[], float] = time.perf_counter,
        caller_pid: int | None = None,
        client_pids: Sequence[int] = (),
    ) -> None:
        self._processes = [_Watched(PROCESS, pid, memory=True)]
        if caller_pid is not None:
            self._processes.append(_Watched(CALLER, caller_pid, memory=False))
        self._processes += [_Watched(CLIENT_WORKER.format(i), pid, memory=False) for i, pid in enumerate(client_pids)]
        self._interval_s = interval_s
        self._clock = clock
        self._samples: list[Sample] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._gpus, self.gpu_note = open_gpus() if gpus else (None, "GPU telemetry not asked for.")
        self._last_machine = psutil.cpu_times()

    def start(self) -> TelemetrySampler:
        with self._lock:
            self._samples.append(Sample(self._clock(), MACHINE, CPU_COUNT, float(psutil.cpu_count() or 0)))
        self._sample()
        self._thread = threading.Thread(target=self._loop, name="telemetry-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> pd.DataFrame:
        """Stop sampling (after one last sample) and return every sample taken."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
            self._sample()
        if self._gpus is not None:
            self._gpus.close()
            self._gpus = None
        return self.samples()

    def samples(self, since_s: float | None = None) -> pd.DataFrame:
        """The samples so far, or those taken at `since_s` or later (safe to call while sampling: a live chart
        asks for the last minute, which costs that minute's rows however long the run); the core count, sampled
        first, comes with every window, which would not know what the machine's percentages are of without it."""
        with self._lock:
            first = 0 if since_s is None else bisect.bisect_left(self._samples, since_s, key=lambda s: s.time_s)
            taken = self._samples[first:] if first == 0 else [self._samples[0], *self._samples[first:]]
        return samples_frame(taken)

    def __enter__(self) -> TelemetrySampler:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def _loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            self._sample()

    def _sample(self) -> None:
        now = self._clock()
        rows = [row for watched in self._processes for row in watched.read(now)] + self._machine_rows(now)
        if self._gpus is not None:
            rows += self._gpus.read(now)
        rows.sort(key=lambda row: row.time_s)  # a process's first CPU row stands at the previous sample's time
        with self._lock:
            self._samples.extend(rows)

    def _machine_rows(self, now: float) -> list[Sample]:
        # From our own previous reading: psutil.cpu_percent's baseline is shared by every caller in the process.
        current, last = psutil.cpu_times(), self._last_machine
        self._last_machine = current
        total = _all_cpu_time(current) - _all_cpu_time(last)
        idle = _idle_cpu_time(current) - _idle_cpu_time(last)
        if total <= 0:
            return []
        return [Sample(now, MACHINE, CPU_PERCENT, 100.0 * max(0.0, min(1.0, 1.0 - idle / total)))]


class _Watched:
    """One sampled process: its CPU cores over each interval between samples (and its resident memory)."""

    def __init__(self, source: str, pid: int | None, memory: bool) -> None:
        self.source, self.memory = source, memory
        try:
            self.process: psutil.Process | None = psutil.Process(pid)
        except psutil.NoSuchProcess:  # a caller already gone: nothing of it to sample
            self.process = None
        self.last: tuple[float, float] | None = None  # (time, CPU seconds the process had used)
        self.cpu_read = False  # whether a CPU row was written

    def read(self, now: float) -> list[Sample]:
        if self.process is None:
            return []
        try:
            with self.process.oneshot():
                ended = self.process.status() == psutil.STATUS_ZOMBIE  # exited, not yet reaped by its parent
                times = self.process.cpu_times()
                rss = self.process.memory_info().rss
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            ended = True
        if ended:
            self.process = None  # the process ended: its last samples stand
            return []
        cpu_s = times.user + times.system
        rows = [Sample(now, self.source, RSS_BYTES, float(rss))] if self.memory else []
        if self.last is not None and now > self.last[0]:
            then, cpu_then = self.last
            cores = (cpu_s - cpu_then) / (now - then)
            if not self.cpu_read:
                # The first interval's mean stands at its start too: a run shorter than the sampler's interval (or
                # one whose sampler thread a busy machine gave no turn) still has its CPU over the whole window.
                rows.append(Sample(then, self.source, CPU_CORES, cores))
                self.cpu_read = True
            rows.append(Sample(now, self.source, CPU_CORES, cores))
        self.last = (now, cpu_s)
        return rows


def _all_cpu_time(times) -> float:
    # Linux counts guest time inside user time as well: leave it out once, as psutil.cpu_percent does.
    return sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)


def _idle_cpu_time(times) -> float:
    return times.idle + getattr(times, "iowait", 0.0)


def with_loop_lag(samples: pd.DataFrame, lags: list[tuple[float, float]]) -> pd.DataFrame:
    """The samples with the client loop's lateness samples (time, seconds late) among them, in time order."""
    if not lags:
        return samples
    lagged = samples_frame([Sample(time_s, CLIENT_LOOP, LOOP_LAG_S, lag) for time_s, lag in lags])
    return pd.concat([samples, lagged], ignore_index=True).sort_values("time_s", kind="stable").reset_index(drop=True)


# Summaries: pure functions of a samples table and a window [start_s, end_s] on the same clock.


def series(samples: pd.DataFrame, source: str, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """Times and values of one source's metric, in time order."""
    chosen = samples[(samples["source"] == source) & (samples["metric"] == metric)].sort_values("time_s")
    return chosen["time_s"].to_numpy(dtype=float), chosen["value"].to_numpy(dtype=float)


def sources_of(samples: pd.DataFrame, metric: str) -> list[str]:
    """The sources that recorded `metric`, sorted (gpu0, gpu1, ...)."""
    return sorted(samples.loc[samples["metric"] == metric, "source"].unique())


def integral(times: np.ndarray, values: np.ndarray, start_s: float, end_s: float) -> float | None:
    """The trapezoid-rule integral of the piecewise-linear series over [start_s, end_s], cut to the span the
    samples cover (values at the cuts interpolated); None with fewer than two samples or no overlap."""
    if len(times) < 2:
        return None
    low, high = max(start_s, times[0]), min(end_s, times[-1])
    if high <= low:
        return None
    inside = (times > low) & (times < high)
    t = np.concatenate(([low], times[inside], [high]))
    v = np.concatenate(([np.interp(low, times, values)], values[inside], [np.interp(high, times, values)]))
    return float(np.sum((v[1:] + v[:-1]) * np.diff(t)) / 2.0)


def interval_weights(times: np.ndarray, start_s: float, end_s: float) -> np.ndarray:
    """How much of [start_s, end_s] each sample after the first covers: sample i holds what happened over
    (times[i-1], times[i]], so its weight is that interval's part inside the window (0 outside it)."""
    return np.clip(np.minimum(times[1:], end_s) - np.maximum(times[:-1], start_s), 0.0, None)


def time_weighted_mean(times: np.ndarray, values: np.ndarray, start_s: float, end_s: float) -> float | None:
    """The series' mean over the part of [start_s, end_s] its samples cover, each instant weighing the same
    (an uneven sampling rate does not tilt it)."""
    area = integral(times, values, start_s, end_s)
    if area is None:
        return None
    return area / (min(end_s, times[-1]) - max(start_s, times[0]))


def mean_across_sources(
    samples: pd.DataFrame, metric: str, start_s: float, end_s: float, sources: list[str] | None = None
) -> float | None:
    """The time-weighted mean of `metric` per source, averaged over the sources (e.g. mean GPU utilisation)."""
    means = [
        time_weighted_mean(*series(samples, source, metric), start_s, end_s)
        for source in (sources or sources_of(samples, metric))
    ]
    measured = [m for m in means if m is not None]
    return float(np.mean(measured)) if measured else None


def peak(samples: pd.DataFrame, metric: str, start_s: float, end_s: float) -> float | None:
    """The largest value of `metric` over [start_s, end_s] by any source (the fullest GPU's memory): the samples
    inside it and, as the integrals read the series, the values interpolated where it cuts between two samples (a
    run shorter than the sampler's interval lies between its samples at start and stop)."""
    peaks = []
    for source in sources_of(samples, metric):
        times, values = series(samples, source, metric)
        low, high = max(start_s, times[0]), min(end_s, times[-1])
        if high < low:
            continue
        inside = values[(times >= low) & (times <= high)]
        peaks.append(max(inside.max(initial=-np.inf), *np.interp([low, high], times, values)))
    return float(max(peaks)) if peaks else None


def energy_joules(samples: pd.DataFrame, start_s: float, end_s: float) -> float | None:
    """Energy the GPUs drew over [start_s, end_s]: each GPU's power integrated by the trapezoid rule, summed;
    None without power samples covering part of the window."""
    per_gpu = [integral(*series(samples, source, POWER_W), start_s, end_s) for source in sources_of(samples, POWER_W)]
    measured = [e for e in per_gpu if e is not None]
    return float(sum(measured)) if measured else None


def mean_power_watts(samples: pd.DataFrame, start_s: float, end_s: float) -> float | None:
    """All GPUs' power together, averaged over the window (energy / covered time per GPU, summed)."""
    means = [time_weighted_mean(*series(samples, s, POWER_W), start_s, end_s) for s in sources_of(samples, POWER_W)]
    measured = [m for m in means if m is not None]
    return float(sum(measured)) if measured else None


def energy_per_output_token(energy_j: float | None, output_tokens: int) -> float | None:
    """Joules per output token (smaller is better); None when energy is unknown or nothing was generated."""
    if energy_j is None or output_tokens <= 0:
        return None
    return energy_j / output_tokens


def telemetry_summary(samples: pd.DataFrame, start_s: float, end_s: float, output_tokens: int) -> dict:
    """A run's telemetry in flat keys, each in its unit; None where it was not measured (no GPU, say)."""
    energy = energy_joules(samples, start_s, end_s)
    return {
        "mean_gpu_util_percent": mean_across_sources(samples, GPU_UTIL_PERCENT, start_s, end_s),
        "peak_gpu_memory_bytes": peak(samples, GPU_MEMORY_BYTES, start_s, end_s),
        "mean_gpu_power_w": mean_power_watts(samples, start_s, end_s),
        "mean_sm_clock_mhz": mean_across_sources(samples, SM_CLOCK_MHZ, start_s, end_s),
        "energy_j": energy,
        "energy_per_output_token_j": energy_per_output_token(energy, output_tokens),
        "mean_process_cpu_cores": mean_across_sources(samples, CPU_CORES, start_s, end_s, [PROCESS]),
        "peak_process_rss_bytes": peak(samples, RSS_BYTES, start_s, end_s),
        "mean_machine_cpu_percent": mean_across_sources(samples, CPU_PERCENT, start_s, end_s, [MACHINE]),
        **loop_lag_summary(samples, start_s, end_s),
    }


def loop_lag_summary(samples: pd.DataFrame, start_s: float, end_s: float) -> dict[str, float | None]:
    """The client loop's mean and largest lateness over the window, in seconds; None each without its samples (an
    engine in this process has no client loop)."""
    times, lags = series(samples, CLIENT_LOOP, LOOP_LAG_S)
    inside = lags[(times >= start_s) & (times <= end_s)]
    if not inside.size:
        return {"mean_loop_lag_s": None, "max_loop_lag_s": None}
    return {"mean_loop_lag_s": float(inside.mean()), "max_loop_lag_s": float(inside.max())}
