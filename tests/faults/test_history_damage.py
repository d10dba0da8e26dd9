"""A damaged results folder, as crashes, editors and disks leave one, met by the CLI and the History page:
rows that do not parse are moved aside verbatim and named once, a history without its run_id column is
refused and left as it is, and what a crash left behind is recovered or removed (issue 10, items 5-7)."""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from bench_core.config import DatasetConfig, EngineConfig, LoadConfig, RunConfig
from bench_core.errors import HistoryColumnsError
from bench_core.run.runner import Runner
from bench_core.store.history import RESULTS_ENV, History, RunRecord
from bench_core.store.journal import FolderLock
from bench_core.store.leftovers import STALE_AFTER_S

# Each test here runs a real engine, server, app script or process for seconds: not in the fast suite.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from app_under_test import APP, shown  # noqa: E402
from cli_output import without_run_flags  # noqa: E402

QUARANTINE = "history.quarantine.csv"


def tiny_config(label: str) -> RunConfig:
    return RunConfig(
        engine=EngineConfig(backend="transformers", model="builtin:tiny-llama"),
        dataset=DatasetConfig(
            dataset="builtin:sample",
            dataset_name="random",
            num_prompts=4,
            random_input_len=16,
            random_output_len=8,
            random_range_ratio=1.0,
        ),
        load=LoadConfig(concurrency=2, stream_output=True),
        label=label,
    )


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, tiny_model_path):
    """A results folder with two real runs of the tiny model: their rows and their folders."""
    root = tmp_path_factory.mktemp("recorded") / "results"
    runner = Runner(History(root))
    runs = [runner.submit(tiny_config(f"run {n}")) for n in (1, 2)]
    for run in runs:
        assert run.wait(120) and run.state == "finished", run.message
    runner.shutdown()
    return root, [run.run_id for run in runs]


@pytest.fixture
def results(recorded, tmp_path):
    """A private copy of the recorded results folder, and its two run ids."""
    source, run_ids = recorded
    root = tmp_path / "results"
    shutil.copytree(source, root)
    return root, run_ids


