"""The Run page's sidebar: every setting of a benchmark, and the RunConfig built from them.

`render_sidebar` draws the widgets and returns their values as a plain dict, by setting name; `build_run_config`
turns such a dict into a RunConfig without touching streamlit, so it is unit-testable. Each widget is drawn from
its setting's declaration (bounds, choices, label, help, unit; `setting_widget`); the sidebar only says which
settings show where: the engine's knobs of the backend, grouped in expanders as LMDeploy's CLI groups them, the
dataset's and the load's that apply to the chosen dataset and load pattern, generation and the SLO. A widget's
key is its setting's (`widget_key`), so it keeps its value across pages and reloads (`url_settings`);
`widget_values` is the way back from a past run's RunConfig to them.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import streamlit as st

from bench_core.config import (
    SLO,
    Part,
    RunConfig,
    Setting,
    config_from_values,
    knobs_for,
    of_part,
    setting,
    settings_of,
)
from bench_core.config.catalog import BY_NAME
from bench_core.config.run_again import applies_to_run
from bench_core.config.settings import widget_label
from bench_core.csvstore import replace_bytes
from bench_core.engines import availability, backends
from bench_core.engines import backend as backend_of
from bench_core.errors import BenchError, ConfigError, DatasetError
from bench_core.load.datasets import BUILTIN_SAMPLE, BUILTIN_SHAREGPT
from bench_core.load.lengths import RANDOM_LENGTHS, describe_random_lengths
from bench_core.measure.quality import KEEPING_SETTINGS, runs_with_answers
from bench_core.models.resolve import PICKABLE_MODELS
from bench_core.run.runner import Run
from bench_core.store.history import History
from dashboard import start_estimate, url_settings
from dashboard.state import get_history
from dashboard.text import plain
from dashboard.url_settings import persisted

DEFAULT_MODEL = setting("model").default
DEFAULT_BACKEND = setting("backend").default
OTHER_MODEL = "Local path or hub id"
BUILTIN_DATASETS = {
    BUILTIN_SHAREGPT: "ShareGPT (built-in copy)",
    BUILTIN_SAMPLE: "Small generated sample",
}
SOURCE_BUILTIN, SOURCE_UPLOAD, SOURCE_PATH = "Built-in", "Upload", "Path"
SLO_SETTINGS = of_part(Part.SLO)


SIZED = ("num_prompts", "concurrency", "stream_output", "sharegpt_output_len")  # what a backend's run size sets


@dataclass
class SidebarChoice:
    """What the user set and pressed this rerun; `problems`: what the settings' declarations refuse in `values`, said
    under their widgets (a page's Start stays disabled while there are any)."""

    values: dict[str, Any]
    start: bool
    unavailable_reason: str | None
    problems: list[str]


def render_sidebar(cancel: Callable[[], None] | None, actions: bool = True) -> SidebarChoice:
    """Draw the sidebar; `cancel` stops the run on show (None disables the Cancel button). Without
    `actions` there are no Start and Cancel buttons: a page that starts something else has its own."""
    bar = st.sidebar
    buttons = bar.container()  # filled last, shown first: Start needs the backend's availability
    values: dict[str, Any] = {
        "label": persisted(bar.text_input, "Run label", value="", key="label", placeholder="optional")
    }

    bar.subheader("Model and engine")
    names = list(backends())
    backend = persisted(
        bar.selectbox,
        "Backend",
        options=names,
        index=names.index(DEFAULT_BACKEND),
        key="backend",
        format_func=_backend_label,
    )
    values["backend"] = backend
    family = _family(backend)
    values.update((_model_widgets if backend_of(backend).in_process else _server_widgets)(backend, family))
    reason = availability(backend)
    _show_unavailable_backends()
    values.update(_knob_widgets(backend, family))

    bar.subheader("Dataset")
    values.update(_dataset_widgets(backend, family))

    bar.subheader("Load")
    values.update(_load_widgets(backend, family))
    values.update(_quality_widgets(backend, family))
    with bar.expander("Generation"):
        st.caption("LMDeploy's pipeline script decodes greedily with ignore_eos, whatever the sampling settings say.")
        values.update(_widgets(of_part(Part.GENERATION), backend, family))
    with bar.expander("Goodput SLO (ms)", expanded=False):
        st.caption(
            "A request is good when it meets every threshold set. Changing them updates the goodput "
            "of the run shown, from its stored requests, without running it again."
        )
        values.update(_widgets(SLO_SETTINGS, backend, family))
    url_settings.remember()
    problems = input_problems(values, backend)
    if refused := url_settings.refused():
        st.error(
            "Settings in this page's link were not used; the sidebar shows its own instead. "
            + " ".join(plain(why) for why in refused)
        )

    start = False
    if actions:
        with buttons:
            left, right = st.columns(2)
            go = start_estimate.run_confirmed(None if problems else config_or_none(values))
            start = left.button(
                "Start",
                key="start",
                type="primary",
                disabled=reason is not None or bool(problems) or not go,
                help="Correct the settings marked in red below first." if problems else None,
                width="stretch",
            )
            right.button("Cancel", key="cancel", disabled=cancel is None, on_click=cancel, width="stretch")
    if start:
        url_settings.forget_refused()  # said once the user starts a run with the sidebar's values
    return SidebarChoice(values=values, start=start, unavailable_reason=reason, problems=problems)


def config_or_none(values: Mapping[str, Any]) -> RunConfig | None:
    """The run the sidebar's values make, for its estimate; None while they make none (Start then says why)."""
    try:
        return build_run_config(values)
    except BenchError:
        return None


def chosen_slo(values: Mapping[str, Any]) -> SLO:
    """The SLO the sidebar's values set (typed in ms, in seconds)."""
    return SLO(**{slo.name: values.get(slo.name) for slo in SLO_SETTINGS})


def build_run_config(values: Mapping[str, Any]) -> RunConfig:
    """The RunConfig for the sidebar's values (by setting name; a missing one takes its default); validation is
    left to `check_run_config` (at submit). The settings of the other datasets are left at their defaults."""
    chosen = {name: value for name, value in values.items() if name in BY_NAME}
    chosen.update(
        model=str(chosen["model"]).strip(),
        dataset=str(chosen["dataset"]).strip(),
        api_key=chosen.get("api_key") or None,
    )
    for declared in of_part(Part.DATASET):
        if declared.datasets and not declared.applies(dataset_name=chosen["dataset_name"]):
            chosen[declared.name] = declared.default
    return config_from_values(chosen, label=str(values.get("label", "")).strip())


def widget_values(config: RunConfig) -> dict[str, Any]:
    """The sidebar's widget values (by key) that rebuild `config`: the inverse of `build_run_config`, used to load
    a past run's settings. An uploaded dataset comes back as the path it was saved to."""
    engine, data = config.engine, config.dataset
    family = _family(engine.backend)
    values: dict[str, Any] = {"label": config.label, "backend": engine.backend}
    if not backend_of(engine.backend).in_process:
        values["server_model"] = engine.model
    elif engine.model in PICKABLE_MODELS:
        values["model_choice"] = engine.model
    else:
        values.update(model_choice=OTHER_MODEL, model_path=engine.model)
    if data.dataset in BUILTIN_DATASETS:
        values.update(dataset_source=SOURCE_BUILTIN, dataset_builtin=data.dataset)
    else:
        values.update(dataset_source=SOURCE_PATH, dataset_path=data.dataset)
    values[_load_pattern_key(engine.backend)] = config.load.load_pattern
    for name, value in settings_of(config).items():
        declared = setting(name)
        if declared.widget is not None and applies_to_run(declared, config):
            values.update(_widget_values(declared, widget_key(declared, family), value))
    return values


def offer_past_settings(run_id: str, run: Run | None, history: History) -> None:
    """For an ended run: a button that loads its settings into the sidebar. Nothing for an imported row that
    kept no settings, or an unknown run (the run view says so)."""
    try:
        config = run.config if run is not None else history.config(run_id)
    except BenchError:
        return
    st.button(
        "Load these settings into the sidebar",
        key="load_settings",
        icon=":material/settings_backup_restore:",
        on_click=url_settings.load,
        args=(widget_values(config),),
        help="Set every sidebar setting as this run had it, to run it again or change one thing.",
    )


def config_from_choice(values: Mapping[str, Any], uploads_dir: Path) -> RunConfig:
    """The sidebar's settings as a RunConfig, an uploaded dataset saved to a file first."""
    values = dict(values)
    upload = values.get("upload")
    if upload is not None:
        values["dataset"] = save_upload(upload.getvalue(), upload.name, uploads_dir)
    if not str(values.get("dataset") or "").strip():
        raise ConfigError("No dataset given: upload a ShareGPT file, type its path, or choose a built-in dataset.")
    return build_run_config(values)


def save_upload(data: bytes, name: str, folder: Path) -> str:
    """Keep an uploaded dataset as a file the runner can read, once per content: the same bytes uploaded again,
    under any name, are the file kept the first time (uploads are kept for the runs that name them)."""
    digest = hashlib.sha256(data).hexdigest()[:16]
    folder = Path(folder)
    kept = sorted(folder.glob(f"{digest}-*")) if folder.is_dir() else []
    if kept:
        return str(kept[0])
    path = folder / f"{digest}-{Path(name).name}"
    try:
        replace_bytes(path, data)  # whole or not at all: a full disk leaves no half dataset to be run later
    except OSError as exc:
        raise DatasetError(f"Cannot save the uploaded dataset to {path}: {exc.strerror or exc}.") from exc
    return str(path)


# ---- one setting, one widget ---------------------------------------------------------------------


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


def _widget_values(declared: Setting, key: str, value: Any) -> dict[str, Any]:
    """The widget keys and values that show `value` of this setting: a switched count's checkbox and number."""
    if declared.widget.style == "switch":
        return {switch_key(key): bool(value), key: value or declared.widget.start}
    return {key: to_widget(declared, value)}


def _widgets(settings: tuple[Setting, ...], backend: str, family: str) -> dict[str, Any]:
    """Each of `settings`' widgets in turn, by setting name."""
    return {
        declared.name: setting_widget(declared, widget_key(declared, family), _start(declared, backend), backend)
        for declared in settings
    }


def _start(declared: Setting, backend: str) -> Any:
    """Where a widget starts: the backend's run size, else the widget's own start, else the setting's default."""
    if declared.name in SIZED:
        return to_widget(declared, getattr(backend_of(backend).run_size, declared.name))
    if declared.widget.start is not None:
        return declared.widget.start
    return to_widget(declared, declared.default)


# ---- widget groups ---------------------------------------------------------------------------


def _family(backend: str) -> str:
    """Widgets of what a run size sets have keys per run size: switching to a backend of another size (LMDeploy's
    on a GPU, a CPU's) starts them at its values."""
    return backend_of(backend).run_size.name


def _load_pattern_key(backend: str) -> str:
    return "load_pattern" if backend_of(backend).in_process else "load_pattern_server"  # a default per kind


def _backend_label(backend: str) -> str:
    return backend if availability(backend) is None else f"{backend} (unavailable here)"


def _show_unavailable_backends() -> None:
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


def _model_widgets(backend: str, family: str) -> dict[str, Any]:
    model = model_picker(st.sidebar)
    with st.sidebar:
        return {"model": model, **_widgets((setting("trust_remote_code"),), backend, family)}


def _server_widgets(backend: str, family: str) -> dict[str, Any]:
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
        return {"model": model, "api_key": api_key, **_widgets((setting("trust_remote_code"),), backend, family)}


def _knob_widgets(backend: str, family: str) -> dict[str, Any]:
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
                chosen.update(_widgets((knob,), backend, family))
                if rule := knob.rule_for(backend):
                    st.caption(f"Constraint: {plain(rule)}")
    return chosen


def _dataset_widgets(backend: str, family: str) -> dict[str, Any]:
    bar = st.sidebar
    source_kind = persisted(
        bar.radio,
        "Prompts from",
        options=(SOURCE_BUILTIN, SOURCE_UPLOAD, SOURCE_PATH),
        horizontal=True,
        key="dataset_source",
        help="A ShareGPT JSON or JSONL file; the random "
        "and shared-prefix datasets also cut their text from it, as LMDeploy does. The trace and "
        "custom datasets read your own file: a Mooncake JSONL trace, or JSON/JSONL records with "
        "a prompt or messages.",
    )
    values: dict[str, Any] = {"upload": None}
    if source_kind == SOURCE_BUILTIN:
        values["dataset"] = persisted(
            bar.selectbox,
            "Built-in dataset",
            options=BUILTIN_DATASETS,
            key="dataset_builtin",
            format_func=BUILTIN_DATASETS.get,
        )
    elif source_kind == SOURCE_UPLOAD:
        values["upload"] = bar.file_uploader(
            "Dataset file",
            type=["json", "jsonl"],
            key="dataset_upload",
            help="Saved once per content in the history's uploads folder (results/uploads, or under "
            "$BENCH_STUDIO_RESULTS): the same file uploaded again is not stored twice. Delete files there to "
            "free the space; the runs that used one name it.",
        )
        values["dataset"] = ""
    else:
        values["dataset"] = persisted(
            bar.text_input,
            "Dataset file path",
            value="",
            key="dataset_path",
            placeholder="/data/ShareGPT_V3_unfiltered_cleaned_split.json",
        )
    with bar:
        values.update(_widgets((setting("dataset_name"),), backend, family))
        shown = [
            declared
            for declared in of_part(Part.DATASET)
            if declared.widget is not None
            and declared.name != "dataset_name"
            and declared.name not in KEEPING_SETTINGS  # the quality guard's expander
            and declared.applies(dataset_name=values["dataset_name"])
        ]
        # The sizes last: what the prompts are first, then how many.
        sizes = ("num_prompts", "seed")
        values.update(_widgets(tuple(s for s in shown if s.name not in sizes), backend, family))
        if all(values.get(name) is not None for name in RANDOM_LENGTHS):
            st.caption(f"Lengths drawn: {plain(describe_random_lengths(*(values[name] for name in RANDOM_LENGTHS)))}")
        values.update(_widgets(tuple(s for s in shown if s.name in sizes), backend, family))
    return values


def _quality_widgets(backend: str, family: str) -> dict[str, Any]:
    """The quality guard's settings: keep the answers, check them against a baseline run's, score them on a set."""
    with st.sidebar.expander("Quality guard"):
        st.caption(
            "Drift: this run's answers against a baseline run's to the same prompts, both greedy (temperature 0). "
            "Accuracy: the answers scored against a quality set's references; its prompts replace the dataset's."
        )
        values = _widgets((setting("keep_outputs"),), backend, family)
        values["drift_baseline"] = _drift_baseline_picker(family)
        values.update(_widgets((setting("quality_set"),), backend, family))
    return values


def _drift_baseline_picker(family: str) -> str:
    """The history's runs that kept their answers, newest first, or none."""
    declared = setting("drift_baseline")
    try:
        runs = get_history().load((*KEEPING_SETTINGS, "label", "model", "num_prompts")).set_index("run_id", drop=False)
    except BenchError as exc:  # an unreadable history index: no baseline to offer, and the sidebar still draws
        st.caption(plain(f"No drift baseline can be offered: {exc}"))
        names = {}
    else:
        names = {run_id: _baseline_name(runs.loc[run_id]) for run_id in runs_with_answers(runs)}
    return persisted(
        st.selectbox,
        widget_label(declared),
        options=["", *names],
        key=widget_key(declared, family),
        format_func=lambda run_id: names[run_id] if run_id else "None",
        help=f"{declared.help} Offered: the runs that kept their answers (Keep the answers, a drift baseline or a "
        "quality set).",
    )


def _baseline_name(run: Any) -> str:
    """ "<run id> · <label> · <model> · 16 prompts": a baseline as the picker names it."""
    label = f"{run['label']} · " if isinstance(run.get("label"), str) and run["label"] else ""
    return f"{run['run_id']} · {label}{run['model']} · {run['num_prompts']} prompts"


def _load_widgets(backend: str, family: str) -> dict[str, Any]:
    bar = st.sidebar
    declared, offered = setting("load_pattern"), backend_of(backend)
    patterns = offered.load_patterns
    pattern = persisted(
        bar.selectbox,
        "Load pattern",
        options=patterns,
        index=patterns.index(offered.load_pattern),
        key=_load_pattern_key(backend),
        format_func=declared.choice_label,
        help="\n\n".join(f"**{declared.choice_label(p)}**: {declared.choice_help[p]}" for p in patterns),
    )
    with bar:
        shown = tuple(
            s for s in of_part(Part.LOAD) if s.widget is not None and s.applies(backend=backend, load_pattern=pattern)
        )
        return {"load_pattern": pattern, **_widgets(shown, backend, family)}
