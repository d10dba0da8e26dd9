"""`python -m bench_core throughput`, LMDeploy's profile_throughput.py: every one of its 44 flags accepted with its
default, and real runs of the embedded engine on the tiny Llama through every flag (ids in, no detokenize, the
cancel rate counted as cancelled, streaming on by default), with LMDeploy's summary and CSV row."""

from __future__ import annotations

import importlib.util
import math

import pytest
from test_cli import read_csv, run_cli

from bench_core.cli import build_parser, main
from bench_core.cli.throughput import ThroughputCommand
from bench_core.config import SETTINGS, DatasetConfig
from bench_core.load.cancellation import cancel_points
from bench_core.load.datasets import sample_requests
from bench_core.store.history import History
from bench_core.store.history_import import SAVE_CSV_COLUMNS
from bench_core.sweep.plan import parse_sweep_arg

# Each test here runs a real engine, server, app script or process for seconds: not in the fast suite.
pytestmark = pytest.mark.slow

# profile_throughput.py's parse_args (lmdeploy snapshot 2026-08-21), in its order: each flag's default, as it parses
# a command line that gives none (positionals: a value to give).
PROFILE_THROUGHPUT_FLAGS = {
    "dataset": "data.json",
    "model_path": "model",
    "--concurrency": 256,
    "--num-prompts": 5000,
    "--no-stream-output": True,  # stream_output True: their dest is no_stream_output=False
    "--skip-tokenize": False,
    "--skip-detokenize": False,
    "--cancel-rate": 0.0,
    "--use-uvloop": False,
    "--csv": "./profile_throughput.csv",
    "--seed": 0,
    "--distributed-executor-backend": None,
    "--dataset-name": "sharegpt",
    "--sharegpt-output-len": None,
    "--random-input-len": None,
    "--random-output-len": None,
    "--random-range-ratio": 0.0,
    "--trust-remote-code": False,
    "--top-p": 0.8,
    "--top-k": 1,
    "--temperature": 0.8,
    "--backend": "turbomind",
    # PyTorch engine arguments
    "--device": "cuda",
    "--eager-mode": False,
    "--dllm-block-length": None,
    "--dllm-unmasking-strategy": "low_confidence_dynamic",
    "--dllm-denoising-steps": None,
    "--dllm-confidence-threshold": 0.85,
    # Speculative decoding
    "--speculative-algorithm": None,
    "--speculative-draft-model": None,
    "--speculative-num-draft-tokens": 1,
    # the knobs both engines take
    "--tp": 1,
    "--cache-max-entry-count": 0.8,
    "--cache-block-seq-len": 64,
    "--enable-prefix-caching": False,
    "--quant-policy": 0,
    "--dtype": "auto",
    # TurboMind engine arguments
    "--dp": 1,
    "--cp": 1,
    "--model-format": "hf",
    "--num-tokens-per-iter": 0,
    "--max-prefill-iters": 1,
    "--async": 1,
    "--communicator": "nccl",
}


def test_each_of_profile_throughputs_44_flags_is_ours_with_its_default():
    assert len(PROFILE_THROUGHPUT_FLAGS) == 44
    parser = build_parser()
    command = next(action for action in parser._actions if action.dest == "command").choices["throughput"]
    by_flag = {option: action for action in command._actions for option in action.option_strings}
    by_flag.update({action.dest: action for action in command._actions if not action.option_strings})
    assert set(PROFILE_THROUGHPUT_FLAGS) <= set(by_flag)
    flags = [flag for flag in PROFILE_THROUGHPUT_FLAGS if flag.startswith("-")]
    ours = [option for action in command._actions for option in action.option_strings if option in flags]
    assert ours[:10] == flags[:10]  # their plain flags, in their order
    args = parser.parse_args(["throughput", "data.json", "model"])
    values = ThroughputCommand().build_config(args).value
    expected = {
        "--concurrency": "concurrency",
        "--num-prompts": "num_prompts",
        "--no-stream-output": "stream_output",
        "--skip-tokenize": "skip_tokenize",
        "--skip-detokenize": "skip_detokenize",
        "--cancel-rate": "cancel_rate",
        "--use-uvloop": "use_uvloop",
        "--seed": "seed",
        "--dataset-name": "dataset_name",
        "--random-range-ratio": "random_range_ratio",
        "--top-p": "top_p",
        "--top-k": "top_k",
        "--temperature": "temperature",
        "--backend": "backend",
    }
    assert {flag: values(name) for flag, name in expected.items()} == {
        flag: PROFILE_THROUGHPUT_FLAGS[flag] for flag in expected
    }
    assert args.csv == "./profile_throughput.csv"
    knobs = [flag for flag in flags if flag not in expected and flag != "--csv"]  # absent until given
    declared = {flag: setting for setting in SETTINGS for flag in setting.cli_flags}
    assert {flag: declared[flag].default for flag in knobs} == {flag: PROFILE_THROUGHPUT_FLAGS[flag] for flag in knobs}


