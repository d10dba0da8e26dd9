"""Streamlit glue shared by the pages: the process-wide runner and history, the sidebar, the run view.

`bench_core` never imports streamlit; this package is where the two meet.
"""
