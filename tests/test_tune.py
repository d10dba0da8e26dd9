"""The tune's pure parts (bench_core/sweep/tune.py): its bounds and objective as the CLI gives them, the early-stop
rule against numpy's own percentile, which trial is best and which are on the Pareto front, the deployment commands,
the study a resume rebuilds, and the command line that runs the best point again (cli/common.command_for) read back by
the CLI's own parser. Bad input is one line and exit 2, nothing written."""

from __future__ import annotations

import math
import shlex

import numpy as np
import pytest

from bench_core.cli import build_parser, main
from bench_core.cli.common import EXIT_BAD_INPUT, command_for
from bench_core.cli.pipeline import PipelineCommand
from bench_core.cli.throughput import ThroughputCommand
from bench_core.config import RunConfig
from bench_core.errors import ConfigError
from bench_core.sweep import tune
from bench_core.sweep.plan import SweepAxis, plan_for
from bench_core.sweep.tune import Bound, Trial, Tune


def test_a_bound_reads_as_the_catalog_metric_its_direction_and_its_limit():
    assert tune.parse_bound("p99_ttft_ms<=500") == Bound("p99_ttft_ms", True, 500.0)
    assert tune.parse_bound(" slo_attainment >= 0.9 ") == Bound("slo_attainment", False, 0.9)
    assert str(Bound("p99_ttft_ms", True, 500.0)) == "p99_ttft_ms<=500"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("p99_ttft_ms<500", "is not a bound"),
        ("ttft_p99<=0.5", "is not a catalog metric's column"),
        ("p99_ttft_ms<=fast", "'fast' is not a number"),
        ("p99_ttft_ms<=inf", "finite"),
    ],
)
def test_a_bound_that_is_not_one_is_refused_saying_why(text, message):
    with pytest.raises(ConfigError, match=message):
        tune.parse_bound(text)


def test_the_objective_takes_its_better_direction_unless_told_and_the_quality_floors_are_bounds():
    assert tune.tune_for("output_throughput").maximize is True
    assert tune.tune_for("mean_e2e_ms").maximize is False
    assert tune.tune_for("mean_e2e_ms", "max").maximize is True
    floors = tune.tune_for(min_exact_match=0.9, min_accuracy=0.5).bounds
    assert floors == (Bound("drift_exact_match_rate", False, 0.9), Bound("quality_accuracy", False, 0.5))
    with pytest.raises(ConfigError, match="given twice"):
        tune.tune_for(bounds=["failed<=0", "failed<=0"])


def test_a_bound_s_excess_is_optuna_s_constraint_value_and_a_missing_metric_breaks_it():
    at_most = Bound("p99_ttft_ms", True, 500.0)
    assert at_most.excess(400.0) == pytest.approx(-0.2)
    assert at_most.excess(750.0) == pytest.approx(0.5)
    assert Bound("slo_attainment", False, 0.9).excess(0.45) == pytest.approx(0.5)
    assert at_most.excess(math.nan) > 0


@pytest.mark.parametrize("statistic", ["p50", "p90", "p99", "p99.9"])
def test_a_percentile_is_broken_for_sure_exactly_when_no_remaining_requests_can_bring_it_back(statistic):
    """Against numpy: the rule says broken only where even the fastest possible rest (0 s) leaves the percentile
    beyond the limit, and says it as soon as that is so (the fastest rest with one fewer miss would keep it)."""
    bound = Bound(f"{statistic}_ttft_ms", True, 100.0)
    quantile = float(statistic[1:])
    rng = np.random.default_rng(7)
    for total in (1, 2, 5, 10, 37, 100, 1000):
        for _ in range(20):
            ended = int(rng.integers(0, total + 1))
            seen = rng.choice([0.05, 0.2], size=ended)  # 50 ms within the 100 ms limit, 200 ms beyond it
            best_rest = np.concatenate([seen, np.zeros(total - ended)])
            certainly = np.percentile(best_rest, quantile) * 1000 > 100.0
            assert tune.broken_for_sure(bound, seen, total) == certainly, (total, ended, int((seen > 0.1).sum()))


