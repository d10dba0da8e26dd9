"""`python -m bench_core pipeline DATASET MODEL [flags]`: benchmark a model in process, as LMDeploy's
profile_pipeline_api.py does.

It accepts profile_pipeline_api.py's flags with the same names and defaults, runs the benchmark through
the same runner the dashboard uses, prints LMDeploy's summary table (our extra rows below it), appends
LMDeploy's CSV row to --csv and records the run in the history.
"""

from __future__ import annotations

import argparse
import typing

from ..config import (
    DATASET_NAMES, ENGINE_KNOBS, IN_PROCESS_BACKENDS, LOAD_PATTERNS, EngineConfig, GenerationSettings, LoadConfig,
    RunConfig, parse_quant_policy,
)
from ..errors import ConfigError
from .common import (
    EngineCommand, add_record_flags, check_writable, dataset_from_args, open_history,
    run_config, run_each, save_lmdeploy_row,
)

LOG_LEVELS = ("CRITICAL", "FATAL", "ERROR", "WARN", "WARNING", "INFO", "DEBUG", "NOTSET")
_ENGINE_TYPES = typing.get_type_hints(EngineConfig)
# The in-process engines' knobs; a server's settings are the `restful` command's flags.
PIPELINE_KNOBS = tuple(knob for knob in ENGINE_KNOBS if set(knob.backends) & set(IN_PROCESS_BACKENDS))


def _optional(kind):
    """Parse an optional value: an empty string means 'not set', like a missing flag."""

    def parse(text: str):
        return None if text.strip() == "" else kind(text)

    parse.__name__ = kind.__name__
    return parse


