"""Fault injection on storage: results folders and CSVs that cannot be written, a results folder that
breaks during the run, a damaged history.csv (an export: kept aside at the next write, never in the way of a
run), a user's CSV that must keep its identity, run ids too long for a file name, a full disk while a run is
saved (the history as it was, the run kept elsewhere) or a row appended. Real files, real `python -m bench_core`
processes on the tiny model, real sockets, a real full file system."""

from __future__ import annotations

import contextlib
import os
import pty
import re
import select
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest

from bench_core import csvstore
from bench_core.errors import HistoryError
from bench_core.models.resolve import cache_dir
from bench_core.store.history import History

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from cli_output import without_run_flags
from openai_server import misbehaving_server  # noqa: F401 (fixture)

# Each test here runs a real engine, server, app script or process for seconds: not in the fast suite.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = (
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
    "16",
)
UNWRITABLE_RESULTS = ("/proc/benchtest", "/sys/benchtest", "a-file", "a-file/below")


@pytest.fixture
def cache(tmp_path, tiny_model_path) -> Path:
    """A cache folder of our own (where unsaved runs go), holding the built models by link."""
    folder = tmp_path / "cache"
    folder.mkdir()
    for entry in cache_dir().iterdir():  # the built models; not the machine's own unsaved runs
        if not entry.name.endswith(".lock") and entry.name != "unsaved-results":
            (folder / entry.name).symlink_to(entry)
    return folder


@pytest.fixture
def empty_cache(tmp_path) -> Path:
    """A cache folder with nothing in it: resolving builtin:tiny-llama (as a model or a tokenizer) builds it here,
    and a run whose results folder fails keeps itself here, so a refusal before anything loads or runs leaves it
    empty."""
    folder = tmp_path / "empty-cache"
    folder.mkdir()
    return folder


def cli_env(cache: Path | None = None) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    if cache is not None:
        env["BENCH_STUDIO_CACHE"] = str(cache)
    return env


def run_cli(*args: str, cwd: Path, cache: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bench_core", *args],
        cwd=cwd,
        env=cli_env(cache),
        capture_output=True,
        text=True,
        timeout=300,
    )


def run_cli_breaking(args: tuple[str, ...], cwd: Path, cache: Path, sabotage: Callable[[], None]) -> tuple[int, str]:
    """Run the CLI with stderr on a terminal and call `sabotage` once its first progress line shows the run
    under way (past every check made before the run); the exit code and stderr."""
    controller, terminal = pty.openpty()
    with open(cwd / "stdout.txt", "wb") as stdout:
        process = subprocess.Popen(
            [sys.executable, "-m", "bench_core", *args],
            cwd=cwd,
            env=cli_env(cache),
            stdout=stdout,
            stderr=terminal,
            stdin=subprocess.DEVNULL,
        )
    os.close(terminal)
    seen, sabotaged, deadline = b"", False, time.monotonic() + 300
    try:
        while time.monotonic() < deadline:
            if not select.select([controller], [], [], 1)[0]:
                continue
            try:
                chunk = os.read(controller, 4096)
            except OSError:  # the process closed the terminal: it has ended
                break
            if not chunk:
                break
            seen += chunk
            if not sabotaged and re.search(rb"(queued|loading|running)", seen):
                sabotage()
                sabotaged = True
    finally:
        os.close(controller)
        code = process.wait(timeout=60)
    assert sabotaged, seen.decode(errors="replace")
    return code, seen.decode(errors="replace").replace("\r", "")


def quiet_socket() -> socket.socket:
    """A listening socket on 127.0.0.1 that answers nothing: it only tells whether anyone connected."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.setblocking(False)
    return listener


def was_contacted(listener: socket.socket) -> bool:
    try:
        listener.accept()[0].close()
    except BlockingIOError:
        return False
    return True


def kept_run(stderr: str) -> tuple[str, Path]:
    """The run id and the fallback folder an unsaved run's message names."""
    match = re.search(r"error: run (\S+) \(\w+\): .* it is kept in (.+) instead", stderr)
    assert match, stderr
    return match.group(1), Path(match.group(2))


