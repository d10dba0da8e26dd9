"""What differs between runs: settings read back from a real History, knobs that do not apply, imported rows,
the setting a chart goes across by default, repeats and the output length a run asked for."""

from __future__ import annotations

import pandas as pd
import pytest
from app_under_test import ROOT
from compared_runs import FIVE, compared_config
from profiled_runs import profiled_run

from bench_core.config import DatasetConfig, EngineConfig, LoadConfig, RunConfig
from bench_core.store.history import History, RunRecord
from bench_core.store.history_import import lmdeploy_hyperparams
from bench_core.views import figures, run_diff

LMDEPLOY_CSV = ROOT / "tests" / "data" / "lmdeploy_csv" / "profile_throughput.csv"
CPU = EngineConfig(backend="transformers", model="builtin:tiny-llama")
RANDOM = DatasetConfig(
    dataset="builtin:sample", dataset_name="random", num_prompts=8, random_input_len=16, random_output_len=8
)


def history_of(
    root, configs: list[RunConfig], run_ids: list[str] | None = None, cache_starts: list[str] | None = None
) -> pd.DataFrame:
    """Record one finished run per config in a real History (measured by a real profiler), each with the prefix
    cache's state at its start where given; its rows."""
    history = History(root)
    run_ids = run_ids or [f"run-{index}" for index in range(len(configs))]
    cache_starts = cache_starts or [""] * len(configs)
    for run_id, config, ttft, cache_start in zip(run_ids, configs, (0.1, 0.2, 0.3, 0.4, 0.5, 0.6), cache_starts):
        prof = profiled_run([ttft, ttft * 2])
        history.record(
            RunRecord(
                run_id=run_id,
                started_at="2026-01-01T00:00:00+00:00",
                status="finished",
                config=config,
                lmdeploy_columns=prof.lmdeploy_csv_row(lmdeploy_hyperparams(config)),
                metrics=prof.summary(),
                requests=prof.request_table(),
                cache_start=cache_start,
            )
        )
    return history.load().set_index("run_id", drop=False).loc[run_ids]


def cpu_run(concurrency: int, label: str = "", **engine) -> RunConfig:
    return RunConfig(
        engine=EngineConfig(**{**vars(CPU), **engine}),
        dataset=RANDOM,
        load=LoadConfig(concurrency=concurrency),
        label=label,
    )


def test_two_cpu_runs_differing_in_concurrency_differ_in_that_alone(tmp_path):
    runs = history_of(tmp_path, [cpu_run(2, "x2"), cpu_run(4, "x4")])
    # GPU-only knobs are empty on both, the measured duration is no setting: concurrency is all.
    assert run_diff.differing_settings(runs) == ["concurrency"]
    table = run_diff.differences(runs, ["concurrency"])
    assert table.to_dict("index") == {"Concurrency (requests)": {"Concurrency 2 (x2)": "2", "Concurrency 4 (x4)": "4"}}
    assert run_diff.default_setting(runs, ["concurrency"]) == "concurrency"


def test_runs_that_started_with_the_prefix_cache_in_different_states_say_so_beside_their_settings(tmp_path):
    runs = history_of(tmp_path, [cpu_run(2, "a"), cpu_run(2, "b"), cpu_run(2, "c")], cache_starts=["cold", "warm", ""])
    assert run_diff.differing_settings(runs) == ["cache_start"]
    table = run_diff.differences(runs, ["cache_start"])
    assert table.loc["Prefix cache at start"].tolist() == ["cold", "warm", "not recorded"]  # "": before it was kept
    alike = history_of(tmp_path / "alike", [cpu_run(2, "a"), cpu_run(4, "b")], cache_starts=["cold", "cold"])
    assert run_diff.differing_settings(alike) == ["concurrency"]


def test_every_kind_of_setting_is_compared(tmp_path):
    changed = RunConfig(
        engine=EngineConfig(**{**vars(CPU), "dtype": "float32", "max_batch_tokens": 512}),
        dataset=DatasetConfig(**{**vars(RANDOM), "random_output_len": 16, "seed": 3}),
        load=LoadConfig(concurrency=2, stream_output=True),
    )
    changed.generation.temperature = 0.5
    changed.slo.ttft = 0.2
    runs = history_of(tmp_path, [cpu_run(2), changed])
    assert run_diff.differing_settings(runs) == [
        "output_length",
        "seed",
        "stream_output",
        "dtype",
        "max_batch_tokens",
        "temperature",
        "slo_ttft_s",
    ]
    table = run_diff.differences(runs, run_diff.differing_settings(runs))
    assert table.loc["Stream output"].tolist() == ["no", "yes"]
    # An SLO left empty sets no threshold: "not set", not "default".
    assert table.loc["SLO on TTFT (s)"].tolist() == ["not set", "0.2"]


