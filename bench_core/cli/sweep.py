"""`python -m bench_core sweep pipeline DATASET MODEL [pipeline flags] --sweep NAME=V1,V2 [--sweep NAME2=...]
[--repeats K] [--ray-address ADDRESS|auto [--cpus-per-point N] [--retries N]]`, and `python -m bench_core sweep
--resume SWEEP_ID` for a sweep that stopped half way.

The engine command's flags give the settings every point starts from; each --sweep varies one setting
(two make a grid). The runs go through the same runner as `pipeline`, one at a time, into the history
with the sweep's id; each finished run also appends its row to --csv, as `pipeline` does. With --ray-address
the runs go to a Ray cluster instead (sweep_cluster: one actor per engine setting, runs side by side,
recorded here); the end then lists where each ran. At the end a compact table gives every point's mean
and 95% interval over its repeats. Exit codes (SWEEP_EXIT_CODES_HELP):
0 all runs finished, 1 some failed or were partial, 2 bad input (nothing run), 130 interrupted (resumable).

With --target-moe P each point runs until the 95% interval of its --target-moe-metric (default output throughput) is
within P of its mean, or --max-repeats stops it (sweep.precision); the end says which points reached the target.

`sweep restful --server-cmd TEMPLATE` starts a server for every run (sweep.server): {port} is a free port, every
other {name} a server setting from --sweep name=V1,V2 or --server-setting name=VALUE. `--find-max request_rate|
max_concurrency` searches each point for the highest load at which --goodput-target of the requests meet the
--slo-* thresholds (sweep.find_max) and prints it, with the runs that show it.
"""

from __future__ import annotations

import argparse
import math
import sys
from functools import partial

import pandas as pd

from ..config import Part, check_values, format_value, of_part, setting
from ..csvstore import append_row
from ..errors import ConfigError
from ..exports import Scope, SweepSubject
from ..measure.catalog import NOT_REPORTED, SWEPT_COLUMNS, acceptance_by_position
from ..measure.draft_length import MODEL_NOTE, mean_rates
from ..measure.stats import MIN_INTERVAL_RUNS
from ..states import RunState
from ..sweep import find_max
from ..sweep.plan import SWEEPABLE, SweepPlan, capacity_search, describe_point, plan_for
from ..sweep.precision import describe_target
from ..sweep.report import request_tables, speedup_blocks
from ..sweep.results import (
    CACHE_START,
    DRAFT_AXIS,
    POINT,
    describe_draft_advice,
    draft_length_advice,
    mean_with_interval,
    point_statistics,
    precision_summary,
    sweep_runs,
)
from ..views.report import Note, Table
from ..views.tables import describe_column
from .common import (
    AGAINST_NO_SPECULATION,
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_OK,
    SWEEP_EXIT_CODES_HELP,
    Command,
    EngineCommand,
    Flag,
    HelpFormatter,
    Parser,
    add_against_no_speculation_flag,
    add_export_flag,
    add_flags,
    add_report_flag,
    add_results_flag,
    add_resume_credential_flags,
    add_server_flags,
    append_csv_row,
    check_export_paths,
    check_report_path,
    check_writable,
    open_history,
    precision_of,
    progress_line,
    report_swept_run,
    resume_credentials,
    sweep_outcome,
    wait_with_progress,
    with_report,
    write_exports,
)

CLUSTER_SETTINGS = ("cpus_per_point", "retries")
# The per-point table printed at the end: throughput, the latency a user waits, decode speed.
TABLE_METRICS = ("output_throughput", "p99_ttft_ms", "mean_tpot_ms")