def run_cli(root: Path) -> subprocess.CompletedProcess:
    """One short real benchmark through the CLI into `root`, as a user would run the next one."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "bench_core",
            "pipeline",
            "builtin:sample",
            "builtin:tiny-llama",
            "--backend",
            "transformers",
            "-n",
            "4",
            "-c",
            "2",
            "--stream-output",
            "--csv",
            "",
            "--results",
            str(root),
        ],
        cwd=root.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def history_warnings_of(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in without_run_flags(proc.stderr.splitlines()) if line.startswith("warning:")]


def age(*paths: Path) -> None:
    """Make files and folders look untouched for longer than a run in progress could leave them."""
    old = time.time() - STALE_AFTER_S - 60
    for path in paths:
        for item in [path, *(path.rglob("*") if path.is_dir() else [])]:
            os.utime(item, (old, old))


def history_page() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=60).run()
    return at.switch_page("app_pages/history.py").run()


# ---- item 5: rows that do not parse are quarantined, never rewritten -------------------------------------


def test_a_row_cut_short_is_moved_aside_and_the_next_run_keeps_every_good_byte(results):
    root, run_ids = results
    csv_path = root / "history.csv"
    good = csv_path.read_bytes()
    header, first_row = good.splitlines(keepends=True)[:2]
    cut = first_row[: len(first_row) // 3]  # a crash in the middle of a row: its tail cells never written
    csv_path.write_bytes(good + cut)

    proc = run_cli(root)

    assert proc.returncode == 0, proc.stderr
    (warning,) = history_warnings_of(proc)
    assert "1 damaged row(s)" in warning and f"line(s) {len(good.splitlines()) + 1}" in warning
    assert str(root / QUARANTINE) in warning
    after = csv_path.read_bytes()
    assert after.startswith(good)  # the good rows byte for byte, their full precision included
    assert cut not in after[len(good) :]
    assert (root / QUARANTINE).read_bytes() == header + cut + b"\n"
    runs = History(root).load()
    assert len(runs) == 3 and set(run_ids) < set(runs["run_id"])
    assert runs["completed"].notna().all()  # no padded row with empty cells


def test_garbage_an_unterminated_quote_and_an_empty_run_id_are_named_on_the_history_page(
    results, monkeypatch, fresh_dashboard
):
    root, run_ids = results
    csv_path = root / "history.csv"
    lines = csv_path.read_bytes().splitlines(keepends=True)
    header, row1, row2 = lines
    columns = header.decode().rstrip("\r\n").split(",")
    no_id = ",".join("" if name == "run_id" else "1" for name in columns).encode() + b"\r\n"
    garbage, open_quote = b"this is garbage\r\n", b'transformers,"4,random\r\n'
    csv_path.write_bytes(header + row1 + garbage + open_quote + no_id + row2)
    monkeypatch.setenv(RESULTS_ENV, str(root))

    at = history_page()

    assert not at.exception and not at.error
    (warning,) = at.warning
    assert "3 damaged row(s)" in shown(warning.value) and "line(s) 3, 4, 5" in shown(warning.value)
    assert str(root / QUARANTINE) in shown(warning.value)
    assert list(at.dataframe[0].value["run_id"]) == run_ids
    assert csv_path.read_bytes() == header + row1 + row2
    assert (root / QUARANTINE).read_bytes() == header + garbage + open_quote + no_id
    assert not history_page().warning  # said once; nothing is left to move


def test_lines_that_are_not_utf8_are_quarantined_and_the_run_is_saved(results):
    root, run_ids = results
    csv_path = root / "history.csv"
    good = csv_path.read_bytes()
    header, first_row = good.splitlines(keepends=True)[:2]
    latin1 = first_row.replace(b"run 1", "r\u00e9sum\u00e9".encode("latin-1"))
    csv_path.write_bytes(good + latin1)

    proc = run_cli(root)

    assert proc.returncode == 0, proc.stderr
    (warning,) = history_warnings_of(proc)
    assert "1 damaged row(s)" in warning and "not UTF-8" in warning
    assert (root / QUARANTINE).read_bytes() == header + latin1
    assert csv_path.read_bytes().startswith(good)
    runs = History(root).load()
    assert len(runs) == 3 and set(run_ids) < set(runs["run_id"])
    assert all((root / "runs" / run_id).is_dir() for run_id in runs["run_id"])


def test_a_cell_holding_line_breaks_is_a_row_not_damage(results):
    root, run_ids = results
    history = History(root)
    message = 'engine said:\n  "out of memory"\r\n  at step 3'
    history.record(
        RunRecord(
            run_id="20261130-120000-abcd",
            started_at="",
            status="failed",
            config=tiny_config("two\nlines"),
            error=message,
        )
    )
    before = (root / "history.csv").read_bytes()

    history.tidy()

    assert history.take_notices() == [] and not (root / QUARANTINE).exists()
    assert (root / "history.csv").read_bytes() == before
    runs = history.load().set_index("run_id")
    assert runs.loc["20261130-120000-abcd", "error"] == message
    assert list(runs.index) == [*run_ids, "20261130-120000-abcd"]


# ---- item 6: a history without its run_id column is refused and left alone ------------------------------


def test_a_renamed_run_id_header_is_refused_before_the_run_and_nothing_is_written(results):
    root, _ = results
    csv_path = root / "history.csv"
    renamed = csv_path.read_bytes().replace(b",run_id,", b",run,", 1)
    csv_path.write_bytes(renamed)
    folders = sorted(path.name for path in (root / "runs").iterdir())

    proc = run_cli(root)

    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: ") and str(csv_path) in line and "'run_id'" in line
    assert csv_path.read_bytes() == renamed
    assert sorted(path.name for path in (root / "runs").iterdir()) == folders
    assert not (root / QUARANTINE).exists()


def test_a_renamed_run_id_header_refuses_a_save_and_the_history_page_says_why(results, monkeypatch, fresh_dashboard):
    root, _ = results
    csv_path = root / "history.csv"
    renamed = csv_path.read_bytes().replace(b",run_id,", b",id,", 1)
    csv_path.write_bytes(renamed)
    history = History(root)
    record = RunRecord(run_id="20261130-120000-abcd", started_at="", status="failed", config=tiny_config("x"))
    with pytest.raises(HistoryColumnsError, match="run_id"):
        history.record(record)
    assert csv_path.read_bytes() == renamed and not (root / "runs" / record.run_id).exists()

    monkeypatch.setenv(RESULTS_ENV, str(root))
    at = history_page()
    assert not at.exception
    (error,) = at.error
    assert "'run_id'" in shown(error.value) and str(csv_path) in shown(error.value)
    assert csv_path.read_bytes() == renamed


# ---- item 7: what a crash left is recovered or removed; what a run in progress writes is not -------------


def test_leftovers_of_a_crash_are_recovered_or_removed_on_start_and_a_run_in_progress_is_spared(results):
    root, (kept_id, lost_id) = results
    csv_path = root / "history.csv"
    header, row1, row2 = csv_path.read_bytes().splitlines(keepends=True)
    assert lost_id.encode() in row2
    csv_path.write_bytes(header + row1)  # killed after the folder, before the row
    runs_dir = root / "runs"
    stray_csv = root / ".history.csv.k2j3h4.tmp"
    stray_csv.write_text("half a history")
    no_parquet = runs_dir / "20261130-010203-dead"
    no_parquet.mkdir()
    shutil.copy(runs_dir / kept_id / "config.json", no_parquet)
    broken_parquet = runs_dir / "20261130-010204-beef"
    shutil.copytree(runs_dir / kept_id, broken_parquet)
    (broken_parquet / "requests.parquet").write_bytes(b"PAR1 cut short")
    stray_parquet = runs_dir / kept_id / ".requests.parquet.x8y9z0.tmp"
    stray_parquet.write_bytes(b"PAR1 half")
    # A run being written right now by another process (this one): it holds its folder's lock, however old the
    # folder looks; a temporary file of a save under way is fresh.
    in_progress = runs_dir / "20261130-235959-cafe"
    writer = FolderLock.hold(in_progress)
    shutil.copy(runs_dir / kept_id / "config.json", in_progress)
    age(stray_csv, runs_dir)
    fresh_tmp = root / ".history.csv.fresh1.tmp"
    fresh_tmp.write_text("being written")

    try:
        proc = run_cli(root)
    finally:
        writer.release()

    assert proc.returncode == 0, proc.stderr
    (warning,) = history_warnings_of(proc)
    assert "put back 1 run(s)" in warning and lost_id in warning
    assert "removed 4 leftover(s)" in warning
    for gone in (stray_csv, stray_parquet, no_parquet, broken_parquet):
        assert not gone.exists() and str(gone) in warning
    assert in_progress.is_dir() and fresh_tmp.exists()
    runs = History(root).load().set_index("run_id")
    assert len(runs) == 3 and {kept_id, lost_id} < set(runs.index)
    assert csv_path.read_bytes().startswith(header + row1 + row2)  # its row back as it was, before the new run's
    assert History(root).requests(lost_id).equals(pd.read_parquet(runs_dir / lost_id / "requests.parquet"))


def test_the_history_page_recovers_leftovers_too_and_says_so_once(results, monkeypatch, fresh_dashboard):
    root, (kept_id, lost_id) = results
    csv_path = root / "history.csv"
    header, row1, _ = csv_path.read_bytes().splitlines(keepends=True)
    csv_path.write_bytes(header + row1)
    stray = root / ".history.csv.abc123.tmp"
    stray.write_text("half a history")
    age(stray, root / "runs")
    monkeypatch.setenv(RESULTS_ENV, str(root))

    at = history_page()

    assert not at.exception and not at.error
    (warning,) = at.warning
    assert "put back 1 run(s)" in shown(warning.value) and "removed 1 leftover(s)" in shown(warning.value)
    assert sorted(at.dataframe[0].value["run_id"]) == sorted([kept_id, lost_id])
    assert not stray.exists()
    assert not history_page().warning
