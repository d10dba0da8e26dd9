"""Sweep page: vary one setting, or two as a grid, over the sidebar's settings; watch the sweep's progress; read its
results as a metric against the setting (with 95% bands over repeats), throughput against latency with the Pareto
frontier, goodput against load, a heat map, a per-point table and a two-point comparison; open or resume past sweeps.
With a Ray cluster's address, the runs go to the cluster and a table shows each one's state and node. The sweep on
show is named in the URL (?sweep=<id>), so a reload or a second tab finds it.
"""

import streamlit as st

from bench_core.errors import BenchError
from dashboard import active_runs, sidebar, sweep_results, sweep_start, tune_view
from dashboard.state import get_history, get_sweeps
from dashboard.text import plain

UPLOADS_FOLDER = "uploads"

active_runs.render_banner(shown_run_id=None)
st.title("Knob sweep")

sweep_id = st.query_params.get("sweep") or st.session_state.get("sweep_id")
shown = get_sweeps().get(sweep_id) if sweep_id else None
live = shown is not None and shown.active  # decided once: the sweep may end while this script runs
cancel = shown.cancel if live else None
choice = sidebar.render_sidebar(cancel=None, actions=False)  # the sweep has its own buttons below

st.caption(
    "Every point starts from the settings in the sidebar; the sweep varies the settings chosen here, "
    "with the run size set here."
)
inputs = tune_view.run_inputs(choice.values)
try:
    runs = get_history().load()  # once per script run: the estimate, the sweep and the past sweeps read it
except BenchError as exc:
    st.error(plain(exc))
    runs = None  # said once; the views below leave out what needs the history
plan = sweep_start.startable_plan(inputs, choice.values, get_history().root / UPLOADS_FOLDER, runs)
start_col, cancel_col = st.columns([1, 1])
blocked = choice.unavailable_reason is not None or bool(choice.problems) or plan is None
start = start_col.button("Start sweep", key="sweep_start", type="primary", width="stretch", disabled=blocked)
cancel_col.button("Cancel sweep", key="sweep_cancel", disabled=cancel is None, on_click=cancel, width="stretch")

if start and plan is not None:
    try:
        sweep = sweep_start.press_start(plan, inputs)
    except BenchError as exc:
        st.error(plain(exc))
    else:
        if sweep is not None and sweep.sweep_id != sweep_id:
            st.query_params["sweep"] = st.session_state["sweep_id"] = sweep.sweep_id
            st.rerun()  # redraw with Cancel enabled for the new sweep
sweep_start.render_confirmation()
if sweep_id:
    # Keep the sweep in the URL (switching pages drops query parameters) and in the session.
    st.query_params["sweep"] = st.session_state["sweep_id"] = sweep_id
    tune_view.render_sweep(sweep_id, sidebar.chosen_slo(choice.values), live, runs, inputs)

st.subheader("Past sweeps")
sweep_results.past_sweeps_section(get_history(), runs)
