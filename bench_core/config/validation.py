"""The checks every run passes before any work: each setting's own bounds and choices (from its declaration),
and the rules that join several settings. Each problem is a sentence for the user.

The backend's own rules (LMDeploy's, the server's) live with the backend; what the checks here need to know of
the backend (is the name known, does it need a model, which load patterns it takes) the engines registry hands
in as `BackendRules`, since this package imports no engine.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from ..models.synthetic import synthetic_name_problems
from ..states import LoadPattern
from .catalog import (
    CUSTOM,
    DAY_S,
    GENERATION,
    IMAGE,
    KNOBS,
    LONG_SCHEDULE_S,
    MAX_SCHEDULE_S,
    MULTI_TURN,
    TRACE_DATASET,
    image_size,
    of_part,
    setting,
)
from .run_config import EngineConfig, GenerationSettings, RunConfig, client_in_workers
from .settings import MAX_WHOLE_NUMBER, Bounds, Part

# The datasets that read the user's own file, and what it holds.
FILE_DATASETS = {TRACE_DATASET: "a Mooncake JSONL trace", CUSTOM: "JSON or JSONL records with a prompt or messages"}


@dataclass(frozen=True)
class BackendRules:
    """What the generic checks need to know of the run's backend."""

    known: tuple[str, ...]  # every backend's name
    needs_model: bool = True  # a server names its own model
    load_patterns: tuple[str, ...] = ()  # the patterns it can offer requests in; empty: any


def inapplicable_knob_problems(engine: EngineConfig) -> list[str]:
    """One sentence per knob set away from its default although the backend does not use it."""
    return [
        knob.not_applicable(engine.backend)
        for knob in KNOBS
        if not knob.applies(backend=engine.backend) and getattr(engine, knob.name) != knob.default
    ]


def ignored_load_settings(load, given: frozenset[str]) -> list[str]:
    """One sentence per load setting given (its flag typed, not a default) that the run's load pattern ignores."""
    return [
        f"{declared.cli_flag} does nothing under the {pattern_label(load.load_pattern)} load pattern: "
        f"{applies_under(declared)}"
        for declared in of_part(Part.LOAD)
        if declared.name in given and not declared.applies(load_pattern=load.load_pattern)
    ]


def pattern_label(pattern: str) -> str:
    return setting("load_pattern").choice_label(pattern)


def applies_under(declared) -> str:
    """Where a load setting means something: "it applies under request rate only." """
    return f"it applies under {' or '.join(map(pattern_label, declared.load_patterns))} only."


def check_values(**values: Any) -> None:
    """ConfigError naming each of these settings' values (by name) outside its declared bounds or choices: for code
    that takes a setting's value directly, not in a checked RunConfig."""
    problems = [problem for name, value in values.items() for problem in setting(name).problems(value)]
    if problems:
        raise ConfigError(" ".join(problems))


def setting_problems(values: Any, part: Part, backend: str, dataset_name: str | None = None) -> list[str]:
    """The bounds and choices of the settings of `part` (its dataclass `values`) that apply to this backend and
    dataset, each as its declaration words it."""
    return [
        problem
        for setting in of_part(part)
        if setting.applies(backend=backend, dataset_name=dataset_name)
        for problem in setting.problems(getattr(values, setting.name), backend)
    ]


def validate_run_config(config: RunConfig, backend: BackendRules | None = None) -> list[str]:
    """Problems of the run's settings but the engine's own (see `setting_problems`), each a sentence for the user;
    empty when the run may start. `backend`: what the registry knows of the run's backend (None: not checked)."""
    problems: list[str] = []
    eng, data, load = config.engine, config.dataset, config.load
    if backend is not None and eng.backend not in backend.known:
        problems.append(f"Unknown backend '{eng.backend}'; choose one of {', '.join(backend.known)}.")
    else:
        problems.extend(inapplicable_knob_problems(eng))
    if not str(eng.model).strip() and (backend is None or backend.needs_model):
        problems.append("No model given: pass a local path, a hub id or a built-in model such as builtin:tiny-llama.")
    problems.extend(synthetic_name_problems(str(eng.model)))
    problems.extend(_dataset_problems(config))
    for part in (Part.DATASET, Part.LOAD, Part.SLO):  # the engine's: with its backend's rules (engines)
        problems.extend(setting_problems(config.part(part), part, eng.backend, data.dataset_name))
    problems.extend(
        declared.not_applicable(eng.backend)
        for declared in of_part(Part.LOAD)
        if not declared.applies(backend=eng.backend) and getattr(load, declared.name) != declared.default
    )
    # Checked only where the client sends from worker processes: num_prompts has its own bounds.
    if client_in_workers(load.client_processes) and load.client_processes > data.num_prompts:
        problems.append(
            f"{setting('client_processes').cli_flag} {load.client_processes} is more processes than the "
            f"{data.num_prompts} prompts to send: use at most {data.num_prompts}."
        )
    if backend is not None and backend.load_patterns and load.load_pattern not in backend.load_patterns:
        problems.append(_pattern_refused(load.load_pattern, eng.backend, backend.load_patterns))
    problems.extend(rate_schedule_problems(config))
    problems.extend(generation_problems(config.generation))
    if not config.percentiles or any(not 0 <= p <= 100 for p in config.percentiles):
        problems.append("Percentiles must be numbers between 0 and 100.")
    return problems