class SweepCommand(Command):
    """`sweep ENGINE_COMMAND ...`: the engine commands it is given (the package's main gives it pipeline's and
    restful's) set the settings every point starts from."""

    name = "sweep"
    help = "run one benchmark per value of one or two settings, with repeats"
    description = (
        "Run an engine command once per point of a sweep: one setting over its values, or two as a\n"
        "grid, each point repeated --repeats times. The other settings come from the command's flags.\n\n"
        "example: python -m bench_core sweep pipeline builtin:sharegpt builtin:smollm2-135m "
        "--backend transformers -n 32 --stream-output --sweep concurrency=1,4,16 --repeats 3\n"
        "resume a stopped sweep: python -m bench_core sweep --resume SWEEP_ID"
    )
    epilog = SWEEP_EXIT_CODES_HELP

    def __init__(self, engine_commands: tuple[EngineCommand, ...]):
        self.engine_commands = {command.name: command for command in engine_commands}

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--resume",
            metavar="SWEEP_ID",
            help="run what a stopped sweep has not finished yet, with its saved settings",
        )
        add_results_flag(
            parser, "with --resume: the history folder the sweep ran in", dest="resume_results", metavar="DIR"
        )
        add_resume_credential_flags(parser, "sweep")
        add_cluster_flags(parser.add_argument_group("on a Ray cluster (with --resume)"))
        add_report_flag(parser, "once the resumed sweep ends", dest="resume_report")
        add_export_flag(parser, "once the resumed sweep ends", dest="resume_export")
        engines = parser.add_subparsers(
            dest="engine_command", parser_class=Parser, metavar="{" + ",".join(self.engine_commands) + "}"
        )
        for name, engine in self.engine_commands.items():
            command = engines.add_parser(
                name, formatter_class=HelpFormatter, help=engine.sweep_help, epilog=self.epilog
            )
            engine.add_arguments(command)
            swept = command.add_argument_group("sweep")
            swept.add_argument(
                "--sweep",
                action="append",
                default=[],
                metavar="NAME=V1,V2",
                help=f"a setting and its values; give --sweep twice for a grid. Sweepable: "
                f"{', '.join(SWEEPABLE)}" + (", and the fields of --server-cmd" if engine.serves else ""),
            )
            add_flags(
                swept,
                (
                    Flag("repeats", metavar="K"),
                    Flag("target_moe", metavar="P"),
                    Flag("max_repeats", metavar="N"),
                    Flag("target_moe_metric", metavar="METRIC", choices=SWEPT_COLUMNS),
                ),
            )
            if engine.serves:
                servers = command.add_argument_group("a server per run")
                add_server_flags(servers)
                add_against_no_speculation_flag(
                    servers,
                    "run every point on --baseline-server-cmd (the same server without speculation) and on "
                    "--server-cmd, the same prompts on each, and print per load TPOT's and the other per-request "
                    "metrics' ratios with their 95%% paired intervals, and the load at which speculation stops paying",
                )
                servers.add_argument(
                    "--baseline-server-cmd",
                    metavar="TEMPLATE",
                    default="",
                    help="with --against-no-speculation: the server without speculation, a template as --server-cmd",
                )
                add_find_max_flags(command.add_argument_group("the highest load within the SLO"))
            # SUPPRESS: unset here, the values given before the engine command (or their defaults) stand.
            add_cluster_flags(command.add_argument_group("on a Ray cluster"), default=argparse.SUPPRESS)

    def run(self, args: argparse.Namespace) -> int:
        from ..run.runner import Runner
        from ..sweep.driver import resume_sweep, start_sweep

        if args.resume and args.engine_command:
            raise ConfigError(
                "Give --resume SWEEP_ID on its own: a resumed sweep keeps the settings it was started with."
            )
        report_path = args.resume_report if args.resume else getattr(args, "report", "")
        check_values(**sweep_setting_values(args))
        check_report_path(report_path)
        requested = args.resume_export if args.resume else getattr(args, "export", None)
        check_export_paths(requested, Scope.SWEEP)
        launch = cluster_launch(args)
        if args.resume:
            runner = Runner(open_history(args.resume_results))
            sweep = resume_sweep(runner, args.resume, launch, resume_credentials(args))
            csv_path = ""
        elif args.engine_command:
            engine = self.engine_commands[args.engine_command]
            plan = build_plan(args, engine)
            csv_path = engine.sweep_csv_path(args)
            runner = Runner(open_history(args.results))
            check_writable(runner.history, csv_path)
            sweep = start_sweep(
                runner, plan, launch
            )  # raises ConfigError naming every impossible point, before any run
        else:
            raise ConfigError(
                "Choose an engine command (pipeline DATASET MODEL ... --sweep NAME=V1,V2) or --resume SWEEP_ID."
            )
        code = report_sweep(sweep, runner, csv_path)
        exports = with_report(requested, report_path)
        if exports and not write_exports(exports, partial(sweep_subject, runner.history, sweep)) and code == EXIT_OK:
            return EXIT_FAILED
        return code


