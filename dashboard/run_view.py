"""The main area of the Run page: one run, live while it is active, its results once it has ended.

While the run is queued, loading or running, a fragment polls its live snapshot once a second (the
worker thread never calls st.*) and triggers one full rerun when the run ends, after which nothing
polls. An ended run is shown from its `RunResult`: summaries are recomputed from the per-request table
with the SLO set on the page, so goodput follows the thresholds without re-running. Downloads sit
outside the fragment and carry bytes.
"""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd
import streamlit as st

from bench_core.config import SLO, RunConfig, client_in_workers
from bench_core.engines import backend
from bench_core.errors import BenchError
from bench_core.exports import RunSubject
from bench_core.hardware.roofline import describe_roofline
from bench_core.hardware.run_flags import live_run_flags
from bench_core.measure import metrics
from bench_core.measure.catalog import METRICS, find_column, requested_rate
from bench_core.measure.latency_bins import BinnedLatencies
from bench_core.measure.live_snapshot import LiveSnapshot
from bench_core.measure.time_left import describe_time_left
from bench_core.run.runner import Run
from bench_core.states import RunState
from bench_core.store import run_parts
from bench_core.views import acceptance_charts, quality_charts, report, run_charts, server_charts, tables, timeline
from bench_core.views.report import describe_config, sentence
from bench_core.views.verdict import run_verdict, unrecorded_verdict
from dashboard import workload_view
from dashboard.active_runs import active_runs
from dashboard.exports_view import export_buttons
from dashboard.run_result import RunResult, result_from_history, result_from_run
from dashboard.state import get_history, get_runner
from dashboard.table_view import LONG_TABLE_ROWS, show_table
from dashboard.text import plain, show_verdict

LIVE_REFRESH_S = 1.0
# Redrawing three Plotly charts costs the browser far more than the counters: on 2 CPU cores shared
# with the engine, charts every second made a SmolLM2 run markedly slower, so they refresh less often.
LIVE_CHARTS_REFRESH_S = 3.0


def run_on_show() -> str | None:
    """The run the Run page shows: the URL's, else this session's last, else the one that holds the engine.

    A run the history no longer has (deleted in History, or by hand) is dropped from the URL and the session
    with one line saying so, and the page is drawn without it: this server may still hold it in memory, but
    what the user removed must not come back by its link.
    """
    run_id = st.query_params.get("run") or st.session_state.get("run_id")
    if run_id and (gone := _gone(run_id)):
        st.warning(plain(gone))
        st.session_state.pop("run_id", None)
        st.query_params.pop("run", None)
        run_id = None
    return run_id or next((run.run_id for run in active_runs(get_runner())), None)


def _gone(run_id: str) -> str | None:
    """Why run `run_id` cannot be shown; None when it can: it is in the history, or only this server holds it
    (active, never recorded, or kept in a fallback folder after its save failed)."""
    run = get_runner().get(run_id)
    if run is not None and (run.active or run.record is None or run.measurement.save_error):
        return None
    if get_history().row(run_id) is not None:
        return None
    said = "it was deleted" if run is not None else "deleted, or never recorded in these results"
    return f"Run {run_id} is not in the history ({said}): here is the Run page without it."


def render_run(run_id: str, slo: SLO, offer: Callable[[str, RunConfig, bool], None] | None = None) -> None:
    """Show run `run_id`: live from this server's runner, else rebuilt from the history. `offer`: what the page offers
    for an ended run, drawn under the line of its settings (given its id, its config and whether it measured
    anything)."""
    run = get_runner().get(run_id)
    if run is not None and run.active:
        st.subheader(f"Run {plain(run_id)}")
        st.caption(plain(describe_config(run.config)))
        _live_panel(run_id)
        _live_charts_panel(run_id)
        return
    try:
        result = result_from_run(run) if run is not None else result_from_history(get_history(), run_id)
    except BenchError as exc:
        st.error(plain(exc))
        return
    st.subheader(f"Run {plain(run_id)}")
    config = run.config if result is None else result.config
    st.caption(plain(describe_config(config)))
    if offer is not None:
        offer(run_id, config, result is not None and result.requests is not None)
    if result is None:  # cancelled before anything was measured, or refused for its input: nothing was recorded
        show_verdict(unrecorded_verdict(run.state, run.message))
        return
    if result.requests is None:  # it failed before measuring: a bad model, dataset or engine
        st.error(plain(f"{result.status}: {result.message}"))
        return
    _ended_view(result, slo)


