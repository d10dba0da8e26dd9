"""The Run page's ended-run data read back from the history, through `History` and its one check of the file."""

from __future__ import annotations

import pandas as pd
import pytest

from bench_core.config import RunConfig
from bench_core.errors import HistoryError
from bench_core.states import RunState
from bench_core.store.history import History, RunRecord
from dashboard.run_result import result_from_history

RUN_ID = "20261130-080000-ab12"


def _stored_run(root) -> History:
    history = History(root)
    config = RunConfig(label="stored")
    config.engine.model = "builtin:tiny-llama"
    requests = pd.DataFrame({"status": ["success"], "ttft_s": [0.1], "tpot_s": [0.01], "e2e_s": [0.5]})
    history.record(
        RunRecord(
            run_id=RUN_ID,
            started_at="2026-11-30T08:00:00+00:00",
            status=RunState.FINISHED,
            config=config,
            metrics={"duration_s": 2.5},
            requests=requests,
            error="",
        )
    )
    return history


def test_a_stored_run_reads_back_with_its_row_config_and_requests(tmp_path):
    result = result_from_history(_stored_run(tmp_path), RUN_ID)
    assert (result.status, result.duration_s, result.config.label) == (RunState.FINISHED, 2.5, "stored")
    assert result.requests["ttft_s"].tolist() == [0.1]


def test_a_damaged_line_in_history_csv_does_not_hide_a_stored_run(tmp_path):
    """A stored run reads from its folder and the index: a damaged line in history.csv (which used to make the Run page
    refuse every stored run while the History page showed them all) is no part of it."""
    history = _stored_run(tmp_path)
    with history.csv_path.open("ab") as csv_file:
        csv_file.write(b"cut,short\n")
    result = result_from_history(History(history.root), RUN_ID)
    assert result.status == RunState.FINISHED and result.requests["ttft_s"].tolist() == [0.1]


def test_an_unknown_run_is_one_history_error(tmp_path):
    history = _stored_run(tmp_path)
    assert history.row("20000101-000000-dead") is None
    with pytest.raises(HistoryError, match="There is no run 20000101-000000-dead"):
        result_from_history(history, "20000101-000000-dead")


def test_a_row_is_every_cell_as_written(tmp_path):
    row = _stored_run(tmp_path).row(RUN_ID)
    assert (row["run_id"], row["status"], row["label"], row["duration_s"]) == (RUN_ID, "finished", "stored", "2.5")
