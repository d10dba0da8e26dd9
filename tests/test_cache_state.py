"""The prefix cache's state at a run's start is a setting (`--cache-state`) and a recorded fact (`cache_start`): a
cold start drops the cache first (a server's reset endpoint, an embedded engine that builds its cache per run), a
warm one keeps what earlier runs left, and where nothing can drop it the run says the state is unknown."""

from __future__ import annotations

import pytest
from aiohttp import web
from openai_server import add_openai_routes, answer_as_prompted, serving
from sweep_cli import bench

from bench_core.config import DatasetConfig, EngineConfig, LoadConfig, RunConfig
from bench_core.run.runner import Runner
from bench_core.store.history import History

SHARED_PREFIX_FLAGS = (
    "--dataset-name",
    "shared-prefix",
    "-n",
    "8",
    "--prefix-len",
    "128",
    "--suffix-len",
    "16",
    "--output-len",
    "4",
)


@pytest.mark.slow
def test_an_embedded_shared_prefix_sweep_with_prefix_caching_starts_every_repeat_cold(tmp_path, tiny_model_path):
    done = bench(
        tmp_path,
        "sweep",
        "pipeline",
        "builtin:sharegpt",
        "builtin:tiny-llama",
        "--backend",
        "transformers",
        *SHARED_PREFIX_FLAGS,
        "--enable-prefix-caching",
        "--stream-output",
        "--results",
        "results",
        "--sweep",
        "concurrency=8",
        "--repeats",
        "2",
    )
    assert done.returncode == 0, done.stderr
    runs = History(tmp_path / "results").load()
    assert runs["cache_start"].tolist() == ["cold", "cold"]  # auto: cold, as prefix caching is on
    rates = runs["prefix_cache_hit_rate"].tolist()
    assert rates[0] > 0 and rates[0] == rates[1]  # the second repeat found nothing of the first's cached
    header, point = done.stdout.splitlines()[1:3]
    assert "prefix cache at start" in header and " cold " in point


def reset_recording_server(events: list[str], route: str, model: str = "m") -> web.Application:
    """A server of completions that notes each request and each POST to `route` (its prefix-cache reset)."""

    async def answer(request: web.Request, endpoint: str) -> web.StreamResponse:
        events.append("request")
        return await answer_as_prompted(request, endpoint, "ok")

    async def reset(request: web.Request) -> web.Response:
        events.append("reset")
        return web.json_response({})

    app = add_openai_routes(web.Application(), answer)
    app.router.add_post(route, reset)
    return app


@pytest.mark.slow
@pytest.mark.parametrize(("backend", "route"), [("vllm", "/reset_prefix_cache"), ("sglang-oai", "/flush_cache")])
def test_a_cold_server_sweep_calls_the_servers_reset_before_each_point(backend, route, tmp_path):
    events: list[str] = []
    with serving(reset_recording_server(events, route)) as url:
        done = bench(
            tmp_path,
            "sweep",
            "restful",
            "--backend",
            backend,
            "--base-url",
            url,
            "--model",
            "m",
            "--tokenizer",
            "builtin:tiny-llama",
            "--dataset-path",
            "builtin:sample",
            "--num-prompts",
            "2",
            "--sharegpt-output-len",
            "4",
            "--disable-warmup",
            "--no-server-metrics",
            "--output-file",
            "",
            "--results",
            "results",
            "--cache-state",
            "cold",
            "--sweep",
            "request_rate=50,100",
        )
    assert done.returncode == 0, done.stderr
    assert events == ["reset", "request", "request"] * 2
    assert History(tmp_path / "results").load()["cache_start"].tolist() == ["cold", "cold"]