# ---- live ------------------------------------------------------------------------------------


@st.fragment(run_every=LIVE_REFRESH_S)
def _live_panel(run_id: str) -> None:
    runner = get_runner()
    run = runner.get(run_id)
    if run is None or not run.active:
        st.rerun()  # one full rerun: the page then shows the ended run and this fragment is gone
    if run.cancel_event.is_set():
        st.warning(f"{plain(run.state)}: cancel requested; the run stops within a second and keeps what it measured.")
    if run.state == RunState.QUEUED:
        ahead = runner.queue_position(run)
        st.info(f"queued: waiting: {ahead:,} run(s) ahead. It starts when the engine is free.")
        return
    snapshot = run.snapshot()
    if run.state == RunState.LOADING or snapshot is None:  # a snapshot comes once it measures
        st.info(plain(f"{run.state}: {run.phase or 'starting'}…"))
        return
    _live_progress(run, snapshot)


@st.fragment(run_every=LIVE_CHARTS_REFRESH_S)
def _live_charts_panel(run_id: str) -> None:
    run = get_runner().get(run_id)
    snapshot = run.snapshot() if run is not None and run.active else None
    if snapshot is not None:  # the counters' fragment reruns the page when the run ends
        _live_charts(run.config, snapshot)
        _live_percentiles(run.config, snapshot)


def _live_progress(run: Run, snap: LiveSnapshot) -> None:
    done = snap.completed + snap.failed + snap.cancelled
    total_tokens = snap.tokens_requested
    # The run's state turns ended a moment before its results are recorded and the page shows them: no time left then.
    left = "" if run.ended else f", {describe_time_left(snap, run.measurement.pace)}"
    st.progress(
        min(snap.tokens_done / total_tokens, 1.0) if total_tokens else 0.0,
        text=f"{plain(run.state)}: {done:,}/{snap.total_requests:,} requests, {snap.output_tokens:,}/{total_tokens:,} "
        f"output tokens, {snap.elapsed_s:.0f} s{plain(left)}",
    )
    in_workers = client_in_workers(run.config.load.client_processes)
    for flag in live_run_flags(snap.telemetry, backend(run.config.engine.backend).in_process, in_workers):
        st.warning(plain(sentence(flag)))
    columns = st.columns(4)
    columns[0].metric("Completed (requests)", snap.completed)
    columns[1].metric("Failed (requests)", snap.failed)
    columns[2].metric("In flight (requests)", snap.in_flight)
    recent, seconds = run_charts.recent_output_rate(snap.output_tokens_per_s, snap.bin_s)
    columns[3].metric(
        f"Output (tok/s, last {seconds:g} s)",
        f"{recent:.1f}",
        help="Over the latest complete bins, as many as a point of the throughput chart averages.",
    )


def _live_charts(config: RunConfig, snap: LiveSnapshot) -> None:
    stream = config.load.stream_output
    # Without streaming a request ticks only at its end, so its "first token" gap is its whole latency.
    first_metric = "ttft" if stream else "e2e"
    left, right = st.columns(2)
    left.plotly_chart(run_charts.binned_latency_histogram(snap.ttft, first_metric), key="live_first_histogram")
    if stream:
        right.plotly_chart(run_charts.binned_latency_histogram(snap.itl, "itl"), key="live_itl_histogram")
    st.plotly_chart(
        run_charts.throughput_over_time(snap.time_s, snap.output_tokens_per_s, snap.in_flight_over_time),
        key="live_throughput",
    )
    if snap.server_metrics is not None:
        st.plotly_chart(
            server_charts.server_metrics_over_time(snap.server_metrics, end_s=snap.elapsed_s), key="live_server_metrics"
        )
    if snap.telemetry is not None:
        st.plotly_chart(run_charts.telemetry_over_time(snap.telemetry), key="live_telemetry")


def _live_percentiles(config: RunConfig, snap: LiveSnapshot) -> None:
    stream = config.load.stream_output
    series = {"ttft": snap.ttft, "itl": snap.itl} if stream else {"e2e": snap.ttft}
    st.caption(
        "So far, over every request that has reached that point (finished or not); percentiles within 1% while running:"
    )
    show_table(live_percentile_table(series, config.percentiles, stream), key="live_percentiles")


