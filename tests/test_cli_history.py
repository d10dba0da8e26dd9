"""`python -m bench_core history list|show|export|import|reindex|delete`, run for real on a copy of a real history
(tests/data/history_round2: six runs of ours, two of them a sweep, and two rows imported from LMDeploy's CSV): what
each action prints, writes and refuses, with its exit code; and the pure functions that format the runs."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bench_core.cli import main
from bench_core.cli.history import ACTIONS, LIST_COLUMNS
from bench_core.store.history import History
from bench_core.store.history_import import HISTORY_LEAD_COLUMNS
from bench_core.views.history_text import csv_text, fixed_width_table, markdown_table, plain_value

ROOT = Path(__file__).resolve().parent.parent
ROUND2 = ROOT / "tests" / "data" / "history_round2"
LMDEPLOY_CSV = ROOT / "tests" / "data" / "lmdeploy_csv"
OURS = [
    "20261201-104433-ef6e",  # streamed ShareGPT, label "streamed"
    "20261201-104445-af89",  # random dataset, batch, not streamed: no TTFT
    "20261201-104454-79d7",  # the sweep's first point, label "concurrency=1"
    "20261201-104500-d240",  # its second, label "concurrency=2"
    "20261201-104502-f29e",  # synthetic:tiny
    "20261201-104518-65cb",  # restful against the scripted server: backend openai
]
IMPORTED = ["20261201-104528-5c4a", "20261201-104528-bd67"]  # LMDeploy's rows: no start time
EVERY_RUN = [*OURS, *IMPORTED]
SWEEP = "sweep-20261201-104454-4bc5"


@pytest.fixture
def results(tmp_path) -> str:
    """A copy of round 2's history, as the folder --results names."""
    root = tmp_path / "results"
    shutil.copytree(ROUND2, root)
    return str(root)


def history(capsys, *args: str) -> tuple[int, str, str]:
    """`python -m bench_core history ARGS` in this process: its exit code, stdout and stderr. A parser error
    leaves through SystemExit, as it leaves the process."""
    try:
        code = main(["history", *args])
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def listed_ids(capsys, results: str, *filters: str) -> list[str]:
    code, out, err = history(capsys, "list", "--results", results, "--format", "csv", "--columns", "run_id", *filters)
    assert code == 0, err
    return out.splitlines()[1:]


def error_line(err: str) -> str:
    """The one line of stderr that says what was wrong (a history opened for the first time adds a warning that it
    built its index)."""
    lines = [line for line in err.splitlines() if not line.startswith("warning: ")]
    assert len(lines) == 1, err
    return lines[0]


