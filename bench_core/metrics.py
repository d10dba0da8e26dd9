"""Every benchmark metric, defined once, and the pure functions that compute them.

Definitions follow `lmdeploy/profiler.py` for the names it shares (see DESIGN.md, Metrics), so the
same ticks give the same numbers. Everything here is vectorised and does no I/O: the Profiler calls
these functions on its ticks, and the dashboard calls `run_summary` on a stored per-request table to
recompute statistics or goodput for new SLO thresholds without re-running anything.

Times are seconds everywhere; the summary dict converts latencies to milliseconds in its key names.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .arrivals import achieved_rate, in_flight_over_time
from .config import SLO


@dataclass(frozen=True)
class MetricSpec:
    """How a metric is named, measured and compared; views read these to label and colour."""

    key: str
    label: str
    unit: str
    larger_is_better: bool
    definition: str
    display_unit: str = ""
    display_scale: float = 1.0


_SPECS = (
    MetricSpec("e2e", "End-to-end latency", "s", False,
               "ts[-1] - ts[0]: from the request's start tick to its last tick; for a server, to the last "
               "chunk with output (vLLM's convention).", "ms", 1000.0),
    MetricSpec("ttft", "Time to first token", "s", False,
               "ts[1] - ts[0]: from the start tick to the first response chunk (streaming only).", "ms", 1000.0),
    MetricSpec("tpot", "Time per output token", "s", False,
               "(ts[-1] - ts[1]) / (ns[-1] - ns[1]); when the first chunk carried every token, "
               "(ts[-1] - ts[0]) / (ns[-1] - ns[0]), which includes the prefill. For a server, to the last "
               "chunk with output (vLLM's convention).", "ms", 1000.0),
    MetricSpec("itl", "Inter-token latency", "s", False,
               "Every gap between ticks after the first chunk (streaming only); a server's ticks are "
               "its SSE events.", "ms", 1000.0),
    MetricSpec("e2e_last_line", "End-to-end latency to the last line", "s", False,
               "From sending a request to the last line of its stream (the usage chunk or [DONE]): "
               "profile_restful_api.py's E2E (HTTP servers only).", "ms", 1000.0),
    MetricSpec("tpot_last_line", "Time per output token to the last line", "s", False,
               "(E2E to the last line - TTFT) / (output tokens - 1), for requests of 2 tokens or more: "
               "profile_restful_api.py's TPOT (HTTP servers only).", "ms", 1000.0),
    MetricSpec("tokens_per_tick", "Tokens per tick", "tokens", True,
               "Output tokens per response chunk (streaming only)."),
    MetricSpec("request_throughput", "Request throughput", "req/s", True,
               "Completed requests / benchmark duration."),
    MetricSpec("input_throughput", "Input throughput", "tok/s", True,
               "Prompt tokens of completed requests / benchmark duration."),
    MetricSpec("output_throughput", "Output throughput", "tok/s", True,
               "Output tokens of completed requests / benchmark duration."),
    MetricSpec("goodput", "Goodput", "req/s", True,
               "Completed requests meeting every set SLO threshold / benchmark duration."),
    MetricSpec("duration", "Benchmark duration", "s", False, "From Profiler.start() to Profiler.finish()."),
)
METRICS: dict[str, MetricSpec] = {spec.key: spec for spec in _SPECS}
LATENCY_METRICS = ("e2e", "ttft", "tpot", "itl")
STREAM_ONLY_METRICS = ("ttft", "itl", "tokens_per_tick")

# Request statuses in the per-request table.
SUCCESS = "success"  # finished successfully with at least the requested number of tokens
INCOMPLETE = "incomplete"  # finished successfully but with fewer tokens than requested
FAILED = "failed"
UNFINISHED = "unfinished"  # never finished: still running, or never sent (a duration ended)
CANCELLED = "cancelled"  # stopped by the user's cancel, running or waiting: not an engine failure
STATUSES = (SUCCESS, FAILED, INCOMPLETE, UNFINISHED, CANCELLED)


@dataclass(frozen=True)
class Distribution:
    """Statistics of one metric's values; every field is NaN when there were no values."""

    count: int
    mean: float
    std: float
    min: float
    max: float
    percentiles: tuple[float, ...]


def distribution(values: np.ndarray | Sequence[float], percentiles: Sequence[float]) -> Distribution:
    """Mean and percentiles exactly as LMDeploy computes them (np.mean, np.percentile), plus std/min/max."""
    values = np.asarray(values)
    if values.size == 0:
        nan = math.nan
        return Distribution(0, nan, nan, nan, nan, tuple(nan for _ in percentiles))
    return Distribution(
        count=int(values.size),
        mean=np.mean(values),
        std=np.std(values),
        min=values.min(),
        max=values.max(),
        percentiles=tuple(np.percentile(values, list(percentiles))),
    )


