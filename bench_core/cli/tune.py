"""`python -m bench_core tune pipeline|throughput|restful ... --space NAME=V1,V2 [--space ...] [--objective METRIC]
[--slo METRIC<=LIMIT ...] [--trials N] [--seed S]`, and `tune --resume TUNE_ID`: which settings to run.

The engine command's flags give the settings every trial starts from; each --space adds a setting and the values the
search may pick (the sweep's NAME=V1,V2). Optuna's TPE proposes each trial's point under the --slo bounds (and the
quality floors), each trial a point run --repeats times (or until --target-moe) through the same runner as a sweep,
into the history under the tune's id; `restful --server-cmd` starts a server per run. The end prints every trial, the
best point with its interval, the Pareto front against the tightest bound, how much of the space was tried, and the
commands that deploy the best point and run it again; the HTML report goes to --report (default: beside the tune's
plan in the history). The logic is sweep.tune's and sweep.driver.TuneRun's; this module parses and prints.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import math
import sys

import pandas as pd

from ..config import check_values, setting
from ..errors import ConfigError
from ..exports import Scope, SweepSubject
from ..sweep import tune as tuning
from ..sweep.plan import describe_point, plan_for
from ..sweep.results import TuneResult, sweep_runs, tune_result
from ..sweep.store import load_plan, plan_path, save_plan, trials_of
from ..sweep.tune import LMDEPLOY_PORT
from ..views.tables import describe_column
from .common import (
    SWEEP_EXIT_CODES_HELP,
    Command,
    EngineCommand,
    ExportRequest,
    Flag,
    HelpFormatter,
    Parser,
    add_export_flag,
    add_flags,
    add_report_flag,
    add_results_flag,
    add_resume_credential_flags,
    add_server_flags,
    check_export_paths,
    check_report_path,
    check_writable,
    command_for,
    open_history,
    precision_of,
    progress_line,
    refuse_paired,
    report_swept_run,
    resume_credentials,
    sweep_outcome,
    wait_with_progress,
    write_exports,
)

PROG = "python -m bench_core"


class TuneCommand(Command):
    """`tune ENGINE_COMMAND ...`: the engine commands it is given set the settings every trial starts from."""

    name = "tune"
    help = "search several settings for the best objective within an SLO, and print how to deploy it"
    description = (
        "Search the settings given with --space for the best --objective within the --slo bounds:\n"
        "Optuna's TPE proposes each trial's point, each a real run (or --repeats runs) in the history.\n"
        "The end prints the best point with its interval, the Pareto front, how much of the space was\n"
        "tried, and the commands that deploy the best point and run it again.\n\n"
        "example: python -m bench_core tune pipeline builtin:sharegpt builtin:smollm2-135m --backend transformers "
        "-n 8 --stream-output --space concurrency=1,2,4,8 --space max_batch_tokens=64,256,1024 "
        "--space enable_prefix_caching=true,false --slo p99_ttft_ms<=5000 --trials 8\n"
        "resume a stopped tune: python -m bench_core tune --resume TUNE_ID"
    )
    epilog = SWEEP_EXIT_CODES_HELP

    def __init__(self, engine_commands: tuple[EngineCommand, ...]):
        self.engine_commands = {command.name: command for command in engine_commands}

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--resume", metavar="TUNE_ID", help="go on with a stopped tune, with its saved settings")
        add_results_flag(parser, "with --resume: the history folder the tune ran in", dest="resume_results")
        add_report_flag(parser, "once the resumed tune ends", dest="resume_report")
        add_export_flag(parser, "once the resumed tune ends", dest="resume_export")
        add_resume_credential_flags(parser, "tune")
        parser.add_argument(
            "--more-trials",
            type=int,
            default=0,
            metavar="N",
            help="with --resume: raise the tune's budget by N trials (the study goes on from the trials it has)",
        )
        engines = parser.add_subparsers(
            dest="engine_command", parser_class=Parser, metavar="{" + ",".join(self.engine_commands) + "}"
        )
        for name, engine in self.engine_commands.items():
            command = engines.add_parser(
                name,
                formatter_class=HelpFormatter,
                help=f"tune {name} runs: its flags give the settings every trial starts from",
                epilog=self.epilog,
            )
            engine.add_arguments(command)
            add_tune_flags(command.add_argument_group("tune"))
            if engine.serves:
                add_server_flags(command.add_argument_group("a server per run"))

    def run(self, args: argparse.Namespace) -> int:
        from ..run.runner import Runner
        from ..sweep.driver import resume_sweep, start_sweep

        refuse_paired(args)
        if args.more_trials and not args.resume:
            raise ConfigError("--more-trials raises a stopped tune's budget: give it with --resume TUNE_ID.")
        if args.resume and args.engine_command:
            raise ConfigError(
                "Give --resume TUNE_ID on its own: a resumed tune keeps the settings it was started with."
            )
        if args.resume:
            report_path, requested = args.resume_report, args.resume_export
            check_report_path(report_path)
            check_export_paths(requested, Scope.SWEEP)
            history = open_history(args.resume_results)
            saved = load_plan(history, args.resume)
            if saved.tune is None:
                raise ConfigError(f"{args.resume} is a sweep, not a tune: resume it with sweep --resume.")
            if args.more_trials:
                save_plan(history, with_more_trials(saved, args.more_trials))
            runner = Runner(history)
            run = resume_sweep(runner, args.resume, credentials=resume_credentials(args))
            engine = self.engine_commands[engine_of(run.plan.base)]
        elif args.engine_command:
            engine = self.engine_commands[args.engine_command]
            report_path, requested = args.report, args.export
            check_report_path(report_path)
            check_export_paths(requested, Scope.SWEEP)
            check_values(**{flag.name: getattr(args, flag.destination) for flag in TUNE_SETTINGS})
            tune = tuning.tune_for(
                args.objective,
                args.direction,
                args.slo,
                args.trials,
                args.tune_seed,
                args.min_exact_match,
                args.min_accuracy,
                args.search,
            )
            precision = precision_of(args)
            base = engine.build_config(args)
            plan = plan_for(
                base,
                args.space,
                args.repeats,
                getattr(args, "server_cmd", ""),
                getattr(args, "server_setting", []),
                getattr(args, "server_start_timeout", setting("server_start_timeout_s").default),
                precision=precision,
                tune=tune,
            )
            runner = Runner(open_history(args.results))
            check_writable(runner.history, "")
            run = start_sweep(runner, plan)  # raises ConfigError naming every impossible point, before any run
        else:
            raise ConfigError(
                "Choose an engine command (pipeline DATASET MODEL ... --space NAME=V1,V2) or --resume TUNE_ID."
            )
        return report_tune(run, runner, engine, report_path, requested or [])


def with_more_trials(plan, more: int):
    """`plan` with its tune's budget raised by `more` trials."""
    if more < 1:
        raise ConfigError(f"--more-trials must be at least 1; got {more}.")
    return dataclasses.replace(plan, tune=dataclasses.replace(plan.tune, trials=plan.tune.trials + more))


