"""The run history: rows in LMDeploy's column order, safe concurrent writes, run folders, imports."""

from __future__ import annotations

import csv
import importlib.metadata
import io
import json
import math
import multiprocessing
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest
from profiled_runs import profiled_run, recorded_history

from bench_core import csvstore
from bench_core.config import EngineConfig, LoadConfig, RunConfig
from bench_core.engines.base import EngineInfo
from bench_core.errors import HistoryError
from bench_core.hardware import environment
from bench_core.measure.catalog import LEGACY_COLUMNS
from bench_core.store.history import History, RunRecord, local_now_iso, new_run_id
from bench_core.store.history_import import HISTORY_LEAD_COLUMNS, SAVE_CSV_COLUMNS, lmdeploy_hyperparams

ROOT = Path(__file__).resolve().parent.parent
LMDEPLOY_CSV = Path(__file__).resolve().parent / "data" / "lmdeploy_csv"


def _config(label: str = "baseline") -> RunConfig:
    return RunConfig(
        engine=EngineConfig(backend="transformers", model="builtin:tiny-llama", dtype="float32"),
        load=LoadConfig(load_pattern="batch", concurrency=4, stream_output=True),
        label=label,
    )


def _lmdeploy_row(tmp_path: Path, config: RunConfig, stream_output: bool) -> dict[str, str]:
    """The row LMDeploy's own Profiler.save_csv writes for three short sessions."""
    from lmdeploy.profiler import Profiler, Session

    profiler = Profiler(stream_output, [50, 75, 95, 99])
    sessions = [profiler.new_session(10 + i, 4) for i in range(3)]
    profiler.start()
    for session in sessions:
        session.tick(0)
    for n_tokens in range(1, 5) if stream_output else (4,):
        time.sleep(0.002)  # LMDeploy's Profiler reads the clock itself; keep its ms columns above 0.000
        for session in sessions:
            session.tick(n_tokens)
    for session in sessions:
        session.finish(Session.SUCCESS)
    profiler.finish()
    profiler.compute_metrics()
    path = tmp_path / f"lmdeploy-{stream_output}.csv"
    profiler.save_csv(str(path), lmdeploy_hyperparams(config))
    return csvstore.read_table(path)[1][-1]


def _requests_table() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "index": [0, 1],
            "input_len": [10, 11],
            "req_output_len": [4, 4],
            "output_len": [4, 2],
            "status": ["success", "incomplete"],
            "reason": ["", "stopped early"],
            "ttft_s": [0.01, 0.02],
            "tpot_s": [0.005, 0.007],
            "e2e_s": [0.025, 0.027],
            "itl_s": [[0.005, 0.004, 0.006], [0.007]],
            "n_ticks": [5, 3],
            "start_s": [0.0, 0.0],
            "finish_s": [0.025, 0.027],
        }
    )


def _record(config: RunConfig | None = None, lmdeploy_columns=None, **fields) -> RunRecord:
    config = config or _config()
    values = dict(
        run_id=new_run_id(),
        started_at=local_now_iso(),
        status="finished",
        config=config,
        lmdeploy_columns=lmdeploy_columns or {},
        metrics={
            "completed": 1,
            "failed": 0,
            "incomplete": 1,
            "p99_ttft_ms": 19.9,
            "goodput_rps": 1.5,
            "failure_reasons": {"stopped early": 1},
        },
        engine_info=EngineInfo(
            "transformers",
            "builtin:tiny-llama",
            "/models/tiny",
            "float32",
            "cpu",
            versions={"transformers": "5.24.0"},
            notes=["paged attention"],
        ),
        environment={"gpu_name": "none", "gpu_count": "0", "cuda": "12.10", "torch": "2.13.0"},
        requests=_requests_table(),
    )
    values.update(fields)
    return RunRecord(**values)


@pytest.fixture
def history(tmp_path) -> History:
    return History(tmp_path / "results")


