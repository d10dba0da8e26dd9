"""The headless CLI: `python -m bench_core pipeline DATASET MODEL [flags]` and helpers.

`pipeline` accepts profile_pipeline_api.py's flags with the same names and defaults, runs the
benchmark through the same runner the dashboard uses, prints LMDeploy's summary table (our extra
rows below it), appends LMDeploy's CSV row to --csv and records the run in the history.
Bad input is one line on stderr and exit code 2: found in the flags, nothing is written; found while
loading (a dataset, a model), the run is recorded as failed. EXIT_CODES_HELP says what each code means.
`sweep pipeline ... --sweep NAME=V1,V2` runs one such benchmark per point of a sweep (see cli_sweep).
"""

from __future__ import annotations

import argparse
import os
import sys
import typing

from . import __version__
from .config import (
    DATASET_NAMES,
    ENGINE_KNOBS,
    IN_PROCESS_BACKENDS,
    LOAD_PATTERNS,
    SLO,
    DatasetConfig,
    EngineConfig,
    GenerationSettings,
    LoadConfig,
    RunConfig,
    parse_quant_policy,
)
from .errors import BenchError, ConfigError, HistoryError

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_PARTIAL, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
EXIT_CODES_HELP = """exit codes:
  0    finished: every request succeeded
  1    failed: no request succeeded, the engine broke, or the results could not be saved
       (the reasons are on stderr, with the folder where an unsaved run was kept instead)
  2    bad input: a flag, the dataset, the model, or lengths beyond the model's context window
  3    partial: some requests failed; the numbers count the successful ones (the reasons are on stderr)
  130  interrupted (Ctrl-C); what was measured is kept"""
PROGRESS_WIDTH = 120  # characters of the progress line redrawn on a terminal
CANCEL_GRACE_S = 0.5  # how long Ctrl-C waits for a loading run to notice before leaving it behind
LOG_LEVELS = ("CRITICAL", "FATAL", "ERROR", "WARN", "WARNING", "INFO", "DEBUG", "NOTSET")


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Shows each flag's default, as LMDeploy's scripts do."""


class _Parser(argparse.ArgumentParser):
    """Reports a usage mistake as one line on stderr and exit code 2."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message} (see --help)\n")


def _optional(kind):
    """Parse an optional value: an empty string means 'not set', like a missing flag."""

    def parse(text: str):
        return None if text.strip() == "" else kind(text)

    parse.__name__ = kind.__name__
    return parse


def _percentiles(text: str) -> tuple[float, ...]:
    values = tuple(float(p) for p in text.split(",") if p.strip())
    if not values:
        raise ValueError(text)
    return values


_percentiles.__name__ = "comma-separated numbers"


