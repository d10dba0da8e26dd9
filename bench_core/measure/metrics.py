"""The pure functions that compute metrics: per-request values from ticks, statuses, statistics, and the
run summary generated from the metric catalog (`catalog.CATALOG`, where every metric is declared once).

Definitions follow `lmdeploy/profiler.py` for the names it shares (README, "What is measured"), so the
same ticks give the same numbers. Everything here is vectorised and does no I/O: the Profiler calls
these functions on its ticks, and the dashboard calls `run_summary` on a stored per-request table to
recompute statistics or goodput for new SLO thresholds without re-running anything.

Times are seconds everywhere; the summary dict converts latencies to milliseconds in its key names.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeGuard

import numpy as np
import pandas as pd

from ..config import SLO
from ..states import RequestStatus
from .catalog import CATALOG, Metric, RunFacts, expand, percentile_key, rate
from .window import SteadyLoad, TimeSlice, WindowFacts, request_times, steady_facts, time_slices

__all__ = ["percentile_key", "rate"]


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
    """Mean and percentiles exactly as LMDeploy computes them (np.mean, and np.percentile's values through
    linear_percentiles), plus std/min/max."""
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
        percentiles=linear_percentiles(values, percentiles),
    )


def linear_percentiles(values: np.ndarray, percentiles: Sequence[float]) -> tuple[np.float64, ...]:
    """np.percentile(values, percentiles) to the bit (its default 'linear' method), for non-empty 1-d values,
    faster.

    np.percentile partitions for all the ranks it needs in one call, which over 5M ITLs costs six times as
    much as partitioning for one rank; here each rank is found by a partition of what lies above the rank
    before it, and a rank right after a found one is the minimum of the rest. The interpolation between
    the two ranks around each percentile is numpy's, operation for operation: (n - 1) * q / 100 splits into
    a rank and a weight g; a + (b - a) * g, or b - (b - a) * (1 - g) where g >= 0.5. Any NaN makes every
    percentile NaN, as in numpy. `values` is not changed.
    """
    values = np.asarray(values)
    quantiles = np.true_divide(np.asarray(percentiles, dtype=np.float64), 100)
    if quantiles.size and not ((quantiles >= 0) & (quantiles <= 1)).all():
        raise ValueError("Percentiles must be in the range [0, 100]")
    n = values.size
    if values.dtype.kind == "f" and np.isnan(values.max()):
        return tuple(np.full(quantiles.size, np.nan))
    virtual = (n - 1) * quantiles
    below = np.minimum(np.floor(virtual), n - 1).astype(np.intp)
    above = np.minimum(below + 1, n - 1)
    ranked = _order_statistics(values, np.union1d(below, above))
    low = np.array([ranked[k] for k in below.tolist()], dtype=values.dtype)
    high = np.array([ranked[k] for k in above.tolist()], dtype=values.dtype)
    weight = virtual - below
    step = high - low
    result = np.add(low, step * weight)
    np.subtract(high, step * (1 - weight), out=result, where=weight >= 0.5, casting="unsafe")
    return tuple(result)


def _order_statistics(values: np.ndarray, ranks: np.ndarray) -> dict[int, np.generic]:
    """The value of each rank (0: the smallest) of `values`, for ranks in ascending order, from one copy."""
    work = values.copy()
    found: dict[int, np.generic] = {}
    rest = 0  # work[rest:] holds exactly the values of rank rest and up, unordered
    for rank in ranks.tolist():
        if rank == rest and rank - 1 in found:  # the smallest of what lies above the rank just found
            found[rank] = work[rest:].min()
            continue
        work[rest:].partition(rank - rest)
        found[rank] = work[rank]
        rest = rank + 1
    return found


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
    """The values of a flat per-request series that belong to the selected requests, in order: `flat`
    itself when every request is selected (the common case, which then copies nothing)."""
    if selected.all():
        return flat
    return flat[np.repeat(selected, counts)]


def request_metrics(
    ts_per_request: Sequence[Sequence[float]], ns_per_request: Sequence[Sequence[int]]
) -> RequestMetrics:
    """Per-request TTFT, TPOT, E2E, ITL and tokens per tick, with LMDeploy's float operations.

    Request i's ticks are `ts_per_request[i]` (seconds) and `ns_per_request[i]` (cumulative tokens), of equal
    length: arrays, array.array or lists, read as float64 and int64. Undefined values, which crash LMDeploy,
    are NaN here: TTFT and E2E need two ticks, TPOT also needs a token generated. Each request's gaps are
    written straight into the flat series, so no array of every tick is ever built; each request's ticks are
    read through a numpy view made when it is reached, so at most one view (two objects for the garbage
    collector, where the buffer is an array.array) is alive at a time.
    """
    size = len(ts_per_request)
    n_ticks = np.fromiter(map(len, ts_per_request), dtype=np.int64, count=size)
    itl_counts = np.maximum(n_ticks - 2, 0)
    steps_counts = np.maximum(n_ticks - 1, 0)
    itl = np.empty(int(itl_counts.sum()), dtype=np.float64)
    token_steps = np.empty(int(steps_counts.sum()), dtype=np.int64)
    # The first, second (the first again for a one-tick request) and last tick of each, 0 without ticks;
    # written item by item, as tuples of them would be 10,000 objects more for the garbage collector.
    first_ts, second_ts, last_ts = np.zeros((3, size), dtype=np.float64)
    first_ns, second_ns, last_ns = np.zeros((3, size), dtype=np.int64)
    itl_at = steps_at = 0
    for i, (ts_seq, ns_seq) in enumerate(zip(ts_per_request, ns_per_request)):
        n = len(ts_seq)
        if n == 0:
            continue
        ts, ns = np.asarray(ts_seq, np.float64), np.asarray(ns_seq, np.int64)  # dtype by position: faster
        second = 1 if n > 1 else 0
        first_ts[i], second_ts[i], last_ts[i] = ts[0], ts[second], ts[-1]
        first_ns[i], second_ns[i], last_ns[i] = ns[0], ns[second], ns[-1]
        if n > 1:
            np.subtract(ns[1:], ns[:-1], out=token_steps[steps_at : steps_at + n - 1])
            steps_at += n - 1
        if n > 2:  # the first gap of a request is its TTFT, not an ITL
            np.subtract(ts[2:], ts[1:-1], out=itl[itl_at : itl_at + n - 2])
            itl_at += n - 2
    has_two = n_ticks >= 2

    e2e = np.where(has_two, last_ts - first_ts, np.nan)
    ttft = np.where(has_two, second_ts - first_ts, np.nan)
    # Tokens after the first chunk: time per token from it; otherwise (non-stream, or one chunk with
    # every token) LMDeploy falls back to the whole span, prefill included.
    after_first = last_ns > second_ns
    span = np.where(after_first, last_ts - second_ts, last_ts - first_ts)
    tokens = np.where(after_first, last_ns - second_ns, last_ns - first_ns)
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = span / tokens
    tpot = np.where(has_two & (tokens != 0), tpot, np.nan)
    return RequestMetrics(
        n_ticks=n_ticks,
        output_len=last_ns,
        ttft_s=ttft,
        tpot_s=tpot,
        e2e_s=e2e,
        itl_s=itl,
        itl_counts=itl_counts,
        tokens_per_tick=token_steps,
        tokens_per_tick_counts=steps_counts,
    )


def request_status(
    finished: np.ndarray,
    succeeded: np.ndarray,
    output_len: np.ndarray,
    req_output_len: np.ndarray,
    cancelled: np.ndarray | None = None,
    length_status: np.ndarray | None = None,
) -> np.ndarray:
    """One RequestStatus per request. Only successful requests count in LMDeploy's metrics.

    A succeeded request is complete when it has the requested tokens (LMDeploy's rule), unless its engine
    judged its length itself (`length_status`, "" where it did not): a server that said it stopped at the
    limit without counting its tokens (SUCCESS), or one that produced more than asked (OVERRUN).
    """
    full_length = np.asarray(output_len) >= np.asarray(req_output_len)
    size = len(full_length)
    cancelled = np.zeros(size, dtype=bool) if cancelled is None else np.asarray(cancelled)
    judged = np.full(size, "", dtype=object) if length_status is None else np.asarray(length_status, dtype=object)
    return np.select(
        [~np.asarray(finished), cancelled, ~np.asarray(succeeded), judged != "", ~full_length],
        [RequestStatus.UNFINISHED, RequestStatus.CANCELLED, RequestStatus.FAILED, judged, RequestStatus.INCOMPLETE],
        RequestStatus.SUCCESS,
    ).astype(object)


def failure_reasons(status: np.ndarray, reason: np.ndarray) -> dict[str, int]:
    """Reason -> count over the requests that did not succeed (the status word when no reason was given);
    cancelled requests are left out: the user stopped them, nothing failed."""
    status = np.asarray(status, dtype=object)
    reason = np.asarray(reason, dtype=object)
    counts: dict[str, int] = {}
    unsuccessful = (status != RequestStatus.SUCCESS) & (status != RequestStatus.CANCELLED)
    for st, why in zip(status[unsuccessful], reason[unsuccessful]):
        label = str(why) if isinstance(why, str) and why else str(st)
        counts[label] = counts.get(label, 0) + 1
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def format_reasons(counts: dict[str, int]) -> str:
    return "; ".join(f"{reason}: {n}" for reason, n in counts.items())


def slo_is_set(slo: SLO | None) -> TypeGuard[SLO]:
    return slo is not None and any(getattr(slo, name) is not None for name in ("ttft", "tpot", "e2e"))


def good_requests(
    status: np.ndarray, ttft_s: np.ndarray, tpot_s: np.ndarray, e2e_s: np.ndarray, slo: SLO
) -> np.ndarray:
    """Successful requests meeting every threshold the SLO sets, as in vLLM; undefined values fail."""
    good = np.asarray(status, dtype=object) == RequestStatus.SUCCESS
    for threshold, values in ((slo.ttft, ttft_s), (slo.tpot, tpot_s), (slo.e2e, e2e_s)):
        if threshold is not None:
            good &= np.asarray(values, dtype=np.float64) <= threshold
    return good


def summary_columns(metric: Metric, stats: Distribution, percentiles: Sequence[float]) -> dict[str, float]:
    """A distribution metric's summary keys from its statistics, in its display unit."""
    by_name = {
        "mean": stats.mean,
        "std": stats.std,
        "min": stats.min,
        "max": stats.max,
        **{percentile_key(q): value for q, value in zip(percentiles, stats.percentiles)},
    }
    columns = {}
    for stat in expand(metric.statistics, percentiles):
        value = by_name[stat]
        if stat.startswith("p") and metric.integer_percentiles:
            columns[metric.column(stat)] = math.nan if math.isnan(value) else int(value)
        else:
            columns[metric.column(stat)] = value * metric.display_scale
    return columns


def run_summary(
    table: pd.DataFrame,
    duration_s: float,
    percentiles: Sequence[float],
    stream_output: bool,
    slo: SLO | None = None,
    steady: SteadyLoad | None = None,
) -> dict[str, float | int | str]:
    """Flat run summary (history columns) from a per-request table as `Profiler.request_table` builds it:
    every catalog metric that applies, under its columns, in catalog order; the steady window's and the time
    slices' where `steady` says what load the run asked for (window.steady_load).

    Metrics that need streaming are NaN when the run did not stream, as LMDeploy leaves them out.
    """
    status = table["status"].to_numpy(dtype=object)
    ok = status == RequestStatus.SUCCESS
    steady_part: WindowFacts | None = None
    slices: tuple[TimeSlice, ...] = ()
    if steady is not None:
        times = request_times(table)
        steady_part = steady_facts(times, duration_s, stream_output, steady)
        if steady.slice_s is not None:
            slices = tuple(time_slices(times, duration_s, steady.slice_s, stream_output))
    facts = RunFacts(
        table=table,
        status=status,
        ok=ok,
        duration_s=duration_s,
        failure_reasons=format_reasons(failure_reasons(status, table["reason"].to_numpy(dtype=object))),
        good=good_requests(status, table["ttft_s"], table["tpot_s"], table["e2e_s"], slo) if slo_is_set(slo) else None,
        steady=steady_part,
        slices=slices,
    )
    summary: dict[str, float | int | str] = {}
    for metric in CATALOG:
        if metric.aggregate is not None:
            value = metric.aggregate(facts)
            if value is not None:
                summary[metric.column()] = value
        elif metric.per_request is not None:
            values = measured_values(metric, table, ok, stream_output)
            if values is not None:
                summary.update(summary_columns(metric, distribution(values, percentiles), percentiles))
    return {key: _plain(value) for key, value in summary.items()}


def measured_values(metric: Metric, table: pd.DataFrame, ok: np.ndarray, stream_output: bool) -> np.ndarray | None:
    """The values a metric's statistics are taken over; None when the table cannot give them."""
    per_request = None if metric.per_request is None else metric.per_request(table, stream_output)
    if per_request is None:
        return None
    if metric.needs_streaming and not stream_output:
        return np.array([])
    selected = ok if metric.over_successes else np.ones(len(table), dtype=bool)
    if isinstance(per_request, np.ndarray):
        values = per_request[selected]
    else:
        rows = [cell for cell, keep in zip(per_request, selected) if keep]
        values = np.concatenate(rows) if rows else np.array([])
    return values[~np.isnan(values)] if values.dtype.kind == "f" else values


def _plain(value):
    """numpy scalars become Python numbers, so the dict writes cleanly to CSV and JSON."""
    return value.item() if isinstance(value, np.generic) else value
