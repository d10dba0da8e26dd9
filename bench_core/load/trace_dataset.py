"""`--dataset-name trace`: a Mooncake trace replayed (JSON Lines of `timestamp` in ms, `input_length`,
`output_length` and `hash_ids`, as Mooncake publishes them; GuideLLM, vLLM, AIPerf and SGLang replay the same).

A hash id stands for a block of `trace_block_len` tokens (Mooncake's 512): the first time an id appears it gets a
block of ShareGPT text of that many tokens, and every prompt naming the id repeats that block's text byte for
byte, so requests that share leading ids share a prefix a cache can reuse, as in the traced service. A prompt is
its blocks in order, cut to its `input_length` (the last block of a Mooncake record is partial) or topped up with
text of its own where the ids cover less. Each request keeps its timestamp, seconds after the earliest of those
taken (`send_at_s`): the trace load pattern sends it then, divided by the speed-up, and nothing else rescales it.
The first `num_prompts` records are taken, in the file's order; a record that is not one of these is refused with
its line number.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..config import DatasetConfig
from ..config.catalog import MAX_SCHEDULE_S
from ..config.validation import span_words
from ..errors import DatasetError
from .base import Dataset
from .datasets import TEXT_SOURCE, load_conversations, load_records, prompt_texts, sample_read
from .requests import LENGTH_RULE, Sample, SampledRequest, TokenSupply, is_length, record_refused, sample_of

FORMAT = "each line needs 'timestamp' (ms), 'input_length', 'output_length' and 'hash_ids' (a list of integers)"


def read_record(record: Any, refuse) -> tuple[float, int, int, list[int]]:
    """(timestamp in ms, input length, output length, hash ids) of one record; `refuse(why)` raises for a bad one."""
    if not isinstance(record, Mapping):
        refuse(f"it is a JSON {type(record).__name__}, not an object")
    missing = [key for key in ("timestamp", "input_length", "output_length", "hash_ids") if key not in record]
    if missing:
        refuse(f"it has no {', '.join(repr(key) for key in missing)}")
    timestamp, hash_ids = record["timestamp"], record["hash_ids"]
    if not _number(timestamp) or not 0 <= timestamp < math.inf:  # JSON's 1e400 and Infinity read as inf
        refuse(f"its 'timestamp' must be a finite number of milliseconds, 0 or more, not {timestamp!r}")
    for key in ("input_length", "output_length"):
        if not is_length(record[key]):
            refuse(f"its '{key}' must be {LENGTH_RULE}, not {record[key]!r}")
    if not isinstance(hash_ids, list) or not all(_whole(h) for h in hash_ids):
        refuse("its 'hash_ids' must be a list of whole numbers")
    return float(timestamp), record["input_length"], record["output_length"], list(hash_ids)


def sample_trace_requests(
    records: list[tuple[int, Any]], source: str, texts: list[str], tokenizer: Any, cfg: DatasetConfig
) -> Sample:
    rows, lines = [], []
    for line, record in records[: cfg.num_prompts]:
        rows.append(read_record(record, lambda why, line=line: record_refused(source, line, why, FORMAT)))
        lines.append(line)
    if not rows:
        raise DatasetError(f"Dataset {source} holds no trace record: {FORMAT}.")
    _check_span(rows, lines, source)
    supply = TokenSupply(texts, tokenizer, random.Random(cfg.seed))
    block = cfg.trace_block_len
    blocks: dict[int, str] = {}
    sent: dict[int, int] = {}  # per hash id, the most of its block's tokens an earlier prompt held
    start = min(timestamp for timestamp, *_ in rows)
    requests = []
    for timestamp, input_length, output_length, hash_ids in rows:
        shared = _shared_tokens(hash_ids, input_length, block, sent)
        parts, covered = [], 0
        for hash_id in hash_ids:
            if covered >= input_length:
                break
            if hash_id not in blocks:
                blocks[hash_id] = supply.text(block)
            tokens = min(block, input_length - covered)
            parts.append(blocks[hash_id] if tokens == block else _cut(blocks[hash_id], tokens, tokenizer))
            sent[hash_id] = max(sent.get(hash_id, 0), tokens)
            covered += tokens
        if covered < input_length:
            parts.append(supply.text(input_length - covered))
        prompt = "".join(parts)
        requests.append(
            SampledRequest(
                prompt,
                len(tokenizer.encode(prompt)),
                output_length,
                send_at_s=(timestamp - start) / 1000.0,
                facts={"trace_input_len": input_length, "shared_prefix_tokens": shared},
            )
        )
    span = max(r.send_at_s or 0.0 for r in requests)
    notes = [f"{len(requests):,} trace records over {span:,.1f} s, {len(blocks):,} distinct blocks of {block} tokens"]
    sample = sample_of(requests, notes=notes)
    sample.arrival_rng = np.random.RandomState(cfg.seed)
    return sample


def _check_span(rows: list[tuple], lines: list[int], source: str) -> None:
    """Refuse the first record more than MAX_SCHEDULE_S after the trace's earliest (an epoch-millisecond
    timestamp among relative ones is decades ahead), naming both."""
    earliest = min(range(len(rows)), key=lambda index: rows[index][0])
    start = rows[earliest][0]
    for (timestamp, *_), line in zip(rows, lines):
        if (timestamp - start) / 1000.0 > MAX_SCHEDULE_S:
            record_refused(
                source,
                line,
                f"its 'timestamp' {timestamp:,.0f} ms is {span_words((timestamp - start) / 1000.0)} after the trace's "
                f"earliest ({start:,.0f} ms, line {lines[earliest]}): a trace spans at most {span_words(MAX_SCHEDULE_S)}",
                FORMAT,
            )


def _shared_tokens(hash_ids: list[int], input_length: int, block: int, sent: dict[int, int]) -> int:
    """The leading tokens of a prompt that an earlier prompt opened with too: its leading blocks as far as earlier
    prompts held them (a block an earlier prompt held only partly ends the shared run there)."""
    shared = 0
    for hash_id in hash_ids:
        held = min(sent.get(hash_id, 0), input_length - shared)
        shared += held
        if held < block:
            break
    return shared


def _cut(text: str, tokens: int, tokenizer: Any) -> str:
    """The start of a block's text: its first `tokens` tokens (the last, partial block of a record)."""
    return tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)[:tokens])


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class Trace(Dataset):
    """A Mooncake JSONL trace (timestamp, input_length, output_length, hash_ids): equal hash ids give identical
    blocks of text; --load trace sends at its timestamps."""

    name = "trace"
    order = 4
    settings = ("trace_block_len",)
    own_file = "a Mooncake JSONL trace"
    waits = True  # for its timestamp
    timed = True

    def sample(self, config: DatasetConfig, tokenizer: Any) -> Sample:
        def draw(records) -> Sample:
            blocks_text = prompt_texts(load_conversations(TEXT_SOURCE).pairs)  # once the trace is read
            return sample_trace_requests(records.records, records.source, blocks_text, tokenizer, config)

        return sample_read(load_records, config.dataset, draw)