def live_percentile_table(series: dict[str, BinnedLatencies], percentiles, stream_output: bool) -> pd.DataFrame:
    """LMDeploy's latency table for the values seen so far; rows with no values yet are left out."""
    summary: dict[str, float] = {}
    for metric, binned in series.items():
        summary.update(metrics.summary_columns(METRICS[metric], binned.distribution(percentiles), percentiles))
    return tables.percentile_table(summary, percentiles, stream_output).dropna(how="all")


# ---- ended -----------------------------------------------------------------------------------


def _ended_view(result: RunResult, page_slo: SLO) -> None:
    slo = page_slo if metrics.slo_is_set(page_slo) else result.config.slo
    summary = result.summary(slo)
    show_verdict(run_verdict(result.status, result.message, summary, result.flags))
    for warning in result.warnings:
        st.warning(plain(warning))
    for note in result.notes:
        st.caption(plain(f"Dataset: {note}"))
    if said := tables.cache_start_sentence(result.cache_start):
        st.caption(plain(said))
    for caveat in tables.workload_caveats(result.config):
        st.info(plain(caveat))
    stream = result.config.load.stream_output

    st.markdown("**Latency (ms)**, successful requests, as LMDeploy reports it")
    show_table(tables.percentile_table(summary, result.config.percentiles, stream), key="summary_percentiles")
    for caveat in tables.per_1k_input_caveats(summary, result.config.load):
        st.caption(plain(caveat))
    left, right = st.columns([2, 1])
    with left:
        st.markdown("**Throughput**")
        show_table(tables.throughput_table(summary), key="summary_throughput")
    with right:
        _goodput(summary, slo)
    if result.config.engine.speculative_algorithm:
        st.markdown(
            f"**Speculative decoding** ({plain(result.config.engine.speculative_algorithm)}, "
            f"{plain(result.config.engine.speculative_num_draft_tokens)} draft tokens per step)"
        )
        show_table(tables.speculative_table(summary), key="summary_speculative")
        by_position, by_request = st.columns(2)
        if "engine_acceptance_by_position" in summary:  # the engine counted positions (a server's come below)
            by_position.plotly_chart(
                acceptance_charts.acceptance_by_position_figure(summary), key="engine_acceptance_by_position"
            )
        if "mean_request_acceptance_rate" in summary:  # the engine counted per request
            by_request.plotly_chart(
                acceptance_charts.request_acceptance_histogram(result.requests), key="request_acceptance"
            )
    if "achieved_rate" in summary:
        _server_load(result.config, summary)
    _quality_section(result, summary)

    first, second = report.ended_latency_histograms(result.requests, stream)
    left, right = st.columns(2)
    left.plotly_chart(first, key="ended_first")
    right.plotly_chart(second, key="ended_second")
    st.plotly_chart(timeline.request_timeline(result.requests, end_s=result.duration_s), key="ended_timeline")
    if result.snapshot is not None:
        snap = result.snapshot
        throughput = run_charts.throughput_over_time(
            snap.time_s, snap.output_tokens_per_s, snap.in_flight_over_time, run_charts.steady_span(summary)
        )
        st.plotly_chart(throughput, key="ended_throughput")
    _server_metrics_section(result)  # under the throughput, on its time axis
    workload_view.render_ended(result.requests, summary)
    _hardware_section(result)

    st.markdown("**Requests**")
    requests = tables.requests_for_display(result.requests)
    show_table(requests, key="requests_table", max_rows=LONG_TABLE_ROWS, keep_numbers=True, hide_index=True)
    export_buttons(_run_subject(result, slo))


def _quality_section(result: RunResult, summary: dict) -> None:
    """The run's drift from its baseline and its accuracy on its quality set, where it was checked against them."""
    if (judged := tables.quality_table(summary)).empty:
        return
    st.markdown(
        "**Quality guard**"
        + (f", against run {plain(baseline)}" if (baseline := result.config.dataset.drift_baseline) else "")
    )
    show_table(judged, key="summary_quality")
    if (divergence := quality_charts.divergence_histogram(result.requests)) is not None:
        st.plotly_chart(divergence, key="quality_divergence")


