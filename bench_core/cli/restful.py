"""`python -m bench_core restful`: benchmark an OpenAI-compatible server as profile_restful_api.py does.

The flags are profile_restful_api.py's, with the same names and defaults (reference §4.1), except
where theirs cannot work here: the default backend is lmdeploy (theirs is sglang, which with sglang-native
sends to SGLang's native /generate API: both are here too, and their answers carry each request's speculative
acceptance, which lands in the same columns and metrics as the embedded engine's) and the default dataset is the
built-in ShareGPT copy (instead of a download). Ours follow: vLLM's max concurrency, burstiness, a duration, warm-up
count, and the history flags. Each rate runs through the same runner as the dashboard, is recorded
in the history, prints profile_restful_api.py's "Serving Benchmark Result" box (our rows below it)
and appends their CSV row to --output-file. Bad input or a server that cannot be reached is one
line on stderr and exit code 2, with nothing written.
"""

from __future__ import annotations

import argparse
import math
import os
from datetime import datetime

from .. import csvstore
from ..config import EngineConfig, Part, RunConfig
from ..config.catalog import BY_NAME, setting
from ..engines.openai_client import check_reachable, discover_model
from ..engines.openai_engine import network_policy
from ..engines.openai_request import REQUEST_DEADLINE_S
from ..errors import ConfigError
from ..exports import Scope
from ..load import dataset
from ..measure import metrics
from ..measure.catalog import BEYOND_LMDEPLOY, METRICS, QUALITY_METRICS, Metric, requested_rate, steady_rows
from ..measure.window import WINDOW_SETTINGS, steady_load
from ..run.preflight import check_run
from ..states import LoadPattern
from ..store.history_import import RESTFUL_COLUMNS
from ..sweep.plan import STARTED_SERVER_URL
from .common import (
    EXIT_CODES_HELP,
    LENGTH_FLAGS,
    EngineCommand,
    Flag,
    add_flags,
    add_record_flags,
    check_export_paths,
    check_report_path,
    check_writable,
    dataset_name_flag,
    flag_values,
    open_history,
    recorded_config,
    run_each,
    unlisted_flags,
    with_report,
)

