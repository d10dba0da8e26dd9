"""The Run page's sidebar: every setting of a benchmark, and the RunConfig built from them.

`render_sidebar` draws the widgets and returns their values as a plain dict; `build_run_config` turns
such a dict into a RunConfig without touching streamlit, so it is unit-testable. Engine knobs come
from `config.knobs_for(backend)`, grouped in expanders as LMDeploy's CLI groups them, with LMDeploy's
defaults; their constraints are shown under each widget and checked by `check_run_config` at Start.
The widgets keep their values across pages and reloads (`url_settings`); `widget_values` is the way back
from a past run's RunConfig to them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import streamlit as st

from bench_core.config import (
    BACKENDS, DATASET_NAMES, LMDEPLOY_BACKENDS, LOAD_PATTERNS, SERVER_BACKEND, SLO, DatasetConfig, EngineConfig,
    GenerationSettings, Knob, LoadConfig, RunConfig, knobs_for,
)
from bench_core.load.datasets import BUILTIN_SAMPLE, BUILTIN_SHAREGPT
from bench_core.engines import availability
from bench_core.errors import BenchError, ConfigError, DatasetError
from bench_core.store.history import History
from bench_core.models.resolve import PICKABLE_MODELS
from bench_core.run.runner import Run
from dashboard import url_settings
from dashboard.url_settings import persisted

DEFAULT_MODEL = "builtin:smollm2-135m"
DEFAULT_BACKEND = "transformers"
OTHER_MODEL = "Local path or hub id"
BUILTIN_DATASETS = {
    BUILTIN_SHAREGPT: "ShareGPT (built-in copy)",
    BUILTIN_SAMPLE: "Small generated sample",
}
SOURCE_BUILTIN, SOURCE_UPLOAD, SOURCE_PATH = "Built-in", "Upload", "Path"
RANDOM_LEN = 128  # the random dataset's input and output lengths to start from
SLO_METRICS = ("ttft", "tpot", "e2e")
LOAD_PATTERN_HELP = {
    "batch": "LMDeploy's profile_pipeline_api.py: every prompt is submitted at once and concurrency bounds "
             "the batch, so TTFT includes queueing.",
    "concurrency": "profile_throughput.py: N workers, a request's clock starts when a worker picks it up.",
    "request_rate": "profile_restful_api.py / vLLM: requests arrive at a rate (Poisson, or gamma with a burstiness "
                    "factor), optionally capped by a max concurrency; a request's clock starts when it is sent.",
}


@dataclass(frozen=True)
class LoadDefaults:
    """Dataset size and load that fit the backend: a first run within two minutes on a CPU, LMDeploy's own on a GPU."""

    num_prompts: int
    concurrency: int
    stream_output: bool
    sharegpt_output_len: int | None


# The first run must end within 2 minutes on 2 busy cores, SmolLM2's conversion included. Measured with an
# empty cache through the CLI, two CPU hogs and another session's tests running (load 3.8-4.6): 16 ShareGPT
# prompts x 64 tokens at concurrency 8, streamed, took 236 s; 8 prompts took 96 s (quiet: 16 prompts, 70 s).
CPU_DEFAULTS = LoadDefaults(num_prompts=8, concurrency=8, stream_output=True, sharegpt_output_len=64)
LMDEPLOY_DEFAULTS = LoadDefaults(
    num_prompts=DatasetConfig.num_prompts, concurrency=LoadConfig.concurrency,
    stream_output=LoadConfig.stream_output, sharegpt_output_len=DatasetConfig.sharegpt_output_len,
)


def load_defaults(backend: str) -> LoadDefaults:
    return LMDEPLOY_DEFAULTS if backend in LMDEPLOY_BACKENDS else CPU_DEFAULTS


@dataclass
class SidebarChoice:
    """What the user set and pressed this rerun."""

    values: dict[str, Any]
    start: bool
    unavailable_reason: str | None


