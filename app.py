"""LLM Bench Studio: page setup and navigation. The pages live in app_pages/; the logic in bench_core/."""

import os

# Before anything imports transformers or huggingface_hub: no network unless the user opts in
# (HF_HUB_OFFLINE=0), and no progress bars or warnings from the libraries in the server log.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import streamlit as st

from dashboard import browser_history

st.set_page_config(page_title="LLM Bench Studio", page_icon=":material/speed:", layout="wide")
browser_history.one_entry_per_page()  # Back leaves a page in one press, whatever its URL kept meanwhile

navigation = st.navigation(
    [
        st.Page("app_pages/run.py", title="Run", icon=":material/play_arrow:", default=True),
        st.Page("app_pages/history.py", title="History", icon=":material/table_chart:"),
        st.Page("app_pages/sweep.py", title="Sweep", icon=":material/tune:"),
        st.Page("app_pages/playground.py", title="Playground", icon=":material/chat:"),
    ]
)
navigation.run()