def rate(count: float, duration_s: float) -> float:
    """count / duration, or NaN when the duration is not a positive number."""
    if not duration_s > 0:
        return math.nan
    return count / duration_s


@dataclass(frozen=True)
class RequestMetrics:
    """Per-request metrics of many requests, from their ticks; NaN where a metric is undefined.

    Value series (`itl_s`, `tokens_per_tick`) are flat over all requests in request order;
    `itl_counts` / `tokens_per_tick_counts` say how many values belong to each request.
    """

    n_ticks: np.ndarray
    output_len: np.ndarray
    ttft_s: np.ndarray
    tpot_s: np.ndarray
    e2e_s: np.ndarray
    itl_s: np.ndarray
    itl_counts: np.ndarray
    tokens_per_tick: np.ndarray
    tokens_per_tick_counts: np.ndarray

    def itl_per_request(self) -> list[np.ndarray]:
        return _per_request(self.itl_s, self.itl_counts)

    def tokens_per_tick_per_request(self) -> list[np.ndarray]:
        return _per_request(self.tokens_per_tick, self.tokens_per_tick_counts)


def _per_request(flat: np.ndarray, counts: np.ndarray) -> list[np.ndarray]:
    return np.split(flat, np.cumsum(counts)[:-1]) if len(counts) else []


def values_of(flat: np.ndarray, counts: np.ndarray, selected: np.ndarray) -> np.ndarray:
    """The values of a flat per-request series that belong to the selected requests, in order."""
    return flat[np.repeat(selected, counts)]


def request_metrics(ts: np.ndarray, ns: np.ndarray, n_ticks: np.ndarray) -> RequestMetrics:
    """Per-request TTFT, TPOT, E2E, ITL and tokens per tick, with LMDeploy's float operations.

    `ts` (float64 seconds) and `ns` (int64 cumulative tokens) hold every request's ticks back to
    back; request i owns the next `n_ticks[i]` of them. Undefined values, which crash LMDeploy,
    are NaN here: TTFT and E2E need two ticks, TPOT also needs a token generated.
    """
    n_ticks = np.asarray(n_ticks, dtype=np.int64)
    ts = np.asarray(ts, dtype=np.float64)
    ns = np.asarray(ns, dtype=np.int64)
    ends = np.cumsum(n_ticks)
    starts = ends - n_ticks
    has_tick = n_ticks >= 1
    has_two = n_ticks >= 2
    if ts.size == 0:  # keep the indexing below valid
        ts, ns = np.zeros(1), np.zeros(1, dtype=np.int64)
    first = np.where(has_tick, starts, 0)
    last = np.where(has_tick, ends - 1, 0)
    second = np.where(has_two, starts + 1, first)

    output_len = np.where(has_tick, ns[last], 0)
    e2e = np.where(has_two, ts[last] - ts[first], np.nan)
    ttft = np.where(has_two, ts[second] - ts[first], np.nan)
    # Tokens after the first chunk: time per token from it; otherwise (non-stream, or one chunk with
    # every token) LMDeploy falls back to the whole span, prefill included.
    after_first = ns[last] > ns[second]
    span = np.where(after_first, ts[last] - ts[second], ts[last] - ts[first])
    tokens = np.where(after_first, ns[last] - ns[second], ns[last] - ns[first])
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = span / tokens
    tpot = np.where(has_two & (tokens != 0), tpot, np.nan)

    total = int(ends[-1]) if len(ends) else 0
    gaps = np.diff(ts[:total])
    token_steps = np.diff(ns[:total])
    # A gap joining one request's last tick to the next request's first is no gap at all.
    within = np.ones(gaps.size, dtype=bool)
    boundaries = ends[has_tick] - 1
    within[boundaries[boundaries < gaps.size]] = False
    after_ttft = within.copy()
    after_ttft[starts[has_two]] = False  # the first gap of a request is its TTFT, not an ITL
    return RequestMetrics(
        n_ticks=n_ticks,
        output_len=output_len,
        ttft_s=ttft,
        tpot_s=tpot,
        e2e_s=e2e,
        itl_s=gaps[after_ttft],
        itl_counts=np.maximum(n_ticks - 2, 0),
        tokens_per_tick=token_steps[within],
        tokens_per_tick_counts=np.maximum(n_ticks - 1, 0),
    )


