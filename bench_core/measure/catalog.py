"""The metric catalog: every metric the app reports, declared once, with its formula beside it.

A `Metric` says what a metric is called (key, label, LMDeploy's column and console row where LMDeploy has
them), its unit and display unit, which direction is better, whether it needs a streamed run, how it is
computed (a formula per request over the per-request table, an aggregate over the run, or a value derived
from other columns of a history row) and which statistics it gets. Everything that names a metric is
generated from `CATALOG`: the summary keys, which are also the history columns (`Metric.column`), their
descriptions (`find_column`), the console and dashboard tables, LMDeploy's CSV row (`lmdeploy_row`), the
compare table's and the sweep picker's default metrics, and chart axes. Adding a metric is one `Metric(...)`.

Definitions follow `lmdeploy/profiler.py` for the names it shares (README, "What is measured"), so the same
ticks give the same numbers. Times are stored in seconds and shown in ms (`display_scale`); a summary key
carries the display unit when there is one (`p99_ttft_ms`). Pure functions, no I/O.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ..config.catalog import MAX_TURNS
from ..engines.engine_api import ENGINE_POSITION_COLUMN
from ..load.arrivals import achieved_rate, in_flight_over_time
from ..states import LoadPattern, RequestStatus
from . import quality
from .stats import UNBOUNDED
from .window import MAX_TIME_SLICES, TimeSlice, WindowFacts

PERCENTILES = "percentiles"  # stands for every configured percentile, p50 ... p99.9
DISTRIBUTION = ("mean", "std", "min", "max", PERCENTILES)
VALUE = ("value",)  # one number for the run, under the metric's own column
MEAN_AND_P99 = ("mean", "p99")
NOT_MEASURED = "-"  # LMDeploy's own marker in its CSV for a value that was not measured
COUNT_SOURCE = "output_len_source"  # the request-table column an HTTP client fills: where output_len came from
_STATISTIC_LABELS = {"mean": "Mean", "std": "Std of", "min": "Min", "max": "Max"}
# Below this mean prompt length TTFT is mostly fixed cost, and scaling it to 1,000 tokens says nothing of prefill.
PER_1K_MIN_PROMPT = 100
# A metric's physical range (`Metric.bounds`): no interval around its mean may reach past it.
NON_NEGATIVE = (0.0, math.inf)
FRACTION = (0.0, 1.0)
PERCENT = (0.0, 100.0)


@dataclass(frozen=True)
class RunFacts:
    """What an aggregate formula reads: the per-request table and what the summary already worked out."""

    table: pd.DataFrame
    status: np.ndarray
    ok: np.ndarray  # the successful requests, the only ones LMDeploy's metrics count
    duration_s: float
    failure_reasons: str
    good: np.ndarray | None  # requests meeting the SLO; None without an SLO
    steady: WindowFacts | None = None  # the steady window's (measure/window.py); None where the run had none
    slices: tuple[TimeSlice, ...] = ()  # its time slices, where the user asked for them

    def count(self, status: str) -> int:
        return int(np.count_nonzero(self.status == status))

    def has(self, column: str) -> bool:
        return column in self.table


PerRequest = Callable[[pd.DataFrame, bool], "np.ndarray | list[np.ndarray] | None"]


@dataclass(frozen=True)
class Metric:
    """One metric. Exactly one of `per_request`, `aggregate`, `derived` and `sampled` is its formula:

    - `per_request(table, streamed)`: one value per request (or a list of values per request, like ITL),
      None when the table lacks what it needs; the summary gets `statistics` over the successful requests
      (all requests when `over_successes` is False), NaN values left out;
    - `aggregate(facts)`: one value for the run, None when it does not apply (then the key is absent);
    - `derived(column)`: a history column computed from the columns named in `needs` (`column(name)` reads
      one as numbers), for runs compared or swept;
    - `sampled(telemetry)`: one value for the run from its hardware samples' summary over the measured window
      (telemetry.telemetry_summary), None when not measured (GPU values on a CPU run);
    - `served(server)`: one value for the run from the summary of the server's own metrics
      (server_metrics.run_summary), None when the server did not serve it.
    """

    key: str
    label: str
    unit: str
    larger_is_better: bool | None
    definition: str
    display_unit: str = ""
    display_scale: float = 1.0
    short_label: str = ""  # a table row's or column's name when the label is long ("TTFT")
    needs_streaming: bool = False
    server_only: bool = False  # needs the columns an HTTP client (or an arrival schedule) adds to the request table
    per_request: PerRequest | None = None
    over_successes: bool = True
    integer_percentiles: bool = False  # truncated to integers, as LMDeploy prints tokens per tick
    aggregate: Callable[[RunFacts], Any] | None = None
    derived: Callable[[Callable[[str], pd.Series]], pd.Series] | None = None
    needs: tuple[str, ...] = ()
    sampled: Callable[[Mapping[str, Any]], Any] | None = None
    served: Callable[[Mapping[str, Any]], Any] | None = None
    statistics: tuple[str, ...] = VALUE
    value_column: str = ""  # a single-valued metric's column when it is not its key ("duration_s")
    lmdeploy: str = ""  # LMDeploy's save_csv column (of the mean, for a distribution)
    lmdeploy_digits: int | None = None  # how LMDeploy formats it there; None: as it is
    lmdeploy_label: str = ""  # its row in LMDeploy's console table
    compared: tuple[str, ...] = ()  # statistics the compare table shows by default
    swept: tuple[str, ...] = ()  # statistics the sweep metric picker offers
    # What the workload did with the cache and the turns: the run's workload table, not LMDeploy's or the throughput's.
    workload: bool = False
    windowed: bool = False  # a figure of the run's steady window (measure/window.py), beside the whole run's
    bounds: tuple[float, float] = NON_NEGATIVE  # counts, rates, times and sizes are never negative

    @property
    def shown_unit(self) -> str:
        return self.display_unit or self.unit

    @property
    def title(self) -> str:
        return f"{self.label} ({self.shown_unit})" if self.shown_unit else self.label

    @property
    def row_title(self) -> str:
        """Its row in a table of statistics: the short label with the unit."""
        return f"{self.short_label or self.label} ({self.shown_unit})"

    @property
    def console_title(self) -> str:
        """Its row below LMDeploy's console table, which is in stored units (seconds), as that table is."""
        return f"{self.short_label or self.label} ({self.unit})"

    @property
    def is_distribution(self) -> bool:
        return self.statistics != VALUE

    def column(self, statistic: str = "value") -> str:
        """The summary key and history column of one statistic ("mean", "p99", or "value")."""
        if not self.is_distribution:
            return self.value_column or self.key
        unit = f"_{self.display_unit}" if self.display_unit else ""
        return f"{statistic}_{self.key}{unit}"

    @property
    def mean_column(self) -> str:
        return self.column("mean" if self.is_distribution else "value")


def percentile_key(q: float) -> str:
    """'p50' for 50 or 50.0, 'p99.9' for 99.9: the history column spelling."""
    return f"p{int(q)}" if float(q).is_integer() else f"p{q}"


def expand(statistics: Sequence[str], percentiles: Sequence[float]) -> list[str]:
    """Statistic names with PERCENTILES replaced by the configured ones."""
    names: list[str] = []
    for stat in statistics:
        if stat == PERCENTILES:
            names.extend(percentile_key(q) for q in percentiles)
        else:
            names.append(stat)
    return names


