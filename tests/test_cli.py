"""The headless CLI, end to end on the real tiny model: table, LMDeploy CSV, history; and bad input."""

import csv
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from bench_core.cli import main
from bench_core.config import DatasetConfig
from bench_core.exports import RunSubject, export
from bench_core.load.datasets import sample_requests
from bench_core.measure.catalog import BEYOND_LMDEPLOY
from bench_core.store.history import History
from bench_core.store.history_import import HISTORY_LEAD_COLUMNS, SAVE_CSV_COLUMNS
from dashboard.run_result import result_from_history

# Each test here runs a real engine, server, app script or process for seconds: not in the fast suite.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "bench_core", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def read_csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    return rows[0], [dict(zip(rows[0], r)) for r in rows[1:]]


@pytest.fixture(scope="module")
def streamed_run(tmp_path_factory, tiny_model_path):
    """One real streamed benchmark through the CLI, shared by the assertions below."""
    work = tmp_path_factory.mktemp("cli")
    proc = run_cli(
        "pipeline",
        "builtin:sample",
        "builtin:tiny-llama",
        "--backend",
        "transformers",
        "-n",
        "12",
        "-c",
        "4",
        "--seed",
        "3",
        "--stream-output",
        "--label",
        "cli-test",
        "--results",
        "results",
        cwd=work,
    )
    return work, proc


def test_streamed_run_prints_lmdeploys_table_with_our_rows_below(streamed_run):
    _, proc = streamed_run
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "Profile Pipeline API" in out
    for row in (
        "Successful requests",
        "End-to-end Latency",
        "Time to First Token (TTFT)",
        "Time per Output Token (TPOT)",
        "Inter-token Latency (ITL)",
        "Tokens per Tick",
    ):
        assert row in out
    assert out.index("Tokens per Tick") < out.index("Failed requests")
    assert "mean       P50       P75       P95       P99" in out


def test_catalog_metrics_beyond_lmdeploys_table_are_printed_and_recorded(streamed_run):
    work, proc = streamed_run
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    for title in ("TTFT per 1,000 input tokens (s)", "Decode tokens/s per request (tok/s)"):
        (line,) = [line for line in lines if line.startswith(title)]
        assert len(line.split()) - len(title.split()) == 5 and "-" not in line.split()  # mean and 4 percentiles
    row = History(work / "results").load().iloc[0]
    assert row["mean_ttft_per_1k_input_ms"] > 0 and row["p99_decode_tokens_per_s"] > 0
    # Acceptance per request is printed for a run that drafted tokens only; this one did not speculate.
    printed = {metric.console_title for metric in BEYOND_LMDEPLOY if metric.key != "request_acceptance_rate"}
    assert printed <= {line[:40].rstrip() for line in lines}


def test_streamed_run_writes_lmdeploy_csv_with_exact_token_counts(streamed_run, tiny_tokenizer):
    work, proc = streamed_run
    assert proc.returncode == 0, proc.stderr
    header, rows = read_csv(work / "profile_pipeline_api.csv")
    assert header == list(SAVE_CSV_COLUMNS)
    (row,) = rows
    expected = sample_requests(DatasetConfig(dataset="builtin:sample", num_prompts=12, seed=3), tiny_tokenizer)
    assert row["backend"] == "transformers" and row["bs"] == "4" and row["num_prompts"] == "12"
    assert row["completed"] == "12"
    assert int(row["total_input_tokens"]) == expected.total_input_tokens
    assert int(row["total_output_tokens"]) == expected.total_output_tokens
    assert float(row["mean_ttft_ms"]) > 0 and float(row["mean_itl_ms"]) > 0


def test_the_history_rebuilds_the_lmdeploy_csv_row_byte_for_byte(streamed_run):
    """The Run page's "LMDeploy CSV" download of a run read back from the history (which keeps one spelling
    per metric, as full floats) is the row the CLI wrote in LMDeploy's names and formats."""
    work, proc = streamed_run
    assert proc.returncode == 0, proc.stderr
    history = History(work / "results")
    result = result_from_history(history, history.load()["run_id"].iloc[0])
    subject = RunSubject(history, result.run_id, result.requests, result.lmdeploy_row, parts=lambda: None)
    rebuilt = export("lmdeploy-csv").build(subject)
    assert rebuilt == (work / "profile_pipeline_api.csv").read_bytes()


def test_streamed_run_lands_in_the_history_with_per_request_ticks(streamed_run):
    work, proc = streamed_run
    assert proc.returncode == 0, proc.stderr
    history = History(work / "results")
    runs = history.load()
    assert list(runs["status"]) == ["finished"] and list(runs["label"]) == ["cli-test"]
    assert list(runs["env_hostname"]) == [socket.gethostname()]  # the node, as a cluster sweep's rows have it
    run_id = runs["run_id"].iloc[0]
    assert run_id in proc.stderr
    requests = history.requests(run_id)
    assert len(requests) == 12
    assert (requests["status"] == "success").all()
    assert (requests["output_len"] == requests["req_output_len"]).all()
    # one tick at t0 and one per streamed token
    assert (requests["n_ticks"] == requests["output_len"] + 1).all()
    assert history.config(run_id).load.concurrency == 4


