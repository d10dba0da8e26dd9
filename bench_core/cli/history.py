"""`python -m bench_core history list|show|export|import|reindex|delete`: the run history without a browser, for a
terminal and for CI.

Each action is a Command of its own under `history`, and works through the History API only (store.history). `list`,
`export` and `delete` choose runs alike: by run id and by the filters here (`select_runs`, a pure function of the
loaded table); the text is views.history_text's. Runs come in the order the history holds them, as they were
recorded or imported: the newest last. What cannot be done as asked (a run id or column the history does not have,
a delete not confirmed) is one line on stderr and exit code 2, with nothing changed (HISTORY_EXIT_CODES_HELP).
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime, time
from pathlib import Path

import pandas as pd

from .. import csvstore
from ..errors import HistoryError
from ..states import IMPORTED, MEASURED, RunState
from ..views.history_text import RUNS_FORMATS, cells_text, json_text, present_cells, runs_text
from .common import (
    EXIT_OK,
    HISTORY_EXIT_CODES_HELP,
    Command,
    HistoryRequestError,
    Parser,
    add_results_flag,
    check_history_folder,
    close_match,
    column_names,
    existing_history,
    open_history,
    print_notices,
)

# What `list` shows unless --columns says otherwise: who and what ran, then the headline results.
LIST_COLUMNS = (
    "run_id",
    "started_at",
    "status",
    "label",
    "model",
    "backend",
    "output_throughput",
    "mean_ttft_ms",
    "mean_tpot_ms",
)
STATUSES = (*MEASURED, RunState.FAILED, RunState.CANCELLED, IMPORTED)  # the statuses a history row can have
EXPORT_FORMATS = ("csv", "json", "markdown")
SHOW_FORMATS = ("text", "json")
YES = ("y", "yes")  # the answers to delete's question that delete


@dataclass(frozen=True)
class RunFilter:
    """Which runs `list`, `export` and `delete` act on: those that pass every field given (an empty one passes all)."""

    statuses: tuple[str, ...] = ()
    backends: tuple[str, ...] = ()
    model: str = ""  # a part of the model's name, in any case
    label: str = ""  # a part of the label, in any case
    sweep_id: str = ""
    since: datetime | None = None  # started at or after this time (with its time zone)
    until: datetime | None = None  # started at or before this time
    last: int | None = None  # only the newest this many of the runs that pass the rest

    @property
    def given(self) -> bool:
        return self != RunFilter()

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RunFilter:
        return cls(
            statuses=tuple(args.status or ()),
            backends=tuple(args.backend or ()),
            model=args.model or "",
            label=args.label or "",
            sweep_id=args.sweep or "",
            since=args.since,
            until=args.until,
            last=args.last,
        )


def select_runs(table: pd.DataFrame, run_filter: RunFilter) -> pd.DataFrame:
    """The rows of a loaded history (History.load) that pass `run_filter`, in the table's order. A run without a
    start time (an import of LMDeploy's CSV) passes no --since or --until."""
    keep = pd.Series(True, index=table.index)
    sweep_ids = (run_filter.sweep_id,) if run_filter.sweep_id else ()
    for name, wanted in (("status", run_filter.statuses), ("backend", run_filter.backends), ("sweep_id", sweep_ids)):
        if wanted:
            keep &= _texts(table, name).isin(wanted)
    for name, part in (("model", run_filter.model), ("label", run_filter.label)):
        if part:
            keep &= _texts(table, name).str.contains(part, case=False, regex=False)
    if run_filter.since or run_filter.until:
        started = pd.to_datetime(_texts(table, "started_at"), utc=True, errors="coerce", format="ISO8601")
        if run_filter.since:
            keep &= started >= run_filter.since
        if run_filter.until:
            keep &= started <= run_filter.until
    chosen = table[keep]
    return chosen.tail(run_filter.last) if run_filter.last else chosen


def _texts(table: pd.DataFrame, name: str) -> pd.Series:
    """A column's cells as text, a missing one empty; all empty where the table lacks the column."""
    if name not in table:
        return pd.Series("", index=table.index)
    return table[name].fillna("").astype(str)


def chosen_columns(table: pd.DataFrame, names: Sequence[str] | None) -> list[str]:
    """The columns to show: `names` (--columns), each one the history has; by default LIST_COLUMNS, those it has."""
    if names is None:
        return [name for name in LIST_COLUMNS if name in table]
    names = list(dict.fromkeys(names))  # each once
    unknown = [name for name in names if name not in table]
    if unknown:
        said = ", ".join(f"'{name}'{close_match(name, table.columns)}" for name in unknown)
        raise HistoryRequestError(
            f"the history has no column {said}; `history show RUN_ID` lists the columns a run has"
        )
    return names


def _moment(text: str, end_of_day: bool) -> datetime:
    """A time a user typed: a date (its first moment, or its last with `end_of_day`) or an ISO time; without a time
    zone, this machine's."""
    try:
        day = date.fromisoformat(text)
    except ValueError:
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"'{text}' is neither a date (2026-12-01) nor an ISO time (2026-12-01T10:44, 2026-12-01T10:44:33+00:00)"
            ) from None
    else:
        moment = datetime.combine(day, time.max if end_of_day else time.min)
    return moment if moment.tzinfo else moment.astimezone()