def request_status(
    finished: np.ndarray, succeeded: np.ndarray, output_len: np.ndarray, req_output_len: np.ndarray,
    cancelled: np.ndarray | None = None,
) -> np.ndarray:
    """One of STATUSES per request. Only SUCCESS requests count in LMDeploy's metrics."""
    full_length = np.asarray(output_len) >= np.asarray(req_output_len)
    cancelled = np.zeros(len(full_length), dtype=bool) if cancelled is None else np.asarray(cancelled)
    return np.select(
        [~np.asarray(finished), cancelled, ~np.asarray(succeeded), ~full_length],
        [UNFINISHED, CANCELLED, FAILED, INCOMPLETE],
        SUCCESS,
    ).astype(object)


def failure_reasons(status: np.ndarray, reason: np.ndarray) -> dict[str, int]:
    """Reason -> count over the requests that did not succeed (the status word when no reason was given);
    cancelled requests are left out: the user stopped them, nothing failed."""
    status = np.asarray(status, dtype=object)
    reason = np.asarray(reason, dtype=object)
    counts: dict[str, int] = {}
    unsuccessful = (status != SUCCESS) & (status != CANCELLED)
    for st, why in zip(status[unsuccessful], reason[unsuccessful]):
        label = str(why) if isinstance(why, str) and why else str(st)
        counts[label] = counts.get(label, 0) + 1
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def format_reasons(counts: dict[str, int]) -> str:
    return "; ".join(f"{reason}: {n}" for reason, n in counts.items())


def slo_is_set(slo: SLO | None) -> bool:
    return slo is not None and any(getattr(slo, name) is not None for name in ("ttft", "tpot", "e2e"))


def good_requests(status: np.ndarray, ttft_s: np.ndarray, tpot_s: np.ndarray, e2e_s: np.ndarray,
                  slo: SLO) -> np.ndarray:
    """Successful requests meeting every threshold the SLO sets, as in vLLM; undefined values fail."""
    good = np.asarray(status, dtype=object) == SUCCESS
    for threshold, values in ((slo.ttft, ttft_s), (slo.tpot, tpot_s), (slo.e2e, e2e_s)):
        if threshold is not None:
            good &= np.asarray(values, dtype=np.float64) <= threshold
    return good


def percentile_key(q: float) -> str:
    """'p50' for 50 or 50.0, 'p99.9' for 99.9: the history column spelling."""
    return f"p{int(q)}" if float(q).is_integer() else f"p{q}"


def latency_columns(name: str, values_s: np.ndarray, percentiles: Sequence[float]) -> dict[str, float]:
    """One latency metric's summary keys in ms: mean, std, min, max, then each percentile."""
    return distribution_columns(name, distribution(values_s, percentiles), percentiles)


def distribution_columns(name: str, stats: Distribution, percentiles: Sequence[float]) -> dict[str, float]:
    """`latency_columns` of statistics already computed (a live run's, from its bins)."""
    columns = {f"{stat}_{name}_ms": getattr(stats, stat) * 1000 for stat in ("mean", "std", "min", "max")}
    columns.update({f"{percentile_key(q)}_{name}_ms": value * 1000 for q, value in zip(percentiles, stats.percentiles)})
    return columns


def run_summary(
    table: pd.DataFrame,
    duration_s: float,
    percentiles: Sequence[float],
    stream_output: bool,
    slo: SLO | None = None,
) -> dict[str, float | int | str]:
    """Flat run summary (history columns) from a per-request table as `Profiler.request_table` builds it.

    TTFT, ITL and tokens per tick are NaN when the run did not stream, as LMDeploy leaves them out.
    """
    status = table["status"].to_numpy(dtype=object)
    ok = status == SUCCESS
    counts = {name: int(np.count_nonzero(status == name)) for name in STATUSES}
    total_input = sum(table["input_len"].to_numpy()[ok].tolist())
    total_output = int(table["output_len"].to_numpy()[ok].sum())
    summary: dict[str, float | int | str] = {
        "total_requests": len(table),
        "completed": counts[SUCCESS],
        "failed": counts[FAILED],
        "incomplete": counts[INCOMPLETE],
        "unfinished": counts[UNFINISHED],
        "cancelled": counts[CANCELLED],
        "failure_reasons": format_reasons(failure_reasons(status, table["reason"].to_numpy(dtype=object))),
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "duration_s": duration_s,
        "request_throughput": rate(counts[SUCCESS], duration_s),
        "input_throughput": rate(total_input, duration_s),
        "output_throughput": rate(total_output, duration_s),
    }
    itl_rows = [np.asarray(v, dtype=np.float64) for v in table["itl_s"].to_numpy(dtype=object)[ok]]
    values = {
        "e2e": table["e2e_s"].to_numpy(dtype=np.float64)[ok],
        "ttft": table["ttft_s"].to_numpy(dtype=np.float64)[ok],
        "tpot": table["tpot_s"].to_numpy(dtype=np.float64)[ok],
        "itl": np.concatenate(itl_rows) if itl_rows else np.array([]),
    }
    for name in LATENCY_METRICS:
        measured = stream_output or name not in STREAM_ONLY_METRICS
        series = values[name][~np.isnan(values[name])] if measured else np.array([])
        summary.update(latency_columns(name, series, percentiles))
    # Tokens per response chunk: LMDeploy's tpts, its percentiles truncated to integers as it prints them.
    # Absent from tables stored before this column existed: the statistic is then not measured.
    tick_cells = table["tokens_per_tick"].to_numpy(dtype=object)[ok] if "tokens_per_tick" in table else []
    tick_rows = [np.asarray(v, dtype=np.int64) for v in tick_cells]
    ticks = np.concatenate(tick_rows) if stream_output and tick_rows else np.array([], dtype=np.int64)
    tick_stats = distribution(ticks, percentiles)
    summary["mean_tokens_per_tick"] = tick_stats.mean
    for q, value in zip(percentiles, tick_stats.percentiles):
        summary[f"{percentile_key(q)}_tokens_per_tick"] = math.nan if math.isnan(value) else int(value)
    if slo_is_set(slo):
        good = good_requests(status, table["ttft_s"], table["tpot_s"], table["e2e_s"], slo)
        summary["good_requests"] = int(good.sum())
        summary["goodput_rps"] = rate(int(good.sum()), duration_s)
    summary.update(client_summary(table, ok, percentiles, stream_output))
    return {key: _plain(value) for key, value in summary.items()}