def render_sidebar(cancel: Callable[[], None] | None, actions: bool = True) -> SidebarChoice:
    """Draw the sidebar; `cancel` stops the run on show (None disables the Cancel button). Without
    `actions` there are no Start and Cancel buttons: a page that starts something else has its own."""
    bar = st.sidebar
    buttons = bar.container()  # filled last, shown first: Start needs the backend's availability
    values: dict[str, Any] = {"label": persisted(bar.text_input, "Run label", value="", key="label",
                                                 placeholder="optional")}

    bar.subheader("Model and engine")
    backend = persisted(bar.selectbox, "Backend", options=BACKENDS, index=BACKENDS.index(DEFAULT_BACKEND),
                        key="backend", format_func=_backend_label)
    values["backend"] = backend
    values.update(_server_widgets() if backend == SERVER_BACKEND else _model_widgets())
    reason = availability(backend)
    _show_unavailable_backends()
    values["knobs"] = _knob_widgets(backend)

    bar.subheader("Dataset")
    defaults = load_defaults(backend)
    family = _family(backend)
    values.update(_dataset_widgets(defaults, family))

    bar.subheader("Load")
    values.update(_load_widgets(defaults, family, backend))
    values["generation"] = _generation_widgets()
    values["slo_ms"] = _slo_widgets()
    url_settings.remember()

    start = False
    if actions:
        with buttons:
            left, right = st.columns(2)
            start = left.button("Start", key="start", type="primary", disabled=reason is not None,
                                width="stretch")
            right.button("Cancel", key="cancel", disabled=cancel is None, on_click=cancel, width="stretch")
    return SidebarChoice(values=values, start=start, unavailable_reason=reason)


def slo_from_ms(slo_ms: Mapping[str, float | None]) -> SLO:
    """Thresholds typed in ms as the SLO in seconds; an empty input leaves that threshold unset."""
    return SLO(**{name: None if slo_ms.get(name) is None else slo_ms[name] / 1000 for name in SLO_METRICS})


def build_run_config(values: Mapping[str, Any]) -> RunConfig:
    """The RunConfig for the sidebar's values; validation is left to `check_run_config` (at submit)."""
    sharegpt = values["dataset_name"] == "sharegpt"
    engine = EngineConfig(
        backend=values["backend"],
        model=values["model"].strip(),
        trust_remote_code=values.get("trust_remote_code", False),
        api_key=values.get("api_key") or None,
        **values.get("knobs", {}),
    )
    dataset = DatasetConfig(
        dataset=str(values["dataset"]).strip(),
        dataset_name=values["dataset_name"],
        num_prompts=int(values["num_prompts"]),
        seed=int(values["seed"]),
        sharegpt_output_len=_int_or_none(values.get("sharegpt_output_len")) if sharegpt else None,
        random_input_len=None if sharegpt else _int_or_none(values.get("random_input_len")),
        random_output_len=None if sharegpt else _int_or_none(values.get("random_output_len")),
        random_range_ratio=float(values.get("random_range_ratio", 0.0)),
    )
    load = LoadConfig(
        load_pattern=values["load_pattern"],
        concurrency=int(values["concurrency"]),
        stream_output=bool(values["stream_output"]),
        **values.get("request_rate_load", {}),
    )
    return RunConfig(
        engine=engine,
        dataset=dataset,
        load=load,
        generation=GenerationSettings(**values.get("generation", {})),
        slo=slo_from_ms(values.get("slo_ms", {})),
        label=values.get("label", "").strip(),
    )