def test_row_starts_with_lmdeploys_columns_in_one_spelling_as_full_floats(tmp_path):
    history, _ = recorded_history(tmp_path / "results", [("run-a", "transformers", 4, profiled_run([0.05, 0.1]))])

    header, (row,) = csvstore.read_table(history.csv_path)
    assert tuple(header[: len(HISTORY_LEAD_COLUMNS)]) == HISTORY_LEAD_COLUMNS
    assert HISTORY_LEAD_COLUMNS[8:12] == ("completed", "total_input_tokens", "total_output_tokens", "duration_s")
    assert not set(LEGACY_COLUMNS) & set(header)  # LMDeploy's duration, mean_e2e_latency_ms: only in its export
    summary = history.load().iloc[0]
    assert float(row["mean_ttft_ms"]) == summary["mean_ttft_ms"] and row["mean_ttft_ms"] != "75.000"  # full float


@pytest.mark.parametrize("stream", [True, False])
def test_lmdeploys_row_is_rebuilt_from_the_history_byte_for_byte(tmp_path, stream):
    prof = profiled_run([0.05, 0.1, 0.2], stream=stream)
    history, _ = recorded_history(tmp_path / "results", [("run-a", "pytorch", 4, prof)])
    config = history.config("run-a")

    ours, theirs = history.lmdeploy_row("run-a"), prof.lmdeploy_csv_row(lmdeploy_hyperparams(config))
    assert list(ours) == list(SAVE_CSV_COLUMNS)
    assert csvstore.table_bytes(list(ours), [ours]) == csvstore.table_bytes(list(theirs), [theirs])


