"""History page: every recorded and imported run in one filterable table; pick runs to compare them,
download them or delete them; import CSVs written by this app or by LMDeploy's benchmark scripts.
"""

import streamlit as st

from bench_core.errors import BenchError
from dashboard import active_runs, compare_view, history_view
from dashboard.state import get_history
from dashboard.text import plain

active_runs.render_banner(shown_run_id=None)
st.title("History")
history = get_history()
history_view.import_section(history)
try:
    history.tidy()  # once per History, i.e. once per dashboard process: see History.tidy
    runs = history.load(history_view.FILTERED_COLUMNS)
except BenchError as exc:
    st.error(plain(exc))
    st.stop()
for notice in history.take_notices():
    st.warning(plain(notice))
if runs.empty:
    st.info("No runs yet: start one on the Run page, or import a CSV above.")
    st.stop()

shown = history_view.filtered(runs)
st.caption(f"{len(shown):,} of {len(runs):,} runs, the newest first. Select rows to compare, download or delete them.")
try:
    page = history_view.table_page(history, shown)
except BenchError as exc:  # the index unreadable since the filters read it: one line, as above
    st.error(plain(exc))
    st.stop()
picked = history_view.runs_table(page)
history_view.downloads(history, picked)
history_view.delete_section(history, picked)
if len(picked) >= 2:
    compare_view.comparison(history, history.load(run_ids=picked))
else:
    st.info("Select two or more runs in the table to compare them.")
