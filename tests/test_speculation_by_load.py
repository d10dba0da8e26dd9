"""Speculation against none at every load of a sweep: the verdict per load from TPOT's paired interval, where it stops
paying, its chart, and the plans `sweep ... --against-no-speculation` builds (the embedded engine's pair of decode
paths, a server's pair of commands). The runs themselves: tests/test_app_sweep.py (the embedded engine, the CLI and
the page) and tests/test_sweep_speculation_servers.py (a scripted server whose speculation stops paying)."""

from __future__ import annotations

import math

import pytest

from bench_core.config import RunConfig
from bench_core.engines import run_config_problems
from bench_core.errors import ConfigError
from bench_core.measure.speculation_speedup import (
    COSTS,
    NO_SPEEDUP,
    PAYS,
    UNDECIDED,
    LoadSpeedup,
    describe_speedups,
    stops_paying,
)
from bench_core.measure.stats import Ratio
from bench_core.sweep.plan import SPECULATION, SweepPlan, plan_for
from bench_core.views.acceptance_charts import speedup_by_load_figure, speedup_table


def at_load(concurrency: int, value: float, low: float, high: float) -> LoadSpeedup:
    return LoadSpeedup(
        f"concurrency={concurrency}",
        concurrency,
        2,
        {"tpot": Ratio(value, low, high, 16), "e2e": Ratio(1, 0.9, 1.1, 16)},
    )


def test_tpot_s_interval_says_whether_speculation_paid_cost_or_cannot_tell():
    assert at_load(1, 0.7, 0.6, 0.8).verdict == PAYS
    assert at_load(1, 1.3, 1.2, 1.4).verdict == COSTS
    assert at_load(1, 0.9, 0.8, 1.02).verdict == UNDECIDED
    assert LoadSpeedup("concurrency=1", 1, 1, {"e2e": Ratio(0.5, 0.4, 0.6, 8)}).verdict is None  # not streamed


def test_it_stops_paying_at_the_first_load_from_which_it_never_pays_again():
    paid, cannot_tell, cost = at_load(1, 0.7, 0.6, 0.8), at_load(4, 0.97, 0.9, 1.05), at_load(16, 1.4, 1.3, 1.5)
    assert stops_paying([paid, cannot_tell, cost]) is cannot_tell
    assert describe_speedups([paid, cannot_tell, cost]) == (
        "Speculation paid up to concurrency=1 and stopped paying at concurrency=4. TPOT with speculation over "
        "without, on the same prompts (95% paired interval): concurrency=1 0.7 (0.6 to 0.8); concurrency=4 0.97 "
        "(0.9 to 1.05), within the interval of 1; concurrency=16 1.4 (1.3 to 1.5), costs."
    )
    again = at_load(64, 0.8, 0.7, 0.9)  # paid again after not paying: no single load where it stopped
    assert stops_paying([paid, cost, again]) is None
    assert describe_speedups([paid, cost, again]).startswith("Speculation paid at concurrency=1, concurrency=64 only.")
    assert stops_paying([cost, cannot_tell]) is None
    assert describe_speedups([cost, cannot_tell]).startswith("Speculation paid at no load swept.")
    assert describe_speedups([paid, again]).startswith("Speculation paid at every load swept.")
    assert describe_speedups([LoadSpeedup("concurrency=1", 1, 0, {})]) == NO_SPEEDUP


def test_the_chart_marks_no_gain_and_the_load_where_it_stopped_paying_on_a_log_axis_for_a_wide_sweep():
    speedups = [at_load(1, 0.7, 0.6, 0.8), at_load(8, 0.9, 0.85, 0.95), at_load(64, 1.4, 1.3, 1.5)]
    figure = speedup_by_load_figure(speedups, "concurrency")
    (trace,) = figure.data
    assert list(trace.x) == [1, 8, 64] and list(trace.y) == [0.7, 0.9, 1.4]
    assert [round(v, 6) for v in trace.error_y.array] == [0.1, 0.05, 0.1]
    assert [round(v, 6) for v in trace.error_y.arrayminus] == [0.1, 0.05, 0.1]
    lines = {(shape.type, shape.x0, shape.y0) for shape in figure.layout.shapes}
    assert ("line", 64, 0) in lines  # the stop, from bottom to top
    assert any(shape.y0 == 1 and shape.y1 == 1 for shape in figure.layout.shapes)  # no gain
    assert figure.layout.xaxis.type == "log"
    (stop,) = [note for note in figure.layout.annotations if note.text.startswith("stops paying")]
    assert stop.text == "stops paying at concurrency=64" and stop.x == pytest.approx(math.log10(64))  # log axis
    table = speedup_table(speedups, "concurrency")
    assert table.to_dict("records")[2] == {
        "concurrency": 64,
        "run pairs": 2,
        "Time per output token": "1.4 (1.3 to 1.5)",
        "End-to-end latency": "1 (0.9 to 1.1)",
        "speculation": COSTS,
    }


