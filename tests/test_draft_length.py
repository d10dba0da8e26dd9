"""The draft-length advisor (measure.draft_length) on synthetic per-position rates and step times whose best draft
length is known by hand: 1 + a1 + ... + ak tokens per step for a cost of 1 + r k plain steps."""

import json
import math

import pandas as pd
import pytest
from test_cli import run_cli

from bench_core.measure.draft_length import (
    advised_draft_tokens,
    draft_length_advice,
    expected_tokens_per_step,
    mean_rates,
    predicted_speedup,
    step_cost,
)

RATES = [0.9, 0.8, 0.3, 0.1]  # nested: position i accepted only where 1..i-1 were
STEP_S, PER_DRAFT_TOKEN = 0.010, 0.2


def _tpot(k: int, per_draft_token: float = PER_DRAFT_TOKEN) -> float:
    """The TPOT the model gives at draft length k: one step's time over the tokens it yields."""
    return STEP_S * (1 + per_draft_token * k) / expected_tokens_per_step(RATES, k)


def test_the_expected_tokens_per_step_add_each_positions_acceptance_to_the_bonus_token():
    assert expected_tokens_per_step(RATES, 0) == 1.0
    assert expected_tokens_per_step(RATES, 2) == pytest.approx(2.7)
    assert expected_tokens_per_step(RATES, 4) == pytest.approx(3.1)


def test_the_advised_length_is_where_the_next_position_accepts_less_than_a_drafted_token_costs():
    # By hand: k=1 1.9/1.2 = 1.58, k=2 2.7/1.4 = 1.93, k=3 3.0/1.6 = 1.875, k=4 3.1/1.8 = 1.72.
    assert predicted_speedup(RATES, 2, PER_DRAFT_TOKEN) == pytest.approx(2.7 / 1.4)
    assert advised_draft_tokens(RATES, PER_DRAFT_TOKEN) == 2
    # Drafting nearly free: every accepted position pays; drafting dear: none does (0 = no speculation).
    assert advised_draft_tokens(RATES, 0.01) == 4
    assert advised_draft_tokens(RATES, 1.0) == 0


def test_the_cost_of_a_drafted_token_is_read_from_the_sweeps_step_times():
    ks = [1, 2, 3, 4]
    cost = step_cost(ks, [_tpot(k) for k in ks], [expected_tokens_per_step(RATES, k) for k in ks])
    assert cost.step_s == pytest.approx(STEP_S) and cost.per_draft_token == pytest.approx(PER_DRAFT_TOKEN)
    assert step_cost([2, 2], [0.01, 0.01], [2.0, 2.0]) is None  # one draft length: no line


def test_the_advice_is_checked_against_the_sweeps_lowest_tpot():
    ks = [1, 2, 3, 4]
    advice = draft_length_advice(ks, [_tpot(k) for k in ks], [expected_tokens_per_step(RATES, k) for k in ks], RATES)
    assert advice.advised == 2 and advice.measured_best == 2 and advice.confirmed
    assert advice.predicted_tpot_s[0] == pytest.approx(STEP_S)  # plain decoding
    assert "draft 2 tokens per step (predicted 1.93x" in advice.sentence("concurrency=1")
    assert "the sweep's lowest TPOT agrees" in advice.sentence()
    # A measured sweep that disagrees is said to.
    measured = [_tpot(k) for k in ks]
    measured[3] = measured[1] * 0.99  # k=4 just beats k=2, its step time still on a rising line
    disagreeing = draft_length_advice(ks, measured, [expected_tokens_per_step(RATES, k) for k in ks], RATES)
    assert disagreeing.measured_best == 4 and not disagreeing.confirmed
    assert "measured its lowest TPOT at 4 draft tokens" in disagreeing.sentence()


def test_repeats_average_each_position_over_the_runs_that_drafted_it():
    assert mean_rates([[0.8, 0.4], [0.6], None]) == pytest.approx([0.7, 0.4])
    assert mean_rates([None, []]) is None
    # No TPOT measured (not streamed): nothing to fit, no advice.
    assert draft_length_advice([1, 2], [math.nan, math.nan], [1.5, 2.0], RATES) is None


def test_step_times_that_fall_with_the_draft_length_mean_drafting_costs_nothing_measurable():
    cost = step_cost([1, 2, 4], [0.010, 0.008, 0.004], [1.5, 1.8, 2.0])
    assert cost.per_draft_token == 0.0 and cost.step_s > 0


@pytest.mark.slow
def test_a_real_sweep_over_the_draft_length_marks_the_advised_value(tmp_path):
    """The embedded engine's prompt lookup at 1, 2 and 4 draft tokens: whatever this machine's timings, the CLI
    states the advice the recorded runs give, marks that row, and the report charts it."""
    done = run_cli(
        *("sweep", "pipeline", "builtin:sample", "builtin:tiny-llama", "--backend", "transformers"),
        *("--load", "concurrency", "-c", "1", "-n", "6", "--sharegpt-output-len", "24", "--stream-output"),
        *("--speculative-algorithm", "prompt_lookup", "--sweep", "speculative_num_draft_tokens=1,2,4"),
        *("--results", str(tmp_path / "results"), "--csv", "", "--report", str(tmp_path / "report.html")),
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    runs = pd.read_csv(tmp_path / "results" / "history.csv").sort_values("speculative_num_draft_tokens")
    rates = [json.loads(cell) for cell in runs["engine_acceptance_by_position"]]
    assert [len(found) for found in rates] == [1, 2, 4]
    advice = draft_length_advice(
        runs["speculative_num_draft_tokens"].tolist(),
        (runs["mean_tpot_ms"] / 1e3).tolist(),
        runs["spec_acceptance_length"].tolist(),
        mean_rates(rates),
    )
    lines = done.stdout.splitlines()
    header = next(line for line in lines if line.lstrip().startswith("speculative_num_draft_tokens"))
    rows = {int(line.split()[0]): line for line in lines[lines.index(header) + 1 :][:3]}
    assert ", ".join(f"{rate:.0%}" for rate in rates[2]) in rows[4]
    if advice is None:
        assert "No draft length advised" in done.stdout
    else:
        assert advice.sentence() in done.stdout
        marked = [k for k, line in rows.items() if line.rstrip().endswith("advised")]
        assert marked == ([advice.advised] if advice.advised in rows else [])
        assert "TPOT by draft length" in (tmp_path / "report.html").read_text()
