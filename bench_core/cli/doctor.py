"""`python -m bench_core doctor [--smoke]`: check in one screen that this machine can benchmark, and with what.

It prints the versions of Python, torch, transformers, lmdeploy and its TurboMind extension; CUDA, the driver and
each GPU with its free memory (NVML); and each backend, available or not, with the reason and the fix where it is
not. `--smoke` then runs a short benchmark on every available in-process backend through the worker process the
dashboard uses (run.engine_process.ProcessRunner), printing its output tok/s, the roofline verdict and where the run
was recorded. DOCTOR_EXIT_CODES_HELP says what each exit code means.
"""

from __future__ import annotations

import argparse
import platform
import sys

from ..config import EngineConfig, RunConfig, config_from_values
from ..redact import redact_text
from ..states import RunState
from .common import (
    DOCTOR_EXIT_CODES_HELP,
    EXIT_FAILED,
    EXIT_NOT_READY,
    EXIT_OK,
    Command,
    Flag,
    ProgressLine,
    add_flags,
    add_results_flag,
    interrupted,
    open_history,
    wait_with_progress,
)

# A smoke run's size: meant for 20-30 s on a quiet 2-core CPU (README, "doctor", says what was measured); on a
# GPU, enough requests to fill it.
CPU_SMOKE = dict(num_prompts=8, concurrency=8, sharegpt_output_len=48)
GPU_SMOKE = dict(num_prompts=1000, concurrency=256, sharegpt_output_len=128)
_GIB = 1024**3


class DoctorCommand(Command):
    name = "doctor"
    help = "check this machine: versions, GPUs, which backends can run (--smoke: a short run on each)"
    description = (
        "Check in one screen what this machine can benchmark with: the versions of Python, torch, transformers,\n"
        "lmdeploy and its TurboMind extension; CUDA, the driver and each GPU with its free memory (NVML); and\n"
        "each backend, available or not (with the reason and the fix). --smoke runs a short benchmark on each\n"
        "available in-process backend through the dashboard's worker process and records it in the history.\n"
        "--server URL also checks a server as the Run page's Test connection does.\n\n"
        "example: python -m bench_core doctor --smoke"
    )
    epilog = DOCTOR_EXIT_CODES_HELP

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--smoke",
            action="store_true",
            help="run a short benchmark on each available in-process backend (about 20-30 s each)",
        )
        add_flags(
            parser,
            [
                Flag(
                    "model",
                    help="the model the smoke runs benchmark (the dashboard's: a real model that needs no download)",
                )
            ],
        )
        add_results_flag(parser, "folder of the run history the smoke runs are recorded in")
        parser.add_argument(
            "--server",
            metavar="URL",
            help="also check an OpenAI-compatible server: its models, its kind, its /metrics and whether it honours "
            "ignore_eos (the API key: $OPENAI_API_KEY)",
        )
        add_flags(parser, [Flag("server_kind")])

    def run(self, args: argparse.Namespace) -> int:
        from ..engines import availability, backend, backends
        from ..engines.gpu_probe import gpu_facts

        print(f"LLM Bench Studio doctor, {platform.node()}")
        _print_software()
        cuda = gpu_facts().cuda
        _print_gpus(cuda)
        print("Backends")
        reasons = {name: availability(name) for name in backends()}
        for name, reason in reasons.items():
            where = "" if backend(name).in_process else " (a server: python -m bench_core restful --base-url URL)"
            print(f"  {name:<13} {'available' + where if reason is None else 'unavailable: ' + reason}")
        in_process = [name for name, reason in reasons.items() if reason is None and backend(name).in_process]
        broken = [name for name, reason in reasons.items() if reason and backend(name).in_process and cuda]
        code = EXIT_OK if in_process and not broken else EXIT_NOT_READY
        if code == EXIT_NOT_READY:
            print(
                "Not ready: "
                + (
                    f"a GPU is visible but {', '.join(broken)} cannot run on it."
                    if broken
                    else "no in-process backend can run here."
                )
            )
        if args.server is not None and not _server_answers(args.server, args.server_kind):
            code = EXIT_NOT_READY
        if args.smoke and in_process:
            smoked = _smoke(in_process, args.model, args.results, cuda)
            code = smoked if smoked != EXIT_OK else code
        return code


