"""`--report FILE` on the command line: a real run of the tiny model writes one HTML file with the numbers the history
holds; a sweep writes its own; a folder that is not there is refused before anything runs."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from cli_forks import CliForks

from bench_core.store.history import History
from bench_core.views import tables

# Each test here runs a real engine, server, app script or process for seconds: not in the fast suite.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent

FAST_RUN = (
    "pipeline",
    "builtin:sample",
    "builtin:tiny-llama",
    "--backend",
    "transformers",
    "-n",
    "4",
    "-c",
    "2",
    "--sharegpt-output-len",
    "8",
    "--stream-output",
    "--csv",
    "",
    "--results",
    "results",
)


@pytest.fixture(scope="module")
def cli():
    """`python -m bench_core` for this module's commands: forks of one interpreter that imported the CLI's libraries
    once (tests/cli_forks.py), each its own process from `main_and_exit` on."""
    with CliForks({**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}) as forks:
        yield forks


def run_cli(cli: CliForks, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return cli.run(list(args), cwd=cwd)


def test_a_run_writes_its_report_with_the_numbers_the_history_holds(tmp_path, tiny_model_path, cli):
    proc = run_cli(cli, *FAST_RUN, "--label", "<i>cli</i>", "--report", "out.html", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    history = History(tmp_path / "results")
    (run_id,) = history.load()["run_id"].astype(str)
    row = history.row(run_id)
    document = (tmp_path / "out.html").read_text(encoding="utf-8")
    assert f"<h1>Run {run_id}</h1>" in document and "&lt;i&gt;cli&lt;/i&gt;" in document
    for column in ("completed", "output_throughput", "mean_ttft_ms", "p99_itl_ms"):
        assert f"<td>{tables.format_number(float(row[column]))}</td>" in document, column
    assert "Hardware telemetry" in document and f"<td>{row['env_python']}</td>" in document
    assert "Throughput over time" in document  # from the run's live tracker, which only the process that ran it has
    assert f"report: out.html ({(tmp_path / 'out.html').stat().st_size / 1e6:.1f} MB)" in proc.stderr


def test_a_sweep_writes_its_report(tmp_path, tiny_model_path, cli):
    proc = run_cli(cli, "sweep", *FAST_RUN, "--sweep", "concurrency=1,2", "--report", "sweep.html", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    document = (tmp_path / "sweep.html").read_text(encoding="utf-8")
    (sweep_id,) = set(History(tmp_path / "results").load()["sweep_id"].astype(str))
    assert f"<h1>Sweep {sweep_id}</h1>" in document and "Output throughput vs concurrency" in document


@pytest.mark.parametrize("command", [FAST_RUN, ("sweep", *FAST_RUN, "--sweep", "concurrency=1,2")])
def test_a_report_in_a_folder_that_is_not_there_is_refused_before_the_run(tmp_path, command, cli):
    proc = run_cli(cli, *command, "--report", "no/such/folder/out.html", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "error: --report no/such/folder/out.html: the folder no/such/folder does not exist."
    ]
    assert not (tmp_path / "results").exists()  # nothing ran, nothing was recorded


def test_a_run_that_failed_while_loading_still_writes_what_it_left(tmp_path, cli):
    broken = tmp_path / "broken-model"  # a model folder that fails to load: a run that failed, not a typo refused
    broken.mkdir()
    (broken / "config.json").write_text("{}")
    proc = run_cli(
        cli,
        "pipeline",
        "builtin:sample",
        str(broken),
        "--backend",
        "transformers",
        "-n",
        "2",
        "--csv",
        "",
        "--results",
        "results",
        "--report",
        "failed.html",
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr  # found while loading: bad input, recorded as failed
    document = (tmp_path / "failed.html").read_text(encoding="utf-8")
    (run_id,) = History(tmp_path / "results").load()["run_id"].astype(str)
    assert f"<h1>Run {run_id}</h1>" in document and "failed: Could not load the tokenizer of" in document
    assert "<h3>Settings</h3>" in document and str(broken) in document