def test_second_run_appends_a_row_under_the_same_header(tmp_path, tiny_model_path):
    args = (
        "pipeline",
        "builtin:sample",
        "builtin:tiny-llama",
        "--backend",
        "transformers",
        "-n",
        "4",
        "-c",
        "2",
        "--dataset-name",
        "random",
        "--random-input-len",
        "16",
        "--random-output-len",
        "8",
        "--random-range-ratio",
        "1",
        "--load",
        "concurrency",
        "--csv",
        str(tmp_path / "out.csv"),
        "--results",
        str(tmp_path / "res"),
    )
    assert main(list(args)) == 0
    assert main(list(args)) == 0
    header, rows = read_csv(tmp_path / "out.csv")
    assert header == list(SAVE_CSV_COLUMNS) and len(rows) == 2
    assert all(r["total_output_tokens"] == "32" and r["mean_ttft_ms"] == "-" for r in rows)
    runs = History(tmp_path / "res").load()
    assert len(runs) == 2 and set(runs["load_pattern"]) == {"concurrency"}


def test_model_path_prints_the_built_in_models_folder(capsys, tiny_model_path):
    assert main(["model-path", "builtin:tiny-llama"]) == 0
    folder = Path(capsys.readouterr().out.strip())
    assert folder == Path(tiny_model_path) and (folder / "config.json").is_file()