def _old_format_history(path: Path) -> None:
    """A history.csv as the app wrote it while it kept LMDeploy's spellings beside ours: a run of ours (both
    spellings, LMDeploy's first with 3 decimals) and an imported LMDeploy row (LMDeploy's spelling only)."""
    header = [
        *SAVE_CSV_COLUMNS,
        "run_id",
        "started_at",
        "status",
        "label",
        "model",
        "source",
        "duration_s",
        "mean_e2e_ms",
        "p99_e2e_ms",
    ]
    ours = {
        "backend": "transformers",
        "bs": "4",
        "completed": "3",
        "duration": "2.5123456789",
        "request_throughput": "1.194",
        "mean_e2e_latency_ms": "101.235",
        "mean_ttft_ms": "50.000",
        "run_id": "20260101-000000-ab12",
        "status": "finished",
        "duration_s": "2.5123456789",
        "mean_e2e_ms": "101.23456789",
        "p99_e2e_ms": "180.5",
    }
    imported = {
        "backend": "turbomind",
        "bs": "256",
        "completed": "1000",
        "duration": "30.1",
        "request_throughput": "33.223",
        "mean_e2e_latency_ms": "88.000",
        "mean_ttft_ms": "-",
        "run_id": "20260101-000001-cd34",
        "status": "imported",
        "source": "profile_throughput.py",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(csvstore.table_bytes(header, [ours, imported]))


def test_an_old_format_history_reads_in_one_spelling_and_loses_nothing(history):
    _old_format_history(history.csv_path)
    before = history.csv_path.read_bytes()

    frame = history.load()
    assert not set(LEGACY_COLUMNS) & set(frame.columns)
    assert frame["mean_e2e_ms"].tolist() == [101.23456789, 88.0]  # ours kept its full float
    assert frame["duration_s"].tolist() == [2.5123456789, 30.1]
    assert frame["p99_e2e_ms"].iloc[0] == 180.5 and math.isnan(frame["mean_ttft_ms"].iloc[1])
    assert history.csv_path.read_bytes() == before  # reading never rewrites the file
    assert b"mean_e2e_latency_ms" not in history.to_csv_bytes()
    assert history.lmdeploy_row("20260101-000001-cd34")["mean_e2e_latency_ms"] == "88.000"

    history.record(_record())  # a new run under the old header: the file keeps every old cell
    frame = history.load()
    assert frame["mean_e2e_ms"].tolist()[:2] == [101.23456789, 88.0] and len(frame) == 3
    imported_again = History(history.root.parent / "elsewhere")
    assert imported_again.import_csv(history.csv_path)[:2] == ["20260101-000000-ab12", "20260101-000001-cd34"]
    assert imported_again.load()["duration_s"].tolist()[:2] == [2.5123456789, 30.1]


def test_row_holds_identity_settings_metrics_engine_and_environment(history):
    record = _record(sweep_id="sweep-1", load_seconds=2.5)
    history.record(record)

    row = history.load().iloc[0]
    identity = (row["run_id"], row["status"], row["label"], row["model"])
    assert identity == (record.run_id, "finished", "baseline", "builtin:tiny-llama")
    assert row["started_at"] == record.started_at and row["sweep_id"] == "sweep-1" and row["load_seconds"] == 2.5
    assert row["concurrency"] == 4 and row["load_pattern"] == "batch" and row["dtype"] == "float32"
    assert row["p99_ttft_ms"] == 19.9 and row["goodput_rps"] == 1.5 and row["incomplete"] == 1
    assert json.loads(row["failure_reasons"]) == {"stopped early": 1}
    assert row["engine_device"] == "cpu" and row["engine_notes"] == "paged attention"
    assert row["engine_version_transformers"] == "5.24.0"
    assert row["env_cuda"] == "12.10"  # a version stays text, not the number 12.1
    assert row["env_gpu_count"] == "0"


def test_load_turns_dashes_into_nan_and_numbers_into_numbers(history, tmp_path):
    config = _config()
    history.record(
        _record(
            config,
            metrics={
                "completed": 3,
                "total_input_tokens": 33,
                "mean_ttft_ms": math.nan,
                "mean_itl_ms": "-",
                "mean_tpot_ms": 2.5,
            },
        )
    )

    frame = history.load()
    assert math.isnan(frame.loc[0, "mean_ttft_ms"]) and math.isnan(frame.loc[0, "mean_itl_ms"])
    assert frame.loc[0, "completed"] == 3 and frame.loc[0, "total_input_tokens"] == 33
    assert frame.loc[0, "mean_tpot_ms"] > 0
    assert bool(frame.loc[0, "stream_output"]) is True


def test_load_of_some_runs_gives_their_rows_in_the_order_recorded_whether_read_alone_or_from_the_table(history):
    records = [_record(_config(f"run {number}")) for number in range(4)]
    for record in records:
        history.record(record)
    wanted = [records[3].run_id, records[1].run_id, "no such run"]

    alone = History(history.root).load(["label"], run_ids=wanted)  # a fresh History: read from the index
    history.load()  # the whole table, kept until the next write
    from_table = history.load(["label"], run_ids=wanted)

    for frame in (alone, from_table):
        assert list(frame.columns) == ["run_id", "label"]
        assert frame.to_dict("records") == [
            {"run_id": records[1].run_id, "label": "run 1"},
            {"run_id": records[3].run_id, "label": "run 3"},
        ]
        assert list(frame.index) == [0, 1]
    assert list(history.load(run_ids=[records[2].run_id])["completed"]) == [1]
    assert history.load(run_ids=[]).empty


def test_the_columns_read_are_kept_until_the_next_write_and_other_columns_are_read_with_them(history, monkeypatch):
    first, second = _record(_config("first")), _record(_config("second"))
    history.record(first)
    reads = []
    read = history.index.frame

    def counted(columns=None, run_ids=None):
        reads.append(None if columns is None else set(columns))
        return read(columns, run_ids)

    monkeypatch.setattr(history.index, "frame", counted)
    assert list(history.load(["label"])["label"]) == ["first"]
    assert list(history.load(["label"])["label"]) == ["first"]  # a page's rerun
    assert set(history.load(["model", "status"]).columns) == {"run_id", "model", "status"}
    assert set(history.load(["label", "model"]).columns) == {"run_id", "label", "model"}
    assert list(history.load(["label"], run_ids=[first.run_id])["label"]) == ["first"]
    assert reads == [{"run_id", "label"}, {"run_id", "label", "model", "status"}]

    History(history.root).record(second)  # another process's run
    assert list(history.load(["label"])["label"]) == ["first", "second"]
    assert reads[-1] == {"run_id", "label"}


def test_api_keys_never_reach_any_file(history):
    record = _record(
        environment={"gpu_name": "none", "openai_api_key": "sk-secret-1"},
        metrics={"completed": 1, "API_KEY_used": "sk-secret-2"},
    )
    history.record(record)

    written = b"".join(path.read_bytes() for path in history.root.rglob("*") if path.is_file())
    assert b"sk-secret" not in written
    assert not [col for col in history.load().columns if "api_key" in col.lower()]


def test_run_folder_round_trips_config_environment_and_requests(history):
    config = _config("with slo")
    config.slo.ttft = 0.5
    config.dataset.dataset_name, config.dataset.random_input_len, config.dataset.random_output_len = "random", 32, 8
    record = _record(config)
    history.record(record)

    assert history.config(record.run_id) == config
    folder = history.run_dir(record.run_id)
    assert json.loads((folder / "environment.json").read_text()) == record.environment
    assert json.loads((folder / "config.json").read_text())["nested"]["slo"]["ttft"] == 0.5
    table = history.requests(record.run_id)
    assert list(table.columns) == list(_requests_table().columns)
    assert [list(itls) for itls in table["itl_s"]] == [[0.005, 0.004, 0.006], [0.007]]
    assert table["n_ticks"].tolist() == [5, 3] and table["status"].tolist() == ["success", "incomplete"]


def test_a_cpu_runs_row_and_config_leave_the_knobs_of_other_backends_empty(history):
    record = _record()  # transformers on the CPU
    history.record(record)

    _, rows = csvstore.read_table(history.csv_path)
    row = rows[0]
    assert (row["device"], row["communicator"], row["cache_max_entry_count"], row["session_len"]) == ("", "", "", "")
    assert (row["dtype"], row["max_batch_tokens"], row["engine_device"]) == ("float32", "1024", "cpu")
    saved = json.loads((history.run_dir(record.run_id) / "config.json").read_text())
    assert saved["flat"]["device"] is None and saved["nested"]["engine"]["communicator"] is None
    assert saved["nested"]["engine"]["dtype"] == "float32"
    assert history.config(record.run_id) == record.config


def test_a_new_column_rewrites_the_file_with_the_union_header(history):
    first = _record()
    second = _record(metrics={"completed": 2, "p90_ttft_ms": 7.5})
    history.record(first)
    history.record(second)

    header, rows = csvstore.read_table(history.csv_path)
    assert header[-1] == "p90_ttft_ms"
    with open(history.csv_path, newline="") as f:
        assert {len(cells) for cells in csv.reader(f)} == {len(header)}
    by_id = {row["run_id"]: row for row in rows}
    assert by_id[first.run_id]["p90_ttft_ms"] == "" and by_id[second.run_id]["p90_ttft_ms"] == "7.5"
    assert by_id[first.run_id]["p99_ttft_ms"] == "19.9" and by_id[second.run_id]["p99_ttft_ms"] == ""


def _append_runs_from_worker(root: str, worker: int, count: int) -> None:
    history = History(root)
    for i in range(count):
        metrics = {"worker": worker, f"only_from_worker_{worker}": i}
        history.record(_record(metrics=metrics, requests=None, run_id=f"w{worker}-{i}"))


def _start_writers(root: Path, writers: int, per_writer: int) -> list[multiprocessing.Process]:
    """Processes recording `per_writer` runs each into the history at `root`, started."""
    context = multiprocessing.get_context("fork")
    processes = [
        context.Process(target=_append_runs_from_worker, args=(str(root), w, per_writer)) for w in range(writers)
    ]
    for process in processes:
        process.start()
    return processes


def test_processes_appending_at_once_lose_no_row(history):
    workers, per_worker = 4, 5
    processes = _start_writers(history.root, workers, per_worker)
    for process in processes:
        process.join(timeout=60)
    assert [process.exitcode for process in processes] == [0] * workers

    frame = history.load()
    assert sorted(frame["run_id"]) == sorted(f"w{w}-{i}" for w in range(workers) for i in range(per_worker))
    for _, row in frame.iterrows():  # every cell under its own column, whatever order the columns arrived in
        worker, i = (int(part) for part in row["run_id"][1:].split("-"))
        assert row["worker"] == worker and row[f"only_from_worker_{worker}"] == i
        others = [f"only_from_worker_{w}" for w in range(workers) if w != worker]
        assert row[others].isna().all()


def test_two_writers_of_twenty_runs_and_a_reader_on_the_history_page_lose_nothing(
    history, monkeypatch, fresh_dashboard
):
    """Two processes record 20 runs each while the History page is drawn again and again: every run is in the index,
    in history.csv and on the page; the page never fails and never loses a run it showed; and the index, deleted,
    rebuilds from the folders to the same table."""
    from app_under_test import APP
    from streamlit.testing.v1 import AppTest

    from bench_core.store.history import RESULTS_ENV

    writers, per_writer = 2, 20
    processes = _start_writers(history.root, writers, per_writer)
    monkeypatch.setenv(RESULTS_ENV, str(history.root))
    page = AppTest.from_file(APP, default_timeout=60).run().switch_page("app_pages/history.py")
    shown: set[str] = set()
    draws = 0
    while any(process.is_alive() for process in processes) or draws == 0:
        page.run()
        draws += 1
        assert not page.exception, page.exception
        now = set(page.dataframe[0].value["run_id"]) if page.dataframe else set()
        assert shown <= now, ([e.value for e in page.error], [c.value for c in page.caption][:5])
        shown = now
    for process in processes:
        process.join(timeout=60)
    assert [process.exitcode for process in processes] == [0] * writers

    expected = sorted(f"w{w}-{i}" for w in range(writers) for i in range(per_writer))
    frame = History(history.root).load()
    assert sorted(frame["run_id"]) == expected
    _, rows = csvstore.read_table(history.csv_path)
    assert sorted(row["run_id"] for row in rows) == expected
    assert sorted(page.run().dataframe[0].value["run_id"]) == expected
    assert not list(history.root.glob("history.edited-*"))  # history.csv was only ever written by the index

    for path in history.root.glob("history.sqlite*"):
        path.unlink()
    rebuilt = History(history.root)
    pd.testing.assert_frame_equal(rebuilt.load(), frame)
    (notice,) = rebuilt.take_notices()
    assert f"from {writers * per_writer} run folder(s)" in notice


def test_an_exception_while_writing_leaves_the_previous_file_and_no_temp_file(history):
    history.record(_record())
    before = history.csv_path.read_bytes()

    class Unprintable:
        def __str__(self):
            raise RuntimeError("disk went away")

    with pytest.raises(RuntimeError):
        history.record(_record(metrics={"completed": Unprintable()}, requests=None))
    assert history.csv_path.read_bytes() == before
    assert [path.name for path in history.root.iterdir() if path.name.endswith(".tmp")] == []


@pytest.mark.slow
def test_a_process_killed_mid_write_leaves_the_previous_file_intact(history):
    history.record(_record())
    before = history.csv_path.read_bytes()
    crash = textwrap.dedent(
        f"""
        import os, sys
        sys.path.insert(0, {str(ROOT)!r})
        from bench_core import csvstore
        original_cell = csvstore._cell
        def dying_cell(value):
            if value == "crash here":
                os._exit(9)  # no cleanup, no exception handler: as if the machine lost power
            return original_cell(value)
        csvstore._cell = dying_cell
        csvstore.append_row({str(history.csv_path)!r}, {{"run_id": "doomed", "label": "crash here"}})
        """
    )
    result = subprocess.run([sys.executable, "-c", crash], timeout=60)
    assert result.returncode == 9
    assert history.csv_path.read_bytes() == before
    assert "doomed" not in history.load()["run_id"].tolist()


@pytest.mark.parametrize(
    ("file_name", "source", "load_pattern"),
    [
        ("profile_pipeline_api.csv", "profile_pipeline_api.py", "batch"),
        ("profile_throughput.csv", "profile_throughput.py", "concurrency"),
        ("lmdeploy_1130_1000_sharegpt.csv", "profile_restful_api.py", "request_rate"),
    ],
)
def test_lmdeploy_csvs_import_as_comparable_rows_with_original_values(history, file_name, source, load_pattern):
    path = LMDEPLOY_CSV / file_name
    _, original_rows = csvstore.read_table(path)

    run_ids = history.import_csv(path)

    assert len(run_ids) == len(original_rows) == len(set(run_ids))
    _, rows = csvstore.read_table(history.csv_path)
    for run_id, row, original in zip(run_ids, rows, original_rows):
        assert row["run_id"] == run_id and row["status"] == "imported"
        assert (row["source"], row["source_file"], row["load_pattern"]) == (source, file_name, load_pattern)
        assert {col: row[LEGACY_COLUMNS.get(col, col)] for col in original} == original  # cells verbatim
    frame = history.load()
    assert frame["completed"].dtype.kind in "if" and frame["mean_e2e_ms"].dtype.kind == "f"


def test_imported_values_load_as_numbers_nan_and_infinity(history):
    history.import_csv(LMDEPLOY_CSV / "profile_pipeline_api.csv")
    history.import_csv(LMDEPLOY_CSV / "profile_throughput.csv")
    history.import_csv(LMDEPLOY_CSV / "lmdeploy_1130_1000_sharegpt.csv")

    frame = history.load()
    assert math.isnan(frame["mean_ttft_ms"].iloc[0])  # '-' from a pipeline run without streaming
    assert frame["concurrency"].iloc[0] == 256
    failed = frame.iloc[3]
    assert failed["completed"] == 0 and math.isinf(failed["mean_e2e_ms"])
    restful = frame.iloc[4]
    assert math.isinf(restful["request_rate"]) and math.isnan(restful["num_prompts"])
    assert frame["request_rate"].iloc[5] == 16.0


def test_offline_scripts_share_a_header_so_an_unhinted_name_says_either(history):
    data = (LMDEPLOY_CSV / "profile_throughput.csv").read_bytes()
    history.import_csv(data, "results.csv")
    frame = history.load()
    assert set(frame["source"]) == {"profile_pipeline_api.py or profile_throughput.py"}
    assert set(frame["load_pattern"]) == {""}


@pytest.mark.slow
def test_a_csv_written_by_lmdeploys_own_profiler_imports(history, tmp_path):
    lmdeploy_row = _lmdeploy_row(tmp_path, _config(), stream_output=True)
    (run_id,) = history.import_csv(tmp_path / "lmdeploy-True.csv", "profile_throughput.csv")

    row = history.load().set_index("run_id").loc[run_id]
    assert row["completed"] == 3 and row["mean_ttft_ms"] == float(lmdeploy_row["mean_ttft_ms"])


def test_importing_a_history_skips_run_ids_already_present(history, tmp_path):
    source = History(tmp_path / "elsewhere")
    first, second = _record(), _record(config=_config("second"))
    source.record(first)
    source.record(second)

    assert history.import_csv(source.to_csv_bytes([first.run_id]), "history.csv") == [first.run_id]
    assert history.import_csv(source.csv_path) == [second.run_id]
    assert history.import_csv(source.csv_path) == []
    assert sorted(history.load()["run_id"]) == sorted([first.run_id, second.run_id])
    assert history.config(second.run_id) == second.config  # rebuilt from the imported row


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        ((LMDEPLOY_CSV / "misaligned_profile_pipeline_api.csv").read_bytes(), "cells but the header has"),
        (b"backend,bs,completed\nturbomind,1,3\n", "not a CSV written by LMDeploy"),
        ((LMDEPLOY_CSV / "profile_throughput.csv").read_bytes().replace(b",56.236,", b",fast,"), "not a number"),
        ((LMDEPLOY_CSV / "profile_throughput.csv").read_bytes().split(b"\r\n")[0], "no rows"),
        (b"", "empty"),
        (b"run_id,status\n../escape,finished\n", "which is not one"),
        (b"\xff\xfe\x00b\x00a\x00d", "not a readable CSV"),
    ],
)
def test_malformed_imports_raise_one_sentence_and_write_nothing(history, data, fragment):
    history.record(_record())
    before = history.csv_path.read_bytes()

    with pytest.raises(HistoryError, match=fragment) as error:
        history.import_csv(data, "upload.csv")

    assert "\n" not in str(error.value) and "upload.csv" in str(error.value)
    assert history.csv_path.read_bytes() == before


