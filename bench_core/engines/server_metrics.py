"""The server's own Prometheus metrics during a run: read at an interval, kept raw, and seen as one set.

LMDeploy's api_server (`lmdeploy/metrics/loggers.py`), vLLM, SGLang and llama.cpp's llama-server (started with
--metrics; `llamacpp:*`, no labels) serve Prometheus text at GET /metrics, each under its own names.
`SERVER_METRICS` maps them onto one set: running and waiting requests, KV-cache usage, the prefix-cache hit rate,
cached prompt tokens, the prompt and generated tokens the server counted, the speculative acceptance length and rate,
and the server-side TTFT, queue and end-to-end times; beside them, over the whole run only, the acceptance rate of
each draft position (`acceptance_by_position`) from the per-position counters LMDeploy and vLLM keep. A quantity is read from the first of its sources the page has: a gauge
as it stands (summed over label sets for counts, averaged for fractions), a counter as its change per second or a
ratio of two counters' changes, a histogram as the mean of what it observed since the previous read
(the change of its `_sum` over the change of its `_count`). So every derived value belongs to the interval
that ends at its read, on the same clock as the run's ticks.

`MetricsScraper` reads the page off the run's critical path: in a process of its own (`metrics_reader`), which
fetches each read whole within a timeout and a size bound, and parses only the lines of the names the mapping
reads (`KNOWN_NAMES`, not the histograms' buckets), at most `MAX_LABEL_SETS` label sets of a name per read. A
slow or huge page so costs its samples, never the run, nor the client's timestamps (the client's process only
files what the reader sends). The raw samples are kept one row per name and label set per read (`RAW_COLUMNS`):
what the run folder stores. The first read is the baseline of the server's counters, so the runner starts the
clock once it has come, or once its timeout has passed: a page slower than that is a failed read, and nothing
waits on it again. A server without /metrics, or whose page has none of these names, is told in one sentence
with the run's other warnings (`MetricsScraper.warnings`), and the run has no server metrics.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import subprocess
import tempfile
import threading
import time
import typing
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import orjson
import pandas as pd

from ..redact import redact_text
from .http_route import NetworkPolicy
from .http_stream import MAX_GET_BYTES
from .metrics_reader import MAX_LABEL_SETS, STOP, ReaderConfig, reader_command

RAW_COLUMNS = ("time_s", "name", "labels", "value")  # labels: the sample's labels as a JSON object, keys sorted
SERIES_COLUMNS = ("time_s", "metric", "value")
PEAK_KV_CACHE_USAGE = "peak_kv_cache_usage"  # run_summary's one key beyond the unified set's
# How each server kind turns its metrics on, for the line that says a page could not be read.
METRICS_SWITCHES = {
    "lmdeploy": "LMDeploy's api_server serves them unless started with --disable-metrics",
    "sglang": "SGLang serves them only when started with --enable-metrics",
}

MAX_PAGE_BYTES = MAX_GET_BYTES  # a read of a longer page fails
READER_START_S = 5.0  # for the reader's interpreter to start, on a busy machine: part of each wait for a read
CANCEL_POLL_S = 0.05  # how often the wait for the first read looks at the run's cancel
Read = Mapping[str, list[float]]  # one read of the page: sample name -> its values, one per label set


@dataclass(frozen=True)
class _Named:
    """A source read from one sample name: the first of `names` (one per server) the page has."""

    names: tuple[str, ...]

    def present(self, read: Read) -> str | None:
        return next((name for name in self.names if name in read), None)


@dataclass(frozen=True)
class Gauge(_Named):
    """A gauge as it stands at the read; `mean` for a fraction (several engines' usage), else their sum."""

    mean: bool = False

    def value(self, now: Read, before: Read | None, seconds: float) -> float | None:
        name = self.present(now)
        if name is None:
            return None
        values = now[name]
        return float(np.mean(values) if self.mean else np.sum(values))


@dataclass(frozen=True)
class CounterRate(_Named):
    """A counter's growth per second since the previous read."""

    def value(self, now: Read, before: Read | None, seconds: float) -> float | None:
        name = self.present(now)
        grown = None if name is None else _growth(name, now, before)
        return None if grown is None or seconds <= 0 else grown / seconds


@dataclass(frozen=True)
class CounterRatio:
    """The growth of one counter over another's since the previous read, plus `plus` (None while the second
    did not grow): vLLM's prefix hits over queries, accepted draft tokens over drafts (+1, the bonus token). With
    `of_sum` the second counts the rest, not the whole: the ratio is over both (llama.cpp's prompt tokens leave out
    the cached ones)."""

    pairs: tuple[tuple[str, str], ...]
    plus: float = 0.0
    of_sum: bool = False

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for pair in self.pairs for name in pair)

    def present(self, read: Read) -> tuple[str, str] | None:
        return next((pair for pair in self.pairs if pair[0] in read and pair[1] in read), None)

    def value(self, now: Read, before: Read | None, seconds: float) -> float | None:
        pair = self.present(now)
        if pair is None:
            return None
        numerator, denominator = pair
        over, grown = _growth(denominator, now, before), _growth(numerator, now, before)
        if over is not None and grown is not None and self.of_sum:
            over += grown
        if not over:
            return None
        return None if grown is None else grown / over + self.plus


