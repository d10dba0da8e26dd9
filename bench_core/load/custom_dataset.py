"""`--dataset-name custom`: a user's own prompts, from a JSON array or JSON Lines file whose records hold a
`prompt` (a string; a list is taken as messages, as LMDeploy's benchmark_chat_completion.py takes it) or OpenAI
`messages`, and optionally the output length as `output_len` or `max_tokens`.

Records are taken in the file's order, the first `num_prompts` of them. A record that is not one of these is
refused with its line number, before anything runs. Messages go as they are to a chat endpoint; elsewhere they are
rendered as a transcript (requests.render_transcript). A record without a length generates `output_len` tokens.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

import numpy as np

from ..config import DatasetConfig
from ..errors import DatasetError
from .base import Dataset
from .datasets import load_records, sample_read
from .requests import LENGTH_RULE, Sample, SampledRequest, is_length, record_refused, render_transcript, sample_of

LENGTH_KEYS = ("output_len", "max_tokens")
FORMAT = "each record needs a 'prompt' string or a 'messages' list of {'role', 'content'} objects"


def sample_custom_requests(records: list[tuple[int, Any]], source: str, tokenizer: Any, cfg: DatasetConfig) -> Sample:
    requests = []
    for line, record in records[: cfg.num_prompts]:
        prompt, messages, output_len = read_record(
            record, cfg.output_len, partial(record_refused, source, line, rule=FORMAT)
        )
        requests.append(SampledRequest(prompt, len(tokenizer.encode(prompt)), output_len, messages=messages))
    if not requests:
        raise DatasetError(f"Dataset {source} holds no record: {FORMAT}.")
    warnings = []
    if len(requests) < cfg.num_prompts:
        warnings.append(
            f"Only {len(requests):,} of the {cfg.num_prompts:,} requested prompts are in {source}; "
            f"the run goes on with {len(requests):,}."
        )
    sample = sample_of(requests, warnings=warnings)
    sample.arrival_rng = np.random.RandomState(cfg.seed)
    return sample


def read_record(record: Any, default_output_len: int, refuse) -> tuple[str, tuple | None, int]:
    """(prompt text, messages or None, output length) of one record; `refuse(why)` raises for a bad one."""
    if not isinstance(record, Mapping):
        refuse(f"it is a JSON {type(record).__name__}, not an object")
    prompt = record.get("prompt")
    messages = record.get("messages")
    if isinstance(prompt, list) and messages is None:
        messages, prompt = prompt, None
    if messages is not None:
        messages = _messages(messages, refuse)
        text = render_transcript(messages)
    elif isinstance(prompt, str) and prompt.strip():
        text = prompt
    else:
        refuse(
            "it has no 'prompt' string and no 'messages' list"
            if prompt is None
            else "its 'prompt' is empty or not a string"
        )
    output_len = default_output_len
    for key in LENGTH_KEYS:
        if key in record:
            value = record[key]
            if not is_length(value):
                refuse(f"its '{key}' must be {LENGTH_RULE}, not {value!r}")
            output_len = value
            break
    return text, messages, output_len


def _messages(messages: Any, refuse) -> tuple:
    if not isinstance(messages, list) or not messages:
        refuse("its 'messages' must be a non-empty list")
    for n, message in enumerate(messages, 1):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            refuse(f"its message {n} is not an object with a 'role'")
        content = message.get("content")
        if not isinstance(content, (str, list)):
            refuse(f"its message {n} has no 'content' text")
    return tuple(dict(message) for message in messages)


class Custom(Dataset):
    """Your JSON or JSONL records, each with a prompt string or OpenAI messages, and optionally output_len or
    max_tokens."""

    name = "custom"
    order = 5
    settings = ("output_len",)
    output_length = "output_len"
    own_file = "JSON or JSONL records with a prompt or messages"

    def sample(self, config: DatasetConfig, tokenizer: Any) -> Sample:
        return sample_read(
            load_records,
            config.dataset,
            lambda records: sample_custom_requests(records.records, records.source, tokenizer, config),
        )
