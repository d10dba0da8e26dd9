"""The download buttons of a scope: one per registered export that covers it (bench_core/exports), in one row.

Each file is written when its button is clicked, not on every rerun: a report inlines plotly's JavaScript (about
5 MB) and the whole history's rows take a second at 10,000 runs.
"""

from __future__ import annotations

import functools

import streamlit as st

from bench_core.errors import BenchError
from bench_core.exports import Subject, exports
from dashboard.text import plain


def export_buttons(subject: Subject) -> None:
    try:
        offered = [export for export in exports(subject.scope).values() if export.offers(subject)]
    except BenchError as exc:  # a plugin folder's module that does not import, two exports of one kind
        st.error(plain(exc))
        return
    if not offered:
        return
    for column, export in zip(st.columns(len(offered)), offered):
        column.download_button(
            export.label_for(subject),
            functools.partial(export.build, subject),
            file_name=export.name_for(subject),
            mime=export.mime,
            key=f"export_{subject.scope}_{export.kind}",
            on_click="ignore",
            help=export.help or None,
        )