@dataclass(frozen=True)
class HistogramMean:
    """The mean of what a histogram observed since the previous read (None when it observed nothing)."""

    families: tuple[str, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f"{family}_{part}" for family in self.families for part in ("sum", "count"))

    def present(self, read: Read) -> str | None:
        return next((family for family in self.families if f"{family}_sum" in read and f"{family}_count" in read), None)

    def value(self, now: Read, before: Read | None, seconds: float) -> float | None:
        family = self.present(now)
        observed = _growth(f"{family}_count", now, before)
        if not observed:
            return None
        total = _growth(f"{family}_sum", now, before)
        return None if total is None else total / observed


Source = Gauge | CounterRate | CounterRatio | HistogramMean


def _growth(name: str, now: Read, before: Read | None) -> float | None:
    """How much a counter grew between two reads; None without a previous read or after a reset (it fell)."""
    if before is None or name not in before:
        return None
    grown = float(np.sum(now[name]) - np.sum(before[name]))
    return grown if grown >= 0 else None


@dataclass(frozen=True)
class ServerMetric:
    """One quantity of the unified set, in the unit its key or label says: its key, its words, and the servers' names
    it is read from."""

    key: str
    label: str
    sources: tuple[Source, ...]

    def value(self, now: Read, before: Read | None, seconds: float) -> float | None:
        """Its value at the read `now` (`seconds` after `before`); None where the page lacks it or it is undefined."""
        source = next((source for source in self.sources if source.present(now) is not None), None)
        return None if source is None else source.value(now, before, seconds)


def _histogram(stem: str, sglang_stem: str = "") -> HistogramMean:
    return HistogramMean((f"lmdeploy:{stem}", f"vllm:{stem}", f"sglang:{sglang_stem or stem}"))