def tpot_to_last_line(e2e_last_line_s: np.ndarray, ttft_s: np.ndarray, output_len: np.ndarray) -> np.ndarray:
    """profile_restful_api.py's TPOT: (E2E to the last line - TTFT) / (output tokens - 1); NaN under 2 tokens."""
    output_len = np.asarray(output_len, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = (np.asarray(e2e_last_line_s, dtype=np.float64) - np.asarray(ttft_s, dtype=np.float64)) / (output_len - 1)
    return np.where(output_len > 1, tpot, np.nan)


def client_summary(table: pd.DataFrame, ok: np.ndarray, percentiles: Sequence[float],
                   stream_output: bool) -> dict[str, float | int]:
    """What an HTTP client's per-request columns add (the openai engine's), for tables that have them.

    E2E and TPOT to the stream's last line (profile_restful_api.py's definitions; ours end at the last
    chunk with output; unstreamed, its completions client has no TTFT and divides the whole E2E),
    LMDeploy's retokenized output total (successful requests), the served requests whose length differs from the one asked, and the load delivered: the send rate achieved
    (`arrivals.achieved_rate`), how late sends were against their schedule, and the most requests in
    flight at once.
    """
    summary: dict[str, float | int] = {}
    if "e2e_last_line_s" in table:
        e2e_last_line = table["e2e_last_line_s"].to_numpy(dtype=np.float64)[ok]
        ttft = table["ttft_s"].to_numpy(dtype=np.float64)[ok] if stream_output else np.zeros(e2e_last_line.size)
        tpot_last_line = tpot_to_last_line(e2e_last_line, ttft, table["output_len"].to_numpy()[ok])
        for name, values in (("e2e_last_line", e2e_last_line), ("tpot_last_line", tpot_last_line)):
            summary.update(latency_columns(name, values[~np.isnan(values)], percentiles))
    if "retokenized_output_len" in table:
        retokenized = table["retokenized_output_len"].to_numpy(dtype=np.float64)[ok]
        summary["total_output_tokens_retokenized"] = int(np.nansum(retokenized))
    if "length_mismatch" in table:
        summary["length_mismatches"] = int(table["length_mismatch"].fillna(False).astype(bool).sum())
    if "sent_s" in table:
        sent = table["sent_s"].to_numpy(dtype=np.float64)
        was_sent = ~np.isnan(sent)
        lags = sent[was_sent] - table["scheduled_s"].to_numpy(dtype=np.float64)[was_sent]
        ended = table["ended_s"].to_numpy(dtype=np.float64)
        spans = was_sent & ~np.isnan(ended)
        _, in_flight = in_flight_over_time(sent[spans], ended[spans])
        summary.update({
            "achieved_rate": achieved_rate(sent[was_sent]),
            "mean_send_lag_ms": lags.mean() * 1000 if lags.size else math.nan,
            "max_send_lag_ms": lags.max() * 1000 if lags.size else math.nan,
            "peak_in_flight": int(in_flight.max()) if in_flight.size else 0,
        })
    return summary


def _plain(value):
    """numpy scalars become Python numbers, so the dict writes cleanly to CSV and JSON."""
    return value.item() if isinstance(value, np.generic) else value
