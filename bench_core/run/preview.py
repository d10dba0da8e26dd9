"""The workload a run would send, sampled before it starts, for the Run page's preview: the same sampler, seed and
tokenizer the run will use, so the lengths shown are the run's own.

Sampling needs the model's tokenizer, hence transformers, which the dashboard's process never imports (DESIGN.md):
so `preview_workload` samples in a short-lived child process (spawned, as the engine's worker is) and hands back
only the workload table and the sample's notes. A bad setting, dataset or tokenizer raises its one-sentence
BenchError here, as the run would.
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

import pandas as pd

from ..config import RunConfig
from ..engines import backend
from ..errors import BenchError
from .preflight import check_run

PREVIEW_TIMEOUT_S = 300.0  # a first use of SmolLM2 converts it (about 30 s on a busy CPU) before its tokenizer loads


@dataclass
class WorkloadPreview:
    """A sampled workload: one row per request (load.workload.workload_table), and what sampling said."""

    table: pd.DataFrame
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    tokenizer: str = ""


def tokenizer_name(config: RunConfig) -> str:
    """The tokenizer the run samples with: the model's; a server's named tokenizer, else its named model, else the
    first model it serves (asked over HTTP, as the run asks)."""
    engine = config.engine
    if backend(engine.backend).in_process:
        return engine.model
    if engine.tokenizer.strip() or engine.model.strip():
        return engine.tokenizer.strip() or engine.model.strip()
    from ..engines.openai_client import discover_model
    from ..engines.openai_engine import network_policy

    return discover_model(engine.base_url, engine.api_key, network=network_policy(engine))


def preview_workload(config: RunConfig, timeout_s: float = PREVIEW_TIMEOUT_S) -> WorkloadPreview:
    """Sample `config`'s requests in a child process; BenchError (ConfigError, DatasetError, ModelError) for what
    the run would refuse."""
    check_run(config)
    name = tokenizer_name(config)
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        try:
            return pool.submit(sample_workload, config, name).result(timeout=timeout_s)
        except BenchError:
            raise
        except TimeoutError:
            raise BenchError(f"Sampling the workload took over {timeout_s:g} s; it was abandoned.") from None
        except Exception as exc:  # the child's own failure (it died, say): one sentence, as for any other
            raise BenchError(f"Sampling the workload failed: {type(exc).__name__}: {exc}") from None


def sample_workload(config: RunConfig, tokenizer: str) -> WorkloadPreview:
    """In the child: sample as the runner does, and keep only what a figure needs."""
    from ..load.datasets import sample_requests
    from ..load.workload import workload_table
    from ..models.resolve import load_tokenizer

    sample = sample_requests(config.dataset, load_tokenizer(tokenizer, config.engine.trust_remote_code))
    return WorkloadPreview(workload_table(sample.requests), sample.notes, sample.warnings, tokenizer)
