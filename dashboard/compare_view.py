"""The History page's comparison of the selected runs: what differs between them, charts across it, the latency
distributions, the side-by-side table against a baseline with which differences are beyond noise, and its report.

The baseline is the run the user picked while it is among the runs compared (PICKED_BASELINE), else the oldest."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from bench_core.exports import ComparisonSubject
from bench_core.measure.quality import with_drift
from bench_core.store import run_parts
from bench_core.store.history import History
from bench_core.views import acceptance_charts, compare_charts, report, run_diff, tables
from dashboard.exports_view import export_buttons
from dashboard.table_view import show_table
from dashboard.text import plain

RUN = report.RUN
BASELINE_KEY = "compare_baseline"
PICKED_BASELINE = "compare_baseline_picked"  # the baseline the user picked, kept while the selection changes


def _title(name: str) -> str:
    return tables.describe_column(name).title


def _index_of(options: list[str], preferred: str) -> int:
    return options.index(compare_charts.default_of(options, preferred))


def comparison(history: History, chosen: pd.DataFrame) -> None:
    """What differs between the chosen runs first, then the charts across it, the distributions and the
    side-by-side table with which differences are beyond noise."""
    st.subheader(f"Compare {len(chosen)} runs")
    rows = chosen
    chosen, varied = report.compared_runs(rows)
    what_differs(chosen, varied)
    comparison_charts(chosen, varied)
    request_tables, missing = run_parts.request_tables(history, chosen, chosen[RUN])
    distributions(chosen, request_tables, missing)
    baseline = baseline_picker(chosen)
    # Runs that kept their answers show their drift from the baseline picked, where it kept its own.
    run_ids = dict(zip(chosen[RUN], chosen["run_id"].astype(str)))
    answers = {run_ids[name]: requests for name, requests in request_tables.items()}
    table, marks, judged = report.comparison_table(with_drift(chosen, answers, baseline), varied, baseline)
    # Compact: five runs' columns in view beside the metric names at 1,600 px.
    show_table(tables.style_comparison(table, marks), key="compare_table", compact=True)
    st.caption(report.COMPARE_NOTE if judged else f"{report.COMPARE_NOTE} {report.UNJUDGED_NOTE}")
    if not (paired := report.paired_against_baseline(chosen, request_tables, baseline)).empty:
        st.markdown(f"**{report.PAIRED_TITLE}**")
        show_table(paired, key="compare_paired")
        st.caption(report.PAIRED_NOTE)
    if not (positions := acceptance_charts.position_table(chosen, chosen[RUN])).empty:
        st.markdown(f"**{report.POSITIONS_TITLE}**")
        show_table(positions, key="compare_positions")
        st.plotly_chart(acceptance_charts.positions_by_run_figure(positions), key="compare_positions_chart")
    export_buttons(ComparisonSubject(history, rows, request_tables, missing, baseline))


def _remember_baseline() -> None:
    st.session_state[PICKED_BASELINE] = st.session_state[BASELINE_KEY]


def baseline_picker(chosen: pd.DataFrame) -> str:
    """The run the others are compared against: the one the user picked while it is among the chosen runs, else the
    oldest of them (a default follows the selection; a pick stays through it)."""
    run_ids = chosen["run_id"].astype(str).tolist()
    picked = st.session_state.get(PICKED_BASELINE)
    st.session_state[BASELINE_KEY] = picked if picked in run_ids else report.oldest_run(chosen)
    names = dict(zip(run_ids, chosen[RUN]))
    return st.selectbox(
        "Baseline: the others' changes are against it",
        run_ids,
        key=BASELINE_KEY,
        format_func=names.get,
        on_change=_remember_baseline,
    )


def what_differs(chosen: pd.DataFrame, varied: list[str]) -> None:
    with st.container(key="compare_differences"):
        if not varied:
            st.info("These runs share every recorded setting: they are repeats of one configuration.")
            return
        st.markdown("**What differs between these runs**")
        st.table(run_diff.differences(chosen, varied))
        st.caption(
            f"Settings the runs share are not shown. {run_diff.NOT_APPLICABLE}: the setting does not apply "
            f"to that run's backend, dataset or load pattern; {run_diff.NOT_RECORDED}: an imported LMDeploy "
            f"row lacks it; {run_diff.DEFAULT}: the run left it at its default."
        )


def comparison_charts(chosen: pd.DataFrame, varied: list[str]) -> None:
    """A metric across a differing setting, and latency against throughput, each run in its own colour."""
    metrics = compare_charts.chartable_metrics(chosen)
    if not metrics:
        st.info("These runs have no metric in common to chart.")
        return
    x_col, y_col, latency_col, colour_col = st.columns(4)
    metric = y_col.selectbox(
        "Metric up",
        metrics,
        key="compare_metric",
        format_func=_title,
        index=_index_of(metrics, compare_charts.DEFAULT_METRIC),
    )
    latencies = [name for name in metrics if name.endswith("_ms")]
    latency = latency_col.selectbox(
        "Latency against throughput",
        latencies,
        key="compare_latency",
        format_func=_title,
        index=_index_of(latencies, compare_charts.DEFAULT_LATENCY),
    )
    colour = colour_col.selectbox("Colour by", [RUN, *varied], key="compare_colour", format_func=_title)
    left, right = st.columns(2)
    if varied:
        knob = x_col.selectbox(
            "Setting across",
            varied,
            key="compare_knob",
            format_func=_title,
            index=varied.index(run_diff.default_setting(chosen, varied)),
        )
        left.plotly_chart(compare_charts.metric_vs_knob(chosen, knob, metric, color=colour), key="chart_metric_vs_knob")
    else:
        x_col.caption("No setting differs to chart across.")
    right.plotly_chart(
        compare_charts.latency_vs_throughput(chosen, latency=latency, color=colour), key="chart_latency_vs_throughput"
    )


def distributions(chosen: pd.DataFrame, request_tables: dict[str, pd.DataFrame], missing: list[str]) -> None:
    """TTFT and ITL CDFs of the runs that kept their per-request table (imported LMDeploy rows did not); the runs
    that were not streamed are named on them."""
    if missing:
        st.caption(plain(report.missing_distributions(missing)))
    if request_tables:
        left, right = st.columns(2)
        unstreamed = compare_charts.not_streamed(chosen)
        left.plotly_chart(compare_charts.cdf_overlay(request_tables, "ttft", unstreamed), key="chart_cdf_ttft")
        right.plotly_chart(compare_charts.cdf_overlay(request_tables, "itl", unstreamed), key="chart_cdf_itl")
