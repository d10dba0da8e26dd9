"""The server's own Prometheus metrics during a run: read at an interval, kept raw, and seen as one set.

LMDeploy's api_server (`lmdeploy/metrics/loggers.py`), vLLM and SGLang serve Prometheus text at GET /metrics,
each under its own names. `SERVER_METRICS` maps them onto one set: running and waiting requests, KV-cache
usage, the prefix-cache hit rate, cached prompt tokens, the speculative acceptance length and the server-side
TTFT, queue and end-to-end times. A quantity is read from the first of its sources the page has: a gauge as
it stands (summed over label sets for counts, averaged for fractions), a counter as its change per second or a
ratio of two counters' changes, a histogram as the mean of what it observed since the previous read
(the change of its `_sum` over the change of its `_count`). So every derived value belongs to the interval
that ends at its read, on the same clock as the run's ticks.

`MetricsScraper` reads the page in a daemon thread (`prometheus_client`'s text parser reads it). The raw
samples it keeps are those of the names the mapping reads (not the histograms' buckets), one row per name and
label set per read (`RAW_COLUMNS`): what the run folder stores. A server without /metrics, or whose page
has none of these names, is told in one sentence (`MetricsScraper.start`) and nothing is scraped.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..errors import BenchError
from ..redact import redact_text

RAW_COLUMNS = ("time_s", "name", "labels", "value")  # labels: the sample's labels as a JSON object, keys sorted
SERIES_COLUMNS = ("time_s", "metric", "value")
PEAK_KV_CACHE_USAGE = "peak_kv_cache_usage"  # run_summary's one key beyond the unified set's
# How each server kind turns its metrics on, for the line that says a page could not be read.
METRICS_SWITCHES = {
    "lmdeploy": "LMDeploy's api_server serves them unless started with --disable-metrics",
    "sglang": "SGLang serves them only when started with --enable-metrics",
}

PARSER_MESSAGE_CHARS = 120  # the parser quotes the line it choked on: an HTML page's, perhaps
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
        values = now[self.present(now)]
        return float(np.mean(values) if self.mean else np.sum(values))


@dataclass(frozen=True)
class CounterRate(_Named):
    """A counter's growth per second since the previous read."""

    def value(self, now: Read, before: Read | None, seconds: float) -> float | None:
        grown = _growth(self.present(now), now, before)
        return None if grown is None or seconds <= 0 else grown / seconds


@dataclass(frozen=True)
class CounterRatio:
    """The growth of one counter over another's since the previous read, plus `plus` (None while the second
    did not grow): vLLM's prefix hits over queries, accepted draft tokens over drafts (+1, the bonus token)."""

    pairs: tuple[tuple[str, str], ...]
    plus: float = 0.0

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for pair in self.pairs for name in pair)

    def present(self, read: Read) -> tuple[str, str] | None:
        return next((pair for pair in self.pairs if pair[0] in read and pair[1] in read), None)

    def value(self, now: Read, before: Read | None, seconds: float) -> float | None:
        numerator, denominator = self.present(now)
        over = _growth(denominator, now, before)
        if not over:
            return None
        grown = _growth(numerator, now, before)
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
        (Gauge(("lmdeploy:num_requests_running", "vllm:num_requests_running", "sglang:num_running_reqs")),),
    ),
    ServerMetric(
        "waiting",
        "Waiting requests",
        (Gauge(("lmdeploy:num_requests_waiting", "vllm:num_requests_waiting", "sglang:num_queue_reqs")),),
    ),
    # vLLM renamed gpu_cache_usage_perc kv_cache_usage_perc; SGLang's token_usage is the share of its KV pool in use.
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
                ),
                mean=True,
            ),
        ),
    ),
    # vLLM counts prefix-cache queries and hits in tokens; LMDeploy and SGLang serve the rate itself.
    ServerMetric(
        "prefix_hit_rate",
        "Prefix-cache hit rate",
        (
            CounterRatio((("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"),)),
            Gauge(("lmdeploy:prefix_cache_hit_rate", "sglang:cache_hit_rate"), mean=True),
        ),
    ),
    ServerMetric(
        "cached_tokens_per_s",
        "Cached prompt tokens per second",
        (CounterRate(("lmdeploy:cached_tokens_total", "sglang:cached_tokens_total", "vllm:prefix_cache_hits_total")),),
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
    ServerMetric("server_ttft_s", "Server TTFT", (_histogram("time_to_first_token_seconds"),)),
    ServerMetric(
        "server_queue_s", "Server queue time", (_histogram("request_queue_time_seconds", "queue_time_seconds"),)
    ),
    ServerMetric("server_e2e_s", "Server end-to-end latency", (_histogram("e2e_request_latency_seconds"),)),
)
BY_KEY = {metric.key: metric for metric in SERVER_METRICS}
KNOWN_NAMES = frozenset(name for metric in SERVER_METRICS for source in metric.sources for name in source.names)


