"""The model's context window, read without loading the model, and the checks that keep requests inside it."""

import json
from pathlib import Path

import pytest

from bench_core.config import DatasetConfig, EngineConfig, RunConfig
from bench_core.engines import context_window
from bench_core.errors import ConfigError, DatasetError
from bench_core.load.datasets import SampledRequest
from bench_core.models.resolve import BUILTIN_CONTEXT_WINDOWS, builtin_is_built, resolve_model
from bench_core.models.window import window_of
from bench_core.run import preflight


def test_the_known_window_of_a_built_in_is_the_one_its_config_declares(tiny_model_path):
    for name, window in BUILTIN_CONTEXT_WINDOWS.items():
        if not builtin_is_built(name):
            continue  # SmolLM2 is converted only where a test or a user asked for it
        config = json.loads((Path(resolve_model(name)) / "config.json").read_text())
        assert window_of(config) == window, name
    assert builtin_is_built("builtin:tiny-llama")


def test_a_folders_window_is_read_from_its_config_and_lmdeploys_session_len_wins(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"max_position_embeddings": 4096}}))
    assert context_window(EngineConfig(backend="transformers", model=str(tmp_path))) == 4096
    assert context_window(EngineConfig(backend="turbomind", model=str(tmp_path), session_len=1024)) == 1024
    assert context_window(EngineConfig(backend="openai", model=str(tmp_path))) is None
    assert context_window(EngineConfig(backend="transformers", model=str(tmp_path / "none"))) is None


def random_run(model: str, input_len: int, output_len: int, backend: str = "transformers") -> RunConfig:
    base_url = "http://127.0.0.1:9" if backend == "openai" else ""  # checked, never reached
    return RunConfig(
        engine=EngineConfig(backend=backend, model=model, base_url=base_url),
        dataset=DatasetConfig(
            dataset="builtin:sample",
            dataset_name="random",
            num_prompts=2,
            random_input_len=input_len,
            random_output_len=output_len,
        ),
    )


def test_lengths_beyond_the_window_are_refused_and_absurd_ones_everywhere():
    preflight.check_run(random_run("builtin:tiny-llama", 48, 2000))  # 2,048 exactly: fits
    with pytest.raises(ConfigError, match="input 49 \\+ output 2,000 tokens does not fit the 2,048-token") as refused:
        preflight.check_run(random_run("builtin:tiny-llama", 49, 2000))
    assert str(refused.value).endswith("lower the output length to 1,999 at most.")
    # An input that fills the window alone: no output length fits, so the remedy is the input's.
    with pytest.raises(ConfigError, match="input 2,048 \\+ output 1 tokens does not fit") as refused:
        preflight.check_run(random_run("builtin:tiny-llama", 2048, 1))
    assert str(refused.value).endswith("lower the input length.")
    preflight.check_run(random_run("", 16, 100_000, backend="openai"))  # the server knows its window
    with pytest.raises(ConfigError, match="2,000,000 tokens is more than any model"):
        preflight.check_run(random_run("", 16, 2_000_000, backend="openai"))


@pytest.mark.parametrize(
    ("dataset_name", "field"), [("shared-prefix", "output_len"), ("multi-turn", "sharegpt_output_len")]
)
def test_every_datasets_own_output_length_is_held_to_the_window(dataset_name, field):
    config = RunConfig(
        engine=EngineConfig(backend="transformers", model="builtin:tiny-llama"),
        dataset=DatasetConfig(dataset_name=dataset_name, **{field: 4000}),
    )
    with pytest.raises(ConfigError, match="an output of 4,000 tokens plus its prompt does not fit the 2,048-token"):
        preflight.check_run(config)


def test_sampled_requests_beyond_the_window_refuse_the_run_naming_the_longest_and_what_fits():
    engine = EngineConfig(backend="transformers", model="builtin:tiny-llama")
    preflight.check_requests([SampledRequest("p", 48, 2000)], engine)
    with pytest.raises(DatasetError) as refused:
        preflight.check_requests(
            [SampledRequest("p", 48, 2000), SampledRequest("q", 100, 2000), SampledRequest("r", 60, 2000)], engine
        )
    message = str(refused.value)
    assert message.startswith("2 of 3 sampled requests do not fit the 2,048-token context window")
    assert "100 input + 2,000 output tokens" in message and "at most 1,948 tokens" in message
