"""RunConfig: knobs that do not apply to the chosen backend are refused and never recorded."""

import pytest

from bench_core.config import EngineConfig, RunConfig, validate_run_config
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
