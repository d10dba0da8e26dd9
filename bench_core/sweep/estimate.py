"""How long a sweep's runs will take: before it starts, and for what is left while it runs.

A run's time is its output tokens over the output throughput that past runs of the same model on the same
backend measured, those most like it first (measure.time_left.past_pace: the same load pattern, dataset and
lengths, the nearest concurrency), as a running run's time left is told before its first token; a length the
dataset decides (ShareGPT's own) is what requests of that dataset produced there. The first run of each engine
setting adds the engine's load time. Without such runs, the embedded engine gets a rough CPU figure (stated
as such) and other backends no estimate. Pure: history rows in, seconds and the basis out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from ..config import EngineConfig, RunConfig
from ..engines import engine_settings_key
from ..measure.time_left import PastPace, past_pace
from .plan import PlannedRun

# Output tok/s of builtin:smollm2-135m on the embedded engine on 2 CPU cores busy with other work, by
# concurrency (medians of the default sweep's runs and of 8 x 64-token runs, measured: they vary 3-fold with
# the load); other concurrencies take the nearest. The engine's load, SmolLM2 cached, took 7-12 s.
ROUGH_CPU_TOK_S = {1: 8.0, 2: 11.0, 4: 10.0}
ROUGH_CPU_LOAD_S = 12.0
# The rough figure is for the embedded engine (the default backend, on a CPU here): other backends have none.
ROUGH_BACKEND = EngineConfig.backend
# ShareGPT conversations' own output lengths are known only once sampled: where no past run of the same dataset
# says how long its answers were, assumed this long each.
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
    paces = [past_pace(history_runs, planned.config) for planned in runs]
    if any(pace is None for pace in paces) and base.backend != ROUGH_BACKEND:
        return SweepEstimate(None, f"no finished run of {base.model} on {base.backend} to estimate from")
    seconds = 0.0
    engines = set()
    for planned, pace in zip(runs, paces):
        key = engine_settings_key(planned.config.engine, planned.config.load)
        if key not in engines and not (loaded and not engines):
            seconds += ROUGH_CPU_LOAD_S if pace is None or pace.load_seconds is None else pace.load_seconds
        engines.add(key)
        rate = _rough_rate(planned.config.load.concurrency) if pace is None else pace.tokens_per_s
        seconds += _output_tokens(planned.config, pace) / rate
    if paces[0] is None:
        basis = (
            f"a rough CPU estimate ({_rough_rate(1):g} tok/s at concurrency 1): no finished run of "
            f"{base.model} on {base.backend} in the history yet"
        )
    else:
        basis = f"from the output throughput of {paces[0].runs} finished run(s) of {base.model} on {base.backend}"
    return SweepEstimate(seconds, basis)


def describe_seconds(seconds: float) -> str:
    """'about 2 min 05 s', 'about 40 s'."""
    whole = max(round(seconds), 1)
    return f"about {whole // 60} min {whole % 60:02d} s" if whole >= 60 else f"about {whole} s"


def _rough_rate(concurrency: int) -> float:
    nearest = min(ROUGH_CPU_TOK_S, key=lambda known: abs(known - concurrency))
    return ROUGH_CPU_TOK_S[nearest]


def _output_tokens(config: RunConfig, pace: PastPace | None) -> float:
    data = config.dataset
    per_request = data.sharegpt_output_len if data.dataset_name == "sharegpt" else data.random_output_len
    if not per_request:
        known = pace.output_tokens_per_request if pace is not None else None
        per_request = known or ASSUMED_OUTPUT_TOKENS
    return data.num_prompts * per_request