def test_delete_removes_only_the_named_rows_and_folders(history):
    kept, doomed = _record(), _record()
    history.record(kept)
    history.record(doomed)
    imported, kept_imported = history.import_csv(LMDEPLOY_CSV / "profile_throughput.csv")

    assert history.delete([doomed.run_id, imported]) == 2

    assert history.load()["run_id"].tolist() == [kept.run_id, kept_imported]
    assert not history.run_dir(doomed.run_id).exists() and history.run_dir(kept.run_id).is_dir()
    with pytest.raises(HistoryError):
        history.delete(["../outside"])


def test_csv_bytes_hold_the_whole_history_or_a_selection(history):
    records = [_record(), _record(), _record()]
    for record in records:
        history.record(record)

    assert history.to_csv_bytes() == history.csv_path.read_bytes()
    selected = list(csv.DictReader(io.StringIO(history.to_csv_bytes([records[2].run_id]).decode())))
    assert [row["run_id"] for row in selected] == [records[2].run_id]


def test_no_history_file_means_an_empty_frame_and_empty_download(tmp_path, monkeypatch):
    monkeypatch.setenv("BENCH_STUDIO_RESULTS", str(tmp_path / "custom"))
    history = History()
    assert history.csv_path == tmp_path / "custom" / "history.csv"
    assert history.load().empty and "run_id" in history.load().columns
    assert history.to_csv_bytes() == b""
    with pytest.raises(HistoryError, match="no per-request table"):
        history.requests("20260101-000000-abcd")