def assert_kept_whole(run_id: str, folder: Path) -> None:
    assert run_id.encode() in (folder / "history.csv").read_bytes()
    written = {path.name for path in (folder / "runs" / run_id).iterdir()}
    assert {"config.json", "environment.json", "requests.parquet"} <= written
    assert len(History(folder).requests(run_id)) == 4


# ---- 1. results folder: checked before anything runs; a save that fails after the run is an error ----


@pytest.mark.parametrize("results", UNWRITABLE_RESULTS)
def test_pipeline_refuses_an_unwritable_results_folder_before_running(tmp_path, empty_cache, results):
    (tmp_path / "a-file").write_text("not a folder")
    proc = run_cli(*PIPELINE, "--results", results, cwd=tmp_path, cache=empty_cache)
    assert list(empty_cache.iterdir()) == []  # the model was never built or loaded, no run kept
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"error: Cannot write {results}: ")
    assert proc.stdout == ""  # no summary table: nothing ran
    assert not (tmp_path / "profile_pipeline_api.csv").exists()


@pytest.mark.parametrize("results", UNWRITABLE_RESULTS[:2])
def test_restful_refuses_an_unwritable_results_folder_before_sending(tmp_path, tiny_model_path, results):
    server = quiet_socket()
    proc = run_cli(
        "restful",
        "--base-url",
        f"http://127.0.0.1:{server.getsockname()[1]}",
        "--model",
        "m",
        "--tokenizer",
        "builtin:tiny-llama",
        "--num-prompts",
        "2",
        "--timeout",
        "5",
        "--results",
        results,
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"error: Cannot write {results}: ")
    assert not was_contacted(server)
    server.close()


def test_a_pipeline_run_whose_results_folder_breaks_is_kept_in_the_cache_and_exits_1(tmp_path, cache):
    results = tmp_path / "results"
    results.mkdir()

    def replace_results_by_a_file():
        shutil.rmtree(results)
        results.write_text("the results folder is gone")

    code, stderr = run_cli_breaking((*PIPELINE, "--results", str(results)), tmp_path, cache, replace_results_by_a_file)
    assert code == 1, stderr
    assert "finished in" not in stderr and "Traceback" not in stderr
    run_id, folder = kept_run(stderr)
    assert folder == cache / "unsaved-results"
    assert f"not saved in {results}" in stderr
    assert_kept_whole(run_id, folder)
    assert "Profile Pipeline API" in (tmp_path / "stdout.txt").read_text()  # the measurement was still shown


def test_a_restful_run_whose_results_folder_breaks_is_kept_in_the_cache_and_exits_1(
    tmp_path, cache, misbehaving_server
):
    results = tmp_path / "results"
    results.mkdir()

    def replace_results_by_a_file():
        shutil.rmtree(results)
        results.write_text("the results folder is gone")

    args = (
        "restful",
        "--base-url",
        misbehaving_server,
        "--model",
        "m",
        "--tokenizer",
        "builtin:tiny-llama",
        "--dataset-path",
        "builtin:sample",
        "--num-prompts",
        "4",
        "--sharegpt-output-len",
        "100",
        "--max-concurrency",
        "2",
        "--output-file",
        "out.csv",
        "--results",
        str(results),
    )
    code, stderr = run_cli_breaking(args, tmp_path, cache, replace_results_by_a_file)
    assert code == 1, stderr
    assert "finished in" not in stderr and "Traceback" not in stderr
    run_id, folder = kept_run(stderr)
    assert folder == cache / "unsaved-results"
    assert_kept_whole(run_id, folder)
    assert len((tmp_path / "out.csv").read_text().splitlines()) == 2  # their CSV still has its row


# ---- 2. a damaged history.csv: kept aside at the next write, and the run saved ----


