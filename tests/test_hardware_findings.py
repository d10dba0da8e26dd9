"""Issue 14 wired through a run: telemetry sampled and recorded, the roofline verdict printed and kept, synthetic
models named anywhere a model is, on the real tiny models and the embedded engine (CPU)."""

import json
import time

import pandas as pd
import pytest

from bench_core.cli import main
from bench_core.config import EngineConfig
from bench_core.engines import context_window
from bench_core.hardware import roofline
from bench_core.hardware.telemetry import CPU_CORES, PROCESS, RSS_BYTES, SAMPLE_COLUMNS, TELEMETRY_FILE
from bench_core.measure import catalog
from bench_core.measure.live_snapshot import TELEMETRY_WINDOW_S
from bench_core.models.resolve import PICKABLE_MODELS, synthetic_is_built
from bench_core.run.runner import Runner
from bench_core.store.history import History

SAMPLED_ON_CPU = ("mean_process_cpu_cores", "peak_process_rss_gib")


@pytest.fixture(scope="module")
def cli_runs(tmp_path_factory):
    """A tiny-llama run and a synthetic tiny run through the CLI, with a fresh model cache (so the copy benchmark
    runs here, once) and the number of times it measured."""
    work = tmp_path_factory.mktemp("hardware")
    measured = []
    real_measure = roofline.measure_copy_bandwidth
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("BENCH_STUDIO_CACHE", str(work / "cache"))
        patch.setattr(roofline, "measure_copy_bandwidth", lambda: measured.append(1) or real_measure())
        outputs = {}
        for model in ("builtin:tiny-llama", "synthetic:tiny"):
            capture = _Capture()
            with capture:
                code = main(
                    [
                        "pipeline",
                        "builtin:sample",
                        model,
                        "--backend",
                        "transformers",
                        "-n",
                        "3",
                        "-c",
                        "2",
                        "--sharegpt-output-len",
                        "16",
                        "--stream-output",
                        "--csv",
                        "",
                        "--results",
                        str(work / "results"),
                    ]
                )
            assert code == 0, capture.text
            outputs[model] = capture.text
    return work, outputs, measured


class _Capture:
    """stdout and stderr of an in-process CLI call, as one text."""

    def __enter__(self):
        import contextlib
        import io

        self._buffer = io.StringIO()
        self._stack = contextlib.ExitStack()
        self._stack.enter_context(contextlib.redirect_stdout(self._buffer))
        self._stack.enter_context(contextlib.redirect_stderr(self._buffer))
        return self

    def __exit__(self, *exc):
        self._stack.close()
        self.text = self._buffer.getvalue()


@pytest.mark.slow
@pytest.mark.parametrize("model", ["builtin:tiny-llama", "synthetic:tiny"])
def test_a_cli_run_prints_its_telemetry_and_roofline_verdict_after_the_tables(cli_runs, model):
    _, outputs, _ = cli_runs
    out = outputs[model]
    assert out.index("Decode tokens/s per request") < out.index("Telemetry: ") < out.index("Roofline verdict: ")
    assert f"Random-weight run ({model})" in out
    assert "Engine process CPU" in out and "Peak engine process memory (RSS)" in out
    # A model of a few hundred thousand parameters cannot load a CPU's memory bus: the host is the limit.
    assert f"Roofline verdict: {roofline.HOST_BOUND}." in out
    assert "per step x" in out and "steps/s" in out


@pytest.mark.slow
@pytest.mark.parametrize("model", ["builtin:tiny-llama", "synthetic:tiny"])
def test_a_cli_run_keeps_its_samples_verdict_and_model_kind_in_the_history(cli_runs, model):
    work, _, _ = cli_runs
    history = History(work / "results")
    runs = history.load()
    row = runs[runs["model"] == model].iloc[0]
    for column in SAMPLED_ON_CPU:
        assert row[column] > 0, column
    assert pd.isna(row.get("mean_gpu_util_percent", float("nan")))  # no GPU here: not measured, not zero
    assert bool(row["model_random_weights"]) is True
    assert row["model_kind"] == ("synthetic" if model.startswith("synthetic:") else "builtin")
    assert row["roofline_bound"] == roofline.HOST_BOUND and 0 < row["roofline_bandwidth_share"] < 0.5

    run_id = row["run_id"]
    assert (history.run_dir(run_id) / TELEMETRY_FILE).exists()
    samples = history.telemetry(run_id)
    assert list(samples.columns) == list(SAMPLE_COLUMNS)
    duration = row["duration_s"]
    rss = samples[(samples["source"] == PROCESS) & (samples["metric"] == RSS_BYTES)]
    # On the run's own clock, from the sample the sampler takes as it starts, before the run's start, to the one it
    # takes as it stops, after the run's end; how many come in between is the sampler thread's turns on this machine.
    assert len(rss) >= 2 and rss["time_s"].min() <= 0 and rss["time_s"].max() >= duration
    assert (samples["metric"] == CPU_CORES).any()
    verdict = history.roofline(run_id)
    assert verdict["bound"] == roofline.HOST_BOUND and verdict["numbers"]["decode_steps_per_s"] > 0


def test_the_copy_benchmark_runs_once_per_machine_and_the_verdict_says_where_it_is_kept(cli_runs):
    work, outputs, measured = cli_runs
    assert measured == [1]  # the second run read the first run's measurement
    cache_file = work / "cache" / roofline.BANDWIDTH_CACHE_FILE
    (entry,) = json.loads(cache_file.read_text()).values()
    shown = f"{entry['copy_bytes_per_s'] / 1e9:,.1f} GB/s, measured once per machine and cached in {cache_file}"
    assert all(shown in out for out in outputs.values())