def _server_answers(url: str, server_kind: str) -> bool:
    """Print the Run page's connection check of the server at `url`; whether it answered (ConfigError for a URL
    that cannot be asked: bad input)."""
    from ..engines.server_check import check_connection

    check = check_connection(EngineConfig(backend="openai", base_url=url, server_kind=server_kind))
    print(f"Server {redact_text(url)}")
    for what, found in check.findings:
        print(f"  {what:<19} {redact_text(found)}")
    return check.reachable


def _print_software() -> None:
    from ..engines import backends
    from ..hardware.environment import collect_environment

    environment = collect_environment()
    cuda_build = environment["cuda"]
    print("Software")
    print(f"  {'Python':<13} {platform.python_version()} ({sys.executable})")
    print(
        f"  {'torch':<13} {environment['torch']}"
        + (
            f" (CUDA {cuda_build} build)"
            if cuda_build not in ("none", "unknown", "not installed")
            else " (a CPU build)"
            if cuda_build == "none"
            else ""
        )
    )
    print(f"  {'transformers':<13} {environment['transformers']}")
    print(f"  {'lmdeploy':<13} {environment['lmdeploy']}")
    facts = {}
    for cls in dict.fromkeys(backends().values()):
        facts.update(cls.install_facts())
    for name, fact in facts.items():
        print(f"  {name:<13} {fact}" if len(name) < 14 else f"  {name}: {fact}")


def _print_gpus(cuda: bool) -> None:
    from ..hardware.environment import collect_environment
    from ..hardware.telemetry import gpu_inventory

    driver, gpus, why_not = gpu_inventory()
    smi_driver = collect_environment()["gpu_driver"]  # nvidia-smi's, where NVML cannot answer
    print("GPUs")
    print(f"  {'CUDA':<13} {'torch sees a GPU' if cuda else 'torch sees no GPU (torch.cuda.is_available() is False)'}")
    if not driver and smi_driver in ("none", "unknown"):
        driver = f"{'none: no nvidia-smi' if smi_driver == 'none' else 'unknown'}; {why_not}"
    print(f"  {'driver':<13} {driver or smi_driver}")
    for index, gpu in enumerate(gpus):
        print(f"  gpu{index:<10} {gpu.name}, {gpu.total_bytes / _GIB:.1f} GiB, {gpu.free_bytes / _GIB:.1f} GiB free")
    if not gpus:
        print("  none visible")


def smoke_config(backend: str, model: str, on_gpu: bool) -> RunConfig:
    """A short streamed ShareGPT run of `model` on `backend`, in the backend's own load pattern."""
    from ..engines import backend as backend_of

    size = GPU_SMOKE if on_gpu else CPU_SMOKE
    return config_from_values(
        {
            "backend": backend,
            "model": model,
            "dataset": "builtin:sharegpt",
            "load_pattern": backend_of(backend).load_pattern,
            "stream_output": True,
            **size,
        },
        label="doctor --smoke",
    )


def _smoke(names: list[str], model: str, results: str, cuda: bool) -> int:
    """Each backend's smoke run in turn through the dashboard's worker process; EXIT_FAILED when one did not finish."""
    from ..hardware.roofline import describe_roofline
    from ..run.engine_process import ProcessRunner

    history = open_history(results)
    history.check_writable()
    runner = ProcessRunner(history)
    code = EXIT_OK
    try:
        for name in names:
            on_gpu = cuda and name != "transformers"
            print(f"Smoke run on {name} ({model}, worker process)", flush=True)
            line = ProgressLine() if sys.stderr.isatty() else None
            run = runner.submit(smoke_config(name, model, on_gpu), observers=[line] if line else [])
            if not wait_with_progress(run, line.text if line else None):
                return interrupted()
            record = run.record
            if run.state != RunState.FINISHED or record is None:
                print(f"  {name}: {run.state}: {run.message}")
                code = EXIT_FAILED
                continue
            metrics = record.metrics
            print(
                f"  {metrics['output_throughput']:,.1f} output tok/s, {metrics['completed']}/"
                f"{metrics['total_requests']} requests in {metrics['duration_s']:.1f} s"
            )
            for verdict in describe_roofline(record.roofline) if record.roofline else ():
                print(f"  {verdict}")
            print(f"  recorded as run {run.run_id} in {history.csv_path}")
    finally:
        runner.shutdown()
    return code
