"""A sweep's duration estimate: from the history's rates for the model, else a stated rough CPU figure."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from bench_core.config import DatasetConfig, EngineConfig, LoadConfig, RunConfig
from bench_core.sweep.estimate import (
    CONFIRM_ABOVE_REQUESTS,
    ROUGH_CPU_LOAD_S,
    ROUGH_CPU_TOK_S,
    describe_seconds,
    estimate,
    estimate_run,
    out_of_proportion,
    plan_estimate,
)
from bench_core.sweep.plan import SweepAxis, SweepPlan
from bench_core.sweep.tune import Tune


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


def test_a_tune_is_estimated_at_its_trial_budget_not_at_every_point_of_its_space():
    plan = dataclasses.replace(_plan(concurrencies=(1, 2, 4, 8), repeats=2), tune=Tune(trials=3))
    guess = plan_estimate(plan, pd.DataFrame())
    assert guess.most and guess.requests == 3 * 2 * 8  # 3 trials of 2 runs of 8 prompts, of the space's 4 points
    assert guess.basis.startswith("at most, 3 trials of 2 run(s) each")
    everything = plan_estimate(dataclasses.replace(plan, tune=Tune(trials=10)), pd.DataFrame())
    assert everything.requests == 4 * 2 * 8  # a budget beyond the space: every point


def test_runs_of_another_model_or_a_failed_run_do_not_count_and_a_server_without_history_gets_none():
    history = _history((1, 100.0, 1.0)).assign(model="other")
    failed = _history((1, 100.0, 1.0)).assign(status="failed")
    guess = estimate(_plan("openai").points(), pd.concat([history, failed]))
    assert guess.seconds is None and "no finished run of builtin:smollm2-135m on openai" in guess.basis


def test_durations_read_in_minutes_and_seconds_then_hours_then_days():
    assert describe_seconds(125.4) == "about 2 min 05 s"
    assert describe_seconds(40.2) == "about 40 s"
    assert describe_seconds(37_520) == "about 10 h 25 min"
    assert describe_seconds(6.4e9) == "about 74,074 days"


def _run(dataset_name: str, backend: str = "transformers", num_prompts: int = 4, **lengths) -> RunConfig:
    return RunConfig(
        engine=EngineConfig(backend=backend, model="builtin:smollm2-135m"),
        dataset=DatasetConfig(dataset_name=dataset_name, num_prompts=num_prompts, **lengths),
        load=LoadConfig(concurrency=1),
    )


def test_a_run_asks_for_its_datasets_own_output_length_and_a_multi_turn_session_for_every_turn():
    shared = estimate_run(_run("shared-prefix", output_len=100), pd.DataFrame())
    assert (shared.requests, shared.output_tokens) == (4, 400)
    turns = estimate_run(_run("multi-turn", sharegpt_output_len=10, turns=3), pd.DataFrame())
    assert (turns.requests, turns.output_tokens) == (12, 120)
    assert turns.seconds == pytest.approx(120 / ROUGH_CPU_TOK_S[1] + ROUGH_CPU_LOAD_S)


def test_what_takes_over_an_hour_at_past_pace_or_sends_untimed_a_flood_of_requests_asks_first():
    paced = _history((1, 8.0, 12.0)).assign(status="finished")
    assert out_of_proportion(estimate_run(_run("shared-prefix", output_len=100), paced)) == ""
    hours = estimate_run(_run("shared-prefix", num_prompts=1_000, output_len=100), paced)
    assert out_of_proportion(hours) == "it would take about 3 h 29 min"  # 100,000 tokens at 8 tok/s, and the load
    rough = estimate_run(_run("shared-prefix", num_prompts=1_000, output_len=100), pd.DataFrame())
    assert rough.seconds == pytest.approx(hours.seconds) and rough.rough
    assert out_of_proportion(rough) == ""  # SmolLM2's pace: another model may run it in a minute
    flood = estimate_run(_run("shared-prefix", num_prompts=CONFIRM_ABOVE_REQUESTS + 1), pd.DataFrame())
    assert out_of_proportion(flood) == f"it would send up to {CONFIRM_ABOVE_REQUESTS + 1:,} requests"
    untimed = estimate_run(_run("shared-prefix", "openai", CONFIRM_ABOVE_REQUESTS + 1), pd.DataFrame())
    assert untimed.seconds is None
    assert out_of_proportion(untimed) == f"it would send up to {CONFIRM_ABOVE_REQUESTS + 1:,} requests"
    assert out_of_proportion(estimate_run(_run("shared-prefix", "openai", 5_000), pd.DataFrame())) == ""