def widget_values(config: RunConfig) -> dict[str, Any]:
    """The sidebar's widget values (by key) that rebuild `config`: the inverse of `build_run_config`, used to load
    a past run's settings. An uploaded dataset comes back as the path it was saved to."""
    engine, data, load = config.engine, config.dataset, config.load
    family = _family(engine.backend)
    values: dict[str, Any] = {"label": config.label, "backend": engine.backend,
                              "trust_remote_code": engine.trust_remote_code}
    if engine.backend == SERVER_BACKEND:
        values["server_model"] = engine.model
    elif engine.model in PICKABLE_MODELS:
        values["model_choice"] = engine.model
    else:
        values.update(model_choice=OTHER_MODEL, model_path=engine.model)
    for knob in knobs_for(engine.backend):
        value = getattr(engine, knob.name)
        kind = _FIELD_TYPES[knob.name]
        if knob.choices is None and kind.startswith("float"):
            value = float(value)
        elif knob.choices is None and kind.startswith("str"):
            value = value or ""
        values[f"knob_{knob.name}"] = value
    if data.dataset in BUILTIN_DATASETS:
        values.update(dataset_source=SOURCE_BUILTIN, dataset_builtin=data.dataset)
    else:
        values.update(dataset_source=SOURCE_PATH, dataset_path=data.dataset)
    values.update({"dataset_name": data.dataset_name, f"num_prompts_{family}": data.num_prompts, "seed": data.seed})
    if data.dataset_name == "sharegpt":
        values[f"sharegpt_output_len_{family}"] = data.sharegpt_output_len
    else:
        values.update(random_input_len=data.random_input_len, random_output_len=data.random_output_len,
                      random_range_ratio=float(data.random_range_ratio))
    values.update({_load_pattern_key(engine.backend): load.load_pattern, f"stream_output_{family}": load.stream_output})
    if load.load_pattern == "request_rate":
        values.update(request_rate=None if math.isinf(load.request_rate) else float(load.request_rate),
                      burstiness=float(load.burstiness), exact_rate_arrivals=load.exact_rate_arrivals,
                      max_concurrency=load.max_concurrency,
                      warmup_requests=load.warmup_requests,
                      duration_s=None if load.duration_s is None else float(load.duration_s))
    else:
        values[f"concurrency_{family}"] = load.concurrency
    generation = config.generation
    values.update(gen_ignore_eos=generation.ignore_eos, gen_do_sample=generation.do_sample,
                  gen_temperature=float(generation.temperature), gen_top_p=float(generation.top_p),
                  gen_top_k=generation.top_k)
    values.update({f"slo_{name}_ms": None if getattr(config.slo, name) is None else getattr(config.slo, name) * 1000
                   for name in SLO_METRICS})
    return values


def offer_past_settings(run_id: str, run: Run | None, history: History) -> None:
    """For an ended run: a button that loads its settings into the sidebar. Nothing for an imported row that
    kept no settings, or an unknown run (the run view says so)."""
    try:
        config = run.config if run is not None else history.config(run_id)
    except BenchError:
        return
    st.button("Load these settings into the sidebar", key="load_settings", icon=":material/settings_backup_restore:",
              on_click=url_settings.load, args=(widget_values(config),),
              help="Set every sidebar setting as this run had it, to run it again or change one thing.")


def config_from_values(values: Mapping[str, Any], uploads_dir: Path) -> RunConfig:
    """The sidebar's settings as a RunConfig, an uploaded dataset saved to a file first."""
    values = dict(values)
    upload = values.get("upload")
    if upload is not None:
        values["dataset"] = save_upload(upload.getvalue(), upload.name, uploads_dir)
    if not str(values.get("dataset") or "").strip():
        raise ConfigError("No dataset given: upload a ShareGPT file, type its path, or choose a built-in dataset.")
    return build_run_config(values)


def save_upload(data: bytes, name: str, folder: Path) -> str:
    """Keep an uploaded dataset as a file the runner can read; named by content, so saving twice is free."""
    digest = hashlib.sha256(data).hexdigest()[:16]
    path = Path(folder) / f"{digest}-{Path(name).name}"
    try:
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
    except OSError as exc:
        raise DatasetError(f"Cannot save the uploaded dataset to {path}: {exc.strerror or exc}.") from exc
    return str(path)


# ---- widget groups ---------------------------------------------------------------------------

def _family(backend: str) -> str:
    """Dataset and load widgets have keys per family: switching between LMDeploy and the others resets defaults."""
    return "lmdeploy" if backend in LMDEPLOY_BACKENDS else "cpu"


def _load_pattern_key(backend: str) -> str:
    return "load_pattern_server" if backend == SERVER_BACKEND else "load_pattern"