# ---- pure: a page's text, the raw table, the unified series -------------------------------------------------


def parse_page(text: str) -> list[tuple[str, str, float]]:
    """(sample name, labels as JSON, value) of every sample on a Prometheus text page; ValueError when the text
    is not one."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        return [
            (sample.name, json.dumps(sample.labels, sort_keys=True), float(sample.value))
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        ]
    except Exception as exc:  # the parser raises ValueError, TypeError or IndexError on a malformed line
        raise ValueError(f"not Prometheus text ({str(exc)[:PARSER_MESSAGE_CHARS]})") from None


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


def run_summary(raw: pd.DataFrame) -> dict[str, float]:
    """The run's figures from its raw samples (`RAW_COLUMNS`), by unified key: a counter's or histogram's quantity
    over the whole run (from the first read, taken before the clock started, to the last, after it ended), a
    gauge's as the mean of the reads after that first one; and the peak KV-cache usage. A quantity the server did
    not serve is left out."""
    reads = _reads(raw)
    if not reads:
        return {}
    (first_s, first), (last_s, last) = reads[0], reads[-1]
    series = unified_series(raw)
    if len(reads) > 1:
        series = series[series["time_s"] > first_s]
    summary: dict[str, float] = {}
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
    return summary


# ---- the scraper ------------------------------------------------------------------------------------------


class MetricsScraper:
    """Reads `url` every `interval_s` seconds in a daemon thread, from `start()` to `stop()`; times are on the
    run's clock (`time.perf_counter`), each the middle of its request. A read that fails mid-run is skipped and
    counted (`failed_reads`, `last_failure`)."""

    def __init__(
        self,
        url: str,
        interval_s: float,
        fetch: Callable[[str, float], bytes],
        switch: str = "",
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        """`fetch(url, timeout_s)`: the page's bytes, BenchError when it cannot be read; `switch`: how the server
        turns its metrics on (`METRICS_SWITCHES`), said when the page cannot be read."""
        self.url = url
        self._switch = switch
        self._interval_s = interval_s
        self._fetch = fetch
        self._clock = clock
        self._raw: list[tuple[float, str, str, float]] = []
        self._series: list[tuple[float, str, float]] = []
        self._before: tuple[float, Read] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.failed_reads = 0
        self.last_failure = ""

    def start(self) -> str | None:
        """Read the page once, then go on reading in the background; or, when the page cannot be read or has no
        name the mapping knows, the sentence that says so (and nothing is scraped)."""
        shown = redact_text(self.url)
        try:
            self._read()
        except BenchError as exc:
            switch = f" ({self._switch})" if self._switch else ""
            return f"No server metrics for this run: {redact_text(str(exc)).rstrip('.')}{switch}."
        except ValueError as exc:
            return f"No server metrics for this run: {shown} is {exc}."
        if not self._raw:
            return (
                f"No server metrics for this run: {shown} has none of the LMDeploy, vLLM or SGLang metrics "
                "read here (running and waiting requests, KV-cache usage, ...)."
            )
        self._thread = threading.Thread(target=self._loop, name="server-metrics", daemon=True)
        self._thread.start()
        return None

    def stop(self) -> pd.DataFrame:
        """Stop reading (after one last read) and return the raw samples."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
            self._read_or_count()
        return self.raw()

    def raw(self) -> pd.DataFrame:
        with self._lock:
            return raw_frame(self._raw)

    def series(self) -> pd.DataFrame:
        """The unified quantities so far (safe to call while reading)."""
        with self._lock:
            return series_frame(self._series)

    def _loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            self._read_or_count()

    def _read_or_count(self) -> None:
        try:
            self._read()
        except (BenchError, ValueError) as exc:
            self.failed_reads += 1
            self.last_failure = str(exc)

    def _read(self) -> None:
        sent = self._clock()
        page = self._fetch(self.url, max(1.0, min(self._interval_s, 5.0)))
        now_s = (sent + self._clock()) / 2
        samples = [row for row in parse_page(page.decode("utf-8", errors="replace")) if row[0] in KNOWN_NAMES]
        if not samples:
            return
        read: dict[str, list[float]] = {}
        for name, _, value in samples:
            read.setdefault(name, []).append(value)
        rows = read_rows(now_s, read, self._before)
        with self._lock:
            self._raw.extend((now_s, name, labels, value) for name, labels, value in samples)
            self._series.extend(rows)
            self._before = (now_s, read)
