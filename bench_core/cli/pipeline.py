"""`python -m bench_core pipeline DATASET MODEL [flags]`: benchmark a model in process, as LMDeploy's
profile_pipeline_api.py does.

It accepts profile_pipeline_api.py's flags with the same names and defaults, runs the benchmark through
the same runner the dashboard uses, prints LMDeploy's summary table (our extra rows below it), appends
LMDeploy's CSV row to --csv and records the run in the history.
"""

from __future__ import annotations

import argparse
import typing

from ..config import Part, RunConfig, setting
from ..engines import in_process_backends
from ..measure.window import WINDOW_SETTINGS
from ..states import LoadPattern
from ..sweep.plan import parse_sweep_arg
from .common import (
    LENGTH_FLAGS,
    Flag,
    ScriptCommand,
    add_against_no_speculation_flag,
    add_flags,
    add_knob_flags,
    add_record_flags,
    dataset_name_flag,
    in_process_knobs,
    unlisted_flags,
)

# profile_pipeline_api.py's flags, in its order (--csv, not a setting, comes after -n).
POSITIONAL = (
    Flag(
        "dataset",
        positional=True,
        help="ShareGPT dataset: a JSON or JSONL path, builtin:sharegpt or builtin:sample; "
        "for --dataset-name trace or custom, your trace or prompts file",
    ),
    Flag(
        "model",
        positional=True,
        dest="model_path",
        help="a local folder, a hub id, builtin:smollm2-135m / builtin:tiny-llama, or synthetic:<preset>[:key=value,...] "
        "(see above)",
    ),
    "concurrency",
    "num_prompts",
)
SCRIPT_FLAGS = (
    "seed",
    "stream_output",
    dataset_name_flag(),
    *LENGTH_FLAGS,
    "top_p",
    "top_k",
    "temperature",
    "log_level",
    Flag("backend", default="turbomind", choices=in_process_backends()),
    "trust_remote_code",
)
# Ours: the load pattern (the engine API is the throughput command's) with a request rate's arrivals and limit (on
# the embedded engine), the warm-up, and the dataset's settings LMDeploy's script lacks.
LOAD_FLAG = Flag(
    "load_pattern",
    default=None,
    choices=(LoadPattern.BATCH, LoadPattern.CONCURRENCY, LoadPattern.REQUEST_RATE, LoadPattern.TRACE),
)
OUR_FLAGS = (
    LOAD_FLAG,
    "request_rate",
    "trace_speedup",
    "burstiness",
    "exact_rate_arrivals",
    "max_concurrency",
    "warmup_requests",
    "cache_state",
    *WINDOW_SETTINGS,
    "allow_long_schedule",
    *unlisted_flags(Part.DATASET, POSITIONAL, SCRIPT_FLAGS),
)


class PipelineCommand(ScriptCommand):
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
    title = "Profile Pipeline API"
    flags = (*POSITIONAL, *SCRIPT_FLAGS, *OUR_FLAGS)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """profile_pipeline_api.py's arguments and flags, then ours."""
        add_flags(parser, POSITIONAL)
        parser.add_argument(
            "--csv",
            default="./profile_pipeline_api.csv",
            help="LMDeploy-format CSV to append the result to; an empty string disables it",
        )
        add_flags(parser, SCRIPT_FLAGS)
        ours = parser.add_argument_group("LLM Bench Studio")
        add_flags(ours, OUR_FLAGS)
        add_against_no_speculation_flag(ours)
        add_record_flags(
            ours,
            label_help="a label for this run in the history",
            percentiles_help="latency percentiles to report, comma-separated",
        )
        add_knob_flags(parser, in_process_knobs())

    def build_config(self, args: argparse.Namespace) -> RunConfig:
        """The run of the flags; without --load, a rate given (--request-rate, or a sweep over it) picks the
        request_rate pattern, else LMDeploy's batch."""
        pattern = getattr(args, LOAD_FLAG.destination)
        if pattern is None:
            swept = {parse_sweep_arg(text).name for text in getattr(args, "sweep", ())}
            by_rate = args.request_rate != setting("request_rate").default or "request_rate" in swept
            pattern = LoadPattern.REQUEST_RATE if by_rate else setting("load_pattern").default
        return super().build_config(argparse.Namespace(**{**vars(args), LOAD_FLAG.destination: pattern}))

    def summary_rows(self, config: RunConfig) -> list[tuple[str, typing.Any]]:
        load = config.load
        if load.load_pattern == LoadPattern.REQUEST_RATE:
            limit = [("Max concurrency", load.max_concurrency)] if load.max_concurrency else []
            return [("Request rate (req/s)", load.request_rate), *limit, ("Stream output", load.stream_output)]
        return [("Concurrency", load.concurrency), ("Stream output", load.stream_output)]
