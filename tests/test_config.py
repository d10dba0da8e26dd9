"""RunConfig: knobs that do not apply to the chosen backend are refused and never recorded, and whole numbers beyond
what a history column holds are refused naming their flag and range."""

import pytest

from bench_core.config import SETTINGS, DatasetConfig, EngineConfig, RunConfig, sampling_problems, validate_run_config
from bench_core.engines import check_run_config
from bench_core.errors import ConfigError


def transformers_config(**knobs) -> RunConfig:
    return RunConfig(engine=EngineConfig(backend="transformers", model="builtin:tiny-llama", **knobs))


LMDEPLOY_ONLY = "applies to the turbomind and pytorch backends only, not to transformers."


@pytest.mark.parametrize(
    "knobs, message",
    [
        ({"cache_max_entry_count": 2.0}, f"--cache-max-entry-count {LMDEPLOY_ONLY}"),
        ({"cache_max_entry_count": -1.0}, f"--cache-max-entry-count {LMDEPLOY_ONLY}"),
        ({"session_len": 0}, f"--session-len {LMDEPLOY_ONLY}"),
        ({"device": "ascend"}, "--device applies to the pytorch backend only, not to transformers."),
        ({"communicator": "native"}, "--communicator applies to the turbomind backend only, not to transformers."),
    ],
)
def test_an_lmdeploy_knob_given_to_the_transformers_backend_is_a_config_error(knobs, message):
    assert message in validate_run_config(transformers_config(**knobs))
    with pytest.raises(ConfigError, match=message.split()[0]):
        check_run_config(transformers_config(**knobs))


def test_knobs_of_the_backend_and_untouched_knobs_of_others_pass():
    assert validate_run_config(transformers_config(max_batch_tokens=256, cache_block_seq_len=32)) == []


def test_the_flat_record_of_a_cpu_run_leaves_other_backends_knobs_empty():
    flat = transformers_config(dtype="float32").to_flat_dict()
    for name in ("device", "communicator", "cache_max_entry_count", "session_len", "tp", "quant_policy", "base_url"):
        assert flat[name] is None, name
    assert (flat["dtype"], flat["max_batch_tokens"], flat["cache_block_seq_len"]) == ("float32", 1024, 64)
    assert RunConfig.from_flat_dict(flat) == transformers_config(dtype="float32")


def test_an_old_row_that_recorded_lmdeploy_knobs_for_a_cpu_run_reads_back_valid():
    old_row = {
        **transformers_config().to_flat_dict(),
        "device": "cuda",
        "communicator": "nccl",
        "cache_max_entry_count": "2.0",
        "session_len": "0",
    }
    config = RunConfig.from_flat_dict(old_row)
    assert config == transformers_config()
    assert validate_run_config(config) == []


WHOLE_NUMBER_SETTINGS = [declared for declared in SETTINGS if declared.kind is int and declared.choices is None]


@pytest.mark.parametrize("declared", WHOLE_NUMBER_SETTINGS, ids=lambda declared: declared.name)
def test_every_whole_number_setting_refuses_one_beyond_what_a_history_column_holds(declared):
    (problem,) = declared.problems(10**30)
    highest = int(declared.limits.high)
    assert str(highest) in problem.replace(",", "") and "\n" not in problem
    assert declared.problems(highest) == []


@pytest.mark.parametrize(
    "dataset, message",
    [
        (
            DatasetConfig(num_prompts=10**30),
            f"--num-prompts must be a whole number from 1 to 1,000,000; got {10**30:,}.",
        ),
        (
            DatasetConfig(dataset_name="random", random_input_len=8, random_output_len=2**31),
            f"--random-output-len must be a whole number from 1 to 16,777,216; got {2**31:,}.",
        ),
    ],
    ids=["--num-prompts", "--random-output-len"],
)
def test_a_count_beyond_what_a_history_column_holds_is_refused_naming_its_flag_and_range(dataset, message):
    config = RunConfig(engine=EngineConfig(backend="transformers", model="builtin:tiny-llama"), dataset=dataset)
    assert validate_run_config(config) == [message]


def test_a_token_budget_beyond_what_a_history_column_holds_is_refused_in_the_sampling_settings_and_the_body():
    assert sampling_problems({"top_k": 10**30, "max_tokens": 2**31}, "In the extra request body, ") == [
        f"In the extra request body, top_k must be a whole number from 0 to 2,147,483,647 (got {10**30}).",
        f"In the extra request body, max_tokens must be a whole number from 1 to 2,147,483,647 (got {2**31}).",
    ]
    assert sampling_problems({"max_tokens": 2**31 - 1}) == []