def history_cli(*args: str, env: dict[str, str] | None = None, stdin=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bench_core", "history", *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        stdin=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )


class Terminal(io.StringIO):
    """A stdin that is a terminal, on which the user types `text`."""

    def isatty(self) -> bool:
        return True


# ---- list -----------------------------------------------------------------------------------------------------


def test_list_shows_a_table_of_every_run_in_the_historys_order_with_the_default_columns(capsys, results):
    code, out, _ = history(capsys, "list", "--results", results)
    assert code == 0
    header, *lines = out.splitlines()
    assert header.split() == list(LIST_COLUMNS)
    assert [line.split()[0] for line in lines] == EVERY_RUN  # recorded, then imported: the newest last
    # Numbers as every table shows them (3 decimals, thousands separated), right-aligned under their header;
    # a metric the run did not measure is a dash.
    assert lines[0].split() == [
        OURS[0],
        "2026-12-01T10:44:33+00:00",
        "finished",
        "streamed",
        "builtin:tiny-llama",
        "transformers",
        "273.514",
        "832.778",
        "5.526",
    ]
    assert lines[6].split()[-3:] == ["4,344.551", "3,304.118", "89.020"]
    assert lines[1].split()[-2] == "-"
    end = header.index("output_throughput") + len("output_throughput")
    assert all(line[:end].endswith(line.split()[-3]) for line in lines)


def test_list_csv_holds_every_value_as_recorded(capsys, results):
    code, out, _ = history(capsys, "list", "--results", results, "--format", "csv")
    assert code == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [row["run_id"] for row in rows] == EVERY_RUN and list(rows[0]) == list(LIST_COLUMNS)
    recorded = History(results)
    for row in rows:
        written = recorded.row(row["run_id"])
        for name in ("status", "label", "model", "backend", "started_at"):
            assert row[name] == written[name]
        for name in ("output_throughput", "mean_ttft_ms", "mean_tpot_ms"):
            if written[name] in ("", "-", "nan"):  # not measured, in the words of LMDeploy and of older runs
                assert row[name] == ""
            else:
                assert float(row[name]) == float(written[name])


def test_list_json_is_one_object_per_run_numbers_as_numbers_and_missing_as_null(capsys, results):
    code, out, _ = history(
        capsys, "list", "--results", results, "--format", "json", "--columns", "run_id,num_prompts,mean_ttft_ms,label"
    )
    assert code == 0
    runs = json.loads(out)
    assert [run["run_id"] for run in runs] == EVERY_RUN
    by_id = {run["run_id"]: run for run in runs}
    assert by_id["20261201-104445-af89"] == {
        "run_id": "20261201-104445-af89",
        "num_prompts": 3,  # a whole number, though the column's missing cells load it as floats
        "mean_ttft_ms": None,  # not streamed: no TTFT
        "label": "",
    }
    assert by_id["20261201-104433-ef6e"]["mean_ttft_ms"] == pytest.approx(832.7778982500433)


def test_list_markdown_is_a_table_to_paste(capsys, results):
    code, out, _ = history(capsys, "list", "--results", results, "--format", "markdown", "--last", "1")
    assert code == 0
    header, rule, row = out.splitlines()
    assert header == "| " + " | ".join(LIST_COLUMNS) + " |"
    assert rule == "| --- | --- | --- | --- | --- | --- | ---: | ---: | ---: |"
    assert row.startswith(f"| {IMPORTED[-1]} |  | imported |") and row.endswith("| 3,139.211 | 128.982 | 28.311 |")


def test_columns_choose_what_list_shows_in_their_order(capsys, results):
    code, out, _ = history(
        capsys, "list", "--results", results, "--columns", "concurrency, run_id,concurrency", "--last", "2"
    )
    assert code == 0
    assert out.splitlines()[0].split() == ["concurrency", "run_id"]  # each once


@pytest.mark.parametrize(
    "filters, expected",
    [
        (["--status", "imported"], IMPORTED),
        (["--status", "finished", "--status", "imported"], EVERY_RUN),
        (["--model", "TINY"], OURS[:5]),  # a part of the name, in any case: builtin:tiny-llama and synthetic:tiny
        (["--label", "Concurrency="], OURS[2:4]),
        (["--backend", "openai"], OURS[5:]),
        (["--backend", "openai", "--backend", "lmdeploy"], [*OURS[5:], *IMPORTED]),
        (["--sweep", SWEEP], OURS[2:4]),
        (["--since", "2026-12-01T10:45:00+00:00"], OURS[3:]),  # at or after; imports have no start time
        (["--until", "2026-12-01T10:44:54+00:00"], OURS[:3]),  # at or before
        (["--since", "2026-12-01T11:44:45+01:00", "--until", "2026-12-01T10:45:00Z"], OURS[1:4]),
        (["--last", "3"], [OURS[5], *IMPORTED]),
        (["--model", "tiny", "--last", "2"], OURS[3:5]),  # the newest of those the other filters choose
        (["--backend", "transformers", "--label", "concurrency=2"], OURS[3:4]),
        (["--status", "failed"], []),
    ],
)
def test_each_filter_chooses_the_runs_it_says(capsys, results, filters, expected):
    assert listed_ids(capsys, results, *filters) == expected


@pytest.fixture
def time_zone():
    """Set this process's time zone (a POSIX TZ string) for a test; put back after."""
    before = os.environ.get("TZ")

    def set_zone(zone: str) -> None:
        os.environ["TZ"] = zone
        time.tzset()

    yield set_zone
    if before is None:
        os.environ.pop("TZ", None)
    else:
        os.environ["TZ"] = before
    time.tzset()


def test_a_date_or_a_time_without_a_zone_is_this_machines_local_time(capsys, results, time_zone):
    time_zone("UTC0")
    assert listed_ids(capsys, results, "--since", "2026-12-01", "--until", "2026-12-01") == OURS
    assert listed_ids(capsys, results, "--since", "2026-12-02") == []
    assert listed_ids(capsys, results, "--until", "2026-11-30") == []
    assert listed_ids(capsys, results, "--since", "2026-12-01T10:45") == OURS[3:]
    time_zone("UTC-14")  # 14 hours ahead of UTC: the runs (10:44-10:45 UTC) started on 2 December there
    assert listed_ids(capsys, results, "--since", "2026-12-02") == OURS
    assert listed_ids(capsys, results, "--until", "2026-12-01") == []


def test_a_list_that_matches_nothing_says_so_and_succeeds(capsys, results):
    code, out, err = history(capsys, "list", "--results", results, "--status", "failed")
    assert (code, out) == (0, "")
    assert error_line(err) == f"No run in {results} matches the filters."
    code, out, _ = history(capsys, "list", "--results", results, "--status", "failed", "--format", "json")
    assert (code, json.loads(out)) == (0, [])


@pytest.mark.parametrize(
    "args, said",
    [
        (
            ["--columns", "run_id,mean_ttft,bogus"],
            "the history has no column 'mean_ttft' (did you mean mean_ttft_ms?), ",
        ),
        (["--since", "2026-13-01"], "argument --since: '2026-13-01' is neither a date (2026-12-01) nor an ISO time"),
        (["--until", "yesterday"], "argument --until: 'yesterday' is neither a date"),
        (["--last", "0"], "argument --last: '0' is not a number of runs (1 or more)"),
        (["--status", "done"], "argument --status: invalid choice: 'done'"),
        (["--format", "html"], "argument --format: invalid choice: 'html'"),
    ],
)
def test_bad_input_to_list_is_one_line_and_exit_code_2(capsys, results, args, said):
    code, out, err = history(capsys, "list", "--results", results, *args)
    assert (code, out) == (2, "")
    assert said in error_line(err)


def test_a_results_folder_that_is_not_there_is_refused_not_read_as_empty(capsys, tmp_path):
    missing = str(tmp_path / "typo")
    for action in (["list"], ["show", OURS[0]], ["export"], ["reindex"], ["delete", OURS[0], "--yes"]):
        code, out, err = history(capsys, *action, "--results", missing)
        assert (code, out) == (2, "")
        assert error_line(err) == f"error: there is no history in {missing}: no such folder " + (
            "(--results or $BENCH_STUDIO_RESULTS names it)"
        )
    assert not Path(missing).exists()


# ---- show -----------------------------------------------------------------------------------------------------


def test_show_prints_every_non_empty_cell_as_written(capsys, results):
    code, out, _ = history(capsys, "show", OURS[1], "--results", results)
    assert code == 0
    written = History(results).row(OURS[1])
    shown = dict(line.split(None, 1) for line in out.splitlines())
    assert shown == {name: cell for name, cell in written.items() if cell not in ("", "nan")}
    # Not streamed: its TTFT was written as "nan", not measured; it has no label.
    assert shown["dataset_name"] == "random" and written["mean_ttft_ms"] == "nan"
    assert "mean_ttft_ms" not in shown and "label" not in shown


def test_show_json_is_the_runs_loaded_cells_as_export_gives_them(capsys, results):
    code, out, _ = history(capsys, "show", IMPORTED[0], "--results", results, "--format", "json")
    assert code == 0
    shown = json.loads(out)
    assert shown["completed"] == 1000 and shown["output_throughput"] == pytest.approx(4344.5508121001)
    assert "mean_ttft_ms" in shown and "bs" not in shown  # a restful row: no batch size
    _, exported, _ = history(capsys, "export", IMPORTED[0], "--results", results, "--format", "json")
    assert json.loads(exported) == [shown]


def test_show_of_an_unknown_run_is_one_line_and_exit_code_2(capsys, results):
    code, out, err = history(capsys, "show", "20990101-000000-none", "--results", results)
    assert (code, out) == (2, "")
    assert error_line(err) == f"error: the history in {results} has no run 20990101-000000-none"


# ---- export ---------------------------------------------------------------------------------------------------


def read_csv(text: str) -> tuple[list[str], list[dict[str, str]]]:
    records = list(csv.reader(io.StringIO(text, newline="")))
    return records[0], [dict(zip(records[0], cells)) for cells in records[1:]]


def test_export_csv_is_the_history_file_with_lmdeploys_columns_first(capsys, results):
    code, out, _ = history(capsys, "export", "--results", results)
    assert code == 0
    header, rows = read_csv(out)
    assert header[: len(HISTORY_LEAD_COLUMNS)] == list(HISTORY_LEAD_COLUMNS)
    assert [row["run_id"] for row in rows] == EVERY_RUN
    recorded = History(results)
    assert all(row == {name: recorded.row(row["run_id"]).get(name, "") for name in header} for row in rows)


def test_export_chooses_runs_by_id_and_by_filter(capsys, results):
    _, out, _ = history(capsys, "export", OURS[5], IMPORTED[0], "--results", results)
    assert [row["run_id"] for row in read_csv(out)[1]] == [OURS[5], IMPORTED[0]]
    _, out, _ = history(capsys, "export", "--sweep", SWEEP, "--results", results)
    assert [row["run_id"] for row in read_csv(out)[1]] == OURS[2:4]
    _, out, _ = history(capsys, "export", *OURS, "--backend", "openai", "--results", results)  # both must hold
    assert [row["run_id"] for row in read_csv(out)[1]] == OURS[5:]


def test_an_exported_csv_imports_into_another_history_as_the_same_runs(capsys, results, tmp_path):
    exported = tmp_path / "sweep.csv"
    code, out, err = history(capsys, "export", "--sweep", SWEEP, "--results", results, "--output", str(exported))
    assert (code, out) == (0, "") and error_line(err) == f"Wrote 2 run(s) to {exported}."
    other = str(tmp_path / "other")
    code, out, _ = history(capsys, "import", str(exported), "--results", other)
    assert (code, out.splitlines()) == (0, OURS[2:4])
    assert History(other).row(OURS[2])["mean_ttft_ms"] == History(results).row(OURS[2])["mean_ttft_ms"]


def test_export_json_is_each_runs_non_empty_cells_or_the_columns_chosen(capsys, results):
    code, out, _ = history(capsys, "export", "--status", "imported", "--results", results, "--format", "json")
    assert code == 0
    runs = json.loads(out)
    assert [run["run_id"] for run in runs] == IMPORTED
    assert all(value is not None and value != "" for run in runs for value in run.values())
    assert runs[1]["request_rate"] == 16  # written "16.0": a whole number
    _, out, _ = history(
        capsys, "export", "--last", "1", "--results", results, "--format", "json", "--columns", "run_id,label"
    )
    assert json.loads(out) == [{"run_id": IMPORTED[1], "label": ""}]


def test_export_markdown_is_lists_table(capsys, results):
    _, exported, _ = history(capsys, "export", "--model", "synthetic", "--results", results, "--format", "markdown")
    _, listed, _ = history(capsys, "list", "--model", "synthetic", "--results", results, "--format", "markdown")
    assert exported == listed and exported.count("\n") == 3 and OURS[4] in exported


def test_export_replaces_its_output_file_whole(capsys, results, tmp_path):
    output = tmp_path / "runs.json"
    output.write_text("an older export\n")
    code, _, _ = history(capsys, "export", "--results", results, "--format", "json", "-o", str(output))
    assert code == 0
    assert [run["run_id"] for run in json.loads(output.read_text())] == EVERY_RUN
    assert sorted(path.name for path in tmp_path.iterdir()) == ["results", "runs.json"]  # no temporary file left
    assert output.stat().st_mode & 0o044  # readable by others, as any new file (the umask allowing)


def test_an_export_that_fails_while_writing_leaves_the_old_file_as_it_was(capsys, results, tmp_path, monkeypatch):
    output = tmp_path / "runs.csv"
    output.write_text("an older export\n")

    sync = os.fsync

    def disk_full_for_the_export(descriptor):
        if os.readlink(f"/proc/self/fd/{descriptor}").startswith(str(tmp_path / ".runs.csv.")):
            raise OSError(28, "No space left on device")
        sync(descriptor)  # the history's own files

    monkeypatch.setattr(os, "fsync", disk_full_for_the_export)
    code, out, err = history(capsys, "export", "--results", results, "-o", str(output))
    assert (code, out) == (2, "")
    assert error_line(err) == f"error: cannot write {output}: No space left on device"
    assert output.read_text() == "an older export\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["results", "runs.csv"]


@pytest.mark.parametrize(
    "args, said",
    [
        ([OURS[0], "20990101-000000-none"], "has no run 20990101-000000-none"),
        (["--columns", "run_id"], "error: --columns is for json and markdown: csv holds history.csv's columns"),
        (["--format", "markdown", "--columns", "p99_ttft"], "the history has no column 'p99_ttft' (did you mean"),
        (["-o", "/nonexistent-folder/runs.csv"], "error: cannot write /nonexistent-folder/runs.csv: No such file"),
    ],
)
def test_bad_input_to_export_is_one_line_exit_code_2_and_no_file(capsys, results, tmp_path, args, said):
    output = tmp_path / "out.csv"
    with_output = args if "-o" in args else [*args, "-o", str(output)]
    code, out, err = history(capsys, "export", "--results", results, *with_output)
    assert (code, out) == (2, "")
    assert said in error_line(err)
    assert not output.exists()


# ---- import ---------------------------------------------------------------------------------------------------


def test_import_adds_lmdeploys_rows_and_prints_their_new_ids(capsys, results):
    code, out, err = history(capsys, "import", str(LMDEPLOY_CSV / "profile_throughput.csv"), "--results", results)
    assert code == 0
    new_ids = out.splitlines()
    assert len(new_ids) == 2 and not set(new_ids) & set(EVERY_RUN)
    assert error_line(err) == f"{LMDEPLOY_CSV / 'profile_throughput.csv'}: imported 2 run(s)"
    assert listed_ids(capsys, results, "--status", "imported") == [*IMPORTED, *new_ids]
    assert listed_ids(capsys, results, "--backend", "turbomind") == new_ids


def test_importing_a_history_twice_adds_its_runs_once(capsys, results, tmp_path):
    other = str(tmp_path / "other")
    history_file = str(Path(results) / "history.csv")
    code, out, _ = history(capsys, "import", history_file, "--results", other)
    assert (code, out.splitlines()) == (0, EVERY_RUN)
    code, out, err = history(capsys, "import", history_file, "--results", other)
    assert (code, out) == (0, "")
    assert error_line(err) == f"{history_file}: nothing new: its runs are already in the history"


@pytest.mark.parametrize(
    "bad, said",
    [
        ("misaligned_profile_pipeline_api.csv", "error: Line 3 of misaligned_profile_pipeline_api.csv has 19 cells"),
        ("no_such_file.csv", "error: Cannot read "),
    ],
)
def test_a_bad_file_imports_nothing_not_even_the_good_files_before_it(capsys, results, bad, said):
    before = History(results).to_csv_bytes()
    good = str(LMDEPLOY_CSV / "profile_pipeline_api.csv")
    code, out, err = history(capsys, "import", good, str(LMDEPLOY_CSV / bad), "--results", results)
    assert (code, out) == (2, "")
    assert error_line(err).startswith(said)
    assert listed_ids(capsys, results) == EVERY_RUN
    assert History(results).to_csv_bytes() == before


# ---- reindex --------------------------------------------------------------------------------------------------


def test_reindex_rebuilds_the_index_and_says_how_many_runs_it_holds(capsys, results):
    # Needs History.reindex (the history's SQLite index): fails with AttributeError on a History without it.
    code, out, _ = history(capsys, "reindex", "--results", results)
    assert (code, out) == (0, f"{len(EVERY_RUN)} run(s) indexed in {results}.\n")
    assert listed_ids(capsys, results) == EVERY_RUN


# ---- delete ---------------------------------------------------------------------------------------------------


def test_delete_with_yes_removes_the_runs_rows_and_folders(capsys, results):
    code, out, err = history(capsys, "delete", OURS[0], OURS[5], "--yes", "--results", results)
    assert (code, out.splitlines()) == (0, [OURS[0], OURS[5]])
    assert error_line(err) == f"Deleted 2 run(s) from {results}."
    assert listed_ids(capsys, results) == [*OURS[1:5], *IMPORTED]
    assert not (Path(results) / "runs" / OURS[0]).exists() and (Path(results) / "runs" / OURS[1]).exists()


def test_delete_asks_on_a_terminal_and_deletes_only_on_yes(capsys, results, monkeypatch):
    monkeypatch.setattr(sys, "stdin", Terminal("n\n"))
    code, out, err = history(capsys, "delete", OURS[0], "--results", results)
    assert (code, out) == (0, "")
    assert OURS[0] in err and f"Delete these 1 run(s) and their folders from {results}? [y/N] " in err
    assert err.endswith("Nothing deleted.\n")
    assert listed_ids(capsys, results) == EVERY_RUN
    monkeypatch.setattr(sys, "stdin", Terminal("y\n"))
    code, out, _ = history(capsys, "delete", OURS[0], "--results", results)
    assert (code, out) == (0, f"{OURS[0]}\n")
    assert listed_ids(capsys, results) == EVERY_RUN[1:]


def test_delete_by_filter_takes_the_runs_that_match_with_yes(capsys, results):
    code, out, _ = history(capsys, "delete", "--status", "imported", "--yes", "--results", results)
    assert (code, out.splitlines()) == (0, IMPORTED)
    assert listed_ids(capsys, results) == OURS


@pytest.mark.parametrize(
    "args, said",
    [
        ([OURS[0]], "error: delete asks first, and stdin is not a terminal: add --yes to delete without asking"),
        ([OURS[0], "20990101-000000-none", "--yes"], "has no run 20990101-000000-none"),
        (["--sweep", SWEEP], "error: runs chosen by filters are deleted only with --yes"),
        (["--yes"], "error: name the runs to delete (RUN_ID ...), or choose them with filters and --yes"),
    ],
)
def test_a_delete_not_confirmed_or_of_an_unknown_run_deletes_nothing(capsys, results, monkeypatch, args, said):
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))  # not a terminal: what it holds is never read as a yes
    code, out, err = history(capsys, "delete", *args, "--results", results)
    assert (code, out) == (2, "")
    assert said in error_line(err)
    assert listed_ids(capsys, results) == EVERY_RUN
    assert all((Path(results) / "runs" / run_id).is_dir() for run_id in OURS)  # every run folder still there


