"""What every subcommand of the CLI shares: exit codes and their help, the parser and its help format, the
flags that record a run (--label, --results, --percentiles, --slo-*), the config parts built from them,
and the run-and-report loop (open the history, check it can be written, run with a progress line that observes
the run, say where each run went).

Exit codes are decided here only: EXIT_CODES_HELP and SWEEP_EXIT_CODES_HELP say what each means.
The subcommand modules import this one and nothing of each other; the package's `main` wires them.
"""

from __future__ import annotations

import abc
import argparse
import difflib
import os
import sys
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..config import (
    DEFAULT_PERCENTILES,
    KNOBS,
    Part,
    RunConfig,
    Setting,
    config_from_values,
    ignored_load_settings,
    of_part,
    setting,
)
from ..errors import BenchError, ConfigError, HistoryError
from ..exports import Scope
from ..run.observer import JobObserver
from ..states import MEASURED, RunState
from ..terminal import redraw

if typing.TYPE_CHECKING:
    from ..run.preflight import Preflighted

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_PARTIAL, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
EXIT_NOT_READY = 4  # doctor: a backend that should run here cannot
EXIT_CODES_HELP = """exit codes:
  0    finished: every request succeeded
  1    failed: no request succeeded, the engine broke, or the results could not be saved
       (the reasons are on stderr, with the folder where an unsaved run was kept instead)
  2    bad input: a flag, the dataset, the model, or lengths beyond the model's context window
  3    partial: some requests failed; the numbers count the successful ones (the reasons are on stderr)
  130  interrupted (Ctrl-C); what was measured is kept"""
SWEEP_EXIT_CODES_HELP = """exit codes:
  0    every run finished with every request succeeded
  1    some run failed or was partial (some of its requests failed); resume re-runs those points
  2    bad input: a flag, the dataset, the model, or lengths beyond the model's context window
  130  interrupted (Ctrl-C); resumable"""
DOCTOR_EXIT_CODES_HELP = """exit codes:
  0    ready: an in-process backend can run here, and with --smoke every smoke run finished
       (LMDeploy's backends may be unavailable for want of a GPU: the reason is printed)
  1    --smoke: a smoke run failed or some of its requests did (the reason is printed)
  2    bad input: a flag, or a results folder that cannot be written
  4    not ready: no in-process backend can run here, or a GPU is visible and an LMDeploy
       backend still cannot run (the reason and the fix are printed), or the --server does not answer
  130  interrupted (Ctrl-C)"""
HISTORY_EXIT_CODES_HELP = """exit codes:
  0    done (a list or export that matches no run, a delete declined at its question)
  2    bad input: a flag, a date, a run id or column the history does not have, a file that cannot be
       read or imported (nothing is imported), an output file that cannot be written, a results folder
       that is not there, a delete not confirmed (--yes) where stdin is not a terminal
  130  interrupted (Ctrl-C)"""
PROGRESS_WIDTH = 120  # characters of the progress line redrawn on a terminal
CANCEL_GRACE_S = 0.5  # how long Ctrl-C waits for a loading run to notice before leaving it behind


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Shows each flag's default, as LMDeploy's scripts do."""


class Parser(argparse.ArgumentParser):
    """Reports a usage mistake as one line on stderr and exit code 2."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message} (see --help)\n")


class Command(abc.ABC):
    """A subcommand: its parser (words and flags) and what it does with what was parsed."""

    name: typing.ClassVar[str]
    help: typing.ClassVar[str]  # its line in the CLI's --help
    description: typing.ClassVar[str | None] = None
    epilog: typing.ClassVar[str | None] = EXIT_CODES_HELP

    def add_parser(self, commands: argparse._SubParsersAction) -> None:
        """Add this command's parser, with its flags, to `commands`."""
        parser = commands.add_parser(
            self.name, formatter_class=HelpFormatter, help=self.help, description=self.description, epilog=self.epilog
        )
        self.add_arguments(parser)

    @abc.abstractmethod
    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """The command's arguments and flags."""

    @abc.abstractmethod
    def run(self, args: argparse.Namespace) -> int:
        """Do what the command does; its exit code."""


class EngineCommand(Command):
    """A command that benchmarks an engine; `sweep` takes its flags for the settings every point starts from."""

    sweep_help: typing.ClassVar[str]  # its line in `sweep --help`
    # Whether it benchmarks a server, so a sweep may start one per run (--server-cmd) and search for its capacity.
    serves: typing.ClassVar[bool] = False

    @abc.abstractmethod
    def build_config(self, args: argparse.Namespace) -> RunConfig:
        """The run the flags describe; a sweep starts every point from it."""

    def sweep_csv_path(self, args: argparse.Namespace) -> str:
        """The LMDeploy-format CSV a sweep appends each finished run to; empty: none, the history only."""
        return ""


