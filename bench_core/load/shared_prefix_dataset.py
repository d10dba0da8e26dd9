"""`--dataset-name shared-prefix`: groups of prompts that open with one prefix, then a suffix of their own (vLLM's
prefix_repetition, SGLang's generated-shared-prefix): the workload on which prefix caching cuts TTFT.

The text is ShareGPT's, cut to token lengths as LMDeploy's random dataset cuts it: `prefix_groups` prefixes of
`prefix_len` tokens, and per prompt a suffix of `suffix_len` tokens after a newline, so the prefix always ends on
a token boundary and the prompts of a group share its tokens exactly. `prefix_share` of the prompts open with
their group's prefix; the others open with a prefix of their own, of the same length, so a run at share 0 sends
the same lengths with nothing to reuse. Prompts arrive leaders-first (interleaved, but a group's other prompts
are sent once its first has finished, so that they find its prefix cached whatever the load: prompts prefilled
together find little cached), interleaved (one of each group in turn), grouped, or shuffled. Each request's
`facts` say its group and how many of its leading tokens it shares with the other prompts of its group (0 for a
prefix of its own), as tokenized.
"""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np

from ..config import DatasetConfig, LoadConfig
from ..config.catalog import LEADERS_FIRST
from ..states import LoadPattern
from .base import Dataset
from .datasets import prompt_texts, sample_conversations
from .requests import Sample, SampledRequest, TokenSupply, common_prefix_len, sample_of

SEPARATOR = "\n"  # between a prefix and its suffix: a token boundary for the tokenizers in use


