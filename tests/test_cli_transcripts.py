"""The CLI as a user sees it, pinned: a fixed list of commands (every --help, bad input, real CPU runs) and the
stdout, stderr and exit code each gave, kept in tests/data/cli_transcripts.json.

A change to the code's layout must leave every transcript as it was; a change a user should see (a new flag,
a better message) rewrites the file, and the diff of that file is the change in the CLI's words:

    UPDATE_CLI_TRANSCRIPTS=1 .venv/bin/python -m pytest tests/test_cli_transcripts.py

What differs between two honest runs of one command is masked before comparing: the working folder, the
model cache, run and sweep ids, the server's port and today's date; in a real run's output every number too
(timings), with runs of spaces made one (the table's padding follows the numbers' widths), the CPU's name
and the roofline's verdict on it (CI runs on other machines), and the "machine busy" and "client bound" warnings
(what else ran).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest
from cli_forks import CliForks
from scripted_server import scripted_server  # noqa: F401  (a fixture)

from bench_core.hardware.client_bound import CLIENT_PREFIX
from bench_core.hardware.contention import BUSY_PREFIX

# Each test here runs a real engine, server, app script or process for seconds: not in the fast suite.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
TRANSCRIPTS = ROOT / "tests" / "data" / "cli_transcripts.json"
UPDATE = os.environ.get("UPDATE_CLI_TRANSCRIPTS") == "1"

TINY = ("pipeline", "builtin:sample", "builtin:tiny-llama", "--backend", "transformers")
RUN = (*TINY, "--csv", "", "--results", "results")
THROUGHPUT = ("throughput", *TINY[1:], "--csv", "", "--results", "results")
CLOSED = "http://127.0.0.1:9"  # the discard port: nothing listens there

# (name, arguments, masked): `masked` for commands that measure something, whose numbers are timings.
COMMANDS: tuple[tuple[str, tuple[str, ...], bool], ...] = (
    ("help", ("--help",), False),
    ("version", ("--version",), False),
    ("no-command", (), False),
    ("unknown-command", ("bogus",), False),
    ("pipeline-help", ("pipeline", "--help"), False),
    ("throughput-help", ("throughput", "--help"), False),
    ("restful-help", ("restful", "--help"), False),
    ("sweep-help", ("sweep", "--help"), False),
    ("sweep-pipeline-help", ("sweep", "pipeline", "--help"), False),
    ("sweep-throughput-help", ("sweep", "throughput", "--help"), False),
    ("sweep-restful-help", ("sweep", "restful", "--help"), False),
    ("tune-help", ("tune", "--help"), False),
    ("tune-pipeline-help", ("tune", "pipeline", "--help"), False),
    ("tune-restful-help", ("tune", "restful", "--help"), False),
    ("tune-not-sweepable", ("tune", *RUN, "--space", "temperature=0,1"), False),
    ("tune-bad-slo", ("tune", *RUN, "--space", "concurrency=1,2", "--slo", "ttft_p99<=0.5"), False),
    ("doctor-help", ("doctor", "--help"), False),
    ("model-path-help", ("model-path", "--help"), False),
    ("pipeline-no-arguments", ("pipeline",), False),
    ("pipeline-bad-backend", (*TINY[:3], "--backend", "vllm"), False),
    ("pipeline-knob-of-another-backend", (*RUN, "--tp", "2"), False),
    ("pipeline-two-foreign-knobs", (*RUN, "--quant-policy", "int8", "--eager-mode"), False),
    (
        "pipeline-range-ratio",
        (
            *RUN,
            "--dataset-name",
            "random",
            "--random-input-len",
            "8",
            "--random-output-len",
            "8",
            "--random-range-ratio",
            "2",
        ),
        False,
    ),
    ("pipeline-random-without-lengths", (*RUN, "--dataset-name", "random"), False),
    ("pipeline-random-length-on-sharegpt", (*RUN, "--random-input-len", "8"), False),
    ("pipeline-sharegpt-output-too-short", (*RUN, "--sharegpt-output-len", "2"), False),
    ("pipeline-negative-seed", (*RUN, "--seed", "-1"), False),
    ("pipeline-no-prompts", (*RUN, "-n", "0"), False),
    ("pipeline-no-concurrency", (*RUN, "-c", "0"), False),
    ("pipeline-bad-quant-policy", (*RUN, "--quant-policy", "int3"), False),
    ("pipeline-bad-percentiles", (*RUN, "--percentiles", "50,101"), False),
    ("pipeline-bad-slo", (*RUN, "--slo-ttft-ms", "-5"), False),
    ("pipeline-sampling-out-of-range", (*RUN, "--top-p", "1.5"), False),
    ("pipeline-missing-dataset", ("pipeline", "/nonexistent/sharegpt.json", *RUN[2:]), False),
    ("pipeline-bad-synthetic", (*TINY[:2], "synthetic:foo", *RUN[3:]), False),
    ("pipeline-output-beyond-window", (*RUN, "--sharegpt-output-len", "4096"), False),
    ("pipeline-turbomind-without-gpu", (*TINY[:3], "--csv", "", "--results", "results"), False),
    ("pipeline-max-batch-tokens-zero", (*RUN, "--max-batch-tokens", "0"), False),
    ("throughput-bad-cancel-rate", (*THROUGHPUT, "--cancel-rate", "1.5"), False),
    ("throughput-dp-below-one", (*THROUGHPUT[:3], "--backend", "turbomind", "--csv", "", "--dp", "0"), False),
    ("restful-bad-port", ("restful", "--port", "0"), False),
    (
        "restful-server-down",
        (
            "restful",
            "--base-url",
            CLOSED,
            "--model",
            "m",
            "--tokenizer",
            "builtin:tiny-llama",
            "--num-prompts",
            "2",
            "--output-file",
            "",
            "--results",
            "results",
        ),
        False,
    ),
    ("restful-zero-rate", ("restful", "--base-url", CLOSED, "--request-rate", "0", "--results", "results"), False),
    ("restful-zero-burstiness", ("restful", "--base-url", CLOSED, "--burstiness", "0", "--results", "results"), False),
    ("restful-bad-rate-range", ("restful", "--base-url", CLOSED, "--multi", "--request-rate-range", "1,4,0"), False),
    (
        "restful-bad-request-body",
        ("restful", "--base-url", CLOSED, "--extra-request-body", "{not json", "--results", "results"),
        False,
    ),
    ("restful-bad-url", ("restful", "--base-url", "ftp://127.0.0.1:9", "--model", "m", "--results", "results"), False),
    ("sweep-nothing", ("sweep",), False),
    ("sweep-resume-unknown", ("sweep", "--resume", "sweep-20000101-000000-abcd", "--results", "results"), False),
    ("sweep-unknown-setting", ("sweep", *RUN, "--sweep", "colour=1,2"), False),
    ("sweep-no-values", ("sweep", *RUN, "--sweep", "concurrency="), False),
    ("sweep-repeated-value", ("sweep", *RUN, "--sweep", "concurrency=1,1"), False),
    ("sweep-bad-value", ("sweep", *RUN, "--sweep", "concurrency=1,x"), False),
    ("sweep-foreign-knob", ("sweep", *RUN, "--sweep", "tp=1,2"), False),
    (
        "sweep-three-axes",
        ("sweep", *RUN, "--sweep", "concurrency=1,2", "--sweep", "num_prompts=1,2", "--sweep", "seed=1,2"),
        False,
    ),
    ("sweep-no-repeats", ("sweep", *RUN, "--sweep", "concurrency=1,2", "--repeats", "0"), False),
    ("sweep-cluster-flags-without-ray", ("sweep", *RUN, "--sweep", "concurrency=1,2", "--cpus-per-point", "2"), False),
    ("sweep-impossible-point", ("sweep", *RUN, "--sweep", "num_prompts=2,0"), False),
    ("model-path-tiny", ("model-path", "builtin:tiny-llama"), False),
    ("model-path-unknown", ("model-path", "builtin:nothing"), False),
    ("history-help", ("history", "--help"), False),
    ("history-list-help", ("history", "list", "--help"), False),
    ("history-missing-folder", ("history", "list", "--results", "results"), False),
    ("history-bad-date", ("history", "list", "--since", "2026-13-01"), False),
    ("compare-help", ("compare", "--help"), False),
    ("compare-missing-folder", ("compare", "main", "pr-123", "--results", "results"), False),
    ("compare-bad-tolerance", ("compare", "main", "pr-123", "--fail-on-regression", "mean_e2e_ms=fast"), False),
    ("run-streamed", (*RUN, "-n", "4", "-c", "2", "--seed", "3", "--stream-output", "--label", "transcript"), True),
    (
        "run-random-batch",
        (
            *RUN,
            "-n",
            "3",
            "-c",
            "3",
            "--dataset-name",
            "random",
            "--random-input-len",
            "16",
            "--random-output-len",
            "6",
            "--random-range-ratio",
            "0.5",
        ),
        True,
    ),
    (
        "run-concurrency-lmdeploy-csv",
        (
            *TINY,
            "--results",
            "results",
            "-n",
            "3",
            "-c",
            "2",
            "--load",
            "concurrency",
            "--sharegpt-output-len",
            "5",
            "--stream-output",
            "--slo-ttft-ms",
            "60000",
        ),
        True,
    ),
    (
        "run-throughput",
        (*THROUGHPUT, "-n", "4", "-c", "2", "--sharegpt-output-len", "5", "--warmup-requests", "1"),
        True,
    ),
    (
        "run-sweep",
        ("sweep", *RUN, "-n", "2", "--sharegpt-output-len", "4", "--stream-output", "--sweep", "concurrency=1,2"),
        True,
    ),
    (
        "run-restful",
        (
            "restful",
            "--base-url",
            "{server}",
            "--model",
            "scripted",
            "--tokenizer",
            "builtin:tiny-llama",
            "--backend",
            "transformers",
            "--num-prompts",
            "3",
            "--sharegpt-output-len",
            "33",
            "--request-rate",
            "50",
            "--output-file",
            "",
            "--results",
            "results",
        ),
        True,
    ),
)


def _cache_dir() -> str:
    from bench_core.models.resolve import cache_dir

    return str(cache_dir())


def normalised(text: str, work: Path, server: str, masked: bool) -> str:
    """`text` with what differs between two honest runs masked (see the module's docstring)."""
    text = text.replace(str(work), "<work>").replace(_cache_dir(), "<cache>")
    text = text.replace(server, "<server>")
    text = re.sub(r"sweep-\d{8}-\d{6}-[0-9a-f]{4}", "<sweep_id>", text)
    text = re.sub(r"\b\d{8}-\d{6}-[0-9a-f]{4}\b", "<run_id>", text)
    text = text.replace(f"_{datetime.now():%m%d}_", "_<MMDD>_")
    if masked:  # what depends on the machine too: its CPU's name, and so the roofline's verdict; whether it was busy
        text = re.sub(rf"^warning: (<run_id>: )?({BUSY_PREFIX}|{CLIENT_PREFIX}): .*\n", "", text, flags=re.MULTILINE)
        text = re.sub(r"CPU \([^)]*\)", "CPU (<cpu>)", text)
        text = re.sub(r"Roofline verdict: [^.]*\.", "Roofline verdict: <verdict>.", text)
        text = re.sub(r"^- the hardware .*$", "- <reason>", text, flags=re.MULTILINE)
        text = re.sub(r"-?\d[\d,]*(\.\d+)?(e[+-]?\d+)?", "N", text)
        text = re.sub(r" +", " ", text)
    return text


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "COLUMNS": "120"}
    env.pop("BENCH_STUDIO_RESULTS", None)
    return env


