"""Run page: configure a benchmark in the sidebar, start it, watch it live, read and download its results.

The run on show is the one named in the URL (?run=<id>), so a reload, a second tab or a bookmark finds
it, including runs that ended before the server restarted (rebuilt from the history), but not one deleted
since. Without one, the page shows the run that holds the engine, if any, whichever tab started it.
"""

from functools import partial

import streamlit as st

from bench_core.errors import BenchError
from dashboard import active_runs, run_again_view, server_check_view, sidebar, workload_view
from dashboard.run_view import render_run, run_on_show
from dashboard.state import get_history, get_runner
from dashboard.text import plain

UPLOADS_FOLDER = "uploads"

runner = get_runner()
run_id = run_on_show()
shown = runner.get(run_id) if run_id else None
active_runs.render_banner(run_id)
st.title("Run a benchmark")
choice = sidebar.render_sidebar(
    cancel=partial(active_runs.cancel_and_settle, shown) if shown is not None and shown.active else None
)

if choice.start:
    try:
        run = active_runs.press_start(sidebar.config_from_choice(choice.values, get_history().root / UPLOADS_FOLDER))
    except BenchError as exc:
        st.error(plain(exc))
    else:
        if run is not None and run.run_id != run_id:
            st.query_params["run"] = st.session_state["run_id"] = run.run_id
            st.rerun()  # redraw the sidebar with Cancel enabled for the new run
active_runs.render_confirmation()
server_check_view.render(choice.values)
if run_id:
    # Keep the run in the URL (switching pages drops query parameters) and in the session.
    st.query_params["run"] = st.session_state["run_id"] = run_id
    if shown is None or not shown.active:
        run_again_view.open_comparison_when_ended(run_id)  # the last of runs started to compare: History shows them
        sidebar.offer_past_settings(run_id, shown, get_history())
    render_run(run_id, sidebar.chosen_slo(choice.values), offer=run_again_view.render_run_again)
else:
    st.info(
        "Choose a model, a backend and a dataset in the sidebar, then press **Start**. With nothing "
        "changed, SmolLM2-135M runs on the embedded transformers engine: about a minute on a 2-core CPU, the first time included."
    )
run_again_view.render_presets(sidebar.config_or_none(choice.values), expanded=not run_id)
# The next run's workload, below the run shown: sampled only when asked.
workload_view.render_preview(choice.values, get_history().root / UPLOADS_FOLDER)
