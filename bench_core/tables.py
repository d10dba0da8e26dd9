"""Tables for the dashboard, built from a run summary, a per-request table or history rows.

Pure pandas, no I/O and no streamlit: a page hands the frames to `st.dataframe` or a download.
History columns are described here once (`describe_column`: label, unit, which direction is
better) from their regular names (`p99_ttft_ms`, `output_throughput`, `concurrency`); the charts
read the same descriptions for their axis titles. Latencies are stored in seconds and shown in ms.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .metrics import METRICS, STREAM_ONLY_METRICS, percentile_key

BETTER = "better"
WORSE = "worse"
_MARK_COLOURS = {BETTER: "background-color: rgba(46, 160, 67, 0.25)",
                 WORSE: "background-color: rgba(218, 54, 51, 0.25)"}


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


# mean_ttft_ms, p99.9_itl_ms, and LMDeploy's own spelling mean_e2e_latency_ms.
_LATENCY_COLUMN = re.compile(r"^(mean|std|min|max|p\d+(?:\.\d+)?)_(e2e_last_line|tpot_last_line|e2e|ttft|tpot|itl)(?:_latency)?_ms$")
_STATISTIC_LABELS = {"mean": "Mean", "std": "Std of", "min": "Min", "max": "Max"}

_COLUMNS = {spec.name: spec for spec in (
    ColumnSpec("request_throughput", METRICS["request_throughput"].label, METRICS["request_throughput"].unit, True),
    ColumnSpec("input_throughput", METRICS["input_throughput"].label, METRICS["input_throughput"].unit, True),
    ColumnSpec("output_throughput", METRICS["output_throughput"].label, METRICS["output_throughput"].unit, True),
    ColumnSpec("goodput_rps", METRICS["goodput"].label, METRICS["goodput"].unit, True),
    ColumnSpec("good_requests", "Good requests", "requests", True),
    ColumnSpec("mean_tokens_per_tick", "Mean tokens per tick", "tokens", True),
    # Derived per run for sweeps (sweep.with_sweep_metrics).
    ColumnSpec("output_throughput_per_user", "Output throughput per user", "tok/s", True),
    ColumnSpec("slo_attainment", "SLO attainment", "fraction", True),
    ColumnSpec("completed", "Completed requests", "requests", True),
    ColumnSpec("failed", "Failed requests", "requests", False),
    ColumnSpec("incomplete", "Incomplete requests", "requests", False),
    ColumnSpec("unfinished", "Unfinished requests", "requests", False),
    ColumnSpec("cancelled", "Cancelled requests", "requests", None),
    ColumnSpec("total_requests", "Total requests", "requests", None),
    ColumnSpec("total_input_tokens", "Total input tokens", "tokens", None),
    ColumnSpec("total_output_tokens", "Total output tokens", "tokens", None),
    ColumnSpec("duration", METRICS["duration"].label, METRICS["duration"].unit, False),
    ColumnSpec("duration_s", METRICS["duration"].label, METRICS["duration"].unit, False),
    ColumnSpec("load_seconds", "Engine load time", "s", False),
    # Settings (knobs, dataset and load) a chart may put on its x axis.
    ColumnSpec("concurrency", "Concurrency", "requests", None),
    ColumnSpec("bs", "Batch size", "requests", None),
    ColumnSpec("num_prompts", "Number of prompts", "prompts", None),
    ColumnSpec("request_rate", "Request rate", "req/s", None),
    ColumnSpec("tp", "Tensor parallelism", "GPUs", None),
    ColumnSpec("quant_policy", "KV cache quantization policy", "", None),
    ColumnSpec("cache_max_entry_count", "KV cache share of free GPU memory", "fraction", None),
    ColumnSpec("session_len", "Session length", "tokens", None),
    ColumnSpec("cache_block_seq_len", "KV cache block length", "tokens", None),
    ColumnSpec("num_tokens_per_iter", "Tokens per forward pass", "tokens", None),
    ColumnSpec("max_prefill_iters", "Max prefill passes", "passes", None),
    ColumnSpec("max_batch_tokens", "Tokens per batching step", "tokens", None),
    ColumnSpec("num_blocks", "KV cache blocks", "blocks", None),
    ColumnSpec("speculative_num_draft_tokens", "Draft tokens per step", "tokens", None),
    ColumnSpec("sharegpt_output_len", "ShareGPT output length", "tokens", None),
    ColumnSpec("random_input_len", "Random input length", "tokens", None),
    ColumnSpec("random_output_len", "Random output length", "tokens", None),
    # OpenAI-compatible servers: the load asked for and delivered, and the client's token counts.
    ColumnSpec("burstiness", "Burstiness", "gamma shape", None),
    ColumnSpec("max_concurrency", "Max concurrency", "requests", None),
    ColumnSpec("warmup_requests", "Warm-up requests", "requests", None),
    ColumnSpec("achieved_rate", "Achieved request rate", "req/s", None),
    ColumnSpec("mean_send_lag_ms", "Mean send lag", "ms", False),
    ColumnSpec("max_send_lag_ms", "Max send lag", "ms", False),
    ColumnSpec("peak_in_flight", "Peak requests in flight", "requests", None),
    ColumnSpec("total_output_tokens_retokenized", "Total output tokens (retokenized)", "tokens", None),
    ColumnSpec("length_mismatches", "Length mismatches", "requests", False),
)}


def describe_column(name: str) -> ColumnSpec:
    """Label, unit and direction of a history column; unknown columns get their name as label."""
    if name in _COLUMNS:
        return _COLUMNS[name]
    match = _LATENCY_COLUMN.match(name)
    if match:
        statistic, metric = match.groups()
        prefix = _STATISTIC_LABELS.get(statistic, statistic.upper())
        spec = METRICS[metric]
        return ColumnSpec(name, f"{prefix} {spec.label[0].lower()}{spec.label[1:]}", spec.display_unit, False)
    return ColumnSpec(name, name.replace("_", " ").capitalize(), "", None)


# ---- one run ---------------------------------------------------------------------------------

_PERCENTILE_ROWS = (("e2e", "End-to-end latency"), ("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"))
# A server's run also has profile_restful_api.py's ends (its last line; ours stop at the last text).
_LAST_LINE_ROWS = (("e2e_last_line", "E2E to last line (LMDeploy)"), ("tpot_last_line", "TPOT to last line (LMDeploy)"))


def percentile_table(summary: dict, percentiles: Sequence[float], stream_output: bool) -> pd.DataFrame:
    """LMDeploy's latency table in ms: mean, the configured percentiles, then std/min/max.

    TTFT, ITL and tokens per tick appear only for streamed runs, as LMDeploy prints them; tokens per
    tick has no std/min/max, as in LMDeploy's table; the last-line rows only for a server's run.
    Missing values are NaN.
    """
    columns = ["mean", *(percentile_key(q).upper() for q in percentiles), "std", "min", "max"]
    rows = {}
    last_line_rows = tuple(row for row in _LAST_LINE_ROWS if f"mean_{row[0]}_ms" in summary)
    for metric, label in _PERCENTILE_ROWS + last_line_rows:
        if metric in STREAM_ONLY_METRICS and not stream_output:
            continue
        keys = [f"mean_{metric}_ms", *(f"{percentile_key(q)}_{metric}_ms" for q in percentiles),
                f"std_{metric}_ms", f"min_{metric}_ms", f"max_{metric}_ms"]
        rows[f"{label} (ms)"] = [_number(summary.get(key)) for key in keys]
    if stream_output:
        keys = ["mean_tokens_per_tick", *(f"{percentile_key(q)}_tokens_per_tick" for q in percentiles)]
        rows["Tokens per tick (tokens)"] = [_number(summary.get(key)) for key in keys] + [math.nan] * 3
    table = pd.DataFrame.from_dict(rows, orient="index", columns=columns, dtype=float)
    table.index.name = "metric"
    return table


# Summary keys, which are also the history columns that describe them.
_THROUGHPUT_ROWS = ("duration_s", "total_requests", "completed", "failed", "incomplete", "unfinished",
                    "cancelled", "total_input_tokens", "total_output_tokens", "request_throughput", "input_throughput",
                    "output_throughput", "good_requests", "goodput_rps")
_ONLY_WHEN_PRESENT = {"good_requests", "goodput_rps"}  # set only when the run had an SLO


def throughput_table(summary: dict) -> pd.DataFrame:
    """Duration, request counts, token totals and throughputs: one row each, a value and its unit."""
    rows = {}
    for key in _THROUGHPUT_ROWS:
        value = _number(summary.get(key))
        if key in _ONLY_WHEN_PRESENT and math.isnan(value):
            continue
        spec = describe_column(key)
        rows[spec.label] = (value, spec.unit)
    table = pd.DataFrame.from_dict(rows, orient="index", columns=["value", "unit"])
    table["value"] = table["value"].astype(float)
    table.index.name = "quantity"
    return table


_BASE_REQUEST_COLUMNS = {"index", "status", "reason", "input_len", "req_output_len", "output_len", "ttft_s", "tpot_s",
                         "e2e_s", "itl_s", "tokens_per_tick", "n_ticks", "start_s", "finish_s"}


def requests_for_display(table: pd.DataFrame) -> pd.DataFrame:
    """The per-request table with latencies in ms and ITL as a count and a mean instead of raw lists."""
    itl = [_values(v) for v in table["itl_s"]] if "itl_s" in table else [np.array([])] * len(table)
    with np.errstate(invalid="ignore"):
        itl_mean_ms = [v.mean() * 1000 if v.size else math.nan for v in itl]
    return pd.DataFrame({
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
    })


# ---- several runs ----------------------------------------------------------------------------

def run_names(runs: pd.DataFrame) -> list[str]:
    """A unique column name per run: its label, or its run id when it has none or shares it."""
    ids = runs["run_id"].astype(str).tolist()
    labels = [_text(v) for v in runs["label"]] if "label" in runs else [""] * len(ids)
    counts = pd.Series(labels).value_counts()
    return [label if label and counts[label] == 1 else (f"{label} · {run_id}" if label else run_id)
            for label, run_id in zip(labels, ids)]


def compare_runs(runs: pd.DataFrame, metrics: list[str]) -> pd.DataFrame:
    """Runs side by side: one column per run (see `run_names`), one row per metric, titled with its unit."""
    values = _metric_matrix(runs, metrics)
    values.index = [describe_column(name).title for name in metrics]
    values.index.name = "metric"
    return values


def compare_marks(runs: pd.DataFrame, metrics: list[str]) -> pd.DataFrame:
    """Same shape as `compare_runs`: "better" on each row's best run(s), "worse" on its worst, else "".

    Rows whose metric has no better direction, or fewer than two different values, stay unmarked.
    """
    values = _metric_matrix(runs, metrics)
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


def style_comparison(table: pd.DataFrame, marks: pd.DataFrame):
    """A Styler for st.dataframe: better cells green, worse red."""
    return table.style.apply(lambda _: marks.map(lambda mark: _MARK_COLOURS.get(mark, "")), axis=None)


def _metric_matrix(runs: pd.DataFrame, metrics: list[str]) -> pd.DataFrame:
    """Numbers only, indexed by metric column name; a column the history lacks is all NaN."""
    names = run_names(runs)
    columns = {name: pd.to_numeric(runs[name], errors="coerce").to_numpy(dtype=np.float64)
               if name in runs else np.full(len(runs), math.nan) for name in metrics}
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
