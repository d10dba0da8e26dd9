"""`python -m bench_core sweep pipeline DATASET MODEL [pipeline flags] --sweep NAME=V1,V2 [--sweep NAME2=...]
[--repeats K]`, and `python -m bench_core sweep --resume SWEEP_ID` for a sweep that stopped half way.

The engine command's flags give the settings every point starts from; each --sweep varies one setting
(two make a grid). The runs go through the same runner as `pipeline`, one at a time, into the history
with the sweep's id; each finished run also appends its row to --csv, as `pipeline` does. At the end a
compact table gives every point's mean and 95% interval over its repeats. Exit codes (SWEEP_EXIT_CODES_HELP):
0 all runs finished, 1 some failed or were partial, 2 bad input (nothing run), 130 interrupted (resumable).
"""

from __future__ import annotations

import argparse
import os
import sys

import pandas as pd

from .cli import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    _HelpFormatter,
    _Parser,
    _progress_line,
    add_pipeline_arguments,
    append_csv_row,
    check_writable,
    config_from_args,
    open_history,
    wait_with_progress,
)
from .cli_restful import add_restful_arguments, sweep_base_config
from .config import lmdeploy_hyperparams
from .errors import ConfigError
from .sweep import SWEEPABLE, SweepPlan, describe_point, new_sweep_id, parse_sweep_arg
from .sweep_results import mean_with_interval, point_statistics, sweep_runs
from .tables import describe_column

# The engine commands whose flags can set a sweep's base settings: name -> (help, add its arguments,
# build the RunConfig from them).
ENGINE_COMMANDS = {
    "pipeline": ("sweep the in-process benchmark (profile_pipeline_api.py's flags)", add_pipeline_arguments,
                 config_from_args),
    "restful": ("sweep an OpenAI-compatible server (profile_restful_api.py's flags), e.g. over request_rate",
                add_restful_arguments, sweep_base_config),
}
SWEEP_EXIT_CODES_HELP = """exit codes:
  0    every run finished with every request succeeded
  1    some run failed or was partial (some of its requests failed); resume re-runs those points
  2    bad input: a flag, the dataset, the model, or lengths beyond the model's context window
  130  interrupted (Ctrl-C); resumable"""
# The per-point table printed at the end: throughput, the latency a user waits, decode speed.
TABLE_METRICS = ("output_throughput", "p99_ttft_ms", "mean_tpot_ms")


def add_sweep_parser(commands: argparse._SubParsersAction) -> None:
    sweep = commands.add_parser(
        "sweep",
        formatter_class=_HelpFormatter,
        epilog=SWEEP_EXIT_CODES_HELP,
        help="run one benchmark per value of one or two settings, with repeats",
        description=(
            "Run an engine command once per point of a sweep: one setting over its values, or two as a\n"
            "grid, each point repeated --repeats times. The other settings come from the command's flags.\n\n"
            "example: python -m bench_core sweep pipeline builtin:sharegpt builtin:smollm2-135m "
            "--backend transformers -n 32 --stream-output --sweep concurrency=1,4,16 --repeats 3\n"
            "resume a stopped sweep: python -m bench_core sweep --resume SWEEP_ID"
        ),
    )
    sweep.add_argument("--resume", metavar="SWEEP_ID",
                       help="run what a stopped sweep has not finished yet, with its saved settings")
    sweep.add_argument("--results", dest="resume_results", metavar="DIR",
                       default=os.environ.get("BENCH_STUDIO_RESULTS", "results"),
                       help="with --resume: the history folder the sweep ran in; env BENCH_STUDIO_RESULTS")
    engines = sweep.add_subparsers(dest="engine_command", parser_class=_Parser, metavar="{pipeline,restful}")
    for name, (help_text, add_arguments, _) in ENGINE_COMMANDS.items():
        command = engines.add_parser(name, formatter_class=_HelpFormatter, help=help_text, epilog=SWEEP_EXIT_CODES_HELP)
        add_arguments(command)
        swept = command.add_argument_group("sweep")
        swept.add_argument("--sweep", action="append", required=True, metavar="NAME=V1,V2",
                           help=f"a setting and its values; give --sweep twice for a grid. Sweepable: "
                                f"{', '.join(SWEEPABLE)}")
        swept.add_argument("--repeats", type=int, default=1, help="runs per point (2 or more give a spread)")