def test_a_model_without_a_config_gets_no_roofline_in_one_line():
    record = {"unavailable": "its config.json is not readable here (/nowhere/config.json)"}
    assert roofline.describe_roofline(record) == [f"{roofline.NO_ROOFLINE}: {record['unavailable']}."]


def _two_streamed_requests():
    from bench_core.config import DatasetConfig, LoadConfig, RunConfig

    return RunConfig(
        engine=EngineConfig(backend="transformers", model="builtin:tiny-llama"),
        dataset=DatasetConfig(dataset="builtin:sample", num_prompts=2, sharegpt_output_len=8),
        load=LoadConfig(concurrency=2, stream_output=True),
    )


def test_the_live_snapshot_carries_the_last_minute_of_samples_on_the_runs_clock(tiny_model_path):
    runner = Runner()
    run = runner.submit(_two_streamed_requests())
    try:
        assert run.wait(60) and run.state == "finished", run.message
    finally:
        runner.shutdown()
    snap = run.snapshot()
    now = time.perf_counter() - run.profiler.t_start  # on the run's clock: no sample can be later
    assert snap.telemetry is not None and set(snap.telemetry["source"]) >= {PROCESS}
    times, recorded = snap.telemetry["time_s"], run.measurement.telemetry
    # From the sampler's start, before the run's, to its stop, after the run's end, on the run's clock.
    assert times.min() <= 0 <= snap.elapsed_s <= times.max() <= now
    # The record's samples of the last TELEMETRY_WINDOW_S, and the core count, sampled first, that every window has.
    inside = (recorded["time_s"] >= snap.elapsed_s - TELEMETRY_WINDOW_S).to_numpy(copy=True)
    inside[0] = True
    pd.testing.assert_frame_equal(snap.telemetry.reset_index(drop=True), recorded[inside].reset_index(drop=True))
    assert len(recorded) == len(run.measurement.sampler.samples())  # the record keeps every sample


def test_synthetic_models_have_their_shapes_context_window_without_being_built():
    name = "synthetic:llama-3.1-8b:layers=1"
    assert context_window(EngineConfig(backend="transformers", model=name)) == 131072
    assert not synthetic_is_built(name)


def test_the_model_picker_offers_every_synthetic_preset_with_its_size():
    assert "synthetic:llama-3.2-1b" in PICKABLE_MODELS and "synthetic:qwen2.5-7b" in PICKABLE_MODELS
    assert "1.24 B parameters" in PICKABLE_MODELS["synthetic:llama-3.2-1b"]


def test_telemetry_metrics_are_declared_once_and_compared_like_any_metric():
    sampled = [metric for metric in catalog.CATALOG if metric.sampled is not None]
    assert {metric.key for metric in sampled} >= {
        "mean_gpu_util_percent",
        "peak_gpu_memory_gib",
        "mean_gpu_power_w",
        "energy_per_output_token_j",
        *SAMPLED_ON_CPU,
    }
    energy = catalog.METRICS["energy_per_output_token_j"]
    assert energy.unit == "J/token" and energy.larger_is_better is False
    assert (
        "energy_per_output_token_j" in catalog.COMPARED_COLUMNS and "energy_per_output_token_j" in catalog.SWEPT_COLUMNS
    )
    summary = {"energy_per_output_token_j": 0.25, "peak_gpu_memory_bytes": 2 * 1024**3, "mean_gpu_util_percent": None}
    assert catalog.telemetry_columns(summary) == {"peak_gpu_memory_gib": 2.0, "energy_per_output_token_j": 0.25}


@pytest.mark.slow
def test_lmdeploy_gets_the_cached_folder_of_a_synthetic_model(tmp_path, monkeypatch):
    from bench_core.engines import lmdeploy_pipeline

    monkeypatch.setenv("BENCH_STUDIO_CACHE", str(tmp_path))
    folder = lmdeploy_pipeline.local_model_path("synthetic:tiny")
    assert folder.startswith(str(tmp_path)) and (tmp_path / folder / "config.json").exists()


@pytest.mark.slow
def test_loading_a_synthetic_model_for_the_first_time_says_it_is_building_it(tmp_path, monkeypatch):
    from bench_core.config import DatasetConfig, LoadConfig, RunConfig
    from bench_core.run import runner as runner_module

    monkeypatch.setenv("BENCH_STUDIO_CACHE", str(tmp_path))
    runner = Runner()
    phases = []
    real_resolve = runner_module.resolve_model
    monkeypatch.setattr(
        runner_module, "resolve_model", lambda name: phases.append(runner.runs()[0].phase) or real_resolve(name)
    )
    config = RunConfig(
        engine=EngineConfig(backend="transformers", model="synthetic:tiny"),
        dataset=DatasetConfig(dataset="builtin:sample", num_prompts=1, sharegpt_output_len=4),
        load=LoadConfig(concurrency=1),
    )
    run = runner.submit(config)
    try:
        assert run.wait(60) and run.state == "finished", run.message
    finally:
        runner.shutdown()
    assert phases == ["building synthetic:tiny with random weights, once (0.34 M parameters, 0.7 MB in bfloat16)"]


@pytest.mark.slow
def test_telemetry_crosses_from_the_engine_process_live_and_into_the_record(tmp_path, tiny_model_path):
    from bench_core.run.engine_process import ProcessRunner

    runner = ProcessRunner(History(tmp_path))
    run = runner.submit(_two_streamed_requests())
    try:
        assert run.wait(120) and run.state == "finished", run.message
    finally:
        runner.shutdown()
    live = run.measurement.live  # the last snapshot the worker published
    assert live.telemetry is not None and (live.telemetry["source"] == PROCESS).any()
    assert len(run.record.telemetry) >= len(live.telemetry)
    assert run.record.metrics["peak_process_rss_gib"] > 0
    assert History(tmp_path).telemetry(run.run_id) is not None
