"""Sweep plans: parsing --sweep values, run order that spares engine reloads, up-front checks, resume."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest

from bench_core import csvstore
from bench_core.config import RunConfig, setting
from bench_core.config.catalog import OUTPUT_LENGTHS
from bench_core.engines import engine_settings_key
from bench_core.errors import ConfigError
from bench_core.load import dataset, dataset_names, output_length, takes
from bench_core.measure.catalog import METRICS, with_derived
from bench_core.store.history import History, RunRecord, history_row
from bench_core.sweep import results as sweep_results
from bench_core.sweep.plan import SWEEPABLE, SweepAxis, SweepPlan, new_sweep_id, parse_sweep_arg, with_run_size
from bench_core.sweep.precision import CAPPED, REACHED, SHORT, Precision, judge
from bench_core.sweep.store import SWEEP_REPEAT, remaining
from bench_core.views import sweep_charts

OUTPUT_THROUGHPUT_PER_USER = METRICS["output_throughput_per_user"].column()
SLO_ATTAINMENT = METRICS["slo_attainment"].column()


def _base(backend: str = "transformers", label: str = "") -> RunConfig:
    config = RunConfig(label=label)
    config.engine.backend = backend
    config.engine.model = "builtin:tiny-llama"
    config.dataset.num_prompts = 8
    return config


def _reloads(plan: SweepPlan) -> int:
    """Engine loads the plan's order costs: one at the start and one per change of engine settings."""
    keys = [engine_settings_key(run.config.engine, run.config.load) for run in plan.points()]
    return 1 + sum(a != b for a, b in zip(keys, keys[1:]))