def _backend_label(backend: str) -> str:
    return backend if availability(backend) is None else f"{backend} (unavailable here)"


def _show_unavailable_backends() -> None:
    """One caption per reason, so the user sees why LMDeploy's engines cannot be chosen here."""
    reasons: dict[str, list[str]] = {}
    for backend in BACKENDS:
        reason = availability(backend)
        if reason:
            reasons.setdefault(reason, []).append(backend)
    for reason, backends in reasons.items():
        st.sidebar.caption(f"**{', '.join(backends)} unavailable:** {reason}")


def model_picker(where: Any, key_prefix: str = "", draw: Callable[..., Any] = persisted) -> str:
    """The model: a built-in one, or a local path or hub id typed in, drawn in `where` (the sidebar, a column)
    with widget keys `key_prefix` + model_choice / model_path; `draw` is `persisted`, or `url_settings.drawn`
    on a page that does not keep its widgets across pages and reloads."""
    options = [*PICKABLE_MODELS, OTHER_MODEL]
    choice = draw(where.selectbox, "Model", options=options, index=options.index(DEFAULT_MODEL),
                  key=f"{key_prefix}model_choice",
                  help="\n\n".join(f"**{name}**: {text}" for name, text in PICKABLE_MODELS.items()))
    if choice != OTHER_MODEL:
        return choice
    return draw(where.text_input, "Model path or hub id", value="", key=f"{key_prefix}model_path",
                placeholder="/models/Qwen2.5-7B-Instruct, Qwen/Qwen2.5-7B-Instruct or synthetic:llama:layers=..",
                help="A folder, a hub id, or a synthetic model of any shape: synthetic:llama (or qwen2):layers=2,"
                     "hidden=64,intermediate=128,heads=4,kv_heads=2,vocab=4096, or a preset with sizes changed, "
                     "e.g. synthetic:llama-3.2-1b:layers=4.")


def _model_widgets() -> dict[str, Any]:
    model = model_picker(st.sidebar)
    trust = persisted(st.sidebar.checkbox, "Trust remote code", value=False, key="trust_remote_code",
                      help="Let the model's own code run (--trust-remote-code).")
    return {"model": model, "trust_remote_code": trust}


_FIELD_TYPES = {f.name: str(f.type) for f in dataclasses.fields(EngineConfig)}


def _server_widgets() -> dict[str, Any]:
    """The model a server is asked for, and its API key: typed here, kept in memory, never stored."""
    bar = st.sidebar
    model = persisted(bar.text_input, "Model (optional)", value="", key="server_model",
                      placeholder="empty: the first of GET /v1/models", help="The model name sent in each request.")
    api_key = bar.text_input("API key (optional)", type="password", key="api_key",
                             placeholder="empty: $OPENAI_API_KEY, if set",
                             help="Sent as a Bearer header; never written to the history, config or logs.")
    trust = persisted(bar.checkbox, "Trust remote code", value=False, key="trust_remote_code",
                      help="Let the tokenizer's own code run.")
    return {"model": model, "api_key": api_key, "trust_remote_code": trust}


def _knob_widgets(backend: str) -> dict[str, Any]:
    """Every knob of `backend`, in LMDeploy's CLI groups, starting at LMDeploy's defaults."""
    groups: dict[str, list[Knob]] = {}
    for knob in knobs_for(backend):
        groups.setdefault(knob.group, []).append(knob)
    chosen: dict[str, Any] = {}
    for group, knobs in groups.items():
        with st.sidebar.expander(group):
            for knob in knobs:
                chosen[knob.name] = _knob_widget(knob)
                if knob.constraint:
                    st.caption(f"Constraint: {knob.constraint}")
    return chosen


