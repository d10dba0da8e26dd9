"""`python -m bench_core compare RUN_OR_GROUP ... [--fail-on-regression [METRIC[=TOLERANCE] ...]]`: the History page's
comparison in a terminal, a pull-request comment or a script, and a regression gate for CI.

The comparison and the gate are views.regression's, on the rows the History API loads. What cannot be compared as
asked (a name that chooses no run, a metric the catalog does not have, a malformed tolerance) is one line on stderr
and exit code 2; a regression found is exit code 1 (COMPARE_EXIT_CODES_HELP).
"""

from __future__ import annotations

import argparse
import sys

from ..exports import ComparisonSubject, Scope
from ..measure.catalog import COMPARED_COLUMNS, find_column
from .common import (
    EXIT_FAILED,
    EXIT_OK,
    Command,
    HistoryRequestError,
    add_export_flag,
    add_results_flag,
    check_export_paths,
    close_match,
    column_names,
    existing_history,
    write_exports,
)

FORMATS = ("table", "markdown", "json")  # the first is the default
COMPARE_EXIT_CODES_HELP = """exit codes:
  0    compared; with --fail-on-regression, no gated metric regressed
  1    --fail-on-regression: a gated metric regressed (each regression is listed); or an --export
       could not be written (why is on stderr)
  2    bad input: a flag, a run id, sweep id or label the history does not have, a metric the
       catalog does not have, a malformed tolerance, a gated metric the baseline or the others did
       not measure, a results folder that is not there
  130  interrupted (Ctrl-C)"""


def _metric(name: str) -> str:
    """A history column that holds a catalog metric; an argparse type."""
    if find_column(name) is None:
        raise argparse.ArgumentTypeError(
            f"'{name}' is not a metric{close_match(name, COMPARED_COLUMNS)}; metrics are history columns "
            "(mean_ttft_ms, p99_ttft_ms, output_throughput, ...)"
        )
    return name


def _metrics(text: str) -> tuple[str, ...]:
    return tuple(_metric(name) for name in column_names(text))


def _gate(text: str):
    """METRIC or METRIC=TOLERANCE (a relative change in %: 5% or 5); an argparse type."""
    from ..views.regression import Gate
    from ..views.tables import describe_column

    name, given, tolerance_text = text.partition("=")
    metric = _metric(name.strip())
    if not given:
        return Gate(metric)
    number = tolerance_text.strip().removesuffix("%").strip()
    try:
        tolerance = float(number)
    except ValueError:
        tolerance = -1.0
    if not 0 <= tolerance < float("inf"):
        raise argparse.ArgumentTypeError(
            f"'{text}': the tolerance is a relative change in % (0 or more), as in {metric}=5%"
        )
    if describe_column(metric).larger_is_better is None:
        raise argparse.ArgumentTypeError(
            f"'{text}': neither direction of {metric} is better, so no change of it is a regression"
        )
    return Gate(metric, tolerance / 100)