# Their backend names: (server kind, endpoint). -chat forms use /v1/chat/completions; sglang and sglang-native,
# SGLang's native /generate.
SERVER_BACKENDS = {
    "lmdeploy": ("lmdeploy", "completions"),
    "lmdeploy-chat": ("lmdeploy", "chat"),
    "vllm": ("vllm", "completions"),
    "vllm-chat": ("vllm", "chat"),
    "sglang": ("sglang", "generate"),
    "sglang-native": ("sglang", "generate"),
    "sglang-oai": ("sglang", "completions"),
    "sglang-oai-chat": ("sglang", "chat"),
    "transformers": ("transformers", "completions"),
    "transformers-chat": ("transformers", "chat"),
}
OFFLINE_ENV = "HF_HUB_OFFLINE"  # 1 (our default, as in the app): tokenizers come from local files only
# profile_restful_api.py's flags that are settings, in its order, with its defaults and words.
DATASET_FLAGS = (
    dataset_name_flag(help="name of the dataset"),
    Flag(
        "dataset",
        names=("--dataset-path",),
        help="ShareGPT JSON/JSONL file, builtin:sharegpt or builtin:sample; "
        "for --dataset-name trace or custom, your trace or prompts file",
    ),
    Flag("model", default=None, help="model name sent to the server; default: the first of GET /v1/models"),
    Flag(
        "tokenizer",
        default=None,
        help="tokenizer to sample prompts and retokenize answers (folder, hub id or builtin:...); default: the model. "
        f"Hub ids come from the local cache only, unless {OFFLINE_ENV}=0 allows downloads",
    ),
)
IMAGE_FLAGS = ("image_count", "image_resolution", "image_format", "image_content")
SAMPLING_FLAGS = (
    Flag("num_prompts", names=("--num-prompts",), default=1000),
    *LENGTH_FLAGS,
    *IMAGE_FLAGS,
    "request_rate",
    Flag("seed", default=1),
)
SWITCHES = (
    Flag("stream_output", names=("--disable-stream",), negated=True, help="do not stream (no TTFT or ITL)"),
    Flag("ignore_eos", names=("--disable-ignore-eos",), negated=True, help="let requests stop at EOS"),
)
BODY_FLAGS = (
    Flag(
        "extra_request_body",
        help="JSON object merged into every request, last, so it overrides any field we send, "
        "e.g. '{\"temperature\": 0.6}'",
    ),
    Flag("trust_remote_code", help="trust remote code when loading the tokenizer"),
)
# benchmark_chat_completion.py's sampling flags, with its defaults. At temperature 0 a request is greedy and carries
# profile_restful_api.py's temperature 0.0 only; above it, it samples with all three.
SAMPLING_BODY_FLAGS = (
    Flag(
        "temperature",
        default=0.0,
        help="sampling temperature sent with every request; above 0 top-p and top-k "
        "are sent too (benchmark_chat_completion.py's fields)",
    ),
    Flag("top_p", default=1.0, help="top-p sent with every request when --temperature is above 0"),
    Flag(
        "top_k",
        default=40,
        help="top-k sent with every request when --temperature is above 0 (to lmdeploy, vllm "
        "and sglang servers: OpenAI's API has no top_k)",
    ),
)
# Ours: vLLM's load shape and limits, and the dataset's settings LMDeploy's script lacks.
OUR_FLAGS = (
    *unlisted_flags(Part.DATASET, DATASET_FLAGS, SAMPLING_FLAGS),
    "max_concurrency",
    "burstiness",
    "exact_rate_arrivals",
    "duration_s",
    "trace_speedup",
    "allow_long_schedule",
    "client_processes",
    Flag("warmup_requests", default=1, help="unmeasured warm-up requests (0 with --disable-warmup)"),
    "cache_state",
    *WINDOW_SETTINGS,
    Flag(
        "chat_limit_field",
        help="the field of a -chat backend's requests that limits their output tokens: "
        "profile_restful_api.py's max_completion_tokens, max_tokens (which llama.cpp's "
        "server heeds) or both",
    ),
    Flag(
        "read_timeout_s",
        help="seconds a request may wait for its next token (the first included) before it fails; keep-alive "
        f"comments do not count. A request also fails after {REQUEST_DEADLINE_S / 3600:g} hours in all, "
        "as in profile_restful_api.py",
    ),
    Flag("server_metrics", negated=True),
    "server_metrics_interval_s",
    Flag("proxy_env", negated=True),
    "ca_bundle",
    "insecure",
)
DEFAULT_PORTS = {"lmdeploy": 23333, "sglang": 30000, "vllm": 8000, "transformers": 8000}
BOX_WIDTH = 50
MAX_RATES = 1000  # runs of one --multi: each is a whole benchmark
SUMMARY_PERCENTILES = (50, 99)  # the box's median and P99, whatever --percentiles says