def server_run(tmp_path, url: str, server_kind: str, cache_state: str):
    config = RunConfig(
        engine=EngineConfig(
            backend="openai", model="m", base_url=url, tokenizer="builtin:tiny-llama", server_kind=server_kind
        ),
        dataset=DatasetConfig(dataset="builtin:sample", num_prompts=2, sharegpt_output_len=4),
        load=LoadConfig(load_pattern="concurrency", concurrency=1, stream_output=True, cache_state=cache_state),
    )
    runner = Runner(History(tmp_path / "results"))
    try:
        run = runner.submit(config)
        assert run.wait(60) and run.state == "finished", run.message
        return run
    finally:
        runner.shutdown()


@pytest.mark.slow
def test_a_server_with_no_reset_starts_unknown_said_in_one_line_and_a_warm_start_resets_nothing(tmp_path):
    events: list[str] = []
    with serving(reset_recording_server(events, "/reset_prefix_cache")) as url:
        unknown = server_run(tmp_path, url, "lmdeploy", "cold")
        warm = server_run(tmp_path, url, "vllm", "warm")
    assert "reset" not in events
    assert unknown.record.cache_start == "unknown"
    (said,) = [w for w in unknown.measurement.warnings if w.startswith("Prefix cache state at the start unknown")]
    assert "a lmdeploy server has no prefix-cache reset" in said
    assert warm.record.cache_start == "warm" and not any("Prefix cache" in w for w in warm.measurement.warnings)


@pytest.mark.slow
def test_a_vllm_server_without_its_reset_route_starts_unknown_and_says_how_vllm_serves_it(tmp_path):
    events: list[str] = []
    with serving(reset_recording_server(events, "/elsewhere")) as url:
        run = server_run(tmp_path, url, "vllm", "cold")
    assert run.record.cache_start == "unknown" and "request" in events
    (said,) = [w for w in run.measurement.warnings if w.startswith("Prefix cache state at the start unknown")]
    assert said.endswith(
        "/reset_prefix_cache answered HTTP 404 Not Found (vLLM serves it only when started with "
        "VLLM_SERVER_DEV_MODE=1)."
    )


@pytest.mark.slow
def test_an_engine_here_that_keeps_its_cache_and_cannot_drop_it_is_reloaded_for_a_cold_start_without_warm_up(
    tmp_path, tiny_model_path, monkeypatch
):
    """LMDeploy's engines keep their prefix cache between runs and have no reset; they need a GPU, so the stand-in
    is the embedded engine told that its cache outlives a run (its real one does not)."""
    from bench_core.engines.transformers_engine import TransformersEngine
    from bench_core.run import runner as runner_module

    monkeypatch.setattr(TransformersEngine, "cache_per_run", False)
    loads = []
    real_load = runner_module.load_engine
    monkeypatch.setattr(runner_module, "load_engine", lambda *args: loads.append(args) or real_load(*args))

    def config(cache_state: str, warmup: int = 0) -> RunConfig:
        return RunConfig(
            engine=EngineConfig(backend="transformers", model="builtin:tiny-llama", enable_prefix_caching=True),
            dataset=DatasetConfig(dataset="builtin:sample", num_prompts=2, sharegpt_output_len=4),
            load=LoadConfig(concurrency=2, stream_output=True, cache_state=cache_state, warmup_requests=warmup),
        )

    runner = Runner(History(tmp_path / "results"))
    try:
        started = []
        for asked in (config("auto"), config("cold"), config("warm"), config("cold", warmup=1)):
            run = runner.submit(asked)
            assert run.wait(120) and run.state == "finished", run.message
            started.append((run.record.cache_start, len(loads), run.measurement.warnings))
    finally:
        runner.shutdown()
    # a warm-up would fill a reloaded engine's cache again: it is kept, and the run recorded warm
    assert [(state, count) for state, count, _ in started] == [("cold", 1), ("cold", 2), ("warm", 2), ("warm", 2)]
    assert not any("Prefix cache" in w for _, _, warnings in started[:3] for w in warnings)
    (said,) = [w for w in started[3][2] if w.startswith("Prefix cache")]
    assert said.startswith(
        "Prefix cache: warm, not cold: the transformers engine has no way to drop what its 1 warm-up"
    )
