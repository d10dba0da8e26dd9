"""One sweep on the Sweep page: its plan in a line, its progress while it runs, how it ended, then its results.

While a sweep runs, a fragment polls its progress once a second and triggers a full rerun whenever another run
finishes, so the results below grow run by run; nothing polls once it has ended. A sweep that ended before a restart,
or ran from the CLI, is read back from its saved plan and the history."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pandas as pd
import streamlit as st

from bench_core.config import SLO
from bench_core.errors import BenchError
from bench_core.measure.time_left import time_left_s
from bench_core.store.history import History
from bench_core.sweep.cluster import states_table
from bench_core.sweep.driver import SweepProgress, SweepRun
from bench_core.sweep.estimate import describe_seconds, estimate
from bench_core.sweep.plan import SweepPlan
from bench_core.sweep.status import saved_sweep_progress, sweep_verdict
from bench_core.sweep.store import load_plan, probes_of, remaining
from dashboard.state import get_history, get_runner, get_sweeps
from dashboard.sweep_results import results
from dashboard.sweep_start import describe_plan, resume
from dashboard.table_view import show_table
from dashboard.text import plain, show_verdict

LIVE_REFRESH_S = 1.0


def render_sweep(
    sweep_id: str,
    slo: SLO,
    live: bool,
    runs: pd.DataFrame | None,
    inputs: Mapping[str, Any],
    results_view: Callable[[History, SweepPlan, pd.DataFrame, SLO], None] = results,
) -> None:
    """Progress (polled while `live`), then the results of the sweep's finished runs so far, with goodput
    for `slo` (the sidebar's) when it sets a threshold, else for the SLO the runs had.

    `live` is whether the sweep was active when this script run began: the page decides it once, so its
    Cancel button and this view never disagree about a sweep that ends in between. `runs` is the history as the
    page read it for this script run; `inputs` the page's sweep inputs, which a resume follows."""
    history = get_history()
    sweep = get_sweeps().get(sweep_id)
    if runs is None:  # the page said why
        return
    try:
        plan = sweep.plan if sweep is not None else load_plan(history, sweep_id)
    except BenchError as exc:
        st.error(plain(exc))
        return
    st.subheader(f"Sweep {plain(sweep_id)}")
    model = plan.base.engine.model or "the model each server serves"  # a sweep's servers name theirs when up
    st.caption(plain(f"{describe_plan(plan)} · {model} on {plan.base.engine.backend}"))
    if live:
        _live_progress(sweep_id, runs)
    else:
        _ended_status(sweep, plan, runs, inputs)
    results_view(history, plan, runs, slo)  # a tune's are tune_view's


@st.fragment(run_every=LIVE_REFRESH_S)
def _live_progress(sweep_id: str, runs: pd.DataFrame) -> None:
    sweep = get_sweeps().get(sweep_id)
    if sweep is None or not sweep.active:
        st.rerun()  # one full rerun: the page then shows the ended sweep and this fragment is gone
    progress = sweep.progress()
    seen_key = f"sweep_runs_ended_{sweep_id}"
    if st.session_state.setdefault(seen_key, progress.ended) != progress.ended:
        st.session_state[seen_key] = progress.ended
        st.rerun()  # a full rerun, once per ended run: the results below take it in
    if sweep.plan.find_max:  # the search decides how many probes it runs: neither a fraction nor a time left
        st.progress(
            progress.ended / progress.total,
            text=f"searching: {progress.ended:,} probes done"
            + (f", now {plain(progress.current)}" if progress.current else ""),
        )
    else:
        st.progress(
            progress.ended / progress.total,
            text=f"running: {progress.ended:,}/{progress.total:,} {'trials' if sweep.plan.tune else 'runs'} done"
            + (f", now {plain(progress.current)}" if progress.current else "")
            + plain(_time_left(sweep, progress, runs)),
        )
    if progress.current_run_id:
        st.page_link(
            "app_pages/run.py",
            label=f"Watch run {plain(progress.current_run_id)} live",
            icon=":material/monitoring:",
            query_params={"run": progress.current_run_id},
        )
    if progress.errors:
        st.warning(plain(" ".join(progress.errors)))
    _where_runs_are(sweep)


def _where_runs_are(sweep: SweepRun | None) -> None:
    """A cluster sweep's runs: state, progress and node of each."""
    states = sweep.point_states() if sweep is not None else []
    if states:
        show_table(states_table(states), key="sweep_cluster_table")


def _time_left(sweep: SweepRun, progress: SweepProgress, runs: pd.DataFrame) -> str:
    """', about 1 min 20 s left': the running run's time left at its pace so far (the history's estimate until
    it has one), plus the history's estimate for the runs not started yet; "" when there is none."""
    # The history changes only when a run ends, and each end reruns the page, which reads it again into `runs`.
    key = f"sweep_eta_{sweep.sweep_id}_{progress.ended}"
    if key not in st.session_state:
        st.session_state[key] = _estimate_left(sweep.plan, progress.total - progress.ended, runs)
    current_guess, rest = st.session_state[key]
    run = get_runner().get(progress.current_run_id) if progress.current_run_id else None
    snapshot = run.snapshot() if run is not None else None
    current = time_left_s(snapshot, run.measurement.pace) if snapshot is not None else None
    current = current_guess if current is None else current
    if current is None or rest is None:
        return ""
    return f", {describe_seconds(current + rest)} left"


def _estimate_left(plan: SweepPlan, count: int, history_runs: pd.DataFrame) -> tuple[float | None, float | None]:
    """Seconds for the running run and for the others of the `count` runs not ended (the last in plan order)."""
    left = remaining(plan, history_runs)[-count:] if count else []
    return (
        estimate(left[:1], history_runs, loaded=True).seconds,
        estimate(left[1:], history_runs, loaded=True).seconds,
    )


def _ended_status(sweep: SweepRun | None, plan: SweepPlan, runs: pd.DataFrame, inputs: Mapping[str, Any]) -> None:
    """The final state: from the sweep object while this server has it, else from the history."""
    if sweep is not None:
        progress = sweep.progress()
    elif plan.find_max:  # how many probes are left is the search's to say: a resume replays those that ended
        st.info(f"{len(probes_of(get_history(), plan.sweep_id))} probes ended.")
        if st.button("Resume the search (what ended is not run again)", key="sweep_resume"):
            _resume_and_rerun(plan, inputs)
        return
    else:
        progress = saved_sweep_progress(get_history(), plan, runs)
    show_verdict(sweep_verdict(progress, searched=plan.find_max is not None, tuned=plan.tune is not None))
    finished, total = progress.finished, progress.total
    _where_runs_are(sweep)
    left = f"up to {total - finished} more" if plan.precision else f"the other {total - finished}"
    if finished < total and st.button(f"Resume: run {left}", key="sweep_resume", type="primary"):
        _resume_and_rerun(plan, inputs)


def _resume_and_rerun(plan: SweepPlan, inputs: Mapping[str, Any]) -> None:
    try:
        resume(plan.sweep_id, inputs)
    except BenchError as exc:
        st.error(plain(exc))
    else:
        st.rerun()
