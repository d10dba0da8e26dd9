"""A request rate (open loop) on the embedded transformers engine, with the real tiny model: requests go in at the
drawn arrivals, through the runner, `pipeline --request-rate` and a sweep over request_rate."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scripted_server import NEVER_THAT_LATE_S  # a busy machine's lag is no unit slip

from bench_core.cli.common import EXIT_BAD_INPUT, EXIT_OK
from bench_core.config import DatasetConfig, EngineConfig, LoadConfig, RunConfig
from bench_core.engines import check_run_config
from bench_core.errors import ConfigError
from bench_core.load.arrivals import achieved_rate, send_offsets
from bench_core.run.runner import Runner
from bench_core.store.history import History

# Each test here runs a real engine, server, app script or process for seconds: not in the fast suite.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
RATE = 4.0  # req/s: six requests span about 1.25 s, each served long before the next arrives
RUN = (
    "builtin:sample",
    "builtin:tiny-llama",
    "--backend",
    "transformers",
    "-n",
    "4",
    "--sharegpt-output-len",
    "4",
    "--stream-output",
    "--results",
    "results",
    "--csv",
    "",
)


def rate_config(**load) -> RunConfig:
    return RunConfig(
        engine=EngineConfig(backend="transformers", model="builtin:tiny-llama"),
        dataset=DatasetConfig(
            dataset="builtin:sample",
            dataset_name="random",
            num_prompts=6,
            random_input_len=16,
            random_output_len=4,
            random_range_ratio=1.0,
        ),
        load=LoadConfig(**{"load_pattern": "request_rate", "request_rate": RATE, "stream_output": True, **load}),
    )


def test_requests_are_admitted_at_the_drawn_arrivals(tmp_path, tiny_model_path):
    runner = Runner(History(tmp_path / "results"))
    try:
        run = runner.submit(rate_config())
        assert run.wait(120) and run.state == "finished", run.message
    finally:
        runner.shutdown()
    drawn = send_offsets(6, RATE, 1.0, run.measurement.sample.arrival_rng)
    assert drawn[-1] > 0.5  # a schedule worth checking: not every request at once
    requests = run.record.requests
    assert np.sort(requests["scheduled_s"].to_numpy()) == pytest.approx(drawn)
    # Each sent at its drawn time or after it, never before (the engine waits for it): a busy machine only makes
    # a send later, by a lag, not by seconds.
    lag = (requests["sent_s"] - requests["scheduled_s"]).to_numpy()
    assert ((lag >= 0) & (lag < NEVER_THAT_LATE_S)).all(), lag  # timing-safe: seconds late is a unit slip
    # The clock starts at admission (stamped just after the send: microseconds later, more on a busy machine), so
    # each request's start is its admission: offsets from the first one's.
    admitted = np.array(sorted(s.admit_time for s in run.measurement.profiler.sessions))
    starts = np.sort(requests["start_s"].to_numpy())
    assert starts - starts[0] == pytest.approx(admitted - admitted[0], abs=1e-9)
    row = runner.history.load().iloc[0]
    assert (row["load_pattern"], float(row["request_rate"])) == ("request_rate", RATE)


def test_the_run_records_how_its_schedule_was_kept(tmp_path, tiny_model_path):
    runner = Runner(History(tmp_path / "results"))
    try:
        run = runner.submit(rate_config(exact_rate_arrivals=True))  # the schedule offers RATE exactly
        assert run.wait(120) and run.state == "finished", run.message
    finally:
        runner.shutdown()
    requests = run.record.requests
    drawn = send_offsets(6, RATE, 1.0, run.measurement.sample.arrival_rng, exact_rate=True)
    assert np.sort(requests["scheduled_s"].to_numpy()) == pytest.approx(drawn)
    assert (requests["ended_s"] > requests["sent_s"]).all()
    metrics = run.record.metrics
    # What the run says of its schedule is what its requests' send times give (a busy machine sends late, and a
    # late first send raises the achieved rate as a late last one lowers it: no bound on it holds on any machine).
    sent, lag_ms = requests["sent_s"].to_numpy(), (requests["sent_s"] - requests["scheduled_s"]).to_numpy() * 1000
    assert metrics["achieved_rate"] == pytest.approx(achieved_rate(sent))
    assert (metrics["mean_send_lag_ms"], metrics["max_send_lag_ms"]) == pytest.approx((lag_ms.mean(), lag_ms.max()))
    assert 0 <= lag_ms.min() and lag_ms.max() < NEVER_THAT_LATE_S * 1000  # timing-safe: seconds late is a slip
    assert metrics["peak_in_flight"] >= 1
    row = runner.history.load().iloc[0]  # kept in the history as the server's runs keep them
    assert float(row["achieved_rate"]) == pytest.approx(metrics["achieved_rate"])
    assert int(row["peak_in_flight"]) == metrics["peak_in_flight"]


def test_max_concurrency_holds_arrivals_until_a_slot_is_free(tmp_path, tiny_model_path):
    runner = Runner(History(tmp_path / "results"))
    try:
        run = runner.submit(rate_config(max_concurrency=1, request_rate=float("inf")))
        assert run.wait(120) and run.state == "finished", run.message
    finally:
        runner.shutdown()
    sessions = sorted(run.measurement.profiler.sessions, key=lambda s: s.admit_time)
    # Every request arrives at t0, and each goes in only once the one before it has ended.
    assert all(later.admit_time >= earlier.finish_time for earlier, later in zip(sessions, sessions[1:]))


def test_a_duration_is_refused_on_the_embedded_engine():
    with pytest.raises(ConfigError, match="--duration applies to the openai backend only, not to transformers"):
        check_run_config(rate_config(duration_s=5.0))


def bench(work: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "bench_core", *args], cwd=work, env=env, capture_output=True, text=True, timeout=300
    )


def test_pipeline_with_a_request_rate_runs_open_loop(tmp_path, tiny_model_path):
    proc = bench(tmp_path, "pipeline", *RUN, "--request-rate", "5")
    assert proc.returncode == EXIT_OK, proc.stderr
    assert "Request rate (req/s)" in proc.stdout  # the summary's hyperparameters say what load it ran
    assert "Achieved send rate (req/s)" in proc.stdout and "Peak requests in flight" in proc.stdout
    (row,) = History(tmp_path / "results").load().to_dict("records")
    assert (row["load_pattern"], float(row["request_rate"]), row["completed"]) == ("request_rate", 5.0, 4)


def test_a_sweep_over_request_rate_runs_one_point_per_rate(tmp_path, tiny_model_path):
    proc = bench(tmp_path, "sweep", "pipeline", *RUN, "--sweep", "request_rate=2,8")
    assert proc.returncode == EXIT_OK, proc.stderr
    runs = History(tmp_path / "results").load()
    assert sorted(runs["request_rate"].astype(float)) == [2.0, 8.0]
    assert set(runs["load_pattern"]) == {"request_rate"} and (runs["completed"] == 4).all()
    assert proc.stdout.strip().splitlines()[1].split()[0] == "request_rate"  # the table's points, by their rate


def test_sweeping_a_rate_under_a_pattern_it_does_not_apply_to_is_refused(tmp_path, tiny_model_path):
    proc = bench(tmp_path, "sweep", "pipeline", *RUN, "--load", "batch", "--sweep", "request_rate=2,8")
    assert proc.returncode == EXIT_BAD_INPUT
    assert (
        "Cannot sweep request_rate under the pipeline batch load pattern: it applies under request rate only."
        in proc.stderr
    )
    assert not (tmp_path / "results" / "history.csv").exists()


def test_a_rate_given_under_a_pattern_that_ignores_it_is_refused(tmp_path):
    proc = bench(tmp_path, "pipeline", *RUN, "--load", "batch", "--request-rate", "2", "--burstiness", "0.5")
    assert proc.returncode == EXIT_BAD_INPUT
    assert proc.stderr.strip().splitlines() == [
        "error: --request-rate does nothing under the pipeline batch load pattern: it applies under request rate "
        "only. --burstiness does nothing under the pipeline batch load pattern: it applies under request rate only."
    ]
    assert not (tmp_path / "results").exists()