def sweep_subject(history, sweep) -> SweepSubject:
    """What a sweep's exports are of, once it ended: its finished runs as the Sweep page shows them."""
    history_runs = history.load()
    return SweepSubject(
        history, sweep.plan, history_runs, sweep_runs(history_runs, sweep.plan), status=sweep.progress().state
    )


def sweep_setting_values(args: argparse.Namespace) -> dict[str, object]:
    """The sweep's own settings the parsed `args` hold, by name (an engine command's flags are its runs')."""
    flags = (Flag(declared.name) for declared in of_part(Part.SWEEP))
    return {flag.name: getattr(args, flag.destination) for flag in flags if hasattr(args, flag.destination)}


def add_find_max_flags(group) -> None:
    group.add_argument(
        "--find-max",
        choices=find_max.SEARCHABLE,
        default=None,
        help="search for the highest value of this load setting at which --goodput-target of the "
        "requests meet the --slo-* thresholds: double from --find-max-start until a run misses "
        "the target, then bisect",
    )
    add_flags(
        group,
        (
            Flag("goodput_target", metavar="FRACTION"),
            Flag("find_max_start", metavar="LOAD"),
            Flag("find_max_precision", metavar="FRACTION"),
            Flag(
                "find_max_limit",
                metavar="LOAD",
                help="with --find-max: the highest load probed; default --num-prompts for max_concurrency, "
                f"{find_max.LIMIT_FACTOR} x the start for request_rate",
            ),
            Flag("find_max_probes", metavar="N"),
            Flag("find_max_time_s", metavar="S"),
        ),
    )


def build_plan(args: argparse.Namespace, engine: EngineCommand) -> SweepPlan:
    """The plan the command line describes (sweep.plan.plan_for, as the Sweep page builds it from its widgets);
    ConfigError for a server or search setting that cannot work."""
    precision = precision_of(args)  # before the engine's settings, which may ask the server
    base = engine.build_config(args)
    search = (
        capacity_search(
            args.find_max,
            base,
            args.find_max_start,
            args.find_max_precision,
            args.goodput_target,
            args.find_max_limit,
            args.find_max_probes,
            args.find_max_time,
        )
        if getattr(args, "find_max", None)
        else None
    )
    return plan_for(
        base,
        args.sweep,
        args.repeats,
        getattr(args, "server_cmd", ""),
        getattr(args, "server_setting", []),
        getattr(args, "server_start_timeout", setting("server_start_timeout_s").default),
        search,
        precision,
        against_no_speculation=getattr(args, AGAINST_NO_SPECULATION, False),
        baseline_server_cmd=getattr(args, "baseline_server_cmd", ""),
    )


def add_cluster_flags(group, default=None) -> None:
    """--ray-address, --cpus-per-point and --retries; `default` replaces each flag's own default."""

    def chosen(own):
        return own if default is None else default

    group.add_argument(
        "--ray-address",
        metavar="ADDRESS",
        default=chosen(""),
        help="run the points on the Ray cluster at ADDRESS (host:port, ray://host:port, auto: the "
        "cluster this machine belongs to, local: a new one here); needs Ray "
        "(pip install -r requirements-cluster.txt)",
    )
    add_flags(group, (Flag(name, metavar="N", default=chosen(setting(name).default)) for name in CLUSTER_SETTINGS))


def cluster_launch(args: argparse.Namespace):
    """How the sweep's runs are run: sweep_driver's default (here) without --ray-address, else on the cluster
    (connected now: Ray missing or the cluster unreachable is a ConfigError before anything is saved)."""
    from ..sweep.cluster import launch_for

    if not args.ray_address and (args.cpus_per_point != 1 or args.retries):
        raise ConfigError("--cpus-per-point and --retries apply to sweeps on a Ray cluster: add --ray-address.")
    return launch_for(args.ray_address, args.cpus_per_point, args.retries)


