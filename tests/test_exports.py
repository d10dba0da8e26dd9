"""The export registry (bench_core/exports): the built-in exports, a module in a folder that $BENCH_STUDIO_PLUGINS
names registering one more, and the CLI's --export offering each, refusing what a command cannot write in one
line before anything runs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from toy_plugins import TOY_EXPORT

from bench_core.cli import main
from bench_core.errors import ConfigError
from bench_core.exports import RunSubject, Scope, describe_kinds, exports
from bench_core.plugins import PLUGINS_ENV
from bench_core.store.history import History

LMDEPLOY_CSV = Path(__file__).resolve().parent / "data" / "lmdeploy_csv" / "profile_throughput.csv"

ROOT = Path(__file__).resolve().parent.parent
BUILT_IN = ["history-rows", "requests", "lmdeploy-csv", "report"]


def help_text(capsys, *command: str) -> str:
    with pytest.raises(SystemExit) as exited:
        main([*command, "--help"])
    assert exited.value.code == 0
    # argparse wraps lines where it likes, after a word's hyphen too
    return re.sub(r"(?<=[a-z]-) ", "", " ".join(capsys.readouterr().out.split()))


def test_the_built_in_exports_and_the_scopes_they_cover():
    assert list(exports()) == BUILT_IN
    assert list(exports(Scope.RUN)) == BUILT_IN
    assert list(exports(Scope.COMPARISON)) == list(exports(Scope.SWEEP)) == ["history-rows", "report"]
    assert exports(Scope.TUNE) == {}


def test_a_module_in_the_plugin_folder_registers_its_export_first_by_its_order(toy_export):
    assert list(exports()) == ["run-ids", *BUILT_IN]
    assert all("run-ids" in exports(scope) for scope in Scope)
    assert "run-ids (run, comparison, sweep, tune)" in describe_kinds()


def test_the_plugin_export_is_offered_by_the_run_sweep_and_compare_commands_help(toy_export, capsys):
    for command in (
        ["pipeline"],
        ["throughput"],
        ["restful"],
        ["sweep"],
        ["sweep", "pipeline"],
        ["compare"],
        ["tune"],
        ["tune", "restful"],
    ):
        text = help_text(capsys, *command)
        assert "--export KIND[:PATH]" in text and "run-ids (run, comparison, sweep, tune)" in text, command


def test_without_the_plugin_folder_the_help_offers_only_the_built_in_exports(capsys):
    text = help_text(capsys, "pipeline")
    assert "report (run, comparison, sweep)" in text and "run-ids" not in text


def test_an_unknown_kind_is_one_line_naming_the_registered_ones(toy_export, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["pipeline", "builtin:sample", "builtin:tiny-llama", "--export", "parquet:out.parquet"])
    assert exited.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "unknown export 'parquet'; choose one of run-ids, history-rows, requests, lmdeploy-csv, report" in line


def test_an_export_the_command_cannot_end_with_is_refused_before_anything_runs(tmp_path, capsys):
    code = main(
        [
            *("sweep", "pipeline", "builtin:sample", "builtin:tiny-llama", "--backend", "transformers"),
            *("--sweep", "concurrency=1,2", "--results", str(tmp_path / "results"), "--export", "requests"),
        ]
    )
    assert code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == "error: --export requests: it is of run; this command ends with sweep."
    assert not (tmp_path / "results").exists()


def test_an_export_into_a_folder_that_is_not_there_is_refused_before_anything_runs(tmp_path, capsys):
    code = main(
        [
            *("pipeline", "builtin:sample", "builtin:tiny-llama", "--backend", "transformers"),
            *("--results", str(tmp_path / "results"), "--export", "report:no/such/out.html"),
        ]
    )
    assert code == 2
    assert capsys.readouterr().err == "error: --export report:no/such/out.html: the folder no/such does not exist.\n"
    assert not (tmp_path / "results").exists()
    assert main([*("restful", "--export", f"requests:{tmp_path}"), *("--results", str(tmp_path / "results"))]) == 2
    assert capsys.readouterr().err == (
        f"error: --export requests:{tmp_path}: that is a folder; give a file name, e.g. {tmp_path / 'run-requests.csv'}.\n"
    )


def test_a_plugin_that_does_not_import_is_one_line_naming_its_file(tmp_path, monkeypatch, capsys):
    (tmp_path / "broken_export.py").write_text("import no_such_module_anywhere\n")
    monkeypatch.setenv(PLUGINS_ENV, str(tmp_path))
    assert main(["pipeline", "--help"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: {PLUGINS_ENV}: {tmp_path / 'broken_export.py'} could not be imported: ")
    assert "No module named 'no_such_module_anywhere'" in line


def test_a_kind_the_flag_could_not_name_is_refused_when_its_module_is_imported(tmp_path, monkeypatch):
    (tmp_path / "colon_export.py").write_text(TOY_EXPORT.replace('"run-ids"', '"run:ids"'))
    monkeypatch.setenv(PLUGINS_ENV, str(tmp_path))
    with pytest.raises(ConfigError, match="an export's kind is lower case letters, digits and hyphens, not 'run:ids'"):
        exports()


def test_two_exports_of_one_kind_are_refused(toy_export):
    (toy_export / "again_export.py").write_text((toy_export / "run_ids_export.py").read_text())
    with pytest.raises(ConfigError, match="Two exports are named 'run-ids'"):
        exports()


@pytest.mark.slow
def test_a_run_writes_the_plugin_export_its_builder_makes_beside_the_built_in_ones(toy_export, tmp_path):
    """A real run of the tiny model, its exports named on the command line: the toy's file under its own name,
    the LMDeploy row byte for byte the row --csv appended, the report where --report put it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "bench_core", "pipeline", "builtin:sample", "builtin:tiny-llama"),
            *("--backend", "transformers", "-n", "4", "-c", "2", "--sharegpt-output-len", "8", "--stream-output"),
            *("--csv", "lmdeploy.csv", "--results", "results", "--report", "out.html"),
            *("--export", "run-ids", "--export", "lmdeploy-csv:row.csv", "--export", "requests"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    (run_id,) = History(tmp_path / "results").load()["run_id"].astype(str)
    assert (tmp_path / f"run-{run_id}-ids.txt").read_bytes() == f"{run_id}\n".encode()
    assert (tmp_path / "row.csv").read_bytes() == (tmp_path / "lmdeploy.csv").read_bytes()
    assert len((tmp_path / f"run-{run_id}-requests.csv").read_text().splitlines()) == 5  # the header, 4 requests
    assert f"<h1>Run {run_id}</h1>" in (tmp_path / "out.html").read_text(encoding="utf-8")
    said = [line.split(" (")[0] for line in proc.stderr.splitlines() if line.startswith(tuple(exports()))]
    assert said == [
        f"run-ids: run-{run_id}-ids.txt",
        "lmdeploy-csv: row.csv",
        f"requests: run-{run_id}-requests.csv",
    ] + ["report: out.html"]


def test_a_runs_history_rows_are_offered_only_when_the_history_holds_its_row(tmp_path):
    history = History(tmp_path / "results")
    imported = history.import_csv(LMDEPLOY_CSV.read_bytes(), "lmdeploy.csv")[0]
    rows = exports(Scope.RUN)["history-rows"]

    def subject(run_id: str) -> RunSubject:
        return RunSubject(history, run_id, None, {}, lambda: None)

    assert rows.offers(subject(imported))
    assert not rows.offers(subject("20260101-000000-gone"))  # a run its history failed to save: no empty file
    assert all(
        export.offers(subject("20260101-000000-gone")) for kind, export in exports().items() if kind != "history-rows"
    )
