"""The checks a run passes before it starts: `check_run`, the one check of a run's settings before it is queued or
recorded (every page, command and sweep asks it, once per run); then, once its prompts are sampled, that its requests
fit the model's context (`check_requests`) and that a trace's replay ends within a schedule's bounds
(`check_schedule`).

A request holds its prompt and its output in the model's context, so input + output tokens must fit in the
window the backend gives a request (`engines.context_window`: the model's, LMDeploy's session_len when set, none
for a server, which enforces its own). The settings are checked when a run is submitted (`check_run`: the
lengths asked for), the sampled requests once the prompts are tokenized (`check_requests`: ShareGPT conversations
bring their own lengths). A request that does not fit refuses the whole run, naming the longest one and the
largest output length that would fit, rather than dropping prompts: the sample stays the one LMDeploy draws.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..config import EngineConfig, LoadConfig, RunConfig, setting
from ..config.validation import schedule_problems
from ..engines import availability, backend_rules, backends, context_window, run_config_problems
from ..errors import ConfigError, DatasetError
from ..load import output_length, takes
from ..load.datasets import SampledRequest
from ..models.resolve import model_problem
from ..states import LoadPattern

# Where no window is known: no model holds a million output tokens, and sizing a KV cache for one would
# try to allocate terabytes.
MAX_OUTPUT_TOKENS = 1_048_576


def length_problems(config: RunConfig) -> list[str]:
    """The output (and random input) lengths asked for that cannot fit the model's window, as sentences."""
    data = config.dataset
    random = takes(data.dataset_name, setting("random_input_len"))
    declared = output_length(data.dataset_name)
    output = getattr(data, declared.name) if declared is not None else None
    if output is None:
        return []  # lengths come from the conversations or the records: checked once they are sampled
    prompt = (data.random_input_len or 1) if random else 1  # a ShareGPT prompt has a token at least
    longest = output + prompt
    window = context_window(config.engine)
    if window is None:
        if output > MAX_OUTPUT_TOKENS:
            return [
                f"An output length of {output:,} tokens is more than any model can produce; "
                f"ask for at most {MAX_OUTPUT_TOKENS:,}."
            ]
        return []
    if longest > window:
        if not random:
            what, remedy = f"an output of {output:,} tokens plus its prompt", "lower the output length"
        else:
            what = f"input {data.random_input_len:,} + output {output:,} tokens"
            # An input that fills the window alone leaves no output length that fits.
            room = window - prompt
            remedy = f"lower the output length to {room:,} at most" if room > 0 else "lower the input length"
        return [
            f"A request of {what} does not fit the {window:,}-token context window of {config.engine.model}; {remedy}."
        ]
    return []


@dataclass(frozen=True)
class Preflighted:
    """A run's config that passed `check_run`: `Runner.submit` queues it as it is, so a run asked for once (a Start
    pressed, a command run) is checked once, however many steps it passes through before it is queued."""

    config: RunConfig


def model_problems(engine: EngineConfig) -> list[str]:
    """The model an in-process engine would load, where its name names nothing here (a server names its own)."""
    problem = model_problem(engine.model) if backend_rules(engine.backend).in_process else None
    return [problem] if problem else []


def run_problems(config: RunConfig) -> list[str]:
    """Every reason the run's settings refuse it, each a sentence for the user: its settings' bounds and combinations
    and its backend's rules (`engines.run_config_problems`) with a model that is not there (`model_problems`), then,
    once those hold, the lengths that cannot fit its model's window (`length_problems`)."""
    return run_config_problems(config) + model_problems(config.engine) or length_problems(config)


def check_run(config: RunConfig) -> Preflighted:
    """The check a run passes before anything is queued, asked or recorded: ConfigError carrying every problem known
    before loading, all at once: its settings' (`run_problems`) and why this machine cannot run its backend."""
    problems = run_problems(config)
    if config.engine.backend in backends() and (reason := availability(config.engine.backend)):
        problems.append(reason)
    if problems:
        raise ConfigError(" ".join(problems))
    return Preflighted(config)


def check_schedule(requests: Sequence[SampledRequest], load: LoadConfig) -> None:
    """Refuse a trace whose replay sends its last request later than a schedule may (schedule_problems): its
    timestamps are known once it is read."""
    if load.load_pattern != LoadPattern.TRACE:
        return
    span_s = max((request.send_at_s or 0.0 for request in requests), default=0.0) / load.trace_speedup
    problems = schedule_problems(span_s, load.allow_long_schedule, f"The trace at speed-up {load.trace_speedup:g}")
    if problems:
        raise DatasetError(" ".join(problems))


def check_requests(requests: Sequence[SampledRequest], engine: EngineConfig) -> None:
    """Refuse a sample whose requests do not fit the window; DatasetError names the longest and what fits."""
    window = context_window(engine)
    if window is None:
        return
    too_long = [r for r in requests if r.input_len + r.output_len > window]
    if not too_long:
        return
    longest = max(too_long, key=lambda r: r.input_len + r.output_len)
    longest_prompt = max(r.input_len for r in requests)
    raise DatasetError(
        f"{len(too_long):,} of {len(requests):,} sampled requests do not fit the {window:,}-token context window "
        f"of {engine.model} (the longest: {longest.input_len:,} input + {longest.output_len:,} output tokens). "
        f"Lower the output length to at most {max(window - longest_prompt, 0):,} tokens, or sample fewer or "
        "shorter prompts."
    )