def _quant_policy(text: str) -> int:
    try:
        return parse_quant_policy(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
_ENGINE_TYPES = typing.get_type_hints(EngineConfig)
# The in-process engines' knobs; a server's settings are the `restful` command's flags.
PIPELINE_KNOBS = tuple(knob for knob in ENGINE_KNOBS if set(knob.backends) & set(IN_PROCESS_BACKENDS))


def _add_knob(group, knob) -> None:
    """A knob's flag. Not given, it is absent from the parsed arguments (argparse.SUPPRESS), so a flag the user
    typed is told apart from a default: `engine_knobs_from_args` refuses one the backend does not use."""
    hint = _ENGINE_TYPES[knob.name]
    backends = ", ".join(knob.backends)
    constraint = f"; {knob.constraint}" if knob.constraint else ""
    kwargs: dict = {"dest": knob.name, "default": argparse.SUPPRESS,
                    "help": f"{knob.help} (default: {knob.default}; for {backends}{constraint})".replace("%", "%%")}
    if hint is bool:
        kwargs["action"] = "store_true"
    elif knob.name == "quant_policy":
        kwargs["type"] = _quant_policy
    else:
        base = next(t for t in typing.get_args(hint) or (hint,) if t is not type(None))
        kwargs["type"] = _optional(base) if knob.default is None else base
        if knob.choices is not None:
            kwargs["choices"] = [c for c in knob.choices if c is not None]
    group.add_argument(knob.flag, **kwargs)


def add_pipeline_arguments(pipe: argparse.ArgumentParser) -> None:
    """The `pipeline` command's arguments and flags (profile_pipeline_api.py's, then ours); `sweep pipeline`
    takes the same ones."""
    pipe.add_argument("dataset", help="ShareGPT dataset: a JSON or JSONL path, builtin:sharegpt or builtin:sample")
    pipe.add_argument("model_path", help="a local folder, a hub id, or builtin:smollm2-135m / builtin:tiny-llama")
    pipe.add_argument("-c", "--concurrency", type=int, default=256,
                      help="requests in flight at once; LMDeploy's engines also take it as max_batch_size")
    pipe.add_argument("-n", "--num-prompts", type=int, default=5000, help="number of prompts to process")
    pipe.add_argument("--csv", default="./profile_pipeline_api.csv",
                      help="LMDeploy-format CSV to append the result to; an empty string disables it")
    pipe.add_argument("--seed", type=int, default=0, help="seed used in sampling prompts from the dataset")
    pipe.add_argument("--stream-output", action="store_true",
                      help="stream tokens (needed for TTFT, ITL and tokens-per-tick statistics)")
    pipe.add_argument("--dataset-name", default="sharegpt", choices=DATASET_NAMES,
                      help="sharegpt: real conversations; random: lengths drawn at random, text from the dataset")
    pipe.add_argument("--sharegpt-output-len", type=int, default=None,
                      help="fixed output length for every request, instead of the dataset's")
    pipe.add_argument("--random-input-len", type=int, default=None, help="input tokens per request (random dataset)")
    pipe.add_argument("--random-output-len", type=int, default=None, help="output tokens per request (random dataset)")
    pipe.add_argument("--random-range-ratio", type=float, default=0.0,
                      help="lengths are drawn from [len*ratio, len]; 1.0 gives fixed lengths (random dataset)")
    pipe.add_argument("--top-p", type=float, default=0.8, help="top-p sampling (LMDeploy's engines decode greedily)")
    pipe.add_argument("--top-k", type=int, default=1, help="top-k sampling (LMDeploy's engines decode greedily)")
    pipe.add_argument("-temp", "--temperature", type=float, default=0.8,
                      help="sampling temperature (LMDeploy's engines decode greedily)")
    pipe.add_argument("--log-level", default="WARNING", choices=LOG_LEVELS, help="LMDeploy's log level")
    pipe.add_argument("--backend", default="turbomind", choices=IN_PROCESS_BACKENDS,
                      help="turbomind or pytorch (LMDeploy, NVIDIA GPU), or transformers (embedded, CPU or GPU)")
    pipe.add_argument("--trust-remote-code", action="store_true", help="trust remote code when loading hf models")

    ours = pipe.add_argument_group("LLM Bench Studio")
    ours.add_argument("--load", dest="load_pattern", default="batch",
                      choices=[p for p in LOAD_PATTERNS if p != "request_rate"],  # a rate: the restful command
                      help="batch: every request starts at t0 and waits for a slot (LMDeploy's pipeline); "
                           "concurrency: a request starts when a worker picks it up (profile_throughput.py)")
    ours.add_argument("--label", default="", help="a label for this run in the history")
    ours.add_argument("--results", default=os.environ.get("BENCH_STUDIO_RESULTS", "results"),
                      help="folder of the run history (history.csv and runs/); env BENCH_STUDIO_RESULTS")
    ours.add_argument("--percentiles", type=_percentiles, default=(50, 75, 95, 99),
                      help="latency percentiles to report, comma-separated")
    for metric in ("ttft", "tpot", "e2e"):
        ours.add_argument(f"--slo-{metric}-ms", type=float, default=None,
                          help=f"goodput threshold on {metric.upper()} in ms; a request is good when it meets all set")

    groups = {}
    for knob in PIPELINE_KNOBS:
        if knob.group not in groups:
            groups[knob.group] = pipe.add_argument_group(f"{knob.group} arguments")
        _add_knob(groups[knob.group], knob)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m bench_core", description="LLM Bench Studio, headless.")
    parser.add_argument("--version", action="version", version=f"LLM Bench Studio {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    pipe = commands.add_parser(
        "pipeline",
        formatter_class=_HelpFormatter,
        epilog=EXIT_CODES_HELP,
        help="benchmark a model in process, as LMDeploy's profile_pipeline_api.py does",
        description=(
            "Benchmark a model in process with the semantics of LMDeploy's profile_pipeline_api.py.\n"
            "DATASET is a ShareGPT JSON/JSONL file, builtin:sharegpt or builtin:sample. MODEL is a local\n"
            "folder, a hub id, or a built-in model (builtin:smollm2-135m, builtin:tiny-llama).\n"
            "On a machine without an NVIDIA GPU, use --backend transformers.\n\n"
            "example: python -m bench_core pipeline builtin:sharegpt builtin:smollm2-135m "
            "--backend transformers -n 32 -c 8 --stream-output"
        ),
    )
    add_pipeline_arguments(pipe)
    from .cli_sweep import add_sweep_parser  # here, not at the top: cli_sweep builds on this module

    add_sweep_parser(commands)
    from .cli_restful import add_restful_parser  # likewise

    add_restful_parser(commands)

    model_path = commands.add_parser("model-path", help="print the local folder of a built-in model, building it if needed")
    model_path.add_argument("name", help="builtin:smollm2-135m or builtin:tiny-llama")
    return parser


def engine_knobs_from_args(args: argparse.Namespace) -> dict:
    """The knob flags given on the command line; ConfigError naming each one that --backend does not use."""
    given = {knob: getattr(args, knob.name) for knob in PIPELINE_KNOBS if hasattr(args, knob.name)}
    problems = [knob.not_applicable(args.backend) for knob in given if args.backend not in knob.backends]
    if problems:
        raise ConfigError(" ".join(problems))
    return {knob.name: value for knob, value in given.items()}


def config_from_args(args: argparse.Namespace) -> RunConfig:
    engine = EngineConfig(
        backend=args.backend,
        model=args.model_path,
        **engine_knobs_from_args(args),
        trust_remote_code=args.trust_remote_code,
        log_level=args.log_level,
    )
    dataset = DatasetConfig(
        dataset=args.dataset,
        dataset_name=args.dataset_name,
        num_prompts=args.num_prompts,
        seed=args.seed,
        sharegpt_output_len=args.sharegpt_output_len,
        random_input_len=args.random_input_len,
        random_output_len=args.random_output_len,
        random_range_ratio=args.random_range_ratio,
    )
    load = LoadConfig(load_pattern=args.load_pattern, concurrency=args.concurrency, stream_output=args.stream_output)
    generation = GenerationSettings(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k)

    def seconds(ms):
        return None if ms is None else ms / 1000.0

    slo = SLO(ttft=seconds(args.slo_ttft_ms), tpot=seconds(args.slo_tpot_ms), e2e=seconds(args.slo_e2e_ms))
    return RunConfig(engine=engine, dataset=dataset, load=load, generation=generation, slo=slo,
                     label=args.label, percentiles=tuple(args.percentiles))


def _progress_line(run) -> str:
    from .live_snapshot import describe_time_left

    snap = run.snapshot()
    if run.state != "running" or snap is None:
        return f"{run.state}: {run.phase}..." if run.phase else f"{run.state}..."
    done = snap.completed + snap.failed + snap.cancelled
    return (f"running: {done}/{snap.total_requests} requests done, {snap.in_flight} in flight, "
            f"{snap.output_tokens:,} tokens, {describe_time_left(snap)}")


def wait_with_progress(job, describe=None) -> bool:
    """Wait for a run or a sweep, redrawing `describe()` as one line on a terminal; False when
    interrupted (Ctrl-C cancels the job, which keeps what it measured). A run interrupted while
    loading is not waited for: a model load cannot be cut short, and there is nothing to keep."""
    describe = describe or (lambda: _progress_line(job))
    show = sys.stderr.isatty()
    try:
        while not job.wait(0.5):
            if show:
                print(f"\r{describe()[:PROGRESS_WIDTH]:<{PROGRESS_WIDTH}}", end="", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        from .runner import LOADING

        job.cancel()
        if not job.wait(CANCEL_GRACE_S) and getattr(job, "state", None) != LOADING:
            job.wait()
        return False
    finally:
        if show:
            print("\r" + " " * PROGRESS_WIDTH + "\r", end="", file=sys.stderr, flush=True)
    return True


def check_writable(history, *csv_paths: str) -> None:
    """Before anything runs: HistoryError unless the run can be recorded in `history` and its row
    appended to each CSV given (an empty path: none)."""
    from .csvstore import check_csv_writable

    history.check_writable()
    for path in filter(None, csv_paths):
        check_csv_writable(path)


def append_csv_row(path: str, append: typing.Callable[[], None]) -> bool:
    """Call `append` (adding the run's row to the CSV at `path`); False, having said why on stderr,
    when it failed."""
    try:
        append()
    except HistoryError as exc:
        print(f"error: the run's row was not appended to {path}: {exc}", file=sys.stderr)
        return False
    return True


def report_unmeasured(run) -> int | None:
    """Print the run's warnings; for a run that failed or was interrupted before measuring anything,
    print why and return the exit code (2 when the user's input was at fault)."""
    for warning in run.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    from .runner import FAILED

    if run.profiler is not None:
        return None
    if run.state == FAILED:
        print(f"error: {run.message}", file=sys.stderr)
        if run.save_error:
            print(f"error: {run.save_error}", file=sys.stderr)
        return EXIT_BAD_INPUT if run.user_error else EXIT_FAILED
    return interrupted(f" while {run.phase or 'waiting to start'}: nothing was measured or recorded")


def interrupted(detail: str = "") -> int:
    """Say in one line that Ctrl-C stopped the command; its exit code."""
    print(f"interrupted{detail}", file=sys.stderr)
    return EXIT_INTERRUPTED


def report_saved(run, history) -> None:
    """The run's last line: the history it is in, or why it is not and where it was kept instead."""
    if run.save_error:
        print(f"error: run {run.run_id} ({run.state}): {run.save_error}", file=sys.stderr)
    else:
        print(f"run {run.run_id}: {run.state} in {history.csv_path}", file=sys.stderr)


def report_outcome(run, completed: bool, csv_saved: bool = True) -> int:
    """Say on stderr why a measured run failed or is partial; its exit code (see EXIT_CODES_HELP).
    A run that was not saved, in its history or in the CSV (`csv_saved`), has failed."""
    from .runner import CANCELLED, FAILED, PARTIAL

    if not completed or run.state == CANCELLED:
        return EXIT_INTERRUPTED
    if run.state == FAILED:
        print(f"error: {run.message}", file=sys.stderr)
        return EXIT_FAILED
    code = EXIT_OK
    if run.state == PARTIAL:
        print(f"warning: {run.message}", file=sys.stderr)
        code = EXIT_PARTIAL
    return code if csv_saved and not run.save_error else EXIT_FAILED


def open_history(root: str):
    """The history under `root`, tidied as every start does (History.tidy): what that did is one warning line
    each on stderr; a history that cannot be used raises its HistoryError before any run starts."""
    from .history import History

    history = History(root)
    history.tidy()
    for notice in history.take_notices():
        print(f"warning: {notice}", file=sys.stderr)
    return history


def run_pipeline(args: argparse.Namespace) -> int:
    from .config import lmdeploy_hyperparams
    from .runner import MEASURED, Runner

    config = config_from_args(args)
    history = open_history(args.results)
    check_writable(history, args.csv)
    runner = Runner(history)
    run = runner.submit(config)  # raises ConfigError before anything is written
    completed = wait_with_progress(run)
    if (code := report_unmeasured(run)) is not None:
        return code
    run.profiler.summarize(
        "Profile Pipeline API",
        [("Concurrency", config.load.concurrency), ("Stream output", config.load.stream_output)],
    )
    csv_saved = True
    if run.state in MEASURED and args.csv:
        csv_saved = append_csv_row(args.csv, lambda: run.profiler.save_csv(args.csv, lmdeploy_hyperparams(config)))
    report_saved(run, history)
    runner.shutdown()
    return report_outcome(run, completed, csv_saved)


def _quiet_libraries() -> None:
    """Keep the terminal for our table: no weight-loading bars or tokenizer length warnings."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main(argv: list[str] | None = None) -> int:
    _quiet_libraries()
    try:
        args = build_parser().parse_args(argv)
        if args.command == "model-path":
            from .models import resolve_model

            print(resolve_model(args.name))
            return EXIT_OK
        if args.command == "sweep":
            from .cli_sweep import run_sweep

            return run_sweep(args)
        if args.command == "restful":
            from .cli_restful import run_restful

            return run_restful(args)
        return run_pipeline(args)
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:  # outside a run's wait: importing, checking the server, printing, writing
        return interrupted()