@pytest.fixture(scope="module")
def cli_forks():
    """One interpreter that imports the CLI's libraries once and forks for each command (tests/cli_forks.py)."""
    with CliForks(_env()) as forks:
        yield forks


def transcript(name: str, args: tuple[str, ...], masked: bool, work: Path, server: str, forks: CliForks | None) -> dict:
    """What `python -m bench_core ARGS` says. A command that measures (`masked`) starts an interpreter of its own,
    as a user's would (a fork's libraries were imported before the CLI quieted their loading bars, see
    tests/cli_forks.py); one that refuses or prints help is a fork of one that has imported the libraries already:
    the same process from `main_and_exit` on, without seconds of imports each."""
    folder = work / name
    folder.mkdir()
    argv = [arg.replace("{server}", server) for arg in args]
    if masked:
        proc = subprocess.run(
            [sys.executable, "-m", "bench_core", *argv],
            cwd=folder,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
    else:
        proc = forks.run(argv, cwd=folder)
    return {
        "args": list(args),
        "exit_code": proc.returncode,
        "stdout": normalised(proc.stdout, folder, server, masked),
        "stderr": normalised(proc.stderr, folder, server, masked),
    }


def _recorded() -> dict:
    return json.loads(TRANSCRIPTS.read_text(encoding="utf-8")) if TRANSCRIPTS.exists() else {}


def test_the_command_list_is_the_recorded_one():
    """A command added or dropped rewrites the transcripts too: none is compared against nothing."""
    if UPDATE:
        pytest.skip("rewriting the transcripts")
    assert sorted(_recorded()) == sorted(name for name, _, _ in COMMANDS)


@pytest.mark.parametrize(("name", "args", "masked"), COMMANDS, ids=[name for name, _, _ in COMMANDS])
def test_the_cli_says_what_it_said(name, args, masked, tmp_path, scripted_server, tiny_model_path, request):
    forks = None if masked else request.getfixturevalue("cli_forks")  # started for the first command that forks
    got = transcript(name, args, masked, tmp_path, scripted_server, forks)
    if UPDATE:
        recorded = _recorded()
        recorded[name] = got
        TRANSCRIPTS.write_text(
            json.dumps(dict(sorted(recorded.items())), indent=1, ensure_ascii=False) + "\n", encoding="utf-8"
        )
        return
    expected = _recorded().get(name)
    assert expected is not None, f"no transcript for {name}: rewrite them (see the module's docstring)"
    assert (got["exit_code"], got["stdout"], got["stderr"]) == (
        expected["exit_code"],
        expected["stdout"],
        expected["stderr"],
    )
