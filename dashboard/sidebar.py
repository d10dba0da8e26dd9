"""The Run page's sidebar: every setting of a benchmark, and the RunConfig built from them.

`render_sidebar` draws the widgets and returns their values as a plain dict, by setting name; `build_run_config`
turns such a dict into a RunConfig without touching streamlit, so it is unit-testable. Each widget is drawn from
its setting's declaration (bounds, choices, label, help, unit; `setting_widgets`); the sidebar only says which
settings show where: the model and the engine's knobs of the backend (`engine_widgets`), the dataset's and the load's
that apply to the chosen dataset and load pattern, generation and the SLO. A widget's
key is its setting's (`widget_key`), so it keeps its value across pages and reloads (`url_settings`);
`widget_values` is the way back from a past run's RunConfig to them.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import streamlit as st

from bench_core.config import SLO, Part, RunConfig, config_from_values, of_part, setting, settings_of
from bench_core.config.catalog import BY_NAME
from bench_core.config.settings import widget_label
from bench_core.csvstore import replace_bytes
from bench_core.engines import availability, backends
from bench_core.engines import backend as backend_of
from bench_core.errors import BenchError, ConfigError, DatasetError
from bench_core.load import dataset_names, takes
from bench_core.load.datasets import BUILTIN_SAMPLE, BUILTIN_SHAREGPT
from bench_core.load.lengths import RANDOM_LENGTHS, describe_random_lengths
from bench_core.measure.quality import KEEPING_SETTINGS, runs_with_answers
from bench_core.models.resolve import PICKABLE_MODELS
from bench_core.run.run_again import applies_to_run
from bench_core.run.runner import Run
from bench_core.store.history import History
from dashboard import start_estimate, url_settings
from dashboard.engine_widgets import (
    OTHER_MODEL,
    backend_label,
    knob_widgets,
    model_widgets,
    server_widgets,
    show_unavailable_backends,
)
from dashboard.setting_widgets import draw_settings, input_problems, shown_values, widget_key
from dashboard.state import get_history
from dashboard.text import plain
from dashboard.url_settings import persisted

DEFAULT_BACKEND = setting("backend").default
BUILTIN_DATASETS = {
    BUILTIN_SHAREGPT: "ShareGPT (built-in copy)",
    BUILTIN_SAMPLE: "Small generated sample",
}
SOURCE_BUILTIN, SOURCE_UPLOAD, SOURCE_PATH = "Built-in", "Upload", "Path"
SLO_SETTINGS = of_part(Part.SLO)


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
        format_func=backend_label,
    )
    values["backend"] = backend
    family = _family(backend)
    values.update((model_widgets if backend_of(backend).in_process else server_widgets)(backend, family))
    reason = availability(backend)
    show_unavailable_backends()
    values.update(knob_widgets(backend, family))

    bar.subheader("Dataset")
    values.update(_dataset_widgets(backend, family))

    bar.subheader("Load")
    values.update(_load_widgets(backend, family))
    values.update(_quality_widgets(backend, family))
    with bar.expander("Generation"):
        st.caption("LMDeploy's pipeline script decodes greedily with ignore_eos, whatever the sampling settings say.")
        values.update(draw_settings(of_part(Part.GENERATION), backend, family))
    with bar.expander("Goodput SLO (ms)", expanded=False):
        st.caption(
            "A request is good when it meets every threshold set. Changing them updates the goodput "
            "of the run shown, from its stored requests, without running it again."
        )
        values.update(draw_settings(SLO_SETTINGS, backend, family))
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
    left to `preflight.check_run` (at Start). The settings of the other datasets are left at their defaults."""
    chosen = {name: value for name, value in values.items() if name in BY_NAME}
    chosen.update(
        model=str(chosen["model"]).strip(),
        dataset=str(chosen["dataset"]).strip(),
        api_key=chosen.get("api_key") or None,
    )
    for declared in of_part(Part.DATASET):
        if not takes(chosen["dataset_name"], declared):
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
            values.update(shown_values(declared, widget_key(declared, family), value))
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


# ---- widget groups ---------------------------------------------------------------------------


def _family(backend: str) -> str:
    """Widgets of what a run size sets have keys per run size: switching to a backend of another size (LMDeploy's
    on a GPU, a CPU's) starts them at its values."""
    return backend_of(backend).run_size.name


def _load_pattern_key(backend: str) -> str:
    return "load_pattern" if backend_of(backend).in_process else "load_pattern_server"  # a default per kind


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
        offered = dataclasses.replace(setting("dataset_name"), choices=dataset_names())  # a plugin's too
        values.update(draw_settings((offered,), backend, family))
        shown = [
            declared
            for declared in of_part(Part.DATASET)
            if declared.widget is not None
            and declared.name != "dataset_name"
            and declared.name not in KEEPING_SETTINGS  # the quality guard's expander
            and takes(values["dataset_name"], declared)
        ]
        # The sizes last: what the prompts are first, then how many.
        sizes = ("num_prompts", "seed")
        values.update(draw_settings(tuple(s for s in shown if s.name not in sizes), backend, family))
        if all(values.get(name) is not None for name in RANDOM_LENGTHS):
            st.caption(f"Lengths drawn: {plain(describe_random_lengths(*(values[name] for name in RANDOM_LENGTHS)))}")
        values.update(draw_settings(tuple(s for s in shown if s.name in sizes), backend, family))
    return values


def _quality_widgets(backend: str, family: str) -> dict[str, Any]:
    """The quality guard's settings: keep the answers, check them against a baseline run's, score them on a set."""
    with st.sidebar.expander("Quality guard"):
        st.caption(
            "Drift: this run's answers against a baseline run's to the same prompts, both greedy (temperature 0). "
            "Accuracy: the answers scored against a quality set's references; its prompts replace the dataset's."
        )
        values = draw_settings((setting("keep_outputs"),), backend, family)
        values["drift_baseline"] = _drift_baseline_picker(family)
        values.update(draw_settings((setting("quality_set"),), backend, family))
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
        return {"load_pattern": pattern, **draw_settings(shown, backend, family)}
