"""How long a sweep's runs will take: before it starts, and for what is left while it runs.

A run's time is its output tokens over the output throughput that past runs of the same model on the same
backend measured, at its concurrency or the nearest one the history has; the first run of each engine
setting adds the engine's load time. Without such runs, the embedded engine gets a rough CPU figure (stated
as such) and other backends no estimate. Pure: history rows in, seconds and the basis out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..config import EngineConfig, RunConfig
from ..engines import engine_settings_key
from ..states import RunState
from .plan import PlannedRun

# Output tok/s of builtin:smollm2-135m on the embedded engine on 2 CPU cores busy with other work, by
# concurrency (medians of the default sweep's runs and of 8 x 64-token runs, measured: they vary 3-fold with
# the load); other concurrencies take the nearest. The engine's load, SmolLM2 cached, took 7-12 s.
ROUGH_CPU_TOK_S = {1: 8.0, 2: 11.0, 4: 10.0}
ROUGH_CPU_LOAD_S = 12.0
# The rough figure is for the embedded engine (the default backend, on a CPU here): other backends have none.
ROUGH_BACKEND = EngineConfig.backend
# ShareGPT conversations' own output lengths are known only once sampled: assumed this long each.
ASSUMED_OUTPUT_TOKENS = 256


@dataclass(frozen=True)
class SweepEstimate:
    """Seconds the runs take (None: nothing to estimate from) and what the figure rests on."""

    seconds: float | None
    basis: str


def estimate(runs: Sequence[PlannedRun], history_runs: pd.DataFrame, loaded: bool = False) -> SweepEstimate:
    """Time for `runs` in order; `loaded`: the first run's engine is already in memory (a running sweep)."""
    if not runs:
        return SweepEstimate(0.0, "nothing left to run")
    base = runs[0].config.engine
    past = _past_runs(history_runs, base.model, base.backend)
    if past.empty and base.backend != ROUGH_BACKEND:
        return SweepEstimate(None, f"no finished run of {base.model} on {base.backend} to estimate from")
    seconds = 0.0
    engines = set()
    for planned in runs:
        key = engine_settings_key(planned.config.engine, planned.config.load)
        if key not in engines and not (loaded and not engines):
            seconds += _load_seconds(past)
        engines.add(key)
        seconds += _output_tokens(planned.config) / _rate(past, planned.config.load.concurrency)
    if past.empty:
        basis = (f"a rough CPU estimate ({_rough_rate(1):g} tok/s at concurrency 1): no finished run of "
                 f"{base.model} on {base.backend} in the history yet")
    else:
        basis = f"from the output throughput of {len(past)} finished run(s) of {base.model} on {base.backend}"
    return SweepEstimate(seconds, basis)


def describe_seconds(seconds: float) -> str:
    """'about 2 min 05 s', 'about 40 s'."""
    whole = max(round(seconds), 1)
    return f"about {whole // 60} min {whole % 60:02d} s" if whole >= 60 else f"about {whole} s"


def _past_runs(history_runs: pd.DataFrame, model: str, backend: str) -> pd.DataFrame:
    """Finished runs of this model on this backend with a measured output throughput."""
    needed = ("model", "backend", "status", "output_throughput", "concurrency")
    if history_runs.empty or any(column not in history_runs for column in needed):
        return pd.DataFrame(columns=[*needed, "load_seconds"])
    rows = history_runs[(history_runs["model"].astype(str) == model) & (history_runs["backend"].astype(str) == backend)
                        & (history_runs["status"].astype(str) == RunState.FINISHED)].copy()
    for column in ("output_throughput", "concurrency", "load_seconds"):
        rows[column] = pd.to_numeric(rows[column], errors="coerce") if column in rows else math.nan
    return rows[rows["output_throughput"] > 0]


def _rate(past: pd.DataFrame, concurrency: int) -> float:
    """Median output tok/s of the past runs at the concurrency nearest this one."""
    if past.empty:
        return _rough_rate(concurrency)
    at = past.dropna(subset=["concurrency"])
    if at.empty:
        return float(past["output_throughput"].median())
    nearest = at["concurrency"].iloc[int(np.argmin(np.abs(at["concurrency"].to_numpy() - concurrency)))]
    return float(at.loc[at["concurrency"] == nearest, "output_throughput"].median())


def _rough_rate(concurrency: int) -> float:
    nearest = min(ROUGH_CPU_TOK_S, key=lambda known: abs(known - concurrency))
    return ROUGH_CPU_TOK_S[nearest]


def _load_seconds(past: pd.DataFrame) -> float:
    loads = past["load_seconds"].dropna() if "load_seconds" in past else pd.Series(dtype=float)
    return float(loads.median()) if not loads.empty else ROUGH_CPU_LOAD_S


def _output_tokens(config: RunConfig) -> int:
    data = config.dataset
    per_request = data.sharegpt_output_len if data.dataset_name == "sharegpt" else data.random_output_len
    return data.num_prompts * (per_request or ASSUMED_OUTPUT_TOKENS)