@pytest.fixture(scope="module")
def first_run(tmp_path_factory, tiny_model_path) -> Path:
    """A folder after one real CLI run: results/ with its history, and the default LMDeploy CSV."""
    work = tmp_path_factory.mktemp("first-run")
    proc = run_cli(*PIPELINE, "--results", "results", cwd=work)
    assert proc.returncode == 0, proc.stderr
    return work


@pytest.fixture
def work(first_run, tmp_path) -> Path:
    shutil.copytree(first_run, tmp_path / "work", symlinks=True)
    return tmp_path / "work"


def test_a_damaged_row_in_history_csv_is_kept_aside_and_the_next_run_is_saved(work, cache):
    history_csv = work / "results" / "history.csv"
    first = history_csv.read_bytes()
    with open(history_csv, "ab") as f:
        f.write(b"20261130-000000-dead,caf\xe9 \xff damaged\r\n")
    damaged = history_csv.read_bytes()

    proc = run_cli(*PIPELINE, "--results", "results", cwd=work, cache=cache)

    # Saved: its row is in the history and its history.csv; the damaged file was kept aside as it was, and said so.
    assert proc.returncode == 0, proc.stderr
    new_run = saved_run(proc.stderr)
    assert History(work / "results").row(new_run) is not None
    kept = kept_aside(work / "results")
    assert kept.read_bytes() == damaged
    assert [line for line in proc.stderr.splitlines() if kept.name in line] == [
        f"warning: results/history.csv was changed outside the app since it was last written: it was kept as "
        f"results/{kept.name}, and history.csv was written again from the history's index (edits to it are not "
        "read back; docs/history.md says how to bring rows in)."
    ]
    after = history_csv.read_bytes()
    assert after.startswith(first) and after.count(new_run.encode()) == 1 and b"\xff damaged" not in after


def test_a_history_csv_whose_header_is_not_utf8_is_kept_aside_and_the_run_is_saved(work, cache):
    history_csv = work / "results" / "history.csv"
    first = history_csv.read_bytes()
    damaged = first.replace(b"run_id", b"run_\xffid", 1)
    history_csv.write_bytes(damaged)
    runs_before = sorted(p.name for p in (work / "results" / "runs").iterdir())

    proc = run_cli(*PIPELINE, "--results", "results", cwd=work, cache=cache)

    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    new_run = saved_run(proc.stderr)
    kept = kept_aside(work / "results")
    assert kept.read_bytes() == damaged  # left as it was, under a name of its own
    assert sum(kept.name in line for line in proc.stderr.splitlines()) == 1
    assert history_csv.read_bytes().startswith(first)  # written again from the index: every run, the header whole
    assert sorted(p.name for p in (work / "results" / "runs").iterdir()) == sorted([*runs_before, new_run])
    assert not (cache / "unsaved-results").exists()


def test_a_history_csv_whose_header_breaks_during_the_run_is_kept_aside_and_the_run_is_saved(work, cache):
    history_csv = work / "results" / "history.csv"
    first = history_csv.read_bytes()
    damaged = first.replace(b"run_id", b"run_\xffid", 1)
    runs_before = sorted(p.name for p in (work / "results" / "runs").iterdir())

    code, stderr = run_cli_breaking(
        (*PIPELINE, "--results", "results"), work, cache, lambda: history_csv.write_bytes(damaged)
    )

    assert code == 0, stderr
    assert "Traceback" not in stderr
    new_run = saved_run(stderr)
    kept = kept_aside(work / "results")
    assert kept.read_bytes() == damaged
    assert sum(kept.name in line for line in stderr.splitlines()) == 1
    assert history_csv.read_bytes().startswith(first)
    assert list(History(work / "results").load()["run_id"]) == [*runs_before, new_run]
    assert sorted(p.name for p in (work / "results" / "runs").iterdir()) == sorted([*runs_before, new_run])
    assert not (cache / "unsaved-results").exists()  # nothing had to be kept elsewhere


