"""A history written by an earlier version reads as it did then: the table, each run's settings, its requests
and its LMDeploy row.

tests/data/history_round2/ was written by the CLI at commit 44384c9 (before the settings catalog and the
package layout): a streamed ShareGPT run, a random-dataset batch run, a two-point sweep with an SLO, a
synthetic model under the concurrency load, a restful run against the scripted server, and two rows imported
from LMDeploy's CSV. tests/data/history_round2.json holds what that version read from it.

    UPDATE_HISTORY_READING=1 .venv/bin/python -m pytest tests/test_history_compatibility.py  # rewrite it
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import pandas as pd
import pytest

from bench_core.store.history import History

DATA = Path(__file__).resolve().parent / "data"
WRITTEN = DATA / "history_round2"
READ = DATA / "history_round2.json"
UPDATE = os.environ.get("UPDATE_HISTORY_READING") == "1"


def _plain(value):
    """A cell as JSON holds it: NaN and NA as None, numpy scalars and arrays as Python's."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def reading(root: Path) -> dict:
    history = History(root)
    table = history.load()
    runs = {}
    for run_id, status in zip(table["run_id"], table["status"]):
        entry = {
            "row": {key: _plain(value) for key, value in history.row(run_id).items()},
            "lmdeploy_row": {key: _plain(value) for key, value in history.lmdeploy_row(run_id).items()},
        }
        if status != "imported":
            entry["config"] = {key: _plain(value) for key, value in history.config(run_id).to_flat_dict().items()}
            requests = history.requests(run_id)
            entry["requests"] = {name: [_plain(v) for v in requests[name]] for name in requests.columns}
        runs[run_id] = entry
    return {
        "columns": list(table.columns),
        "dtypes": {name: str(kind) for name, kind in table.dtypes.items()},
        "cells": {name: [_plain(v) for v in table[name]] for name in table.columns},
        "runs": runs,
    }


def _new_settings(config: dict) -> dict:
    """What a run recorded before the settings declared since reads as: each one's default where it applies."""
    from bench_core.config import SETTINGS, RunConfig

    defaults = RunConfig.from_flat_dict({"backend": config["backend"]}).to_flat_dict()
    return {
        setting.key: defaults[setting.key]
        for setting in SETTINGS
        if setting.key not in _RECORDED_BEFORE and not setting.secret
    }


# Knobs that apply to a backend since the history was written, and the value its runs then ran with: the
# transformers engine's KV block sharing was always off before enable_prefix_caching drove it (issue 22).
_APPLIES_SINCE = {
    "enable_prefix_caching": ("transformers", False),
    "speculative_num_draft_tokens": ("transformers", 1),  # prompt-lookup decoding on the embedded engine
}


def _widened(config: dict) -> dict:
    """What an old run's recorded settings read as, where a knob applies to its backend since."""
    return config | {key: value for key, (backend, value) in _APPLIES_SINCE.items() if config["backend"] == backend}


# The settings the history held when tests/data/history_round2 was written.
_RECORDED_BEFORE = json.loads(READ.read_text(encoding="utf-8"))["runs"]["20261201-104433-ef6e"]["config"].keys()


@pytest.fixture
def old_history(tmp_path) -> Path:
    root = tmp_path / "results"
    shutil.copytree(WRITTEN, root)
    return root


def test_a_history_written_before_reads_as_it_did(old_history):
    got = json.loads(json.dumps(reading(old_history)))
    if UPDATE:
        READ.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        pytest.skip("rewrote the reading")
    expected = json.loads(READ.read_text(encoding="utf-8"))
    assert got["columns"] == expected["columns"]
    assert got["dtypes"] == expected["dtypes"]
    assert got["cells"] == expected["cells"]
    assert got["runs"].keys() == expected["runs"].keys()
    for run_id, entry in expected["runs"].items():
        read = got["runs"][run_id]
        assert {key: read[key] for key in entry if key != "config"} == {k: v for k, v in entry.items() if k != "config"}
        if "config" in entry:  # settings declared since read as their defaults (empty where they do not apply)
            config = read["config"]
            assert {key: config.get(key) for key in entry["config"]} == _widened(entry["config"]), run_id
            assert {key: config[key] for key in config.keys() - entry["config"].keys()} == _new_settings(config), run_id


def test_reading_it_changes_no_file_and_adds_only_the_index_and_each_runs_row_once(old_history):
    def files():
        return {path.relative_to(old_history): path.read_bytes() for path in old_history.rglob("*") if path.is_file()}

    before = files()
    reading(old_history)
    after = files()
    assert {path: after[path] for path in before} == before
    added = sorted(map(str, after.keys() - before.keys()))
    row_files = sorted(f"runs/{run_id}/row.json" for run_id in History(old_history).load()["run_id"])
    assert [name for name in added if not name.startswith("history.sqlite")] == row_files
    assert "history.sqlite" in added

    reading(old_history)
    assert files().keys() == after.keys()
