"""The workload on the Run page: before Start, what the sidebar's settings would send (sampled on request, in a
child process: bench_core.run.preview); after a run, what it sent, from its request table. Both draw the same
figures (bench_core.views.workload_charts) and, for an ended run, what the prefix cache served and TTFT by turn.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

from bench_core.errors import BenchError
from bench_core.load import dataset
from bench_core.run.preview import WorkloadPreview, preview_workload
from bench_core.views import tables, workload_charts
from dashboard.sidebar import config_from_choice
from dashboard.table_view import show_table
from dashboard.text import plain


@st.cache_data(show_spinner=False, max_entries=8)
def _sampled(config_json: str, _config) -> WorkloadPreview:
    """One preview per distinct set of settings (`config_json` keys the cache; the config itself is not hashed)."""
    return preview_workload(_config)


def render_preview(values: Mapping[str, Any], uploads_dir: Path) -> None:
    """An expander with the workload the sidebar's settings would send, sampled when asked."""
    with st.expander("Workload to be sent", expanded=False):
        try:
            config = config_from_choice(values, uploads_dir)
        except BenchError as exc:
            st.caption(plain(exc))
            return
        key = repr(asdict(config.dataset)) + repr(
            (
                config.engine.backend,
                config.engine.model,
                config.engine.tokenizer,
                config.engine.base_url,
                config.load.load_pattern,
            )
        )
        if st.session_state.get("workload_preview_key") != key:
            st.caption(
                "The prompts are sampled with the run's seed and the model's tokenizer, as the run will "
                "sample them (a few seconds; the first use of a model loads it)."
            )
            if not st.button("Sample the workload", key="sample_workload", icon=":material/bar_chart:"):
                return
            st.session_state["workload_preview_key"] = key
        try:
            with st.spinner("Sampling the prompts with the model's tokenizer..."):
                preview = _sampled(key, config)
        except BenchError as exc:
            st.error(plain(exc))
            return
        for warning in preview.warnings:
            st.warning(plain(warning))
        st.caption(
            f"{len(preview.table):,} requests, tokenized with {plain(preview.tokenizer)}. "
            + " ".join(plain(f"{note[:1].upper()}{note[1:]}.") for note in preview.notes[-2:])
        )
        if note := dataset(config.dataset.dataset_name).lengths_note(config.dataset):
            st.caption(plain(note))
        show_figures(preview.table, "preview")


def render_ended(requests: pd.DataFrame, summary: dict) -> None:
    """The workload an ended run sent, and what its prefix cache served and TTFT turn by turn."""
    st.markdown("**Workload sent**")
    show_figures(requests, "ended")
    turns = workload_charts.ttft_by_turn(requests)
    if turns is not None:
        st.plotly_chart(turns, key="ended_ttft_by_turn")
    table = tables.workload_metrics_table(summary)
    if not table.empty:
        show_table(table, key="summary_workload")


def show_figures(table: pd.DataFrame, key: str) -> None:
    shown = workload_charts.workload_figures(table)
    for column, (n, figure) in zip(st.columns(len(shown)), enumerate(shown)):
        column.plotly_chart(figure, key=f"{key}_workload_{n}")