SERVER_METRICS = (
    ServerMetric(
        "running",
        "Running requests",
        (
            Gauge(
                (
                    "lmdeploy:num_requests_running",
                    "vllm:num_requests_running",
                    "sglang:num_running_reqs",
                    "llamacpp:requests_processing",
                )
            ),
        ),
    ),
    ServerMetric(
        "waiting",
        "Waiting requests",
        (
            Gauge(
                (
                    "lmdeploy:num_requests_waiting",
                    "vllm:num_requests_waiting",
                    "sglang:num_queue_reqs",
                    "llamacpp:requests_deferred",
                )
            ),
        ),
    ),
    # vLLM renamed gpu_cache_usage_perc kv_cache_usage_perc; SGLang's token_usage is the share of its KV pool in use;
    # llama.cpp's kv_cache_usage_ratio is in older builds only.
    ServerMetric(
        "kv_cache_usage",
        "KV-cache usage",
        (
            Gauge(
                (
                    "lmdeploy:gpu_cache_usage_perc",
                    "vllm:kv_cache_usage_perc",
                    "vllm:gpu_cache_usage_perc",
                    "sglang:token_usage",
                    "llamacpp:kv_cache_usage_ratio",
                ),
                mean=True,
            ),
        ),
    ),
    # vLLM counts prefix-cache queries and hits in tokens; llama.cpp the cached prompt tokens and the others (its
    # prompt_tokens_total leaves the cached out); LMDeploy and SGLang serve the rate itself.
    ServerMetric(
        "prefix_hit_rate",
        "Prefix-cache hit rate",
        (
            CounterRatio((("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"),)),
            CounterRatio((("llamacpp:prompt_tokens_cached_total", "llamacpp:prompt_tokens_total"),), of_sum=True),
            Gauge(("lmdeploy:prefix_cache_hit_rate", "sglang:cache_hit_rate"), mean=True),
        ),
    ),
    ServerMetric(
        "cached_tokens_per_s",
        "Cached prompt tokens per second",
        (
            CounterRate(
                (
                    "lmdeploy:cached_tokens_total",
                    "sglang:cached_tokens_total",
                    "vllm:prefix_cache_hits_total",
                    "llamacpp:prompt_tokens_cached_total",
                )
            ),
        ),
    ),
    # The server's own token counts: vLLM, SGLang and LMDeploy count every prompt token, llama.cpp only those it
    # processed (the cached ones are cached_tokens_per_s).
    ServerMetric(
        "prompt_tokens_per_s",
        "Prompt tokens per second",
        (
            CounterRate(
                (
                    "lmdeploy:prompt_tokens_total",
                    "vllm:prompt_tokens_total",
                    "sglang:prompt_tokens_total",
                    "llamacpp:prompt_tokens_total",
                )
            ),
        ),
    ),
    ServerMetric(
        "generation_tokens_per_s",
        "Generated tokens per second",
        (
            CounterRate(
                (
                    "lmdeploy:generation_tokens_total",
                    "vllm:generation_tokens_total",
                    "sglang:generation_tokens_total",
                    "llamacpp:tokens_predicted_total",
                )
            ),
        ),
    ),
    # Tokens a verification step yields: the accepted draft tokens per draft, plus the target model's own token.
    ServerMetric(
        "spec_accept_length",
        "Speculative acceptance length",
        (
            CounterRatio(
                (
                    ("lmdeploy:spec_decode_num_accepted_tokens_total", "lmdeploy:spec_decode_num_drafts_total"),
                    ("vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_drafts_total"),
                ),
                plus=1.0,
            ),
            Gauge(("sglang:spec_accept_length",), mean=True),
        ),
    ),
    ServerMetric(
        "spec_accept_rate",
        "Speculative acceptance rate",
        (
            CounterRatio(
                (
                    ("lmdeploy:spec_decode_num_accepted_tokens_total", "lmdeploy:spec_decode_num_draft_tokens_total"),
                    ("vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_draft_tokens_total"),
                )
            ),
            Gauge(("sglang:spec_accept_rate",), mean=True),
        ),
    ),
    ServerMetric("server_ttft_s", "Server TTFT", (_histogram("time_to_first_token_seconds"),)),
    ServerMetric(
        "server_queue_s", "Server queue time", (_histogram("request_queue_time_seconds", "queue_time_seconds"),)
    ),
    ServerMetric("server_e2e_s", "Server end-to-end latency", (_histogram("e2e_request_latency_seconds"),)),
)
BY_KEY = {metric.key: metric for metric in SERVER_METRICS}
# The accepted draft tokens counted per draft position (label "position", from 0), over the drafts that counter
# belongs with: LMDeploy's and vLLM's. SGLang's /metrics has no per-position counter, only its mean gauges above.
PER_POSITION_COUNTERS = (
    ("lmdeploy:spec_decode_num_accepted_tokens_per_pos_total", "lmdeploy:spec_decode_num_drafts_total"),
    ("vllm:spec_decode_num_accepted_tokens_per_pos_total", "vllm:spec_decode_num_drafts_total"),
)
SPEC_ACCEPT_BY_POSITION = "spec_accept_by_position"  # run_summary's key: the rates of positions 1..k, in order
KNOWN_NAMES = frozenset(
    {name for metric in SERVER_METRICS for source in metric.sources for name in source.names}
    | {name for pair in PER_POSITION_COUNTERS for name in pair}
)


# ---- pure: a page's text, the raw table, the unified series -------------------------------------------------


def raw_frame(rows: Iterable[tuple[float, str, str, float]]) -> pd.DataFrame:
    """Raw samples as a table with fixed column types (the parquet file's schema)."""
    frame = pd.DataFrame.from_records(list(rows), columns=list(RAW_COLUMNS))
    return frame.astype({"time_s": "float64", "name": "string", "labels": "string", "value": "float64"})


