"""`--dataset-name multi-turn`: ShareGPT conversations sent as sessions of `turns` turns (vLLM's
benchmarks/multi_turn, GuideLLM's turns).

Each turn's prompt is the conversation so far plus the next user message, rendered as one transcript (or sent as
chat messages to a chat endpoint), so a turn's prompt opens with the previous turn's prompt and its answer: the
prefix a cache can reuse. The answers repeated are the model's real ones from this run (`multi_turn_answers`
"model": each turn `builds_on_answer`) or the conversation's own ("dataset"). Either way a session's turns go one
after another, each `think_time_s` after the previous answer, while the sessions run side by side.

`num_prompts` counts sessions: conversations of at least `turns` exchanges, shuffled with the seed, whose answers
pass LMDeploy's ShareGPT filter (4 tokens or more, unless --sharegpt-output-len fixes the length) and whose last
turn fits LMDeploy's 2,048-token total. A turn's input length is that of its prompt with the dataset's answers: in
a run on the model's answers it is an estimate, made exact when the turn is sent.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np

from ..config import DatasetConfig
from ..errors import DatasetError
from .base import Dataset
from .datasets import load_dialogues, sample_read
from .requests import Sample, SampledRequest, render_transcript, sample_of

MIN_ANSWER_TOKENS = 4  # LMDeploy's ShareGPT filter on a completion
MAX_CONVERSATION_TOKENS = 2048  # LMDeploy's ShareGPT total: the last turn's prompt and answer together


def sample_multi_turn_requests(
    dialogues: list[list[tuple[str, str]]], source: str, tokenizer: Any, cfg: DatasetConfig
) -> Sample:
    shuffled = [exchanges for exchanges in dialogues if len(exchanges) >= cfg.turns]
    random.Random(cfg.seed).shuffle(shuffled)
    live = cfg.multi_turn_answers == "model"
    requests: list[SampledRequest] = []
    sessions = 0
    for exchanges in shuffled:
        if sessions == cfg.num_prompts:
            break
        turns = _session(exchanges[: cfg.turns], tokenizer, cfg.sharegpt_output_len, live)
        if turns is None:
            continue
        first = len(requests)
        for turn, (messages, input_len, output_len) in enumerate(turns):
            later = turn > 0
            requests.append(
                SampledRequest(
                    render_transcript(messages),
                    input_len,
                    output_len,
                    messages=messages,
                    session=sessions,
                    turn=turn,
                    follows=first + turn - 1 if later else None,
                    think_s=cfg.think_time_s if later else 0.0,
                    builds_on_answer=live and later,
                    facts={
                        "session": sessions,
                        "turn": turn,
                        "shared_prefix_tokens": turns[turn - 1][1] if later else 0,
                    },
                )
            )
        sessions += 1
    if not requests:
        raise DatasetError(
            f"No conversation in {source} has {cfg.turns} turns that pass the length filters "
            f"(answers of {MIN_ANSWER_TOKENS} tokens or more, the whole conversation at most "
            f"{MAX_CONVERSATION_TOKENS}): ask for fewer turns."
        )
    warnings = []
    if sessions < cfg.num_prompts:
        warnings.append(
            f"Only {sessions:,} of the {cfg.num_prompts:,} sessions asked for have {cfg.turns} turns "
            f"that pass the length filters; the run goes on with {sessions:,}."
        )
    answers = "the model's own answers" if live else "the dataset's answers"
    notes = [f"{sessions:,} sessions of {cfg.turns} turns ({len(requests):,} requests), repeating {answers}"]
    sample = sample_of(requests, warnings=warnings, notes=notes)
    sample.arrival_rng = np.random.RandomState(cfg.seed)
    return sample


def _session(exchanges: list[tuple[str, str]], tokenizer: Any, fixed_output_len: int | None, live: bool):
    """(messages, input_len, output_len) per turn, or None when a turn fails the length filters. On the model's
    answers a turn's input length counts each earlier answer as the tokens asked of it, not the dataset's."""
    messages: list[dict[str, str]] = []
    turns = []
    answers_differ_by = 0  # tokens the model's answers so far are longer than the dataset's
    for user, answer in exchanges:
        if not user.strip():
            return None
        messages.append({"role": "user", "content": user})
        input_len = len(tokenizer.encode(render_transcript(messages))) + answers_differ_by
        answer_len = len(tokenizer.encode(answer))
        output_len = answer_len if fixed_output_len is None else fixed_output_len
        if output_len < MIN_ANSWER_TOKENS:
            return None
        turns.append((tuple(messages), input_len, output_len))
        messages.append({"role": "assistant", "content": answer})
        if live:
            answers_differ_by += output_len - answer_len
    last_input, last_output = turns[-1][1], turns[-1][2]
    return turns if last_input + last_output <= MAX_CONVERSATION_TOKENS else None


class MultiTurn(Dataset):
    """ShareGPT conversations as sessions of turns: each turn sends the conversation so far plus the next user
    message, after the previous answer and a think time."""

    name = "multi-turn"
    order = 3
    settings = ("sharegpt_output_len", "turns", "multi_turn_answers", "think_time_s")
    output_length = "sharegpt_output_len"
    counts_sessions = True
    waits = True  # for the session's previous answer

    def sample(self, config: DatasetConfig, tokenizer: Any) -> Sample:
        return sample_read(
            load_dialogues,
            config.dataset,
            lambda dialogues: sample_multi_turn_requests(dialogues.exchanges, dialogues.source, tokenizer, config),
        )

    def lengths_note(self, data: DatasetConfig) -> str:
        if data.multi_turn_answers == "model":
            return "Later turns repeat the model's own answers, so their input lengths are estimates until sent."
        return ""