# ---- as a user runs it ----------------------------------------------------------------------------------------


def test_the_command_line_lists_the_history_that_bench_studio_results_names(results):
    answer = history_cli("list", "--format", "csv", "--columns", "run_id,status", env={"BENCH_STUDIO_RESULTS": results})
    assert answer.returncode == 0, answer.stderr
    assert answer.stdout.splitlines() == ["run_id,status", *(f"{run_id},finished" for run_id in OURS)] + [
        f"{run_id},imported" for run_id in IMPORTED
    ]


def test_the_command_line_refuses_a_delete_from_a_pipe_without_yes(results):
    answer = history_cli("delete", OURS[0], "--results", results, stdin=subprocess.DEVNULL)
    assert (answer.returncode, answer.stdout) == (2, "")
    assert error_line(answer.stderr).startswith("error: delete asks first, and stdin is not a terminal")
    assert History(results).row(OURS[0]) is not None


def test_bench_studio_runs_the_same_history_command(results):
    args = ["history", "list", "--results", results, "--sweep", SWEEP]
    installed = subprocess.run(
        [sys.executable, "-c", "from bench_studio.command import main; main()", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert installed.returncode == 0, installed.stderr
    assert [line.split()[0] for line in installed.stdout.splitlines()[1:]] == OURS[2:4]


def test_every_action_says_its_exit_codes_and_is_in_the_cli_reference(capsys):
    reference = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    for action in ACTIONS:
        code, out, _ = history(capsys, action.name, "--help")
        assert code == 0 and "exit codes:" in out and "2    bad input" in out
        assert f"history {action.name}" in reference


# ---- the text, as pure functions --------------------------------------------------------------------------------


def test_the_fixed_width_table_aligns_numbers_right_and_text_left():
    table = pd.DataFrame({"name": ["a", "longer"], "value": [1.5, 1234.0], "flag": pd.array([True, None])})
    assert fixed_width_table(table) == "name    value  flag\na       1.500  True\nlonger  1,234  -\n"


def test_a_markdown_cell_keeps_its_pipes_and_newlines_from_breaking_the_table():
    table = pd.DataFrame({"label": ["a|b", "two\nlines"], "n": [1, 2]})
    assert markdown_table(table) == "| label | n |\n| --- | ---: |\n| a\\|b | 1 |\n| two lines | 2 |\n"


def test_csv_text_leaves_a_missing_value_empty_and_a_whole_number_without_decimals():
    table = pd.DataFrame({"run_id": ["x", "y"], "bs": [8.0, math.nan], "rate": [math.inf, 0.25]})
    assert csv_text(table) == "run_id,bs,rate\nx,8,inf\ny,,0.25\n"


@pytest.mark.parametrize(
    "cell, plain",
    [
        (math.nan, None),
        (pd.NA, None),
        (np.float64(8.0), 8),
        (np.int64(3), 3),
        (0.1, 0.1),
        (math.inf, "inf"),  # LMDeploy's word for "nothing succeeded"; JSON has no infinity
        (-math.inf, "-inf"),
        (np.bool_(True), True),
        ("text", "text"),
    ],
)
def test_plain_value_is_what_json_can_hold(cell, plain):
    assert plain_value(cell) == plain and type(plain_value(cell)) is type(plain)