TUNE_SETTINGS = (Flag("repeats", metavar="K"),)


def add_tune_flags(group) -> None:
    group.add_argument(
        "--space",
        action="append",
        default=[],
        metavar="NAME=V1,V2",
        help="a setting and the values the search may pick; give --space once per setting. Sweepable: "
        "the catalog's sweep settings (see sweep --help), and the fields of --server-cmd",
    )
    group.add_argument(
        "--objective",
        default=tuning.DEFAULT_OBJECTIVE,
        metavar="METRIC",
        help="the catalog metric (a history column) to make best, e.g. output_throughput, goodput_rps, mean_e2e_ms",
    )
    group.add_argument(
        "--direction",
        choices=("max", "min"),
        default="",
        help="maximise or minimise the objective (default: its better way)",
    )
    group.add_argument(
        "--slo",
        action="extend",
        nargs="+",
        default=[],
        metavar="METRIC<=LIMIT",
        help="bounds a trial must keep, on catalog metrics in their shown units, e.g. p99_ttft_ms<=500 "
        "failed<=0 slo_attainment>=0.9 drift_exact_match_rate>=0.95; a trial that breaks one is rejected",
    )
    group.add_argument(
        "--min-exact-match",
        type=float,
        default=None,
        metavar="FRACTION",
        help="the quality guard's floor: drift_exact_match_rate>=FRACTION (runs need --drift-baseline)",
    )
    group.add_argument(
        "--min-accuracy",
        type=float,
        default=None,
        metavar="FRACTION",
        help="the quality guard's floor: quality_accuracy>=FRACTION (runs need --quality-set)",
    )
    group.add_argument(
        "--search",
        choices=tuning.SEARCHES,
        default=tuning.SEARCHES[0],
        help="how trials pick their points: Optuna's TPE, or at random (a baseline for TPE)",
    )
    group.add_argument("--trials", type=int, default=tuning.DEFAULT_TRIALS, metavar="N", help="points to try, at most")
    group.add_argument(
        "--tune-seed", type=int, default=tuning.DEFAULT_SEED, help="the search's seed (TPE's; --seed is the dataset's)"
    )
    add_flags(
        group,
        (
            *TUNE_SETTINGS,
            Flag("target_moe", metavar="P"),
            Flag("max_repeats", metavar="N"),
            Flag("target_moe_metric", metavar="METRIC"),
        ),
    )