def _dataset_problems(config: RunConfig) -> list[str]:
    """What the datasets ask of their settings: none set for another dataset, the lengths the random rule draws
    from, a file for the datasets that read one, a trace for the trace load pattern."""
    data, name = config.dataset, config.dataset.dataset_name
    problems = [
        f"{declared.cli_flag} applies to the {_names(declared.datasets)} dataset"
        f"{'s' if len(declared.datasets) > 1 else ''} only."
        for declared in of_part(Part.DATASET)
        if declared.datasets
        and not declared.applies(dataset_name=name)
        and not (data.quality_set and declared.name == "output_len")  # a quality set's prompts' length, any dataset
        and getattr(data, declared.name) != declared.default
    ]
    lengths = setting("random_input_len")
    if lengths.applies(dataset_name=name) and (data.random_input_len is None or data.random_output_len is None):
        problems.append(f"The {name} dataset needs both --random-input-len and --random-output-len.")
    if name in FILE_DATASETS and str(data.dataset).startswith("builtin:"):
        problems.append(
            f"The {name} dataset reads your own file ({FILE_DATASETS[name]}): pass its path as the "
            f"dataset, not {data.dataset}."
        )
    if name == IMAGE:
        try:
            image_size(data.image_resolution)
        except ValueError as exc:
            problems.append(str(exc))
    if config.load.load_pattern == LoadPattern.TRACE and name != TRACE_DATASET:
        problems.append(
            "The trace load pattern sends each request at its trace timestamp: choose the trace dataset "
            "(--dataset-name trace)."
        )
    if config.load.load_pattern == LoadPattern.ENGINE_API and name in (MULTI_TURN, TRACE_DATASET):
        problems.append(
            f"The engine API load pattern (throughput) sends a request whenever a worker is free, as "
            f"profile_throughput.py does, so it cannot wait for a turn's answer or a trace's timestamps: "
            f"run the {name} dataset with pipeline or restful."
        )
    return problems


def rate_schedule_problems(config: RunConfig) -> list[str]:
    """Arrivals at a request rate over many prompts that would take longer than a day to send (see
    schedule_problems): (N - 1) / rate on average, cut short by a duration."""
    load, prompts = config.load, config.dataset.num_prompts
    if load.load_pattern != LoadPattern.REQUEST_RATE or not 0 < load.request_rate < math.inf or prompts < 2:
        return []
    span_s = (prompts - 1) / load.request_rate
    if load.duration_s is not None and load.duration_s < span_s:
        return []
    return schedule_problems(span_s, load.allow_long_schedule, f"{prompts:,} prompts at {load.request_rate:g} req/s")


def schedule_problems(span_s: float, allowed: bool, what: str) -> list[str]:
    """A schedule that sends its last request `span_s` after the start: refused beyond MAX_SCHEDULE_S, and beyond
    LONG_SCHEDULE_S unless confirmed (`allowed`). `what` names the schedule."""
    declared = setting("allow_long_schedule")
    if not span_s <= MAX_SCHEDULE_S:
        return [
            f"{what} would send the last request {span_words(span_s)} after the start: no run may take longer than "
            f"{span_words(MAX_SCHEDULE_S)}."
        ]
    if span_s > LONG_SCHEDULE_S and not allowed:
        return [
            f"{what} would send the last request {span_words(span_s)} after the start, more than a day: confirm it "
            f"with {declared.cli_flag} (on the dashboard: '{declared.widget_label}')."
        ]
    return []


def span_words(seconds: float) -> str:
    """A long time in words: "3.5 hours", "11.6 days", "50.7 years"."""
    for unit, size in (("years", 365.25 * DAY_S), ("days", DAY_S), ("hours", 3600.0)):
        if seconds >= size:
            return f"{seconds / size:,.1f} {unit}".replace(".0 ", " ")
    return f"{seconds:,.0f} s"


def _names(names: tuple[str, ...]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _pattern_refused(pattern: str, backend: str, patterns: tuple[str, ...]) -> str:
    return f"The {pattern} load pattern is not offered by the {backend} backend; choose {' or '.join(patterns)}."


# Request-body fields no engine can generate with, beyond the run's own sampling settings (GENERATION), with
# the ranges LMDeploy's GenerationConfig asserts and OpenAI's API documents.
_BODY_LIMITS = (
    ("min_p", Bounds(low=0, high=1), False),
    ("repetition_penalty", Bounds(low=0, low_open=True), False),
    ("max_tokens", Bounds(low=1, high=MAX_WHOLE_NUMBER), True),
    ("max_completion_tokens", Bounds(low=1, high=MAX_WHOLE_NUMBER), True),
    ("max_new_tokens", Bounds(low=1, high=MAX_WHOLE_NUMBER), True),
)
_SAMPLING_LIMITS = (
    *((setting.name, setting.limits, setting.kind is int) for setting in GENERATION if setting.numeric),
    *_BODY_LIMITS,
)


def sampling_problems(values: dict[str, Any], where: str = "") -> list[str]:
    """One sentence per sampling setting among `values` (by name) outside the range any engine accepts."""
    problems = []
    for name, bounds, whole in _SAMPLING_LIMITS:
        if name not in values:
            continue
        value = values[name]
        number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan
        if math.isnan(number) or not bounds.hold(number):
            problems.append(f"{where}{name} must be {bounds.words(whole)} (got {value!r}).")
    return problems


def generation_problems(generation: GenerationSettings) -> list[str]:
    """The run's sampling settings that cannot be right: outside LMDeploy's ranges (asserted whatever
    do_sample says), or sampling with nothing to sample from."""
    problems = sampling_problems(dataclasses.asdict(generation))
    if generation.do_sample and generation.temperature == 0:
        problems.append("Sampling needs a temperature above 0 (turn sampling off for greedy decoding).")
    if generation.do_sample and generation.top_p == 0:
        problems.append("Sampling needs a top_p above 0 (turn sampling off for greedy decoding).")
    return problems