def report_sweep(sweep, runner, csv_path: str) -> int:
    """Wait for the sweep with a progress line, append each finished run's row to the CSV at `csv_path` (if any),
    print the per-point table and how the sweep ended; its exit code."""
    plan, history = sweep.plan, runner.history
    if plan.find_max:
        print(
            f"sweep {plan.sweep_id}: searching {plan.find_max.setting} at {len(plan.grid())} point(s)", file=sys.stderr
        )
    elif plan.precision:
        print(
            f"sweep {plan.sweep_id}: {len(plan.grid())} points, each repeated until "
            f"{describe_target(plan.precision, plan.repeats)}: at most {sweep.total} runs, {sweep.finished_before} "
            "finished before",
            file=sys.stderr,
        )
    else:
        print(
            f"sweep {plan.sweep_id}: {sweep.total} runs ({len(plan.grid())} points x {plan.repeats} repeats), "
            f"{sweep.total - sweep.finished_before} to run",
            file=sys.stderr,
        )
    for leftover in sweep.leftover_servers:
        print(f"warning: {leftover}", file=sys.stderr)
    completed = wait_with_progress(sweep, lambda: _sweep_progress_line(sweep))
    runner.shutdown()
    saved = True
    for _, run in sweep.runs:
        saved &= report_swept_run(run)
        # The record's LMDeploy row: a run on a cluster has no profiler here.
        if run.state == RunState.FINISHED and csv_path:
            saved &= append_csv_row(csv_path, partial(append_row, csv_path, run.record.lmdeploy_columns))

    progress = sweep.progress()
    if (
        completed
        and progress.finished == 0
        and all(not run.measurement.measured and run.user_error for _, run in sweep.runs)
    ):
        # e.g. a dataset that is not there; never an empty line, whatever stopped the sweep
        reason = " ".join(progress.errors) or "the sweep stopped before any of its runs started, and gave no reason."
        print(f"error: {reason}", file=sys.stderr)
        return EXIT_BAD_INPUT
    states = sweep.point_states()  # a cluster sweep: where each run ran
    if states:
        from ..sweep.cluster import states_table

        print(states_table(states).drop(columns="progress").to_string(index=False), file=sys.stderr)
    runs = sweep_runs(history.load(), plan)
    if plan.find_max:
        print_capacities(sweep.capacities, plan)
    elif not runs.empty:
        print(
            f"Sweep {plan.sweep_id}: mean [95% CI, within the metric's bounds] over each point's finished runs; "
            f"(range lowest..highest run) with fewer than {MIN_INTERVAL_RUNS} runs, too few for an interval"
        )
        print(point_table(runs, plan).to_string(index=False))
        if plan.precision:
            print(precision_summary(plan, history.load()))
        advised = draft_length_advice(runs, plan)
        for load, advice in advised:
            print(describe_draft_advice(load, advice))
        if any(advice for _, advice in advised):
            print(MODEL_NOTE)
        print_speedup_by_load(history, runs, plan)
    unsaved = sum(1 for _, run in sweep.runs if run.measurement.save_error)
    where = f"in {history.csv_path}" + (
        f", except {unsaved} that could not be saved there (said above)" if unsaved else ""
    )
    print(
        f"sweep {plan.sweep_id}: {progress.state}, {progress.finished}/{progress.total} runs finished, {where}",
        file=sys.stderr,
    )
    if progress.message:
        print(progress.message, file=sys.stderr)
    if progress.finished < progress.total:
        print(
            f"resume with: python -m bench_core sweep --resume {plan.sweep_id} --results {history.root}",
            file=sys.stderr,
        )
    return sweep_outcome(completed, progress.state, saved)


def print_speedup_by_load(history, runs: pd.DataFrame, plan: SweepPlan) -> None:
    """For a sweep with --against-no-speculation: per load, the ratios with speculation over without on the same
    prompts, and where speculation stopped paying (the report's blocks, less the chart)."""
    if plan.speculation_pairing is None:
        return
    for block in reversed(speedup_blocks(runs, plan, request_tables(history, runs))):
        if isinstance(block, Table):
            print(f"{block.title}:")
            print(block.frame.to_string(index=False))
        elif isinstance(block, Note):
            print(block.text)


