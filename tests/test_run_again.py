"""A run again with one thing changed and the presets, as pure functions: which settings a run may change, the run
that a change makes, what a preset expands to, and when runs started to compare open compared."""

import re

import pytest

from bench_core.config import RunConfig, config_from_values, settings_of
from bench_core.engines import run_config_problems
from bench_core.errors import ConfigError
from bench_core.run.run_again import (
    PRESETS,
    change_problems,
    changeable_settings,
    first_offered,
    preset_problem,
    preset_runs,
    speculation_pair,
    with_change,
)
from bench_core.sweep.plan import change_sweep
from bench_core.sweep.precision import Precision
from dashboard.run_again_view import comparison_due

MULTI_TURN = config_from_values({"dataset_name": "multi-turn", "num_prompts": 4, "load_pattern": "batch"}, label="chat")


def changed(before: RunConfig, after: RunConfig) -> dict:
    old = settings_of(before)
    return {name: value for name, value in settings_of(after).items() if value != old[name]}


def test_a_run_may_change_the_settings_that_apply_to_its_backend_dataset_and_load_pattern_only():
    names = [declared.name for declared in changeable_settings(MULTI_TURN)]
    assert {
        "enable_prefix_caching",
        "max_batch_tokens",
        "turns",
        "think_time_s",
        "concurrency",
        "stream_output",
    } <= set(names)
    # LMDeploy's knobs, a server's, another dataset's, another load pattern's, the dataset itself, an SLO, a secret.
    assert not {
        "cache_max_entry_count",
        "base_url",
        "random_input_len",
        "prefix_len",
        "request_rate",
        "dataset_name",
        "slo_ttft_s",
        "ttft",
        "api_key",
    } & set(names)
    server = config_from_values({"backend": "openai", "base_url": "http://127.0.0.1:1", "load_pattern": "request_rate"})
    server_names = [declared.name for declared in changeable_settings(server)]
    assert {"request_rate", "max_concurrency", "client_processes"} <= set(server_names)
    assert not {"enable_prefix_caching", "concurrency", "duration_s"} & set(server_names)


def test_the_knob_a_preset_shows_is_offered_first():
    settings = changeable_settings(MULTI_TURN)
    assert settings[first_offered(settings)].name == "enable_prefix_caching"


def test_a_run_again_changes_one_setting_and_names_it_in_its_label_leaving_the_ended_run_as_it_was():
    again = with_change(MULTI_TURN, "enable_prefix_caching", True)
    assert changed(MULTI_TURN, again) == {"enable_prefix_caching": True}
    assert again.label == "chat · enable_prefix_caching=true"
    assert MULTI_TURN.engine.enable_prefix_caching is False and MULTI_TURN.label == "chat"
    unlabelled = config_from_values({"num_prompts": 4})
    assert with_change(unlabelled, "concurrency", 2).label == "concurrency=2"


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("concurrency", 0, "--concurrency must be a whole number from 1 to 1,000,000; got 0."),
        ("turns", 4, "The run had Turns per session (turns) = 4 already: give another value."),
        ("request_rate", 2.0, "Request rate (req/s) does not apply to this run: its backend, load pattern or dataset"),
        ("dataset_name", "random", "Dataset name is more than one thing: another dataset is another workload"),
    ],
)
def test_a_change_the_run_cannot_take_is_refused_in_one_sentence(name, value, message):
    (problem,) = change_problems(MULTI_TURN, name, value)
    assert problem.startswith(message)
    with pytest.raises(ConfigError, match="^" + re.escape(message)):
        with_change(MULTI_TURN, name, value)


@pytest.mark.parametrize("preset", PRESETS, ids=lambda preset: preset.title)
def test_a_preset_is_two_small_runs_on_the_users_engine_that_differ_in_its_setting_alone(preset):
    base = config_from_values(
        {"model": "builtin:tiny-llama", "max_batch_tokens": 512, "num_prompts": 5000, "ttft": 2.0}, label="mine"
    )
    first, second = preset_runs(preset, base)
    assert changed(first, second) == {preset.setting: preset.values[1]}
    assert first.value(preset.setting) == preset.values[0]
    assert preset.setting not in preset.workload
    # The user's engine and SLO; the preset's workload, small enough for a CPU; each run labelled with its value.
    assert first.engine.model == "builtin:tiny-llama" and first.engine.max_batch_tokens == 512
    assert first.slo.ttft == 2.0
    assert first.dataset.num_prompts <= 8
    assert {name: first.value(name) for name in preset.workload} == dict(preset.workload)
    assert [first.label, second.label] == [f"{preset.setting}={value}".lower() for value in preset.values]
    assert run_config_problems(first) == run_config_problems(second) == []
    assert preset_problem(preset, "transformers") is None