def engine_of(config) -> str:
    """The engine command that runs `config` again: restful for a server, pipeline for an in-process engine (the
    throughput command's runs are on the engine API pattern)."""
    from ..engines import in_process_backends
    from ..states import LoadPattern

    if config.engine.backend not in in_process_backends():
        return "restful"
    return "throughput" if config.load.load_pattern == LoadPattern.ENGINE_API else "pipeline"


def report_tune(run, runner, engine: EngineCommand, report_path: str, exports: list[ExportRequest]) -> int:
    """Wait for the tune with a progress line, then print its trials, best point, front and deployment, and write its
    report and `exports` (a tune's are a sweep's); its exit code (SWEEP_EXIT_CODES_HELP)."""
    plan, history = run.plan, runner.history
    print(
        f"tune {plan.sweep_id}: {plan.tune.describe()}; {run.budget} trials over a space of "
        f"{tuning.space_size(plan.axes)} points ({', '.join(axis.name for axis in plan.axes)}), "
        f"{run.trials_before} done before",
        file=sys.stderr,
    )
    for leftover in run.leftover_servers:
        print(f"warning: {leftover}", file=sys.stderr)
    completed = wait_with_progress(run, lambda: _progress(run))
    runner.shutdown()
    saved = all([report_swept_run(each) for _, each in run.runs])  # a list: every run is said, not up to the first
    result = tune_result(plan, trials_of(history, plan.sweep_id), history.load())
    rerun = rerun_command(result, plan, engine)
    print_result(result, plan, rerun)
    progress = run.progress()
    print(
        f"tune {plan.sweep_id}: {progress.state}, {len(result.trials)}/{run.budget} trials, in {history.csv_path}",
        file=sys.stderr,
    )
    if run.stop_reason:
        print(f"The tune ended early: {run.stop_reason}.", file=sys.stderr)
    if progress.errors:
        print(f"error: {' '.join(progress.errors)}", file=sys.stderr)
    if len(result.trials) < run.budget and not run.stop_reason:
        print(f"resume with: {PROG} tune --resume {plan.sweep_id} --results {history.root}", file=sys.stderr)
    path = report_path or str(plan_path(history, plan.sweep_id).with_suffix(".html"))
    exports = [*exports, ExportRequest("report", path)]
    if not write_exports(exports, lambda: tune_subject(history, plan, progress.state, rerun)):
        saved = False
    return sweep_outcome(completed, progress.state, saved)


def tune_subject(history, plan, status: str, rerun: str) -> SweepSubject:
    """What a tune's report is of: its trials as a sweep's runs, with the command that runs its best point again."""
    history_runs = history.load()
    return SweepSubject(history, plan, history_runs, sweep_runs(history_runs, plan), status=status, rerun=rerun)


def print_result(result: TuneResult, plan, rerun: str) -> None:
    """The trials, the best point and its interval, the Pareto front, the space tried, the deployment commands and
    `rerun`, ours."""
    tune = result.tune
    if result.trials:
        print(f"Trials ({tune.describe()}):")
        print(shown(tuning.trial_table(result.trials, tune)).to_string(index=False))
    share = result.tried / result.space if result.space else math.nan
    print(f"Tried {result.tried} of the space's {result.space} points ({share:.0%}).")
    if result.best is None:
        print("No trial kept every bound: no best point." if result.trials else "No trial ran.")
        return
    print(f"Best: {tuning.describe_best(result.best, tune, describe_point(result.best.point))}")
    if not result.front.empty:
        print(
            f"Pareto front, {describe_column(tune.objective).title} against {describe_column(result.tightest).title}:"
        )
        print(shown(result.front).to_string(index=False))
    print("Deploy it:")
    for what, text in result.deploy:
        print(f"  {what}: {text}")
    print(f"  run it again: {rerun}")


def rerun_command(result: TuneResult, plan, engine: EngineCommand) -> str:
    """Our command that runs the best point again ("" without one); against the deployed server for a tune that
    started its servers."""
    if result.best_config is None:
        return ""
    config = copy.deepcopy(result.best_config)
    if plan.server_cmd:
        config.engine.base_url = f"http://127.0.0.1:{LMDEPLOY_PORT}"
    return command_for(engine, config, f"{PROG} {engine.name}")


def shown(table: pd.DataFrame) -> pd.DataFrame:
    """Numbers to 4 significant digits, for the terminal."""
    return table.apply(lambda column: column.map(lambda v: f"{v:.4g}" if isinstance(v, float) else v))


def _progress(run) -> str:
    progress = run.progress()
    current = run.runner.get(progress.current_run_id) if progress.current_run_id else None
    line = f"tune: {progress.ended}/{progress.total} trials done"
    if current is not None:
        return (
            line
            + f"; {progress.current}: {progress_line(current.state, current.phase, current.snapshot(), current.measurement.pace)}"
        )
    return line + (f"; {progress.current}" if progress.current else "")