class RestfulCommand(EngineCommand):
    name = "restful"
    help = "benchmark an OpenAI-compatible server, as LMDeploy's profile_restful_api.py does"
    description = (
        "Benchmark an OpenAI-compatible server (LMDeploy api_server, vLLM, SGLang, transformers serve)\n"
        "with the semantics of LMDeploy's profile_restful_api.py and vLLM's bench serve. The API key\n"
        "is read from $OPENAI_API_KEY and never written anywhere.\n\n"
        "Rates for --multi: --request-rate-range START,STOP,STEP is a range as in profile_restful_api.py\n"
        "(STOP excluded; floats allowed), any other count of values is a list; --request-rate-list\n"
        "takes an explicit list of any length (1,2,4 means the rates 1, 2 and 4) and implies --multi.\n\n"
        "example: python -m bench_core restful --backend vllm --port 8000 --num-prompts 200 "
        "--request-rate 8 --max-concurrency 64"
    )
    epilog = EXIT_CODES_HELP + "\n(with several rates: the worst of their codes)"
    sweep_help = "sweep an OpenAI-compatible server (profile_restful_api.py's flags), e.g. over request_rate"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """profile_restful_api.py's flags, then ours."""
        parser.add_argument(
            "--backend",
            default="lmdeploy",
            choices=list(SERVER_BACKENDS),
            help="the server, and with -chat the chat endpoint (sglang and sglang-native: SGLang's native /generate); "
            "sets the default port and how ignore_eos is sent",
        )
        add_flags(parser, (Flag("base_url", default=None, help="server address; overrides --host and --port"),))
        parser.add_argument("--host", default="127.0.0.1", help="server host")
        parser.add_argument(
            "--port",
            type=_port,
            default=None,
            help="server port; default per backend: lmdeploy 23333, sglang 30000, vllm 8000, transformers 8000",
        )
        add_flags(parser, DATASET_FLAGS)
        add_flags(parser, SAMPLING_FLAGS)
        parser.add_argument("--multi", action="store_true", help="run once per rate of --request-rate-range")
        parser.add_argument(
            "--request-rate-range",
            type=_rate_range,
            default="2,34,2",
            help="START,STOP,STEP: a range, STOP excluded (floats allowed); other counts: a list",
        )
        parser.add_argument(
            "--request-rate-list",
            type=_rate_list,
            default=None,
            help="an explicit list of rates, e.g. 1,2,4; implies --multi",
        )
        parser.add_argument(
            "--output-file",
            default=None,
            help="CSV to append profile_restful_api.py's row to; default {backend}_{MMDD}_{num_prompts}_sharegpt.csv, "
            "{backend}_{MMDD}_{num_prompts}_{in}_{out}.csv for random, "
            "{backend}_{MMDD}_{num_prompts}_{dataset}.csv for ours; an empty string disables it",
        )
        add_flags(parser, SWITCHES)
        parser.add_argument("--disable-warmup", action="store_true", help="send no warm-up request")
        add_flags(parser, BODY_FLAGS)
        add_flags(parser, SAMPLING_BODY_FLAGS)

        ours = parser.add_argument_group("LLM Bench Studio")
        add_flags(ours, OUR_FLAGS)
        add_record_flags(
            ours,
            label_help="a label for the run(s) in the history",
            percentiles_help="latency percentiles, comma-separated",
        )

    serves = True

    def build_config(self, args: argparse.Namespace) -> RunConfig:
        """At --request-rate, with the server's model; a sweep that starts its own servers (--server-cmd) reaches each
        at its own port and asks it for its model then."""
        hub_offline_by_default()
        if getattr(args, "server_cmd", ""):
            return config_for_rate(args, STARTED_SERVER_URL, args.model or "", args.request_rate)
        config = config_for_rate(args, base_url(args), args.model or "", args.request_rate)
        config.engine.model = check_server(config.engine)
        return config

    def run(self, args: argparse.Namespace) -> int:
        check_report_path(args.report)
        hub_offline_by_default()
        url = base_url(args)
        configs = [config_for_rate(args, url, args.model or "", rate) for rate in rates(args)]
        check_export_paths(args.export, Scope.RUN if len(configs) == 1 else Scope.COMPARISON)
        checked = [check_run(config) for config in configs]  # every rate's problems before anything is sent
        output_file = default_output_file(args) if args.output_file is None else args.output_file
        history = open_history(args.results)
        check_writable(history, output_file)
        model = check_server(configs[0].engine)
        for config in configs:  # the name the server gave: no setting of the checked run changes with it
            config.engine.model = model

        def show(run):
            config = run.config
            summary = metrics.run_summary(
                run.record.requests,
                run.record.metrics["duration_s"],
                sorted({*config.percentiles, *SUMMARY_PERCENTILES}),
                config.load.stream_output,
                config.slo,
                steady_load(config),
            )
            print_result(args.backend, config, summary)
            return lambda: csvstore.append_row(output_file, restful_csv_row(args.backend, config, summary))

        return run_each(history, checked, output_file, show, with_report(args.export, args.report))


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"the port must be a whole number from 1 to 65535, not '{text}'")
    return port


