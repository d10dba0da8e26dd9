"""Playground page: offline batch inference. Prompts typed or uploaded run once through the model's chat
template on the same runner (and cached engine) as benchmarks; each answer comes back with its token
counts, finish reason and timing, downloadable as CSV or JSONL.

The job on show is named in the URL (?job=<id>), so a reload finds it while the server runs.
"""

import streamlit as st

from bench_core.errors import BenchError
from dashboard import active_runs, playground_view
from dashboard.state import get_runner
from dashboard.text import plain

active_runs.render_banner(shown_run_id=None)
st.title("Playground")
st.caption(
    "Run a batch of chat prompts once, with the model's chat template, and read the answers. "
    "Prompts wait their turn behind any benchmark and are not recorded in the history."
)
engine = playground_view.engine_choice()
shown_job = get_runner().get_playground(st.query_params.get("job", ""))  # the one in the URL, e.g. after a reload
conversations, file_problem = playground_view.prompt_input(shown_job)
generation, max_new_tokens = playground_view.generation_settings()
if file_problem:
    st.error(plain(file_problem))
elif st.button("Run prompts", key="pg_run", type="primary"):
    try:
        job = get_runner().submit_playground(engine, conversations, generation, max_new_tokens)
    except BenchError as exc:
        st.error(plain(exc))
    else:
        st.query_params["job"] = job.job_id

job_id = st.query_params.get("job")
if job_id:
    job = get_runner().get_playground(job_id)
    if job is None:
        st.info("That playground job is gone (the server restarted since); run the prompts again.")
    else:
        playground_view.show_job(job)