# ---- parsing ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "name", "values"),
    [
        ("concurrency=1,2,4", "concurrency", (1, 2, 4)),
        ("cache-max-entry-count=0.5, 0.8", "cache_max_entry_count", (0.5, 0.8)),
        ("--num-prompts=100,200", "num_prompts", (100, 200)),
        ("random_output_len=64,128", "random_output_len", (64, 128)),
        ("async=0,1", "async_", (0, 1)),
        ("session-len=none,4096", "session_len", (None, 4096)),
        ("quant-policy=none,int8,4", "quant_policy", (0, 8, 4)),
        ("enable-prefix-caching=true,false", "enable_prefix_caching", (True, False)),
        ("dtype=float32,bfloat16", "dtype", ("float32", "bfloat16")),
    ],
)
def test_sweep_values_take_the_type_of_their_setting(text, name, values):
    axis = parse_sweep_arg(text)
    assert axis == SweepAxis(name, values)
    assert [type(v) for v in axis.values] == [type(v) for v in values]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("concurency=1,2", "Cannot sweep 'concurency'. Sweepable settings: tp, cache_max_entry_count"),
        ("model=a,b", "Cannot sweep 'model'"),
        ("concurrency", "write NAME=V1,V2"),
        ("concurrency=1,2.5", "Sweep value '2.5' for concurrency is not a whole number from 1 to 1,000,000."),
        ("cache_max_entry_count=half", "is not a number above 0 and at most 2,147,483,647."),
        ("session_len=lots", "is not a whole number from 1 to 16,777,216 or none."),
        ("eager_mode=maybe", "is not true or false."),
        ("concurrency=1,,2", "Sweep value '' for concurrency"),
        ("model_format=hf,onnx", "is not one of its choices: hf, awq"),
        ("quant_policy=int3", "Sweep value 'int3' for quant_policy"),
        ("concurrency=4,1,4", "lists 4 more than once"),
    ],
)
def test_a_bad_sweep_is_one_clear_message(text, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_sweep_arg(text)


def test_request_rate_is_sweepable_as_floats():
    axis = parse_sweep_arg("request-rate=0.5,2,inf")
    assert axis.name == "request_rate" and axis.values == (0.5, 2.0, float("inf"))


def test_an_unknown_setting_lists_the_sweepable_ones():
    with pytest.raises(
        ConfigError,
        match="Sweepable settings: .*concurrency, request_rate, max_concurrency, cache_state, trace_speedup, num_prompts",
    ):
        parse_sweep_arg("warp-speed=1,2")


def test_every_engine_knob_and_the_load_and_length_settings_are_sweepable():
    assert {
        "tp",
        "cache_max_entry_count",
        "max_batch_tokens",
        "concurrency",
        "num_prompts",
        "random_input_len",
        "random_output_len",
        "sharegpt_output_len",
    } <= set(SWEEPABLE)


# ---- plans -----------------------------------------------------------------------------------


def test_a_plan_varies_one_or_two_settings_with_at_least_one_repeat():
    concurrency = parse_sweep_arg("concurrency=1,2")
    with pytest.raises(ConfigError, match="one setting or two"):
        SweepPlan("s", _base(), (concurrency, parse_sweep_arg("tp=1,2"), parse_sweep_arg("num_prompts=1,2")))
    with pytest.raises(ConfigError, match="varies concurrency twice"):
        SweepPlan("s", _base(), (parse_sweep_arg("tp=1,2"), concurrency, parse_sweep_arg("concurrency=4")))
    with pytest.raises(ConfigError, match="--repeats must be a whole number from 1 to 1,000; got 0"):
        SweepPlan("s", _base(), (concurrency,), repeats=0)


def test_points_cover_the_grid_times_the_repeats_with_labelled_configs():
    plan = SweepPlan(
        "s",
        _base(label="baseline"),
        (parse_sweep_arg("concurrency=1,2"), parse_sweep_arg("num_prompts=4,8,16")),
        repeats=2,
    )
    runs = plan.points()
    assert len(runs) == 12
    assert sorted((r.values["concurrency"], r.values["num_prompts"], r.repeat) for r in runs) == sorted(
        (c, n, k) for c in (1, 2) for n in (4, 8, 16) for k in (0, 1)
    )
    for run in runs:
        assert run.config.load.concurrency == run.values["concurrency"]
        assert run.config.dataset.num_prompts == run.values["num_prompts"]
        assert run.config.engine == plan.base.engine
    run = runs[0]
    assert (
        run.config.label == f"baseline · concurrency={run.values['concurrency']}, "
        f"num_prompts={run.values['num_prompts']} · repeat {run.repeat + 1}/2"
    )
    assert plan.base.dataset.num_prompts == 8 and plan.base.label == "baseline"  # the base is not changed
    runs[0].config.generation.temperature = 0.1
    assert runs[1].config.generation.temperature == plan.base.generation.temperature == 0.8


def test_a_single_repeat_label_names_only_the_point():
    (run, _) = SweepPlan("s", _base(), (parse_sweep_arg("max_batch_tokens=256,512"),)).points()
    assert run.config.label == "max_batch_tokens=256"
    assert run.config.engine.max_batch_tokens == 256


def test_runs_sharing_engine_settings_follow_each_other():
    # transformers reloads for a dtype change only; product order would flip dtype on every run.
    plan = SweepPlan(
        "s", _base(), (parse_sweep_arg("concurrency=1,2,4"), parse_sweep_arg("dtype=float32,bfloat16")), repeats=2
    )
    assert _reloads(plan) == 2
    assert [run.config.engine.dtype for run in plan.points()] == ["float32"] * 6 + ["bfloat16"] * 6


def test_lmdeploy_concurrency_changes_reload_the_engine_and_are_grouped():
    # max_batch_size (= concurrency) is part of an LMDeploy pipeline, the prompt count is not.
    plan = SweepPlan(
        "s", _base("turbomind"), (parse_sweep_arg("num_prompts=10,20,40"), parse_sweep_arg("concurrency=1,2"))
    )
    assert _reloads(plan) == 2
    assert [r.values["concurrency"] for r in plan.points()] == [1, 1, 1, 2, 2, 2]


def test_repeats_run_as_rounds_within_an_engine_group():
    plan = SweepPlan("s", _base(), (parse_sweep_arg("concurrency=1,2"),), repeats=2)
    assert [(r.values["concurrency"], r.repeat) for r in plan.points()] == [(1, 0), (2, 0), (1, 1), (2, 1)]


def test_check_names_every_impossible_point_in_one_error():
    plan = SweepPlan("s", _base(), (parse_sweep_arg("concurrency=0,1,-1"), parse_sweep_arg("num_prompts=0,3")))
    with pytest.raises(ConfigError) as caught:
        plan.check()
    assert str(caught.value) == (
        "Sweep points with num_prompts=0: --num-prompts must be a whole number from 1 to 1,000,000; got 0. "
        "Sweep points with concurrency=0: --concurrency must be a whole number from 1 to 1,000,000; got 0. "
        "Sweep points with concurrency=-1: --concurrency must be a whole number from 1 to 1,000,000; got -1."
    )


@pytest.mark.slow
def test_check_applies_the_backend_rules_to_each_point():
    base = _base("pytorch")
    plan = SweepPlan("s", base, (parse_sweep_arg("cache_max_entry_count=0.5,1.0"),))
    with pytest.raises(ConfigError, match=r"^Sweep points with cache_max_entry_count=1.0: --cache-max-entry-count"):
        plan.check()


def test_a_sweep_over_a_knob_the_backend_does_not_use_is_refused():
    plan = SweepPlan("s", _base(), (parse_sweep_arg("session_len=none,4096"),))  # transformers has no session_len
    with pytest.raises(
        ConfigError,
        match=r"^Cannot sweep session_len: --session-len applies to the turbomind and "
        r"pytorch backends only, not to transformers\.$",
    ):
        plan.check()


def test_check_says_once_what_every_point_lacks():
    base = _base()
    base.engine.model = " "
    with pytest.raises(ConfigError, match=r"^Every sweep point: No model given"):
        SweepPlan("s", base, (parse_sweep_arg("concurrency=1,2"),)).check()


def test_a_possible_plan_passes_its_check():
    SweepPlan("s", _base(), (parse_sweep_arg("concurrency=1,2"), parse_sweep_arg("max_batch_tokens=256,512"))).check()


def test_each_dataset_takes_one_output_length_setting_at_most_and_a_trace_none():
    for name in dataset_names():
        assert sum(dataset(name).takes(length) for length in OUTPUT_LENGTHS) <= 1, name
    assert output_length("trace") is None
    assert output_length("multi-turn").name == "sharegpt_output_len"
    assert output_length("shared-prefix").name == "output_len"


@pytest.mark.parametrize("dataset_name", dataset_names())
def test_a_run_size_sets_the_output_length_the_dataset_takes_and_no_other(dataset_name):
    base = _base()
    base.dataset.dataset_name = dataset_name
    sized = with_run_size(base, 3, 24)
    declared = output_length(dataset_name)
    assert [length.key for length in OUTPUT_LENGTHS if getattr(sized.dataset, length.key) == 24] == (
        [declared.name] if declared else []
    )
    assert sized.dataset.num_prompts == 3
    assert with_run_size(base, None, None).dataset == base.dataset  # empty fields: the sidebar's


@pytest.mark.parametrize("dataset_name", ["sharegpt", "random", "shared-prefix", "multi-turn"])
def test_a_sized_sweep_of_each_text_workload_passes_its_check(dataset_name):
    base = _base()
    base.dataset.dataset_name = dataset_name
    if takes(dataset_name, setting("random_input_len")):
        base.dataset.random_input_len = 16  # the random dataset's other length: no default
    SweepPlan("s", with_run_size(base, 3, 24), (parse_sweep_arg("concurrency=1,2"),)).check()


def test_a_gpu_sweep_is_refused_here_without_a_gpu_but_may_go_to_a_cluster():
    """This machine has no CUDA GPU: running the points here is refused up front, while a sweep for a
    cluster's GPU nodes passes (their workers say what they lack)."""
    plan = SweepPlan("s", _base("pytorch"), (parse_sweep_arg("concurrency=1,2"),))
    with pytest.raises(ConfigError, match="NVIDIA GPU"):
        plan.check()
    plan.check(runs_here=False)


def test_a_plan_survives_a_json_round_trip():
    plan = SweepPlan(
        new_sweep_id(),
        _base("pytorch", label="x"),
        (parse_sweep_arg("session_len=none,4096"), parse_sweep_arg("cache_max_entry_count=0.5,0.8")),
        repeats=3,
    )
    again = SweepPlan.from_dict(json.loads(json.dumps(plan.to_dict())))
    assert again == plan
    assert again.points() == plan.points()


def test_a_plan_with_a_target_survives_a_json_round_trip_and_runs_each_point_at_least_three_times():
    plan = SweepPlan(
        new_sweep_id(),
        _base(),
        (parse_sweep_arg("concurrency=1,2"),),
        precision=Precision(0.05, "mean_ttft_ms", max_repeats=6),
    )
    assert plan.repeats == 3  # the fewest that give an interval
    assert [(run.values["concurrency"], run.repeat) for run in plan.points()] == [
        (1, 0), (2, 0), (1, 1), (2, 1), (1, 2), (2, 2)
    ]  # fmt: skip
    assert plan.config_at({"concurrency": 2}, 4).label.endswith("concurrency=2 · repeat 5 (at most 6)")
    again = SweepPlan.from_dict(json.loads(json.dumps(plan.to_dict())))
    assert again == plan


@pytest.mark.parametrize(
    ("precision", "said"),
    [
        (dict(target=0.05, metric="bogus"), "--target-moe-metric takes a sweep metric"),
        (dict(target=1.5), "--target-moe must be a number above 0 and at most 1; got 1.5."),
        (dict(target=0.05, max_repeats=2), "--max-repeats must be at least 3 with --target-moe"),
    ],
)
def test_a_target_that_cannot_work_is_refused_with_its_reason(precision, said):
    with pytest.raises(ConfigError, match=re.escape(said)):
        Precision(**precision)


def test_a_target_on_a_metric_unstreamed_runs_do_not_measure_is_refused_before_any_run():
    plan = SweepPlan("s", _base(), (parse_sweep_arg("concurrency=1,2"),), precision=Precision(0.1, "mean_ttft_ms"))
    with pytest.raises(ConfigError) as refused:
        plan.check()
    assert str(refused.value) == (
        "Every sweep point would never reach the target: --target-moe-metric mean_ttft_ms is measured on streamed runs "
        "only. Add --stream-output, or choose another metric."
    )
    streamed = _base()
    streamed.load.stream_output = True
    SweepPlan("s", streamed, (parse_sweep_arg("concurrency=1,2"),), precision=Precision(0.1, "mean_ttft_ms")).check()
    SweepPlan("s", _base(), (parse_sweep_arg("concurrency=1,2"),), precision=Precision(0.1)).check()


def test_where_a_point_stands_follows_its_runs_values():
    precision = Precision(0.05, max_repeats=5)
    assert judge([100.0, 100.5, 99.5], 3, precision, 3).outcome == REACHED
    assert judge([100.0, 100.0], 2, precision, 3).outcome == SHORT  # a spread of 0, but too few runs for an interval
    assert judge([100.0, 10.0, 100.0], 3, precision, 3).outcome == SHORT
    assert judge([100.0, 10.0, 100.0, 10.0, 100.0], 5, precision, 3).outcome == CAPPED
    assert judge([], 5, precision, 3).outcome == CAPPED  # runs without the metric's value (one not reported)
    assert judge([100.0, 100.5, 99.5], 3, precision, 4).outcome == SHORT  # --repeats 4 raised the floor


def test_sweep_ids_are_distinct_and_readable():
    ids = {new_sweep_id() for _ in range(20)}
    assert len(ids) == 20 and all(i.startswith("sweep-") for i in ids)


# ---- resume ----------------------------------------------------------------------------------


def test_remaining_skips_finished_runs_of_this_sweep_only():
    plan = SweepPlan("s1", _base(), (parse_sweep_arg("concurrency=1,2"),), repeats=2)
    history = pd.DataFrame(
        {
            "sweep_id": ["s1", "s1", "s1", "other", "s1"],
            SWEEP_REPEAT: [0.0, 0.0, 1.0, 1.0, np.nan],
            "status": ["finished", "failed", "cancelled", "finished", "finished"],
            "concurrency": [1.0, 2.0, 2.0, 1.0, 2.0],  # read back from CSV as floats
        }
    )
    assert [(r.values["concurrency"], r.repeat) for r in remaining(plan, history)] == [(2, 0), (1, 1), (2, 1)]


def test_nothing_is_done_in_an_empty_or_older_history():
    plan = SweepPlan("s1", _base(), (parse_sweep_arg("concurrency=1,2"),))
    assert remaining(plan, pd.DataFrame()) == plan.points()
    assert remaining(plan, pd.DataFrame({"run_id": ["a"], "status": ["finished"]})) == plan.points()


def test_resume_reads_the_points_back_from_a_real_history(tmp_path):
    history = History(tmp_path)
    plan = SweepPlan(
        "sweep-1",
        _base("pytorch"),
        (parse_sweep_arg("session_len=none,64"), parse_sweep_arg("enable_prefix_caching=false,true")),
        repeats=2,
    )
    first_half = plan.points()[:5]
    for index, run in enumerate(first_half):
        record = RunRecord(
            run_id=f"run-{index}",
            started_at="2026-11-30T08:00:00+00:00",
            status="finished",
            config=run.config,
            sweep_id=plan.sweep_id,
        )
        csvstore.append_row(history.csv_path, {**history_row(record), SWEEP_REPEAT: run.repeat})
    left = remaining(plan, history.load())
    assert left == plan.points()[5:]
    assert len(left) == 3


# ---- derived metrics -------------------------------------------------------------------------


def test_sweep_metrics_add_per_user_speed_and_slo_attainment():
    runs = pd.DataFrame(
        {"mean_tpot_ms": [20.0, 0.0, np.nan], "good_requests": [90, 5, np.nan], "total_requests": [100, 10, 10]}
    )
    frame = with_derived(runs)
    assert frame[OUTPUT_THROUGHPUT_PER_USER].tolist()[0] == pytest.approx(50.0)
    assert np.isnan(frame[OUTPUT_THROUGHPUT_PER_USER].tolist()[1:]).all()
    assert frame[SLO_ATTAINMENT].tolist()[:2] == pytest.approx([0.9, 0.5])
    assert "mean_tpot_ms" in runs and OUTPUT_THROUGHPUT_PER_USER not in runs  # the input is left alone


def test_sweep_metrics_of_rows_without_those_columns_are_missing():
    frame = with_derived(pd.DataFrame({"run_id": ["a"]}))
    assert frame[[OUTPUT_THROUGHPUT_PER_USER, SLO_ATTAINMENT]].isna().all().all()


# ---- point statistics ------------------------------------------------------------------------


def _throughput_sweep(throughputs: dict[int, list[float]]) -> tuple[SweepPlan, pd.DataFrame]:
    """Finished runs of a concurrency sweep with these output throughputs (and as many E2E means) per point."""
    repeats = max(len(values) for values in throughputs.values())
    plan = SweepPlan(
        "s1", _base(), (parse_sweep_arg("concurrency=" + ",".join(map(str, throughputs))),), repeats=repeats
    )
    rows = [
        {
            "run_id": f"c{concurrency}-{k}",
            "sweep_id": "s1",
            SWEEP_REPEAT: float(k),
            "status": "finished",
            "concurrency": float(concurrency),
            "output_throughput": value,
            "mean_e2e_ms": value * 100,
            "p99_ttft_ms": 1000.0 / value,
        }
        for concurrency, values in throughputs.items()
        for k, value in enumerate(values)
    ]
    return plan, sweep_results.sweep_runs(pd.DataFrame(rows), plan)


def test_point_intervals_never_go_below_zero_and_two_runs_show_their_range():
    # The case: two repeats far apart gave a throughput interval down to -5 tok/s and E2E to -2,322 ms.
    plan, runs = _throughput_sweep({1: [2.0, 30.0], 2: [3.0, 4.0, 60.0]})
    statistics = sweep_results.point_statistics(runs, plan, ("output_throughput", "mean_e2e_ms"))
    assert (statistics[["ci_low", "ci_high"]].dropna() >= 0).all().all()
    two = statistics[(statistics["concurrency"] == 1) & (statistics["metric"] == "output_throughput")].iloc[0]
    assert np.isnan(two["ci_low"]) and (two["min"], two["max"]) == (2.0, 30.0)
    three = statistics[(statistics["concurrency"] == 2) & (statistics["metric"] == "output_throughput")].iloc[0]
    assert three["ci_low"] == 0.0 and three["ci_high"] > three["mean"]
    assert sweep_results.mean_with_interval(two) == "16.00 (range 2.00..30.00)"
    assert sweep_results.mean_with_interval(three) == f"22.33 [0.00, {three['ci_high']:.2f}]"
    note = sweep_results.interval_note(statistics)
    assert "concurrency=1: too few runs for a 95% interval" in note and "concurrency=2" not in note
    shown = sweep_results.statistics_for_display(statistics)
    assert {"lowest run", "highest run", "95% CI low"} <= set(shown.columns)


def test_an_attainment_interval_stays_within_zero_and_one():
    plan = SweepPlan("s1", _base(), (parse_sweep_arg("concurrency=1"),), repeats=3)
    rows = pd.DataFrame(
        {
            "run_id": ["a", "b", "c"],
            "sweep_id": "s1",
            SWEEP_REPEAT: [0.0, 1.0, 2.0],
            "status": "finished",
            "concurrency": 1.0,
            "good_requests": [5, 10, 10],
            "total_requests": [10, 10, 10],
        }
    )
    statistics = sweep_results.point_statistics(sweep_results.sweep_runs(rows, plan), plan, ("slo_attainment",))
    assert statistics["ci_high"].item() == 1.0 and statistics["ci_low"].item() >= 0.0


def test_the_pareto_points_of_a_sweep_are_its_point_means_not_its_repeats():
    plan, runs = _throughput_sweep({1: [10.0, 20.0], 2: [30.0, 50.0]})
    points = sweep_results.point_means(runs, plan, ("p99_ttft_ms", "output_throughput"))
    assert points["concurrency"].tolist() == [1, 2] and points["n"].tolist() == [2, 2]
    assert points["output_throughput"].tolist() == pytest.approx([15.0, 40.0])
    fig = sweep_charts.pareto_chart(points, "p99_ttft_ms", "output_throughput")
    assert sum(len(trace.x) for trace in fig.data) == 2  # one marker per point, not four per run
    assert "mean of %{customdata[0]} runs" in fig.data[1].hovertemplate


def test_a_points_runs_say_the_prefix_cache_states_they_started_with():
    def starts(*states):
        return sweep_results.cache_starts(pd.DataFrame({"cache_start": list(states)}))

    assert starts("cold", "cold") == "cold"
    assert starts("cold", "warm", "warm") == "1 cold, 2 warm"
    assert starts(None, "") == starts() == "not recorded"  # runs recorded before the state was
    assert sweep_results.cache_starts(pd.DataFrame({"run_id": ["a"]})) == "not recorded"