def _server_metrics_section(result: RunResult) -> None:
    """The server's own metrics, where it served them: from the run this server holds, else from its folder."""
    recorded = _recorded(result)
    try:
        raw, values = recorded.server_metrics(), recorded.values()
    except BenchError as exc:
        st.warning(plain(exc))
        return
    if raw is None:
        return
    st.markdown("**Server**, from its own metrics")
    if not (served := tables.quantity_table(values, "served")).empty:
        show_table(served, key="summary_server_metrics")
    st.plotly_chart(
        server_charts.ended_server_metrics(raw, result.requests, result.duration_s), key="ended_server_metrics"
    )
    if acceptance_charts.describe_acceptance_by_position(values) is not None:  # the server decoded speculatively
        st.plotly_chart(acceptance_charts.acceptance_by_position_figure(values), key="acceptance_by_position")


def _hardware_section(result: RunResult) -> None:
    """What the hardware did: telemetry summary and chart, the roofline verdict, the random-weight label."""
    recorded = _recorded(result)
    try:
        random_weights, values, samples, verdict = (
            recorded.random_weights(),
            recorded.values(),
            recorded.telemetry(),
            recorded.roofline(),
        )
    except BenchError as exc:
        st.warning(plain(exc))
        return
    st.markdown("**Hardware**")
    if random_weights:
        st.caption("Random-weight run: the model's weights are random, so the timings are real and the text is not.")
    if not (sampled := tables.quantity_table(values, "sampled")).empty:
        show_table(sampled, key="summary_telemetry")
    if samples is not None:
        st.plotly_chart(run_charts.telemetry_over_time(samples), key="ended_telemetry")
    if verdict is not None:
        first, *rest = describe_roofline(verdict)
        st.info(plain(first))
        if rest:
            st.markdown("\n".join(plain(line) for line in rest))


def _recorded(result: RunResult) -> run_parts.RecordedRun:
    """Where an ended run's parts are read: its record while this server holds it (the result was not rebuilt from
    the history), else its history row and folder."""
    run = get_runner().get(result.run_id) if result.history_row is None else None
    return run_parts.RecordedRun(get_history(), result.run_id, run.record if run is not None else None)


def _server_load(config: RunConfig, summary: dict) -> None:
    """The load asked for next to the load delivered, and answers whose length was not the one asked."""
    if (short := summary.get("length_mismatches", 0) - summary.get("overrun", 0)) > 0:
        st.warning(
            f"{short:,} served request(s) returned fewer tokens than asked: the server may not honour "
            "ignore_eos; check the server kind or pass it in the extra request body."
        )
    shown = ("achieved_rate", ".2f"), ("mean_send_lag_ms", ".1f"), ("mean_slot_wait_ms", ".1f"), ("peak_in_flight", "")
    shown = tuple((name, digits) for name, digits in shown if name in summary)  # absent from runs recorded before it
    columns = st.columns(1 + len(shown))
    asked = requested_rate(config.load.load_pattern, config.load.request_rate, summary)
    columns[0].metric("Requested rate (req/s)", f"{asked:g}")
    for column, (name, digits) in zip(columns[1:], shown):
        metric, _ = find_column(name)
        column.metric(tables.describe_column(name).title, format(summary[name], digits), help=metric.definition)


def _goodput(summary: dict, slo: SLO) -> None:
    st.markdown("**Goodput**")
    if not metrics.slo_is_set(slo):
        st.caption("Set TTFT, TPOT or E2E thresholds under *Goodput SLO* in the sidebar to see goodput.")
        return
    goodput, good = METRICS["goodput"], METRICS["good_requests"]
    st.metric(goodput.title, f"{summary[goodput.column()]:.3f}", help=goodput.definition)
    st.metric(good.label, f"{summary[good.column()]}/{summary['total_requests']}")
    st.caption(plain(f"For {tables.describe_slo(slo)}."))


def _run_subject(result: RunResult, slo: SLO) -> RunSubject:
    recorded = _recorded(result)
    return RunSubject(
        recorded.history,
        result.run_id,
        result.requests,
        result.lmdeploy_row,
        lambda: run_parts.run_parts(
            recorded.history, result.run_id, recorded.record, slo, result.warnings, result.notes, result.snapshot
        ),
    )