def read_rows(time_s: float, now: Read, before: tuple[float, Read] | None) -> list[tuple[float, str, float]]:
    """The unified quantities at one read, as (time_s, metric key, value) rows; undefined ones are left out."""
    seconds = time_s - before[0] if before is not None else 0.0
    previous = before[1] if before is not None else None
    rows = []
    for metric in SERVER_METRICS:
        value = metric.value(now, previous, seconds)
        if value is not None and np.isfinite(value):
            rows.append((time_s, metric.key, value))
    return rows


def series_frame(rows: Iterable[tuple[float, str, float]]) -> pd.DataFrame:
    frame = pd.DataFrame.from_records(list(rows), columns=list(SERIES_COLUMNS))
    return frame.astype({"time_s": "float64", "metric": "string", "value": "float64"})


def unified_series(raw: pd.DataFrame) -> pd.DataFrame:
    """The unified quantities over a run from its raw samples (`RAW_COLUMNS`): one row per quantity and read."""
    rows: list[tuple[float, str, float]] = []
    before: tuple[float, Read] | None = None
    for time_s, now in _reads(raw):
        rows.extend(read_rows(time_s, now, before))
        before = (time_s, now)
    return series_frame(rows)


def _reads(raw: pd.DataFrame) -> list[tuple[float, Read]]:
    """The raw samples as the reads they came from, in time order."""
    return [
        (float(time_s), {str(name): list(part["value"]) for name, part in read.groupby("name", sort=False)})
        for time_s, read in raw.groupby("time_s", sort=True)
    ]


def acceptance_by_position(raw: pd.DataFrame) -> list[float] | None:
    """The acceptance rate of each draft position 1..k over the run: the growth of its accepted-tokens counter from
    the first read to the last over the drafts' growth. None where the server has no per-position counter, drafted
    nothing over the run, or a counter was reset (fell)."""
    if raw["time_s"].nunique() < 2:
        return None
    first, last = raw[raw["time_s"] == raw["time_s"].min()], raw[raw["time_s"] == raw["time_s"].max()]
    for accepted_name, drafts_name in PER_POSITION_COUNTERS:
        accepted_then, accepted_now = _by_position(first, accepted_name), _by_position(last, accepted_name)
        drafts_then, drafts_now = (read.loc[read["name"] == drafts_name, "value"] for read in (first, last))
        if not accepted_now or drafts_then.empty or drafts_now.empty:
            continue
        drafts = float(drafts_now.sum() - drafts_then.sum())
        grown = [accepted_now[position] - accepted_then.get(position, 0.0) for position in sorted(accepted_now)]
        return [accepted / drafts for accepted in grown] if drafts > 0 and min(grown) >= 0 else None
    return None


def _by_position(read: pd.DataFrame, name: str) -> dict[int, float]:
    """A per-position counter at one read, summed over its other labels (engines, models), by position."""
    counted: dict[int, float] = {}
    for labels, value in read.loc[read["name"] == name, ["labels", "value"]].itertuples(index=False):
        position = str(orjson.loads(labels).get("position", ""))
        if position.isdigit():
            counted[int(position)] = counted.get(int(position), 0.0) + float(value)
    return counted


def run_summary(raw: pd.DataFrame) -> dict[str, typing.Any]:
    """The run's figures from its raw samples (`RAW_COLUMNS`), by unified key: a counter's or histogram's quantity
    over the whole run (from the first read, taken before the clock started, to the last, after it ended), a
    gauge's as the mean of the reads after that first one; the peak KV-cache usage; and the acceptance rate per
    draft position (`SPEC_ACCEPT_BY_POSITION`, a list). A quantity the server did not serve is left out."""
    reads = _reads(raw)
    if not reads:
        return {}
    (first_s, first), (last_s, last) = reads[0], reads[-1]
    series = unified_series(raw)
    if len(reads) > 1:
        series = series[series["time_s"] > first_s]
    summary: dict[str, typing.Any] = {}
    for metric in SERVER_METRICS:
        source = next((source for source in metric.sources if source.present(last) is not None), None)
        if isinstance(source, Gauge):
            values = series.loc[series["metric"] == metric.key, "value"]
            value = float(values.mean()) if len(values) else None
        else:
            value = metric.value(last, first, last_s - first_s) if source is not None and len(reads) > 1 else None
        if value is not None and np.isfinite(value):
            summary[metric.key] = value
    usage = series.loc[series["metric"] == "kv_cache_usage", "value"]
    if len(usage):
        summary[PEAK_KV_CACHE_USAGE] = float(usage.max())
    if (by_position := acceptance_by_position(raw)) is not None:
        summary[SPEC_ACCEPT_BY_POSITION] = by_position
    return summary