def test_a_mean_or_maximum_breaks_early_but_a_lower_bound_or_an_end_only_metric_never_does():
    seen = np.array([0.3, 0.3])
    assert tune.broken_for_sure(Bound("mean_e2e_ms", True, 100.0), seen, 4)  # 600 ms over 4 is 150 ms at least
    assert not tune.broken_for_sure(Bound("mean_e2e_ms", True, 200.0), seen, 4)
    assert tune.broken_for_sure(Bound("max_tpot_ms", True, 250.0), seen, 100)
    assert not tune.broken_for_sure(Bound("slo_attainment", False, 0.9), seen, 4)
    assert not tune.broken_for_sure(Bound("output_throughput", True, 1.0), seen, 4)


def _trial(number, point, throughput, ttft, stopped=""):
    return Trial(number, point, (f"run{number}",), stopped, {"output_throughput": throughput, "p99_ttft_ms": ttft})


def test_the_best_trial_keeps_every_bound_and_the_front_trades_the_objective_against_the_tightest():
    spec = Tune("output_throughput", True, (Bound("p99_ttft_ms", True, 500.0),))
    trials = [
        _trial(0, {"concurrency": 1}, 10.0, 100.0),
        _trial(1, {"concurrency": 2}, 18.0, 300.0),
        _trial(2, {"concurrency": 4}, 15.0, 450.0),  # slower and later than 2: dominated
        _trial(3, {"concurrency": 8}, 30.0, 900.0),  # fastest, beyond the bound
        _trial(4, {"concurrency": 16}, 40.0, 200.0, stopped="p99_ttft_ms<=500 broken for sure after 3 of 8 requests"),
    ]
    assert tune.best_trial(trials, spec).number == 1
    assert [trial.feasible(spec) for trial in trials] == [True, True, True, False, False]
    assert tune.tightest_bound(trials, spec) == spec.bounds[0]
    # 4's partial run is left out: its figures are not the point's
    assert list(tune.front(trials, spec)["trial"]) == [0, 1, 3]
    table = tune.trial_table(trials, spec)
    assert list(table["within bounds"]) == ["yes", "yes", "yes", "no: p99_ttft_ms<=500", "no: p99_ttft_ms<=500"]
    assert tune.best_trial(trials[3:], spec) is None


def test_a_quality_floor_rejects_a_fast_trial_whose_answers_drifted():
    spec = tune.tune_for("output_throughput", min_exact_match=0.95)
    drifted = Trial(0, {"dtype": "bfloat16"}, ("a",), "", {"output_throughput": 50.0, "drift_exact_match_rate": 0.6})
    kept = Trial(1, {"dtype": "float32"}, ("b",), "", {"output_throughput": 20.0, "drift_exact_match_rate": 1.0})
    unchecked = Trial(2, {"dtype": "float16"}, ("c",), "", {"output_throughput": 60.0})  # no baseline: no value
    assert tune.best_trial([drifted, kept, unchecked], spec) is kept


def test_the_deploy_commands_of_lmdeploy_backends_and_of_a_server_template():
    config = RunConfig()
    config.engine.backend = "turbomind"
    config.engine.model = "internlm/internlm2_5-7b-chat"
    config.engine.tp = 2
    config.engine.enable_prefix_caching = True
    config.engine.cache_max_entry_count = 0.5
    config.load.concurrency = 64
    commands = dict(tune.deploy_commands(config))
    words = shlex.split(commands["lmdeploy serve"])
    assert words[:6] == ["lmdeploy", "serve", "api_server", "internlm/internlm2_5-7b-chat", "--backend", "turbomind"]
    flags = " ".join(words[6:])
    for expected in ("--max-batch-size 64", "--tp 2", "--cache-max-entry-count 0.5", "--enable-prefix-caching"):
        assert expected in flags
    assert "enable-metrics" not in flags  # the benchmark script's own, not a deployment's
    assert commands["lmdeploy pipeline"].startswith("pipeline('internlm/internlm2_5-7b-chat', backend_config=Turbo")
    assert "max_batch_size=64" in commands["lmdeploy pipeline"]
    served = tune.deploy_commands(RunConfig(), "serve --port {port} --batch {batch}", {"batch": 4})
    assert served == [("server command", "serve --port 23333 --batch 4")]