def _numbers(text: str) -> list[float]:
    try:
        return [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a comma-separated list of numbers") from None


def _rate_range(text: str) -> list[float]:
    """profile_restful_api.py's reading, with floats: three values are a range (stop excluded), others a list."""
    values = _numbers(text)
    if len(values) != 3:
        return values
    start, stop, step = values
    if not step > 0:
        raise argparse.ArgumentTypeError(f"the step of '{text}' must be above 0")
    if not math.isfinite(start + stop + step):
        raise argparse.ArgumentTypeError(f"'{text}' is not a range of finite numbers")
    count = max(0, math.ceil((stop - start) / step - 1e-9))
    if count > MAX_RATES:
        raise argparse.ArgumentTypeError(f"'{text}' is {count:,} rates; a range gives at most {MAX_RATES:,}")
    return [round(start + i * step, 10) for i in range(count)]


def _rate_list(text: str) -> list[float]:
    return _numbers(text)


def base_url(args: argparse.Namespace) -> str:
    """--base-url, else http://HOST:PORT with the backend's default port."""
    if args.base_url:
        return args.base_url
    port = args.port or DEFAULT_PORTS[SERVER_BACKENDS[args.backend][0]]
    return f"http://{args.host}:{port}"


def rates(args: argparse.Namespace) -> list[float]:
    if args.request_rate_list is not None:
        chosen = args.request_rate_list
    elif args.multi:
        chosen = args.request_rate_range
    else:
        chosen = [args.request_rate]
    if not chosen:
        raise ConfigError("The request rates for --multi are empty: check --request-rate-range or --request-rate-list.")
    if dataset(args.dataset_name).timed and len(chosen) > 1:
        raise ConfigError(
            "A trace is sent at its own times, not at a request rate: drop --multi and the rate lists, "
            "or change --trace-speedup (a sweep can vary it)."
        )
    return chosen


def config_for_rate(args: argparse.Namespace, url: str, model: str, rate: float) -> RunConfig:
    """The run at `rate`; a trace's run instead sends each request at its trace time, at most --max-concurrency at
    once (default: no limit)."""
    kind, endpoint = SERVER_BACKENDS[args.backend]
    values = flag_values(
        args, (*DATASET_FLAGS, *SAMPLING_FLAGS, *SWITCHES, *BODY_FLAGS, *SAMPLING_BODY_FLAGS, *OUR_FLAGS)
    )
    values["do_sample"] = values["temperature"] > 0
    if args.disable_warmup:
        values["warmup_requests"] = 0
    values.update(
        backend="openai",
        model=model,
        base_url=url,
        endpoint=endpoint,
        server_kind=kind,
        tokenizer=args.tokenizer or "",
        load_pattern=LoadPattern.REQUEST_RATE,
        request_rate=rate,
    )
    if dataset(args.dataset_name).timed:
        values.update(
            load_pattern=LoadPattern.TRACE,
            concurrency=args.max_concurrency or args.num_prompts,
            max_concurrency=None,
            request_rate=setting("request_rate").default,
        )
    return recorded_config(args, values)


def default_output_file(args: argparse.Namespace) -> str:
    """profile_restful_api.py's default name, always ending in .csv (theirs says .jsonl for random data)."""
    stem = f"{args.backend}_{datetime.now():%m%d}_{args.num_prompts}"
    return f"{stem}_{dataset(args.dataset_name).output_file_tag(args)}.csv"


def hub_offline_by_default() -> None:
    """No model hub lookups unless the user allows them (HF_HUB_OFFLINE=0), as in the app. Called before
    huggingface_hub is imported: it reads the variable once."""
    os.environ.setdefault(OFFLINE_ENV, "1")


def check_server(engine: EngineConfig) -> str:
    """The model to benchmark: the engine's, or the server's first; ServerError when the server cannot be reached
    (by the route the run takes: its proxy, its TLS)."""
    network = network_policy(engine)
    if not engine.model:
        return discover_model(engine.base_url, engine.api_key, network=network)
    check_reachable(engine.base_url, engine.api_key, network=network)
    return engine.model


def restful_csv_row(backend: str, config: RunConfig, summary: dict) -> dict:
    """The row profile_restful_api.py appends: its columns, in its order (its backend, then the settings of their
    names, then the metrics), raw numbers, its definitions (E2E and TPOT end at the stream's last line)."""
    settings = {column: config.value(column) for column in RESTFUL_COLUMNS[1:] if column in BY_NAME}
    values = {
        "backend": backend,
        **settings,
        "completed": summary["completed"],
        "total_input_tokens": summary["total_input_tokens"],
        "total_output_tokens": summary["total_output_tokens"],
        "duration": summary["duration_s"],
        "request_throughput": summary["request_throughput"],
        "input_throughput": summary["input_throughput"],
        "output_throughput": summary["output_throughput"],
        # The timings to the stream's last line come with each request's end: none where the engine failed first.
        "mean_e2e_latency_ms": summary.get("mean_e2e_last_line_ms", math.nan),
        "mean_ttft_ms": summary["mean_ttft_ms"],
        "mean_tpot_ms": summary.get("mean_tpot_last_line_ms", math.nan),
        "mean_itl_ms": summary["mean_itl_ms"],
    }
    return {column: values[column] for column in RESTFUL_COLUMNS}


def _line(name: str, value) -> None:
    if isinstance(value, float):
        value = "-" if math.isnan(value) else f"{value:.2f}"
    print(f"{name:<40} {value!s:<10}")


def _section(title: str, char: str = "-") -> None:
    print(f"{title:{char}^{BOX_WIDTH}}")


def print_result(backend: str, config: RunConfig, summary: dict) -> None:
    """profile_restful_api.py's box (latencies in ms, E2E and TPOT to the stream's last line as it
    measures them), then our rows below its closing rule."""
    _section(" Serving Benchmark Result ", "=")
    _line("Backend:", backend)
    _line("Traffic request rate:", _requested_rate(config, summary))
    _line("Successful requests:", summary["completed"])
    _line("Benchmark duration (s):", summary["duration_s"])
    _line("Total input tokens:", summary["total_input_tokens"])
    _line("Total generated tokens:", summary["total_output_tokens"])
    _line("Total generated tokens (retokenized):", summary.get("total_output_tokens_retokenized", "-"))
    _line("Request throughput (req/s):", summary["request_throughput"])
    _line("Input token throughput (tok/s):", summary["input_throughput"])
    _line("Output token throughput (tok/s):", summary["output_throughput"])
    _section("End-to-End Latency")
    _line("Mean E2E Latency (ms):", summary.get("mean_e2e_last_line_ms", math.nan))  # see restful_csv_row
    _line("Median E2E Latency (ms):", summary.get("p50_e2e_last_line_ms", math.nan))
    for metric, title, name in (
        ("ttft", "Time to First Token", "TTFT"),
        ("tpot_last_line", "Time per Output Token (excl. 1st token)", "TPOT"),
        ("itl", "Inter-token Latency", "ITL"),
    ):
        _section(title)
        _box_statistics(f"{name} (ms)", METRICS[metric], summary)
    _section("", "=")
    _extra_rows(config, summary)


def _requested_rate(config: RunConfig, summary: dict) -> float:
    return requested_rate(config.load.load_pattern, config.load.request_rate, summary)


def _box_statistics(title: str, metric: Metric, summary: dict) -> None:
    """The rows profile_restful_api.py prints of a latency in its box (mean, median, P99), as we print any of them."""
    for statistic, said in (("mean", "Mean"), ("p50", "Median"), ("p99", "P99")):
        _line(f"{said} {title}:", summary.get(metric.column(statistic), math.nan))


def _extra_rows(config: RunConfig, summary: dict) -> None:
    _section("LLM Bench Studio")
    for metric in ("e2e", "tpot"):  # the box's end at the last line; vLLM's, and ours, at the last text
        _line(f"Mean {metric.upper()} to last text (ms):", summary[f"mean_{metric}_ms"])
    for metric, name in (("e2e_last_line", "E2E"), ("ttft", "TTFT"), ("tpot_last_line", "TPOT"), ("itl", "ITL")):
        _line(f"Std {name} (ms):", summary.get(f"std_{metric}_ms", math.nan))
        for q in config.percentiles:
            key = metrics.percentile_key(q)
            _line(f"{key.upper()} {name} (ms):", summary.get(f"{key}_{metric}_ms", math.nan))
    for metric in BEYOND_LMDEPLOY:  # a metric whose columns the run lacks (speculation's, on a server) has no line
        if metric.mean_column in summary:
            _line(f"Mean {metric.row_title}:", summary[metric.mean_column])
    reasoning = METRICS["ttft_reasoning"]  # "-" for a run that streamed no reasoning
    _box_statistics(reasoning.row_title, reasoning, summary)
    for metric in QUALITY_METRICS:  # a run checked against a drift baseline or a quality set
        if metric.column() in summary:
            _line(f"{metric.title}:", summary[metric.column()])
    _line("Failed requests:", summary["failed"])
    _line("Incomplete requests:", summary["incomplete"])
    _line("Overrun requests:", summary.get("overrun", "-"))
    _line("Unfinished requests:", summary["unfinished"])
    _line("Cancelled requests:", summary["cancelled"])
    for reason in filter(None, str(summary["failure_reasons"]).split("; ")):
        print(f"  {reason}")
    _line("Requested rate (req/s):", _requested_rate(config, summary))
    _line(f"{METRICS['achieved_rate'].label} (req/s):", summary.get("achieved_rate", math.nan))
    _line("Mean send lag (ms):", summary.get("mean_send_lag_ms", math.nan))
    _line("Mean slot wait (ms):", summary.get("mean_slot_wait_ms", math.nan))
    _line("Peak requests in flight:", summary.get("peak_in_flight", "-"))
    for title, value in steady_rows(summary):
        if value is None:
            print(title)
        else:
            _line(f"{title}:", value)
    _line("Length mismatches:", summary.get("length_mismatches", "-"))
    if summary.get("length_mismatches", 0) > summary.get("overrun", 0):
        print("  served requests returned fewer tokens than asked: does the server honour ignore_eos?")
    _line("Output counts from:", summary.get("output_len_sources") or "-")
    if summary.get("resent_requests"):  # a server that closes kept-alive connections; absent from most runs
        _line("Resent on a new connection:", summary["resent_requests"])
    if "goodput_rps" in summary:
        _line("Good requests:", summary["good_requests"])
        _line("Goodput (req/s):", summary["goodput_rps"])
    _section("", "=")
