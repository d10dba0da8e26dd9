"""The Run page's "Test connection" for a server backend: one button that asks the server the sidebar names for its
models, its /metrics page and whether it honours ignore_eos (engines/server_check.py), and one box with what was
found. Everything the server said is outside text: shown through `plain`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import streamlit as st

from bench_core.engines import backend
from bench_core.engines.server_check import IGNORE_EOS_PROBE_TOKENS, check_connection
from bench_core.errors import BenchError
from dashboard.sidebar import build_run_config
from dashboard.text import plain


def render(values: Mapping[str, Any]) -> None:
    """The button, and on its press the check of the server the sidebar's `values` name; nothing for a backend that
    runs in this machine's worker."""
    if backend(values["backend"]).in_process:
        return
    pressed = st.button(
        "Test connection",
        key="test_connection",
        help="Ask the server for its models and its /metrics page, detect its kind, and send one request for "
        f"{IGNORE_EOS_PROBE_TOKENS} tokens with ignore_eos to see whether it honours it.",
    )
    if not pressed:
        return
    try:
        with st.spinner("Asking the server..."):
            check = check_connection(build_run_config(values).engine)
    except BenchError as exc:
        st.error(plain(exc))
        return
    (st.success if check.reachable else st.error)(
        "  \n".join(f"**{plain(what)}**: {plain(found)}" for what, found in check.findings)
    )