def group_order(num_prompts: int, groups: int, order: str, rng: random.Random) -> list[int]:
    """The group of each prompt, in the order they are sent: groups of sizes as even as can be (the first ones one
    larger), interleaved round-robin (leaders-first too: its waits are `leaders`'), grouped one after another, or
    shuffled."""
    sizes = [num_prompts // groups + (g < num_prompts % groups) for g in range(groups)]
    if order == "grouped":
        return [g for g, size in enumerate(sizes) for _ in range(size)]
    interleaved = [g for round_ in range(max(sizes, default=0)) for g, size in enumerate(sizes) if round_ < size]
    if order == "random":
        rng.shuffle(interleaved)
    return interleaved


def sample_shared_prefix_requests(texts: list[str], tokenizer: Any, cfg: DatasetConfig) -> Sample:
    rng = random.Random(cfg.seed)
    supply = TokenSupply(texts, tokenizer, rng)
    groups = min(cfg.prefix_groups, cfg.num_prompts)
    prefixes = [supply.text(cfg.prefix_len) for _ in range(groups)]
    order = group_order(cfg.num_prompts, groups, cfg.prefix_order, rng)
    reusing = set(rng.sample(range(cfg.num_prompts), round(cfg.prefix_share * cfg.num_prompts)))
    prompts, owned = [], []
    for index, group in enumerate(order):
        prefix = prefixes[group] if index in reusing else supply.text(cfg.prefix_len)
        prompts.append(prefix + SEPARATOR + supply.text(cfg.suffix_len))
        owned.append(index not in reusing)
    encoded = [tokenizer.encode(prompt) for prompt in prompts]
    shared = _shared_tokens(encoded, order, owned)
    follows = leaders(order, owned) if cfg.prefix_order == LEADERS_FIRST else [None] * len(order)
    requests = [
        SampledRequest(
            prompt,
            len(ids),
            cfg.output_len,
            follows=leader,
            facts={"prefix_group": group, "shared_prefix_tokens": tokens or 0},
        )
        for prompt, ids, group, tokens, leader in zip(prompts, encoded, order, shared, follows)
    ]
    notes = [
        f"{len(reusing):,} of {cfg.num_prompts:,} prompts reuse one of {groups} prefixes of {cfg.prefix_len:,} tokens"
    ]
    warnings = []
    short = [tokens for tokens in shared if tokens is not None and tokens < cfg.prefix_len]
    if short:
        warnings.append(
            f"{len(short)} prompts share fewer tokens with their group than the prefix length "
            f"(as few as {min(short)} of {cfg.prefix_len}): this tokenizer merges tokens across the "
            "prefix's end."
        )
    sample = sample_of(requests, warnings=warnings, notes=notes)
    sample.arrival_rng = np.random.RandomState(cfg.seed)
    return sample


def leaders(order: list[int], owned: list[bool]) -> list[int | None]:
    """Per prompt, the prompt it waits for under leaders-first: its group's first prompt reusing the prefix, for
    the group's other prompts reusing it; None for that first one and for a prompt with a prefix of its own."""
    first: dict[int, int] = {}
    waits: list[int | None] = []
    for index, (group, alone) in enumerate(zip(order, owned)):
        if alone:
            waits.append(None)
        else:
            waits.append(first.get(group))
            first.setdefault(group, index)
    return waits


def _shared_tokens(encoded: list[list[int]], order: list[int], owned: list[bool]) -> list[int | None]:
    """Per prompt, the leading tokens it has in common with every other prompt of its group that reuses the
    prefix; None for a prompt with a prefix of its own, or alone in reusing its group's (it shares nothing)."""
    members: dict[int, list[int]] = {}
    for index, (group, alone) in enumerate(zip(order, owned)):
        if not alone:
            members.setdefault(group, []).append(index)
    shared: list[int | None] = [None] * len(encoded)
    for indices in members.values():
        if len(indices) < 2:
            continue
        first = encoded[indices[0]]
        tokens = min(common_prefix_len(first, encoded[i]) for i in indices[1:])
        for index in indices:
            shared[index] = tokens
    return shared


def prompts_at_once(load: LoadConfig, num_prompts: int) -> int | None:
    """How many prompts the load sends at the same instant: all of a batch or of an infinite rate (in flight up to
    the concurrency or the max concurrency), a concurrency's workers' first picks; None where they are spread in
    time (a finite rate, a trace)."""
    if load.load_pattern == LoadPattern.BATCH:
        return num_prompts
    if load.load_pattern in (LoadPattern.CONCURRENCY, LoadPattern.ENGINE_API):
        return min(num_prompts, load.concurrency)
    if load.load_pattern == LoadPattern.REQUEST_RATE and math.isinf(load.request_rate):
        return min(num_prompts, load.max_concurrency or num_prompts)
    return None


def hidden_reuse_note(dataset: DatasetConfig, load: LoadConfig, caching: bool) -> str:
    """Why a shared-prefix run with prefix caching on can show little of its effect on TTFT, "" where nothing hides
    it: prompts sent at the same instant queue behind each other's prefills, and a prompt finds a prefix cached only
    once the engine has computed it for an earlier one; at most the prompts after each group's first can, and only
    where the engine prefills that first one before them. Leaders-first sends those after it."""
    if not caching or dataset.prefix_order == LEADERS_FIRST:
        return ""
    at_once = prompts_at_once(load, dataset.num_prompts)
    if at_once is None or at_once < 2:
        return ""
    reusing = round(dataset.prefix_share * dataset.num_prompts)
    can_reuse = max(0, reusing - min(dataset.prefix_groups, reusing))
    return (
        f"{at_once:,} prompts arrive at once; at most {can_reuse:,} of the {dataset.num_prompts:,} can reuse a "
        f"cached prefix (those after each group's first, and only where the engine prefills that one before them): "
        "the others' TTFT is the same with caching or without, and every TTFT holds the wait behind the prompts sent "
        f"with it, so caching's effect hardly shows. The arrival order {LEADERS_FIRST} sends each group's other "
        "prompts once its first has finished."
    )


class SharedPrefix(Dataset):
    """Groups of prompts that open with the same prefix of ShareGPT text, then a suffix of their own: the workload
    prefix caching speeds up."""

    name = "shared-prefix"
    order = 2
    settings = ("prefix_len", "prefix_groups", "suffix_len", "prefix_share", "prefix_order", "output_len")
    output_length = "output_len"

    def sample(self, config: DatasetConfig, tokenizer: Any) -> Sample:
        return sample_conversations(
            config.dataset,
            lambda conversations: sample_shared_prefix_requests(prompt_texts(conversations.pairs), tokenizer, config),
        )

    def hidden_reuse_note(self, data: DatasetConfig, load: LoadConfig, caching: bool) -> str:
        return hidden_reuse_note(data, load, caching)