def saved_run(stderr: str) -> str:
    """The run id of the run the CLI's last line says is in the history."""
    match = re.search(r"^run (\d{8}-\d{6}-\w+): finished in results/history.csv$", stderr, re.MULTILINE)
    assert match, stderr
    return match.group(1)


def kept_aside(root: Path) -> Path:
    """The one copy of a changed history.csv that a write kept (history.edited-<time>-<xxxx>.csv)."""
    (kept,) = root.glob("history.edited-*.csv")
    return kept


# ---- 3. CSVs that cannot be written: checked up front; a lock that cannot be made is no lock to wait for ----


@pytest.mark.parametrize("csv_path", ["/proc/x.csv", "a-file/x.csv", "a-folder"])
def test_pipeline_refuses_an_unwritable_csv_before_running(tmp_path, empty_cache, csv_path):
    (tmp_path / "a-file").write_text("not a folder")
    (tmp_path / "a-folder").mkdir()
    proc = run_cli(*PIPELINE, "--results", "results", "--csv", csv_path, cwd=tmp_path, cache=empty_cache)
    assert list(empty_cache.iterdir()) == []  # the model was never built or loaded
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"error: Cannot write {csv_path}: ")
    assert proc.stdout == "" and not (tmp_path / "results").exists()


def test_restful_refuses_an_unwritable_output_file_before_sending(tmp_path, empty_cache):
    server = quiet_socket()
    proc = run_cli(
        "restful",
        "--base-url",
        f"http://127.0.0.1:{server.getsockname()[1]}",
        "--model",
        "m",
        "--tokenizer",
        "builtin:tiny-llama",
        "--num-prompts",
        "2",
        "--timeout",
        "5",
        "--output-file",
        "/proc/x.csv",
        "--results",
        "results",
        cwd=tmp_path,
        cache=empty_cache,
    )
    assert not was_contacted(server)  # not even asked for its model
    assert list(empty_cache.iterdir()) == []  # nor the tokenizer built or loaded
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "error: Cannot write /proc/x.csv: /proc does not take new files (No such file or directory)."
    ]
    server.close()


@pytest.mark.parametrize("where", ["/proc/x.csv", "a-file/x.csv"])
def test_a_lock_file_that_cannot_be_created_fails_at_once(tmp_path, monkeypatch, where):
    monkeypatch.chdir(tmp_path)
    Path("a-file").write_text("not a folder")
    # Every lock the store takes, taken without waiting: one that could not be made would time out at once.
    taken = []
    real_lock = csvstore.FileLock
    monkeypatch.setattr(csvstore, "FileLock", lambda path, timeout: taken.append(path) or real_lock(path, timeout=0))
    with pytest.raises(HistoryError, match=f"Cannot write {where}"):
        csvstore.append_row(where, {"backend": "transformers"})
    assert taken == []  # refused before any lock was waited for


# ---- 4. appending to a user's CSV keeps the file: inode, mode, symlink, hard links ----


def test_the_cli_appends_to_the_users_csv_in_place(work, cache):
    target = work / "profile_pipeline_api.csv"
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~current_umask()  # made as open() makes files, not 0600
    target.chmod(0o640)
    (work / "link.csv").symlink_to(target.name)
    os.link(target, work / "hard-link.csv")
    inode, before = target.stat().st_ino, target.read_bytes()

    proc = run_cli(*PIPELINE, "--results", "results", "--csv", "link.csv", cwd=work, cache=cache)

    assert proc.returncode == 0, proc.stderr
    assert (work / "link.csv").is_symlink() and os.readlink(work / "link.csv") == target.name
    assert target.stat().st_ino == inode and stat.S_IMODE(target.stat().st_mode) == 0o640
    after = (work / "hard-link.csv").read_bytes()
    assert after.startswith(before) and len(after.splitlines()) == 3


