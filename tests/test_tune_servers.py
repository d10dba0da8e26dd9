"""`tune restful --server-cmd` through the command line against a server with a known optimum (tests/load_server.py
--batch B: at most B requests served at once, each token D + 5 x B ms): throughput rises with the batch and with a
shorter D, and so does TPOT with the batch, so the best point within p99 TPOT <= 50 ms is batch 4 at D = 20 ms (TPOT
40 ms; batch 8 takes 60, D = 60 puts every batch at 65 or more). The tune finds it within 6 of the 8 points, its
trials are runs in the history under its id, a resume with more trials goes on with the same study without running a
recorded trial again, and the command it prints runs the best point again with its settings."""

from __future__ import annotations

import json
import shlex
import socket
import subprocess
import sys
import time

import pytest
from sweep_cli import ROOT, bench, rows_of

from bench_core.cli.common import EXIT_OK
from bench_core.config import RunConfig
from bench_core.store.history import History
from bench_core.sweep.store import trials_of

pytestmark = pytest.mark.slow

BATCH_SERVER = (
    f"{sys.executable} {ROOT / 'tests' / 'load_server.py'} --port {{port}} --batch {{batch}} --token-delay-ms {{delay}} "
    "--step-ms-per-seat 5"
)
TUNE_RUN = (
    "tune",
    "restful",
    "--tokenizer",
    "builtin:tiny-llama",
    "--num-prompts",
    "8",
    "--max-concurrency",
    "8",
    "--dataset-name",
    "random",
    "--random-input-len",
    "8",
    "--random-output-len",
    "8",
    "--random-range-ratio",
    "1",
    "--disable-warmup",
    "--output-file",
    "",
    "--results",
    "results",
    "--no-server-metrics",
    "--server-cmd",
    BATCH_SERVER,
    "--space",
    "batch=1,2,4,8",
    "--space",
    "delay=20,60",
    "--slo",
    "p99_tpot_ms<=50",
)


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """A tune of 4 trials, then resumed with 2 more."""
    work = tmp_path_factory.mktemp("tune")
    first = bench(work, *TUNE_RUN, "--trials", "4", "--tune-seed", "1")
    assert first.returncode == EXIT_OK, first.stderr
    tune_id = rows_of(work)["sweep_id"].iloc[0]
    before = trials_of(History(work / "results"), tune_id)
    resumed = bench(work, "tune", "--resume", tune_id, "--results", "results", "--more-trials", "2")
    assert resumed.returncode == EXIT_OK, resumed.stderr
    return work, tune_id, before, resumed


def test_the_tune_finds_the_known_best_point_within_its_budget_and_rejects_the_points_beyond_the_slo(tuned):
    work, tune_id, _, resumed = tuned
    assert "Best: batch=4, delay=20: Output throughput (tok/s)" in resumed.stdout
    assert "Tried 6 of the space's 8 points (75%)." in resumed.stdout
    journal = trials_of(History(work / "results"), tune_id)
    points = [json.loads(point) for point in journal["point"]]
    assert len(points) == len({json.dumps(point, sort_keys=True) for point in points}) == 6
    table = resumed.stdout.split("Trials (")[1].split("Tried")[0]
    for line in table.splitlines()[2:]:
        batch, delay, within = line.split()[1], line.split()[2], "yes" in line.split()
        assert within == (delay == "20" and batch in ("1", "2", "4")), line  # the SLO's verdict, as designed
    html = (work / "results" / "sweeps" / f"{tune_id}.html").read_text()
    assert "Best: batch=4, delay=20" in html and "run it again: python -m bench_core restful --base-url" in html


def test_every_trial_is_a_run_of_the_tune_with_its_server_settings(tuned):
    work, tune_id, _, _ = tuned
    rows = rows_of(work)
    journal = trials_of(History(work / "results"), tune_id)
    run_ids = [run_id for runs in journal["runs"] for run_id in runs.split()]
    assert sorted(run_ids) == sorted(rows["run_id"].astype(str))
    assert set(rows["sweep_id"]) == {tune_id}
    by_run = dict(zip(rows["run_id"].astype(str), rows["server_settings"]))
    for point, runs in zip(journal["point"], journal["runs"]):
        assert all(json.loads(by_run[run_id]) == json.loads(point) for run_id in runs.split())


def test_a_resume_goes_on_with_the_same_study_and_runs_no_recorded_trial_again(tuned):
    work, tune_id, before, resumed = tuned
    after = trials_of(History(work / "results"), tune_id)
    assert len(before) == 4 and len(after) == 6
    assert after.iloc[:4].equals(before)  # the recorded trials stand, their runs not run again
    assert not set(after["point"].iloc[4:]) & set(before["point"])
    assert "4 done before" in resumed.stderr


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_the_printed_command_runs_the_best_point_again_with_its_settings(tuned):
    work, tune_id, _, resumed = tuned
    server_line = resumed.stdout.split("server command: ")[1].splitlines()[0]
    again = resumed.stdout.split("run it again: ")[1].splitlines()[0]
    port = _free_port()
    server = subprocess.Popen(
        shlex.split(server_line.replace("--port 23333", f"--port {port}")), stdout=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.2)
        words = shlex.split(again.replace("http://127.0.0.1:23333", f"http://127.0.0.1:{port}"))
        assert words[:3] == ["python", "-m", "bench_core"]
        ran = bench(work, *words[3:], "--results", "again")
        assert ran.returncode == EXIT_OK, ran.stderr
    finally:
        server.terminate()
        server.wait(10)
    best_runs = trials_of(History(work / "results"), tune_id)
    best = best_runs[best_runs["point"] == json.dumps({"batch": 4, "delay": 20})]["runs"].iloc[0].split()[0]
    tuned_config = History(work / "results").config(best)
    again_config = History(work / "again").config(History(work / "again").load()["run_id"].iloc[0])
    differ = {
        name for name, value in tuned_config.to_flat_dict().items() if again_config.to_flat_dict().get(name) != value
    }
    # The port, the label and the server's settings are the tune's own; every setting of the run itself is the same.
    assert differ <= {"base_url", "label", "server_settings"}, differ
    assert isinstance(again_config, RunConfig)


def test_a_trial_repeats_its_point_and_the_best_is_given_with_its_interval(tmp_path):
    args = [*TUNE_RUN[: TUNE_RUN.index("--space")], "--space", "batch=2,4", "--space", "delay=20"]
    proc = bench(tmp_path, *args, "--trials", "2", "--repeats", "3")
    assert proc.returncode == EXIT_OK, proc.stderr
    tune_id = rows_of(tmp_path)["sweep_id"].iloc[0]
    journal = trials_of(History(tmp_path / "results"), tune_id)
    assert [len(runs.split()) for runs in journal["runs"]] == [3, 3]
    best = proc.stdout.split("Best: ")[1].splitlines()[0]
    assert best.startswith("batch=4, delay=20: Output throughput (tok/s) ") and "[95% CI " in best
    assert best.endswith("over 3 runs")