def test_imported_lmdeploy_rows_have_no_settings_to_rebuild(history):
    (run_id, _) = history.import_csv(LMDEPLOY_CSV / "profile_pipeline_api.csv")
    with pytest.raises(HistoryError, match="profile_pipeline_api.py without its settings"):
        history.config(run_id)


def test_run_ids_are_readable_and_sortable_by_time():
    assert re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{4}", new_run_id())
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d", local_now_iso())


@pytest.mark.slow
def test_environment_reports_versions_without_importing_lmdeploy():
    probe = textwrap.dedent(
        f"""
        import json, sys
        sys.path.insert(0, {str(ROOT)!r})
        from bench_core.hardware.environment import collect_environment
        print(json.dumps({{"env": collect_environment(), "lmdeploy_imported": "lmdeploy" in sys.modules}}))
        """
    )
    probe_run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    output = json.loads(probe_run.stdout)
    env = output["env"]
    assert output["lmdeploy_imported"] is False
    assert env["lmdeploy"] == importlib.metadata.version("lmdeploy")
    assert env["transformers"] == importlib.metadata.version("transformers")
    assert env["torch"] == importlib.metadata.version("torch")
    expected_commit = (
        subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        or "unknown"
    )
    assert env["app_commit"] == expected_commit
    assert {"gpu_name", "gpu_count", "gpu_driver", "cuda", "python", "platform", "cpu_count", "app_version"} <= set(env)
    assert all(isinstance(value, str) for value in env.values())


def test_environment_marks_missing_packages_and_prefers_the_engines_versions(monkeypatch):
    real_version = importlib.metadata.version

    def version(name):
        if name == "lmdeploy":
            raise importlib.metadata.PackageNotFoundError(name)
        return real_version(name)

    monkeypatch.setattr(importlib.metadata, "version", version)
    environment._static_environment.cache_clear()
    try:
        info = EngineInfo("transformers", "m", "/m", "float32", "cpu", versions={"torch": "9.9.9-engine"})
        env = environment.collect_environment(info)
    finally:
        environment._static_environment.cache_clear()
    assert env["lmdeploy"] == "not installed"
    assert env["torch"] == "9.9.9-engine"