@pytest.fixture(scope="module")
def cancelled_run(tmp_path_factory, tiny_model_path):
    """profile_throughput.py's flags at once, on the embedded engine: ids in, no detokenize, a quarter cancelled."""
    work = tmp_path_factory.mktemp("throughput")
    proc = run_cli(
        "throughput",
        "builtin:sample",
        "builtin:tiny-llama",
        "--backend",
        "transformers",
        "-n",
        "24",
        "-c",
        "4",
        "--seed",
        "0",
        "--sharegpt-output-len",
        "16",
        "--skip-tokenize",
        "--skip-detokenize",
        "--cancel-rate",
        "0.25",
        "--top-k",
        "1",
        "--warmup-requests",
        "2",
        "--results",
        "results",
        cwd=work,
    )
    return work, proc


def test_the_summary_is_profile_throughputs_with_its_extra_rows(cancelled_run):
    _, proc = cancelled_run
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert any("Profile Throughput" in line for line in lines)
    rows = {line[:40].strip(): line[40:].split() for line in lines if line[:40].strip()}
    assert rows["Concurrency"] == ["4"] and rows["Cancel rate"] == ["0.250"]
    assert rows["Stream output"] == ["true"]  # on by default, as theirs
    assert rows["Skip tokenize"] == rows["Skip detokenize"] == ["true"]
    assert float(rows["Time to First Token (TTFT)"][0]) > 0  # streamed: the latencies are there
    assert any(line.startswith("Warm-up: 2 requests in") for line in lines)


def test_the_cancel_rate_cancels_its_share_counted_cancelled_not_failed(cancelled_run, tiny_tokenizer):
    work, proc = cancelled_run
    assert proc.returncode == 0, proc.stderr
    sample = sample_requests(
        DatasetConfig(dataset="builtin:sample", num_prompts=24, seed=0, sharegpt_output_len=16), tiny_tokenizer
    )
    planned = cancel_points([r.output_len for r in sample.requests], 0.25, sample.cancel_rng)
    cut_short = sum(point is not None and point <= 16 - 2 for point in planned)
    assert 2 <= cut_short <= 10  # near a quarter of 24
    row = History(work / "results").load().iloc[0]
    assert (row["load_pattern"], row["skip_tokenize"], row["skip_detokenize"]) == ("engine_api", True, True)
    assert (row["cancelled"], row["failed"], row["completed"]) == (cut_short, 0, 24 - cut_short)
    assert row["status"] == "finished" and row["warmup_seconds"] > 0


def test_the_lmdeploy_csv_row_goes_to_profile_throughput_csv(cancelled_run):
    work, proc = cancelled_run
    assert proc.returncode == 0, proc.stderr
    header, rows = read_csv(work / "profile_throughput.csv")
    assert header == list(SAVE_CSV_COLUMNS)
    (row,) = rows
    assert (row["backend"], row["bs"], row["num_prompts"], row["sharegpt_output_len"]) == (
        "transformers",
        "4",
        "24",
        "16",
    )
    assert int(row["completed"]) < 24 and float(row["mean_ttft_ms"]) > 0


