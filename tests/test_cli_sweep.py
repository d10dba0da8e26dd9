"""`python -m bench_core sweep`: a small grid on the real tiny model, its table, history and LMDeploy CSV,
resume, and bad input as one line with exit code 2 and nothing written."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench_core.cli import main
from bench_core.cli.common import EXIT_BAD_INPUT, EXIT_OK
from bench_core.store.history import History
from bench_core.store.history_import import SAVE_CSV_COLUMNS

# Each test here runs a real engine, server, app script or process for seconds: not in the fast suite.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
# A 2x2 grid, 2 repeats, 4 prompts x 8 tokens: 8 runs of about a second each.
SWEEP_ARGS = (
    "sweep",
    "pipeline",
    "builtin:sample",
    "builtin:tiny-llama",
    "--backend",
    "transformers",
    "-n",
    "4",
    "--sharegpt-output-len",
    "8",
    "--stream-output",
    "--label",
    "grid",
    "--results",
    "results",
    "--sweep",
    "concurrency=1,2",
    "--sweep",
    "max-batch-tokens=256,512",
    "--repeats",
    "2",
)


@pytest.fixture(scope="module")
def grid_sweep(tmp_path_factory, tiny_model_path):
    """The grid through the real command line, shared by the assertions below."""
    work = tmp_path_factory.mktemp("cli-sweep")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "bench_core", *SWEEP_ARGS],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == EXIT_OK, proc.stderr
    return work, proc


def sweep_id_of(work: Path) -> str:
    (plan_file,) = (work / "results" / "sweeps").glob("*.json")
    return plan_file.stem


def test_a_grid_prints_one_line_per_point_with_mean_and_interval(grid_sweep):
    work, proc = grid_sweep
    lines = proc.stdout.strip().splitlines()
    assert lines[0] == (
        f"Sweep {sweep_id_of(work)}: mean [95% CI, within the metric's bounds] over each point's "
        "finished runs; (range lowest..highest run) with fewer than 3 runs, too few for an interval"
    )
    header = lines[1].split()
    assert header[:3] == ["concurrency", "max_batch_tokens", "runs"]
    assert "Output throughput (tok/s)" in lines[1] and "P99 time to first token (ms)" in lines[1]
    assert "Mean time per output token (ms)" in lines[1]
    points = [line.split()[:3] for line in lines[2:]]
    assert points == [["1", "256", "2"], ["1", "512", "2"], ["2", "256", "2"], ["2", "512", "2"]]
    assert all(line.count("(range ") == 3 and "±" not in line for line in lines[2:])  # 2 repeats: no t-interval
    assert f"sweep {sweep_id_of(work)}: finished, 8/8 runs finished" in proc.stderr


def test_every_run_is_in_the_history_and_in_lmdeploys_csv(grid_sweep):
    work, _ = grid_sweep
    runs = History(work / "results").load()
    sweep_id = sweep_id_of(work)
    assert len(runs) == 8 and set(runs["sweep_id"]) == {sweep_id} and set(runs["status"]) == {"finished"}
    assert sorted(zip(runs["concurrency"], runs["max_batch_tokens"], runs["sweep_repeat"])) == [
        (c, m, r) for c in (1, 2) for m in (256, 512) for r in (0, 1)
    ]
    assert (runs["completed"] == 4).all()
    with open(work / "profile_pipeline_api.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == list(SAVE_CSV_COLUMNS) and len(rows) == 8
    plan = json.loads((work / "results" / "sweeps" / f"{sweep_id}.json").read_text())
    assert plan["axes"] == [
        {"name": "concurrency", "values": [1, 2]},
        {"name": "max_batch_tokens", "values": [256, 512]},
    ]
    assert plan["repeats"] == 2 and plan["base"]["label"] == "grid"


def test_resume_runs_only_the_missing_run(grid_sweep, capsys):
    work, _ = grid_sweep
    history = History(work / "results")
    lost = history.load()["run_id"].iloc[-1]
    history.delete([lost])
    assert main(["sweep", "--resume", sweep_id_of(work), "--results", str(work / "results")]) == EXIT_OK
    captured = capsys.readouterr()
    assert "8 runs (4 points x 2 repeats), 1 to run" in captured.err
    assert "finished, 8/8 runs finished" in captured.err
    runs = history.load()
    assert len(runs) == 8 and lost not in set(runs["run_id"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--sweep", "concurency=1,2"], "error: Cannot sweep 'concurency'. Sweepable settings: tp,"),
        (
            ["--sweep", "concurrency=0,2"],
            "error: Sweep points with concurrency=0: --concurrency must be a whole number from 1 to 1,000,000; got 0.",
        ),
        (
            ["--sweep", "concurrency=1,2", "--repeats", "0"],
            "error: --repeats must be a whole number from 1 to 1,000; got 0.",
        ),
        (["--sweep", "concurrency=1", "--sweep", "tp=1", "--sweep", "num_prompts=4"], "one setting or two"),
        (
            ["--sweep", "cache_max_entry_count=0.5,0.8"],
            "error: Cannot sweep cache_max_entry_count: --cache-max-entry-count applies to the turbomind and pytorch "
            "backends only, not to transformers.",
        ),
    ],
)
def test_a_bad_sweep_is_one_line_exit_2_and_nothing_written(args, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code = main(["sweep", "pipeline", "builtin:sample", "builtin:tiny-llama", "--backend", "transformers", *args])
    err = capsys.readouterr().err
    assert code == EXIT_BAD_INPUT
    assert message in err
    assert err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def test_resume_of_an_unknown_sweep_and_resume_with_settings_are_refused(tmp_path, capsys):
    assert main(["sweep", "--resume", "sweep-nope", "--results", str(tmp_path)]) == EXIT_BAD_INPUT
    assert "error: There is no sweep sweep-nope" in capsys.readouterr().err
    assert main(["sweep", "--resume", "../../etc", "--results", str(tmp_path)]) == EXIT_BAD_INPUT
    assert "is not a sweep id" in capsys.readouterr().err
    assert main(["sweep"]) == EXIT_BAD_INPUT
    assert "error: Choose an engine command" in capsys.readouterr().err


def test_a_missing_dataset_is_one_error_and_exit_2(tmp_path, capsys, tiny_model_path):
    code = main(
        [
            "sweep",
            "pipeline",
            str(tmp_path / "none.json"),
            "builtin:tiny-llama",
            "--backend",
            "transformers",
            "--results",
            str(tmp_path / "results"),
            "--csv",
            "",
            "--sweep",
            "concurrency=1,2",
        ]
    )
    err = capsys.readouterr().err
    assert code == EXIT_BAD_INPUT
    assert err == (
        f"error: Every sweep point: Dataset {tmp_path / 'none.json'} does not exist: pass a ShareGPT JSON or JSONL "
        "file, builtin:sharegpt or builtin:sample.\n"
    )
    # A typo is no run: found before any point runs, nothing in the history.
    assert History(tmp_path / "results").load().empty