class ScriptCommand(EngineCommand):
    """An in-process engine run as one of LMDeploy's offline scripts runs it: the command's `flags` (the script's, in
    its order, then ours) and the in-process engines' knobs give one run, whose summary has the script's title and
    rows and whose LMDeploy row is appended to --csv."""

    title: typing.ClassVar[str]  # the summary's, as the script prints it
    flags: typing.ClassVar[tuple[Flag | str, ...]]
    fixed: typing.ClassVar[Mapping[str, typing.Any]] = {}  # the settings the script fixes whatever the flags say

    @abc.abstractmethod
    def summary_rows(self, config: RunConfig) -> list[tuple[str, typing.Any]]:
        """The script's rows below the summary's totals (its hyperparameters)."""

    def build_config(self, args: argparse.Namespace) -> RunConfig:
        values = {**flag_values(args, self.flags), **self.fixed}
        return recorded_config(args, {**values, **knob_values(args, in_process_knobs(), args.backend)})

    def sweep_csv_path(self, args: argparse.Namespace) -> str:
        return args.csv

    def run(self, args: argparse.Namespace) -> int:
        from ..run.preflight import check_run
        from ..run.run_again import speculation_pair

        check_report_path(args.report)
        check_export_paths(args.export, Scope.RUN)
        config = self.build_config(args)
        paired = getattr(args, AGAINST_NO_SPECULATION, False)
        # Before the history is opened: a refused run writes nothing.
        configs = [check_run(each) for each in (speculation_pair(config) if paired else [config])]
        history = open_history(args.results)
        check_writable(history, args.csv)
        shown = []

        def show(run):
            shown.append(run)
            run.profiler.summarize(self.title, self.summary_rows(config))
            return lambda: save_lmdeploy_row(args.csv, run)

        status = run_each(history, configs, args.csv, show, with_report(args.export, args.report))
        if paired and len(shown) == len(configs):
            print_paired(history, *shown)
        return status


AGAINST_NO_SPECULATION = "against_no_speculation"


PAIRED_HELP = (
    "run the same prompts first without speculation, on the same decode path (the embedded engine: generate(), one "
    "request at a time), then with it, and print each per-request metric's ratio with its 95%% paired interval; in a "
    "sweep, at every point, with the load at which speculation stops paying"
)


def add_against_no_speculation_flag(group, help_text: str = PAIRED_HELP) -> None:
    group.add_argument("--against-no-speculation", action="store_true", dest=AGAINST_NO_SPECULATION, help=help_text)


def refuse_paired(args: argparse.Namespace) -> None:
    """A tune takes pipeline's flags but picks its points: --against-no-speculation is refused."""
    if getattr(args, AGAINST_NO_SPECULATION, False):
        raise ConfigError(
            "A tune picks its points and does not pair them: for speculation against none at each load, run sweep "
            "... --against-no-speculation --sweep concurrency=1,4,16."
        )


def print_paired(history, baseline, other) -> None:
    """The per-request metrics of `other` over `baseline`'s on the same requests, each with its paired interval."""
    from ..views.tables import paired_ratios

    found = {run.run_id: history.requests(run.run_id) for run in (baseline, other) if history.measured(run.run_id)}
    ratios = paired_ratios(found, baseline.run_id) if len(found) == 2 else None
    if ratios is None or other.run_id not in ratios or ratios[other.run_id].dropna().empty:
        print(f"\nNo paired ratio: runs {baseline.run_id} and {other.run_id} did not serve the same prompts.")
        return
    print(
        f"\n{other.config.label} against {baseline.config.label}, request by request ({other.run_id} over "
        f"{baseline.run_id}; mean ratio, 95% paired-bootstrap interval):"
    )
    for metric, cell in ratios[other.run_id].dropna().items():
        print(f"  {metric}: {cell}")


def _percentiles(text: str) -> tuple[float, ...]:
    values = tuple(float(p) for p in text.split(",") if p.strip())
    if not values:
        raise ValueError(text)
    return values


_percentiles.__name__ = "comma-separated numbers"


def add_results_flag(group, help_text: str, **options) -> None:
    """--results: the history folder, by default $BENCH_STUDIO_RESULTS, else ./results."""
    from ..store.history import RESULTS_ENV

    group.add_argument(
        "--results", default=os.environ.get(RESULTS_ENV, "results"), help=f"{help_text}; env {RESULTS_ENV}", **options
    )


def add_resume_credential_flags(parser, command: str) -> None:
    """The flags that give a resumed sweep or tune the credentials its saved plan masked (CREDENTIAL_SETTINGS)."""
    from ..sweep.store import CREDENTIAL_SETTINGS

    credentials = parser.add_argument_group("credentials (with --resume)")
    for name in CREDENTIAL_SETTINGS:
        credentials.add_argument(
            setting(name).cli_flag,
            dest=f"resume_{name}",
            metavar="TEXT",
            default="",
            help=f"the {command}'s {setting(name).cli_flag} again, where it held a credential",
        )


def resume_credentials(args: argparse.Namespace) -> dict[str, str]:
    from ..sweep.store import CREDENTIAL_SETTINGS

    return {name: getattr(args, f"resume_{name}") for name in CREDENTIAL_SETTINGS}


_DECLARED = object()  # a Flag's default: the setting's own


