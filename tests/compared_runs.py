"""Five real runs of the tiny model to compare, as a user picks them: random prompts asking 8 tokens and
ShareGPT prompts fixed at 16, at concurrency 2, 4 and 8, one of them not streamed. The first two differing
settings (dataset, output length) do not tell the two ShareGPT runs apart; their concurrency does. No labels:
the runs are known by their ids, as the History page lists them.
"""

from __future__ import annotations

from pathlib import Path

from bench_core.config import DatasetConfig, EngineConfig, LoadConfig, RunConfig
from bench_core.run.runner import Runner
from bench_core.store.history import History

RUN_TIMEOUT_S = 120
# (dataset name, concurrency, streamed), in the order they run.
FIVE = (("random", 2, True), ("sharegpt", 2, True), ("sharegpt", 8, True), ("random", 4, True), ("random", 4, False))
NOT_STREAMED = 4  # the position of the run without TTFT or ITL


def compared_config(dataset_name: str, concurrency: int, streamed: bool) -> RunConfig:
    lengths = (
        dict(random_input_len=16, random_output_len=8, random_range_ratio=1.0)
        if dataset_name == "random"
        else dict(sharegpt_output_len=16)
    )
    return RunConfig(
        engine=EngineConfig(backend="transformers", model="builtin:tiny-llama"),
        dataset=DatasetConfig(dataset="builtin:sample", dataset_name=dataset_name, num_prompts=8, **lengths),
        load=LoadConfig(concurrency=concurrency, stream_output=streamed),
    )


def record_five_runs(results: Path) -> list[str]:
    """Run the five into the history at `results`; their run ids, in `FIVE`'s order."""
    runner = Runner(History(results))
    try:
        runs = [runner.submit(compared_config(*run)) for run in FIVE]
        for run in runs:
            assert run.wait(RUN_TIMEOUT_S) and run.state == "finished", run.message
    finally:
        runner.shutdown()
    return [run.run_id for run in runs]