def _since(text: str) -> datetime:
    return _moment(text, end_of_day=False)


def _until(text: str) -> datetime:
    return _moment(text, end_of_day=True)


def _run_count(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number of runs (1 or more)")
    return int(text)


def _add_filter_flags(parser: argparse.ArgumentParser, title: str) -> None:
    group = parser.add_argument_group(title)
    group.add_argument("--status", action="append", choices=STATUSES, help="runs of this status (repeat for several)")
    group.add_argument("--model", help="runs whose model's name contains this text, in any case")
    group.add_argument("--label", help="runs whose label contains this text, in any case")
    group.add_argument("--backend", action="append", help="runs of this backend (repeat for several)")
    group.add_argument("--sweep", metavar="SWEEP_ID", help="the runs of this sweep")
    group.add_argument(
        "--since",
        type=_since,
        metavar="WHEN",
        help="runs started at or after WHEN: a date (2026-12-01) or an ISO time; without a time zone, this machine's",
    )
    group.add_argument(
        "--until", type=_until, metavar="WHEN", help="runs started at or before WHEN (a date: up to its end)"
    )
    group.add_argument("--last", type=_run_count, metavar="N", help="only the newest N of the runs chosen")


def _add_columns_flag(parser: argparse.ArgumentParser, help_text: str) -> None:
    parser.add_argument("--columns", type=column_names, metavar="A,B,...", help=help_text)


def _chosen_runs(table: pd.DataFrame, args: argparse.Namespace, results: str) -> pd.DataFrame:
    """The runs that `args` name (RUN_ID ..., each one the history must have) and its filters choose."""
    if args.run_ids:
        known = set(table["run_id"])
        unknown = [run_id for run_id in dict.fromkeys(args.run_ids) if run_id not in known]
        if unknown:
            raise HistoryRequestError(f"the history in {results} has no run {', '.join(unknown)}")
        table = table[table["run_id"].isin(args.run_ids)]
    return select_runs(table, RunFilter.from_args(args))


def _write(data: bytes, output: str | None = None) -> None:
    """`data` to stdout, or with `output` into that file, whole or not at all."""
    if not output:
        sys.stdout.flush()
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return
    try:
        if not Path(output).resolve().parent.is_dir():  # a typo in the folder is not a folder to make
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), output)
        csvstore.replace_bytes(Path(output), data)  # whole or not at all, as every file we write
    except OSError as exc:
        raise HistoryRequestError(f"cannot write {output}: {exc.strerror or exc}") from exc


class ListRuns(Command):
    name = "list"
    help = "one line per run, the newest last, filtered (table, csv, json or markdown)"
    description = (
        "One line per run, in the order the history holds them (as recorded or imported): the newest last.\n"
        f"Columns by default: {', '.join(LIST_COLUMNS)}.\n\n"
        "examples:\n"
        "  python -m bench_core history list --status finished --model qwen --last 10\n"
        "  python -m bench_core history list --since 2026-12-01 --columns run_id,concurrency,output_throughput "
        "--format csv"
    )
    epilog = HISTORY_EXIT_CODES_HELP

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--format",
            choices=RUNS_FORMATS,
            default=RUNS_FORMATS[0],
            help="table: for a terminal, numbers rounded; csv and json: every value as recorded, for scripts; "
            "markdown: a table to paste",
        )
        _add_columns_flag(parser, "the columns to show, comma-separated (any of the history's)")
        _add_filter_flags(parser, "choosing runs (every filter given must hold)")
        add_results_flag(parser, "folder of the run history")

    def run(self, args: argparse.Namespace) -> int:
        table = existing_history(args.results).load()
        columns = chosen_columns(table, args.columns)
        runs = select_runs(table, RunFilter.from_args(args))
        if runs.empty and args.format in ("table", "markdown"):
            matching = " matches the filters" if RunFilter.from_args(args).given else ""
            print(f"No run in {args.results}{matching}.", file=sys.stderr)
            return EXIT_OK
        _write(runs_text(runs[columns], args.format).encode())
        return EXIT_OK


