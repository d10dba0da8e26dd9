"""A run's folder holds what its history row needs (issue 24, items 1 and 3): a process killed by SIGKILL while its
run measures (the CLI, or the dashboard's runner with its engine in a worker process) leaves a journal that the next
start records as a cancelled run with the requests finished before the kill; a folder whose row is not in the
history's index (a crash between the folder and the index, a folder moved back from unsaved-results) gets exactly
its row back at once, history.csv's line included, and one written before folders kept their row says which columns
it could not rebuild. Real processes, real files, the tiny model."""

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from bench_core.store.history import History
from bench_core.store.journal import JOURNAL_FILE, FolderLock

# Each test here runs a real engine, server, app script or process for seconds: not in the fast suite.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
PIPELINE = [
    sys.executable,
    "-m",
    "bench_core",
    "pipeline",
    "builtin:sample",
    "builtin:tiny-llama",
    "--backend",
    "transformers",
    "--stream-output",
    "--csv",
    "",
]
# The dashboard's runner (engine_process.ProcessRunner) in a process of its own, as the Streamlit server holds it.
DASHBOARD_RUNNER = textwrap.dedent("""
    import sys
    from bench_core.config import DatasetConfig, EngineConfig, LoadConfig, RunConfig
    from bench_core.run.engine_process import ProcessRunner
    from bench_core.store.history import History

    if __name__ == "__main__":
        config = RunConfig(engine=EngineConfig(backend="transformers", model="builtin:tiny-llama"),
                           dataset=DatasetConfig(dataset="builtin:sample", dataset_name="random", num_prompts=200,
                                                 random_input_len=16, random_output_len=8),
                           load=LoadConfig(concurrency=2, stream_output=True))
        ProcessRunner(History(sys.argv[1])).submit(config).wait()
""")
JOURNALED_BATCHES = 2  # the kill comes once the journal has this many batches of finished requests


def journal_of(root: Path) -> tuple[dict, dict[int, dict]]:
    """The journal's first line and its finished requests by index, as the test reads the file itself."""
    (path,) = (root / "runs").glob(f"*/{JOURNAL_FILE}")
    header, *batches = [json.loads(line) for line in path.read_text().splitlines()]
    return header, {int(index): request for batch in batches for index, request in batch["requests"].items()}


def kill_when_journaled(command: list[str], cwd: Path, root: Path) -> None:
    """Start `command`, SIGKILL it (and its whole process group: the engine's worker too) once the run's journal
    holds JOURNALED_BATCHES batches of finished requests."""
    process = subprocess.Popen(
        command, cwd=cwd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline and process.poll() is None:
            journals = list((root / "runs").glob(f"*/{JOURNAL_FILE}"))
            if journals and len(journals[0].read_text().splitlines()) > JOURNALED_BATCHES:
                break
            time.sleep(0.1)
        else:
            pytest.fail(
                f"no journal of {JOURNALED_BATCHES} batches in {root}/runs: "
                f"{process.stderr.read().decode() if process.poll() is not None else 'still running'}"
            )
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)


@pytest.mark.parametrize("kind", ["cli", "dashboard runner"])
def test_a_process_killed_mid_run_leaves_a_cancelled_run_with_what_it_had_measured(kind, tmp_path, tiny_model_path):
    root = tmp_path / "results"
    if kind == "cli":
        command = [*PIPELINE, "-n", "200", "-c", "2", "--results", str(root)]
    else:
        (tmp_path / "runner.py").write_text(DASHBOARD_RUNNER)
        command = [sys.executable, str(tmp_path / "runner.py"), str(root)]
    kill_when_journaled(command, tmp_path, root)
    header, finished = journal_of(root)
    assert not (root / "history.csv").exists()  # the kill left no row

    history = History(root)
    history.tidy()

    (notice,) = history.take_notices()
    assert "recorded 1 run(s) whose process was killed" in notice and "last recorded request" in notice
    (row,) = history.load().to_dict("records")
    assert row["status"] == "cancelled" and row["recovered_at"] and "journal" in row["error"]
    served = sum(request["status"] == 1 for request in finished.values())  # Session.SUCCESS
    assert row["completed"] + row["incomplete"] + row.get("overrun", 0) == served > 0
    assert row["unfinished"] == 200 - len(finished)
    last = max(request["finish_time"] for request in finished.values())
    assert row["duration_s"] == pytest.approx(last - header["t_start"], rel=1e-12)
    assert row["output_throughput"] == pytest.approx(row["total_output_tokens"] / row["duration_s"], rel=1e-12)
    assert row["engine_backend"] == "transformers" and row["load_seconds"] > 0 and row["model_kind"] == "builtin"
    requests = history.requests(row["run_id"])
    assert sorted(requests.index[requests["status"] != "unfinished"]) == sorted(finished)
    folder = root / "runs" / row["run_id"]
    assert not (folder / JOURNAL_FILE).exists() and (folder / "row.json").exists()
    again = History(root)
    again.tidy()
    assert again.take_notices() == [] and len(again.load()) == 1