def test_without_stream_output_there_is_no_ttft(tmp_path, tiny_model_path, capsys):
    code = main(
        [
            "throughput",
            "builtin:sample",
            "builtin:tiny-llama",
            "--backend",
            "transformers",
            "-n",
            "4",
            "-c",
            "2",
            "--sharegpt-output-len",
            "4",
            "--no-stream-output",
            "--csv",
            "",
            "--results",
            str(tmp_path / "results"),
        ]
    )
    assert code == 0, capsys.readouterr().err
    row = History(tmp_path / "results").load().iloc[0]
    assert not row["stream_output"] and row["completed"] == 4
    assert "mean_ttft_ms" not in row or math.isnan(row["mean_ttft_ms"])


def test_the_sampling_flags_reach_the_engine(tmp_path, tiny_model_path, capsys):
    code = main(
        [
            "throughput",
            "builtin:sample",
            "builtin:tiny-llama",
            "--backend",
            "transformers",
            "-n",
            "2",
            "--sharegpt-output-len",
            "4",
            "--top-k",
            "5",
            "--top-p",
            "0.5",
            "--temperature",
            "0.7",
            "--csv",
            "",
            "--results",
            str(tmp_path / "results"),
        ]
    )
    assert code == 0, capsys.readouterr().err
    row = History(tmp_path / "results").load().iloc[0]
    assert (row["do_sample"], row["top_k"], row["top_p"], row["temperature"]) == (True, 5, 0.5, 0.7)


@pytest.mark.skipif(importlib.util.find_spec("uvloop") is not None, reason="uvloop is installed here")
def test_use_uvloop_without_uvloop_is_refused_in_one_line(tmp_path, capsys):
    code = main(
        [
            "throughput",
            "builtin:sample",
            "builtin:tiny-llama",
            "--backend",
            "transformers",
            "--use-uvloop",
            "--csv",
            "",
            "--results",
            str(tmp_path / "results"),
        ]
    )
    assert code == 2
    assert capsys.readouterr().err == (
        "error: --use-uvloop needs the uvloop package, which is not installed here: pip install uvloop.\n"
    )
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize("workload", [["--dataset-name", "multi-turn", "--turns", "2"], ["--dataset-name", "trace"]])
def test_workloads_that_wait_on_answers_or_timestamps_are_refused_on_the_engine_api(tmp_path, capsys, workload):
    code = main(
        [
            "throughput",
            "builtin:sample",
            "builtin:tiny-llama",
            "--backend",
            "transformers",
            *workload,
            "--csv",
            "",
            "--results",
            str(tmp_path / "results"),
        ]
    )
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and "cannot wait for a turn's answer or a trace's timestamps" in line, line


@pytest.mark.skipif(importlib.util.find_spec("uvloop") is None, reason="uvloop is not installed here")
def test_use_uvloop_runs_the_workers_on_uvloop(tmp_path, tiny_model_path, capsys):
    code = main(
        [
            "throughput",
            "builtin:sample",
            "builtin:tiny-llama",
            "--backend",
            "transformers",
            "--use-uvloop",
            "-n",
            "3",
            "--sharegpt-output-len",
            "4",
            "--csv",
            "",
            "--results",
            str(tmp_path / "results"),
        ]
    )
    assert code == 0, capsys.readouterr().err
    assert History(tmp_path / "results").load().iloc[0]["completed"] == 3


def test_a_sweep_takes_the_engine_api_and_its_lmdeploy_knobs(tmp_path, tiny_model_path, capsys):
    code = main(
        [
            "sweep",
            "throughput",
            "builtin:sample",
            "builtin:tiny-llama",
            "--backend",
            "transformers",
            "-n",
            "2",
            "--sharegpt-output-len",
            "4",
            "--csv",
            "",
            "--results",
            str(tmp_path / "results"),
            "--sweep",
            "concurrency=1,2",
        ]
    )
    assert code == 0, capsys.readouterr().err
    runs = History(tmp_path / "results").load()
    assert sorted(runs["concurrency"]) == [1, 2] and set(runs["load_pattern"]) == {"engine_api"}
    assert parse_sweep_arg("max_prefill_token_num=1024,2048").values == (1024, 2048)  # once "Cannot sweep"
