"""The sidebar's model and engine: the backends (those this machine cannot run said once per reason), the model (a
built-in one, a path or hub id, or the one a server is asked for, with its API key) and the backend's knobs in
LMDeploy's CLI groups."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import streamlit as st

from bench_core.config import Setting, knobs_for, setting
from bench_core.engines import availability, backends
from bench_core.models.resolve import PICKABLE_MODELS
from dashboard.setting_widgets import draw_settings
from dashboard.text import plain
from dashboard.url_settings import persisted

DEFAULT_MODEL = setting("model").default
OTHER_MODEL = "Local path or hub id"


def backend_label(backend: str) -> str:
    return backend if availability(backend) is None else f"{backend} (unavailable here)"


def show_unavailable_backends() -> None:
    """One caption per reason, so the user sees why LMDeploy's engines cannot be chosen here."""
    reasons: dict[str, list[str]] = {}
    for backend in backends():
        reason = availability(backend)
        if reason:
            reasons.setdefault(reason, []).append(backend)
    for reason, names in reasons.items():
        st.sidebar.caption(f"**{plain(', '.join(names))} unavailable:** {plain(reason)}")


def model_picker(where: Any, key_prefix: str = "", draw: Callable[..., Any] = persisted) -> str:
    """The model: a built-in one, or a local path or hub id typed in, drawn in `where` (the sidebar, a column)
    with widget keys `key_prefix` + model_choice / model_path; `draw` is `persisted`, or `url_settings.drawn`
    on a page that does not keep its widgets across pages and reloads."""
    options = [*PICKABLE_MODELS, OTHER_MODEL]
    choice = draw(
        where.selectbox,
        "Model",
        options=options,
        index=options.index(DEFAULT_MODEL),
        key=f"{key_prefix}model_choice",
        help="\n\n".join(f"**{name}**: {text}" for name, text in PICKABLE_MODELS.items()),
    )
    if choice != OTHER_MODEL:
        return choice
    return draw(
        where.text_input,
        "Model path or hub id",
        value="",
        key=f"{key_prefix}model_path",
        placeholder="/models/Qwen2.5-7B-Instruct, Qwen/Qwen2.5-7B-Instruct or synthetic:llama:layers=..",
        help="A folder, a hub id, or a synthetic model of any shape: synthetic:llama (or qwen2):layers=2,"
        "hidden=64,intermediate=128,heads=4,kv_heads=2,vocab=4096, or a preset with sizes changed, "
        "e.g. synthetic:llama-3.2-1b:layers=4.",
    )


def model_widgets(backend: str, family: str) -> dict[str, Any]:
    model = model_picker(st.sidebar)
    with st.sidebar:
        return {"model": model, **draw_settings((setting("trust_remote_code"),), backend, family)}


def server_widgets(backend: str, family: str) -> dict[str, Any]:
    """The model a server is asked for, and its API key: typed here, kept in memory, never stored."""
    bar = st.sidebar
    model = persisted(
        bar.text_input,
        "Model (optional)",
        value="",
        key="server_model",
        placeholder="empty: the first of GET /v1/models",
        help="The model name sent in each request.",
    )
    api_key = bar.text_input(
        "API key (optional)",
        type="password",
        key="api_key",
        placeholder="empty: $OPENAI_API_KEY, if set",
        help="Sent as a Bearer header; never written to the history, config or logs.",
    )
    with bar:
        return {"model": model, "api_key": api_key, **draw_settings((setting("trust_remote_code"),), backend, family)}


def knob_widgets(backend: str, family: str) -> dict[str, Any]:
    """Every knob of `backend` that has a widget (not server_settings: only a server sweep sets it), in LMDeploy's
    CLI groups, starting at LMDeploy's defaults."""
    groups: dict[str, list[Setting]] = {}
    for knob in knobs_for(backend):
        if knob.widget is not None:
            groups.setdefault(knob.group, []).append(knob)
    chosen: dict[str, Any] = {}
    for group, knobs in groups.items():
        with st.sidebar.expander(plain(group)):
            for knob in knobs:
                chosen.update(draw_settings((knob,), backend, family))
                if rule := knob.rule_for(backend):
                    st.caption(f"Constraint: {plain(rule)}")
    return chosen