@pytest.fixture(scope="module")
def recorded_run(tmp_path_factory, tiny_model_path):
    """A results folder with one real CLI run in it (as the issue's reproduction makes it)."""
    root = tmp_path_factory.mktemp("recorded") / "results"
    subprocess.run(
        [*PIPELINE, "-n", "3", "-c", "3", "--results", str(root)],
        cwd=root.parent,
        env=ENV,
        check=True,
        capture_output=True,
        timeout=300,
    )
    return root


@pytest.fixture
def unsaved(recorded_run, tmp_path):
    """A copy of the recorded results whose run folder has no row in the index, as after a crash between the folder
    and the index, or a save that went to unsaved-results and a folder moved back a moment ago; the original
    history.csv's bytes. The row is deleted (from the index and history.csv) while the folder is out of the way."""
    root = tmp_path / "results"
    shutil.copytree(recorded_run, root)
    original = (root / "history.csv").read_bytes()
    (run_id,) = [path.name for path in (root / "runs").iterdir()]
    shutil.move(root / "runs" / run_id, tmp_path / run_id)
    assert History(root).delete([run_id]) == 1
    shutil.move(tmp_path / run_id, root / "runs" / run_id)
    assert History(root).row(run_id) is None and rows_of(root / "history.csv") == []
    return root, run_id, original


def rows_of(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as file:
        return list(csv.DictReader(file))


def test_a_folder_moved_back_gets_its_row_back_at_once_byte_for_byte(unsaved):
    root, run_id, original = unsaved

    history = History(root)
    history.tidy()

    (notice,) = history.take_notices()
    assert "put back 1 run(s) missing from the history, as recorded" in notice and run_id in notice
    assert (root / "history.csv").read_bytes() == original  # every column, every digit
    assert history.row(run_id) == json.loads((root / "runs" / run_id / "row.json").read_text(encoding="utf-8"))
    assert list(history.load()["run_id"]) == [run_id]
    (row,) = rows_of(root / "history.csv")
    assert row["finished_at"] and row["load_seconds"] and row["engine_backend"] and row["model_kind"]


def test_a_folder_without_row_json_is_rebuilt_and_names_what_it_could_not_rebuild(unsaved):
    root, run_id, original = unsaved
    (root / "runs" / run_id / "row.json").unlink(missing_ok=True)  # written before folders kept their row

    history = History(root)
    history.tidy()

    (notice,) = history.take_notices()
    assert "rebuilt from older folders" in notice and run_id in notice
    assert "throughputs read high" in notice
    (before,) = rows_of_bytes(original)
    (after,) = rows_of(root / "history.csv")
    assert after["recovered_at"] and after["completed"] == before["completed"]
    lost = [column for column, cell in before.items() if cell and not after.get(column)]
    assert "finished_at" in lost and "engine_backend" in lost  # what such a folder never held
    for column in lost:
        assert (column[: len("engine_")] + "*" if column.startswith("engine_") else column) in notice, column
    assert after["model_kind"] == before["model_kind"] and after["roofline_bound"] == before["roofline_bound"]


def rows_of_bytes(data: bytes) -> list[dict[str, str]]:
    return list(csv.DictReader(data.decode().splitlines()))


def test_a_folder_whose_writer_is_alive_is_left_alone_however_old_and_recovered_once_it_is_gone(unsaved):
    root, run_id, original = unsaved
    folder = root / "runs" / run_id
    old = time.time() - 24 * 3600
    for path in [folder, *folder.iterdir()]:
        os.utime(path, (old, old))
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from bench_core.store.journal import FolderLock
        FolderLock.hold(Path({str(folder)!r}))
        print("held", flush=True)
        time.sleep(600)
    """),
        ],
        env=ENV,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        busy = History(root)
        busy.tidy()
        assert busy.take_notices() == [] and rows_of(root / "history.csv") == []
        assert busy.row(run_id) is None
        assert folder.is_dir()
    finally:
        holder.kill()
        holder.wait(timeout=30)

    after = History(root)
    after.tidy()

    (notice,) = after.take_notices()
    assert "put back 1 run(s)" in notice and (root / "history.csv").read_bytes() == original
    assert not (folder / ".writing").exists()
    lock = FolderLock.claim(folder)
    assert lock is not None
    lock.release()