@dataclass(frozen=True)
class Flag:
    """A setting's flag in one command: the declaration's, with what this command spells or defaults otherwise
    (LMDeploy's scripts give one setting other defaults: 1,000 prompts and seed 1 in profile_restful_api.py)."""

    name: str  # the setting
    names: tuple[str, ...] = ()  # default: the declaration's flags
    default: typing.Any = _DECLARED
    help: str = ""  # default: the declaration's cli_help
    dest: str = ""  # default: the setting's name
    negated: bool = False  # a --disable-... switch: given, the setting is False
    positional: bool = False
    # Default: the declaration's; a function gives them when the parser is built (a registry's, plugins' included).
    choices: tuple[typing.Any, ...] | Callable[[], tuple[typing.Any, ...]] | None = None
    metavar: str | None = None  # default: argparse's, from the flag

    @property
    def setting(self) -> Setting:
        return setting(self.name)

    @property
    def destination(self) -> str:
        """Where argparse puts it: `dest`, else what argparse makes of the long flag (--num-prompts: num_prompts)."""
        if self.dest or self.positional:
            return self.dest or self.name
        long = next(name for name in self.names or self.setting.cli_flags if name.startswith("--"))
        return long.removeprefix("--").replace("-", "_")

    def add(self, group) -> None:
        declared = self.setting
        options: dict[str, typing.Any] = {"help": (self.help or declared.cli_help).replace("%", "%%")}
        if self.positional:
            group.add_argument(self.destination, **options).setting_name = self.name
            return
        default = declared.default if self.default is _DECLARED else self.default
        options["action"] = _GivenTrue if declared.kind is bool else _Given
        if self.metavar is not None:
            options["metavar"] = self.metavar
        if declared.kind is not bool:
            options["type"] = flag_type(declared)
            choices = declared.choices if self.choices is None else self.choices
            choices = choices() if callable(choices) else choices
            if choices is not None and declared.text_parser is None:  # a text parser knows its choices
                options["choices"] = [choice for choice in choices if choice is not None]
        action = group.add_argument(
            *(self.names or declared.cli_flags),
            dest=self.destination,
            default=False if self.negated else default,
            **options,
        )
        action.setting_name = self.name
        action.negated = self.negated

    def value(self, args: argparse.Namespace) -> typing.Any:
        """The setting's value the parsed `args` give (a typed value scaled as the setting stores it)."""
        value = getattr(args, self.destination)
        if self.negated:
            return not value
        scale = self.setting.typed_scale
        return value * scale if scale != 1 and isinstance(value, (int, float)) else value


def dataset_name_flag(**options: typing.Any) -> Flag:
    """--dataset-name, offering the datasets registered when the parser is built (bench_core/load/__init__.py), a
    plugin's included."""
    from ..load import dataset_names

    return Flag("dataset_name", choices=dataset_names, **options)


GIVEN = "given_settings"  # the parsed arguments' set of the settings whose flags were typed, defaults aside


class _NotesGiven(argparse.Action):
    """A setting's flag that notes, where it was typed, that the setting was given (GIVEN)."""

    setting_name = ""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        super().__call__(parser, namespace, values, option_string)
        setattr(namespace, GIVEN, {*getattr(namespace, GIVEN, ()), self.setting_name})


class _Given(_NotesGiven, argparse._StoreAction):
    pass


class _GivenTrue(_NotesGiven, argparse._StoreTrueAction):
    pass


def given_settings(args: argparse.Namespace) -> frozenset[str]:
    """The settings whose flags were typed on the command line."""
    return frozenset(getattr(args, GIVEN, ()))


# The dataset's length settings, as both LMDeploy scripts list their flags, in their order; the other datasets'
# settings are ours (unlisted_flags).
LENGTH_FLAGS = ("sharegpt_output_len", "random_input_len", "random_output_len", "random_range_ratio")