def print_capacities(capacities, plan: SweepPlan) -> None:
    """Each point's probes, then the highest load that met the target and the runs at it and just above it."""
    search = plan.find_max
    goal = f"{search.target:.0%} of requests within the SLO"
    for capacity in capacities:
        where = f" at {describe_point(capacity.point)}" if capacity.point else ""
        if capacity.probes:
            print(f"Probes of {search.setting}{where} ({goal}):")
            print(probe_table(capacity.probes).to_string(index=False))
        best, lowest_missed = capacity.found, capacity.lowest_missed
        missed = (
            ""
            if lowest_missed is None
            else (f"; {lowest_missed:g} missed it ({', '.join(capacity.runs_at(lowest_missed))})")
        )
        before = " before the search stopped" if capacity.error else ""
        if best is None:
            print(f"No {search.setting}{where} met the target ({goal}){missed}{before}.")
        else:
            limit = (
                " (so far: the search stopped before its end)"
                if capacity.error
                else ""
                if lowest_missed is not None
                else f" (the highest probed, --find-max-limit {search.limit:g})"
            )
            print(
                f"Highest {search.setting}{where} meeting {goal}: {best:g}{limit}, "
                f"shown by {', '.join(capacity.runs_at(best))}{missed}."
            )
        if capacity.error:
            print(f"error: {capacity.error}", file=sys.stderr)


def probe_table(probes: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "load": p["load"],
                "met": "yes" if p["met"] else "no",
                "SLO attainment": "-" if math.isnan(p["attainment"]) else f"{p['attainment']:.2f}",
                "run": p["run_id"],
                "stopped early": p["stopped_early"] or "-",
            }
            for p in probes
        ]
    )


def point_table(runs: pd.DataFrame, plan: SweepPlan) -> pd.DataFrame:
    """One row per point that has a finished run: its settings, its run count, and each table metric as
    "mean [95% CI]" or "mean (range)" (mean_with_interval; "-" where the runs have no value, e.g. TTFT without
    --stream-output); a sweep that decodes speculatively adds the acceptance, "not reported" where the engine
    reported none."""
    speculative = plan.speculative_columns
    metrics = (*TABLE_METRICS, *speculative)
    statistics = point_statistics(runs, plan, metrics)
    advised = dict(draft_length_advice(runs, plan))
    rows = []
    for values in plan.grid():
        label = describe_point(values)
        of_point = statistics[statistics["point"] == label].set_index("metric")
        if of_point.empty:
            continue
        cells = {
            metric: mean_with_interval(of_point.loc[metric])
            if metric in of_point.index
            else NOT_REPORTED
            if metric in speculative
            else "-"
            for metric in metrics
        }
        row = {
            **{name: format_value(value) if value is None else value for name, value in values.items()},
            "runs": int(of_point["n"].max()),
            "prefix cache at start": of_point[CACHE_START].iloc[0],
            **{describe_column(metric).title: cell for metric, cell in cells.items()},
        }
        if plan.speculative:
            row[POSITIONS_COLUMN] = _positions_cell(runs[runs[POINT] == label])
        if DRAFT_AXIS in values:
            advice = advised.get(describe_point({k: v for k, v in values.items() if k != DRAFT_AXIS}))
            row[ADVISED_COLUMN] = "advised" if advice is not None and advice.advised == values[DRAFT_AXIS] else ""
        rows.append(row)
    return pd.DataFrame(rows)


POSITIONS_COLUMN = "Acceptance by draft position"
ADVISED_COLUMN = "draft length"


def _positions_cell(runs: pd.DataFrame) -> str:
    rates = mean_rates([acceptance_by_position(row) for row in runs.to_dict("records")])
    return NOT_REPORTED if rates is None else ", ".join(f"{rate:.0%}" for rate in rates)


def _sweep_progress_line(sweep) -> str:
    progress = sweep.progress()
    run = sweep.runner.get(progress.current_run_id) if progress.current_run_id else None
    line = f"sweep: {progress.ended}/{progress.total} runs done"
    if run is not None:
        where = progress_line(run.state, run.phase, run.snapshot(), run.measurement.pace)
        return line + f"; {progress.current}: {where}"
    return line + (f"; {progress.current}" if progress.current else "")
