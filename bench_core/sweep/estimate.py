"""How long a sweep's runs, or a single run, will take: before they start, and for what is left while they run.

A run's requests are its prompts (a multi-turn session's every turn), and its output tokens those requests ask for.
A run's time is its output tokens over the output throughput that past runs of the same model on the same
backend measured, those most like it first (measure.time_left.past_pace: the same load pattern, dataset and
lengths, the nearest concurrency), as a running run's time left is told before its first token; a length the
dataset decides (ShareGPT's own) is what requests of that dataset produced there. The first run of each engine
setting adds the engine's load time. Without such runs, the embedded engine gets a rough CPU figure (stated
as such) and other backends no estimate. Where the estimate is out of proportion (`out_of_proportion`), Start
asks to confirm first. Pure: history rows in, seconds and the basis out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import pandas as pd

from ..config import EngineConfig, RunConfig
from ..engines import engine_settings_key
from ..load import find_dataset, output_length
from ..measure.time_left import PastPace, past_pace
from .plan import PlannedRun, SweepPlan

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
# Start asks to confirm what takes longer than this at past runs' pace, or, with no such pace, sends more requests
# than this (LMDeploy's scripts default to 5,000 prompts on a GPU).
CONFIRM_ABOVE_S = 3600.0
CONFIRM_ABOVE_REQUESTS = 100_000


@dataclass(frozen=True)
class SweepEstimate:
    """Seconds the runs take (None: nothing to estimate from) and what the figure rests on (`rough`: some run has no
    past pace, only the rough CPU figure); the requests they send (at most: a dataset may hold fewer) and the output
    tokens those ask for."""

    seconds: float | None
    basis: str
    requests: int = 0
    output_tokens: float = 0.0
    rough: bool = False
    most: bool = False  # the requests and tokens are the most a search may send, not what it will


def plan_estimate(plan: SweepPlan, history_runs: pd.DataFrame) -> SweepEstimate:
    """What a sweep sends and how long it takes, before it starts. A capacity search runs as many probes as its load
    takes to find, so only its budget bounds it: the requests and tokens of as many probes as --find-max-probes allows
    at every point, and no duration (each probe's load is its own, and --find-max-time caps each point's search). A
    sweep with a target runs each point until it, at most --max-repeats times: the estimate is of that most. A tune
    runs as many trials as its budget, of points its search picks: the estimate is of as many of the space's first."""
    search = plan.find_max
    if plan.tune is not None:  # the search picks its points: as many as its budget, each run at most this often
        per_trial = plan.precision.max_repeats if plan.precision else plan.repeats
        trials = min(plan.tune.trials, len(plan.grid()))
        most = estimate(plan.points(per_trial)[: trials * per_trial], history_runs)
        return replace(
            most,
            basis=f"at most, {trials} trials of {per_trial} run(s) each, timed as the space's first points; "
            f"{most.basis}",
            most=True,
        )
    if plan.precision is not None:  # its target decides how many runs: as many as the cap allows, at most
        most = estimate(plan.points(plan.precision.max_repeats), history_runs)
        return replace(
            most,
            basis=f"at most, if every point runs --max-repeats {plan.precision.max_repeats} times; {most.basis}",
            most=True,
        )
    if search is None:
        return estimate(plan.points(), history_runs)
    configs = [plan.config_at(values) for values in plan.grid()]
    points = "its point" if len(configs) == 1 else f"each of its {len(configs)} points"
    return SweepEstimate(
        None,
        f"a search runs until it finds its load, at most {search.max_probes:,} probes (--find-max-probes) and "
        f"{describe_seconds(search.max_time_s).removeprefix('about ')} (--find-max-time) at {points}",
        search.max_probes * sum(requests_asked(config) for config in configs),
        search.max_probes * sum(_output_tokens(config, None) for config in configs),
        most=True,
    )


