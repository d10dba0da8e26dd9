"""A tune's chart: the objective against its tightest bound's metric, the front joined, the bound drawn at its limit,
the best trial starred."""

from __future__ import annotations

import pandas as pd

from bench_core.views.tune_charts import BEST_TRIAL, tune_front_chart

TRIALS = pd.DataFrame(
    {
        "trial": [0, 1, 2],
        "concurrency": [1, 4, 8],
        "runs": [1, 1, 1],
        "output_throughput": [10.0, 30.0, 35.0],
        "p99_ttft_ms": [100.0, 400.0, 900.0],
    }
)


def test_the_front_is_joined_the_bound_drawn_at_its_limit_and_the_best_trial_starred():
    fig = tune_front_chart(TRIALS, "p99_ttft_ms", "output_throughput", 500.0, best=1)
    traces = {trace.name: trace for trace in fig.data}
    assert list(traces["Pareto frontier"].x) == [100.0, 400.0, 900.0]  # each buys throughput with latency
    (line,) = fig.layout.shapes
    assert (line.x0, line.x1) == (500.0, 500.0)
    assert "500" in fig.layout.annotations[-1].text
    star = traces[BEST_TRIAL]
    assert (list(star.x), list(star.y), star.marker.symbol) == ([400.0], [30.0], "star")


def test_without_a_trial_within_every_bound_nothing_is_starred():
    fig = tune_front_chart(TRIALS, "p99_ttft_ms", "output_throughput", 50.0, best=None)
    assert BEST_TRIAL not in [trace.name for trace in fig.data]