def _knob_widget(knob: Knob) -> Any:
    label, key, default, kind = knob.flag, f"knob_{knob.name}", knob.default, _FIELD_TYPES[knob.name]
    if knob.choices is not None:
        return persisted(st.selectbox, label, options=knob.choices, index=knob.choices.index(default), key=key,
                         help=knob.help, format_func=lambda choice: "off" if choice is None else str(choice))
    if isinstance(default, bool):
        return persisted(st.checkbox, label, value=default, key=key, help=knob.help)
    if kind.startswith("int"):
        value = persisted(st.number_input, label, value=default, step=1, key=key, help=knob.help,
                          placeholder="empty: automatic" if default is None else None)
        return None if value is None else int(value)
    if kind.startswith("float"):
        return persisted(st.number_input, label, value=float(default), step=0.05, format="%.2f", key=key,
                         help=knob.help)
    text = persisted(st.text_input, label, value=default or "", key=key, help=knob.help)
    return text.strip() or (None if default is None else default)


def _dataset_widgets(defaults: LoadDefaults, family: str) -> dict[str, Any]:
    bar = st.sidebar
    source_kind = persisted(bar.radio, "Prompts from", options=(SOURCE_BUILTIN, SOURCE_UPLOAD, SOURCE_PATH),
                            horizontal=True, key="dataset_source", help="A ShareGPT JSON or JSONL file; the random "
                            "dataset also draws its token ids from it, as LMDeploy does.")
    values: dict[str, Any] = {"upload": None}
    if source_kind == SOURCE_BUILTIN:
        values["dataset"] = persisted(bar.selectbox, "Built-in dataset", options=BUILTIN_DATASETS, key="dataset_builtin",
                                      format_func=BUILTIN_DATASETS.get)
    elif source_kind == SOURCE_UPLOAD:
        values["upload"] = bar.file_uploader("ShareGPT file", type=["json", "jsonl"], key="dataset_upload")
        values["dataset"] = ""
    else:
        values["dataset"] = persisted(bar.text_input, "ShareGPT file path", value="", key="dataset_path",
                                      placeholder="/data/ShareGPT_V3_unfiltered_cleaned_split.json")
    name = persisted(bar.radio, "Dataset", options=DATASET_NAMES, horizontal=True, key="dataset_name",
                     help="sharegpt: the conversations' own lengths; random: lengths you choose.")
    values["dataset_name"] = name
    if name == "sharegpt":
        values["sharegpt_output_len"] = persisted(
            bar.number_input, "Fixed output length (tokens)", value=defaults.sharegpt_output_len, min_value=1, step=1,
            key=f"sharegpt_output_len_{family}", placeholder="empty: each conversation's own",
            help="--sharegpt-output-len: every request generates this many tokens.")
    else:
        left, right = bar.columns(2)
        values["random_input_len"] = persisted(left.number_input, "Input length", value=RANDOM_LEN, min_value=1,
                                               step=1, key="random_input_len")
        values["random_output_len"] = persisted(right.number_input, "Output length", value=RANDOM_LEN, min_value=1,
                                                step=1, key="random_output_len")
        values["random_range_ratio"] = persisted(bar.slider, "Range ratio", min_value=0.0, max_value=1.0, value=0.0,
                                                 step=0.05, key="random_range_ratio",
                                                 help="Lengths are drawn from [len x ratio, len].")
    values["num_prompts"] = persisted(bar.number_input, "Number of prompts", value=defaults.num_prompts, min_value=1,
                                      step=1, key=f"num_prompts_{family}")
    values["seed"] = persisted(bar.number_input, "Seed", value=0, min_value=0, step=1, key="seed")
    return values


def _load_widgets(defaults: LoadDefaults, family: str, backend: str) -> dict[str, Any]:
    bar = st.sidebar
    server = backend == SERVER_BACKEND
    patterns = LOAD_PATTERNS if server else tuple(p for p in LOAD_PATTERNS if p != "request_rate")
    pattern = persisted(bar.selectbox, "Load pattern", options=patterns,
                        index=patterns.index("request_rate" if server else "batch"),
                        key=_load_pattern_key(backend),  # a default per kind
                        help="\n\n".join(f"**{p}**: {LOAD_PATTERN_HELP[p]}" for p in patterns))
    if pattern == "request_rate":
        return {"load_pattern": pattern, "concurrency": LoadConfig.concurrency, "stream_output": _stream_widget(defaults, family),
                "request_rate_load": _request_rate_widgets()}
    concurrency = persisted(bar.number_input, "Concurrency", value=defaults.concurrency, min_value=1, step=1,
                            key=f"concurrency_{family}",
                            help="Requests in flight at once; LMDeploy's engines take it as max_batch_size.")
    return {"load_pattern": pattern, "concurrency": concurrency, "stream_output": _stream_widget(defaults, family)}