# ---- the scraper ------------------------------------------------------------------------------------------


class MetricsScraper:
    """Reads `url` every `interval_s` seconds from `start()` to `stop()` in a reader process (`metrics_reader`), each
    read within `read_timeout_s(interval_s)` and `MAX_PAGE_BYTES`; times are on the run's clock
    (`time.perf_counter`), each the middle of its GET. A read that fails mid-run is skipped and counted
    (`failed_reads`, `last_failure`); a name with more label sets than a read keeps is left out of that read
    and counted (`crowded`). `warnings` says all of it once the scraper has stopped."""

    def __init__(
        self,
        url: str,
        interval_s: float,
        headers: Mapping[str, str] | None = None,
        network: NetworkPolicy = NetworkPolicy(),  # noqa: B008 (frozen)
        switch: str = "",
    ) -> None:
        """`headers`: sent with every GET (the API key's; they reach the reader on its stdin); `switch`: how the
        server turns its metrics on (`METRICS_SWITCHES`), said when the page cannot be read."""
        self.url = url
        self._shown = redact_text(url)
        self._switch = switch
        self._timeout_s = read_timeout_s(interval_s)
        self._stop_wait_s = 2 * self._timeout_s + READER_START_S  # a read in progress, then the last one
        self._config = ReaderConfig(
            url=_without_user_info(url),
            headers=dict(headers or {}),
            interval_s=interval_s,
            timeout_s=self._timeout_s,
            max_bytes=MAX_PAGE_BYTES,
            names=sorted(KNOWN_NAMES),
            network=dataclasses.asdict(network),
        )
        self._raw: list[tuple[float, str, str, float]] = []
        self._series: list[tuple[float, str, float]] = []
        self._before: tuple[float, Read] | None = None
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None
        self._listener: threading.Thread | None = None
        self._errors: typing.IO[bytes] | None = None  # the reader's stderr
        self._reads = 0  # outcomes heard from the reader, failures included
        self._first_heard = threading.Event()  # the first read's outcome has come, or the reader has ended
        self.failed_reads = 0
        self.last_failure = ""
        self.crowded: dict[str, int] = {}  # name -> the reads it was left out of
        # Why the run has no server metrics: its first read could not be made or found none of our names.
        self.unavailable: str | None = None

    def start(self) -> None:
        """Start the reader process, which reads the page at once and then every interval; returns at once (what
        the first read found is told by `warnings` after `stop()`)."""
        # Its stderr goes to a file, read only if it fails: a pipe nobody drains could fill and stall it.
        self._errors = tempfile.TemporaryFile()
        try:
            self._process = subprocess.Popen(
                reader_command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._errors
            )
        except OSError as exc:  # out of processes or file descriptors: the run goes on without its server's metrics
            self.unavailable = (
                f"No server metrics for this run: the process to read {self._shown} did not start ({exc})."
            )
            self._errors.close()
            self._first_heard.set()
            return
        assert self._process.stdin is not None, "a pipe"
        self._process.stdin.write(self._config.to_line())
        self._process.stdin.flush()
        self._listener = threading.Thread(target=self._listen, name="server-metrics", daemon=True)
        self._listener.start()

    def wait_for_first_read(self, cancel: threading.Event) -> None:
        """Until the first read's outcome has come, at most the reader's start-up and one read timeout (a page
        that comes slower is a failed read: its metrics are lost, the wait ends), or until `cancel` is set."""
        deadline = time.monotonic() + READER_START_S + self._timeout_s
        while not self._first_heard.wait(CANCEL_POLL_S):
            if cancel.is_set() or time.monotonic() > deadline:
                return

    def stop(self) -> pd.DataFrame | None:
        """Stop reading, after the reader's last read, and return the raw samples; None when the run has none
        (`unavailable` says why, unless Ctrl-C came before the first read). A read in progress and the last one
        each end within the read timeout: a reader that has not ended by then (and its start-up) is killed."""
        process, listener = self._process, self._listener
        if process is not None and listener is not None:
            self._process = self._listener = None
            assert process.stdin is not None and self._errors is not None, "started with both"
            # It may have ended already (its first read found nothing, or Ctrl-C reached it): then the pipe is broken.
            with contextlib.suppress(BrokenPipeError):
                process.stdin.write(f"{STOP}\n".encode())
                process.stdin.flush()
            listener.join(self._stop_wait_s)
            if listener.is_alive():
                process.kill()
                listener.join()
            with contextlib.suppress(BrokenPipeError):  # what the broken pipe kept buffered is dropped
                process.stdin.close()
            self._ended(process.wait())
            self._errors.close()
        return None if self.unavailable or not self._raw else self.raw()

    @property
    def warnings(self) -> list[str]:
        """What the run should say about its server metrics, each a sentence (after `stop()`)."""
        if self.unavailable:
            return [self.unavailable]
        said = []
        if self.failed_reads:
            said.append(
                f"{self.failed_reads} reads of the server's /metrics failed, so the server metrics have gaps (the "
                f"last: {redact_text(self.last_failure)})."
            )
        for name, reads in self.crowded.items():
            lost = " or ".join(metric.label for metric in SERVER_METRICS if _reads_name(metric, name))
            lost = lost or "acceptance by draft position"  # the per-position counters belong to no unified quantity
            said.append(
                f"The server's /metrics has more than {MAX_LABEL_SETS:,} label sets of {name} (more than are read of "
                f"one name), so it was left out of {reads} of {self._reads} reads: no {lost} from it."
            )
        return said

    def raw(self) -> pd.DataFrame:
        with self._lock:
            return raw_frame(self._raw)

    def series(self) -> pd.DataFrame:
        """The unified quantities so far (safe to call while reading)."""
        with self._lock:
            return series_frame(self._series)

    def _listen(self) -> None:
        try:
            process = self._process
            assert process is not None and process.stdout is not None, "started with a pipe"
            for line in process.stdout:
                self._take(orjson.loads(line))
                self._first_heard.set()
        finally:
            self._first_heard.set()

    def _take(self, outcome: dict) -> None:
        """One read as the reader told it (`metrics_reader`'s docstring lists the lines)."""
        first = self._reads == 0
        self._reads += 1
        failure = outcome.get("unreachable") or outcome.get("unreadable")
        if failure is not None:
            if first:
                switch = f" ({self._switch})" if self._switch and "unreachable" in outcome else ""
                self.unavailable = f"No server metrics for this run: {redact_text(failure).rstrip('.')}{switch}."
            else:
                self.failed_reads += 1
                self.last_failure = failure
            return
        for name in outcome["crowded"]:
            self.crowded[name] = self.crowded.get(name, 0) + 1
        samples = [(name, labels, float(value)) for name, labels, value in outcome["samples"]]
        if first and not samples and not self.crowded:
            self.unavailable = (
                f"No server metrics for this run: {self._shown} has none of the LMDeploy, vLLM, SGLang or llama.cpp "
                "metrics read here (running and waiting requests, KV-cache usage, ...)."
            )
        if not samples:
            return
        now_s = outcome["time_s"]
        read: dict[str, list[float]] = {}
        for name, _, value in samples:
            read.setdefault(name, []).append(value)
        rows = read_rows(now_s, read, self._before)
        with self._lock:
            self._raw.extend((now_s, name, labels, value) for name, labels, value in samples)
            self._series.extend(rows)
            self._before = (now_s, read)

    def _ended(self, code: int) -> None:
        """The reader has ended with exit status `code`: a failure unless it left as asked, or was interrupted with
        the rest of its process group (Ctrl-C: the run is being interrupted, nothing to say about its metrics)."""
        if code == -signal.SIGINT or (code == 0 and self._reads):
            return
        if code == -signal.SIGKILL:
            failure = f"a read of {self._shown} did not end within {self._stop_wait_s:g} s"
        else:
            assert self._errors is not None, "kept until the reader has ended"
            self._errors.seek(0)
            said = self._errors.read().decode(errors="replace").strip().splitlines()
            failure = (
                f"the process reading {self._shown} ended with exit status {code}{': ' + said[-1] if said else ''}"
            )
        if self._reads == 0:
            self.unavailable = f"No server metrics for this run: {redact_text(failure)}."
        else:
            self.failed_reads += 1
            self.last_failure = failure


def read_timeout_s(interval_s: float) -> float:
    """How long one read of the page may take, whole: the interval, within 1 to 5 s."""
    return max(1.0, min(interval_s, 5.0))


def _reads_name(metric: ServerMetric, name: str) -> bool:
    return any(name in source.names for source in metric.sources)


def _without_user_info(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()
