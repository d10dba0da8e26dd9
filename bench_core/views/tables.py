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

from ..config import SETTINGS
from ..measure.catalog import (
    CATALOG,
    COMPARED_COLUMNS,
    METRICS,
    NOT_MEASURED,
    NOT_REPORTED,
    PER_1K_MIN_PROMPT,
    PERCENTILES,
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
from ..measure.stats import compare

MISSING = NOT_MEASURED  # a table cell without a value reads as LMDeploy prints it
# Decimals shown: enough for three significant digits, and at least this many.
MIN_DECIMALS = 3
MAX_DECIMALS = 9
BETTER = "better"
WORSE = "worse"
BEYOND_NOISE = "beyond noise"
WITHIN_NOISE = "within noise"
SINGLE_RUN = "single run, spread unknown"
ONE_CONFIGURATION = "repeats of one configuration"
# What a verdict says, kept out of its cells so the column stays narrow beside the runs.
NOISE_VERDICT_HELP = (
    "Welch's t-test between the configurations with the lowest and the highest mean (runs with the "
    "same settings are repeats of one): beyond noise where p < 0.05. It needs two runs of each."
)
_MARK_COLOURS = {
    BETTER: "background-color: rgba(46, 160, 67, 0.25)",
    WORSE: "background-color: rgba(218, 54, 51, 0.25)",
}


@dataclass(frozen=True)
class ColumnSpec:
    """How a history column is shown and compared; `larger_is_better` is None when neither is."""

    name: str
    label: str
    unit: str
    larger_is_better: bool | None

    @property
    def title(self) -> str:
        """Label with its unit, for an axis or a table row."""
        return f"{self.label} ({self.unit})" if self.unit else self.label


# History columns that are neither metrics nor settings: the engine's load time, LMDeploy's batch size, and the output
# length a run asked for whichever dataset holds it (run_diff's).
_COLUMNS = {
    spec.name: spec
    for spec in (
        ColumnSpec("load_seconds", "Engine load time", "s", False),
        ColumnSpec("warmup_seconds", "Warm-up time", "s", None),
        ColumnSpec("bs", "Batch size", "requests", None),
        ColumnSpec("output_length", "Output length", "tokens", None),
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
        return ColumnSpec(name, column_label(metric, statistic), metric.shown_unit, column_direction(metric, statistic))
    if name in _SETTINGS:
        setting = _SETTINGS[name]
        return ColumnSpec(name, setting.shown_label, setting.unit, None)
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


def per_1k_input_caveat(summary: Mapping[str, Any]) -> str:
    """Why the table's TTFT per 1,000 input tokens means nothing for this run, or "": its prompts are short
    (a 1-token prompt multiplies a fixed 1.5 s TTFT into 1,500,000 ms per 1,000 tokens)."""
    metric = METRICS["ttft_per_1k_input"]
    completed = _number(summary.get("completed"))
    if metric.mean_column not in summary or not completed > 0:
        return ""
    mean_prompt = _number(summary.get("total_input_tokens")) / completed
    if not mean_prompt < PER_1K_MIN_PROMPT:
        return ""
    return (
        f"{metric.label} means little here: the prompts average {count_of(mean_prompt, 'tokens')} (under "
        f"{PER_1K_MIN_PROMPT}), so TTFT is mostly fixed cost, and scaling it to 1,000 tokens multiplies that."
    )


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
        ):
            continue
        rows[metric.label] = (_number(summary[key]), metric.unit)
    return _value_table(rows, value_type=float)


def speculative_table(summary: dict) -> pd.DataFrame:
    """Speculative decoding's figures for a run that asked for it: each one's value, or "not reported" where the
    engine reported nothing (never 0), and its unit."""
    rows = {}
    for key in SPECULATIVE_COLUMNS:
        metric, _ = find_column(key)
        value = _number(summary.get(key))
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


def _value_table(rows: dict[str, tuple[object, str]], value_type: type = object) -> pd.DataFrame:
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


def compare_runs(
    runs: pd.DataFrame, metrics: Sequence[str] = COMPARED_COLUMNS, names: Sequence[str] | None = None
) -> pd.DataFrame:
    """Runs side by side: one column per run (named `names`, by default `run_names`), one row per metric, titled
    with its unit; by default the catalog's compared metrics."""
    values = _metric_matrix(runs, metrics, names)
    values.index = [describe_column(name).title for name in metrics]
    values.index.name = "metric"
    return values


def compare_marks(
    runs: pd.DataFrame, metrics: Sequence[str] = COMPARED_COLUMNS, names: Sequence[str] | None = None
) -> pd.DataFrame:
    """Same shape as `compare_runs`: "better" on each row's best run(s), "worse" on its worst, else "".

    Rows whose metric has no better direction, or fewer than two different values, stay unmarked.
    """
    values = _metric_matrix(runs, metrics, names)
    marks = pd.DataFrame("", index=values.index, columns=values.columns, dtype=object)
    for name in metrics:
        row = values.loc[name]
        direction = describe_column(name).larger_is_better
        present = row.dropna()
        if direction is None or present.nunique() < 2:
            continue
        best, worst = (present.max(), present.min()) if direction else (present.min(), present.max())
        marks.loc[name, row == best] = BETTER
        marks.loc[name, row == worst] = WORSE
    marks.index = [describe_column(name).title for name in metrics]
    marks.index.name = "metric"
    return marks


def noise_verdicts(runs: pd.DataFrame, metrics: Sequence[str], groups: Sequence[int]) -> list[str]:
    """Per metric, whether the runs differ by more than their run-to-run noise. Runs sharing a group number
    are repeats of one configuration; the configurations with the lowest and the highest mean are compared
    by Welch's t-test (stats.compare), which needs two runs of each to measure a spread."""
    values = _metric_matrix(runs, metrics).to_numpy()
    groups = np.asarray(groups)
    verdicts = []
    for row in values:
        samples = [row[(groups == group) & np.isfinite(row)] for group in np.unique(groups)]
        samples = sorted((sample for sample in samples if sample.size), key=np.mean)
        if len(samples) < 2:  # nothing to compare, unless every run is a repeat of one configuration
            verdicts.append(ONE_CONFIGURATION if samples and np.unique(groups).size == 1 else "")
            continue
        result = compare(samples[0], samples[-1])
        if result.significant is None:
            verdicts.append(SINGLE_RUN)
            continue
        verdict = BEYOND_NOISE if result.significant else WITHIN_NOISE
        verdicts.append(f"{verdict} (p = {result.p_value:.2g}; {result.a.n} vs {result.b.n} runs)")
    return verdicts


def style_comparison(table: pd.DataFrame, marks: pd.DataFrame):
    """A Styler for st.dataframe: better cells green, worse red."""
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
