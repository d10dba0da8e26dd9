"""Sidebar settings that outlive a page switch and a reload: kept in the session and in the URL.

Streamlit gives each page its own widgets (a widget's identity includes its page), so the sidebar drawn on
Run and again on Sweep would start over at its defaults, and a reload starts a new session. A persisted
widget is drawn through `persisted`, which starts it at this session's last value, else the URL's, else its
default; `remember` then records the values the sidebar shows, and puts in the URL's query parameters only
those that differ from the defaults, so a link stays short and carries the settings. Never for secrets: the
API key widget is not drawn through here, and a server URL's password or a request body's key is masked.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import streamlit as st

from bench_core.config import format_value, parse_bool
from bench_core.redact import redact_text

STORE = "sidebar_settings"  # session key: widget key -> last value shown, for every page of the session
NONE = format_value(None)  # how an empty optional value is written in the URL
# Streamlit number widgets hold what a browser number holds exactly; a larger integer breaks the page.
JS_SAFE_INTEGER = 2**53 - 1
# Defaults per widget key, as the widgets declare them; the same for every session.
_DEFAULTS: dict[str, Any] = {}


def persisted(
    make: Callable[..., Any],
    label: str,
    *,
    key: str,
    options: Sequence[Any] | None = None,
    accepts: Callable[[Any], bool] | None = None,
    **kwargs: Any,
) -> Any:
    """Draw `make` (st.selectbox, st.radio, st.number_input, ...) with its starting value restored.

    A choice widget takes `options` and an `index`; the others a `value` (and a number's `min_value`,
    `max_value`, `step`, which also say how to read a number back from the URL). A value the URL gives that
    `accepts` refuses (a hand-edited link's 0 prompts) starts the widget at its default instead.
    """
    if options is not None:
        options = list(options)
        default = options[kwargs.pop("index", 0)]
        start = _restored(key, default, lambda text: _choice(text, options))
        return make(label, options, index=options.index(start), key=key, **kwargs)
    default = kwargs.pop("value")
    number = _number_type(default, kwargs)

    def parse(text: str) -> Any:
        value = _number(text, number, kwargs) if number else _scalar(text, default)
        if accepts is not None and not accepts(value):
            raise ValueError(text)
        return value

    start = _restored(key, default, parse)
    return make(label, value=start, key=key, **kwargs)


def drawn(
    make: Callable[..., Any], label: str, *, key: str, options: Sequence[Any] | None = None, **kwargs: Any
) -> Any:
    """Draw `make` as `persisted` would, but starting at its default: for a widget a page does not keep."""
    return make(label, key=key, **kwargs) if options is None else make(label, list(options), key=key, **kwargs)


def remember() -> None:
    """Record the persisted widgets' values for the other pages, and write the non-default ones to the URL."""
    store = _store()
    store.update({key: st.session_state[key] for key in _DEFAULTS if key in st.session_state})
    for key, default in _DEFAULTS.items():
        value = store.get(key, default)
        text = None if _same(value, default) else redact_text(format_value(value))  # a link holds no password
        if text is None and key in st.query_params:
            del st.query_params[key]
        elif text is not None and st.query_params.get(key) != text:
            st.query_params[key] = text


def load(values: Mapping[str, Any]) -> None:
    """Show `values` (widget key -> value) in the sidebar from the next draw on, on every page; call it from
    a button's on_click, which runs before any widget is drawn."""
    for key, value in values.items():
        st.session_state[key] = value
    _store().update(values)


def _store() -> dict[str, Any]:
    return st.session_state.setdefault(STORE, {})


def _restored(key: str, default: Any, parse: Callable[[str], Any]) -> Any:
    """This session's last value, else the URL's when it reads as one, else the default."""
    _DEFAULTS[key] = default
    store = _store()
    if key in store:
        return store[key]
    text = st.query_params.get(key)
    if text is None:
        return default
    try:
        return parse(text)
    except ValueError:  # a hand-edited or outdated link: the default, not an error
        return default


def _choice(text: str, options: list[Any]) -> Any:
    for option in options:
        if format_value(option) == text:
            return option
    raise ValueError(text)


def _number_type(default: Any, kwargs: Mapping[str, Any]) -> type | None:
    if isinstance(default, bool):
        return None
    for value in (default, kwargs.get("step"), kwargs.get("min_value")):
        if isinstance(value, (int, float)):
            return type(value)
    return None


def _number(text: str, number: type, kwargs: Mapping[str, Any]) -> int | float | None:
    if text == NONE:
        return None
    value = number(text)
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(text)
    if isinstance(value, int) and abs(value) > JS_SAFE_INTEGER:
        raise ValueError(text)
    low, high = kwargs.get("min_value"), kwargs.get("max_value")
    if (low is not None and value < low) or (high is not None and value > high):
        raise ValueError(text)
    return value


def _scalar(text: str, default: Any) -> Any:
    return parse_bool(text) if isinstance(default, bool) else text


def _same(value: Any, default: Any) -> bool:
    return type(value) is type(default) and value == default
