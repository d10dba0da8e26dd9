"""Tables for the dashboard, built from a run summary, a per-request table or history rows.

Pure pandas, no I/O and no streamlit: a page hands the frames to `st.dataframe` or a download.
History columns are described here once (`describe_column`: label, unit, which direction is
better): metric columns from the metric catalog, settings from the table below; the charts read the
same descriptions for their axis titles. Latencies are stored in seconds and shown in ms. Every number a
table shows is written by `format_number`, so all tables read alike.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ..config import SETTINGS, SLO
from ..config.catalog import CACHE_COLD, CACHE_UNKNOWN, CACHE_WARM
from ..engines import in_process_backends
from ..load import find_dataset
from ..measure.catalog import (
    CATALOG,
    METRICS,
    NOT_MEASURED,
    NOT_REPORTED,
    PER_1K_MIN_PROMPT,
    PERCENTILES,
    QUALITY_METRICS,
    SPECULATIVE_COLUMNS,
    VALUE,
    WORKLOAD_METRICS,
    column_direction,
    column_label,
    find_column,
    percentile_key,
    sampled_values,
    with_derived,
)
from ..measure.speculation_speedup import describe_ratio
from ..measure.stats import Comparison, compare, paired_ratio
from ..states import LoadPattern, RequestStatus

MISSING = NOT_MEASURED  # a table cell without a value reads as LMDeploy prints it
# Decimals shown: enough for three significant digits, and at least this many.
MIN_DECIMALS = 3
MAX_DECIMALS = 9
BETTER = "better"
WORSE = "worse"
CHANGED = "changed"  # beyond noise, on a metric of which neither direction is better
# Beside a change beyond run-to-run noise: the cell says so in words a screen reader and a copy keep, not by colour only.
BEYOND_NOISE_MARK = "*"
_MARK_COLOURS = {
    BETTER: "background-color: rgba(46, 160, 67, 0.25)",
    WORSE: "background-color: rgba(218, 54, 51, 0.25)",
    CHANGED: "background-color: rgba(9, 105, 218, 0.2)",
}


@dataclass(frozen=True)
class ColumnSpec:
    """How a history column is shown and compared; `larger_is_better` is None when neither is."""

    name: str
    label: str
    unit: str
    larger_is_better: bool | None
    # Its header in a table of many columns (History's runs), whose help gives the title: a metric by its short label
    # ("Mean TTFT (ms)"), a setting by its label alone ("Concurrency"); the title where it has none.
    short_title: str = ""

    @property
    def title(self) -> str:
        """Label with its unit, for an axis or a table row."""
        return f"{self.label} ({self.unit})" if self.unit else self.label

    @property
    def header(self) -> str:
        return self.short_title or self.title


# History columns that are neither metrics nor settings: the engine's load time, LMDeploy's batch size, and the output
# length a run asked for whichever dataset holds it (run_diff's).
_COLUMNS = {
    spec.name: spec
    for spec in (
        ColumnSpec("load_seconds", "Engine load time", "s", False),
        ColumnSpec("warmup_seconds", "Warm-up time", "s", None),
        # What the prefix cache held when the clock started (cold, warm, unknown): a fact, beside the setting asking.
        ColumnSpec("cache_start", "Prefix cache at start", "", None),
        ColumnSpec("bs", "Batch size", "requests", None),
        ColumnSpec("output_length", "Output length", "tokens", None, "Output length"),
    )
}
_SETTINGS = {setting.key: setting for setting in SETTINGS}


def describe_column(name: str) -> ColumnSpec:
    """Label, unit and direction of a history column; unknown columns get their name as label."""
    if name in _COLUMNS:
        return _COLUMNS[name]
    found = find_column(name)  # before the settings: duration_s is the measured duration, not the time limit
    if found:
        metric, statistic = found
        unit, direction = metric.shown_unit, column_direction(metric, statistic)
        short = f"{column_label(metric, statistic, short=True)} ({unit})" if metric.short_label and unit else ""
        return ColumnSpec(name, column_label(metric, statistic), unit, direction, short)
    if name in _SETTINGS:
        setting = _SETTINGS[name]
        return ColumnSpec(name, setting.shown_label, setting.unit, None, setting.shown_label)
    return ColumnSpec(name, name.replace("_", " ").capitalize(), "", None)


def count_of(n: float, plural: str) -> str:
    """ "1 request", "2 requests", "1,200 gaps", "2.500 tokens": a number (`format_number`) with its noun in the
    number it takes."""
    return f"{format_number(n)} {plural.removesuffix('s') if n == 1 else plural}"


def format_number(value) -> str:
    """A number as every table shows it: thousands separators, whole numbers without decimals, others with
    3 decimals (more below 0.1, to keep 3 significant digits: 0.000123); missing values are a dash."""
    if isinstance(value, str):
        return value
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value))
    number = _number(value)
    if math.isnan(number):
        return MISSING
    if math.isinf(number):
        return "∞" if number > 0 else "-∞"
    if number.is_integer() and abs(number) < 1e15:
        return f"{int(number):,}"
    size = abs(number)
    decimals = MIN_DECIMALS if size >= 0.1 else 2 - math.floor(math.log10(size))
    if decimals > MAX_DECIMALS:
        return f"{number:.3g}"
    return f"{number:,.{decimals}f}"


def formatted(table: pd.DataFrame) -> pd.DataFrame:
    """`table` as text for display: numbers through `format_number`, missing text as a dash. A named index
    (a table's row titles) becomes the first column, so a page can size and show it like any other."""
    if table.index.name is not None:
        table = table.reset_index()
    return pd.DataFrame(
        {name: [_display_cell(cell) for cell in table[name]] for name in table.columns}, index=table.index, dtype=object
    )


def _display_cell(cell) -> str:
    if cell is None or (not isinstance(cell, str) and pd.api.types.is_scalar(cell) and pd.isna(cell)):
        return MISSING
    if isinstance(cell, (int, float, np.integer, np.floating, bool, np.bool_)):
        return format_number(cell)
    return str(cell)


# ---- one run ---------------------------------------------------------------------------------


def percentile_table(summary: dict, percentiles: Sequence[float], stream_output: bool) -> pd.DataFrame:
    """LMDeploy's latency table in ms: mean, the configured percentiles, then std/min/max; one row per catalog
    metric with percentiles that the summary holds.

    Metrics that need streaming appear only for streamed runs, as LMDeploy prints them; statistics a metric
    does not have (tokens per tick has no std/min/max, as in LMDeploy's table) and missing values are NaN.
    """
    statistics = ["mean", *(percentile_key(q) for q in percentiles), "std", "min", "max"]
    rows = {}
    for metric in CATALOG:
        if PERCENTILES not in metric.statistics or metric.mean_column not in summary:
            continue
        if metric.needs_streaming and not stream_output:
            continue
        rows[metric.row_title] = [_number(summary.get(metric.column(stat))) for stat in statistics]
    columns = ["mean", *(percentile_key(q).upper() for q in percentiles), "std", "min", "max"]
    table = pd.DataFrame.from_dict(rows, orient="index", columns=columns, dtype=float)
    table.index.name = "metric"
    return table


def describe_slo(slo: SLO | None) -> str:
    """The thresholds an SLO sets, as a request must meet them all: "TTFT ≤ 5,000 ms, E2E ≤ 20,000 ms"; "no
    threshold set" for an SLO (or None) that sets none."""
    values = ((name, None if slo is None else getattr(slo, name)) for name in ("ttft", "tpot", "e2e"))
    thresholds = [f"{name.upper()} ≤ {value * 1000:,g} ms" for name, value in values if value is not None]
    return ", ".join(thresholds) or "no threshold set"


def per_1k_input_caveats(summary: Mapping[str, Any], load: Any) -> list[str]:
    """Why the table's TTFT per 1,000 input tokens means little for this run (its `load`: a LoadConfig), if it does:
    its prompts are short (a 1-token prompt multiplies a fixed 1.5 s TTFT into 1,500,000 ms per 1,000 tokens), or
    every request arrived at once, so a TTFT holds the wait behind the other prompts, not its own prompt's prefill."""
    metric = METRICS["ttft_per_1k_input"]
    if not load.stream_output or metric.mean_column not in summary:
        return []
    caveats = []
    completed = _number(summary.get("completed"))
    mean_prompt = _number(summary.get("total_input_tokens")) / completed if completed > 0 else math.nan
    if mean_prompt < PER_1K_MIN_PROMPT:
        caveats.append(
            f"{metric.label} means little here: the prompts average {count_of(mean_prompt, 'tokens')} (under "
            f"{PER_1K_MIN_PROMPT}), so TTFT is mostly fixed cost, and scaling it to 1,000 tokens multiplies that."
        )
    if load.load_pattern == LoadPattern.BATCH or (
        load.load_pattern == LoadPattern.REQUEST_RATE and load.request_rate == math.inf
    ):
        caveats.append(
            f"{metric.label} is not prefill speed here: every request arrived at once, so a request's TTFT holds "
            "its wait behind the other prompts (queue and their prefill), not its own prompt's prefill alone."
        )
    return caveats


# What each recorded prefix-cache state at a run's start means, for the Run page and the report.
CACHE_START_MEANING = {
    CACHE_COLD: "cold: nothing an earlier run sent was cached when the clock started",
    CACHE_WARM: "warm: what earlier runs (and this one's warm-up) left cached was kept",
    CACHE_UNKNOWN: "unknown: it could not be dropped (the warning says why), so earlier runs' prefixes may be cached",
}


def cache_start_sentence(state: str) -> str:
    """The run's prefix-cache state at its start in words; "" for a run recorded before the state was."""
    meaning = CACHE_START_MEANING.get(str(state).strip(), "")
    return f"Prefix cache at the start: {meaning}." if meaning else ""


def workload_caveats(config: Any) -> list[str]:
    """Why this run's setup (a RunConfig) hides what its workload is there to show, if it does: shared prefixes
    sent at once, with prefix caching on (the engine's knob, or a server's own, which the run cannot see)."""
    engine = config.engine
    caching = engine.enable_prefix_caching or engine.backend not in in_process_backends()
    ran = find_dataset(config.dataset.dataset_name)
    note = ran.hidden_reuse_note(config.dataset, config.load, caching) if ran is not None else ""
    return [note] if note else []


def throughput_table(summary: dict) -> pd.DataFrame:
    """Duration, request counts, token totals and throughputs (the run's single-valued catalog metrics that
    are numbers, the summary holds, and every engine measures): one row each, a value and its unit."""
    rows = {}
    for metric in CATALOG:
        key = metric.column()
        if (
            metric.is_distribution
            or metric.server_only
            or metric.workload
            or not metric.unit
            or key not in summary
            or key in SPECULATIVE_COLUMNS
            or metric in QUALITY_METRICS  # in their own table (quality_table)
        ):
            continue
        rows[metric.label] = (_number(summary[key]), metric.unit)
    return _value_table(rows, value_type=float)


def quality_table(summary: Mapping[str, Any]) -> pd.DataFrame:
    """The run's drift from its baseline and its accuracy on its quality set (measure/quality.py), one row each
    that the summary has a number for; empty for a run checked against neither."""
    rows = {
        metric.label: (value, metric.unit)
        for metric in QUALITY_METRICS
        if not math.isnan(value := _number(summary.get(metric.column())))
    }
    return _value_table(rows, value_type=float)


def speculative_table(summary: dict) -> pd.DataFrame:
    """Speculative decoding's figures for a run that asked for it: each one's value, or "not reported" where the
    engine reported nothing (never 0), and its unit."""
    rows = {}
    for key in SPECULATIVE_COLUMNS:
        found = find_column(key)
        assert found is not None, f"{key} is a catalog column"
        metric, value = found[0], _number(summary.get(key))
        rows[metric.label] = (NOT_REPORTED if math.isnan(value) else value, metric.unit)
    return _value_table(rows)


def workload_metrics_table(summary: dict) -> pd.DataFrame:
    """What the prefix cache served and TTFT turn by turn (the catalog's workload metrics the summary holds): one
    row each, its value ("not reported" where the engine did not say) and its unit."""
    rows = {}
    for metric in WORKLOAD_METRICS:
        key = metric.mean_column
        if key in summary:
            value = _number(summary[key])
            rows[metric.label if metric.statistics == VALUE else column_label(metric, "mean")] = (
                NOT_REPORTED if math.isnan(value) else value,
                metric.unit,
            )
    return _value_table(rows)


def _value_table(rows: Mapping[str, tuple[object, str]], value_type: type = object) -> pd.DataFrame:
    """label -> (value, unit) as a table indexed by quantity; values that may read "not reported" stay objects."""
    table = pd.DataFrame.from_dict(rows, orient="index", columns=["value", "unit"], dtype=object)
    table["value"] = table["value"].astype(value_type)
    table.index.name = "quantity"
    return table


_BASE_REQUEST_COLUMNS = {
    "index",
    "status",
    "reason",
    "input_len",
    "req_output_len",
    "output_len",
    "ttft_s",
    "tpot_s",
    "e2e_s",
    "itl_s",
    "tokens_per_tick",
    "n_ticks",
    "start_s",
    "finish_s",
}


def quantity_table(summary: Mapping[str, Any], formula: str) -> pd.DataFrame:
    """The run's metrics of one formula kind ("sampled": hardware; "served": the server's own metrics) with a
    number in `summary` (a summary or a history row), and the derived ones they feed, as quantity/value/unit rows."""
    found = sampled_values(summary, formula)
    kind = {metric.key for metric, _ in found}
    fed = [
        metric
        for metric in CATALOG
        if metric.derived is not None
        and any((described := find_column(need)) is not None and described[0].key in kind for need in metric.needs)
    ]
    if fed:
        derived = with_derived(pd.DataFrame([dict(summary)]))
        found += [
            (metric, float(value)) for metric in fed if np.isfinite(value := _number(derived[metric.column()].iloc[0]))
        ]
    return pd.DataFrame(
        {
            "quantity": [metric.label for metric, _ in found],
            "value": [value for _, value in found],
            "unit": [metric.unit for metric, _ in found],
        }
    )


def requests_for_display(table: pd.DataFrame) -> pd.DataFrame:
    """The per-request table with latencies in ms and ITL as a count and a mean instead of raw lists."""
    itl = [_values(v) for v in table["itl_s"]] if "itl_s" in table else [np.array([])] * len(table)
    with np.errstate(invalid="ignore"):
        itl_mean_ms = [v.mean() * 1000 if v.size else math.nan for v in itl]
    return pd.DataFrame(
        {
            "request": table["index"].to_numpy(),
            "status": table["status"].to_numpy(dtype=object),
            "reason": table["reason"].to_numpy(dtype=object),
            "input_len": table["input_len"].to_numpy(),
            "req_output_len": table["req_output_len"].to_numpy(),
            "output_len": table["output_len"].to_numpy(),
            "ttft_ms": table["ttft_s"].to_numpy(dtype=np.float64) * 1000,
            "tpot_ms": table["tpot_s"].to_numpy(dtype=np.float64) * 1000,
            "e2e_ms": table["e2e_s"].to_numpy(dtype=np.float64) * 1000,
            "itl_count": np.array([v.size for v in itl], dtype=np.int64),
            "itl_mean_ms": np.array(itl_mean_ms, dtype=np.float64),
            "n_ticks": table["n_ticks"].to_numpy(),
            "start_s": table["start_s"].to_numpy(dtype=np.float64),
            "finish_s": table["finish_s"].to_numpy(dtype=np.float64),
            # An engine's own per-request columns (an HTTP server's usage and retokenized counts) as they are.
            **{name: table[name].to_numpy() for name in table.columns if name not in _BASE_REQUEST_COLUMNS},
        }
    )


# ---- several runs ----------------------------------------------------------------------------


def run_names(runs: pd.DataFrame) -> list[str]:
    """A unique column name per run: its label, or its run id when it has none or shares it."""
    ids = runs["run_id"].astype(str).tolist()
    labels = [_text(v) for v in runs["label"]] if "label" in runs else [""] * len(ids)
    counts = pd.Series(labels).value_counts()
    return [
        label if label and counts[label] == 1 else (f"{label} · {run_id}" if label else run_id)
        for label, run_id in zip(labels, ids)
    ]


def against_baseline(
    runs: pd.DataFrame, metrics: Sequence[str], names: Sequence[str], groups: Sequence[int], baseline: int
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The runs against a baseline: one row per metric (titled with its unit), one column per run (named `names`),
    the baseline's (the run at position `baseline`) first, then the others in their order. Each other run's cell is
    its value and its change against the baseline's in % (`format_change`), marked BEYOND_NOISE_MARK where Welch's
    t-test between the two runs' setups says the change is beyond their run-to-run noise (p < 0.05).

    `groups` numbers the runs' setups: runs sharing a number are repeats of one (run_diff.repeat_groups). A setup run
    once has no spread to judge by, and a repeat of the baseline's setup differs from it by noise alone: their
    changes are not judged. Returns the cells and their marks: BETTER / WORSE (CHANGED on a metric of which neither
    direction is better) on the changes beyond noise, "" elsewhere."""
    setups = np.asarray(groups)
    values = _metric_matrix(runs, metrics, names)
    cells = pd.DataFrame(MISSING, index=values.index, columns=values.columns, dtype=object)
    marks = pd.DataFrame("", index=values.index, columns=values.columns, dtype=object)
    for at, (name, samples) in enumerate(zip(metrics, values.to_numpy())):
        for position, value in enumerate(samples):
            change = format_change(value, samples[baseline]) if position != baseline else ""
            mark = _beyond_noise(samples, setups, baseline, position, name)
            parts = (format_number(value), change and f"({change})", mark and BEYOND_NOISE_MARK)
            cells.iat[at, position] = " ".join(part for part in parts if part)
            marks.iat[at, position] = mark
    order = [baseline, *(position for position in range(len(runs)) if position != baseline)]
    titles = [describe_column(name).title for name in metrics]
    cells, marks = cells.iloc[:, order], marks.iloc[:, order]
    cells.index, marks.index = titles, titles
    return cells, marks


def _beyond_noise(values: np.ndarray, groups: np.ndarray, baseline: int, position: int, metric: str) -> str:
    """BETTER, WORSE or CHANGED where the setups of the runs at `baseline` and `position` differ on `metric` by more
    than their run-to-run noise (Welch's t-test over their repeats, `values` in the runs' order); "" otherwise."""
    return change_verdict(setup_comparison(values, groups, baseline, position), metric)


def setup_comparison(values: np.ndarray, groups: np.ndarray, baseline: int, position: int) -> Comparison | None:
    """The setup of the run at `position` against the baseline's (Welch's t-test over their repeats' finite `values`,
    in the runs' order, `groups` numbering their setups); None for the baseline or a repeat of it, and where the run
    has no value."""
    if groups[position] == groups[baseline] or not np.isfinite(values[position]):
        return None
    base, other = (values[(groups == groups[at]) & np.isfinite(values)] for at in (baseline, position))
    return compare(base, other)


def change_verdict(comparison: Comparison | None, metric: str) -> str:
    """BETTER, WORSE or CHANGED (on a metric of which neither direction is better) where `comparison` says the change
    is beyond noise; "" otherwise."""
    if comparison is None or not comparison.significant:
        return ""
    direction = describe_column(metric).larger_is_better
    if direction is None:
        return CHANGED
    return BETTER if (comparison.difference > 0) == direction else WORSE


def format_change(value: float, base: float) -> str:
    """`value` against `base` in %: "+20.1 %", "-3.5 %", "+1,250 %"; "" where there is no base to divide by."""
    value, base = _number(value), _number(base)
    if not (math.isfinite(value) and math.isfinite(base)) or base == 0:
        return ""
    percent = (value - base) / abs(base) * 100
    return f"{percent:+,.0f} %" if abs(percent) >= 100 else f"{percent:+.1f} %"


def style_comparison(table: pd.DataFrame, marks: pd.DataFrame):
    """A Styler for st.dataframe and the reports: better cells green, worse red, other changes beyond noise blue."""
    return table.style.apply(lambda _: marks.map(lambda mark: _MARK_COLOURS.get(mark, "")), axis=None)


def _metric_matrix(runs: pd.DataFrame, metrics: Sequence[str], names: Sequence[str] | None = None) -> pd.DataFrame:
    """Numbers only, indexed by metric column name, a column per run (`names`, by default `run_names`); a column
    the history lacks is all NaN."""
    names = run_names(runs) if names is None else list(names)
    columns = {
        name: pd.to_numeric(runs[name], errors="coerce").to_numpy(dtype=np.float64)
        if name in runs
        else np.full(len(runs), math.nan)
        for name in metrics
    }
    return pd.DataFrame.from_dict(columns, orient="index", columns=names, dtype=float)


def _number(value) -> float:
    """Summary values as floats; missing, None and unparsable text ('-') become NaN."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _text(value) -> str:
    return "" if pd.isna(value) else str(value)


def _values(cell) -> np.ndarray:
    """An ITL cell (a list, a numpy array from parquet, or None) as a float array."""
    if cell is None or (isinstance(cell, float) and math.isnan(cell)):
        return np.array([])
    return np.asarray(cell, dtype=np.float64)


# The per-request metrics a run is set against the baseline's on the same requests (paired_ratios).
PAIRED_METRICS = ("ttft", "tpot", "e2e", "decode_tokens_per_s")


def paired_ratios(
    request_tables: Mapping[str, pd.DataFrame], baseline: str, not_streamed: Sequence[str] = ()
) -> pd.DataFrame:
    """Per metric (a row), each run's mean over the baseline's (a column) on the requests both served, paired request
    by request, with its 95% bootstrap interval: "0.61 (0.55 to 0.68)". Only the runs of the baseline's prompts (the
    same number, each of the same input length) are set against it: the paired run of a preset, a run again; a
    metric that needs streamed output only where both runs were streamed. Empty where no run pairs with it."""
    base = request_tables.get(baseline)
    columns: dict[str, pd.Series] = {}
    for name, table in request_tables.items():
        if base is None or name == baseline or not same_prompts(base, table):
            continue
        cells = {}
        for key in PAIRED_METRICS:
            metric = METRICS[key]
            if metric.needs_streaming and {name, baseline} & set(not_streamed):
                continue
            paired = paired_request_values(key, base, table)
            if paired is not None and (ratio := paired_ratio(*paired)).n >= 2:
                cells[metric.label] = describe_ratio(ratio)
        columns[name] = pd.Series(cells, dtype=object)
    return pd.DataFrame(columns)


def same_prompts(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    """Whether two runs' request tables are of the same prompts, in the same order (each of the same input length)."""
    return len(a) == len(b) and np.array_equal(a["input_len"].to_numpy(), b["input_len"].to_numpy())


def paired_request_values(
    metric_key: str, base: pd.DataFrame, other: pd.DataFrame
) -> tuple[np.ndarray, np.ndarray] | None:
    """A per-request metric (a METRICS key) of two runs' request tables, request by request, NaN where a request did
    not succeed; None where the metric has no single value per request."""
    metric = METRICS[metric_key]
    a, b = (_served_values(metric, frame) for frame in (base, other))
    return None if a is None or b is None else (a, b)


def _served_values(metric, table: pd.DataFrame) -> np.ndarray | None:
    """The metric's value per request, NaN where the request did not succeed; None where it has no single value."""
    values = metric.per_request(table, True)
    if not isinstance(values, np.ndarray):
        return None
    return np.where(table["status"].to_numpy(dtype=object) == RequestStatus.SUCCESS, values.astype(float), np.nan)