def estimate(runs: Sequence[PlannedRun], history_runs: pd.DataFrame, loaded: bool = False) -> SweepEstimate:
    """Time for `runs` in order; `loaded`: the first run's engine is already in memory (a running sweep)."""
    if not runs:
        return SweepEstimate(0.0, "nothing left to run")
    base = runs[0].config.engine
    paces = [past_pace(history_runs, planned.config) for planned in runs]
    requests = sum(requests_asked(planned.config) for planned in runs)
    tokens = [_output_tokens(planned.config, pace) for planned, pace in zip(runs, paces)]
    if any(pace is None for pace in paces) and base.backend != ROUGH_BACKEND:
        model = base.model or "the model each server serves"  # a sweep's servers name theirs once up
        basis = f"no finished run of {model} on {base.backend} to estimate from"
        return SweepEstimate(None, basis, requests, sum(tokens))
    seconds = 0.0
    engines: set[tuple] = set()
    for planned, pace, run_tokens in zip(runs, paces, tokens):
        key = engine_settings_key(planned.config.engine, planned.config.load)
        if key not in engines and not (loaded and not engines):
            seconds += ROUGH_CPU_LOAD_S if pace is None or pace.load_seconds is None else pace.load_seconds
        engines.add(key)
        rate = _rough_rate(planned.config.load.concurrency) if pace is None else pace.tokens_per_s
        seconds += run_tokens / rate
    if paces[0] is None:
        basis = (
            f"a rough CPU estimate ({_rough_rate(1):g} tok/s at concurrency 1): no finished run of "
            f"{base.model} on {base.backend} in the history yet"
        )
    else:
        basis = f"from the output throughput of {paces[0].runs} finished run(s) of {base.model} on {base.backend}"
    return SweepEstimate(seconds, basis, requests, sum(tokens), rough=any(pace is None for pace in paces))


def estimate_run(config: RunConfig, history_runs: pd.DataFrame) -> SweepEstimate:
    """One run's estimate, before Start: a sweep of that run alone."""
    return estimate([PlannedRun({}, 0, config)], history_runs)


def requests_asked(config: RunConfig) -> int:
    """The requests a run asks for: its prompts, or each session's every turn where the dataset counts sessions."""
    data = config.dataset
    ran = find_dataset(data.dataset_name)
    return data.num_prompts * (data.turns if ran is not None and ran.counts_sessions else 1)


def out_of_proportion(guess: SweepEstimate) -> str:
    """Why Start should ask before it runs this ("" where it need not): over an hour at past runs' pace, or, with no
    such pace to time it by, more requests than CONFIRM_ABOVE_REQUESTS. The rough CPU figure alone asks nothing: it is
    SmolLM2's, and another model runs at its own pace (the tiny test model a hundred times faster)."""
    timed = None if guess.rough else guess.seconds
    if timed is not None and timed > CONFIRM_ABOVE_S:
        return f"it would take {describe_seconds(timed)}"
    if timed is None and guess.requests > CONFIRM_ABOVE_REQUESTS:
        return f"it would send up to {guess.requests:,} requests"
    return ""


def describe_seconds(seconds: float) -> str:
    """'about 40 s', 'about 2 min 05 s', 'about 3 h 20 min', 'about 12 days'."""
    whole = max(round(seconds), 1)
    if whole < 60:
        return f"about {whole} s"
    if whole < 3600:
        return f"about {whole // 60} min {whole % 60:02d} s"
    minutes = round(whole / 60)
    if minutes < 48 * 60:
        return f"about {minutes // 60} h {minutes % 60:02d} min"
    return f"about {round(minutes / (24 * 60)):,} days"


def _rough_rate(concurrency: int) -> float:
    nearest = min(ROUGH_CPU_TOK_S, key=lambda known: abs(known - concurrency))
    return ROUGH_CPU_TOK_S[nearest]


def _output_tokens(config: RunConfig, pace: PastPace | None) -> float:
    """The output tokens the run's requests ask for: its dataset's fixed output length where set, else what requests
    of that dataset produced in past runs, else ASSUMED_OUTPUT_TOKENS each."""
    declared = output_length(config.dataset.dataset_name)
    per_request = getattr(config.dataset, declared.name) if declared is not None else None
    if not per_request:
        known = pace.output_tokens_per_request if pace is not None else None
        per_request = known or ASSUMED_OUTPUT_TOKENS
    return requests_asked(config) * per_request