def test_a_new_column_rewrites_the_target_of_a_symlink_keeping_link_and_mode(tmp_path):
    target = tmp_path / "data.csv"
    csvstore.append_row(target, {"a": 1})
    target.chmod(0o604)
    link = tmp_path / "link.csv"
    link.symlink_to(target)

    csvstore.append_row(link, {"a": 2, "b": 3})

    assert link.is_symlink() and stat.S_IMODE(target.stat().st_mode) == 0o604
    assert target.read_text().splitlines() == ["a,b", "1,", "2,3"]
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_an_append_after_a_last_line_without_line_break_starts_a_new_line(tmp_path):
    path = tmp_path / "edited.csv"
    path.write_bytes(b"a,b\r\n1,2")  # saved by an editor without the final line break
    csvstore.append_row(path, {"a": 3, "b": 4})
    assert path.read_bytes() == b"a,b\r\n1,2\r\n3,4\r\n"


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# ---- 8. run ids on import: length and characters checked, one clear message ----


def test_an_imported_run_id_too_long_for_a_file_name_is_refused_naming_it(tmp_path):
    history = History(tmp_path / "results")
    long_id = "r" * 300
    source = tmp_path / "other-history.csv"
    source.write_text(f"run_id,status,label\r\n20261130-101010-ab12,finished,ok\r\n{long_id},finished,long\r\n")

    with pytest.raises(HistoryError) as refused:
        history.import_csv(source)

    message = str(refused.value)
    assert message.startswith(f"Line 3 of other-history.csv has '{'r' * 40}...' (300 characters) as its run id")
    assert "1 to 100 letters, digits" in message and len(message) < 300
    assert not history.csv_path.exists()  # nothing imported, not even the good row


@pytest.mark.parametrize("bad_id", ["r" * 101, "../escape", "id with spaces", "trailing-newline\n"])
def test_a_history_holding_a_bad_run_id_answers_with_a_message_not_an_os_error(tmp_path, bad_id):
    history = History(tmp_path)
    with pytest.raises(HistoryError, match="is not a run id"):
        history.measured(bad_id)


# ---- round 3: one file-mode policy, a private last fallback -----------------------------------------------------


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_every_file_a_run_writes_takes_the_users_umask(tmp_path, tiny_model_path, umask):
    process = subprocess.run(
        [sys.executable, "-m", "bench_core", *PIPELINE, "--results", "results", "--csv", "out.csv"],
        cwd=tmp_path,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=lambda: os.umask(umask),
    )
    assert process.returncode == 0, process.stderr
    files = [path for path in tmp_path.rglob("*") if path.is_file() and path.name != "stdout.txt"]
    assert {"history.csv", "out.csv", "config.json", "requests.parquet", "telemetry.parquet"} <= {p.name for p in files}
    assert {str(path.relative_to(tmp_path)): oct(path.stat().st_mode & 0o777) for path in files} == {
        str(path.relative_to(tmp_path)): oct(0o666 & ~umask) for path in files
    }


def test_a_run_neither_the_history_nor_the_cache_takes_goes_to_a_private_folder_of_its_own(tmp_path, cache):
    results = tmp_path / "results"
    results.mkdir()
    taken = Path(tempfile.gettempdir()) / "llm-bench-studio-unsaved-results"  # what another user could create first
    planted = not taken.exists()
    if planted:
        taken.mkdir(mode=0o777)

    def break_both():
        shutil.rmtree(results)
        results.write_text("the results folder is gone")
        (cache / "unsaved-results").write_text("nor can the cache take it")

    try:
        code, stderr = run_cli_breaking((*PIPELINE, "--results", str(results)), tmp_path, cache, break_both)
        run_id, folder = kept_run(stderr)
        assert code == 1, stderr
        assert folder.parent == Path(tempfile.gettempdir()) and folder != taken
        assert folder.name.startswith("llm-bench-studio-unsaved-results-")
        assert folder.stat().st_mode & 0o777 == 0o700
        assert_kept_whole(run_id, folder)
        assert not any(taken.iterdir())
    finally:
        if planted:
            shutil.rmtree(taken, ignore_errors=True)
        shutil.rmtree(folder, ignore_errors=True)