def test_a_preset_whose_knob_the_backend_lacks_says_so():
    (caching,) = [preset for preset in PRESETS if preset.setting == "enable_prefix_caching"]
    assert preset_problem(caching, "openai") == (
        "--enable-prefix-caching applies to the turbomind, pytorch and transformers backends only, not to openai."
    )


def test_runs_started_to_compare_open_once_the_last_of_them_is_on_show_and_every_one_has_ended():
    groups = [["base", "again"], ["first", "second"]]
    ended = {"base", "again", "first"}
    assert comparison_due(groups, "again", ended.__contains__) == ["base", "again"]
    assert comparison_due(groups, "base", ended.__contains__) is None  # the baseline on show: not the last started
    assert comparison_due(groups, "second", ended.__contains__) is None  # still running
    assert comparison_due(groups, "second", {"first", "second"}.__contains__) == ["first", "second"]
    assert comparison_due(groups, "other", lambda run_id: True) is None


def test_a_run_again_until_a_target_is_a_sweep_of_the_runs_value_and_the_new_one():
    ended = config_from_values({"backend": "transformers", "concurrency": 4}, label="ended")
    plan = change_sweep(ended, "concurrency", 8, Precision(0.05, max_repeats=6))
    assert plan.base == ended and plan.precision == Precision(0.05, max_repeats=6)
    assert [(axis.name, axis.values) for axis in plan.axes] == [("concurrency", (4, 8))]
    assert plan.config_at({"concurrency": 8}, 3).label == "ended · concurrency=8 · repeat 4 (at most 6)"
    with pytest.raises(ConfigError, match=re.escape("Temperature is run again once, not until a target")):
        change_sweep(ended, "temperature", 0.5, Precision(0.05))
    with pytest.raises(ConfigError, match=re.escape("The run had Concurrency (requests) = 4 already")):
        change_sweep(ended, "concurrency", 4, Precision(0.05))


def test_a_preset_whose_value_the_backend_does_not_take_says_so():
    (speculation,) = [preset for preset in PRESETS if preset.setting == "speculative_algorithm"]
    assert preset_problem(speculation, "pytorch") == (
        "--speculative-algorithm must be one of eagle, eagle3, deepseek_mtp, hy3_mtp, qwen3_5_mtp; got 'prompt_lookup'."
    )


def test_speculation_is_set_against_its_own_decode_path_without_drafting():
    (speculation,) = [preset for preset in PRESETS if preset.setting == "speculative_algorithm"]
    off, on = preset_runs(speculation, config_from_values({"backend": "transformers"}))
    assert (off.engine.speculative_algorithm, on.engine.speculative_algorithm) == (None, "prompt_lookup")
    assert off.engine.decode_path == on.engine.decode_path == "generate"
    paired = speculation_pair(config_from_values({"backend": "transformers", "speculative_algorithm": "prompt_lookup"}))
    assert [(run.engine.speculative_algorithm, run.engine.decode_path) for run in paired] == [
        (None, "generate"),
        ("prompt_lookup", "generate"),
    ]
    assert [run.label for run in paired] == ["speculative_algorithm=none", "speculative_algorithm=prompt_lookup"]
    # LMDeploy's engines have one path: only the drafting changes, and the run without it loads no draft model
    # (LMDeploy's engines refuse a draft model without a method).
    eagle = {"backend": "pytorch", "speculative_algorithm": "eagle", "speculative_draft_model": "/models/draft"}
    lmdeploy = speculation_pair(config_from_values(eagle))
    assert [(run.engine.speculative_algorithm, run.engine.speculative_draft_model) for run in lmdeploy] == [
        (None, None),
        ("eagle", "/models/draft"),
    ]
    assert all(run.engine.decode_path == "auto" for run in lmdeploy)
    assert [run_config_problems(run) for run in lmdeploy] == [[], []]
