"""The one check a run passes before it is queued (`preflight.check_run`), asked once per run however it is queued."""

from __future__ import annotations

import pytest
from counted_calls import counted_calls

from bench_core.config import DatasetConfig, EngineConfig, LoadConfig, RunConfig
from bench_core.errors import ConfigError
from bench_core.run import preflight
from bench_core.run.runner import Runner
from bench_core.store.history import History


def server_run(**dataset) -> RunConfig:
    """A run against a port nothing listens on: it is checked and queued, then fails at once without a model."""
    return RunConfig(
        engine=EngineConfig(backend="openai", base_url="http://127.0.0.1:9", model="m"),
        dataset=DatasetConfig(**{"dataset": "builtin:sample", "num_prompts": 2, **dataset}),
        load=LoadConfig(load_pattern="concurrency", concurrency=1),
    )


def test_the_check_says_every_settings_problem_then_the_lengths_in_one_message():
    with pytest.raises(ConfigError) as refused:
        preflight.check_run(server_run(num_prompts=0, sharegpt_output_len=-1))
    assert "--num-prompts" in str(refused.value) and "--sharegpt-output-len" in str(refused.value)
    with pytest.raises(ConfigError, match="2,000,000 tokens is more than any model"):
        preflight.check_run(server_run(sharegpt_output_len=2_000_000))
    assert preflight.check_run(server_run()).config == server_run()


def test_a_missing_dataset_file_and_model_folder_are_said_with_the_settings_problems_before_anything_loads(tmp_path):
    folder = tmp_path / "folder"
    folder.mkdir()
    run = RunConfig(
        engine=EngineConfig(backend="transformers", model=str(tmp_path / "no-model")),
        dataset=DatasetConfig(dataset=str(tmp_path / "none.json"), num_prompts=0),
    )
    with pytest.raises(ConfigError) as refused:
        preflight.check_run(run)
    assert str(refused.value) == (
        f"Dataset {tmp_path / 'none.json'} does not exist: pass a ShareGPT JSON or JSONL file, builtin:sharegpt or "
        "builtin:sample. --num-prompts must be a whole number from 1 to 1,000,000; got 0. "
        f"No model folder at {tmp_path / 'no-model'}: give a folder, a hub id or one of builtin:smollm2-135m, "
        "builtin:tiny-llama."
    )
    run.dataset.dataset, run.dataset.num_prompts, run.engine.model = str(folder), 2, "builtin:tiny-llama"
    with pytest.raises(ConfigError, match=f"^Dataset {folder} is a folder, not a file"):
        preflight.check_run(run)
    # A quality set's prompts replace the dataset's: its source is not read. A server names its own model.
    run.dataset.quality_set = "builtin:quality"
    assert preflight.check_run(run).config == run
    server = server_run()
    server.engine.model = str(tmp_path / "no-model")
    assert preflight.check_run(server).config == server


def test_a_submitted_run_is_checked_once_and_a_checked_one_is_not_checked_again(tmp_path):
    runner = Runner(History(tmp_path))
    try:
        with counted_calls(preflight.check_run) as checks:
            first = runner.submit(server_run())
        assert len(checks) == 1
        checked = preflight.check_run(server_run())
        with counted_calls(preflight.check_run) as checks:
            second = runner.submit(checked)
        assert checks == [] and second.config is checked.config
        with pytest.raises(ConfigError):
            runner.submit(server_run(num_prompts=0))
        assert [run.run_id for run in runner.runs()] == [first.run_id, second.run_id]
        assert first.wait(60) and second.wait(60)
    finally:
        runner.shutdown()