# ---- a real full file system (a small tmpfs; root only) ----


@pytest.fixture
def full_disk(tmp_path) -> Path:
    """A 4 MB tmpfs mounted for the test; `fill(full_disk)` takes what room is left."""
    folder = tmp_path / "tmpfs"
    folder.mkdir()
    if (
        os.geteuid() != 0
        or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(folder)], capture_output=True
        ).returncode
        != 0
    ):
        pytest.skip("mounting a tmpfs needs root")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def fill(folder: Path) -> None:
    """Write to `folder` until its file system is full, down to its last byte."""
    fd = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        for size in (65536, 4096, 512, 1):
            with contextlib.suppress(OSError):
                while os.write(fd, b"\0" * size):
                    pass
    finally:
        os.close(fd)


def leave_room(folder: Path, room: int) -> None:
    """Fill `folder`'s file system but for `room` bytes (in whole pages), with `folder / "filler"`."""
    (folder / "filler").unlink(missing_ok=True)
    with open(folder / "filler", "wb") as f:
        f.write(b"\0" * (shutil.disk_usage(folder).free - room))


def test_an_append_that_fills_the_disk_is_undone_whole_and_the_next_one_fits(full_disk):
    path = full_disk / "history.csv"
    row = {"run_id": "r", **{f"col{i}": "x" * 20 for i in range(100)}}  # about 2.2 KB: more than a page's rest
    run_ids = [f"20260101-00000{i}-aaaa" for i in range(3)]
    for run_id in run_ids:
        csvstore.append_row(path, {**row, "run_id": run_id})
    before = path.read_bytes()
    fill(full_disk)
    with pytest.raises(HistoryError, match="No space left on device"):
        csvstore.append_row(path, {**row, "run_id": "20260101-000009-bbbb"})
    assert path.read_bytes() == before
    (full_disk / "filler").unlink()
    csvstore.append_row(path, {**row, "run_id": "20260101-000009-bbbb"})
    assert path.read_bytes().startswith(before)
    run_ids.append("20260101-000009-bbbb")
    written = path.read_bytes()

    # A folder holding only such a CSV (a history written before the index): the first read builds the index from
    # it, each row getting a folder with its row.json, and leaves the file as it is.
    history = History(full_disk)
    assert list(history.load()["run_id"]) == run_ids
    (notice,) = history.take_notices()
    assert "Built the history's index" in notice and "4 row(s)" in notice
    assert history.row(run_ids[-1]) == {**row, "run_id": run_ids[-1]}
    assert all((full_disk / "runs" / run_id / "row.json").is_file() for run_id in run_ids)
    assert path.read_bytes() == written


# Where a save runs out of room: (the error cell of the run already recorded, the new run's error cell and
# environment, the room left). A cell is in the run's row.json, in history.csv and in the index (twice: as written,
# and typed); a new column (a new environment key) makes the export rewrite history.csv whole.
FULL_DISK_SAVES = {
    "no room for the run's folder": ("", "x" * 200_000, {}, 100_000),
    "room for its folder only": ("", "x" * 200_000, {}, 300_000),
    "room for its folder and history.csv, not the index": ("", "x" * 200_000, {}, 500_000),
    "room for its folder and the index, not history.csv rewritten": ("x" * 400_000, "", {"host": "b"}, 200_000),
}


