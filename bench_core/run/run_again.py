"""A run again with one thing changed, and the presets that show one knob's effect in two runs.

"Run again with one thing changed" takes an ended run's settings, changes one of those that apply to it (its
backend's knobs, its dataset's and load pattern's settings, generation) and starts the result, so that the two runs
compared differ in that setting alone. A preset is the same idea declared as data: a workload that shows a knob's
effect, and the knob's two values; it expands to two runs on the engine the user chose.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..config.catalog import SETTINGS, WARMUP_START, setting
from ..config.run_config import RunConfig, config_from_values
from ..config.settings import Part, Setting, format_value
from ..errors import ConfigError
from ..load import takes
from ..states import LoadPattern

CHANGED_PARTS = (Part.ENGINE, Part.DATASET, Part.LOAD, Part.GENERATION)  # an SLO re-judges a run: it runs nothing
# Another dataset is another workload, under which other settings apply: not one thing changed. So is a quality
# set, whose prompts replace the dataset's.
NOT_CHANGED = frozenset({"dataset_name", "quality_set"})


def applies_to_run(declared: Setting, config: RunConfig) -> bool:
    """Whether `declared` means something for `config`: a knob of its backend, or a setting of its backend, load
    pattern and dataset."""
    if declared.is_knob:
        return declared.applies(backend=config.engine.backend)
    return declared.applies(backend=config.engine.backend, load_pattern=config.load.load_pattern) and takes(
        config.dataset.dataset_name, declared
    )


def changeable_settings(config: RunConfig) -> tuple[Setting, ...]:
    """The settings a run again of `config` may change, in the catalog's order: those the sidebar draws, that apply
    to the run and that a comparison shows (not a secret, not a time limit or a permission)."""
    return tuple(
        declared
        for declared in SETTINGS
        if declared.part in CHANGED_PARTS
        and declared.widget is not None
        and declared.compared
        and not declared.secret
        and declared.name not in NOT_CHANGED
        and applies_to_run(declared, config)
    )


def change_label(name: str, value: Any) -> str:
    """How a run's label names the one thing changed: "enable_prefix_caching=true", as a sweep's point does."""
    return f"{name}={format_value(value)}"


def change_problems(config: RunConfig, name: str, value: Any) -> list[str]:
    """Why `config` cannot run again with `name` set to `value` (empty when it can): the setting does not apply to the
    run, its declaration refuses the value, or the run had that value already."""
    declared = setting(name)
    if declared.name in NOT_CHANGED:
        return [
            f"{declared.title} is more than one thing: another dataset is another workload, with settings of its "
            "own. Load these settings into the sidebar to change it there."
        ]
    if declared not in changeable_settings(config):
        return [f"{declared.title} does not apply to this run: its backend, load pattern or dataset does not use it."]
    if problems := declared.problems(value, config.engine.backend):
        return problems
    if value == config.value(name):
        return [f"The run had {declared.title} = {format_value(value)} already: give another value."]
    return []


def with_change(config: RunConfig, name: str, value: Any) -> RunConfig:
    """`config` with setting `name` set to `value` and labelled with the change; ConfigError saying why it cannot be
    (`change_problems`)."""
    if problems := change_problems(config, name, value):
        raise ConfigError(" ".join(problems))
    changed = copy.deepcopy(config)  # no part shared with the ended run's config
    setattr(changed.part(setting(name).part), name, value)
    tag = change_label(name, value)
    changed.label = f"{config.label} · {tag}" if config.label else tag
    return changed


@dataclass(frozen=True)
class Preset:
    """Two runs that differ in one setting, on a workload that shows its effect. `workload`: the two runs' other
    settings by name (the rest are the catalog's defaults, the engine the user's); `values`: the setting's value in
    the first run (the baseline), then in the second; `look_at`: what the comparison shows, in a sentence;
    `engine_values`: knobs both runs take where the user's backend has them (the path both runs decode on)."""

    title: str
    setting: str
    values: tuple[Any, Any]
    workload: Mapping[str, Any] = field(default_factory=dict)
    look_at: str = ""
    engine_values: Mapping[str, Any] = field(default_factory=dict)