class CompareCommand(Command):
    name = "compare"
    help = "compare runs against a baseline as the History page does, beyond noise; a CI regression gate"
    description = (
        "The History page's comparison of runs: each run's value of each metric and its change against the\n"
        "baseline's in %, marked * where it is beyond the run-to-run noise (Welch's t-test over repeats).\n"
        "RUN_OR_GROUP is a run id, a sweep id (its runs) or a label (the runs with it). Runs named by one\n"
        "RUN_OR_GROUP that share every setting that differs are repeats of one setup; two groups of the same\n"
        "settings (the main branch's runs and a pull request's) are two setups.\n"
        "The baseline is the oldest run of --baseline (a RUN_OR_GROUP; added to the runs if not among them),\n"
        "by default of the first RUN_OR_GROUP.\n\n"
        "--fail-on-regression exits 1 when a metric got worse than the baseline's setup (the catalog says which\n"
        "direction is better): METRIC, beyond the noise of the repeats (each setup needs 2 runs or more);\n"
        "METRIC=TOLERANCE, when its mean is worse by more than TOLERANCE % (5% or 5). Without a metric it\n"
        "checks every metric shown against noise. Put it after the runs.\n\n"
        "examples:\n"
        "  python -m bench_core compare 20261201-104433-ef6e 20261202-091500-a1b2\n"
        "  python -m bench_core compare main pr-123 --format markdown --metrics p99_ttft_ms,output_throughput\n"
        "  python -m bench_core compare main pr-123 --fail-on-regression p99_ttft_ms=5% output_throughput"
    )
    epilog = COMPARE_EXIT_CODES_HELP

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "names", nargs="+", metavar="RUN_OR_GROUP", help="a run id, a sweep id or a label (the runs with it)"
        )
        parser.add_argument(
            "--baseline",
            metavar="RUN_OR_GROUP",
            help="compare against the oldest run of this RUN_OR_GROUP; None: of the first RUN_OR_GROUP",
        )
        parser.add_argument(
            "--metrics",
            type=_metrics,
            metavar="A,B,...",
            help="the metrics to compare, comma-separated history columns; None: those the History page compares "
            "that any of the runs measured",
        )
        parser.add_argument(
            "--format",
            choices=FORMATS,
            default=FORMATS[0],
            help="table: for a terminal; markdown: for a pull-request comment; json: for scripts",
        )
        parser.add_argument(
            "--fail-on-regression",
            nargs="*",
            type=_gate,
            metavar="METRIC[=TOLERANCE]",
            help="exit 1 when a metric got worse than the baseline's: beyond noise, or by more than TOLERANCE %%; None: no check",
        )
        add_results_flag(parser, "folder of the run history")
        add_export_flag(parser, "of the runs compared, against the baseline")

    def run(self, args: argparse.Namespace) -> int:
        from ..views import regression, report

        check_export_paths(args.export, Scope.COMPARISON)
        history = existing_history(args.results)
        table = history.load()
        names = list(dict.fromkeys(args.names))
        baseline_source = args.baseline or names[0]
        if baseline_source not in names:
            names.insert(0, baseline_source)
        rows, sources, unknown = regression.named_runs(table, names)
        if unknown:
            raise HistoryRequestError(f"the history in {args.results} has no run, sweep or label {', '.join(unknown)}")
        if len(rows) < 2:
            raise HistoryRequestError(f"{names[0]} is one run: compare needs two runs or more")
        compared = regression.compared(rows, sources, baseline_source)
        gates = args.fail_on_regression
        metrics = list(args.metrics or report.measured_metrics(compared.runs))
        if gates == []:  # the flag alone: every metric shown that both sides measured, against noise
            every = [regression.Gate(metric) for metric in metrics]
            one_sided = set(regression.unmeasured(compared, every))
            gates = [gate for gate in every if gate.metric not in one_sided]
        metrics += [gate.metric for gate in gates or () if gate.metric not in metrics]
        unmeasured = regression.unmeasured(compared, gates or ())
        if unmeasured:
            raise HistoryRequestError(
                f"nothing to gate on: the baseline's runs or the others have no {', '.join(unmeasured)} "
                "(a TTFT needs streamed runs)"
            )
        found = regression.regressions(compared, gates) if gates is not None else []
        if args.format == "json":
            sys.stdout.write(regression.comparison_json(compared, metrics, gates, found))
        else:
            sys.stdout.write(regression.comparison_text(compared, metrics, args.format))
            if gates is not None:
                sys.stdout.write("\n" + regression.gate_text(found, gates, args.format))
        unjudged = regression.unjudged(compared, gates or ())
        if unjudged:
            print(
                f"warning: not judged against noise, so never a regression: {', '.join(unjudged)}; that needs the "
                "baseline's setup and another run twice or more (a tolerance, METRIC=5%, checks single runs)",
                file=sys.stderr,
            )
        written = not args.export or write_exports(args.export, lambda: comparison_subject(history, rows, compared))
        return EXIT_FAILED if found or not written else EXIT_OK


def comparison_subject(history, rows, compared) -> ComparisonSubject:
    """What the exports of a comparison are of: the rows chosen, their request tables by the names the comparison
    gives them, against its baseline."""
    from ..store.run_parts import request_tables
    from ..views.report import RUN

    found, missing = request_tables(history, compared.runs, compared.runs[RUN])
    return ComparisonSubject(history, rows, found, missing, compared.baseline)