def test_knobs_of_another_backend_are_not_applicable_and_never_a_difference(tmp_path):
    turbomind = RunConfig(
        engine=EngineConfig(backend="turbomind", model="builtin:tiny-llama"),
        dataset=RANDOM,
        load=LoadConfig(concurrency=2),
    )
    runs = history_of(tmp_path, [cpu_run(2), turbomind])
    varied = run_diff.differing_settings(runs)
    assert varied == ["backend"]  # TurboMind's cache fraction, transformers' batch tokens: each on one side only
    cells = run_diff.setting_cells(runs, ["cache_max_entry_count", "max_batch_tokens", "dtype"])
    assert cells == {
        "cache_max_entry_count": [run_diff.NOT_APPLICABLE, 0.8],
        "max_batch_tokens": [1024, run_diff.NOT_APPLICABLE],
        "dtype": ["auto", "auto"],
    }


def test_a_knob_left_at_its_empty_default_differs_from_a_set_one(tmp_path):
    gpu = [
        RunConfig(
            engine=EngineConfig(backend="pytorch", model="m", session_len=length, quant_policy=policy),
            dataset=RANDOM,
            load=LoadConfig(concurrency=4),
            label=f"q{policy}",
        )
        for length, policy in ((None, 0), (4096, 8))
    ]
    runs = history_of(tmp_path, gpu)
    assert run_diff.differing_settings(runs) == ["session_len", "quant_policy"]
    table = run_diff.differences(runs, ["session_len", "quant_policy"])
    assert table.loc["Session length (tokens)"].tolist() == [run_diff.DEFAULT, "4096"]


@pytest.mark.slow
def test_dataset_and_load_settings_count_only_where_they_apply(tmp_path):
    sharegpt = RunConfig(
        engine=CPU,
        dataset=DatasetConfig(dataset="builtin:sample", num_prompts=8, sharegpt_output_len=8, random_range_ratio=0.5),
        load=LoadConfig(concurrency=2),
    )
    runs = history_of(tmp_path, [cpu_run(2), sharegpt])
    # The random input length and range ratio mean nothing on ShareGPT prompts; both runs ask for 8 tokens out.
    assert run_diff.differing_settings(runs) == ["dataset_name"]
    assert run_diff.with_output_length(runs)[run_diff.OUTPUT_LENGTH].tolist() == ["8", "8"]


def test_the_output_length_is_one_setting_whichever_dataset_holds_it(tmp_path):
    sharegpt = RunConfig(
        engine=CPU, dataset=DatasetConfig(dataset="builtin:sample", num_prompts=8), load=LoadConfig(concurrency=2)
    )
    longer = RunConfig(
        engine=CPU, dataset=DatasetConfig(**{**vars(RANDOM), "random_output_len": 256}), load=LoadConfig(concurrency=2)
    )
    runs = history_of(tmp_path, [cpu_run(2), sharegpt, longer])
    assert run_diff.differing_settings(runs) == ["dataset_name", "output_length"]
    table = run_diff.differences(runs, ["output_length"])
    assert table.loc["Output length (tokens)"].tolist() == ["8", run_diff.DEFAULT, "256"]


def test_every_dataset_shows_the_output_length_its_own_setting_holds(tmp_path):
    """Shared-prefix runs asked for 128 tokens by default and read "default" (only random and ShareGPT were mapped)."""

    def run(dataset_name: str, **lengths) -> RunConfig:
        data = DatasetConfig(dataset="builtin:sample", dataset_name=dataset_name, num_prompts=8, **lengths)
        return RunConfig(engine=CPU, dataset=data, load=LoadConfig(concurrency=2))

    configs = [
        run("shared-prefix"),
        run("shared-prefix", output_len=32),
        run("multi-turn", sharegpt_output_len=24),
        run("image", random_input_len=16, random_output_len=40),
        run("custom", output_len=12),
        run("trace"),
    ]
    runs = history_of(tmp_path, configs)
    shown = run_diff.with_output_length(runs)[run_diff.OUTPUT_LENGTH].tolist()
    assert shown == ["128", "32", "24", "40", "12", run_diff.NOT_APPLICABLE]  # a trace's records carry their own


