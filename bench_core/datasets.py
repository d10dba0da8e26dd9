"""Prompts for a benchmark: ShareGPT (JSON or JSONL, built-in or a user file) and random-length
requests, sampled with the rules of LMDeploy's profile_pipeline_api.py.

CONTRACT STUB - the datasets helper replaces the bodies; keep the names and fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class SampledRequest:
    prompt: str
    input_len: int
    output_len: int


@dataclass
class Conversations:
    """First-two-turn (prompt, completion) pairs read from a ShareGPT-format source."""

    pairs: list[tuple[str, str]]
    source: str
    notes: list[str] = field(default_factory=list)  # e.g. "truncated file: recovered 17,671 records"


@dataclass
class Sample:
    requests: list[SampledRequest]
    total_input_tokens: int
    total_output_tokens: int
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def load_conversations(source: str) -> Conversations:
    raise NotImplementedError


def sample_requests(dataset_config, tokenizer) -> Sample:
    raise NotImplementedError
