"""The checks every run passes before any work: each setting's own bounds and choices (from its declaration),
and the rules that join several settings. Each problem is a sentence for the user.

The backend's own rules (LMDeploy's, the server's) live with the backend; what the checks here need to know of
the backend (is the name known, does it need a model, which load patterns it takes) the engines registry hands
in as `BackendRules`, since this package imports no engine. Likewise the dataset's rules live with the dataset,
and the datasets registry (load) hands in what they refuse and which settings the dataset takes as `DatasetRules`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from ..models.synthetic import synthetic_name_problems
from ..states import LoadPattern
from .catalog import (
    DAY_S,
    GENERATION,
    KNOBS,
    LONG_SCHEDULE_S,
    MAX_SCHEDULE_S,
    of_part,
    setting,
)
from .run_config import EngineConfig, GenerationSettings, RunConfig, client_in_workers
from .settings import MAX_WHOLE_NUMBER, Bounds, Part, Setting


@dataclass(frozen=True)
class BackendRules:
    """What the generic checks need to know of the run's backend."""

    known: tuple[str, ...]  # every backend's name
    needs_model: bool = True  # a server names its own model
    load_patterns: tuple[str, ...] = ()  # the patterns it can offer requests in; empty: any
    takes_images: bool = False  # in the requests it sends (a vision model's)
    in_process: bool = True  # its engine runs here, not behind a server's endpoint


def _takes_any(declared: Setting) -> bool:
    return True


@dataclass(frozen=True)
class DatasetRules:
    """What the generic checks need to know of the run's dataset."""

    problems: tuple[str, ...] = ()  # what the dataset (and the registry) refuse in the run's settings
    takes: Callable[[Setting], bool] = _takes_any  # the settings that mean something for it, whose bounds are checked


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


def setting_problems(values: Any, part: Part, backend: str, takes: Callable[[Setting], bool] = _takes_any) -> list[str]:
    """The bounds and choices of the settings of `part` (its dataclass `values`) that apply to this backend and that
    the dataset `takes`, each as its declaration words it."""
    return [
        problem
        for setting in of_part(part)
        if setting.applies(backend=backend) and takes(setting)
        for problem in setting.problems(getattr(values, setting.name), backend)
    ]


def validate_run_config(
    config: RunConfig, backend: BackendRules | None = None, dataset: DatasetRules | None = None
) -> list[str]:
    """Problems of the run's settings but the engine's own (see `setting_problems`), each a sentence for the user;
    empty when the run may start. `backend`, `dataset`: what the registries know of the run's backend and dataset
    (None: not checked; every dataset setting's bounds are)."""
    dataset = dataset or DatasetRules()
    problems: list[str] = []
    eng, data, load = config.engine, config.dataset, config.load
    if backend is not None and eng.backend not in backend.known:
        problems.append(f"Unknown backend '{eng.backend}'; choose one of {', '.join(backend.known)}.")
    else:
        problems.extend(inapplicable_knob_problems(eng))
    if not str(eng.model).strip() and (backend is None or backend.needs_model):
        problems.append("No model given: pass a local path, a hub id or a built-in model such as builtin:tiny-llama.")
    problems.extend(synthetic_name_problems(str(eng.model)))
    problems.extend(dataset.problems)
    for part in (Part.DATASET, Part.LOAD, Part.SLO):  # the engine's: with its backend's rules (engines)
        problems.extend(setting_problems(config.part(part), part, eng.backend, dataset.takes))
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
