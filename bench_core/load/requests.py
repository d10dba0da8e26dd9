"""What every dataset samples: requests (a prompt, its length, the output length asked for, and what some
workloads add) and the sample they make up. The datasets' modules build these; engines send them.

A request of most datasets is independent of the others and may go at any time. Two workloads add when:
- a multi-turn request `follows` another (the previous turn of its session): it may be sent only once that one
  has finished, `think_s` after its answer; with `builds_on_answer` its prompt is then that request's prompt, the
  answer the model gave and this turn's own message (load/schedule.py builds it);
- a trace request carries `send_at_s`, its timestamp in the trace, which the trace load pattern sends it at.
`facts` are what the dataset knows of a request for the per-request table (its prefix group, the tokens it shares
with others, its vision tokens), never needed to send it.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

import numpy as np

from ..config.catalog import MAX_TOKENS
from ..errors import DatasetError

Message = Mapping[str, Any]  # an OpenAI-style chat message: {"role": ..., "content": ...}
ROLE_NAMES = {"system": "System", "user": "User", "assistant": "Assistant", "tool": "Tool"}


@dataclass(frozen=True, slots=True)
class SampledRequest:
    prompt: str
    input_len: int
    output_len: int
    messages: tuple[Message, ...] | None = None  # the chat form, sent as is to a chat endpoint; `prompt` renders it
    images: tuple[str, ...] = ()  # data URIs, in the user message (the image dataset)
    session: int | None = None  # the multi-turn conversation it belongs to
    turn: int = 0  # its place in that conversation, from 0
    follows: int | None = None  # the index of the request it must wait for (the session's previous turn)
    think_s: float = 0.0  # how long after that request's answer it goes
    builds_on_answer: bool = False  # its prompt repeats the model's real answer to `follows`, not the dataset's
    send_at_s: float | None = None  # its timestamp in a trace, seconds after the trace's first
    facts: Mapping[str, Any] = field(default_factory=dict, compare=False)  # per-request table columns
    # The engine API's load adds these before the clock starts: the prompt's ids (skip tokenize: ids go in) and the
    # token count past which the request is cancelled (its cancel rate).
    input_ids: tuple[int, ...] | None = None
    cancel_after: int | None = None

    @property
    def user_message(self) -> Message | None:
        """This turn's own message: the last of its messages."""
        return self.messages[-1] if self.messages else None

    def lengths_only(self) -> SampledRequest:
        """The request without its text and images: what a process that only counts needs (a followed run's)."""
        return dataclasses.replace(self, prompt="", messages=None, images=())


@dataclass
class Sample:
    """Sampled requests, and numpy's global generator as profile_restful_api.py leaves it after sampling
    them (seeded with the seed; past the random dataset's length draws), which draws its arrivals."""

    requests: list[SampledRequest]
    total_input_tokens: int
    total_output_tokens: int
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    arrival_rng: np.random.RandomState = field(default_factory=lambda: np.random.RandomState(0), repr=False)
    # Python's `random` as profile_throughput.py's sampling leaves it (seeded, then one shuffle), which draws its
    # cancellations.
    cancel_rng: random.Random = field(default_factory=lambda: random.Random(0), repr=False)


def sample_of(requests: list[SampledRequest], warnings: Sequence[str] = (), notes: Sequence[str] = ()) -> Sample:
    return Sample(
        requests=requests,
        total_input_tokens=sum(r.input_len for r in requests),
        total_output_tokens=sum(r.output_len for r in requests),
        warnings=list(warnings),
        notes=list(notes),
    )


def render_transcript(messages: Sequence[Message]) -> str:
    """Chat messages as one text prompt, for the engines and endpoints that take text: "User: ...", "Assistant: ..."
    turns, ending with the cue for the next answer. The transcript of a conversation's first n messages is a
    prefix of the transcript of all of them (the cue is the start of the next assistant turn), so a later turn's
    prompt opens with the earlier one's, byte for byte."""
    parts = [
        f"{ROLE_NAMES.get(str(message.get('role')), str(message.get('role')).capitalize())}: {message_text(message)}"
        for message in messages
    ]
    return "\n\n".join([*parts, "Assistant:"])


def message_text(message: Message) -> str:
    """A message's text: its content, or the text parts of a content list (OpenAI's multi-part form)."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))
    return ""


def cycled_token_ids(texts: list[str], tokenizer: Any) -> Iterator[list[int]]:
    """Encoded texts in order, starting over when they run out; texts that encode to nothing are skipped."""
    while True:
        produced = False
        for text in texts:
            ids = tokenizer.encode(text)
            if ids:
                produced = True
                yield ids
        if not produced:
            raise DatasetError("The dataset has no prompt text to build random prompts from.")


class TokenSupply:
    """Token ids of dataset texts, shuffled with the seed and taken n at a time, running on through the texts (and
    round again when they run out): where the synthetic workloads cut their text from, as LMDeploy's random
    dataset cuts its prompts from ShareGPT's."""

    def __init__(self, texts: list[str], tokenizer: Any, rng: Any) -> None:
        shuffled = list(texts)
        rng.shuffle(shuffled)
        self._tokenizer = tokenizer
        self._texts = iter(cycled_token_ids(shuffled, _WithoutSpecialTokens(tokenizer)))
        self._buffer: list[int] = []

    def take(self, n: int) -> list[int]:
        while len(self._buffer) < n:
            self._buffer.extend(next(self._texts))
        taken, self._buffer = self._buffer[:n], self._buffer[n:]
        return taken

    def text(self, n: int) -> str:
        """Text that encodes to exactly `n` tokens on its own where the tokenizer allows it (decoding and encoding
        again can merge or split tokens: a few rounds of cutting and topping up settle it), with no space at its
        ends, so that what follows it starts a token of its own."""
        ids = self.take(n)
        text = ""
        for _ in range(_SETTLING_ROUNDS):
            text = self._tokenizer.decode(ids).strip()
            ids = self._tokenizer.encode(text, add_special_tokens=False)
            if len(ids) == n:
                break
            ids = ids[:n] if len(ids) > n else ids + self.take(n - len(ids))
        return text


_SETTLING_ROUNDS = 8


class _WithoutSpecialTokens:
    """A tokenizer's encode without BOS/EOS: text cut from the middle of a prompt has none."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False)


def common_prefix_len(first: Sequence[int], second: Sequence[int]) -> int:
    """How many leading tokens two prompts have in common."""
    n = 0
    for a, b in zip(first, second):
        if a != b:
            break
        n += 1
    return n


# What a length in a user's record (an output length, a trace's input length) must be: a token count within a
# length setting's range (a trace's input length is made into that much text before anything is sent).
LENGTH_RULE = f"a whole number from 1 to {MAX_TOKENS:,}"


def is_length(value: Any) -> bool:
    """Whether `value`, read from a user's record, is a length a request may ask for (LENGTH_RULE; JSON's true is
    not 1)."""
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_TOKENS


def record_refused(source: str, line: int, why: str, rule: str) -> NoReturn:
    """Refuse a record of a user's file (custom prompts, a trace) with its line, why, and what a record needs."""
    raise DatasetError(f"Dataset {source}, line {line}: the record is refused because {why}; {rule}.")
