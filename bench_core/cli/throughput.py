"""`python -m bench_core throughput DATASET MODEL [flags]`: benchmark a model through its engine API, as LMDeploy's
profile_throughput.py does.

It accepts profile_throughput.py's flags with the same names, defaults and order (streaming on, --no-stream-output
to turn it off; -c workers, at most -n of them; --skip-tokenize, --skip-detokenize, --cancel-rate, --use-uvloop;
the sampling flags handed to the engine), runs the engine_api load pattern through the same runner as the dashboard,
prints LMDeploy's "Profile Throughput" summary with its extra rows (our rows below it), appends LMDeploy's CSV row to
--csv and records the run in the history.
"""

from __future__ import annotations

import argparse
import typing

from ..config import Part, RunConfig, setting
from ..engines import in_process_backends
from ..measure.window import WINDOW_SETTINGS
from ..states import LoadPattern
from .common import (
    LENGTH_FLAGS,
    Flag,
    ScriptCommand,
    add_flags,
    add_knob_flags,
    add_record_flags,
    dataset_name_flag,
    in_process_knobs,
    knob_flag,
    unlisted_flags,
)

# profile_throughput.py's flags, in its order: before --csv, then after it up to its argument groups.
POSITIONAL = (
    Flag("dataset", positional=True, help="ShareGPT dataset: a JSON or JSONL path, builtin:sharegpt or builtin:sample"),
    Flag(
        "model",
        positional=True,
        dest="model_path",
        help="a local folder, a hub id, builtin:smollm2-135m / builtin:tiny-llama, or synthetic:<preset>[:key=value,...]",
    ),
    Flag(
        "concurrency",
        help="number of workers taking the prompts in turn, at most -n of them; LMDeploy's engines "
        "also take it as max_batch_size (TurboMind: divided by --dp)",
    ),
    "num_prompts",
    Flag("stream_output", names=("--no-stream-output",), negated=True, help="do not stream (no TTFT or ITL)"),
    "skip_tokenize",
    "skip_detokenize",
    "cancel_rate",
    "use_uvloop",
)
SEED = ("seed",)
DISTRIBUTED = "distributed_executor_backend"  # a knob, listed by the script among its plain flags, after --seed
SCRIPT_FLAGS = (
    dataset_name_flag(),
    *LENGTH_FLAGS,
    "trust_remote_code",
    *(
        Flag(
            name,
            help=f"{setting(name).cli_help.split(' (')[0]}, handed to the engine as profile_throughput.py hands it",
        )
        for name in ("top_p", "temperature", "top_k")
    ),
    Flag("backend", default="turbomind", choices=in_process_backends()),
)
# Its argument groups. It lists the knobs both engines take in its PyTorch group and again in its TurboMind one;
# here they are listed once, in a group of their own.
SCRIPT_KNOB_GROUPS = (
    (
        "PyTorch engine arguments",
        (
            "device",
            "eager_mode",
            "dllm_block_length",
            "dllm_unmasking_strategy",
            "dllm_denoising_steps",
            "dllm_confidence_threshold",
        ),
    ),
    (
        "Speculative decoding arguments",
        ("speculative_algorithm", "speculative_draft_model", "speculative_num_draft_tokens"),
    ),
    (
        "PyTorch and TurboMind engine arguments",
        ("tp", "cache_max_entry_count", "cache_block_seq_len", "enable_prefix_caching", "quant_policy", "dtype"),
    ),
    (
        "TurboMind engine argument",
        ("dp", "cp", "model_format", "num_tokens_per_iter", "max_prefill_iters", "async_", "communicator"),
    ),
)
# Ours: the warm-up; the log level, which their script fixes at ERROR; the dataset's settings it lacks.
OUR_FLAGS = (
    "warmup_requests",
    "cache_state",
    *WINDOW_SETTINGS,
    Flag("log_level", default="ERROR", help="LMDeploy's log level (profile_throughput.py fixes it at ERROR)"),
    *unlisted_flags(Part.DATASET, POSITIONAL, SEED, SCRIPT_FLAGS),
)


class ThroughputCommand(ScriptCommand):
    name = "throughput"
    help = "benchmark a model through its engine API, as LMDeploy's profile_throughput.py does"
    description = (
        "Benchmark a model through its engine API with the semantics of LMDeploy's profile_throughput.py:\n"
        "-c workers take the prompts in turn, each request's clock starting when a worker picks it up;\n"
        "its prompt is tokenized then (or before the clock with --skip-tokenize: token ids go in), its output\n"
        "detokenized as it streams (unless --skip-detokenize), and --cancel-rate cancels that share of the\n"
        "requests part way, drawn from --seed, counted as cancelled. Streaming is on (--no-stream-output).\n"
        "On turbomind and pytorch it drives LMDeploy's engine itself (create_instance / async_stream_infer);\n"
        "on transformers, the embedded engine, the same way, on a CPU too.\n"
        "DATASET and MODEL are as for the pipeline command.\n\n"
        "example: python -m bench_core throughput builtin:sharegpt builtin:smollm2-135m "
        "--backend transformers -n 32 -c 8 --cancel-rate 0.25"
    )
    sweep_help = "sweep the engine-API benchmark (profile_throughput.py's flags)"
    title = "Profile Throughput"
    flags = (*POSITIONAL, *SEED, *SCRIPT_FLAGS, *OUR_FLAGS)
    # The engine API, and the sampling flags handed to the engine as theirs are (top_k 1, the default, is greedy).
    fixed = {"load_pattern": LoadPattern.ENGINE_API, "do_sample": True}

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """profile_throughput.py's arguments and flags, then ours."""
        add_flags(parser, POSITIONAL)
        parser.add_argument(
            "--csv",
            default="./profile_throughput.csv",
            help="LMDeploy-format CSV to append the result to; an empty string disables it",
        )
        add_flags(parser, SEED)
        knob_flag(setting(DISTRIBUTED)).add(parser)
        add_flags(parser, SCRIPT_FLAGS)
        add_knob_flags(parser, [knob for knob in in_process_knobs() if knob.name != DISTRIBUTED], SCRIPT_KNOB_GROUPS)
        ours = parser.add_argument_group("LLM Bench Studio")
        add_flags(ours, OUR_FLAGS)
        add_record_flags(
            ours,
            label_help="a label for this run in the history",
            percentiles_help="latency percentiles to report, comma-separated",
        )

    def summary_rows(self, config: RunConfig) -> list[tuple[str, typing.Any]]:
        load = config.load
        return [
            ("Concurrency", load.concurrency),
            ("Cancel rate", load.cancel_rate),
            ("Stream output", str(load.stream_output).lower()),
            ("Skip tokenize", str(load.skip_tokenize).lower()),
            ("Skip detokenize", str(load.skip_detokenize).lower()),
        ]
