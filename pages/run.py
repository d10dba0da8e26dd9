"""Run page: configure a benchmark in the sidebar, start it, watch it live, read and download its results.

The run on show is the one named in the URL (?run=<id>), so a reload, a second tab or a bookmark finds
it, including runs that ended before the server restarted (rebuilt from the history).
"""

import streamlit as st

from bench_core.errors import BenchError
from dashboard import sidebar
from dashboard.run_view import render_run
from dashboard.state import get_history, get_runner

UPLOADS_FOLDER = "uploads"

st.title("Run a benchmark")

run_id = st.query_params.get("run") or st.session_state.get("run_id")
shown = get_runner().get(run_id) if run_id else None
choice = sidebar.render_sidebar(cancel=shown.cancel if shown is not None and shown.active else None)

if choice.start:
    try:
        run = sidebar.submit_run(choice.values, get_runner(), get_history().root / UPLOADS_FOLDER)
    except BenchError as exc:
        st.error(str(exc))
    else:
        st.query_params["run"] = st.session_state["run_id"] = run.run_id
        st.rerun()  # redraw the sidebar with Cancel enabled for the new run
if run_id:
    # Keep the run in the URL (switching pages drops query parameters) and in the session.
    st.query_params["run"] = st.session_state["run_id"] = run_id
    render_run(run_id, sidebar.slo_from_ms(choice.values["slo_ms"]))
else:
    st.info("Choose a model, a backend and a dataset in the sidebar, then press **Start**. With nothing "
            "changed, SmolLM2-135M runs on the embedded transformers engine: about a minute on a laptop CPU.")
