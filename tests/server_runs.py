"""One run of the tiny tokenizer's prompts against an OpenAI-compatible server, through the dashboard's Runner."""

from __future__ import annotations

from bench_core.config import DatasetConfig, EngineConfig, LoadConfig, RunConfig
from bench_core.run.lifecycle import Run
from bench_core.run.runner import Runner
from bench_core.store.history import History


def server_run(tmp_path, base_url: str, *, num_prompts: int = 4, output_len: int = 8, **engine) -> Run:
    """A streamed run at concurrency 1 without warm-up, recorded under tmp_path/results; `engine` overrides the
    server settings (model "m" unless given)."""
    config = RunConfig(
        engine=EngineConfig(
            **{"backend": "openai", "model": "m", "base_url": base_url, "tokenizer": "builtin:tiny-llama", **engine}
        ),
        dataset=DatasetConfig(dataset="builtin:sample", num_prompts=num_prompts, sharegpt_output_len=output_len),
        load=LoadConfig(load_pattern="concurrency", concurrency=1, stream_output=True, warmup_requests=0),
    )
    runner = Runner(History(tmp_path / "results"))
    try:
        run = runner.submit(config)
        assert run.wait(60)
        return run
    finally:
        runner.shutdown()