def _quant_policy(text: str) -> int:
    try:
        return parse_quant_policy(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


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


def engine_knobs_from_args(args: argparse.Namespace) -> dict:
    """The knob flags given on the command line; ConfigError naming each one that --backend does not use."""
    given = {knob: getattr(args, knob.name) for knob in PIPELINE_KNOBS if hasattr(args, knob.name)}
    problems = [knob.not_applicable(args.backend) for knob in given if args.backend not in knob.backends]
    if problems:
        raise ConfigError(" ".join(problems))
    return {knob.name: value for knob, value in given.items()}


class PipelineCommand(EngineCommand):
    name = "pipeline"
    help = "benchmark a model in process, as LMDeploy's profile_pipeline_api.py does"
    description = (
        "Benchmark a model in process with the semantics of LMDeploy's profile_pipeline_api.py.\n"
        "DATASET is a ShareGPT JSON/JSONL file, builtin:sharegpt or builtin:sample. MODEL is a local\n"
        "folder, a hub id, a built-in model (builtin:smollm2-135m, builtin:tiny-llama) or a synthetic one:\n"
        "a public shape with random weights, built on first use (synthetic:llama-3.2-1b, synthetic:llama-3.1-8b,\n"
        "synthetic:qwen2.5-7b, synthetic:tiny, ...), a preset with sizes changed (synthetic:llama-3.2-1b:layers=4)\n"
        "or any shape (synthetic:llama:layers=2,hidden=64,intermediate=128,heads=4,kv_heads=2,vocab=4096).\n"
        "On a machine without an NVIDIA GPU, use --backend transformers.\n\n"
        "example: python -m bench_core pipeline builtin:sharegpt builtin:smollm2-135m "
        "--backend transformers -n 32 -c 8 --stream-output"
    )
    sweep_help = "sweep the in-process benchmark (profile_pipeline_api.py's flags)"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """profile_pipeline_api.py's arguments and flags, then ours."""
        parser.add_argument("dataset", help="ShareGPT dataset: a JSON or JSONL path, builtin:sharegpt or builtin:sample")
        parser.add_argument("model_path", help="a local folder, a hub id, builtin:smollm2-135m / builtin:tiny-llama, or "
                                                   "synthetic:<preset>[:key=value,...] (see above)")
        parser.add_argument("-c", "--concurrency", type=int, default=256,
                            help="requests in flight at once; LMDeploy's engines also take it as max_batch_size")
        parser.add_argument("-n", "--num-prompts", type=int, default=5000, help="number of prompts to process")
        parser.add_argument("--csv", default="./profile_pipeline_api.csv",
                            help="LMDeploy-format CSV to append the result to; an empty string disables it")
        parser.add_argument("--seed", type=int, default=0, help="seed used in sampling prompts from the dataset")
        parser.add_argument("--stream-output", action="store_true",
                            help="stream tokens (needed for TTFT, ITL and tokens-per-tick statistics)")
        parser.add_argument("--dataset-name", default="sharegpt", choices=DATASET_NAMES,
                            help="sharegpt: real conversations; random: lengths drawn at random, text from the dataset")
        parser.add_argument("--sharegpt-output-len", type=int, default=None,
                            help="fixed output length for every request, instead of the dataset's")
        parser.add_argument("--random-input-len", type=int, default=None, help="input tokens per request (random dataset)")
        parser.add_argument("--random-output-len", type=int, default=None,
                            help="output tokens per request (random dataset)")
        parser.add_argument("--random-range-ratio", type=float, default=0.0,
                            help="lengths are drawn from [len*ratio, len]; 1.0 gives fixed lengths (random dataset)")
        parser.add_argument("--top-p", type=float, default=0.8,
                            help="top-p sampling (LMDeploy's engines decode greedily)")
        parser.add_argument("--top-k", type=int, default=1, help="top-k sampling (LMDeploy's engines decode greedily)")
        parser.add_argument("-temp", "--temperature", type=float, default=0.8,
                            help="sampling temperature (LMDeploy's engines decode greedily)")
        parser.add_argument("--log-level", default="WARNING", choices=LOG_LEVELS, help="LMDeploy's log level")
        parser.add_argument("--backend", default="turbomind", choices=IN_PROCESS_BACKENDS,
                            help="turbomind or pytorch (LMDeploy, NVIDIA GPU), or transformers (embedded, CPU or GPU)")
        parser.add_argument("--trust-remote-code", action="store_true", help="trust remote code when loading hf models")

        ours = parser.add_argument_group("LLM Bench Studio")
        ours.add_argument("--load", dest="load_pattern", default="batch",
                          choices=[p for p in LOAD_PATTERNS if p != "request_rate"],  # a rate: the restful command
                          help="batch: every request starts at t0 and waits for a slot (LMDeploy's pipeline); "
                               "concurrency: a request starts when a worker picks it up (profile_throughput.py)")
        add_record_flags(ours, label_help="a label for this run in the history",
                         percentiles_help="latency percentiles to report, comma-separated")

        groups = {}
        for knob in PIPELINE_KNOBS:
            if knob.group not in groups:
                groups[knob.group] = parser.add_argument_group(f"{knob.group} arguments")
            _add_knob(groups[knob.group], knob)

    def build_config(self, args: argparse.Namespace) -> RunConfig:
        engine = EngineConfig(
            backend=args.backend,
            model=args.model_path,
            **engine_knobs_from_args(args),
            trust_remote_code=args.trust_remote_code,
            log_level=args.log_level,
        )
        load = LoadConfig(load_pattern=args.load_pattern, concurrency=args.concurrency, stream_output=args.stream_output)
        generation = GenerationSettings(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k)
        return run_config(args, engine, dataset_from_args(args, args.dataset), load, generation)

    def sweep_csv_path(self, args: argparse.Namespace) -> str:
        return args.csv

    def run(self, args: argparse.Namespace) -> int:
        config = self.build_config(args)
        history = open_history(args.results)
        check_writable(history, args.csv)

        def show(run):
            run.profiler.summarize(
                "Profile Pipeline API",
                [("Concurrency", config.load.concurrency), ("Stream output", config.load.stream_output)],
            )
            return lambda: save_lmdeploy_row(args.csv, run)

        return run_each(history, [config], args.csv, show)