def test_a_resumed_study_holds_the_recorded_trials_and_proposes_another_point():
    axes = (SweepAxis("concurrency", (1, 2, 4, 8)), SweepAxis("max_batch_tokens", (64, 256)))
    spec = Tune("output_throughput", True, (Bound("p99_ttft_ms", True, 500.0),), trials=4, seed=3)
    recorded = [_trial(0, {"concurrency": 2, "max_batch_tokens": 64}, 18.0, 300.0)]
    recorded.append(Trial(1, {"concurrency": 8, "max_batch_tokens": 256}, (), "its engine failed", {}))
    study = tune.new_study(spec)
    tune.replay(study, axes, spec, recorded)
    states = [trial.state.name for trial in study.trials]
    assert states == ["COMPLETE", "FAIL"]
    assert study.trials[0].params == recorded[0].point and study.trials[0].value == 18.0
    assert study.trials[0].constraints == {"p99_ttft_ms<=500": pytest.approx(-0.4)}
    asked = study.ask(tune.distributions(axes))
    assert set(asked.params) == {"concurrency", "max_batch_tokens"}


def test_the_command_that_runs_a_point_again_reads_back_as_the_same_settings():
    parser = build_parser()
    argv = (
        "pipeline builtin:sharegpt builtin:smollm2-135m --backend transformers -n 4 -c 2 --stream-output "
        "--sharegpt-output-len 16 --max-batch-tokens 256 --enable-prefix-caching --percentiles 50,99 --seed 3"
    ).split()
    pipeline = PipelineCommand()
    config = pipeline.build_config(parser.parse_args(argv))
    again = shlex.split(command_for(pipeline, config, "python -m bench_core pipeline"))
    assert again[:3] == ["python", "-m", "bench_core"]
    back = pipeline.build_config(parser.parse_args(again[3:]))
    assert back.to_flat_dict() == config.to_flat_dict()

    throughput = ThroughputCommand()  # a negated switch: given where the setting is off
    argv = ["throughput", "builtin:sample", "builtin:smollm2-135m", "--backend", "transformers", "--no-stream-output"]
    config = throughput.build_config(parser.parse_args(argv))
    again = shlex.split(command_for(throughput, config, "bench-studio throughput"))
    assert "--no-stream-output" in again
    assert throughput.build_config(parser.parse_args(again[1:])).to_flat_dict() == config.to_flat_dict()


def test_a_tune_plan_takes_more_than_two_settings_and_saves_its_tune():
    spec = tune.tune_for("output_throughput", bounds=["p99_ttft_ms<=500"], trials=5, seed=2)
    base = RunConfig()
    plan = plan_for(base, ["concurrency=1,2", "max_batch_tokens=64,256", "enable_prefix_caching=true,false"], tune=spec)
    assert plan.sweep_id.startswith("tune-") and len(plan.grid()) == 8
    assert type(plan).from_dict(plan.to_dict()).tune == spec
    with pytest.raises(ConfigError, match="Give --space"):
        plan_for(base, [], tune=spec)


PIPELINE = ["tune", "pipeline", "builtin:sample", "builtin:smollm2-135m", "--backend", "transformers", "-n", "2"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--space", "temperature=0,1"], "error: Cannot sweep 'temperature'. Sweepable settings: "),
        (["--space", "concurrency=1,x"], "error: Sweep value 'x' for concurrency is not"),
        (["--space", "concurrency=1,2", "--slo", "p99_ttft<=5"], "error: --slo: 'p99_ttft' is not a catalog metric"),
        (["--space", "concurrency=1,2", "--objective", "speed"], "error: --objective: 'speed' is not a catalog metric"),
        (["--space", "concurrency=1,2", "--trials", "0"], "error: --trials must be at least 1; got 0."),
        ([], "error: Give --space NAME=V1,V2"),
    ],
)
def test_bad_tune_input_is_one_line_and_exit_2_with_nothing_written(extra, message, tmp_path, capsys):
    code = main([*PIPELINE, "--results", str(tmp_path / "results"), *extra])
    err = capsys.readouterr().err
    assert code == EXIT_BAD_INPUT
    assert err.startswith(message) and err.count("\n") == 1, err
    assert not (tmp_path / "results" / "sweeps").exists()


def test_resume_of_what_is_not_a_tune_or_more_trials_without_resume_is_one_line(tmp_path, capsys):
    assert main(["tune", "--more-trials", "2"]) == EXIT_BAD_INPUT
    assert (
        capsys.readouterr().err
        == "error: --more-trials raises a stopped tune's budget: give it with --resume TUNE_ID.\n"
    )
    assert main(["tune", "--resume", "tune-nope", "--results", str(tmp_path)]) == EXIT_BAD_INPUT
    assert capsys.readouterr().err.startswith("error: There is no sweep tune-nope")
