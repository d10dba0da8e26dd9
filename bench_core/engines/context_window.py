"""The model's context window, read cheaply, and the checks that keep a run's requests inside it.

A request holds its prompt and its output in the model's context, so input + output tokens must fit
in the window. The window comes from the model's config.json (`max_position_embeddings` or its other
spellings) without loading weights or building anything: built-ins know theirs, a local folder or a
cached hub id is read from disk. LMDeploy's `session_len`, when set, is the window its engines use.
A server (the openai backend) enforces its own window, so nothing is checked for it here.

The settings are checked when a run is submitted (`check_settings`: the lengths asked for), the sampled
requests once the prompts are tokenized (`check_requests`: ShareGPT conversations bring their own
lengths). A request that does not fit refuses the whole run, naming the longest one and the largest
output length that would fit, rather than dropping prompts: the sample stays the one LMDeploy draws.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from ..config import LMDEPLOY_BACKENDS, SERVER_BACKEND, EngineConfig, RunConfig
from ..load.datasets import SampledRequest
from ..errors import ConfigError, DatasetError
from ..models.resolve import CACHED_MODEL_PREFIXES, known_context_window

WINDOW_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "max_sequence_length")
# Where no window is known: no model holds a million output tokens, and sizing a KV cache for one would
# try to allocate terabytes.
MAX_OUTPUT_TOKENS = 1_048_576


def context_window(engine: EngineConfig) -> int | None:
    """Tokens of context the engine gives a request; None when unknown (a server, an unreadable config)."""
    if engine.backend == SERVER_BACKEND:
        return None
    if engine.backend in LMDEPLOY_BACKENDS and engine.session_len:
        return engine.session_len
    name = str(engine.model).strip()
    if name.startswith(CACHED_MODEL_PREFIXES):
        return known_context_window(name)
    path = _config_path(name)
    if path is None:
        return None
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # loading the model will say what is wrong with it
    return window_of(config)


def window_of(config: dict) -> int | None:
    """The window a Hugging Face config.json declares, at its top level or in its text model's part."""
    for part in (config, config.get("text_config") or {}):
        for key in WINDOW_KEYS:
            value = part.get(key)
            if isinstance(value, int) and value > 0:
                return value
    return None


def _config_path(name: str) -> Path | None:
    folder = Path(name).expanduser()
    if folder.is_dir():
        path = folder / "config.json"
        return path if path.is_file() else None
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    try:
        cached = try_to_load_from_cache(name, "config.json")
    except Exception:  # not a valid hub id: loading the model will say so
        return None
    return Path(cached) if isinstance(cached, str) else None


def length_problems(config: RunConfig) -> list[str]:
    """The output (and random input) lengths asked for that cannot fit the model's window, as sentences."""
    data = config.dataset
    random = data.dataset_name == "random"
    output = data.random_output_len if random else data.sharegpt_output_len
    if output is None:
        return []  # lengths come from the conversations: checked once they are sampled
    longest = output + ((data.random_input_len or 1) if random else 1)  # a ShareGPT prompt has a token at least
    window = context_window(config.engine)
    if window is None:
        if output > MAX_OUTPUT_TOKENS:
            return [f"An output length of {output:,} tokens is more than any model can produce; "
                    f"ask for at most {MAX_OUTPUT_TOKENS:,}."]
        return []
    if longest > window:
        what = f"input {data.random_input_len:,} + output {output:,} tokens" if random else (
            f"an output of {output:,} tokens plus its prompt")
        return [f"A request of {what} does not fit the {window:,}-token context window of "
                f"{config.engine.model}; lower the output length."]
    return []


def check_settings(config: RunConfig) -> None:
    """Raise ConfigError when the lengths asked for cannot fit the model's window (see length_problems)."""
    problems = length_problems(config)
    if problems:
        raise ConfigError(" ".join(problems))


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
