"""The playground: a batch of chat prompts run once through an engine, and what came back.

Prompts arrive typed (one per line) or as a file: plain text lines, a CSV with a `prompt` column,
JSONL records with a `prompt` or OpenAI-style `messages`, or a JSON list of conversations. Each
becomes a conversation (a list of {"role", "content"} messages) that the engine renders with the
model's chat template. Results go back to the user as a table, CSV or JSONL. No streamlit here.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

import pandas as pd

from ..config import GenerationSettings, generation_problems
from ..csvstore import table_bytes
from ..errors import ConfigError, DatasetError
from .datasets import LENIENT_JSON, json_lines, nested_too_deeply

Conversation = list[dict[str, str]]

ROLES = ("system", "user", "assistant", "tool")
FILE_TYPES = ("txt", "csv", "jsonl", "json")
PREVIEW_CHARS = 80


@dataclass
class PlaygroundResult:
    """One prompt's answer. Times in seconds from when the batch was handed to the engine."""

    index: int
    prompt: str  # a preview of the last user message
    text: str = ""
    input_tokens: int = 0  # the prompt after the chat template
    output_tokens: int = 0
    finish_reason: str = ""  # "stop" (EOS), "length" (max new tokens), "error" or "abort"
    ttft_s: float | None = None
    total_s: float | None = None
    error: str = ""


def prompt_preview(conversation: Conversation) -> str:
    """The last user message (else the last message), on one line, shortened for a table cell."""
    user_turns = [m for m in conversation if m["role"] == "user"] or conversation
    text = " ".join(user_turns[-1]["content"].split())
    return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "…"


def prompts_from_text(text: str) -> list[Conversation]:
    """One single-message conversation per non-blank line."""
    return [[{"role": "user", "content": line.strip()}] for line in text.splitlines() if line.strip()]


def parse_prompt_file(name: str, data: bytes) -> list[Conversation]:
    """The conversations in an uploaded file, told apart by its extension; a bad file is one DatasetError."""
    kind = PurePath(name).suffix.lower().lstrip(".")
    if kind not in FILE_TYPES:
        raise DatasetError(f"{name} is not a prompt file: use .{', .'.join(FILE_TYPES)}.")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DatasetError(f"{name} is not UTF-8 text (byte {exc.start} cannot be decoded).") from exc
    if kind == "txt":
        conversations = prompts_from_text(text)
    elif kind == "csv":
        conversations = _csv_prompts(text, name)
    elif kind == "jsonl":
        conversations = _jsonl_prompts(text, name)
    else:
        conversations = _json_prompts(text, name)
    if not conversations:
        raise DatasetError(f"{name} holds no prompt.")
    return conversations


def _csv_prompts(text: str, name: str) -> list[Conversation]:
    try:
        rows = list(csv.DictReader(io.StringIO(text, newline="")))
    except csv.Error as exc:
        raise DatasetError(f"{name} is not a readable CSV file ({exc}).") from exc
    columns = {column.strip().lower(): column for column in (rows[0].keys() if rows else []) if column}
    if "prompt" not in columns:
        raise DatasetError(f"{name} has no 'prompt' column; its first line must name the columns.")
    cells = (str(row.get(columns["prompt"]) or "").strip() for row in rows)
    return [[{"role": "user", "content": cell}] for cell in cells if cell]


def _jsonl_prompts(text: str, name: str) -> list[Conversation]:
    conversations = []
    for number, line in json_lines(text):
        where = f"line {number} of {name}"
        try:
            record = LENIENT_JSON.decode(line)
        except RecursionError:
            raise nested_too_deeply(where.capitalize()) from None
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{where.capitalize()} is not valid JSON ({exc.msg}).") from exc
        conversations.append(_conversation(record, where))
    return conversations


def _json_prompts(text: str, name: str) -> list[Conversation]:
    try:
        records = LENIENT_JSON.decode(text)
    except RecursionError:
        raise nested_too_deeply(name) from None
    except json.JSONDecodeError as exc:
        raise DatasetError(f"{name} is not valid JSON ({exc.msg} at line {exc.lineno}).") from exc
    if not isinstance(records, list):
        raise DatasetError(f"{name} must hold a JSON list of conversations (lists of role/content messages).")
    return [_conversation(record, f"item {number} of {name}") for number, record in enumerate(records, start=1)]


def _conversation(record: Any, where: str) -> Conversation:
    """A record as a conversation: a prompt string, {"prompt": ...}, {"messages": [...]} or a bare message list."""
    if isinstance(record, dict) and "messages" in record:
        record = record["messages"]
    elif isinstance(record, dict) and "prompt" in record:
        record = record["prompt"]
    if isinstance(record, str) and record.strip():
        return [{"role": "user", "content": record.strip()}]
    if isinstance(record, list) and record:
        return [_message(message, where) for message in record]
    raise DatasetError(
        f'{where.capitalize()} is neither a prompt nor a conversation: give a non-empty "prompt" string '
        'or "messages", a list of {"role", "content"} objects.'
    )


def _message(message: Any, where: str) -> dict[str, str]:
    role = message.get("role") if isinstance(message, dict) else None
    if role not in ROLES:
        raise DatasetError(f"A message in {where} has role {role!r}; use one of {', '.join(ROLES)}.")
    content = message.get("content")
    if isinstance(content, list):  # OpenAI content parts: keep the text ones
        content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
    if not isinstance(content, str):
        raise DatasetError(f"A {role} message in {where} has no text content.")
    return {"role": role, "content": content}


def check_request(conversations: Sequence[Conversation], generation: GenerationSettings, max_new_tokens: int) -> None:
    """Raise one ConfigError with every problem of a playground request, before it is queued."""
    problems = []
    if not conversations:
        problems.append("There is no prompt to run: type one per line or upload a file.")
    if max_new_tokens < 1:
        problems.append("The maximum number of new tokens must be at least 1.")
    problems.extend(generation_problems(generation))
    if problems:
        raise ConfigError(" ".join(problems))


RESULT_COLUMNS = tuple(f.name for f in dataclasses.fields(PlaygroundResult))


def _rows_in_prompt_order(results: Iterable[PlaygroundResult]) -> list[dict[str, Any]]:
    return sorted((dataclasses.asdict(r) for r in results), key=lambda row: row["index"])


def results_frame(results: Iterable[PlaygroundResult]) -> pd.DataFrame:
    """The results in prompt order, one row each, columns as in `PlaygroundResult`."""
    return pd.DataFrame(_rows_in_prompt_order(results), columns=list(RESULT_COLUMNS))


def results_to_csv_bytes(results: Iterable[PlaygroundResult]) -> bytes:
    """CSV with the `PlaygroundResult` columns; a time that was not measured is an empty cell."""
    return table_bytes(list(RESULT_COLUMNS), _rows_in_prompt_order(results))


def results_to_jsonl_bytes(results: Iterable[PlaygroundResult]) -> bytes:
    """One JSON object per prompt, in prompt order; a time that was not measured is null."""
    rows = _rows_in_prompt_order(results)
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows).encode("utf-8")
