"""A sweep's duration estimate: from the history's rates for the model, else a stated rough CPU figure."""

from __future__ import annotations

import pandas as pd
import pytest

from bench_core.config import DatasetConfig, EngineConfig, LoadConfig, RunConfig
from bench_core.sweep.estimate import ROUGH_CPU_LOAD_S, ROUGH_CPU_TOK_S, describe_seconds, estimate
from bench_core.sweep.plan import SweepAxis, SweepPlan


def _plan(backend: str = "transformers", concurrencies=(1, 4), repeats: int = 1) -> SweepPlan:
    base = RunConfig(
        engine=EngineConfig(backend=backend, model="builtin:smollm2-135m"),
        dataset=DatasetConfig(num_prompts=8, sharegpt_output_len=64),
        load=LoadConfig(concurrency=1),
    )
    return SweepPlan("sweep-test", base, (SweepAxis("concurrency", concurrencies),), repeats)


def _history(*rows) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "model": "builtin:smollm2-135m",
                "backend": "transformers",
                "status": "finished",
                "concurrency": c,
                "output_throughput": rate,
                "load_seconds": load,
            }
            for c, rate, load in rows
        ]
    )


def test_the_estimate_uses_past_rates_of_the_model_at_the_nearest_concurrency_and_one_engine_load():
    history = _history((1, 8.0, 6.0), (1, 12.0, 6.0), (8, 32.0, 6.0))
    guess = estimate(_plan(concurrencies=(1, 4, 16), repeats=2).points(), history)
    # 512 tokens a run: at 1 the median of 8 and 12 tok/s; 4 is nearest to... 1 (3 away) rather than 8 (4 away);
    # 16 takes the rate at 8. The transformers engine is loaded once for every concurrency.
    per_repeat = 512 / 10.0 + 512 / 10.0 + 512 / 32.0
    assert guess.seconds == pytest.approx(2 * per_repeat + 6.0)
    assert "3 finished run(s) of builtin:smollm2-135m on transformers" in guess.basis


def test_without_past_runs_the_embedded_engine_gets_a_rough_cpu_estimate_that_says_so():
    guess = estimate(_plan().points(), pd.DataFrame())
    assert guess.seconds == pytest.approx(512 / ROUGH_CPU_TOK_S[1] + 512 / ROUGH_CPU_TOK_S[4] + ROUGH_CPU_LOAD_S)
    assert guess.basis.startswith("a rough CPU estimate")


def test_runs_of_another_model_or_a_failed_run_do_not_count_and_a_server_without_history_gets_none():
    history = _history((1, 100.0, 1.0)).assign(model="other")
    failed = _history((1, 100.0, 1.0)).assign(status="failed")
    guess = estimate(_plan("openai").points(), pd.concat([history, failed]))
    assert guess.seconds is None and "no finished run of builtin:smollm2-135m on openai" in guess.basis


def test_durations_read_in_minutes_and_seconds():
    assert describe_seconds(125.4) == "about 2 min 05 s"
    assert describe_seconds(40.2) == "about 40 s"


def test_a_sweep_is_told_from_past_runs_of_its_dataset_their_pace_and_the_lengths_its_answers_had():
    # ShareGPT's own output lengths: past runs of the same dataset answered 50 tokens a request, at 20 tok/s at
    # concurrency 1 and 40 at 4; a run of short random prompts (200 tok/s) says nothing of these.
    base = RunConfig(
        engine=EngineConfig(backend="transformers", model="builtin:smollm2-135m"),
        dataset=DatasetConfig(num_prompts=8),
        load=LoadConfig(concurrency=1),
    )
    plan = SweepPlan("sweep-test", base, (SweepAxis("concurrency", (1, 4)),), 1)
    same = {
        "dataset": "builtin:sharegpt",
        "dataset_name": "sharegpt",
        "sharegpt_output_len": None,
        "load_pattern": "batch",
        "completed": 8,
        "total_output_tokens": 400,
    }
    history = pd.concat(
        [
            _history((1, 20.0, 5.0), (4, 40.0, 5.0)).assign(**same),
            _history((1, 200.0, 5.0)).assign(**{**same, "dataset_name": "random", "random_output_len": 16}),
        ]
    )
    guess = estimate(plan.points(), history)
    assert guess.seconds == pytest.approx(8 * 50 / 20.0 + 8 * 50 / 40.0 + 5.0)
    assert "3 finished run(s) of builtin:smollm2-135m on transformers" in guess.basis