# Small enough for SmolLM2-135M on a busy 2-core CPU: the prompts are ShareGPT's (the built-in copy), a few dozen
# output tokens, and a warm-up before each run, so the second run's warm engine does not flatter it.
QUICK = {"load_pattern": LoadPattern.CONCURRENCY, "warmup_requests": WARMUP_START}
# The embedded engine's speculation decodes in generate(): a run against it without speculation must decode there too.
SAME_PATH = {"decode_path": "generate"}
PRESETS = (
    Preset(
        "Prefix caching off vs on, multi-turn",
        "enable_prefix_caching",
        (False, True),
        {
            **QUICK,
            "stream_output": True,
            "dataset_name": "multi-turn",
            "num_prompts": 4,
            "turns": 4,
            "sharegpt_output_len": 16,
            "concurrency": 4,
        },
        "Each turn resends the conversation so far: with caching, turns 2 onward reuse its KV cache, so their TTFT "
        "(the TTFT of turn 2, 3 and 4 rows) drops.",
    ),
    Preset(
        "Concurrency 1 vs 8",
        "concurrency",
        (1, 8),
        {**QUICK, "stream_output": True, "num_prompts": 8, "sharegpt_output_len": 32},
        "Eight requests at once share the engine's steps: more output tokens per second, while each request waits "
        "longer for its tokens.",
    ),
    Preset(
        "Streaming off vs on",
        "stream_output",
        (False, True),
        {**QUICK, "num_prompts": 8, "sharegpt_output_len": 32, "concurrency": 8},
        "Streaming sends each token as it comes: TTFT and ITL are measured only then, at a small cost in throughput.",
    ),
    # Both runs through generate(), one request at a time (SAME_PATH): the embedded engine drafts only there, so the
    # run without speculation decodes on the same path and the pair differs in the drafting alone.
    Preset(
        "Speculation off vs on (prompt lookup)",
        "speculative_algorithm",
        (None, "prompt_lookup"),
        {**QUICK, "stream_output": True, "num_prompts": 8, "sharegpt_output_len": 32, "concurrency": 1},
        "Prompt lookup drafts the engine's draft tokens per step from the prompt's own text: where they are accepted "
        "(the acceptance by draft position), TPOT drops and output tokens per second rise; the answers stay the "
        "same under greedy decoding.",
        engine_values=SAME_PATH,
    ),
)


def first_offered(settings: tuple[Setting, ...]) -> int:
    """Which of `settings` a run again offers first: the first a preset varies (a knob whose effect shows), else the
    first."""
    varied = {preset.setting for preset in PRESETS}
    return next((number for number, declared in enumerate(settings) if declared.name in varied), 0)


def preset_problem(preset: Preset, backend: str) -> str | None:
    """Why `preset` cannot run on `backend` (its setting is not one of the backend's, or a value it sets is not one
    the backend takes), else None."""
    declared = setting(preset.setting)
    if not declared.applies(backend=backend):
        return declared.not_applicable(backend)
    return next((problem for value in preset.values for problem in declared.problems(value, backend)), None)


def preset_runs(preset: Preset, base: RunConfig) -> tuple[RunConfig, RunConfig]:
    """The preset's two runs on `base`'s engine (its backend, model and knobs), SLO and percentiles: its workload,
    the setting at its first value, then at its second."""
    start = config_from_values(preset.workload, percentiles=base.percentiles)
    start.engine, start.slo = copy.deepcopy(base.engine), copy.deepcopy(base.slo)
    runs = []
    for value in preset.values:
        run = copy.deepcopy(start)
        setattr(run.part(setting(preset.setting).part), preset.setting, value)
        run.label = change_label(preset.setting, value)
        runs.append(run)
    first, second = (_with_engine_values(run, preset.engine_values) for run in runs)
    return first, second


def speculation_pair(config: RunConfig) -> tuple[RunConfig, RunConfig]:
    """`config` without speculation, then `config`: the same prompts, seed and knobs on the same decode path (the
    embedded engine's generate(), where its speculation runs), so the pair differs in the drafting alone. Labelled as
    a preset's runs are, unless `config` has a label."""
    if not config.engine.speculative_algorithm:
        raise ConfigError(
            "A run against no speculation needs speculation to set against: give --speculative-algorithm."
        )
    off, on = without_speculation(copy.deepcopy(config)), copy.deepcopy(config)
    for run in (off, on):
        run.label = run.label or change_label("speculative_algorithm", run.engine.speculative_algorithm)
    return _with_engine_values(off, SAME_PATH), _with_engine_values(on, SAME_PATH)


def without_speculation(config: RunConfig) -> RunConfig:
    """`config` decoding without speculation: no method, and no draft model either (LMDeploy's engines refuse one
    without a method)."""
    config.engine.speculative_algorithm = None
    config.engine.speculative_draft_model = None
    return config


def _with_engine_values(config: RunConfig, values: Mapping[str, Any]) -> RunConfig:
    for name, value in values.items():
        if setting(name).applies(backend=config.engine.backend):
            setattr(config.engine, name, value)
    return config