def flag_type(declared: Setting) -> Callable[[str], typing.Any]:
    """How a flag's text becomes the setting's value: its own text form (quant_policy's names), else its kind; an
    empty string leaves an optional setting unset, like a missing flag. Text that is no value of a number setting
    is refused with its range (its bounds are checked with the run's other settings)."""

    def parse(text: str) -> typing.Any:
        if declared.optional and text.strip() == "":
            return None
        try:
            return (declared.text_parser or declared.kind)(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(not_a_value(declared, text) if declared.numeric else str(exc)) from None

    parse.__name__ = declared.kind.__name__  # argparse names it in "invalid int value"
    return parse


def not_a_value(declared: Setting, text: str) -> str:
    """Why `text`, typed for a number setting, is not one of its values: its range's sentence where it is a number of
    another kind (nan, 1e30 or 2.5 for a whole number), else that it is no number at all."""
    try:
        number = float(text)
    except ValueError:
        return f"'{text}' is not {declared.limits.words(declared.kind is int, declared.typed_scale)}."
    return declared.out_of_range(number * declared.typed_scale)


def unlisted_flags(part: Part, *layouts: Iterable[Flag | str]) -> tuple[Flag, ...]:
    """The flags of `part`'s settings that a command's layouts (LMDeploy's flags, in its order) do not list: ours,
    each as its declaration spells it, so a setting declared in the catalog reaches every command."""
    listed = {flag if isinstance(flag, str) else flag.name for layout in layouts for flag in layout}
    return tuple(Flag(declared.name) for declared in of_part(part) if declared.name not in listed)


def add_flags(group, flags: Iterable[Flag | str]) -> None:
    for flag in flags:
        (Flag(flag) if isinstance(flag, str) else flag).add(group)


def flag_values(args: argparse.Namespace, flags: Iterable[Flag | str]) -> dict[str, typing.Any]:
    """The settings' values the parsed `args` give for `flags`, by setting name."""
    chosen = [Flag(flag) if isinstance(flag, str) else flag for flag in flags]
    return {flag.name: flag.value(args) for flag in chosen}


def in_process_knobs() -> tuple[Setting, ...]:
    """The knobs of the engines that run in process (LMDeploy's, the embedded one); a server's are restful's."""
    from ..engines import in_process_backends

    return tuple(knob for knob in KNOBS if set(knob.backends or ()) & set(in_process_backends()))


def knob_flag(knob: Setting) -> Flag:
    """A knob's flag. Not given, the knob is absent from the parsed arguments (argparse.SUPPRESS), so a flag the user
    typed is told apart from a default: `knob_values` refuses one the backend does not use."""
    constraint = f"; {knob.rule}" if knob.rule else ""
    help_text = f"{knob.help} (default: {knob.default}; for {', '.join(knob.backends or ())}{constraint})"
    return Flag(knob.name, default=argparse.SUPPRESS, help=help_text)


def add_knob_flags(
    parser: argparse.ArgumentParser, knobs: Iterable[Setting], layout: Iterable[tuple[str, Iterable[str]]] = ()
) -> None:
    """Each knob's flag: those a `layout` names (an LMDeploy script's argument groups, by title, in its order) in
    its groups, the others in their catalog group's ("<group> arguments", ours beside a script's layout)."""
    chosen = {knob.name: knob for knob in knobs}
    for title, names in layout:
        group = parser.add_argument_group(title)
        for name in names:
            knob_flag(chosen.pop(name)).add(group)
    ours = " (LLM Bench Studio)" if layout else ""
    groups: dict[str, typing.Any] = {}
    for knob in chosen.values():
        if knob.group not in groups:
            groups[knob.group] = parser.add_argument_group(f"{knob.group} arguments{ours}")
        knob_flag(knob).add(groups[knob.group])


def knob_values(args: argparse.Namespace, knobs: Iterable[Setting], backend: str) -> dict[str, typing.Any]:
    """The knob flags given on the command line; ConfigError naming each one that `backend` does not use."""
    given = {knob: Flag(knob.name).value(args) for knob in knobs if hasattr(args, Flag(knob.name).destination)}
    problems = [knob.not_applicable(backend) for knob in given if not knob.applies(backend=backend)]
    if problems:
        raise ConfigError(" ".join(problems))
    return {knob.name: value for knob, value in given.items()}


def add_record_flags(group, *, label_help: str, percentiles_help: str) -> None:
    """The flags that say how a run is recorded: --label, --results, --percentiles and the goodput thresholds."""
    group.add_argument("--label", default="", help=label_help)
    add_results_flag(group, "folder of the run history (history.csv and runs/)")
    group.add_argument("--percentiles", type=_percentiles, default=DEFAULT_PERCENTILES, help=percentiles_help)
    add_flags(group, (slo.name for slo in of_part(Part.SLO)))
    add_report_flag(group, "once the run(s) end")
    add_export_flag(group, "once the run(s) end")


def add_server_flags(group) -> None:
    group.add_argument(
        "--server-cmd",
        metavar="TEMPLATE",
        default="",
        help="start this server for every run and stop it after: {port} is a free port (the base URL "
        "follows it), every other {name} a server setting from --sweep name=V1,V2 or "
        "--server-setting name=VALUE; its output goes to runs/<id>/server.log",
    )
    group.add_argument(
        "--server-setting",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a fixed value of a field of --server-cmd",
    )
    add_flags(group, (Flag("server_start_timeout_s", metavar="S"),))


def precision_of(args: argparse.Namespace):
    """The target --target-moe sets (a sweep.precision.Precision; None without one); ConfigError for its other flags
    given without it."""
    from ..sweep.precision import Precision

    if args.target_moe is None:
        alone = sorted(given_settings(args) & {"max_repeats", "target_moe_metric"})
        if alone:
            flags = " and ".join(setting(name).cli_flag for name in alone)
            raise ConfigError(f"{flags} appl{'y' if len(alone) > 1 else 'ies'} only with --target-moe P.")
        return None
    return Precision(args.target_moe, args.target_moe_metric, args.max_repeats)


def command_for(engine: EngineCommand, config: RunConfig, prog: str) -> str:
    """The command line of `engine` (`prog pipeline DATASET MODEL --flag value ...`) that runs `config` again: each
    setting whose flag the command has, where its value is not the flag's default (a switch typed where it is set,
    a negated one where it is not), the percentiles where they are not the default. Settings the command has no flag
    for (a tune's server settings, the label) are left out; a credential in a value is masked (the user types it in
    again: the command is printed and written in reports)."""
    import shlex

    from ..redact import redact_text

    parser = Parser(prog=prog)
    engine.add_arguments(parser)
    positional, flags, done = [], [], set()
    for action in parser._actions:  # argparse keeps no public list of a parser's arguments
        name = getattr(action, "setting_name", "")
        if not name or name in done:
            continue
        done.add(name)
        declared = setting(name)
        value = config.value(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and declared.typed_scale != 1:
            value = value / declared.typed_scale
        if not action.option_strings:
            positional.append(str(value))
            continue
        flag = next(option for option in action.option_strings if option.startswith("--"))
        default = declared.default if action.default is argparse.SUPPRESS else action.default
        if getattr(action, "negated", False):
            flags += [flag] if value is False else []
        elif declared.kind is bool:
            flags += [flag] if value and not default else []
        elif value != default:
            flags += [flag, "" if value is None else redact_text(_flag_text(value))]
    if tuple(config.percentiles) != tuple(DEFAULT_PERCENTILES):
        flags += ["--percentiles", ",".join(f"{p:g}" for p in config.percentiles)]
    return shlex.join([*prog.split(), *positional, *flags])


def _flag_text(value: typing.Any) -> str:
    """A value as its flag takes it: a whole float without its ".0" where the flag reads whole numbers too."""
    return f"{value:g}" if isinstance(value, float) and value.is_integer() else str(value)


def add_report_flag(group, when: str, **options) -> None:
    group.add_argument(
        "--report",
        metavar="FILE",
        default="",
        **options,
        help=f"write one self-contained HTML report (charts, tables, settings, environment; it opens "
        f"offline) to FILE {when}",
    )


def add_export_flag(group, when: str, **options) -> None:
    """--export KIND[:PATH], repeatable: every kind the export registry holds (bench_core/exports)."""
    from ..exports import describe_kinds

    group.add_argument(
        "--export",
        metavar="KIND[:PATH]",
        action="append",
        type=export_request,
        **options,
        help=f"write the export KIND to PATH (default: its own file name, in the current folder) {when}; repeat "
        f"for several. KIND (what it is of): {describe_kinds()}",
    )


@dataclass(frozen=True)
class ExportRequest:
    """One --export: the kind, and where ("": the export's own file name, in the current folder)."""

    kind: str
    path: str = ""


def export_request(text: str) -> ExportRequest:
    """KIND[:PATH] as --export takes it; an unknown kind is refused naming the registered ones."""
    from ..exports import exports

    kind, _, path = text.partition(":")
    if kind not in (known := exports()):
        raise argparse.ArgumentTypeError(f"unknown export '{kind}'; choose one of {', '.join(known)}")
    return ExportRequest(kind, path)


def with_report(requests: Iterable[ExportRequest] | None, report_path: str) -> list[ExportRequest]:
    """The --export requests (None where none was given), and --report FILE, which is `--export report:FILE` under
    its older name."""
    return [*(requests or ()), *([ExportRequest("report", report_path)] if report_path else [])]


def check_report_path(path: str, typed: str = "", example: str = "report.html") -> None:
    """Before anything runs: ConfigError unless a file can be written at `path` (its folder must exist), naming
    the flag as it was `typed` (by default `--report PATH`)."""
    from ..csvstore import check_folder_writable

    if not path:
        return
    typed = typed or f"--report {path}"
    target = Path(path)
    if target.is_dir():
        raise ConfigError(f"{typed}: that is a folder; give a file name, e.g. {target / example}.")
    if not target.parent.is_dir():
        raise ConfigError(f"{typed}: the folder {target.parent} does not exist.")
    check_folder_writable(target.parent, target)


def check_export_paths(requests: Iterable[ExportRequest] | None, *scopes: Scope) -> None:
    """Before anything runs: ConfigError for an export that is of none of `scopes` (what the command ends with)
    or whose file cannot be written."""
    from ..exports import export

    for request in requests or ():
        chosen = export(request.kind)
        if not set(scopes) & set(chosen.scopes):
            raise ConfigError(
                f"--export {request.kind}: it is of {' or '.join(chosen.scopes)}; this command ends with "
                f"{' or '.join(scopes)}."
            )
        typed = f"--export {request.kind}:{request.path}"
        check_report_path(request.path, typed, chosen.file_name.format(stem=scopes[0]))


def write_exports(requests: Sequence[ExportRequest], subject_of: Callable[[], typing.Any]) -> bool:
    """Write each export of the subject `subject_of()` gives (read once, when the first is written) to its path,
    whole or not at all, and say where; False, having said why on stderr, when one could not be written. The
    history is written already: nothing recorded is lost."""
    from ..csvstore import replace_bytes
    from ..exports import export

    written, subject = True, None
    for request in requests:
        path = request.path
        try:
            subject = subject or subject_of()
            chosen = export(request.kind)
            path = path or chosen.name_for(subject)
            data = chosen.build(subject)
            replace_bytes(Path(path), data)
        except (OSError, BenchError) as exc:  # a run that left nothing to export, a full disk, a folder gone
            reason = getattr(exc, "strerror", None) or exc
            print(f"error: the {request.kind} was not written to {path or 'its file'}: {reason}", file=sys.stderr)
            written = False
            continue
        print(f"{request.kind}: {path} ({len(data) / 1e6:.1f} MB)", file=sys.stderr)
    return written


def runs_subject(history, runs: list) -> Callable[[], typing.Any]:
    """What the exports of the ended `runs` are of: one run, or the comparison of several (restful's rates)."""
    from ..exports import ComparisonSubject, RunSubject
    from ..store.history import lmdeploy_row_of
    from ..store.run_parts import request_tables, run_parts
    from ..views import report

    def subject() -> RunSubject | ComparisonSubject:
        if len(runs) == 1:
            run = runs[0]
            record, measurement = run.record, run.measurement
            notes = measurement.sample.notes if measurement.sample is not None else ()
            return RunSubject(
                history,
                run.run_id,
                record.requests if record is not None else None,
                record.lmdeploy_columns if record is not None else lmdeploy_row_of(history.row(run.run_id) or {}),
                lambda: run_parts(history, run.run_id, record, None, measurement.warnings, notes, run.snapshot()),
            )
        rows = history.load(run_ids=[run.run_id for run in runs])
        if rows.empty:
            raise HistoryError("none of the runs was recorded")
        # Keyed by the names the comparison gives the runs, as the History page keys them: the paired table and the
        # distributions find each run's requests under its name.
        chosen, _ = report.compared_runs(rows)
        found, missing = request_tables(history, chosen, chosen[report.RUN])
        return ComparisonSubject(history, rows, found, missing)

    return subject


def recorded_config(args: argparse.Namespace, values: Mapping[str, typing.Any]) -> RunConfig:
    """The run of these settings' values, recorded as the record flags say (goodput thresholds, label, percentiles)."""
    slo = flag_values(args, (slo.name for slo in of_part(Part.SLO)))
    config = config_from_values({**values, **slo}, label=args.label, percentiles=tuple(args.percentiles))
    if problems := ignored_load_settings(config.load, given_settings(args)):
        raise ConfigError(" ".join(problems))
    return config


def progress_line(state: RunState, phase: str, snap, pace=None) -> str:
    """Where a run stands, in one line: its state and phase, then how far its measurement got (`snap`), its time
    left told from past runs (`pace`) until its own output tells."""
    from ..measure.time_left import describe_time_left

    if state != RunState.RUNNING or snap is None:
        return f"{state}: {phase}..." if phase else f"{state}..."
    done = snap.completed + snap.failed + snap.cancelled
    return (
        f"running: {done}/{snap.total_requests} requests done, {snap.in_flight} in flight, "
        f"{snap.output_tokens:,} tokens, {describe_time_left(snap, pace)}"
    )


class ProgressLine(JobObserver):
    """A run's progress line, from what the run tells its observers: its moves, then its live snapshots."""

    def __init__(self) -> None:
        self.state, self.phase, self.snapshot, self.pace = RunState.QUEUED, "", None, None

    def on_state(self, job, change) -> None:
        self.state, self.phase = change.state, change.phase

    def on_snapshot(self, run, snapshot) -> None:
        self.snapshot = snapshot
        self.pace = run.measurement.pace if run is not None else None

    def text(self) -> str:
        return progress_line(self.state, self.phase, self.snapshot, self.pace)


def wait_with_progress(job, describe: Callable[[], str] | None) -> bool:
    """Wait for a run or a sweep, redrawing `describe()` as one line on a terminal (None: no line); False
    when interrupted (Ctrl-C cancels the job, which keeps what it measured). A run interrupted while
    loading is not waited for: a model load cannot be cut short, and there is nothing to keep."""
    show = describe if sys.stderr.isatty() else None
    try:
        while not job.wait(0.5):
            if show is not None:
                redraw(show(), PROGRESS_WIDTH)
    except KeyboardInterrupt:
        job.cancel()
        if not job.wait(CANCEL_GRACE_S) and getattr(job, "state", None) != RunState.LOADING:
            job.wait()
        return False
    finally:
        if show is not None:
            redraw("", PROGRESS_WIDTH)
    return True


def open_history(root: str):
    """The history under `root`, tidied as every start does (History.tidy): what that did is one warning line
    each on stderr; a history that cannot be used raises its HistoryError before any run starts."""
    from ..store.history import History

    history = History(root)
    history.tidy()
    print_notices(history)
    return history


class HistoryRequestError(BenchError):
    """A history action that cannot be done as asked: a run id or column the history does not have, a folder that
    is not a history, a delete not confirmed. Refused before anything is changed."""

    refuses_input = True


def existing_history(results: str):
    """The history in the folder `results`, opened as every command opens it (open_history)."""
    check_history_folder(results)
    return open_history(results)


def check_history_folder(results: str) -> None:
    """Refuse a history folder that is not there: a mistyped --results would read as an empty history."""
    if not Path(results).is_dir():
        raise HistoryRequestError(
            f"there is no history in {results}: no such folder (--results or $BENCH_STUDIO_RESULTS names it)"
        )


def close_match(name: str, columns: Iterable[str]) -> str:
    """ " (did you mean NAME?)" for the one of `columns` closest to `name`, or "" where none is close."""
    found = difflib.get_close_matches(name, [str(column) for column in columns], n=1)
    return f" (did you mean {found[0]}?)" if found else ""


def column_names(text: str) -> tuple[str, ...]:
    """Comma-separated names (--columns, --metrics), each once stripped; an argparse type."""
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    if not names:
        raise argparse.ArgumentTypeError(f"'{text}' names no column")
    return names


def print_notices(history) -> None:
    """What reading or tidying `history` did to its files, one warning line each on stderr."""
    for notice in history.take_notices():
        print(f"warning: {notice}", file=sys.stderr)


def check_writable(history, *csv_paths: str) -> None:
    """Before anything runs: HistoryError unless the run can be recorded in `history` and its row
    appended to each CSV given (an empty path: none)."""
    from ..csvstore import check_csv_writable

    history.check_writable()
    for path in filter(None, csv_paths):
        check_csv_writable(path)


def append_csv_row(path: str, append: Callable[[], None]) -> bool:
    """Call `append` (adding the run's row to the CSV at `path`); False, having said why on stderr,
    when it failed."""
    try:
        append()
    except HistoryError as exc:
        print(f"error: the run's row was not appended to {path}: {exc}", file=sys.stderr)
        return False
    return True


def save_lmdeploy_row(path: str, run) -> None:
    """Append the run's row to the LMDeploy-format CSV at `path`, as profile_pipeline_api.py does."""
    from ..store.history_import import lmdeploy_hyperparams

    run.profiler.save_csv(path, lmdeploy_hyperparams(run.config))


def report_unmeasured(run) -> int | None:
    """Print the run's warnings; for a run that failed or was interrupted before measuring anything,
    print why and return the exit code (2 when the user's input was at fault)."""
    for warning in run.measurement.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if run.measurement.measured:
        return None
    if run.state == RunState.FAILED:
        print(f"error: {run.message}", file=sys.stderr)
        if run.measurement.save_error:
            print(f"error: {run.measurement.save_error}", file=sys.stderr)
        return EXIT_BAD_INPUT if run.user_error else EXIT_FAILED
    return interrupted(f" while {run.phase or 'waiting to start'}: nothing was measured or recorded")


def print_workload_findings(run) -> None:
    """After the tables, for a run whose dataset is one of ours, with prefix caching on, or whose engine served
    prompt tokens from its cache: what the prefix cache served ("not reported" where the engine does not say,
    never 0) and the mean TTFT turn by turn."""
    import math

    from ..config.catalog import MAX_TURNS
    from ..load import find_dataset
    from ..measure.catalog import METRICS

    record = run.record
    if record is None:
        return
    summary = record.metrics
    hit_rate = summary.get(METRICS["prefix_cache_hit_rate"].column(), math.nan)
    cached = summary.get(METRICS["total_cached_tokens"].column(), math.nan)
    config = record.config
    ran = find_dataset(config.dataset.dataset_name)
    ours = ran is not None and not ran.lmdeploy
    if ours or config.engine.enable_prefix_caching or cached > 0:
        said = (
            f"{cached:,.0f} of {summary['total_input_tokens']:,} prompt tokens cached, hit rate {hit_rate:.3f}"
            if not math.isnan(hit_rate)
            else "not reported (the engine does not say which prompt tokens it had cached)"
        )
        print(f"Prefix cache: {said}")
    turns = [
        (turn, summary[column])
        for turn in range(1, MAX_TURNS + 1)
        if (column := METRICS[f"ttft_turn{turn}"].column()) in summary
    ]
    if turns:
        print("Mean TTFT by turn (ms): " + ", ".join(f"{turn}: {value:.1f}" for turn, value in turns))


def print_hardware_findings(run) -> None:
    """After the tables: the warm-up, speculative decoding's acceptance where it was asked for ("not reported"
    where the engine reported none), a random-weight model said as such, the run's telemetry and its server's own
    metrics (the catalog's sampled and served metrics it has), the acceptance by draft position where the server
    decoded speculatively ("not reported" where it counts no positions) and its roofline verdict with the numbers
    behind it."""
    from ..hardware.roofline import describe_roofline
    from ..measure.catalog import METRICS, NOT_REPORTED, SPECULATIVE_COLUMNS
    from ..views.acceptance_charts import describe_acceptance_by_position
    from ..views.tables import quantity_table

    record = run.record
    if record is None:
        return
    if run.measurement.warmup_seconds is not None:
        print(
            f"Warm-up: {record.config.load.warmup_requests} requests in {run.measurement.warmup_seconds:.2f} s, "
            "before the clock started (not measured)."
        )
    engine = record.config.engine
    # The engine's settings say it speculates; a server (SGLang's /generate) says so in its answers.
    if engine.speculative_algorithm or any(key in record.metrics for key in SPECULATIVE_COLUMNS):
        figures = [
            f"{METRICS[key].label.lower()} "
            + (f"{record.metrics[key]:.3g} {METRICS[key].unit}" if key in record.metrics else NOT_REPORTED)
            for key in SPECULATIVE_COLUMNS
        ]
        how = (
            f"{engine.speculative_algorithm}, {engine.speculative_num_draft_tokens} draft tokens per step"
            if engine.speculative_algorithm
            else "the server's count per request"
        )
        print(f"Speculative decoding ({how}): {'; '.join(figures)}.")
    if record.model is not None and record.model.random_weights:
        print(f"Random-weight run ({record.model.name}): the timings are real, the generated text is not.")
    for title, formula in (("Telemetry", "sampled"), ("Server metrics", "served")):
        found = quantity_table(record.metrics, formula)
        if not found.empty:
            print(f"{title}: " + "; ".join(f"{row.quantity} {row.value:,.3g} {row.unit}" for row in found.itertuples()))
    if (by_position := describe_acceptance_by_position(record.metrics)) is not None:
        print(by_position)
    if record.roofline is not None:
        print("\n".join(describe_roofline(record.roofline)))


def interrupted(detail: str = "") -> int:
    """Say in one line that Ctrl-C stopped the command; its exit code."""
    print(f"interrupted{detail}", file=sys.stderr)
    return EXIT_INTERRUPTED


def report_saved(run, history) -> None:
    """The run's last line: the history it is in, or why it is not and where it was kept instead; before it, what
    saving did to the history's files (a history.csv edited by hand, kept under another name)."""
    print_notices(history)
    if run.measurement.save_error:
        print(f"error: run {run.run_id} ({run.state}): {run.measurement.save_error}", file=sys.stderr)
    else:
        print(f"run {run.run_id}: {run.state} in {history.csv_path}", file=sys.stderr)


def warn_flags(run, prefix: str = "") -> None:
    """A warning line on stderr for each flag of the run (hardware/run_flags.py), with its numbers: an engine that
    shared the machine's CPU with other processes, a client that could not keep up with the server."""
    from ..hardware.run_flags import run_flags

    record = run.record
    for note in run_flags(record.metrics, record.environment.get("cpu_count")) if record is not None else ():
        print(f"warning: {prefix}{note}", file=sys.stderr)


def report_swept_run(run) -> bool:
    """A sweep's or a tune's run said on stderr: its warnings, its flags and why it was not saved; whether it was."""
    for warning in run.measurement.warnings:
        print(f"warning: {run.run_id}: {warning}", file=sys.stderr)
    warn_flags(run, f"{run.run_id}: ")
    if run.measurement.save_error:
        print(f"error: run {run.run_id}: {run.measurement.save_error}", file=sys.stderr)
        return False
    return True


def report_outcome(run, completed: bool, csv_saved: bool = True) -> int:
    """Say on stderr why a measured run failed or is partial; its exit code (see EXIT_CODES_HELP).
    A run that was not saved, in its history or in the CSV (`csv_saved`), has failed."""
    if not completed or run.state == RunState.CANCELLED:
        return EXIT_INTERRUPTED
    if run.state == RunState.FAILED:
        print(f"error: {run.message}", file=sys.stderr)
        return EXIT_FAILED
    code = EXIT_OK
    if run.state == RunState.PARTIAL:
        print(f"warning: {run.message}", file=sys.stderr)
        code = EXIT_PARTIAL
    return code if csv_saved and not run.measurement.save_error else EXIT_FAILED


def sweep_outcome(completed: bool, state: str, saved: bool) -> int:
    """A sweep's exit code (see SWEEP_EXIT_CODES_HELP): from whether its wait ended without Ctrl-C, its state and
    whether every run was saved."""
    if not completed or state == RunState.CANCELLED:
        return EXIT_INTERRUPTED
    return EXIT_OK if state == RunState.FINISHED and saved else EXIT_FAILED


def run_each(
    history,
    configs: Iterable[RunConfig | Preflighted],
    csv_path: str,
    show: Callable[[typing.Any], Callable[[], None]],
    exports: Sequence[ExportRequest] = (),
) -> int:
    """Run each config in turn (one `preflight.check_run` passed is not checked again), waiting with a progress line. A run that measured something is shown (`show(run)`
    prints its result and returns what appends its row to the CSV at `csv_path`, when it has one), recorded in
    the history and reported. The exit code: the first run that measured nothing or was interrupted ends the
    command with its own; else the worst of the runs' codes, failed before partial. The `exports` of the runs that
    ended (what a failed one left) are written at the end; one that cannot be written fails a command that would
    have succeeded."""
    ended: list = []  # the runs that ended, for the exports
    status = _run_each(history, configs, csv_path, show, ended)
    if exports and ended and not write_exports(exports, runs_subject(history, ended)) and status == EXIT_OK:
        return EXIT_FAILED
    return status


def _run_each(
    history,
    configs: Iterable[RunConfig | Preflighted],
    csv_path: str,
    show: Callable[[typing.Any], Callable[[], None]],
    ended: list,
) -> int:
    from ..run.runner import Runner

    runner = Runner(history)
    status, run = EXIT_OK, None
    try:
        for config in configs:
            # Only a line on a terminal observes the run: a run with observers publishes its progress as it measures.
            line = ProgressLine() if sys.stderr.isatty() else None
            # ConfigError before anything is written, for a config not checked yet.
            run = runner.submit(config, observers=[line] if line else [])
            completed = wait_with_progress(run, line.text if line else None)
            if not run.active and (run.record is not None or history.row(run.run_id) is not None):
                ended.append(run)
            if (code := report_unmeasured(run)) is not None:
                return code
            append_row = show(run)
            print_workload_findings(run)
            print_hardware_findings(run)
            warn_flags(run)
            csv_saved = True
            if run.state in MEASURED and csv_path:
                csv_saved = append_csv_row(csv_path, append_row)
            report_saved(run, history)
            code = report_outcome(run, completed, csv_saved)
            if code == EXIT_INTERRUPTED:
                return code
            if status != EXIT_FAILED and code != EXIT_OK:
                status = code
    finally:
        if run is None or not run.active:  # a load left behind by Ctrl-C cannot be cut short; the process ends anyway
            runner.shutdown()
    return status