class ShowRun(Command):
    name = "show"
    help = "every recorded cell of one run"
    description = (
        "Every cell of one run's row that holds a value: as written in the history (text), or as loaded,\n"
        "numbers as numbers (json, as `export --format json` gives each run).\n\n"
        "example: python -m bench_core history show 20261201-104433-ef6e --format json"
    )
    epilog = HISTORY_EXIT_CODES_HELP

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("run_id", metavar="RUN_ID", help="the run (its id, as `history list` shows it)")
        parser.add_argument("--format", choices=SHOW_FORMATS, default=SHOW_FORMATS[0], help="text or json")
        add_results_flag(parser, "folder of the run history")

    def run(self, args: argparse.Namespace) -> int:
        history = existing_history(args.results)
        table = history.load()
        run = table[table["run_id"] == args.run_id]
        if run.empty:
            raise HistoryRequestError(f"the history in {args.results} has no run {args.run_id}")
        cells = present_cells(run.iloc[0])  # a cell written as "-" or "nan" (not measured) is empty
        if args.format == "text":
            written = history.row(args.run_id) or {}
            text = cells_text({name: written.get(name, value) for name, value in cells.items()})
        else:
            text = json_text(cells)
        _write(text.encode())
        return EXIT_OK


class ExportRuns(Command):
    name = "export"
    help = "the history, or some of its runs, as csv (LMDeploy's columns first), json or markdown"
    description = (
        "The history, or the runs named and those the filters choose, to stdout or to a file (written whole,\n"
        "through a temporary file). csv: history.csv's columns, LMDeploy's first, every cell as written;\n"
        "json: a list with each run's non-empty cells (as `show --format json`), or the --columns chosen;\n"
        "markdown: a table of `list`'s columns, or the --columns chosen.\n\n"
        "examples:\n"
        "  python -m bench_core history export --sweep SWEEP_ID --output sweep.csv\n"
        "  python -m bench_core history export RUN_ID RUN_ID --format markdown"
    )
    epilog = HISTORY_EXIT_CODES_HELP

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "run_ids", nargs="*", metavar="RUN_ID", help="the runs to export; none named: every run the filters choose"
        )
        parser.add_argument("--format", choices=EXPORT_FORMATS, default=EXPORT_FORMATS[0], help="csv, json or markdown")
        parser.add_argument("--output", "-o", metavar="FILE", help="write FILE instead of stdout")
        _add_columns_flag(parser, "json and markdown: the columns, comma-separated")
        _add_filter_flags(parser, "choosing runs (every filter given must hold)")
        add_results_flag(parser, "folder of the run history")

    def run(self, args: argparse.Namespace) -> int:
        if args.columns and args.format == "csv":
            raise HistoryRequestError("--columns is for json and markdown: csv holds history.csv's columns")
        history = existing_history(args.results)
        table = history.load()
        runs = _chosen_runs(table, args, args.results)
        if args.format == "csv":
            every_run = not args.run_ids and not RunFilter.from_args(args).given
            data = history.to_csv_bytes(None if every_run else list(runs["run_id"]))
        elif args.format == "json" and not args.columns:
            data = json_text([present_cells(run) for _, run in runs.iterrows()]).encode()
        else:
            data = runs_text(runs[chosen_columns(table, args.columns)], args.format).encode()
        _write(data, args.output)
        if args.output:
            print(f"Wrote {len(runs)} run(s) to {args.output}.", file=sys.stderr)
        return EXIT_OK


class ImportFiles(Command):
    name = "import"
    help = "add LMDeploy's CSVs or another history's runs"
    description = (
        "Add the rows of CSV files written by LMDeploy's profile_*.py scripts, or of another history.csv\n"
        "(its runs already here are skipped). Prints each new run id. All the files or none: a file that\n"
        "cannot be read or imported leaves the history as it was. The folder is made if it is not there.\n\n"
        "example: python -m bench_core history import profile_throughput.csv ../other/results/history.csv"
    )
    epilog = HISTORY_EXIT_CODES_HELP

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("files", nargs="+", metavar="FILE", help="a CSV of LMDeploy's or a history.csv")
        add_results_flag(parser, "folder of the run history to import into")

    def run(self, args: argparse.Namespace) -> int:
        history = open_history(args.results)
        new_ids: list[str] = []
        counts = []
        try:
            for path in args.files:
                found = history.import_csv(path)
                new_ids += found
                counts.append((path, len(found)))
        except HistoryError:
            if new_ids:  # the files before the bad one: all the files or none
                history.delete(new_ids)
            raise
        for path, count in counts:
            said = f"imported {count} run(s)" if count else "nothing new: its runs are already in the history"
            print(f"{path}: {said}", file=sys.stderr)
        _write("".join(f"{run_id}\n" for run_id in new_ids).encode())
        return EXIT_OK


