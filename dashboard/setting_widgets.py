"""One widget per setting, drawn from its declaration (bounds, choices, label, help, unit), and the way between a
setting's value and its widget's: the sidebar and the Run page's run-again form draw their settings through here. A widget's key is its setting's (`widget_key`), so it keeps its value across pages and reloads (`url_settings`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import streamlit as st

from bench_core.config import Part, Setting, setting
from bench_core.config.catalog import BY_NAME
from bench_core.config.settings import widget_label
from bench_core.engines import backend as backend_of
from dashboard.text import plain
from dashboard.url_settings import persisted

SIZED = ("num_prompts", "concurrency", "stream_output", "sharegpt_output_len")  # what a backend's run size sets


def widget_key(declared: Setting, family: str) -> str:
    """The session and URL key of a setting's widget: its declared one, else knob_<name> for an engine knob,
    gen_<name> for generation, <name>_<family> for what a backend's run size sets (switching between LMDeploy's
    backends and the others starts those at the other's defaults), else its name."""
    if declared.widget is not None and declared.widget.key:
        return declared.widget.key
    if declared.is_knob:
        return f"knob_{declared.name}"
    if declared.part == Part.GENERATION:
        return f"gen_{declared.name}"
    return f"{declared.name}_{family}" if declared.name in SIZED else declared.name


def to_widget(declared: Setting, value: Any) -> Any:
    """A setting's value as its widget shows it: in the unit typed (ms for an SLO), empty for inf or unset."""
    if declared.choices is not None:
        return value  # None is a choice too ("off")
    if value is None or (isinstance(value, float) and math.isinf(value)):
        return "" if declared.kind is str else None
    if declared.kind in (str, bool):
        return value
    typed = value / declared.typed_scale
    return float(typed) if declared.kind is float else int(typed)


def from_widget(declared: Setting, shown: Any) -> Any:
    """The inverse of `to_widget`: what a widget's value sets."""
    if declared.kind is str and declared.choices is None:
        text = str(shown or "").strip()
        return text or (None if declared.optional else declared.default)
    if shown is None:
        return math.inf if declared.allow_inf and not declared.optional else None
    if declared.choices is not None or declared.kind is bool:
        return shown
    value = shown * declared.typed_scale
    return float(value) if declared.kind is float else int(value)


def setting_widget(declared: Setting, key: str, start: Any, backend: str, draw: Callable[..., Any] = persisted) -> Any:
    """Draw the setting's widget in the current container (the sidebar, an expander), starting at `start` (in the
    widget's unit), with the choices `backend` takes; return the setting's value. A value its declaration refuses is
    said under the widget, and Start is disabled while it shows (`input_problems`). `draw`: `persisted`, or
    `url_settings.drawn` for a widget outside the sidebar that no other page and no link keeps."""
    value = _draw_widget(declared, key, start, backend, draw)
    for problem in declared.problems(value, backend):
        st.error(plain(problem))
    return value


def input_problems(values: Mapping[str, Any], backend: str) -> list[str]:
    """What the declarations of the sidebar's settings refuse in `values` (by setting name), as `setting_widget`
    says it under each widget."""
    return [
        problem
        for name, value in values.items()
        if name in BY_NAME
        for problem in setting(name).problems(value, backend)
    ]


def _draw_widget(declared: Setting, key: str, start: Any, backend: str, draw: Callable[..., Any]) -> Any:
    hints, label = declared.widget, widget_label(declared)
    options: dict[str, Any] = {"key": key, "help": declared.help or None}
    if declared.choices is not None:
        choices = declared.choices_for(backend)
        start = start if start in choices else choices[0]
        if hints.style == "radio":
            return draw(st.radio, label, options=choices, index=choices.index(start), horizontal=True, **options)
        return from_widget(
            declared,
            draw(
                st.selectbox,
                label,
                options=choices,
                index=choices.index(start),
                format_func=declared.choice_label,
                **options,
            ),
        )
    if hints.style == "switch":
        return _switched_count(declared, key, start, label, options, draw)
    if declared.kind is bool:
        return draw(st.checkbox, label, value=start, **options)
    if declared.kind is str:
        return from_widget(
            declared, draw(st.text_input, label, value=start or "", placeholder=hints.placeholder, **options)
        )
    if declared.kind is int:
        options["step"] = int(hints.step or 1)
    else:
        options["step"] = hints.step
        if hints.style == "slider":  # its ends hold what it takes: nothing else can be chosen
            bounds = declared.bounds
            low, high = (bounds.widget_min, bounds.widget_max) if bounds else (None, None)
            return from_widget(
                declared,
                draw(
                    st.slider,
                    label,
                    value=float(start),
                    min_value=low,
                    max_value=high,
                    refuse=_refusal(declared, backend),
                    **options,
                ),
            )
        options["format"] = hints.format
        start = None if start is None else float(start)
    # No min_value or max_value: a number input refuses a value beyond them in the browser (a red "!") and keeps its
    # last one, which Start would then run unseen. The setting's bounds are checked here instead (`setting_widget`).
    placeholder = hints.placeholder if start is None or hints.placeholder else None
    return from_widget(
        declared,
        draw(
            st.number_input,
            label,
            value=start,
            placeholder=placeholder,
            refuse=_refusal(declared, backend),
            **options,
        ),
    )


def _refusal(declared: Setting, backend: str | None = None) -> Callable[[Any], str | None]:
    """Why a value for the setting's widget (read from a link) cannot be the setting's: its declaration's sentence."""

    def refuse(shown: float) -> str | None:
        try:
            value = from_widget(declared, shown)
        except (ValueError, OverflowError):  # nan or inf for a whole number: the declaration's sentence says why
            value = shown
        problems = declared.problems(value, backend)
        return problems[0] if problems else None

    return refuse


def switch_key(key: str) -> str:
    """The key of a switched count's checkbox, beside its number's `key`."""
    return f"{key}_on"


def _switched_count(
    declared: Setting, key: str, start: Any, label: str, options: dict[str, Any], draw: Callable[..., Any]
) -> int:
    """A checkbox, on when `start` is above 0, with the count it turns on beside it; off, the count is 0."""
    on = draw(st.checkbox, label, value=bool(start), key=switch_key(key), help=options["help"])
    shown = start or declared.widget.start
    count = draw(
        st.number_input,
        declared.shown_label,
        value=int(shown),
        step=int(declared.widget.step or 1),
        key=key,
        disabled=not on,
        label_visibility="collapsed",
        refuse=_refusal(declared),
    )
    return int(count) if on else 0


def shown_values(declared: Setting, key: str, value: Any) -> dict[str, Any]:
    """The widget keys and values that show `value` of this setting: a switched count's checkbox and number."""
    if declared.widget.style == "switch":
        return {switch_key(key): bool(value), key: value or declared.widget.start}
    return {key: to_widget(declared, value)}


def draw_settings(settings: tuple[Setting, ...], backend: str, family: str) -> dict[str, Any]:
    """Each of `settings`' widgets in turn, by setting name."""
    return {
        declared.name: setting_widget(declared, widget_key(declared, family), _start_value(declared, backend), backend)
        for declared in settings
    }


def _start_value(declared: Setting, backend: str) -> Any:
    """Where a widget starts: the backend's run size, else the widget's own start, else the setting's default."""
    if declared.name in SIZED:
        return to_widget(declared, getattr(backend_of(backend).run_size, declared.name))
    if declared.widget.start is not None:
        return declared.widget.start
    return to_widget(declared, declared.default)