def test_help_documents_every_engine_knob(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["pipeline", "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for flag in (
        "--concurrency",
        "--num-prompts",
        "--stream-output",
        "--cache-max-entry-count",
        "--quant-policy",
        "--cache-block-seq-len",
        "--speculative-algorithm",
        "--load",
        "--slo-ttft-ms",
        "--max-batch-tokens",
    ):
        assert flag in text


@pytest.mark.parametrize(
    "args, message",
    [
        (["builtin:nope", "builtin:tiny-llama", "--backend", "transformers"], "Unknown built-in dataset"),
        (["/no/such/file.json", "builtin:tiny-llama", "--backend", "transformers"], "does not exist"),
        (["builtin:sample", "/no/such/model", "--backend", "transformers"], "No model folder"),
        (["builtin:sample", "builtin:tiny-llama"], "NVIDIA GPU"),
        # Every typo known before loading, and the backend this machine cannot run, in the one line.
        (
            ["/no/such/file.json", "/no/such/model"],
            "Dataset /no/such/file.json does not exist: pass a ShareGPT JSON or JSONL file, builtin:sharegpt or "
            "builtin:sample. No model folder at /no/such/model: give a folder, a hub id or one of "
            "builtin:smollm2-135m, builtin:tiny-llama. The turbomind backend needs an NVIDIA GPU",
        ),
        (
            ["builtin:sample", "builtin:tiny-llama", "--backend", "pytorch", "--cache-max-entry-count", "1.5"],
            "--cache-max-entry-count",
        ),
        (
            ["builtin:sample", "builtin:tiny-llama", "--backend", "transformers", "-c", "0"],
            "--concurrency must be a whole number from 1",
        ),
        (
            ["builtin:sample", "builtin:tiny-llama", "--backend", "transformers", "--dataset-name", "random"],
            "--random-input-len",
        ),
        (
            ["builtin:sample", "builtin:tiny-llama", "--backend", "transformers", "--sharegpt-output-len", "2"],
            "--sharegpt-output-len must be a whole number from 4 to 16,777,216; got 2. LMDeploy's least is 4.",
        ),
        (["builtin:sample", "builtin:tiny-llama", "--quant-policy", "int3"], "invalid quant_policy"),
        (
            ["builtin:sample", "builtin:tiny-llama", "--backend", "transformers", "--cache-max-entry-count", "2.0"],
            "error: --cache-max-entry-count applies to the turbomind and pytorch backends only, not to transformers.",
        ),
        (
            ["builtin:sample", "builtin:tiny-llama", "--backend", "transformers", "--cache-max-entry-count", "-1"],
            "error: --cache-max-entry-count applies to the turbomind and pytorch backends only",
        ),
        # Given explicitly, even LMDeploy's default value is refused: the flag does nothing on this backend.
        (
            ["builtin:sample", "builtin:tiny-llama", "--backend", "transformers", "--session-len", "0", "--eager-mode"],
            "--session-len applies to the turbomind and pytorch backends only, not to transformers. "
            "--eager-mode applies to the pytorch backend only, not to transformers.",
        ),
        (
            ["builtin:sample", "builtin:tiny-llama", "--backend", "transformers", "--communicator", "nccl"],
            "--communicator applies to the turbomind backend only",
        ),
        (["builtin:sample", "builtin:tiny-llama", "--bogus"], "unrecognized arguments"),
        # 4,000 output tokens on a 2,048-token model, and an output length that would size a cache in terabytes.
        (
            [
                "builtin:sample",
                "builtin:tiny-llama",
                "--backend",
                "transformers",
                "--dataset-name",
                "random",
                "--random-input-len",
                "16",
                "--random-output-len",
                "4000",
            ],
            "does not fit the 2,048-token context window",
        ),
        (
            ["builtin:sample", "builtin:tiny-llama", "--backend", "transformers", "--sharegpt-output-len", "100000000"],
            "--sharegpt-output-len must be a whole number from 4 to 16,777,216; got 100,000,000.",
        ),
        # Conversations bring their own prompt lengths: known once sampled.
        (
            [
                "builtin:sample",
                "builtin:tiny-llama",
                "--backend",
                "transformers",
                "-n",
                "8",
                "--sharegpt-output-len",
                "2040",
            ],
            "sampled requests do not fit",
        ),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys, tiny_model_path, args, message):
    """Found in the flags or while loading, a typo is no run: no CSV row, no history row, no run folder."""
    csv_path, results = tmp_path / "out.csv", tmp_path / "results"
    try:
        code = main(["pipeline", *args, "--csv", str(csv_path), "--results", str(results)])
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not csv_path.exists()
    assert History(results).load().empty and not list(results.glob("runs/*"))


def test_history_csv_reads_back_with_pandas(streamed_run):
    work, _ = streamed_run
    frame = pd.read_csv(work / "results" / "history.csv")
    assert list(frame.columns[: len(HISTORY_LEAD_COLUMNS)]) == list(HISTORY_LEAD_COLUMNS)


def test_the_terminal_progress_line_shows_what_the_run_tells_its_observers():
    from bench_core.cli.common import ProgressLine
    from bench_core.measure.profiler import Profiler
    from bench_core.run.observer import StateChange
    from bench_core.states import RunState

    line = ProgressLine()
    assert line.text() == "queued..."
    line.on_state(None, StateChange(RunState.LOADING, "loading the tokenizer of builtin:tiny-llama"))
    assert line.text() == "loading: loading the tokenizer of builtin:tiny-llama..."
    profiler = Profiler(True, [50])
    sessions = [profiler.new_session(4, 2) for _ in range(3)]
    t0 = time.perf_counter() - 10.0  # ten seconds in, a third of the tokens done: twenty seconds left
    profiler.start(t0)
    for session in sessions:
        session.tick_at(0, t0)
    sessions[0].tick_at(2, t0 + 0.1)
    sessions[0].finish(1, "length", t0 + 0.1)
    line.on_state(None, StateChange(RunState.RUNNING, "measuring"))
    assert line.text() == "running: measuring..."  # no snapshot yet
    line.on_snapshot(None, profiler.live_snapshot())
    assert line.text() == "running: 1/3 requests done, 2 in flight, 2 tokens, about 20 s left"


# Every request needs more KV cache blocks than the cache has (1), or only the longest ones do (5 blocks).
CACHE_STARVED = (
    "pipeline",
    "builtin:sample",
    "builtin:tiny-llama",
    "--backend",
    "transformers",
    "-n",
    "6",
    "-c",
    "1",
    "--dataset-name",
    "random",
    "--random-input-len",
    "16",
    "--random-output-len",
    "8",
    "--random-range-ratio",
    "0.1",
    "--cache-block-seq-len",
    "4",
    "--csv",
    "",
)


@pytest.mark.parametrize(
    "num_blocks, code, said, status, completed",
    [
        ("1", 1, "error: No request succeeded (error: The request needs", "failed", 0),
        ("5", 3, "warning: 1 of 6 requests failed (error: The request needs 6 KV cache blocks", "partial", 5),
    ],
)
def test_a_run_with_failed_requests_exits_non_zero_and_says_why(
    tmp_path, capsys, tiny_model_path, num_blocks, code, said, status, completed
):
    assert main([*CACHE_STARVED, "--num-blocks", num_blocks, "--results", str(tmp_path)]) == code
    assert said in capsys.readouterr().err
    (row,) = History(tmp_path).load().to_dict("records")
    assert (row["status"], row["completed"], row["failed"]) == (status, completed, 6 - completed)
    assert row["error"].startswith(said.split(": ", 1)[1])  # the history keeps the reasons too


@pytest.mark.parametrize("command", [["pipeline"], ["throughput"], ["restful"], ["sweep"], ["sweep", "pipeline"]])
def test_help_documents_the_exit_codes(capsys, command):
    with pytest.raises(SystemExit):
        main([*command, "--help"])
    text = capsys.readouterr().out
    assert "exit codes:" in text and "130" in text
    assert ("partial" in text) and ("bad input" in text)