def _stream_widget(defaults: LoadDefaults, family: str) -> bool:
    return persisted(st.sidebar.checkbox, "Stream output", value=defaults.stream_output, key=f"stream_output_{family}",
                     help="Needed for TTFT, ITL and tokens per tick.")


def _request_rate_widgets() -> dict[str, Any]:
    """vLLM's load: arrival rate and shape, a cap on requests in flight, warm-up, and an optional duration."""
    bar = st.sidebar
    rate = persisted(bar.number_input, "Request rate (req/s)", value=None, min_value=0.01, step=1.0, key="request_rate",
                     placeholder="empty: inf, every request at once")
    burstiness = persisted(bar.number_input, "Burstiness", value=1.0, min_value=0.01, step=0.1, key="burstiness",
                           help="Gamma shape of the gaps between requests: 1 is Poisson, below 1 burstier, "
                                "above 1 more regular.")
    exact_rate = persisted(bar.checkbox, "Exact-rate arrivals", value=False, key="exact_rate_arrivals",
                           help="Rescale the drawn gaps so the requests take exactly (N - 1) / rate seconds (vLLM). "
                                "Unchecked: drawn from the seed as LMDeploy's profile_restful_api.py draws them.")
    max_concurrency = persisted(bar.number_input, "Max concurrency (requests)", value=None, min_value=1, step=1,
                                key="max_concurrency", placeholder="empty: no limit")
    warmup = persisted(bar.number_input, "Warm-up requests", value=1, min_value=0, step=1,
                       key="warmup_requests", help="Sent before the measurement starts, not measured.")
    duration = persisted(bar.number_input, "Duration (s)", value=None, min_value=0.1, step=10.0, key="duration_s",
                         placeholder="empty: send every prompt",
                         help="End the run after this long: requests not sent stay unfinished, those in flight are cancelled.")
    return {
        "request_rate": math.inf if rate is None else float(rate),
        "burstiness": float(burstiness),
        "exact_rate_arrivals": bool(exact_rate),
        "max_concurrency": _int_or_none(max_concurrency),
        "warmup_requests": int(warmup),
        "duration_s": None if duration is None else float(duration),
    }


def _generation_widgets() -> dict[str, Any]:
    base = GenerationSettings()
    with st.sidebar.expander("Generation"):
        st.caption("LMDeploy's pipeline script decodes greedily with ignore_eos, whatever the sampling settings say.")
        return {
            "ignore_eos": persisted(st.checkbox, "Ignore EOS", value=base.ignore_eos, key="gen_ignore_eos",
                                    help="Generate exactly the requested number of tokens."),
            "do_sample": persisted(st.checkbox, "Sample", value=base.do_sample, key="gen_do_sample"),
            "temperature": persisted(st.number_input, "Temperature", value=base.temperature, min_value=0.0,
                                     max_value=2.0, step=0.1, key="gen_temperature"),
            "top_p": persisted(st.number_input, "Top p", value=base.top_p, min_value=0.0, max_value=1.0, step=0.05,
                               key="gen_top_p"),
            "top_k": persisted(st.number_input, "Top k", value=base.top_k, min_value=0, step=1, key="gen_top_k"),
        }


def _slo_widgets() -> dict[str, float | None]:
    with st.sidebar.expander("Goodput SLO (ms)", expanded=False):
        st.caption("A request is good when it meets every threshold set. Changing them updates the goodput "
                   "of the run shown, from its stored requests, without running it again.")
        return {name: persisted(st.number_input, f"{name.upper()} at most (ms)", value=None, min_value=0.0, step=10.0,
                                key=f"slo_{name}_ms", placeholder="not set")
                for name in SLO_METRICS}


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)