class Reindex(Command):
    name = "reindex"
    help = "rebuild the history's index from its run folders"
    description = (
        "Rebuild the index that `list`, the pages and the sweeps read from the run folders (each folder\n"
        "holds its run whole); prints how many runs it indexed."
    )
    epilog = HISTORY_EXIT_CODES_HELP

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_results_flag(parser, "folder of the run history")

    def run(self, args: argparse.Namespace) -> int:
        check_history_folder(args.results)
        # Not opened as the others are (History.tidy reads the index first): the index may be what is broken.
        from ..store.history import History

        history = History(args.results)
        count = history.reindex()
        print_notices(history)
        print(f"{count} run(s) indexed in {args.results}.")
        return EXIT_OK


class DeleteRuns(Command):
    name = "delete"
    help = "delete runs: their rows and folders (asks first, unless --yes)"
    description = (
        "Delete the runs named, their rows and their folders. On a terminal it lists them and asks first;\n"
        "--yes deletes without asking (where stdin is not a terminal, it is required). Runs chosen by\n"
        "filters are deleted only with --yes: `history list` with the same filters shows which they are.\n"
        "A run id the history does not have refuses the whole delete.\n\n"
        "examples:\n"
        "  python -m bench_core history delete 20261201-104433-ef6e\n"
        "  python -m bench_core history delete --status failed --until 2026-11-30 --yes"
    )
    epilog = HISTORY_EXIT_CODES_HELP

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("run_ids", nargs="*", metavar="RUN_ID", help="the runs to delete")
        parser.add_argument("--yes", "-y", action="store_true", help="delete without asking")
        _add_filter_flags(parser, "choosing runs (every filter given must hold; only with --yes)")
        add_results_flag(parser, "folder of the run history")

    def run(self, args: argparse.Namespace) -> int:
        by_filter = RunFilter.from_args(args).given
        if not args.run_ids and not by_filter:
            raise HistoryRequestError("name the runs to delete (RUN_ID ...), or choose them with filters and --yes")
        if by_filter and not args.yes:
            raise HistoryRequestError(
                "runs chosen by filters are deleted only with --yes (`history list` with the same filters shows them)"
            )
        if not args.yes and not sys.stdin.isatty():
            raise HistoryRequestError(
                "delete asks first, and stdin is not a terminal: add --yes to delete without asking"
            )
        history = existing_history(args.results)
        runs = _chosen_runs(history.load(), args, args.results)
        if runs.empty:
            print(f"No run in {args.results} matches the filters: nothing deleted.", file=sys.stderr)
            return EXIT_OK
        if not args.yes and not _confirmed(runs, args.results):
            print("Nothing deleted.", file=sys.stderr)
            return EXIT_OK
        run_ids = list(runs["run_id"])
        history.delete(run_ids)
        print(f"Deleted {len(run_ids)} run(s) from {args.results}.", file=sys.stderr)
        _write("".join(f"{run_id}\n" for run_id in run_ids).encode())
        return EXIT_OK


def _confirmed(runs: pd.DataFrame, results: str) -> bool:
    """Whether the user, shown the runs on stderr, answers yes on stdin."""
    print(runs_text(runs[chosen_columns(runs, None)], "table"), end="", file=sys.stderr)
    print(f"Delete these {len(runs)} run(s) and their folders from {results}? [y/N] ", end="", file=sys.stderr)
    sys.stderr.flush()
    return sys.stdin.readline().strip().lower() in YES


ACTIONS: tuple[Command, ...] = (ListRuns(), ShowRun(), ExportRuns(), ImportFiles(), Reindex(), DeleteRuns())


class HistoryCommand(Command):
    name = "history"
    help = "the run history without a browser: list, show, export, import, reindex, delete"
    description = (
        "The run history (--results: the folder; $BENCH_STUDIO_RESULTS, else ./results) from a terminal or CI.\n"
        "Each action has its own --help.\n\n"
        "examples:\n"
        "  python -m bench_core history list --last 5\n"
        "  python -m bench_core history show RUN_ID\n"
        "  python -m bench_core history export --status finished --format json --output runs.json\n"
        "  python -m bench_core history import profile_throughput.csv\n"
        "  python -m bench_core history delete RUN_ID"
    )
    epilog = HISTORY_EXIT_CODES_HELP

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        actions = parser.add_subparsers(dest="history_action", required=True, parser_class=Parser)
        for action in ACTIONS:
            action.add_parser(actions)

    def run(self, args: argparse.Namespace) -> int:
        return {action.name: action for action in ACTIONS}[args.history_action].run(args)
