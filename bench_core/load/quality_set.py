"""`--quality-set FILE`: prompts with references, each scored by its record's scorer below (a run's accuracy: measure/quality.py).

A quality set is a JSON array or JSON Lines file of {"prompt", "reference", "scorer"} records; its prompts, in the
file's order (the first `num_prompts`), are the run's, each generating `output_len` tokens (--output-len, whatever the
dataset), the other dataset settings aside. A record that is not one is refused with its line number, before anything runs.

`builtin:quality` is the set below: twelve arithmetic and factual questions written for this project by its
authors (not taken from any benchmark), part of the project and shared on its terms.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from ..config import DatasetConfig
from ..errors import DatasetError
from .requests import Sample, SampledRequest, record_refused, sample_of

_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")


def _number(text: str) -> float | None:
    found = _NUMBER.search(text)
    return None if found is None else float(found.group().replace(",", ""))


def exact(answer: str, reference: str) -> bool:
    return answer.strip() == reference.strip()


def contains(answer: str, reference: str) -> bool:
    return reference.strip().casefold() in answer.casefold()


def regex(answer: str, reference: str) -> bool:
    return re.search(reference, answer) is not None


def number(answer: str, reference: str) -> bool:
    got, wanted = _number(answer), _number(reference)
    return got is not None and wanted is not None and math.isclose(got, wanted, rel_tol=1e-9, abs_tol=1e-9)


SCORERS: dict[str, Callable[[str, str], bool]] = {
    "exact": exact,
    "contains": contains,
    "regex": regex,
    "number": number,
}
QUALITY_FORMAT = "each record needs a 'prompt' string, a 'reference' string and a 'scorer' (" + ", ".join(SCORERS) + ")"


@dataclass(frozen=True)
class QualityItem:
    prompt: str
    reference: str
    scorer: str

    def score(self, answer: str) -> bool:
        return SCORERS[self.scorer](answer, self.reference)


def quality_item(record: Any, refuse: Callable[[str], Any]) -> QualityItem:
    """One quality-set record; `refuse(why)` raises for a bad one (a regex that does not compile is bad)."""
    if not isinstance(record, Mapping):
        refuse(f"it is a JSON {type(record).__name__}, not an object")
    prompt, reference, scorer = record.get("prompt"), record.get("reference"), record.get("scorer", "exact")
    if not isinstance(prompt, str) or not prompt.strip():
        refuse("its 'prompt' is not a non-empty string")
    if not isinstance(reference, str) or not reference.strip():
        refuse("its 'reference' is not a non-empty string")
    if scorer not in SCORERS:
        refuse(f"its scorer {scorer!r} is not one of {', '.join(SCORERS)}")
    if scorer == "regex":
        try:
            re.compile(reference)
        except re.error as exc:
            refuse(f"its reference is not a regular expression ({exc})")
    if scorer == "number" and _number(reference) is None:
        refuse("its reference holds no number")
    return QualityItem(prompt, reference, scorer)


BUILTIN_QUALITY = "builtin:quality"
_ANSWER = " Answer with the number only."
BUILTIN_RECORDS: tuple[dict[str, str], ...] = (
    {"prompt": "What is 7 + 5?" + _ANSWER, "reference": "12", "scorer": "number"},
    {"prompt": "What is 9 times 8?" + _ANSWER, "reference": "72", "scorer": "number"},
    {"prompt": "What is 100 minus 37?" + _ANSWER, "reference": "63", "scorer": "number"},
    {"prompt": "What is 144 divided by 12?" + _ANSWER, "reference": "12", "scorer": "number"},
    {"prompt": "How many days are in a week?" + _ANSWER, "reference": "7", "scorer": "number"},
    {"prompt": "How many minutes are in an hour?" + _ANSWER, "reference": "60", "scorer": "number"},
    {"prompt": "What is the capital of France?", "reference": "Paris", "scorer": "contains"},
    {"prompt": "What is the capital of Japan?", "reference": "Tokyo", "scorer": "contains"},
    {"prompt": "Which planet is closest to the Sun?", "reference": "Mercury", "scorer": "contains"},
    {"prompt": "What colour do you get by mixing blue and yellow?", "reference": "green", "scorer": "contains"},
    {"prompt": "Water is made of hydrogen and which other element?", "reference": "oxygen", "scorer": "contains"},
    {"prompt": "Is 17 a prime number? Answer yes or no.", "reference": r"(?i)\byes\b", "scorer": "regex"},
)


def quality_items(records: list[tuple[int, Any]], source: str) -> list[QualityItem]:
    """The set's items, in order; a bad record, or none, is refused with one message."""
    items = [
        quality_item(record, partial(record_refused, source, line, rule=QUALITY_FORMAT)) for line, record in records
    ]
    if not items:
        raise DatasetError(f"Quality set {source} holds no record: {QUALITY_FORMAT}.")
    return items


def builtin_records() -> list[tuple[int, Any]]:
    return [(line, dict(record)) for line, record in enumerate(BUILTIN_RECORDS, start=1)]


def sample_quality_requests(items: list[QualityItem], tokenizer: Any, cfg: DatasetConfig) -> Sample:
    """The run's requests: the first `num_prompts` items' prompts, `output_len` tokens each."""
    chosen = items[: cfg.num_prompts]
    requests = [SampledRequest(item.prompt, len(tokenizer.encode(item.prompt)), cfg.output_len) for item in chosen]
    return sample_of(requests)
