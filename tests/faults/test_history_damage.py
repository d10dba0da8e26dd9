"""A damaged results folder, as crashes, editors and disks leave one, met by the CLI and the History page (issue 10,
items 5-7). The run folders are the history's truth, history.sqlite their index, and history.csv an export that is
never read back: a history.csv cut short, garbled, not UTF-8 or without its run_id column is kept byte for byte as
history.edited-<time>-<xxxx>.csv at the next write, named once, and written again from the index with every run; a
deleted index is rebuilt from the folders to the same rows; a cell of any length goes through the folder, the index
and the CSV whole; and what a crash left behind is recovered or removed, a run in progress spared."""

import csv
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from bench_core import csvstore
from bench_core.config import DatasetConfig, EngineConfig, LoadConfig, RunConfig
from bench_core.run.runner import Runner
from bench_core.store import leftovers as history_leftovers
from bench_core.store.history import RESULTS_ENV, History, RunRecord
from bench_core.store.journal import FolderLock
from bench_core.store.leftovers import DELETED_PREFIX, STALE_AFTER_S

# Each test here runs a real engine, server, app script or process for seconds: not in the fast suite.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from app_under_test import APP, shown  # noqa: E402
from cli_output import without_run_flags  # noqa: E402

ENV = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
INDEX_FILES = ("history.sqlite", "history.sqlite-wal", "history.sqlite-shm")


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


def failed_record(run_id: str, label: str = "failed", error: str = "the engine did not load") -> RunRecord:
    """A run that failed before measuring, as the runner records one: settings and error, no requests."""
    return RunRecord(run_id=run_id, started_at="", status="failed", config=tiny_config(label), error=error)


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
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )


def start_cli(root: Path, *args: str) -> subprocess.CompletedProcess:
    """A start of the CLI that records nothing (`history list`, or the `history` command given): it tidies the
    history and says what that did, as every start does."""
    return subprocess.run(
        [sys.executable, "-m", "bench_core", "history", *(args or ("list",)), "--results", str(root)],
        cwd=root.parent,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )


def history_warnings_of(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in without_run_flags(proc.stderr.splitlines()) if line.startswith("warning:")]


def new_run_id(root: Path, before: list[str]) -> str:
    (run_id,) = [run_id for run_id in History(root).load()["run_id"] if run_id not in before]
    return run_id


def kept_aside(root: Path) -> Path:
    """The one copy of a changed history.csv that a write kept (history.edited-<time>-<xxxx>.csv)."""
    (kept,) = root.glob("history.edited-*.csv")
    return kept


def csv_rows(path: Path) -> list[dict[str, str]]:
    """history.csv's rows as the csv module reads the file."""
    with open(path, newline="", encoding="utf-8") as file:
        return list(csv.DictReader(file))


def unindex(root: Path, run_id: str) -> None:
    """Leave the run's folder without its row in the index, as a crash between the two does: the row is deleted
    (from the index and history.csv) while the folder is out of the way, then the folder comes back."""
    folder, aside = root / "runs" / run_id, root.parent / f"aside-{run_id}"
    shutil.move(folder, aside)
    history = History(root)
    assert history.delete([run_id]) == 1 and history.take_notices() == []
    shutil.move(aside, folder)
    assert History(root).row(run_id) is None


def age(*paths: Path) -> None:
    """Make files and folders look untouched for longer than a run in progress could leave them."""
    old = time.time() - STALE_AFTER_S - 60
    for path in paths:
        for item in [path, *(path.rglob("*") if path.is_dir() else [])]:
            os.utime(item, (old, old))


def history_page() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=60).run()
    return at.switch_page("app_pages/history.py").run()


# ---- item 5: a damaged history.csv is kept aside as it was, and written again from the index ----------------