def rate(count: float, duration_s: float) -> float:
    """count / duration, or NaN when the duration is not a positive number."""
    if not duration_s > 0:
        return math.nan
    return count / duration_s


# ---- per-request formulas over the per-request table ------------------------------------------


def _floats(table: pd.DataFrame, column: str) -> np.ndarray:
    return table[column].to_numpy(dtype=np.float64)


def _lists(table: pd.DataFrame, column: str, dtype) -> list[np.ndarray]:
    return [np.asarray([] if cell is None else cell, dtype=dtype) for cell in table[column].to_numpy(dtype=object)]


def tpot_to_last_line(e2e_last_line_s: np.ndarray, ttft_s: np.ndarray, output_len: np.ndarray) -> np.ndarray:
    """profile_restful_api.py's TPOT: (E2E to the last line - TTFT) / (output tokens - 1); NaN under 2 tokens."""
    output_len = np.asarray(output_len, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = (np.asarray(e2e_last_line_s, dtype=np.float64) - np.asarray(ttft_s, dtype=np.float64)) / (output_len - 1)
    return np.where(output_len > 1, tpot, np.nan)


def _tpot_last_line(table: pd.DataFrame, streamed: bool) -> np.ndarray | None:
    # Unstreamed, profile_restful_api.py's completions client has no TTFT and divides the whole E2E.
    if "e2e_last_line_s" not in table:
        return None
    ttft = _floats(table, "ttft_s") if streamed else np.zeros(len(table))
    return tpot_to_last_line(_floats(table, "e2e_last_line_s"), ttft, table["output_len"].to_numpy())


def _ttft_per_1k_input(table: pd.DataFrame, streamed: bool) -> np.ndarray:
    input_len = table["input_len"].to_numpy(dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(input_len > 0, _floats(table, "ttft_s") / input_len * 1000, np.nan)


def _decode_tokens_per_s(table: pd.DataFrame, streamed: bool) -> np.ndarray:
    after_first = table["output_len"].to_numpy(dtype=np.float64) - 1
    span = _floats(table, "e2e_s") - _floats(table, "ttft_s")
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where((after_first > 0) & (span > 0), after_first / span, np.nan)


def _send_lag(table: pd.DataFrame, streamed: bool) -> np.ndarray | None:
    """Sent minus due, less the wait for a free slot where the client kept one (the slot wait is no lateness)."""
    if "sent_s" not in table:
        return None
    waited = np.nan_to_num(_floats(table, "slot_wait_s")) if "slot_wait_s" in table else 0.0
    return _floats(table, "sent_s") - _floats(table, "scheduled_s") - waited


# ---- aggregate formulas over the run ---------------------------------------------------------


def _sent(run: RunFacts) -> np.ndarray:
    sent = _floats(run.table, "sent_s")
    return sent[~np.isnan(sent)]


def _due(run: RunFacts) -> np.ndarray:
    due = _floats(run.table, "scheduled_s")
    return due[~np.isnan(due)]


def requested_rate(load_pattern: str, request_rate: float, summary: Mapping[str, Any]) -> float:
    """The request rate a run asked for: a trace's is its schedule's (`scheduled_rate`), not the request rate
    setting it never used."""
    if load_pattern == LoadPattern.TRACE:
        return summary.get("scheduled_rate", math.nan)
    return request_rate


def _peak_in_flight(run: RunFacts) -> int:
    sent, ended = _floats(run.table, "sent_s"), _floats(run.table, "ended_s")
    spans = ~np.isnan(sent) & ~np.isnan(ended)
    _, in_flight = in_flight_over_time(sent[spans], ended[spans])
    return int(in_flight.max()) if in_flight.size else 0


def _total_input(run: RunFacts) -> int:
    return sum(run.table["input_len"].to_numpy()[run.ok].tolist())


def _total_output(run: RunFacts) -> int:
    return int(run.table["output_len"].to_numpy()[run.ok].sum())


def _count_sources(run: RunFacts) -> str:
    """ "retokenized: 30; usage: 2": each source of the requests' output counts, most frequent first."""
    counts = run.table[COUNT_SOURCE].dropna().value_counts().items()
    return "; ".join(f"{source}: {count}" for source, count in sorted(counts, key=lambda item: (-item[1], item[0])))


def _only_with(column: str, formula: Callable[[RunFacts], Any]) -> Callable[[RunFacts], Any]:
    return lambda run: formula(run) if run.has(column) else None


def _spec_total(run: RunFacts, column: str) -> float:
    return float(np.nansum(_floats(run.table, column)))


def _acceptance_length(run: RunFacts) -> float | None:
    drafts = _spec_total(run, "spec_drafts")
    return 1 + _spec_total(run, "spec_accepted_tokens") / drafts if drafts > 0 else None


def _acceptance_rate(run: RunFacts) -> float | None:
    drafted = _spec_total(run, "spec_draft_tokens")
    return _spec_total(run, "spec_accepted_tokens") / drafted if drafted > 0 else None


def request_acceptance_rates(table: pd.DataFrame, streamed: bool) -> np.ndarray | None:
    """Each request's accepted draft tokens / drafted tokens, NaN where it drafted none; None: no engine counted."""
    if "spec_draft_tokens" not in table:
        return None
    drafted = _floats(table, "spec_draft_tokens")
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(drafted > 0, _floats(table, "spec_accepted_tokens") / drafted, np.nan)


def _engine_acceptance_by_position(run: RunFacts) -> str | None:
    """Per draft position, the drafts accepted there / all drafts, over every request the engine counted positions
    for (transformers_generate.DraftTally's JSON lists, one per request; SGLang's, from /generate's histogram). A
    list shorter than the others accepted nothing past its end (SGLang's, where the server said no draft length)."""
    drafts = _spec_total(run, "spec_drafts")
    lists = [json.loads(cell) for cell in run.table[ENGINE_POSITION_COLUMN] if isinstance(cell, str)]
    if drafts <= 0 or not lists:
        return None
    width = max(map(len, lists))
    accepted = np.array([counts + [0] * (width - len(counts)) for counts in lists], dtype=np.float64)
    return _position_text(accepted.sum(axis=0) / drafts)


def _cached(run: RunFacts) -> np.ndarray | None:
    """Each completed request's cached prompt tokens (NaN where its engine said nothing); None: no engine said."""
    return _floats(run.table, "cached_tokens")[run.ok] if run.has("cached_tokens") else None


def _total_cached(run: RunFacts) -> float:
    cached = _cached(run)
    return math.nan if cached is None or np.isnan(cached).all() else float(np.nansum(cached))


def _hit_rate(run: RunFacts) -> float:
    """LMDeploy's benchmark_chat_completion.py cache_hit_rate: cached / input tokens of the completed requests,
    over those whose engine said how many were cached."""
    cached = _cached(run)
    if cached is None or np.isnan(cached).all():
        return math.nan
    said = ~np.isnan(cached)
    return rate(float(cached[said].sum()), float(run.table["input_len"].to_numpy(dtype=np.float64)[run.ok][said].sum()))


def _mean_of(column: str) -> Callable[[RunFacts], Any]:
    """The mean of a per-request column over the completed requests that have a value (NaN: none has); None (the
    key absent) where the run has no such column."""

    def mean(run: RunFacts) -> Any:
        if not run.has(column):
            return None
        values = _floats(run.table, column)[run.ok]
        values = values[~np.isnan(values)]
        return float(values.mean()) if len(values) else math.nan

    return mean


def _turn_ttft(turn: int) -> Callable[[RunFacts], Any]:
    """The mean TTFT (ms) of the completed requests of turn `turn` (1 the first); None without turns."""

    def mean_ms(run: RunFacts) -> Any:
        if not run.has("turn") or not run.has("ttft_s"):
            return None
        ttft = _floats(run.table, "ttft_s")[run.ok & (_floats(run.table, "turn") == turn - 1)]
        ttft = ttft[~np.isnan(ttft)]
        return float(ttft.mean() * 1000) if ttft.size else None

    return mean_ms


def _in_window(formula: Callable[[WindowFacts], Any]) -> Callable[[RunFacts], Any]:
    """A steady-window formula; None (no column) for a run without a window."""
    return lambda run: None if run.steady is None else formula(run.steady)


def _mean_ms(values_s: np.ndarray) -> float:
    return float(values_s.mean() * 1000) if values_s.size else math.nan


def _p99_ms(values_s: np.ndarray) -> float:
    return float(np.percentile(values_s, 99) * 1000) if values_s.size else math.nan


def _slice_text(part: TimeSlice) -> str:
    """ "0-5 s: 3 sent, 41.2 tok/s, TTFT 120 ms": one time slice, compactly."""
    window = part.window
    ttft = "-" if math.isnan(part.mean_ttft_s) else f"{part.mean_ttft_s * 1000:.0f}"
    return (
        f"{_seconds(window.start_s)}-{_seconds(window.end_s)} s: {part.sent} sent, "
        f"{rate(part.output_tokens, window.duration_s):.1f} tok/s, TTFT {ttft} ms"
    )


def _seconds(value: float) -> str:
    """5 s as "5", 16.9576 s as "16.96"."""
    return f"{value:.2f}".rstrip("0").rstrip(".")


def _slices(run: RunFacts) -> str | None:
    if not run.slices:
        return None
    text = "; ".join(map(_slice_text, run.slices))
    wanted = math.ceil(run.duration_s / run.slices[0].window.duration_s)
    return text if wanted <= MAX_TIME_SLICES else f"{text}; the first {MAX_TIME_SLICES:,} of {wanted:,} slices"


# ---- derived formulas over history columns ---------------------------------------------------


def _per_user(column: Callable[[str], pd.Series]) -> pd.Series:
    tpot_ms = column("mean_tpot_ms")
    return 1000.0 / tpot_ms.where(tpot_ms > 0)


def _attainment(column: Callable[[str], pd.Series]) -> pd.Series:
    total = column("total_requests")
    return column("good_requests") / total.where(total > 0)


# ---- sampled formulas over the telemetry summary ------------------------------------------------

_GIB = 1024**3


def _in_gib(key: str) -> Callable[[Mapping[str, Any]], Any]:
    return lambda telemetry: None if telemetry.get(key) is None else telemetry[key] / _GIB


def _sampled(key: str, scale: float = 1.0) -> Callable[[Mapping[str, Any]], Any]:
    """The summary's `key` (a telemetry or server summary), times `scale`; None when absent."""
    return lambda summary: None if summary.get(key) is None else summary[key] * scale


def _position_text(rates: Sequence[float] | None) -> str | None:
    return None if rates is None else json.dumps([round(float(rate), 4) for rate in rates])


def position_metric(summary: Mapping[str, Any]) -> Metric:
    """Which metric holds a run's acceptance by draft position: the engine's own count where it made one, else the
    server's (a history reads an empty cell back as "": the engine made none)."""
    engine = METRICS["engine_acceptance_by_position"]
    cell = summary.get(engine.column())
    return engine if isinstance(cell, str) and cell else METRICS["spec_acceptance_by_position"]


def acceptance_by_position(summary: Mapping[str, Any]) -> list[float] | None:
    """The acceptance rates of draft positions 1..k a summary or history row holds (the engine's, else the
    server's); None where not reported."""
    cell = summary.get(position_metric(summary).column())
    try:
        rates = json.loads(cell) if isinstance(cell, str) else None
    except ValueError:
        return None
    return [float(rate) for rate in rates] if isinstance(rates, list) and rates else None


def _ttft_gap(column: Callable[[str], pd.Series]) -> pd.Series:
    return column("mean_ttft_ms") - column("mean_server_ttft_ms")


# ---- the catalog -----------------------------------------------------------------------------

_MS: dict[str, Any] = dict(unit="s", display_unit="ms", display_scale=1000.0)
CATALOG: tuple[Metric, ...] = (
    Metric(
        "total_requests",
        "Total requests",
        "requests",
        None,
        "Every request of the run.",
        aggregate=lambda run: len(run.table),
    ),
    Metric(
        "completed",
        "Completed requests",
        "requests",
        True,
        "Requests that finished successfully with at least the requested tokens.",
        aggregate=lambda run: run.count(RequestStatus.SUCCESS),
        lmdeploy="completed",
        compared=VALUE,
    ),
    Metric(
        "failed",
        "Failed requests",
        "requests",
        False,
        "Requests the engine failed.",
        aggregate=lambda run: run.count(RequestStatus.FAILED),
        compared=VALUE,
    ),
    Metric(
        "incomplete",
        "Incomplete requests",
        "requests",
        False,
        "Requests that finished with fewer tokens than requested.",
        aggregate=lambda run: run.count(RequestStatus.INCOMPLETE),
        compared=VALUE,
    ),
    Metric(
        "unfinished",
        "Unfinished requests",
        "requests",
        False,
        "Requests still running or never sent when the run ended.",
        aggregate=lambda run: run.count(RequestStatus.UNFINISHED),
    ),
    Metric(
        "cancelled",
        "Cancelled requests",
        "requests",
        None,
        "Requests stopped by the user's cancel.",
        aggregate=lambda run: run.count(RequestStatus.CANCELLED),
    ),
    Metric(
        "failure_reasons",
        "Failure reasons",
        "",
        None,
        "Reason: count over the requests that did not succeed (cancelled ones left out).",
        aggregate=lambda run: run.failure_reasons,
    ),
    Metric(
        "total_input_tokens",
        "Total input tokens",
        "tokens",
        None,
        "Prompt tokens of completed requests: a server's own count (usage.prompt_tokens) where it sends one, else ours "
        "(on a chat endpoint, in the tokenizer's chat template).",
        aggregate=_total_input,
        lmdeploy="total_input_tokens",
    ),
    Metric(
        "total_output_tokens",
        "Total output tokens",
        "tokens",
        None,
        "Output tokens of completed requests.",
        aggregate=_total_output,
        lmdeploy="total_output_tokens",
    ),
    Metric(
        "duration",
        "Benchmark duration",
        "s",
        False,
        "From Profiler.start() to Profiler.finish().",
        aggregate=lambda run: run.duration_s,
        value_column="duration_s",
        lmdeploy="duration",
        compared=VALUE,
    ),
    Metric(
        "request_throughput",
        "Request throughput",
        "req/s",
        True,
        "Completed requests / benchmark duration.",
        short_label="Requests",
        aggregate=lambda run: rate(run.count(RequestStatus.SUCCESS), run.duration_s),
        lmdeploy="request_throughput",
        lmdeploy_digits=3,
        compared=VALUE,
        swept=VALUE,
    ),
    Metric(
        "input_throughput",
        "Input throughput",
        "tok/s",
        True,
        "Prompt tokens of completed requests / benchmark duration.",
        aggregate=lambda run: rate(_total_input(run), run.duration_s),
        lmdeploy="input_throughput",
        lmdeploy_digits=3,
        compared=VALUE,
    ),
    Metric(
        "output_throughput",
        "Output throughput",
        "tok/s",
        True,
        "Output tokens of completed requests / benchmark duration.",
        short_label="Output",
        aggregate=lambda run: rate(_total_output(run), run.duration_s),
        lmdeploy="output_throughput",
        lmdeploy_digits=3,
        compared=VALUE,
        swept=VALUE,
    ),
    Metric(
        "e2e",
        "End-to-end latency",
        **_MS,
        larger_is_better=False,
        definition="ts[-1] - ts[0]: from the request's start tick to its last tick; for a server, to the last "
        "chunk with output (vLLM's convention).",
        per_request=lambda table, streamed: _floats(table, "e2e_s"),
        statistics=DISTRIBUTION,
        lmdeploy="mean_e2e_latency_ms",
        lmdeploy_digits=3,
        lmdeploy_label="End-to-end Latency",
        compared=MEAN_AND_P99,
        swept=("mean",),
    ),
    Metric(
        "ttft",
        "Time to first token",
        **_MS,
        larger_is_better=False,
        short_label="TTFT",
        needs_streaming=True,
        definition="ts[1] - ts[0]: from the start tick to the first response chunk (streaming only). For a "
        "server, its first chunk of answer text, as profile_restful_api.py has it: reasoning before it "
        "is timed apart (TTFT (reasoning)), unless no answer came.",
        per_request=lambda table, streamed: _floats(table, "ttft_s"),
        statistics=DISTRIBUTION,
        lmdeploy="mean_ttft_ms",
        lmdeploy_digits=3,
        lmdeploy_label="Time to First Token (TTFT)",
        compared=MEAN_AND_P99,
        swept=MEAN_AND_P99,
    ),
    Metric(
        "tpot",
        "Time per output token",
        **_MS,
        larger_is_better=False,
        short_label="TPOT",
        definition="(ts[-1] - ts[1]) / (ns[-1] - ns[1]); when the first chunk carried every token, "
        "(ts[-1] - ts[0]) / (ns[-1] - ns[0]), which includes the prefill. For a server, to the last "
        "chunk with output (vLLM's convention).",
        per_request=lambda table, streamed: _floats(table, "tpot_s"),
        statistics=DISTRIBUTION,
        lmdeploy="mean_tpot_ms",
        lmdeploy_digits=3,
        lmdeploy_label="Time per Output Token (TPOT)",
        compared=MEAN_AND_P99,
        swept=MEAN_AND_P99,
    ),
    Metric(
        "itl",
        "Inter-token latency",
        **_MS,
        larger_is_better=False,
        short_label="ITL",
        needs_streaming=True,
        definition="Every gap between ticks after the first chunk (streaming only); a server's ticks are "
        "its SSE events.",
        per_request=lambda table, streamed: _lists(table, "itl_s", np.float64),
        statistics=DISTRIBUTION,
        lmdeploy="mean_itl_ms",
        lmdeploy_digits=3,
        lmdeploy_label="Inter-token Latency (ITL)",
        compared=MEAN_AND_P99,
        swept=("mean",),
    ),
    Metric(
        "e2e_last_line",
        "End-to-end latency to the last line",
        **_MS,
        larger_is_better=False,
        short_label="E2E to last line (LMDeploy)",
        server_only=True,
        definition="From sending a request to the last line of its stream (the usage chunk or [DONE]): "
        "profile_restful_api.py's E2E (HTTP servers only).",
        per_request=lambda table, streamed: _floats(table, "e2e_last_line_s") if "e2e_last_line_s" in table else None,
        statistics=DISTRIBUTION,
    ),
    Metric(
        "tpot_last_line",
        "Time per output token to the last line",
        **_MS,
        larger_is_better=False,
        short_label="TPOT to last line (LMDeploy)",
        server_only=True,
        definition="(E2E to the last line - TTFT) / (output tokens - 1), for requests of 2 tokens or more: "
        "profile_restful_api.py's TPOT (HTTP servers only).",
        per_request=_tpot_last_line,
        statistics=DISTRIBUTION,
    ),
    # Absent from tables stored before the column existed: then not measured.
    Metric(
        "tokens_per_tick",
        "Tokens per tick",
        "tokens",
        True,
        "Output tokens per response chunk (streaming only).",
        needs_streaming=True,
        statistics=("mean", PERCENTILES),
        integer_percentiles=True,
        per_request=lambda table, streamed: (
            _lists(table, "tokens_per_tick", np.int64) if "tokens_per_tick" in table else []
        ),
        lmdeploy_label="Tokens per Tick",
    ),
    Metric(
        "good_requests",
        "Good requests",
        "requests",
        True,
        "Completed requests meeting every set SLO threshold.",
        aggregate=lambda run: None if run.good is None else int(run.good.sum()),
    ),
    Metric(
        "goodput",
        "Goodput",
        "req/s",
        True,
        "Completed requests meeting every set SLO threshold / benchmark duration.",
        aggregate=lambda run: None if run.good is None else rate(int(run.good.sum()), run.duration_s),
        value_column="goodput_rps",
        compared=VALUE,
        swept=VALUE,
    ),
    Metric(
        "total_output_tokens_retokenized",
        "Total output tokens (retokenized)",
        "tokens",
        None,
        "LMDeploy's retokenized count of the completed requests' output (HTTP servers only).",
        server_only=True,
        aggregate=_only_with(
            "retokenized_output_len", lambda run: int(np.nansum(_floats(run.table, "retokenized_output_len")[run.ok]))
        ),
    ),
    Metric(
        "length_mismatches",
        "Length mismatches",
        "requests",
        False,
        "Served requests that came back shorter or longer than asked (HTTP servers only); one the server said "
        "it stopped at the limit is as long as asked.",
        server_only=True,
        aggregate=_only_with(
            "length_mismatch", lambda run: int(run.table["length_mismatch"].fillna(False).astype(bool).sum())
        ),
    ),
    Metric(
        "resent_requests",
        "Resent requests",
        "requests",
        False,
        "Requests sent again, once, on a new connection because the kept-alive one they went out on closed before "
        "any byte of the answer (a server that closes after each response while it advertises keep-alive); each "
        "is timed from its first send (HTTP servers only).",
        server_only=True,
        aggregate=_only_with("resent", lambda run: int(run.table["resent"].fillna(False).astype(bool).sum())),
    ),
    Metric(
        "overrun",
        "Overrun requests",
        "requests",
        False,
        "Served requests that produced more tokens than asked, so the server ignored the token limit; not counted "
        "with the completed (HTTP servers only).",
        server_only=True,
        aggregate=_only_with(COUNT_SOURCE, lambda run: run.count(RequestStatus.OVERRUN)),
    ),
    Metric(
        "output_len_sources",
        "Output count sources",
        "",
        None,
        "Where the requests' output token counts came from, with how many each: the server's usage, its usage per "
        "chunk, the tokens asked where the server said it stopped for length, our retokenized count of the text, or "
        "the chunks counted; a request with no output to count is in none (HTTP servers only).",
        server_only=True,
        aggregate=_only_with(COUNT_SOURCE, _count_sources),
    ),
    Metric(
        "achieved_rate",
        "Achieved send rate",
        "req/s",
        None,
        "Requests sent per second, between the first and the last send: the pace the load went out at, not the pace "
        "answers came back (that is Request throughput). At request rate inf every request goes out at once, so it is "
        "as fast as the client sends (HTTP servers; the embedded engine at a request rate).",
        server_only=True,
        aggregate=_only_with("sent_s", lambda run: achieved_rate(_sent(run))),
    ),
    Metric(
        "scheduled_rate",
        "Scheduled send rate",
        "req/s",
        None,
        "Requests due per second, between the first and the last due time: the rate the load asked for, as drawn "
        "(a trace's own, at its speed-up; inf where everything was due at once) (HTTP servers).",
        server_only=True,
        aggregate=_only_with("scheduled_s", lambda run: achieved_rate(_due(run))),
    ),
    Metric(
        "send_lag",
        "Send lag",
        **_MS,
        larger_is_better=False,
        server_only=True,
        definition="How late each request was sent against its schedule, its wait for a free slot left out (HTTP "
        "servers; the embedded engine at a request rate: how late it went into the batch).",
        per_request=_send_lag,
        over_successes=False,
        statistics=("mean", "max"),
    ),
    Metric(
        "slot_wait",
        "Slot wait",
        **_MS,
        larger_is_better=False,
        server_only=True,
        definition="How long each request, once due, waited for a free slot under the concurrency cap: the queue a "
        "closed loop keeps on the client, not lateness (HTTP servers).",
        per_request=lambda table, streamed: _floats(table, "slot_wait_s") if "slot_wait_s" in table else None,
        over_successes=False,
        statistics=("mean", "max"),
    ),
    Metric(
        "peak_in_flight",
        "Peak requests in flight",
        "requests",
        None,
        "The most requests in flight at once (HTTP servers; the embedded engine at a request rate).",
        server_only=True,
        aggregate=_only_with("sent_s", _peak_in_flight),
    ),
    # Speculative decoding, where the engine reports its accounting per request (engine_api.SPEC_COLUMNS: LMDeploy's
    # PyTorch engine with enable_metrics; the embedded engine's prompt lookup; SGLang's /generate, per request in its
    # meta_info); absent, not 0, where it does not.
    Metric(
        "spec_acceptance_length",
        "Mean acceptance length",
        "tokens",
        True,
        "1 + accepted draft tokens / drafting steps, the bonus token included (LMDeploy's and vLLM's "
        "SpecDecoding figure), over every request the engine reported on; only where the engine reports it.",
        aggregate=_only_with("spec_drafts", _acceptance_length),
        swept=VALUE,
    ),
    Metric(
        "spec_acceptance_rate",
        "Draft acceptance rate",
        "fraction",
        True,
        "Accepted draft tokens / drafted tokens, over every request the engine reported on; only where the "
        "engine reports it.",
        aggregate=_only_with("spec_drafts", _acceptance_rate),
        swept=VALUE,
        bounds=FRACTION,
    ),
    Metric(
        "request_acceptance_rate",
        "Draft acceptance rate per request",
        "fraction",
        True,
        "One request's accepted draft tokens / its drafted tokens (AIPerf's per-request acceptance), from the "
        "engine's own count per request; a request that drafted nothing has none.",
        short_label="Acceptance per request",
        per_request=request_acceptance_rates,
        statistics=DISTRIBUTION,
        bounds=FRACTION,
    ),
    Metric(
        "engine_acceptance_by_position",
        "Acceptance by draft position",
        "",
        None,
        "For each draft position 1..k, the drafts whose token at that position was accepted / all drafts, as a "
        "JSON list, over every request the engine counted positions for (the embedded engine's prompt lookup; "
        "SGLang's per-request histogram on its native /generate).",
        aggregate=_only_with(ENGINE_POSITION_COLUMN, _engine_acceptance_by_position),
    ),
    Metric(
        "ttft_per_1k_input",
        "TTFT per 1,000 input tokens",
        **_MS,
        larger_is_better=False,
        needs_streaming=True,
        definition="ttft_s / input_len * 1000: time to first token per thousand prompt tokens; meaningless for "
        f"prompts under {PER_1K_MIN_PROMPT} tokens, whose TTFT is mostly fixed cost, not prefill.",
        per_request=_ttft_per_1k_input,
        statistics=DISTRIBUTION,
        compared=MEAN_AND_P99,
        swept=MEAN_AND_P99,
    ),
    Metric(
        "decode_tokens_per_s",
        "Decode tokens/s per request",
        "tok/s",
        True,
        needs_streaming=True,
        definition="(output tokens - 1) / (E2E - TTFT): the tokens after the first over the time after it.",
        per_request=_decode_tokens_per_s,
        statistics=DISTRIBUTION,
        compared=("mean", "p50"),
        swept=("mean", "p50"),
    ),
    Metric(
        "output_throughput_per_user",
        "Output throughput per user",
        "tok/s",
        True,
        "1000 / mean TPOT in ms: the decode speed one request sees.",
        derived=_per_user,
        needs=("mean_tpot_ms",),
        swept=VALUE,
    ),
    Metric(
        "slo_attainment",
        "SLO attainment",
        "fraction",
        True,
        "Good requests / all requests; NaN for runs without an SLO.",
        derived=_attainment,
        needs=("good_requests", "total_requests"),
        swept=VALUE,
        bounds=FRACTION,
    ),
    # What the prefix cache served (the engine's count, or a server's usage.prompt_tokens_details.cached_tokens)
    # and how TTFT goes turn by turn: "not reported" (NaN, an empty cell) where nothing told, never a made-up 0.
    Metric(
        "total_cached_tokens",
        "Cached prompt tokens",
        "tokens",
        True,
        "Prompt tokens of completed requests the engine served from its prefix cache (LMDeploy's Response."
        "cached_tokens, a server's usage.prompt_tokens_details.cached_tokens, transformers' shared blocks); not "
        "reported where the engine does not say.",
        aggregate=_total_cached,
        workload=True,
    ),
    Metric(
        "prefix_cache_hit_rate",
        "Prefix cache hit rate",
        "fraction",
        True,
        "Cached prompt tokens / prompt tokens of the completed requests that reported it (LMDeploy's "
        "benchmark_chat_completion.py cache_hit_rate); not reported where the engine does not say.",
        aggregate=_hit_rate,
        workload=True,
        compared=VALUE,
        swept=VALUE,
        bounds=FRACTION,
    ),
    Metric(
        "cached_tokens",
        "Cached prompt tokens per request",
        "tokens",
        True,
        "Per completed request, the prompt tokens served from the prefix cache, where the engine reports them.",
        per_request=lambda table, streamed: _floats(table, "cached_tokens") if "cached_tokens" in table else None,
        statistics=("mean", "max"),
        workload=True,
    ),
    # The quality guard (measure/quality.py): where a run was checked against a baseline run's answers to the same
    # prompts (--drift-baseline) or scored against a quality set's references (--quality-set).
    Metric(
        quality.DRIFT_METRICS[quality.DRIFT_IDENTICAL],
        "Exact-match rate with the baseline",
        "fraction",
        True,
        "The share of completed requests whose answer's token ids are identical to the drift baseline run's answer to "
        "the same prompt (both greedy); 1 means no drift.",
        aggregate=_mean_of(quality.DRIFT_IDENTICAL),
        compared=VALUE,
        swept=VALUE,
        bounds=FRACTION,
    ),
    Metric(
        quality.DRIFT_METRICS[quality.DRIFT_DIVERGENCE],
        "Mean first divergence from the baseline",
        "tokens",
        True,
        "Over the completed requests, the mean position of the first token that differs from the drift baseline's "
        "answer (an answer identical to it counts its length).",
        aggregate=_mean_of(quality.DRIFT_DIVERGENCE),
        compared=VALUE,
    ),
    Metric(
        quality.DRIFT_METRICS[quality.DRIFT_OVERLAP],
        "Token overlap with the baseline",
        "fraction",
        True,
        "Over the completed requests, the mean share of token ids (with repeats) an answer has in common with the "
        "drift baseline's answer, over the longer of the two.",
        aggregate=_mean_of(quality.DRIFT_OVERLAP),
        compared=VALUE,
        bounds=FRACTION,
    ),
    Metric(
        quality.ACCURACY_METRIC,
        "Quality-set accuracy",
        "fraction",
        True,
        "The share of completed requests whose answer meets its quality-set record's reference by the record's "
        "scorer (exact, contains, regex, number).",
        aggregate=_mean_of(quality.QUALITY_CORRECT),
        compared=VALUE,
        swept=VALUE,
        bounds=FRACTION,
    ),
    *(
        Metric(
            f"ttft_turn{turn}",
            f"Mean TTFT of turn {turn}",
            "ms",
            False,
            f"Mean TTFT of the completed turn-{turn} requests of multi-turn sessions: against the turn number, it "
            "shows what reusing the conversation's prefix saves.",
            needs_streaming=True,
            aggregate=_turn_ttft(turn),
            value_column=f"mean_ttft_turn{turn}_ms",
            workload=True,
            swept=VALUE if turn <= 2 else (),
            compared=VALUE,  # where runs measured it: caching's effect on a conversation shows turn by turn
        )
        for turn in range(1, MAX_TURNS + 1)
    ),
    # A reasoning model's thinking, timed apart from its TTFT, which is its answer's (profile_restful_api.py's).
    Metric(
        "ttft_reasoning",
        "Time to first reasoning token",
        **_MS,
        larger_is_better=False,
        short_label="TTFT (reasoning)",
        needs_streaming=True,
        server_only=True,
        definition="From sending a request to the first chunk of reasoning text (reasoning_content or reasoning, "
        "as reasoning parsers stream it); not reported for a run without reasoning (HTTP servers only).",
        per_request=lambda table, streamed: (
            _floats(table, "first_reasoning_s") if "first_reasoning_s" in table else None
        ),
        statistics=DISTRIBUTION,
        swept=MEAN_AND_P99,
    ),
    # The steady window (measure/window.py): the run without its ramp-up and drain, beside the whole run's figures.
    Metric(
        "steady_window_start",
        "Steady window start",
        "s",
        None,
        "When the steady window starts, from the run's start: the requests in flight first at their target (the "
        "concurrency; at a rate or a trace, their mean in flight), or --warmup-seconds.",
        aggregate=_in_window(lambda part: part.window.start_s),
        value_column="steady_window_start_s",
        windowed=True,
    ),
    Metric(
        "steady_window_end",
        "Steady window end",
        "s",
        None,
        "When the steady window ends, from the run's start: the last request sent (a closed loop: the first "
        "request to end after it), or --cooldown-seconds before the run's end.",
        aggregate=_in_window(lambda part: part.window.end_s),
        value_column="steady_window_end_s",
        windowed=True,
    ),
    Metric(
        "steady_requests",
        "Requests sent in the steady window",
        "requests",
        None,
        "Requests sent within the steady window: its latencies are theirs.",
        aggregate=_in_window(lambda part: part.sent),
        windowed=True,
    ),
    Metric(
        "steady_output_throughput",
        "Output throughput (steady window)",
        "tok/s",
        True,
        "Output tokens of completed requests that came within the steady window (by their ticks) / its length.",
        aggregate=_in_window(lambda part: rate(part.output_tokens, part.window.duration_s)),
        windowed=True,
        compared=VALUE,
        swept=VALUE,
    ),
    Metric(
        "steady_request_throughput",
        "Request throughput (steady window)",
        "req/s",
        True,
        "Completed requests that ended within the steady window / its length.",
        aggregate=_in_window(lambda part: rate(part.ended, part.window.duration_s)),
        windowed=True,
        compared=VALUE,
    ),
    Metric(
        "steady_mean_ttft",
        "Mean TTFT (steady window)",
        "ms",
        False,
        "Mean time to first token of the completed requests sent within the steady window (streaming only).",
        needs_streaming=True,
        aggregate=_in_window(lambda part: _mean_ms(part.ttft_s)),
        value_column="steady_mean_ttft_ms",
        windowed=True,
        compared=VALUE,
        swept=VALUE,
    ),
    Metric(
        "steady_p99_ttft",
        "P99 TTFT (steady window)",
        "ms",
        False,
        "99th percentile of the time to first token of the completed requests sent within the steady window "
        "(streaming only).",
        needs_streaming=True,
        aggregate=_in_window(lambda part: _p99_ms(part.ttft_s)),
        value_column="steady_p99_ttft_ms",
        windowed=True,
        compared=VALUE,
    ),
    Metric(
        "steady_mean_tpot",
        "Mean TPOT (steady window)",
        "ms",
        False,
        "Mean time per output token of the completed requests sent within the steady window.",
        aggregate=_in_window(lambda part: _mean_ms(part.tpot_s)),
        value_column="steady_mean_tpot_ms",
        windowed=True,
        compared=VALUE,
    ),
    Metric(
        "steady_mean_e2e",
        "Mean E2E latency (steady window)",
        "ms",
        False,
        "Mean end-to-end latency of the completed requests sent within the steady window.",
        aggregate=_in_window(lambda part: _mean_ms(part.e2e_s)),
        value_column="steady_mean_e2e_ms",
        windowed=True,
    ),
    Metric(
        "time_slices",
        "Time slices",
        "",
        None,
        "Per slice of --time-slice seconds from the run's start: requests sent, output tokens/s (by their ticks) "
        "and the mean TTFT of the completed requests sent in it.",
        aggregate=_slices,
    ),
    # Hardware telemetry (telemetry.py), sampled at 10 Hz in the engine's process, over the measured window.
    Metric(
        "mean_gpu_util_percent",
        "Mean GPU utilisation",
        "%",
        True,
        "Time-weighted mean over the run of NVML's utilisation (share of time a kernel ran), averaged over the "
        "visible GPUs.",
        sampled=_sampled("mean_gpu_util_percent"),
        compared=VALUE,
        swept=VALUE,
        bounds=PERCENT,
    ),
    Metric(
        "peak_gpu_memory_gib",
        "Peak GPU memory",
        "GiB",
        None,
        "The most memory used on any visible GPU in a sample during the run (NVML, the whole device).",
        sampled=_in_gib("peak_gpu_memory_bytes"),
    ),
    Metric(
        "mean_gpu_power_w",
        "Mean GPU power",
        "W",
        None,
        "Time-weighted mean of the visible GPUs' power draw together over the run (NVML).",
        sampled=_sampled("mean_gpu_power_w"),
    ),
    Metric(
        "energy_per_output_token_j",
        "Energy per output token",
        "J/token",
        False,
        "The GPUs' power integrated over the run (trapezoid rule) / output tokens of completed requests.",
        sampled=_sampled("energy_per_output_token_j"),
        compared=VALUE,
        swept=VALUE,
    ),
    Metric(
        "mean_process_cpu_cores",
        "Engine process CPU",
        "cores",
        None,
        "CPU time the engine's process used per second of the run: 1.0 is one core busy all the time.",
        sampled=_sampled("mean_process_cpu_cores"),
    ),
    Metric(
        "peak_process_rss_gib",
        "Peak engine process memory (RSS)",
        "GiB",
        None,
        "The largest resident memory of the engine's process in a sample during the run.",
        sampled=_in_gib("peak_process_rss_bytes"),
    ),
    # Whether the engine had the machine to itself (hardware/contention.py's rule): in-process engines only.
    Metric(
        "other_cpu_cores",
        "Other processes' CPU",
        "cores",
        False,
        "Mean over the run of the machine's busy cores minus ours (the engine's process and the app following it "
        "from another process): what other processes took while the engine ran. Not judged for server runs, "
        "whose engine is a process we do not sample.",
        sampled=_sampled("mean_other_cpu_cores"),
    ),
    Metric(
        "machine_busy_share",
        "Run time saturated by other processes",
        "fraction",
        False,
        "Share of the run during which the machine's CPU was saturated while other processes held a large part "
        'of it (hardware/contention.py); past its threshold the run is flagged "machine busy".',
        sampled=_sampled("machine_busy_share"),
        bounds=FRACTION,
    ),
    # Whether the client kept up with a server run (hardware/client_bound.py's rule): HTTP server runs only.
    Metric(
        "mean_loop_lag_ms",
        "Mean client event-loop lag",
        "ms",
        False,
        "How late, on average, the HTTP client's event loop woke against a 10 ms timer (engines/loop_lag.py): "
        "the delay between a chunk's arrival and its timestamp, which every ITL and TTFT carries; at 10 ms or more "
        'the run is flagged "client bound" (a chosen limit).',
        sampled=_sampled("mean_loop_lag_s", 1000.0),
    ),
    Metric(
        "max_loop_lag_ms",
        "Max client event-loop lag",
        "ms",
        False,
        "The longest the HTTP client's event loop was late during the run: its longest stall.",
        sampled=_sampled("max_loop_lag_s", 1000.0),
    ),
    Metric(
        "client_cpu_cores",
        "Client process CPU",
        "cores",
        None,
        "CPU time the client used per second of the run: this process in a server run, or its worker processes "
        "together where it sends from several (--client-processes).",
        sampled=_sampled("mean_client_cpu_cores"),
    ),
    Metric(
        "client_saturated_share",
        "Run time the client's CPU was saturated",
        "fraction",
        False,
        "Share of the run during which the client's busiest process used 0.9 cores or more, all the CPU its event "
        'loop can have; at half the run or more it is flagged "client bound" (a chosen limit).',
        sampled=_sampled("client_saturated_share"),
        bounds=FRACTION,
    ),
    # The server's own Prometheus metrics (server_metrics.py), read during server runs.
    Metric(
        "peak_kv_cache_usage",
        "Peak KV-cache usage (server)",
        "fraction",
        None,
        "The highest KV-cache usage the server reported at a read of its /metrics during the run.",
        served=_sampled("peak_kv_cache_usage"),
        compared=VALUE,
        swept=VALUE,
        bounds=FRACTION,
    ),
    Metric(
        "mean_server_waiting",
        "Mean waiting requests (server)",
        "requests",
        False,
        "The mean over the run's reads of /metrics of the requests the server had waiting for a slot.",
        served=_sampled("waiting"),
        compared=VALUE,
        swept=VALUE,
    ),
    Metric(
        "server_prefix_hit_rate",
        "Prefix-cache hit rate (server)",
        "fraction",
        True,
        "vLLM: prefix-cache hit tokens / queried tokens over the run; LMDeploy and SGLang: the mean over the "
        "reads of the rate they serve.",
        served=_sampled("prefix_hit_rate"),
        swept=VALUE,
        bounds=FRACTION,
    ),
    Metric(
        "mean_spec_accept_length",
        "Mean acceptance length (server)",
        "tokens/step",
        True,
        "Speculative decoding: 1 + accepted draft tokens / drafts over the run (LMDeploy, vLLM); SGLang: the mean "
        "of its accept length over the reads.",
        served=_sampled("spec_accept_length"),
        compared=VALUE,
        swept=VALUE,
    ),
    Metric(
        "server_spec_acceptance_rate",
        "Draft acceptance rate (server)",
        "fraction",
        True,
        "Speculative decoding: accepted draft tokens / drafted tokens over the run (LMDeploy, vLLM); SGLang: the "
        "mean of its accept rate over the reads.",
        served=_sampled("spec_accept_rate"),
        compared=VALUE,
        swept=VALUE,
        bounds=FRACTION,
    ),
    Metric(
        "spec_acceptance_by_position",
        "Acceptance by draft position (server)",
        "",
        None,
        "Speculative decoding: for each draft position 1..k, the drafts whose token at that position was accepted / "
        "all drafts over the run, from the server's per-position counters (LMDeploy, vLLM), as a JSON list; SGLang "
        "serves no per-position counter.",
        served=lambda server: _position_text(server.get("spec_accept_by_position")),
    ),
    Metric(
        "mean_server_ttft_ms",
        "Mean server TTFT",
        "ms",
        False,
        "The server's time-to-first-token histogram over the run: the change of its sum / of its count.",
        served=_sampled("server_ttft_s", 1000.0),
        swept=VALUE,
    ),
    Metric(
        "ttft_gap_ms",
        "Client minus server TTFT",
        "ms",
        False,
        "Mean client TTFT - mean server TTFT: the network and the client (and requests the server counts "
        "apart, such as failed ones).",
        derived=_ttft_gap,
        needs=("mean_ttft_ms", "mean_server_ttft_ms"),
        compared=VALUE,
        swept=VALUE,
        bounds=UNBOUNDED,
    ),
)
METRICS: dict[str, Metric] = {metric.key: metric for metric in CATALOG}
LMDEPLOY_METRICS = tuple(metric for metric in CATALOG if metric.lmdeploy)
# LMDeploy's save_csv columns after its hyperparameters, in its order.
LMDEPLOY_COLUMNS = tuple(metric.lmdeploy for metric in LMDEPLOY_METRICS)
# The same columns in the history's single spelling.
HISTORY_METRIC_COLUMNS = tuple(metric.mean_column for metric in LMDEPLOY_METRICS)
# Per-request metrics every engine measures that LMDeploy's console table leaves out: the rows printed below it.
BEYOND_LMDEPLOY = tuple(
    metric
    for metric in CATALOG
    if metric.per_request is not None and not metric.lmdeploy_label and not metric.server_only and not metric.workload
)
WORKLOAD_METRICS = tuple(metric for metric in CATALOG if metric.workload)
STEADY_METRICS = tuple(metric for metric in CATALOG if metric.windowed)
# The quality guard's (measure/quality.py): a run has them where it was checked against a baseline or a quality set.
QUALITY_METRICS = tuple(
    metric for metric in CATALOG if metric.key in (*quality.DRIFT_METRICS.values(), quality.ACCURACY_METRIC)
)
# LMDeploy's names that the history spelled beside ours before it kept one spelling: read as ours.
LEGACY_COLUMNS = {old: new for old, new in zip(LMDEPLOY_COLUMNS, HISTORY_METRIC_COLUMNS) if old != new}


def _default_columns(field: str) -> tuple[str, ...]:
    return tuple(metric.column(stat) for metric in CATALOG for stat in getattr(metric, field))


# The results a reader looks at first, in this order: the History table's and the head of its comparison.
KEY_COLUMNS = ("output_throughput", "request_throughput", "mean_ttft_ms", "p99_ttft_ms", "mean_itl_ms", "mean_e2e_ms")
# The comparison's metrics: the key ones first, then the rest in the catalog's order.
COMPARED_COLUMNS = tuple(dict.fromkeys((*KEY_COLUMNS, *_default_columns("compared"))))
SWEPT_COLUMNS = _default_columns("swept")
# What a run with speculative decoding shows of it; each "not reported" where the engine reported nothing.
SPECULATIVE_COLUMNS = ("spec_acceptance_length", "spec_acceptance_rate")
SERVED_SPECULATIVE_COLUMNS = ("mean_spec_accept_length", "server_spec_acceptance_rate")  # the same, from /metrics
NOT_REPORTED = "not reported"

_FIXED_COLUMNS = {
    metric.column(stat): (metric, stat) for metric in CATALOG for stat in metric.statistics if stat != PERCENTILES
}
_PERCENTILE_SUFFIXES = {
    metric.column("").removeprefix("_"): metric for metric in CATALOG if PERCENTILES in metric.statistics
}


def find_column(name: str) -> tuple[Metric, str] | None:
    """The metric and statistic a summary key or history column holds ("p99.9_itl_ms" -> itl, "p99.9")."""
    if name in _FIXED_COLUMNS:
        return _FIXED_COLUMNS[name]
    statistic, _, rest = name.partition("_")
    metric = _PERCENTILE_SUFFIXES.get(rest)
    if metric is None or not statistic.startswith("p"):
        return None
    try:
        float(statistic[1:])
    except ValueError:
        return None
    return metric, statistic


def lower_first(label: str) -> str:
    """A label inside a title: "Concurrency" -> "concurrency", but "KV cache", "TTFT", "P99" and "ShareGPT" keep their
    capitals (a first word with a capital or a digit past its first letter is a name)."""
    word = label.split(" ", 1)[0]
    return label if any(c.isupper() or c.isdigit() for c in word[1:]) else label[:1].lower() + label[1:]


def column_label(metric: Metric, statistic: str, short: bool = False) -> str:
    """ "Mean time to first token", "P99 inter-token latency"; with `short`, by the metric's short label where it has
    one ("Mean TTFT")."""
    label = metric.short_label if short and metric.short_label else metric.label
    if statistic == "value":
        return label
    prefix = _STATISTIC_LABELS.get(statistic, statistic.upper())
    return f"{prefix} {lower_first(label)}"


def column_direction(metric: Metric, statistic: str) -> bool | None:
    """Which way is better for one statistic: the metric's own, but a smaller spread is always better."""
    return False if statistic == "std" else metric.larger_is_better


def column_bounds(name: str) -> tuple[float, float]:
    """The physical range of a history column's values: its metric's bounds, unbounded for any other column."""
    found = find_column(name)
    return found[0].bounds if found else UNBOUNDED


def lmdeploy_row(summary: Mapping[str, Any]) -> dict[str, Any]:
    """LMDeploy's save_csv metric columns, in its order and formats, from a summary (or a history row read
    as numbers): three decimals where LMDeploy rounds, '-' where nothing was measured."""
    row = {}
    for metric in LMDEPLOY_METRICS:
        value = summary.get(metric.mean_column, math.nan)
        if isinstance(value, (float, np.floating)) and math.isnan(value):
            row[metric.lmdeploy] = NOT_MEASURED
        else:
            row[metric.lmdeploy] = value if metric.lmdeploy_digits is None else f"{value:.{metric.lmdeploy_digits}f}"
    return row


def steady_rows(summary: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """The steady window's rows of a run's summary, each (title, value), then its time slices, a line each (value
    None); nothing for a summary without them."""
    rows = [
        (metric.label if metric.unit == "requests" else metric.title, summary[metric.column()])
        for metric in STEADY_METRICS
        if metric.column() in summary
    ]
    slices = summary.get(METRICS["time_slices"].column())
    if isinstance(slices, str) and slices:
        rows.append((f"{METRICS['time_slices'].label}:", None))
        rows.extend((f"  {part}", None) for part in slices.split("; "))
    return rows


def telemetry_columns(telemetry: Mapping[str, Any]) -> dict[str, Any]:
    """The sampled metrics' history columns from a run's telemetry summary; those not measured are left out."""
    return _summary_columns(telemetry, "sampled")


def server_columns(server: Mapping[str, Any]) -> dict[str, Any]:
    """The served metrics' history columns from the summary of a server's own metrics; those not served are left out."""
    return _summary_columns(server, "served")


def _summary_columns(summary: Mapping[str, Any], formula: str) -> dict[str, Any]:
    columns = {
        metric.column(): getattr(metric, formula)(summary) for metric in CATALOG if getattr(metric, formula) is not None
    }
    return {key: value for key, value in columns.items() if value is not None}


def sampled_values(summary: Mapping[str, Any], formula: str = "sampled") -> list[tuple[Metric, float]]:
    """The metrics of a formula kind ("sampled": hardware telemetry; "served": the server's own metrics) a summary
    or history row holds a number for, in catalog order."""
    found = []
    for metric in CATALOG:
        if getattr(metric, formula) is None:
            continue
        try:
            number = float(summary.get(metric.column(), math.nan))
        except (TypeError, ValueError):
            continue
        if not math.isnan(number):
            found.append((metric, number))
    return found


def with_derived(runs: pd.DataFrame) -> pd.DataFrame:
    """History rows plus every derived metric's column (NaN where a row lacks what it needs)."""
    frame = runs.copy()

    def column(name: str) -> pd.Series:
        return pd.to_numeric(frame.get(name, pd.Series(np.nan, index=frame.index)), errors="coerce")

    for metric in CATALOG:
        if metric.derived is not None:
            frame[metric.column()] = metric.derived(column)
    return frame