def run_sweep(args: argparse.Namespace) -> int:
    from .runner import Runner
    from .sweep_runner import resume_sweep, start_sweep

    if args.resume and args.engine_command:
        raise ConfigError("Give --resume SWEEP_ID on its own: a resumed sweep keeps the settings it was started with.")
    if args.resume:
        runner = Runner(open_history(args.resume_results))
        sweep = resume_sweep(runner, args.resume)
        csv_path = ""
    elif args.engine_command:
        _, _, build_config = ENGINE_COMMANDS[args.engine_command]
        axes = tuple(parse_sweep_arg(text) for text in args.sweep)
        plan = SweepPlan(new_sweep_id(), build_config(args), axes, args.repeats)
        csv_path = getattr(args, "csv", "")  # LMDeploy's pipeline CSV; a restful sweep keeps to the history
        runner = Runner(open_history(args.results))
        check_writable(runner.history, csv_path)
        sweep = start_sweep(runner, plan)  # raises ConfigError naming every impossible point, before any run
    else:
        raise ConfigError("Choose an engine command (pipeline DATASET MODEL ... --sweep NAME=V1,V2) "
                          "or --resume SWEEP_ID.")
    plan, history = sweep.plan, runner.history
    print(f"sweep {plan.sweep_id}: {sweep.total} runs ({len(plan.grid())} points x {plan.repeats} repeats), "
          f"{sweep.total - sweep.finished_before} to run", file=sys.stderr)
    interrupted = not wait_with_progress(sweep, lambda: _sweep_progress_line(sweep))
    runner.shutdown()
    saved = True
    for _, run in sweep.runs:
        for warning in run.warnings:
            print(f"warning: {run.run_id}: {warning}", file=sys.stderr)
        if run.save_error:
            print(f"error: run {run.run_id}: {run.save_error}", file=sys.stderr)
            saved = False
        if run.state == "finished" and csv_path:
            saved &= append_csv_row(csv_path, lambda: run.profiler.save_csv(csv_path, lmdeploy_hyperparams(run.config)))

    progress = sweep.progress()
    if not interrupted and progress.finished == 0 and all(run.profiler is None and run.user_error
                                                          for _, run in sweep.runs):
        print(f"error: {' '.join(progress.errors)}", file=sys.stderr)  # e.g. a dataset that is not there
        return EXIT_BAD_INPUT
    runs = sweep_runs(history.load(), plan)
    if not runs.empty:
        print(f"Sweep {plan.sweep_id}: mean ± 95% CI half-width over each point's finished runs")
        print(point_table(runs, plan).to_string(index=False))
    print(f"sweep {plan.sweep_id}: {progress.state}, {progress.finished}/{progress.total} runs finished, "
          f"in {history.csv_path}", file=sys.stderr)
    if progress.message:
        print(progress.message, file=sys.stderr)
    if progress.finished < progress.total:
        print(f"resume with: python -m bench_core sweep --resume {plan.sweep_id} --results {history.root}",
              file=sys.stderr)
    if interrupted or progress.state == "cancelled":
        return EXIT_INTERRUPTED
    return EXIT_OK if progress.state == "finished" and saved else EXIT_FAILED


def point_table(runs: pd.DataFrame, plan: SweepPlan) -> pd.DataFrame:
    """One row per point that has a finished run: its settings, its run count, and each table metric as
    "mean ± half-width" ("-" where the runs have no value, e.g. TTFT without --stream-output)."""
    statistics = point_statistics(runs, plan, TABLE_METRICS)
    rows = []
    for values in plan.grid():
        label = describe_point(values)
        of_point = statistics[statistics["point"] == label].set_index("metric")
        if of_point.empty:
            continue
        cells = {metric: mean_with_interval(of_point.loc[metric]) if metric in of_point.index else "-"
                 for metric in TABLE_METRICS}
        rows.append({**values, "runs": int(of_point["n"].max()),
                     **{describe_column(metric).title: cell for metric, cell in cells.items()}})
    return pd.DataFrame(rows)


def _sweep_progress_line(sweep) -> str:
    progress = sweep.progress()
    run = sweep.runner.get(progress.current_run_id) if progress.current_run_id else None
    line = f"sweep: {progress.ended}/{progress.total} runs done"
    return line + (f"; {progress.current}: {_progress_line(run)}" if run is not None else "")
