"""A run recorded on a busy machine (hardware/contention.py) is amber with its numbers on the Run page, whether opened
from the History page's link or directly, and the History table tags it in its row; a calm run beside it is not."""

from __future__ import annotations

import dataclasses

import pytest
from app_under_test import APP, shown
from streamlit.testing.v1 import AppTest

from bench_core.config import DatasetConfig, EngineConfig, LoadConfig, RunConfig
from bench_core.hardware.contention import BUSY_PREFIX
from bench_core.hardware.telemetry import CPU_CORES, CPU_COUNT, CPU_PERCENT, MACHINE, PROCESS, Sample, samples_frame
from bench_core.run.runner import Runner
from bench_core.store.history import RESULTS_ENV, History, run_metrics
from dashboard.history_view import FLAGS_COLUMN

# Each test here runs a real engine, server, app script or process for seconds: not in the fast suite.
pytestmark = pytest.mark.slow

NOTE = (
    "Machine busy: other processes used 1.8 of 2 CPU cores during this run and saturated the machine 100% of the "
    "time: its numbers are not the engine's alone."
)


def _telemetry(duration_s: float, engine_cores: float):
    """What the sampler records, all run long, on a 2-core machine at 100% where the engine uses `engine_cores`."""
    rows = [Sample(0.0, MACHINE, CPU_COUNT, 2.0)]
    for i in range(int(duration_s * 10) + 2):
        rows += [Sample(i / 10, MACHINE, CPU_PERCENT, 100.0), Sample(i / 10, PROCESS, CPU_CORES, engine_cores)]
    return samples_frame(rows)


@pytest.fixture
def busy_and_calm(tmp_path, monkeypatch, fresh_dashboard, tiny_model_path) -> tuple[str, str]:
    """Two real runs of the tiny model, recorded with the telemetry of an engine starved by other processes (0.24
    of 2 cores) and of one busy on its own (1.97): whatever this shared machine was doing meanwhile."""
    root = tmp_path / "results"
    history = History(root)
    runner = Runner()  # records here, by hand
    config = RunConfig(
        engine=EngineConfig(backend="transformers", model="builtin:tiny-llama"),
        dataset=DatasetConfig(dataset="builtin:sample", num_prompts=4, sharegpt_output_len=4),
        load=LoadConfig(concurrency=2, stream_output=True),
    )
    ids = []
    for starved in (True, False):
        run = runner.submit(config)
        assert run.wait(60) and run.state == "finished", run.message
        duration = run.record.metrics["duration_s"]
        telemetry = _telemetry(duration, 0.24 if starved else 1.97)
        record = dataclasses.replace(
            run.record,
            telemetry=telemetry,
            environment={**run.record.environment, "cpu_count": "2"},
            metrics=run_metrics(config, run.record.requests, duration, telemetry),
        )
        history.record(record)
        ids.append(run.run_id)
    runner.shutdown()
    monkeypatch.setenv(RESULTS_ENV, str(root))
    return ids[0], ids[1]


def test_a_busy_run_is_amber_with_its_numbers_on_the_run_page_and_in_history(busy_and_calm):
    busy, calm = busy_and_calm
    at = AppTest.from_file(APP, default_timeout=60).run().switch_page("app_pages/history.py").run()
    assert not at.exception
    table = at.dataframe[0].value.set_index("run_id")
    assert list(table.columns).index(FLAGS_COLUMN) == list(table.columns).index("status") + 1
    assert table.loc[busy, FLAGS_COLUMN] == BUSY_PREFIX  # its tag; the sentence, with its numbers, on its page
    assert table.loc[calm, FLAGS_COLUMN] == ""

    link = table.loc[busy, "open"]  # the Run page as the table's link opens it
    page = AppTest.from_file(APP, default_timeout=60)
    page.query_params["run"] = link.split("run=", 1)[1]
    page.run()
    assert not page.exception and not page.success
    status = shown(page.warning[0].value)
    assert status.startswith("finished: 4/4 requests succeeded") and status.endswith(NOTE)
    telemetry = next(
        d.value for d in page.dataframe if "Engine process CPU" in set(d.value.get("quantity", ()))
    ).set_index("quantity")
    assert telemetry.loc["Other processes' CPU", "value"] == "1.760"  # as the table formats it

    calm_page = AppTest.from_file(APP, default_timeout=60)
    calm_page.query_params["run"] = calm
    calm_page.run()
    assert calm_page.success[0].value.startswith("finished: 4/4 requests succeeded")
    assert not any("Machine busy" in shown(w.value) for w in calm_page.warning)