def test_what_an_imported_lmdeploy_row_did_not_record_is_unknown_not_different(tmp_path):
    history = History(tmp_path)
    imported = history.import_csv(LMDEPLOY_CSV)
    rows = history.load().set_index("run_id", drop=False).loc[imported]
    # The random lengths apply to the random row alone: one value each, no difference.
    assert run_diff.differing_settings(rows) == ["dataset_name", "num_prompts", "concurrency"]
    assert run_diff.setting_cells(rows, ["model"]) == {"model": [run_diff.NOT_RECORDED] * 2}
    assert run_diff.setting_cells(rows, ["output_length"]) == {"output_length": [run_diff.NOT_RECORDED, 512]}


def test_the_chart_goes_across_the_setting_taking_the_most_values_numbers_first(tmp_path):
    configs = [
        cpu_run(c, dtype=dtype, max_batch_tokens=tokens)
        for c, dtype, tokens in ((1, "auto", 256), (2, "float32", 512), (4, "bfloat16", 256))
    ]
    runs = history_of(tmp_path, configs)
    varied = run_diff.differing_settings(runs)
    assert varied == ["concurrency", "dtype", "max_batch_tokens"]
    assert run_diff.default_setting(runs, varied) == "concurrency"  # 3 values, a number: before dtype's 3 names
    assert run_diff.default_setting(runs, ["dtype", "max_batch_tokens"]) == "dtype"  # 3 names before 2 numbers
    assert run_diff.default_setting(runs, []) is None


def test_runs_with_the_same_settings_are_repeats(tmp_path):
    runs = history_of(tmp_path, [cpu_run(2, "a"), cpu_run(4, "b"), cpu_run(2, "c"), cpu_run(4, "d")])
    assert run_diff.repeat_groups(runs) == [0, 1, 0, 1]
    assert run_diff.repeat_groups(runs.iloc[[0, 2]]) == [0, 0]
    assert run_diff.differing_settings(runs.iloc[[0, 2]]) == []


@pytest.mark.parametrize("cell, text", [(4, "4"), (0.8, "0.8"), (True, "yes"), (None, "default"), ("auto", "auto")])
def test_cells_read_as_a_person_writes_them(cell, text):
    assert run_diff.show(cell) == text


@pytest.mark.slow
def test_a_long_history_of_repeats_differs_where_its_few_setups_do(tmp_path):
    """A year of runs repeats a few setups: each distinct row counts once, and a setting differing in one row of
    thousands is found."""
    runs = history_of(tmp_path, [cpu_run(2, "a"), cpu_run(4, "b", dtype="float32")])
    many = pd.concat([runs] * 2000, ignore_index=True)
    assert run_diff.differing_settings(many) == run_diff.differing_settings(runs) == ["concurrency", "dtype"]
    assert run_diff.differing_settings(many.iloc[::2]) == []
    odd = many.copy()
    odd.loc[3001, "seed"] = 7
    assert run_diff.differing_settings(odd) == ["seed", "concurrency", "dtype"]


def test_labels_name_the_settings_that_tell_runs_apart_not_the_first_ones_that_differ(tmp_path):
    """Five runs: random at 8 tokens and ShareGPT fixed at 16, concurrency 2, 4 and 8, one not streamed. The two
    ShareGPT runs share their dataset and output length (the first two settings that differ): their concurrency
    tells them apart."""
    runs = history_of(tmp_path, [compared_config(*run) for run in FIVE])
    varied = run_diff.differing_settings(runs)
    assert varied == ["dataset_name", "output_length", "concurrency", "stream_output"]
    assert run_diff.telling_settings(runs, varied) == ["dataset_name", "concurrency", "stream_output"]
    labels = figures.setting_labels(runs)
    assert labels[1:3] == [
        "Dataset name sharegpt, Concurrency 2, Stream output yes",
        "Dataset name sharegpt, Concurrency 8, Stream output yes",
    ]
    assert len(set(labels)) == len(FIVE)
    names = run_diff.compared_names(runs, varied)
    assert names == [f"{label} (run run-{index})" for index, label in enumerate(labels)]
    assert list(run_diff.differences(runs, varied).columns) == names


def test_runs_differing_in_one_setting_are_named_by_it_and_repeats_by_who_they_are(tmp_path):
    runs = history_of(tmp_path, [cpu_run(2, "a"), cpu_run(4, "b"), cpu_run(2, "c")])
    varied = run_diff.differing_settings(runs)
    assert run_diff.compared_names(runs, varied) == ["Concurrency 2 (a)", "Concurrency 4 (b)", "Concurrency 2 (c)"]
    assert run_diff.compared_names(runs.iloc[[0, 2]], []) == ["a", "c"]
