"""Sidebar settings that outlive a page switch and a reload: kept in the session and in the URL.

Streamlit gives each page its own widgets (a widget's identity includes its page), so the sidebar drawn on
Run and again on Sweep would start over at its defaults, and a reload starts a new session. A persisted
widget is drawn through `persisted`, which starts it at this session's last value, else the URL's, else its
default; `remember` then records the values the sidebar shows, and puts in the URL's query parameters only
those that differ from the defaults, so a link stays short and carries the settings. Never for secrets: the
API key widget is not drawn through here, and a server URL's password or a request body's key is masked.

A link's value that a widget cannot take (not a number, outside the setting's range: `refuse` says why, as the
setting's declaration words it) is not used: the widget starts at its default, and `refused` gives one sentence
per such value for the page to show.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import streamlit as st

from bench_core.config import format_value, parse_bool
from bench_core.redact import redact_text

STORE = "sidebar_settings"  # session key: widget key -> last value shown, for every page of the session
REFUSED = "sidebar_refused"  # session key: widget key -> why the link's value for it was not used
SHOWN_TEXT = 40  # characters of a refused value quoted
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
    **kwargs: Any,
) -> Any:
    """Draw `make` (st.selectbox, st.radio, st.number_input, ...) with its starting value restored.

    A choice widget takes `options` and an `index`; the others a `value` (and a number's `min_value`,
    `max_value`, `step`, which also say how to read a number back from the URL). `refuse`: the sentence why a value
    read from the URL cannot be the setting's (None: it can).
    """
    refuse: Callable[[Any], str | None] = kwargs.pop("refuse", None) or (lambda value: None)
    if options is not None:
        options = list(options)
        default = options[kwargs.pop("index", 0)]
        start = _restored(key, default, lambda text: _choice(text, options))
        if start not in options:  # this session's last choice is offered no longer (a run picked, since deleted)
            start = default
            st.session_state.pop(key, None)
        return make(label, options, index=options.index(start), key=key, **kwargs)
    default = kwargs.pop("value")
    number = _number_type(default, kwargs)
    start = _restored(
        key, default, lambda text: _number(text, number, kwargs, refuse) if number else _scalar(text, default)
    )
    return make(label, value=start, key=key, **kwargs)


def drawn(
    make: Callable[..., Any], label: str, *, key: str, options: Sequence[Any] | None = None, **kwargs: Any
) -> Any:
    """Draw `make` as `persisted` would, but starting at its default: for a widget a page does not keep (no link
    gives it a value, so nothing is refused)."""
    kwargs.pop("refuse", None)
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


def refused() -> list[str]:
    """Why each of this session's link values that a widget could not take was not used, one sentence each."""
    return list(st.session_state.get(REFUSED, {}).values())


def forget_refused() -> None:
    st.session_state.pop(REFUSED, None)


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
    except ValueError as exc:  # a hand-edited or outdated link: the default, and the page says why
        shown = text if len(text) <= SHOWN_TEXT else text[:SHOWN_TEXT] + "..."
        why = str(exc) if str(exc) != text else "it is not a value this setting takes."
        st.session_state.setdefault(REFUSED, {})[key] = redact_text(f"{key}={shown!r}: {why}")
        return default


def _choice(text: str, options: list[Any]) -> Any:
    for option in options:
        if format_value(option) == text:
            return option
    raise ValueError(f"it is none of {', '.join(format_value(option) for option in options)}.")


def _number_type(default: Any, kwargs: Mapping[str, Any]) -> type | None:
    if isinstance(default, bool):
        return None
    for value in (default, kwargs.get("step"), kwargs.get("min_value")):
        if isinstance(value, (int, float)):
            return type(value)
    return None


def _number(
    text: str, number: type, kwargs: Mapping[str, Any], refuse: Callable[[Any], str | None]
) -> int | float | None:
    """The number `text` spells, if the widget can show it; ValueError saying why not (the setting's own sentence,
    from `refuse`, where it has one)."""
    if text == NONE:
        return None
    try:
        value = number(text)
    except ValueError:
        try:
            other = float(text)  # nan, 1e30 or 2.5 for a whole number: the setting's sentence says what it takes
        except ValueError:
            raise ValueError("it is not a number.") from None
        raise ValueError(refuse(other) or "it is not a whole number.") from None
    if (problem := refuse(value)) is not None:
        raise ValueError(problem)
    low, high = kwargs.get("min_value"), kwargs.get("max_value")
    if (
        (isinstance(value, float) and not math.isfinite(value))
        or (isinstance(value, int) and abs(value) > JS_SAFE_INTEGER)
        or (low is not None and value < low)
        or (high is not None and value > high)
    ):
        raise ValueError(f"{text} is beyond what the widget shows.")
    return value


def _scalar(text: str, default: Any) -> Any:
    return parse_bool(text) if isinstance(default, bool) else text


def _same(value: Any, default: Any) -> bool:
    return type(value) is type(default) and value == default