def speculating() -> RunConfig:
    config = RunConfig()
    config.engine.speculative_algorithm = "prompt_lookup"
    return config


def test_against_no_speculation_adds_speculation_off_and_on_last_with_both_on_generate():
    plan = plan_for(speculating(), ["concurrency=1,4"], against_no_speculation=True)
    assert [(axis.name, axis.values) for axis in plan.axes] == [
        ("concurrency", (1, 4)),
        ("speculative_algorithm", (None, "prompt_lookup")),
    ]
    assert plan.speculation_pairing == ("speculative_algorithm", None, "prompt_lookup")
    # Each load's two runs follow each other where they load one engine; both decode through generate().
    assert [(run.values["concurrency"], run.config.engine.speculative_algorithm) for run in plan.points()] == [
        (1, None),
        (4, None),
        (1, "prompt_lookup"),
        (4, "prompt_lookup"),
    ]
    assert {run.config.engine.decode_path for run in plan.points()} == {"generate"}
    assert SweepPlan.from_dict(plan.to_dict()).speculation_pairing == plan.speculation_pairing


def test_on_lmdeploys_engine_the_points_without_speculation_load_no_draft_model():
    base = RunConfig()
    base.engine.backend, base.engine.speculative_algorithm = "pytorch", "eagle"
    base.engine.speculative_draft_model = "/models/draft"
    plan = plan_for(base, ["concurrency=1,64"], against_no_speculation=True)
    engines = [(run.values["concurrency"], run.config.engine) for run in plan.points()]
    assert [(load, engine.speculative_algorithm, engine.speculative_draft_model) for load, engine in engines] == [
        (1, None, None),
        (1, "eagle", "/models/draft"),
        (64, None, None),
        (64, "eagle", "/models/draft"),
    ]
    assert [run_config_problems(run.config) for run in plan.points()] == [[]] * 4  # a draft without a method: refused


@pytest.mark.parametrize(
    ("sweeps", "options", "said"),
    [
        (["concurrency=1,4"], {"base": RunConfig()}, "needs speculation to set against: give --speculative-algorithm"),
        (["concurrency=1,4", "max_batch_tokens=64,128"], {}, "sweep one setting with it"),
        ([], {"baseline_server_cmd": "server --port {port}", "against": False}, "add --against-no-speculation"),
    ],
)
def test_a_sweep_that_cannot_pair_says_why(sweeps, options, said):
    with pytest.raises(ConfigError, match=said):
        plan_for(
            options.get("base", speculating()),
            sweeps or ["concurrency=1,4"],
            against_no_speculation=options.get("against", True),
            baseline_server_cmd=options.get("baseline_server_cmd", ""),
        )


def test_a_running_server_s_speculation_cannot_be_turned_off_and_a_server_per_run_needs_its_baseline():
    served = RunConfig()
    served.engine.base_url = "http://127.0.0.1:8000"
    with pytest.raises(ConfigError, match="start one per run with --server-cmd and --baseline-server-cmd"):
        plan_for(served, ["max_concurrency=1,8"], against_no_speculation=True)
    with pytest.raises(ConfigError, match="give --baseline-server-cmd"):
        plan_for(served, ["max_concurrency=1,8"], server_cmd="serve --port {port}", against_no_speculation=True)


def test_a_server_per_run_starts_the_baseline_command_for_the_runs_without_speculation():
    served = RunConfig()
    served.engine.backend = "openai"
    plan = plan_for(
        served,
        ["max_concurrency=1,8"],
        server_cmd="serve --port {port} --draft 4 --batch {batch}",
        server_settings=["batch=4"],
        baseline_server_cmd="serve --port {port} --batch {batch}",
        against_no_speculation=True,
    )
    assert plan.axes[-1].name == SPECULATION and plan.speculation_pairing == (SPECULATION, "off", "on")
    commands = [(run.values[SPECULATION], plan.server_command(run.config, 9000)) for run in plan.points()]
    assert commands[:2] == [
        ("off", ["serve", "--port", "9000", "--batch", "4"]),
        ("on", ["serve", "--port", "9000", "--draft", "4", "--batch", "4"]),
    ]
    assert SweepPlan.from_dict(plan.to_dict()).server_command(plan.points()[0].config, 1) == [
        "serve",
        "--port",
        "1",
        "--batch",
        "4",
    ]
