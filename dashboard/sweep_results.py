"""A sweep's results on the Sweep page: the metric against the setting (with 95% bands over repeats), throughput
against latency with the Pareto frontier, goodput against load, the per-point table, a two-point comparison and the
downloads; and the list of past sweeps."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from bench_core.config import SLO
from bench_core.errors import BenchError
from bench_core.exports import SweepSubject
from bench_core.measure import metrics
from bench_core.store.history import History
from bench_core.sweep import report as sweep_report
from bench_core.sweep import results as sweep_results
from bench_core.sweep.plan import SweepPlan, describe_point
from bench_core.sweep.store import past_sweeps
from bench_core.views.report import Block, Note, Table
from bench_core.views.tables import describe_column
from dashboard.exports_view import export_buttons
from dashboard.sweep_servers import find_max_view
from dashboard.sweep_widgets import tick, title
from dashboard.table_view import show_table
from dashboard.text import plain

# Relative to this page's URL (app_pages/sweep.py -> /sweep) and to the Run page's.
SWEEP_PAGE_URL = "sweep"


def results(history: History, plan: SweepPlan, runs: pd.DataFrame, slo: SLO) -> None:
    history_runs, runs = runs, sweep_results.sweep_runs(runs, plan)
    if plan.find_max:
        find_max_view(history, plan)
        _downloads(history, plan, history_runs, runs, slo)
        return
    if runs.empty:
        st.info("No run of this sweep has finished yet.")
        return
    if metrics.slo_is_set(slo):
        try:
            tables = _request_tables(history, runs)
        except BenchError as exc:
            st.warning(plain(f"Goodput for the sidebar's SLO needs every run's stored requests: {exc}"))
        else:
            runs = sweep_results.with_slo(runs, tables, slo)
    statistics = sweep_results.point_statistics(runs, plan)
    measured = sweep_report.measured_metrics(statistics)
    st.markdown(f"**Results** of {len(runs)} finished runs: {sweep_report.RESULTS_HEADING}")
    if unreported := sweep_report.unreported_note(plan, measured):
        st.caption(plain(unreported))
    metric = st.selectbox(
        "Metric",
        measured,
        key="sweep_metric",
        format_func=title,
        index=measured.index(sweep_report.DEFAULT_METRIC) if sweep_report.DEFAULT_METRIC in measured else 0,
    )
    figures = sweep_report.metric_figures(statistics, plan, metric)
    for column, figure, key in zip(
        st.columns(len(figures)) if len(figures) > 1 else [st], figures, ("sweep_chart_band", "sweep_chart_heatmap")
    ):
        column.plotly_chart(figure, key=key)
    st.caption(plain(sweep_results.interval_note(statistics)))
    if plan.precision:
        st.markdown(f"**{sweep_report.PRECISION_TABLE_TITLE}**")
        st.caption(plain(sweep_results.precision_summary(plan, runs)))
        show_table(sweep_results.precision_table(plan, runs), key="sweep_precision_table")
    _pareto_view(runs, plan)
    _goodput_view(runs, plan, slo)
    _blocks(sweep_report.draft_length_blocks(runs, plan), "draft_length")
    _speedup_view(history, runs, plan)
    st.markdown(f"**Per point**: {sweep_report.POINT_TABLE_COLUMNS}")
    show_table(sweep_results.statistics_for_display(statistics), key="sweep_points_table")
    _comparison(runs, plan)
    _downloads(history, plan, history_runs, runs, slo)


def _blocks(blocks: list[Block], name: str) -> None:
    """A report's blocks on the page: a note as a caption, a chart, a table under its title."""
    for number, block in enumerate(blocks):
        if isinstance(block, Note):
            st.caption(plain(block.text))
        elif isinstance(block, Table):
            st.markdown(f"**{plain(block.title)}**")
            show_table(block.frame, key=f"sweep_table_{name}_{number}")
        else:
            st.plotly_chart(block, key=f"sweep_chart_{name}_{number}")


def _speedup_view(history: History, runs: pd.DataFrame, plan: SweepPlan) -> None:
    """For a sweep with speculation against none: the speed-up by load, from every run's stored requests."""
    if plan.speculation_pairing is None:
        return
    try:
        tables = _request_tables(history, runs)
    except BenchError as exc:
        st.warning(plain(f"Speculation against none needs every run's stored requests: {exc}"))
        return
    _blocks(sweep_report.speedup_blocks(runs, plan, tables), "speedup")


