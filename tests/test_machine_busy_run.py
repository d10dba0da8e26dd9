"""A real run of the tiny model on the embedded engine beside processes that keep every core busy: the CLI's last
lines and the history row say the machine was busy, with the numbers (hardware/contention.py)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from cli_forks import CliForks

from bench_core.hardware.contention import BUSY_SHARE_COLUMN, OTHER_CORES_COLUMN, busy_note
from bench_core.store.history import History

# Each test here runs a real engine, server, app script or process for seconds: not in the fast suite.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
HOGS_PER_CORE = 2  # beside an engine that uses every core, each hog takes its share: two per core leave it a third


def _cpu_seconds(processes: list[psutil.Process]) -> float:
    return sum(sum(process.cpu_times()[:2]) for process in processes)


@pytest.fixture
def cpu_hogs():
    """`yes` into /dev/null, HOGS_PER_CORE per core, for the test's length; always killed at its end."""
    hogs = []
    try:
        for _ in range(HOGS_PER_CORE * (os.cpu_count() or 1)):
            hogs.append(subprocess.Popen(["yes"], stdout=subprocess.DEVNULL))
        time.sleep(0.5)  # running before the CLI starts
        yield hogs
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait()


@pytest.fixture(scope="module")
def cli():
    """`python -m bench_core`, forked from an interpreter that imported the CLI's libraries before the hogs started
    (tests/cli_forks.py): the CLI's life beside them is the run itself, not seconds of imports at a third of a core."""
    with CliForks({**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}) as forks:
        yield forks


def test_a_run_beside_cpu_hogs_is_flagged_in_the_cli_and_its_history_row(cli, cpu_hogs, tmp_path, tiny_model_path):
    hogs = [psutil.Process(hog.pid) for hog in cpu_hogs]
    hogs_cpu_s, began = _cpu_seconds(hogs), time.perf_counter()
    done = cli.run(
        [
            "pipeline",
            "builtin:sample",
            "builtin:tiny-llama",
            "--backend",
            "transformers",
            "-n",
            "4",
            "-c",
            "4",
            "--sharegpt-output-len",
            "8",
            "--stream-output",
            "--csv",
            "",
            "--results",
            str(tmp_path / "results"),
        ],
        cwd=tmp_path,
        timeout=400,
    )
    # What the hogs used, per psutil, in mean cores over the CLI's whole life (loading the model, measuring, writing).
    hogs_cores = (_cpu_seconds(hogs) - hogs_cpu_s) / (time.perf_counter() - began)
    assert all(hog.poll() is None for hog in cpu_hogs)  # they ran the whole time
    assert done.returncode == 0, done.stderr
    row = History(tmp_path / "results").load().iloc[0]
    cores = float(row["env_cpu_count"])
    other, share = float(row[OTHER_CORES_COLUMN]), float(row[BUSY_SHARE_COLUMN])
    print(
        f"\nbeside {len(cpu_hogs)} hogs on {cores:g} cores: other processes {other:.2f} cores (the hogs "
        f"{hogs_cores:.2f} over the CLI's life), engine {float(row['mean_process_cpu_cores']):.2f} cores, the "
        f"machine saturated by others {share:.0%} of the run"
    )
    # The hogs' CPU is counted as other processes': at least three quarters of what they used over the CLI's life
    # (they used the cores the engine left them, in its measured window as in its loading), and more where other
    # work ran beside them.
    assert other >= 0.75 * hogs_cores
    # And it flags the run, with the numbers, in the CLI's last lines.
    note = busy_note(row, row["env_cpu_count"])
    assert note is not None and f"warning: {note}" in done.stderr.splitlines()
    assert note.startswith(f"machine busy: other processes used {other:.1f} of {cores:g} CPU cores")
