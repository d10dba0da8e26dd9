"""The regression gate's rules (views.regression) on history rows of known numbers: which runs a name chooses, which
runs are repeats of one setup, and when a metric got worse beyond the noise of the repeats or beyond a tolerance, in
the direction the metric catalog says is better. The same gate run for real from the CLI: tests/test_cli_compare.py."""

from __future__ import annotations

import pandas as pd

from bench_core.views import regression
from bench_core.views.regression import Gate


def _runs(values: dict[str, list[float]], labels: list[str], **settings: list) -> pd.DataFrame:
    """History rows r0, r1, ... started a minute apart, with these labels, metric values and settings."""
    count = len(labels)
    return pd.DataFrame(
        {
            "run_id": [f"r{at}" for at in range(count)],
            "label": labels,
            "started_at": [f"2026-12-01T10:{at:02d}:00+00:00" for at in range(count)],
            "backend": ["transformers"] * count,
            "load_pattern": ["concurrency"] * count,
            **values,
            **settings,
        }
    )


def _gate(table: pd.DataFrame, names: list[str], gates: list[Gate]) -> list[regression.Regression]:
    rows, sources, unknown = regression.named_runs(table, names)
    assert not unknown
    return regression.regressions(regression.compared(rows, sources, names[0]), gates)


def test_worse_beyond_the_noise_of_the_repeats_is_a_regression_in_the_catalogs_direction():
    labels = ["main"] * 3 + ["pr"] * 3
    slower = _runs({"mean_e2e_ms": [100, 101, 99, 130, 131, 129]}, labels)
    (found,) = _gate(slower, ["main", "pr"], [Gate("mean_e2e_ms")])
    assert (found.metric, found.setup, found.run_ids, found.reason) == (
        "mean_e2e_ms",
        "pr",
        ["r3", "r4", "r5"],
        "noise",
    )
    assert found.comparison.relative == 0.3
    # Lower latency is better: the same change the other way round is no regression.
    assert _gate(slower, ["pr", "main"], [Gate("mean_e2e_ms")]) == []
    # Higher throughput is better: a throughput that fell is one.
    fell = _runs({"output_throughput": [50, 51, 49, 40, 41, 39]}, labels)
    assert [found.metric for found in _gate(fell, ["main", "pr"], [Gate("output_throughput")])] == ["output_throughput"]


def test_a_change_within_the_noise_is_no_regression():
    spread = _runs({"mean_e2e_ms": [80, 120, 100, 110, 90, 130]}, ["main"] * 3 + ["pr"] * 3)
    assert _gate(spread, ["main", "pr"], [Gate("mean_e2e_ms")]) == []


def test_a_tolerance_judges_the_means_single_runs_too():
    single = _runs({"p99_ttft_ms": [100, 106]}, ["main", "pr"])
    (found,) = _gate(single, ["main", "pr"], [Gate("p99_ttft_ms", 0.05)])
    assert found.reason == "tolerance" and found.sentence.endswith("beyond the 5 % tolerance")
    assert _gate(single, ["main", "pr"], [Gate("p99_ttft_ms", 0.07)]) == []
    assert _gate(single, ["pr", "main"], [Gate("p99_ttft_ms", 0.05)]) == []  # lower latency is better
    # Higher throughput is better: 6 % less is beyond 5 %, 6 % more no regression.
    throughput = _runs({"output_throughput": [100, 94, 106]}, ["main", "less", "more"])
    assert [
        found.setup for found in _gate(throughput, ["main", "less", "more"], [Gate("output_throughput", 0.05)])
    ] == ["less"]
    # Against noise a single run cannot be judged: said, as that gate can never fail.
    rows, sources, _ = regression.named_runs(single, ["main", "pr"])
    compared = regression.compared(rows, sources, "main")
    assert regression.regressions(compared, [Gate("p99_ttft_ms")]) == []
    assert regression.unjudged(compared, [Gate("p99_ttft_ms"), Gate("p99_ttft_ms", 0.05)]) == ["p99_ttft_ms"]


def test_names_choose_runs_by_id_then_sweep_then_label_each_run_once():
    table = _runs({}, ["main", "main", "r0", "pr"], sweep_id=["", "", "s1", "s1"])
    rows, sources, unknown = regression.named_runs(table, ["r0", "main", "s1", "nothing"])
    # "r0" is a run id before it is r2's label; r0 stays with the first name that chose it.
    assert rows["run_id"].tolist() == ["r0", "r1", "r2", "r3"]
    assert sources == ["r0", "main", "s1", "s1"]
    assert unknown == ["nothing"]


def test_repeats_are_runs_of_one_name_and_one_setting():
    table = _runs({}, ["main", "main", "main", "pr", "pr"], concurrency=[1, 1, 4, 1, 1])
    rows, sources, _ = regression.named_runs(table, ["main", "pr"])
    compared = regression.compared(rows, sources, "main")
    # main at concurrency 1 twice, main at 4, pr at 1 twice: the same settings under two names are two setups.
    assert compared.groups == [0, 0, 1, 2, 2]
    assert compared.baseline == "r0"


def test_a_gate_on_what_one_side_did_not_measure_is_found():
    table = _runs({"mean_ttft_ms": [10, 11, None, None], "mean_tpot_ms": [1, 1, 1, 1]}, ["main"] * 2 + ["pr"] * 2)
    rows, sources, _ = regression.named_runs(table, ["main", "pr"])
    compared = regression.compared(rows, sources, "main")
    assert regression.unmeasured(compared, [Gate("mean_ttft_ms"), Gate("mean_tpot_ms")]) == ["mean_ttft_ms"]