def _downloads(history: History, plan: SweepPlan, history_runs: pd.DataFrame, runs: pd.DataFrame, slo: SLO) -> None:
    """The sweep's exports (its history rows, its report, ...) for the SLO and the goodput targets the page shows."""
    targets = {goodput: st.session_state.get(_target_key(goodput)) for goodput in sweep_report.GOODPUT_METRICS}
    export_buttons(SweepSubject(history, plan, history_runs, runs, slo=slo, targets=targets))


def _pareto_view(runs: pd.DataFrame, plan: SweepPlan) -> None:
    view = st.selectbox("Throughput against latency", list(sweep_report.PARETO_VIEWS), key="sweep_pareto")
    st.plotly_chart(sweep_report.pareto_figure(runs, plan, view), key="sweep_chart_pareto")


def _goodput_view(runs: pd.DataFrame, plan: SweepPlan, slo: SLO) -> None:
    load = sweep_report.load_axis(plan)
    if load is None:
        st.caption("Sweep the concurrency to see goodput against load, with the highest load meeting the SLO.")
        return
    if not sweep_report.has_goodput(runs):
        st.caption(
            "Set TTFT, TPOT or E2E thresholds under *Goodput SLO* in the sidebar to see goodput against "
            "load: it is computed from the runs' stored requests, without running them again."
        )
        return
    goodput_col, target_col = st.columns(2)
    goodput = goodput_col.selectbox("Goodput as", sweep_report.GOODPUT_METRICS, key="sweep_goodput", format_func=title)
    target = target_col.number_input(
        f"Target ({describe_column(goodput).unit})",
        value=None,
        min_value=0.0,
        step=0.05,
        key=_target_key(goodput),
        placeholder="none: no target line",
        help="The goodput a load must reach: the chart then marks the highest load that meets it.",
    )
    shown = runs
    for axis in plan.axes:  # with a grid, one line of the other setting at a time
        if axis.name != load:
            value = st.selectbox(f"At {axis.name}", axis.values, key="sweep_goodput_at", format_func=tick)
            shown = runs[runs[axis.name] == value]
    figure = sweep_report.goodput_figure(shown, plan, load, goodput, target, sweep_report.goodput_slo(plan, slo))
    st.plotly_chart(figure, key="sweep_chart_goodput")


def _target_key(goodput: str) -> str:
    return f"sweep_target_{goodput}"


def _comparison(runs: pd.DataFrame, plan: SweepPlan) -> None:
    st.markdown("**Compare two points**: is the difference beyond the run-to-run spread? (Welch's t-test, 95%)")
    labels = [describe_point(values) for values in plan.grid() if describe_point(values) in set(runs["point"])]
    if len(labels) < 2:
        st.caption("Two points with finished runs are needed.")
        return
    left, right = st.columns(2)
    point_a = left.selectbox("Point A", labels, key="sweep_point_a")
    point_b = right.selectbox("Point B", labels, index=len(labels) - 1, key="sweep_point_b")
    table = sweep_results.compare_points(runs, point_a, point_b)
    show_table(table, key="sweep_compare_table")
    st.caption(
        "B - A and its 95% interval; beyond the spread when Welch's p-value is under 0.05. A point that "
        "ran once has no spread to judge against."
    )


def _request_tables(history: History, runs: pd.DataFrame) -> dict[str, pd.DataFrame]:
    return {run_id: _request_table(str(history.root), run_id) for run_id in runs["run_id"].astype(str)}


@st.cache_data(max_entries=1024, show_spinner=False)
def _request_table(root: str, run_id: str) -> pd.DataFrame:
    """A run's per-request table; a run's folder never changes once written, so it is read once."""
    return History(root).requests(run_id)


def past_sweeps_section(history: History, runs: pd.DataFrame | None) -> None:
    if runs is None:  # the page said why
        return
    try:
        table = past_sweeps(history, runs)
    except BenchError as exc:
        st.error(plain(exc))
        return
    if table.empty:
        st.caption("No sweep yet.")
        return
    table.insert(1, "open", SWEEP_PAGE_URL + "?sweep=" + table["sweep_id"])
    show_table(
        table, key="sweep_past_table", column_config={"open": st.column_config.LinkColumn("Sweep", display_text="open")}
    )
