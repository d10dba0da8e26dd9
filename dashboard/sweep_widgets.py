"""The Sweep page's small inputs and names: a number input drawn from a setting's declaration, one that can be emptied,
and how a setting, a metric and a swept value are named in its selectboxes and captions."""

from __future__ import annotations

from typing import Any

import streamlit as st

from bench_core.config import Setting
from bench_core.config.settings import widget_label
from bench_core.views.tables import describe_column

NO_SECOND = "(none)"


def sweep_number(where: Any, declared: Setting, key: str, placeholder: str | None = None) -> Any:
    """A number input for a sweep's own setting, starting at its default, labelled and explained by its declaration.
    It takes any number: the plan checks its bounds with the sweep's other settings and says what is wrong once."""
    shown = where.number_input(
        widget_label(declared),
        value=declared.default,
        step=declared.widget.step
        if declared.widget and declared.widget.step
        else (1 if declared.kind is int else None),
        key=key,
        placeholder=placeholder,
        format=declared.widget.format if declared.widget else None,
        help=f"{declared.cli_flag}: {declared.cli_help}",
    )
    return None if shown is None else declared.kind(shown)


def number_or_empty(where: Any, label: str, key: str, start: int | None, **options: Any) -> int | None:
    """A whole-number input starting at `start` (again whenever `start` changes: another backend's run size) that
    can still be emptied: Streamlit lets a number input be emptied only when it has no default value of its own.
    It takes any number: its bounds are checked with the sweep's other settings."""
    started_at = f"{key}_start"
    if key not in st.session_state or st.session_state.get(started_at) != start:
        st.session_state[key] = start
        st.session_state[started_at] = start
    return where.number_input(label, value=None, step=1, key=key, **options)


def axis_label(name: str, server_fields: list[str]) -> str:
    """A setting to sweep as the selectbox names it: a field of the server command as the command writes it."""
    if name == NO_SECOND:
        return name
    return f"{{{name}}} (server command)" if name in server_fields else setting_label(name)


def setting_label(name: str) -> str:
    label = describe_column(name).label
    return name if label.lower().replace(" ", "_") == name else f"{name} ({label})"


def title(name: str) -> str:
    return describe_column(name).title


def tick(value: Any) -> str:
    return "none" if value is None else str(value)