@pytest.mark.parametrize("case", FULL_DISK_SAVES)
def test_a_save_that_finds_the_disk_full_leaves_the_history_as_it_was_and_the_next_one_fits(full_disk, case):
    from bench_core.config import RunConfig
    from bench_core.store.history import RunRecord

    earlier_error, error, environment, room = FULL_DISK_SAVES[case]
    root = full_disk / "results"
    earlier = RunRecord(
        run_id="20260101-000000-aaaa", started_at="", status="failed", config=RunConfig(), error=earlier_error
    )
    History(root).record(earlier)
    before = History(root).load()
    exported = (root / "history.csv").read_bytes()
    record = RunRecord(
        run_id="20260101-000001-bbbb",
        started_at="",
        status="failed",
        config=RunConfig(),
        error=error,
        environment=environment,
    )
    leave_room(full_disk, room)

    with pytest.raises((OSError, HistoryError), match="No space left on device|disk is full"):
        History(root).record(record)

    history = History(root)
    pd.testing.assert_frame_equal(history.load(), before)  # the index as it was: its transaction rolled back
    assert history.row(record.run_id) is None
    assert (root / "history.csv").read_bytes() == exported
    assert sorted(path.name for path in (root / "runs").iterdir()) == [earlier.run_id]  # nothing of the run
    assert not list(root.rglob("*.tmp"))
    # Room again: the next start finds nothing to tidy, and the next save fits, history.csv written from the index
    # as before (nothing in it looks edited).
    (full_disk / "filler").unlink()
    history.tidy()
    history.record(record)
    assert history.take_notices() == [] and not list(root.glob("history.edited-*"))
    assert list(history.load()["run_id"]) == [earlier.run_id, record.run_id]
    assert history.row(record.run_id)["error"] == error and history.row(earlier.run_id)["error"] == earlier_error
    assert [row["run_id"] for row in csvstore.read_table(root / "history.csv")[1]] == [earlier.run_id, record.run_id]


def test_a_sweep_whose_runs_find_the_disk_full_says_they_are_not_in_the_history(full_disk, cache):
    results = full_disk / "results"
    first = run_cli(*PIPELINE, "--csv", "", "--results", str(results), cwd=full_disk, cache=cache)
    assert first.returncode == 0, first.stderr  # a history to append to
    before = History(results).load()
    exported = (results / "history.csv").read_bytes()
    # Room to read the index (its shared memory, 32 KiB, which every connection to a WAL database maps) and for the
    # small plan file; none for a run's folder (a dozen pages) and the index's shared memory as its row goes in.
    leave_room(full_disk, 32 * 1024 + 5 * 4096)

    proc = run_cli(
        "sweep",
        *PIPELINE,
        "--sweep",
        "concurrency=1,2",
        "--csv",
        "",
        "--results",
        str(results),
        cwd=full_disk,
        cache=cache,
    )

    last = proc.stderr.strip().splitlines()[-1]
    assert "2/2 runs finished" in last and "except 2 that could not be saved there" in last, proc.stderr
    assert len(list((cache / "unsaved-results" / "runs").iterdir())) == 2  # kept whole elsewhere
    pd.testing.assert_frame_equal(History(results).load(), before)  # the index as it was
    assert (results / "history.csv").read_bytes() == exported
    assert [path.name for path in (results / "runs").iterdir()] == list(before["run_id"])  # no half a run
    assert not list(results.rglob("*.tmp"))
    # Room again: the next run is saved, next to the first.
    (full_disk / "filler").unlink()
    again = run_cli(*PIPELINE, "--csv", "", "--results", str(results), cwd=full_disk, cache=cache)
    assert again.returncode == 0, again.stderr
    assert "warning: " not in "\n".join(without_run_flags(again.stderr.splitlines()))
    assert len(History(results).load()) == 2 and (results / "history.csv").read_bytes().startswith(exported)


# ---- 15. uploads are kept once per content ----


def test_the_same_upload_under_two_names_is_kept_once(tmp_path):
    from dashboard.sidebar import save_upload

    data = b'[{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}]'
    first = save_upload(data, "sharegpt.json", tmp_path / "uploads")
    again = save_upload(data, "copy of sharegpt.json", tmp_path / "uploads")
    other = save_upload(data + b"\n", "sharegpt.json", tmp_path / "uploads")
    assert again == first != other and Path(first).read_bytes() == data
    assert sorted(path.name for path in (tmp_path / "uploads").iterdir()) == sorted(
        [Path(first).name, Path(other).name]
    )
