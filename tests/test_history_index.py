"""The history read once per change (issue 24, item 14): a row read by id is the row of the file, and every kind
of change to history.csv, by this process, another one or an editor, is seen at the next read. Real files on disk;
other processes are real processes. Speed is measured by bench/bench_history_scale.py, not here."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from bench_core import csvstore
from bench_core.store.history import QUARANTINE_FILE, History
from bench_core.store.history_index import SIDECAR_FILE, read_sidecar

ROOT = Path(__file__).resolve().parent.parent
ROUND2 = ROOT / "tests" / "data" / "history_round2"
ROWS = 300


def fresh_rows(root: Path) -> dict[str, dict[str, str]]:
    """The rows of history.csv by run id, as a plain read of the file gives them."""
    _, rows = csvstore.read_table(root / "history.csv")
    return {row["run_id"]: row for row in rows}


@pytest.fixture
def long_history(tmp_path) -> Path:
    """Round 2's real rows (runs of ours and LMDeploy imports) repeated under new run ids, appended by the History's
    own import, as ROWS runs would have accumulated."""
    root = tmp_path / "results"
    shutil.copytree(ROUND2, root)
    header, rows = csvstore.read_table(root / "history.csv")
    more = [{**row, "run_id": f"{row['run_id']}-{n:03d}"} for n in range(ROWS // len(rows)) for row in rows]
    for number, row in enumerate(more):
        row["label"] = f"{row['label']} #{number}"  # a label no other row has
    History(root).import_csv(csvstore.table_bytes(header, more), "more.csv")
    return root


@pytest.mark.slow
def test_a_row_read_by_id_is_the_row_of_the_full_table(long_history):
    history = History(long_history)
    everything = fresh_rows(long_history)
    assert len(everything) >= ROWS
    history.load()
    for run_id in [*list(everything)[:3], *list(everything)[-3:], list(everything)[len(everything) // 2]]:
        assert history.row(run_id) == everything[run_id]
        one = csvstore.table_bytes(list(next(iter(everything.values()))), [everything[run_id]])
        assert history.to_csv_bytes([run_id]) == one
    assert history.row("20990101-000000-none") is None
    pd.testing.assert_frame_equal(history.load(), History(long_history).load())


def test_what_a_caller_changes_in_a_row_or_the_table_is_not_read_back(long_history):
    history = History(long_history)
    run_id = next(iter(fresh_rows(long_history)))
    history.row(run_id)["label"] = "changed by a caller"
    frame = history.load()
    frame.loc[0, "label"] = "changed by a caller"
    frame["output_throughput"] = 0.0
    assert history.row(run_id)["label"] != "changed by a caller"
    again = history.load()
    assert again.loc[0, "label"] != "changed by a caller" and (again["output_throughput"] > 0).any()


def _append_in_another_process(root: Path, run_id: str) -> None:
    script = (
        "import sys; from bench_core import csvstore; from pathlib import Path\n"
        "path = Path(sys.argv[1]) / 'history.csv'\n"
        "header, rows = csvstore.read_table(path)\n"
        "csvstore.append_row(path, {**rows[0], 'run_id': sys.argv[2], 'label': 'from another process'})\n"
    )
    subprocess.run([sys.executable, "-c", script, str(root), run_id], cwd=ROOT, check=True)


def _edit_in_place(root: Path, old: bytes, new: bytes) -> None:
    """Overwrite bytes where they are, the size unchanged, and put the modification time back as it was: what a
    careful editor or a second write in one clock tick leaves."""
    path = root / "history.csv"
    before = os.stat(path)
    data = path.read_bytes()
    assert len(old) == len(new) and data.count(old) == 1
    with open(path, "r+b") as f:
        f.seek(data.index(old))
        f.write(new)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert os.stat(path).st_size == before.st_size


def _relabelled(label: str) -> str:
    """Another label of the same length."""
    return label[:-1] + ("X" if label[-1] != "X" else "Y")


def _replace_by_editor(root: Path, old: bytes, new: bytes) -> None:
    """Save a copy with the change and rename it over the file, as editors do: same size, a new inode."""
    path = root / "history.csv"
    copy = root / "history.csv.edited"
    copy.write_bytes(path.read_bytes().replace(old, new))
    os.replace(copy, path)


@pytest.mark.slow
@pytest.mark.parametrize(
    "change",
    [
        "appended by another process",
        "edited in place",
        "replaced by an editor",
        "deleted by another History",
        "cut back to fewer rows",
    ],
)
def test_every_change_to_the_file_is_seen_at_the_next_read(long_history, change):
    history = History(long_history)
    ids = list(history.load()["run_id"])
    edited, last = ids[len(ids) // 2], ids[-1]
    label = history.row(edited)["label"]  # "... #n": one row has it
    if change == "appended by another process":
        _append_in_another_process(long_history, "20261202-000000-beef")
    elif change == "edited in place":
        _edit_in_place(long_history, f",{label},".encode(), f",{_relabelled(label)},".encode())
    elif change == "replaced by an editor":
        _replace_by_editor(long_history, f",{label},".encode(), f",{_relabelled(label)},".encode())
    elif change == "deleted by another History":
        assert History(long_history).delete([last]) == 1
    else:
        path = long_history / "history.csv"
        data = path.read_bytes()
        path.write_bytes(data[: data.rindex(b"\n", 0, len(data) - 1) + 1])

    now = fresh_rows(long_history)
    assert list(history.load()["run_id"]) == list(now)
    pd.testing.assert_frame_equal(history.load(), History(long_history).load())
    for run_id in (edited, last, "20261202-000000-beef"):
        assert history.row(run_id) == now.get(run_id)
    expected = _relabelled(label) if change in ("edited in place", "replaced by an editor") else label
    assert history.row(edited)["label"] == expected
    assert (history.row("20261202-000000-beef") is not None) == (change == "appended by another process")
    assert (history.row(last) is None) == (change in ("deleted by another History", "cut back to fewer rows"))


@pytest.mark.slow
def test_a_damaged_row_written_after_a_read_is_still_moved_aside(long_history):
    history = History(long_history)
    rows = len(history.load())
    path = long_history / "history.csv"
    with open(path, "ab") as f:
        f.write(b"20261202-000000-cut,finished,half a row")  # a crash in the middle of a write by hand
    assert len(history.load()) == rows
    assert b"half a row" in (long_history / QUARANTINE_FILE).read_bytes()
    assert b"half a row" not in path.read_bytes()
    (notice,) = history.take_notices()
    assert "1 damaged row(s)" in notice and str(long_history / QUARANTINE_FILE) in notice


@pytest.mark.slow
def test_a_new_process_trusts_the_sidecar_only_for_the_bytes_it_describes(long_history):
    """Each CLI run starts where the last write left the sidecar: after rows appended since, it parses only those;
    after any other change, the file again."""
    path = long_history / "history.csv"
    sidecar = read_sidecar(long_history / SIDECAR_FILE)  # written by the import that made the history
    assert sidecar is not None and sidecar.size == path.stat().st_size
    assert sidecar.run_ids == list(fresh_rows(long_history))

    _append_in_another_process(long_history, "20261202-000000-beef")
    grown = sidecar.grown(path.read_bytes(), lambda row: True)
    assert grown is not None and grown.run_ids == list(fresh_rows(long_history))

    label = History(long_history).row(sidecar.run_ids[-1])["label"]
    _edit_in_place(long_history, f",{label},".encode(), f",{_relabelled(label)},".encode())
    assert sidecar.grown(path.read_bytes(), lambda row: True) is None

    with open(path, "ab") as f:
        f.write(b"20261202-000000-cut,finished,half a row")
    history = History(long_history)
    history.tidy()
    assert any("1 damaged row(s)" in notice for notice in history.take_notices())
    assert len(History(long_history).load()) == len(fresh_rows(long_history))


@pytest.mark.parametrize(
    "data",
    [
        b"a,b,c\r\n1,2,3\r\n4,5,6\r\n",
        b'\xef\xbb\xbfa,b,c\n1,"two\nlines",3\n',  # a byte-order mark, a quoted line break
        b"a,b,c\r1,'=SUM(A1),3\r",  # CR line ends, a formula made safe by a quote
        'a,b,c\n\n1,\u00e9t\u00e9,"x,y"\n'.encode(),  # a blank line, UTF-8, a quoted comma
    ],
)
def test_the_one_pass_read_gives_the_rows_of_the_line_by_line_read(data):
    assert csvstore._whole_table(data).rows == csvstore.split_table(data).rows


@pytest.mark.parametrize(
    "data",
    [
        b"a,b,c\n1,2,3\n4,5",  # the last row cut short
        b"a,b,c\n1,2\n4,5,6\n",  # a row with a cell missing
        b"a,b,c\n1,\xff,3\n",  # not UTF-8
        b'a,b,c\n1,"2,3\n',  # an unterminated quote
    ],
)
def test_the_one_pass_read_leaves_any_damaged_file_to_the_line_by_line_read(data):
    assert csvstore._whole_table(data) is None
    assert csvstore.split_table(data).damaged


@pytest.mark.slow
def test_the_table_after_appended_rows_is_the_table_of_the_whole_file(long_history):
    """Each kind of row (a run of ours, a server run, an LMDeploy import), appended after the table was read, leaves
    the table as a fresh read of the whole file types it: columns left empty by one kind keep their type."""
    history = History(long_history)
    history.load()
    _, rows = csvstore.read_table(ROUND2 / "history.csv")
    for number, row in enumerate(rows):
        csvstore.append_row(long_history / "history.csv", {**row, "run_id": f"20261202-0000{number:02d}-feed"})
        pd.testing.assert_frame_equal(history.load(), History(long_history).load())
    # A cell that is not a number, in a column of numbers (an edit by hand): the whole table is typed again.
    csvstore.append_row(long_history / "history.csv", {**rows[0], "run_id": "20261202-000100-feed", "seed": "x"})
    pd.testing.assert_frame_equal(history.load(), History(long_history).load())