def test_a_row_cut_short_is_kept_aside_and_the_next_run_is_saved_with_every_run(results):
    root, run_ids = results
    csv_path = root / "history.csv"
    good = csv_path.read_bytes()
    first_row = good.splitlines(keepends=True)[1]
    damaged = good + first_row[: len(first_row) // 3]  # a crash in the middle of a row: its tail cells never written
    csv_path.write_bytes(damaged)

    proc = run_cli(root)

    assert proc.returncode == 0, proc.stderr
    run_id = new_run_id(root, run_ids)
    assert f"run {run_id}: finished in {csv_path}" in proc.stderr
    kept = kept_aside(root)
    assert kept.read_bytes() == damaged  # byte for byte, for whoever wants it
    (warning,) = history_warnings_of(proc)
    assert str(kept) in warning and "written again from the history's index" in warning
    after = csv_path.read_bytes()
    assert after.startswith(good)  # the good rows byte for byte, their full precision included
    assert len(after.splitlines()) == 4  # the header, the two runs, the new one: no line of the cut row
    assert [row["run_id"] for row in csv_rows(csv_path)] == [*run_ids, run_id]
    runs = History(root).load()
    assert list(runs["run_id"]) == [*run_ids, run_id]
    assert runs["completed"].notna().all()  # no padded row with empty cells

    again = start_cli(root)  # said once: the next start has nothing to say, nor to keep
    assert again.returncode == 0 and history_warnings_of(again) == [], again.stderr
    assert kept_aside(root) == kept and csv_path.read_bytes() == after


def test_garbage_an_unterminated_quote_and_an_empty_run_id_are_kept_aside_and_named_on_the_history_page(
    results, monkeypatch, fresh_dashboard
):
    from dashboard.state import get_runner

    root, run_ids = results
    csv_path = root / "history.csv"
    header, row1, row2 = csv_path.read_bytes().splitlines(keepends=True)
    columns = header.decode().rstrip("\r\n").split(",")
    no_id = ",".join("" if name == "run_id" else "1" for name in columns).encode() + b"\r\n"
    garbage, open_quote = b"this is garbage\r\n", b'transformers,"4,random\r\n'
    damaged = header + row1 + garbage + open_quote + no_id + row2
    csv_path.write_bytes(damaged)
    monkeypatch.setenv(RESULTS_ENV, str(root))

    at = history_page()

    # The page reads the index: the file is not read back, and nothing is written until the next run.
    assert not at.exception and not at.error and not at.warning
    assert list(at.dataframe[0].value["run_id"]) == run_ids[::-1]
    assert csv_path.read_bytes() == damaged

    run = get_runner().submit(tiny_config("run 3"))  # the dashboard records its next run
    assert run.wait(120) and run.state == "finished", run.message
    at = history_page()

    assert not at.exception and not at.error
    kept = kept_aside(root)
    (warning,) = at.warning
    assert str(kept) in shown(warning.value)
    assert kept.read_bytes() == damaged
    assert list(at.dataframe[0].value["run_id"]) == [run.run_id, *run_ids[::-1]]
    after = csv_path.read_bytes()
    assert after.startswith(header + row1 + row2) and b"garbage" not in after and b'"4,random' not in after
    assert [row["run_id"] for row in csv_rows(csv_path)] == [*run_ids, run.run_id]
    assert not history_page().warning  # said once
    assert kept_aside(root) == kept and csv_path.read_bytes() == after


def test_lines_that_are_not_utf8_are_kept_aside_and_the_run_is_saved(results):
    root, run_ids = results
    csv_path = root / "history.csv"
    good = csv_path.read_bytes()
    latin1 = good.splitlines(keepends=True)[1].replace(b"run 1", "r\u00e9sum\u00e9".encode("latin-1"))
    csv_path.write_bytes(good + latin1)

    proc = run_cli(root)

    assert proc.returncode == 0, proc.stderr
    run_id = new_run_id(root, run_ids)
    kept = kept_aside(root)
    (warning,) = history_warnings_of(proc)
    assert str(kept) in warning
    assert kept.read_bytes() == good + latin1
    after = csv_path.read_bytes()
    assert after.startswith(good) and "r\u00e9sum\u00e9".encode("latin-1") not in after
    after.decode("utf-8")  # the export is UTF-8 throughout
    assert [row["run_id"] for row in csv_rows(csv_path)] == [*run_ids, run_id]
    runs = History(root).load()
    assert list(runs["run_id"]) == [*run_ids, run_id]
    assert all((root / "runs" / run_id / "row.json").is_file() for run_id in runs["run_id"])


def test_a_cell_holding_line_breaks_round_trips_and_is_no_damage(results):
    root, run_ids = results
    history = History(root)
    message = 'engine said:\n  "out of memory"\r\n  at step 3'
    history.record(failed_record("20261130-120000-abcd", label="two\nlines", error=message))
    before = (root / "history.csv").read_bytes()

    history.tidy()

    assert history.take_notices() == []
    assert history.row("20261130-120000-abcd")["error"] == message
    assert history.row("20261130-120000-abcd")["label"] == "two\nlines"
    runs = history.load().set_index("run_id")
    assert list(runs.index) == [*run_ids, "20261130-120000-abcd"]
    assert runs.loc["20261130-120000-abcd", "error"] == message
    assert runs.loc["20261130-120000-abcd", "label"] == "two\nlines"
    (row,) = [row for row in csv_rows(root / "history.csv") if row["run_id"] == "20261130-120000-abcd"]
    assert row["error"] == message and row["label"] == "two\nlines"
    # The file with line breaks in a row is the index's own: the next start and write append to it.
    later = History(root)
    later.tidy()
    later.record(failed_record("20261130-120001-abcd"))
    assert later.take_notices() == [] and not list(root.glob("history.edited-*"))
    assert (root / "history.csv").read_bytes().startswith(before)
    assert [row["run_id"] for row in csv_rows(root / "history.csv")] == [
        *run_ids,
        "20261130-120000-abcd",
        "20261130-120001-abcd",
    ]


# ---- item 6: a history.csv without its run_id column is an edit like any other -------------------------------


def test_a_renamed_run_id_header_is_kept_aside_and_the_next_run_is_saved(results):
    root, run_ids = results
    csv_path = root / "history.csv"
    original = csv_path.read_bytes()
    renamed = original.replace(b",run_id,", b",run,", 1)
    csv_path.write_bytes(renamed)
    folders = sorted(path.name for path in (root / "runs").iterdir())

    proc = run_cli(root)

    assert proc.returncode == 0, proc.stderr
    run_id = new_run_id(root, run_ids)
    assert f"run {run_id}: finished in {csv_path}" in proc.stderr
    kept = kept_aside(root)
    (warning,) = history_warnings_of(proc)
    assert str(kept) in warning
    assert kept.read_bytes() == renamed
    assert csv_path.read_bytes().startswith(original)  # the run_id column back, the earlier rows as they were
    assert [row["run_id"] for row in csv_rows(csv_path)] == [*run_ids, run_id]
    assert sorted(path.name for path in (root / "runs").iterdir()) == sorted([*folders, run_id])
    again = start_cli(root)
    assert again.returncode == 0 and history_warnings_of(again) == [], again.stderr


def test_a_renamed_run_id_header_does_not_refuse_the_dashboards_save_and_the_history_page_says_so_once(
    results, monkeypatch, fresh_dashboard
):
    from dashboard.state import get_history

    root, run_ids = results
    csv_path = root / "history.csv"
    renamed = csv_path.read_bytes().replace(b",run_id,", b",id,", 1)
    csv_path.write_bytes(renamed)
    monkeypatch.setenv(RESULTS_ENV, str(root))
    assert not history_page().warning

    get_history().record(failed_record("20261130-120000-abcd", label="x"))  # a run that failed before measuring
    at = history_page()

    assert not at.exception and not at.error
    kept = kept_aside(root)
    (warning,) = at.warning
    assert str(kept) in shown(warning.value) and str(csv_path) in shown(warning.value)
    assert kept.read_bytes() == renamed
    assert list(at.dataframe[0].value["run_id"]) == ["20261130-120000-abcd", *run_ids[::-1]]
    assert [row["run_id"] for row in csv_rows(csv_path)] == [*run_ids, "20261130-120000-abcd"]
    assert (root / "runs" / "20261130-120000-abcd" / "row.json").is_file()
    assert not history_page().warning


# ---- the index: deleted, it is rebuilt from the folders; a cell of any length goes through it -----------------


def test_a_deleted_index_is_rebuilt_at_the_next_start_to_the_same_rows(results, tmp_path):
    root, run_ids = results
    history = History(root)
    history.record(failed_record("20261130-120000-abcd", label="two\nlines", error='said:\n"no"'))
    lmdeploy_csv = tmp_path / "profile_throughput.csv"
    csvstore.append_row(lmdeploy_csv, history.lmdeploy_row(run_ids[0]))
    (imported,) = history.import_csv(lmdeploy_csv)  # a row without a run of ours: its folder holds only row.json
    history.record(failed_record("20261130-120001-abcd"))
    history.delete(["20261130-120001-abcd"])
    before = History(root).load()
    rows = {run_id: history.row(run_id) for run_id in before["run_id"]}
    exported = (root / "history.csv").read_bytes()
    assert list(before["run_id"]) == [*run_ids, "20261130-120000-abcd", imported]
    for name in INDEX_FILES:
        (root / name).unlink(missing_ok=True)

    proc = start_cli(root)

    assert proc.returncode == 0, proc.stderr
    (warning,) = history_warnings_of(proc)
    assert "Built the history's index" in warning and "from 4 run folder(s)" in warning
    rebuilt = History(root)
    pd.testing.assert_frame_equal(rebuilt.load(), before)
    assert {run_id: rebuilt.row(run_id) for run_id in before["run_id"]} == rows
    assert rebuilt.row("20261130-120001-abcd") is None  # a deleted run stays deleted
    again = start_cli(root)
    assert again.returncode == 0 and history_warnings_of(again) == [], again.stderr
    # history.csv was the index's export, and still is: the next write appends to it, keeping nothing aside.
    rebuilt.record(failed_record("20261130-120002-abcd"))
    assert rebuilt.take_notices() == [] and not list(root.glob("history.edited-*"))
    assert (root / "history.csv").read_bytes().startswith(exported)


def test_a_cell_of_200000_characters_is_kept_whole_by_the_folder_the_index_and_history_csv(results, tmp_path):
    root, run_ids = results
    line = 'server log: "CUDA out of memory", tried to allocate 2.00 GiB,\n'
    error = (line * (200_000 // len(line) + 1))[:200_000]  # a failed run's error quoting a server's log
    history = History(root)

    history.record(failed_record("20261130-120000-abcd", error=error))

    assert history.take_notices() == []
    assert history.row("20261130-120000-abcd")["error"] == error
    assert history.load().set_index("run_id").loc["20261130-120000-abcd", "error"] == error
    folder_row = json.loads((root / "runs" / "20261130-120000-abcd" / "row.json").read_text(encoding="utf-8"))
    assert folder_row["error"] == error
    (row,) = [row for row in csv_rows(root / "history.csv") if row["run_id"] == "20261130-120000-abcd"]
    assert row["error"] == error
    # The index is rebuilt from the folders with the cell whole.
    for name in INDEX_FILES:
        (root / name).unlink(missing_ok=True)
    rebuilt = History(root)
    assert rebuilt.row("20261130-120000-abcd")["error"] == error
    (notice,) = rebuilt.take_notices()
    assert "from 3 run folder(s)" in notice and "could not be read" not in notice
    assert rebuilt.load().set_index("run_id").loc["20261130-120000-abcd", "error"] == error
    # history.csv with that cell imports into another history (a process of its own: the CLI's).
    other = tmp_path / "other"
    proc = start_cli(other, "import", str(root / "history.csv"))
    assert proc.returncode == 0, proc.stderr
    assert History(other).row("20261130-120000-abcd")["error"] == error
    assert list(History(other).load()["run_id"]) == [*run_ids, "20261130-120000-abcd"]


# ---- item 7: what a crash left is recovered or removed; what a run in progress writes is not -------------------


def test_leftovers_of_a_crash_are_recovered_or_removed_on_start_and_a_run_in_progress_is_spared(results):
    root, (kept_id, lost_id) = results
    csv_path = root / "history.csv"
    original = csv_path.read_bytes()
    header, row1, row2 = original.splitlines(keepends=True)
    assert lost_id.encode() in row2
    unindex(root, lost_id)  # killed after the folder, before its row in the index
    assert csv_path.read_bytes() == header + row1
    runs_dir = root / "runs"
    stray_csv = root / ".history.csv.k2j3h4.tmp"
    stray_csv.write_text("half a history")
    no_parquet = runs_dir / "20261130-010203-dead"
    no_parquet.mkdir()
    shutil.copy(runs_dir / kept_id / "config.json", no_parquet)
    broken_parquet = runs_dir / "20261130-010204-beef"
    shutil.copytree(runs_dir / kept_id, broken_parquet)  # its row.json is another run's: not this folder's row
    (broken_parquet / "requests.parquet").write_bytes(b"PAR1 cut short")
    stray_parquet = runs_dir / lost_id / ".requests.parquet.x8y9z0.tmp"
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
    assert in_progress.is_dir() and fresh_tmp.exists() and str(in_progress) not in warning
    runs = History(root).load().set_index("run_id")
    assert len(runs) == 3 and {kept_id, lost_id} < set(runs.index)
    assert csv_path.read_bytes().startswith(original)  # its row back as it was, before the new run's
    assert not list(root.glob("history.edited-*"))
    assert History(root).requests(lost_id).equals(pd.read_parquet(runs_dir / lost_id / "requests.parquet"))


def test_the_history_page_recovers_leftovers_too_and_says_so_once(results, monkeypatch, fresh_dashboard):
    root, (kept_id, lost_id) = results
    csv_path = root / "history.csv"
    original = csv_path.read_bytes()
    unindex(root, lost_id)
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
    assert csv_path.read_bytes() == original  # its row back in history.csv too, byte for byte
    assert not history_page().warning


def test_the_folder_of_a_delete_cut_short_is_removed_once_it_is_old(results, monkeypatch):
    root, (kept_id, doomed_id) = results
    # A delete renames the run's folder out of the way, removes its row, then the folder: killed before the last.
    trash = root / "runs" / f"{DELETED_PREFIX}{doomed_id}-ab12"
    os.replace(root / "runs" / doomed_id, trash)
    assert History(root).delete([doomed_id]) == 1

    soon = History(root)
    soon.tidy()

    # A delete under way may still rename its folder back (its index write failed): a fresh one is left alone.
    assert soon.take_notices() == [] and trash.is_dir()
    later_clock = time.time() + STALE_AFTER_S + 60
    monkeypatch.setattr(history_leftovers, "time", SimpleNamespace(time=lambda: later_clock))

    later = History(root)
    later.tidy()

    (notice,) = later.take_notices()
    assert "removed 1 leftover(s)" in notice and str(trash) in notice
    assert not trash.exists()
    assert list(later.load()["run_id"]) == [kept_id] and (root / "runs" / kept_id).is_dir()
    assert [row["run_id"] for row in csv_rows(root / "history.csv")] == [kept_id]
