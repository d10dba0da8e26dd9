"""The headless CLI: `python -m bench_core pipeline DATASET MODEL [flags]`, `throughput`, `restful`, `sweep`,
`tune`, `doctor`, `history`, `compare` and helpers.

One module per subcommand (pipeline, throughput, restful, sweep, tune, doctor, history, compare, model_path), each a Command that adds its flags and
runs; `common` holds what they share, and they import nothing of each other. This module is the one
dispatch: it builds the parser from the commands and runs the one chosen.
Bad input is one line on stderr and exit code 2: found in the flags, nothing is written; found while
loading (a dataset, a model), the run is recorded as failed. common.EXIT_CODES_HELP says what each code means.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import typing
from collections.abc import Mapping

from .. import __version__
from ..errors import BenchError
from ..terminal import shown_streams
from .common import EXIT_BAD_INPUT, Command, Parser, interrupted

PROG = "python -m bench_core"  # the name usage lines give the CLI; the installed command passes its own


def commands() -> tuple[Command, ...]:
    """The subcommands, in the order --help lists them. Imported here, not at the top, so that `python -m
    bench_core` starts at once and Ctrl-C while their libraries load is reported like any other."""
    from .compare import CompareCommand
    from .doctor import DoctorCommand
    from .history import HistoryCommand
    from .model_path import ModelPathCommand
    from .pipeline import PipelineCommand
    from .restful import RestfulCommand
    from .sweep import SweepCommand
    from .throughput import ThroughputCommand
    from .tune import TuneCommand

    pipeline, throughput, restful = PipelineCommand(), ThroughputCommand(), RestfulCommand()
    return (
        pipeline,
        throughput,
        SweepCommand((pipeline, throughput, restful)),
        TuneCommand((pipeline, throughput, restful)),
        restful,
        DoctorCommand(),
        HistoryCommand(),
        CompareCommand(),
        ModelPathCommand(),
    )


def build_parser(
    chosen: tuple[Command, ...] | None = None,
    prog: str = PROG,
    epilog: str | None = None,
    run_before: Mapping[str, str] | None = None,
) -> argparse.ArgumentParser:
    """The CLI's parser; `run_before`: subcommands (name: help line) that the caller runs itself before any
    parsing (bench-studio's `app`), listed among the choices and in --help all the same."""
    parser = Parser(prog=prog, description="LLM Bench Studio, headless.", epilog=epilog)
    parser.add_argument("--version", action="version", version=f"LLM Bench Studio {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for name, help_line in (run_before or {}).items():
        subparsers.add_parser(name, help=help_line)
    for command in chosen or commands():
        command.add_parser(subparsers)
    return parser


def _quiet_libraries() -> None:
    """Keep the terminal for our table: no weight-loading bars or tokenizer length warnings."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main(
    argv: list[str] | None = None,
    prog: str = PROG,
    epilog: str | None = None,
    run_before: Mapping[str, str] | None = None,
) -> int:
    """Run the command `argv` names (default: this process's arguments); its exit code. `run_before`: as
    build_parser's."""
    _quiet_libraries()
    with shown_streams():  # every message: outside text in it shown, its credentials masked
        return _run(argv, prog, epilog, run_before)


def _run(argv: list[str] | None, prog: str, epilog: str | None, run_before: Mapping[str, str] | None) -> int:
    # SIGTERM (`timeout`, `kill`, a scheduler ending a job) stops a command as Ctrl-C does: the run recorded as
    # cancelled with what it measured, a sweep's server stopped, exit 130. Its default would end the process at
    # once, with none of that.
    on_main_thread = threading.current_thread() is threading.main_thread()
    if on_main_thread:
        previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        chosen = commands()
        args = build_parser(chosen, prog, epilog, run_before).parse_args(argv)
        return {command.name: command for command in chosen}[args.command].run(args)
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:  # outside a run's wait: importing, checking the server, printing, writing
        return interrupted()
    finally:
        if on_main_thread:
            signal.signal(signal.SIGTERM, previous)


def main_and_exit(
    argv: list[str] | None = None,
    prog: str = PROG,
    epilog: str | None = None,
    run_before: Mapping[str, str] | None = None,
) -> typing.NoReturn:
    """`python -m bench_core` and the installed `bench-studio`: main(), then leave without the interpreter's
    teardown. Everything is written and said by then; the teardown takes seconds once torch is imported, would
    wait on a model load that Ctrl-C left behind, and a second Ctrl-C during it prints a traceback."""
    code = main(argv, prog, epilog, run_before)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
