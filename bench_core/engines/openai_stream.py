"""Reading an OpenAI-compatible server's answer: server-sent events, then what the chunks say.

Pure code, no I/O: `SSEParser` turns bytes cut anywhere into events, and `StreamReader` turns
events (or a whole non-streamed body) into output text, token counts, usage and how the response
ended, so every edge case is testable without a server. `openai_client` does the sending.

Both run once per streamed token, hundreds of streams at a time, so the common case (one
`data:` line holding a chunk with text) takes the shortest path; bench/bench_http_client.py
measures it against a vLLM-style client. Whatever a server sends, an answer this client cannot read
fails its own request with a message saying what was wrong, and never raises: a run's other requests
go on.
"""

from __future__ import annotations

import reprlib
from typing import NamedTuple

import orjson

ERROR_BODY_CHARS = 300  # of a server's error text, kept in a request's message
MAX_COUNT = 2**31  # a token count at or past this is no count a server meant: far past any context window

# Chunks are decoded with orjson: several times faster than json (docs/performance.md), and it refuses what JSON
# does not allow (Infinity, NaN, invalid UTF-8) and nesting past 1,024 levels, where json gives inf or raises
# RecursionError.
_loads = orjson.loads

# How a value a server sent is shown in a message: bounded in depth and length, where str() of a value nested
# past Python's recursion limit raises RecursionError and that of a huge one costs its size.
_shown = reprlib.Repr()
_shown.maxlevel, _shown.maxstring, _shown.maxother = 6, ERROR_BODY_CHARS, ERROR_BODY_CHARS


def _short(value: object) -> str:
    return _shown.repr(value)[:ERROR_BODY_CHARS]


class _Unreadable(ValueError):
    """A value in an answer this client cannot read: the message names it, for the request's error."""


def _count(value: object, name: str) -> int:
    """A token count as an int: a whole number from 0 to MAX_COUNT (5.0 is 5; True is no count)."""
    if type(value) is int and 0 <= value < MAX_COUNT:
        return value
    if type(value) is float and value.is_integer() and 0 <= value < MAX_COUNT:
        return int(value)
    raise _Unreadable(f"the server sent a {name} this client cannot count: {_short(value)}")


def _text(value: object, name: str) -> str | None:
    """A text field: a str, or None where the server left it out."""
    if value is None or isinstance(value, str):
        return value
    raise _Unreadable(f"the server sent a {name} that is not a string: {_short(value)}")


class SSEMessage(NamedTuple):
    """One server-sent event: its data lines joined by newlines, and its event name."""

    data: bytes
    event: str = "message"


_new_message = tuple.__new__  # SSEMessage's own __new__ is a Python call; per token, that shows


# An event this long is no token chunk: a server sending one is refused rather than buffered without end.
MAX_EVENT_BYTES = 16 * 1024 * 1024


class EventTooLarge(ValueError):
    """A server-sent event longer than MAX_EVENT_BYTES."""


def _lines_as_lf(data: bytes) -> bytes:
    return data.replace(b"\r\n", b"\n").replace(b"\r", b"\n") if b"\r" in data else data


class SSEParser:
    """Server-sent events from a byte stream cut at any point (text/event-stream; LF, CRLF or CR lines).

    Comments (`: ping`), `id:` and `retry:` lines carry nothing a benchmark needs and are skipped.
    Events are cut at blank lines first and most are a single `data: ` line, read without a
    per-line loop: at hundreds of streams this parser is the client's main cost after JSON.
    An unfinished event's chunks wait in a list and are joined once, when a chunk ends it, so a long
    event costs its length, not its length times its chunks.
    """

    def __init__(self) -> None:
        self._pending: list[bytes] = []  # line ends already LF
        self._pending_bytes = 0
        self._after_cr = False  # the last chunk ended in CR: an LF starting this one ends the same line

    def feed(self, chunk: bytes) -> list[SSEMessage]:
        """The events completed by `chunk`; an unfinished event waits for the next one."""
        if self._after_cr and chunk[:1] == b"\n":
            chunk = chunk[1:]
        self._after_cr = chunk.endswith(b"\r")
        chunk = _lines_as_lf(chunk)  # once per chunk: what waits in _pending is never scanned for CR again
        if b"\n\n" not in chunk and not (chunk[:1] == b"\n" and self._pending and self._pending[-1][-1:] == b"\n"):
            if chunk:
                self._pending.append(chunk)
                self._pending_bytes += len(chunk)
            if self._pending_bytes > MAX_EVENT_BYTES:
                raise EventTooLarge(f"the server sent an event longer than {MAX_EVENT_BYTES // 2**20} MiB")
            return []
        buffer = b"".join([*self._pending, chunk]) if self._pending else chunk
        blocks = buffer.split(b"\n\n")
        tail = blocks.pop()
        self._pending, self._pending_bytes = ([tail], len(tail)) if tail else ([], 0)
        messages = []
        for block in blocks:
            if block.startswith(b"data: ") and b"\n" not in block:  # the usual event: one data line
                messages.append(_new_message(SSEMessage, (block[6:], "message")))
            elif (message := _read_event(block)) is not None:
                messages.append(message)
        return messages

    def close(self) -> list[SSEMessage]:
        """The last event of a stream that ended without its blank line."""
        block = b"".join(self._pending).rstrip(b"\n")
        self._pending, self._pending_bytes = [], 0
        message = _read_event(block)
        return [] if message is None else [message]


def _read_event(block: bytes) -> SSEMessage | None:
    """One event's lines (no blank line inside); None when it has no data (a comment, a retry)."""
    data, event = [], b""
    for line in block.split(b"\n"):
        name, _, value = line.partition(b":")
        if value.startswith(b" "):
            value = value[1:]
        if name == b"data":
            data.append(value)
        elif name == b"event":
            event = value
    if not data:
        return None
    return SSEMessage(b"\n".join(data), event.decode(errors="replace") or "message")


# Where a request's output count comes from, best first (RequestResult.output_source): LIMIT is the requested number of
# tokens, where the server sent no usage and said it stopped for length.
USAGE, CHUNK_USAGE, LIMIT, RETOKENIZED, CHUNKS = "usage", "chunk usage", "limit (length stop)", "retokenized", "chunks"
_SERVED_REASONS = {"length": "length", "stop": "stop", "abort": "abort", "error": "error"}


class StreamReader:
    """What one response has said so far: output text, token counts, usage, how it ended.

    Pure: it reads SSE messages (`read_message`) or a whole non-streamed JSON body (`read_body`)
    and does no I/O, so every edge case is testable without a server.
    """

    def __init__(self) -> None:
        self.n_tokens = 0
        self.text_parts: list[str] = []
        self.reasoning_parts: list[str] = []
        self.usage_completion_tokens: int | None = None
        self.usage_prompt_tokens: int | None = None
        # Where usage_completion_tokens came from: USAGE (a chunk that ended the output, the usage-only chunk,
        # a whole body) or CHUNK_USAGE (chunks with output, each carrying the count so far); None: no usage.
        self.usage_source: str | None = None
        self.usage_cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens, where sent
        self.server_finish_reason: str | None = None
        self.done = False  # "[DONE]" seen
        self.error: str | None = None
        # The server's count of this request's speculative decoding, where its answer carries one (SGLang's native
        # meta_info, `NativeReader`): SPEC_FIELDS' keys, each as the server sent it.
        self.speculation: dict[str, int | list[int]] = {}

    @property
    def ended(self) -> bool:
        """Whether the server said the response is complete (a finish_reason or [DONE])."""
        return self.done or self.server_finish_reason is not None

    def read_message(self, message: SSEMessage) -> None:
        if self.done:  # [DONE] ends the response: whatever a server sends after it is not part of it
            return
        if message.event == "error":
            self.error = f"the server sent an error event: {error_text(message.data)}"
            return
        try:
            body = _loads(message.data)
        except ValueError as exc:
            if message.data.strip() == b"[DONE]":
                self.done = True
            else:
                self.error = _not_json("an event", message.data, exc)
            return
        self.read_body(body)

    def read_json(self, data: bytes) -> None:
        """A whole non-streamed answer's body."""
        try:
            body = _loads(data)
        except ValueError as exc:
            self.error = _not_json("an answer", data, exc)
            return
        self.read_body(body)

    def read_body(self, body: object) -> None:
        """One chunk (`delta`) or a whole response (`message`/`text`), completions or chat alike; a value it
        cannot read is the request's error, naming the field.

        The common case, a chunk with text, comes first and costs the fewest lookups.
        """
        try:
            if type(body) is not dict:
                raise _Unreadable(f"the server sent JSON that is not an object: {_short(body)}")
            completion_tokens = None
            if usage := body.get("usage"):
                if type(usage) is not dict:
                    raise _Unreadable(f"the server sent a usage that is not an object: {_short(usage)}")
                completion_tokens = usage.get("completion_tokens")
                if completion_tokens is not None:
                    completion_tokens = _count(completion_tokens, "usage.completion_tokens")
                    self.usage_completion_tokens = completion_tokens
                if (prompt_tokens := usage.get("prompt_tokens")) is not None:
                    self.usage_prompt_tokens = _count(prompt_tokens, "usage.prompt_tokens")
                details = usage.get("prompt_tokens_details")
                if isinstance(details, dict) and (cached := details.get("cached_tokens")) is not None:
                    self.usage_cached_tokens = _count(cached, "usage.prompt_tokens_details.cached_tokens")
            choices = body.get("choices")
            if not choices:  # the usage-only last chunk, or an error
                if completion_tokens is not None:
                    self.usage_source = USAGE
                if "error" in body or body.get("object") == "error":
                    self.error = f"the server reported an error: {error_text(body)}"
                return
            if type(choices) is not list or type(choice := choices[0]) is not dict:
                raise _Unreadable(f"the server sent choices that are not a list of objects: {_short(choices)}")
            answer, reasoning = _text(choice.get("text"), "choices[0].text"), None  # completions
            if answer is None:  # chat: a streamed delta or a whole message
                name = "delta" if choice.get("delta") else "message"
                part = choice.get(name) or {}
                if type(part) is not dict:
                    raise _Unreadable(f"the server sent a choices[0].{name} that is not an object: {_short(part)}")
                answer = _text(part.get("content"), f"choices[0].{name}.content")
                reasoning = _text(part.get("reasoning_content"), f"choices[0].{name}.reasoning_content") or _text(
                    part.get("reasoning"), f"choices[0].{name}.reasoning"
                )
            if answer:
                self.text_parts.append(answer)
            if reasoning:
                self.reasoning_parts.append(reasoning)
            if answer or reasoning:
                self.n_tokens = self.n_tokens + 1 if completion_tokens is None else completion_tokens
            if finish_reason := choice.get("finish_reason"):
                self.server_finish_reason = _text(finish_reason, "choices[0].finish_reason")
                if completion_tokens is not None:
                    self.usage_source = USAGE
            elif completion_tokens is not None:
                self.usage_source = CHUNK_USAGE if answer or reasoning else USAGE
        except _Unreadable as exc:
            self.error = str(exc)

    def finish(self) -> tuple[str, str]:
        """(finish_reason, message) for a response whose body has been read to its end."""
        if self.error:
            return "error", self.error
        if not self.ended:
            return "error", f"the stream ended before the server finished it (after {self.n_tokens} tokens)"
        reason = self.server_finish_reason or "stop"
        if reason in _SERVED_REASONS:
            return _SERVED_REASONS[reason], ""
        return "stop", f"the server's finish_reason was '{reason}'"


# SGLang's per-request speculative accounting in /generate's meta_info, on the chunk that ends the request
# (tokenizer_manager's _calculate_spec_decoding_metrics), under each name its versions have given it, newest first:
# verify steps; draft tokens proposed (steps x (speculative_num_draft_tokens - 1)); draft tokens accepted (no bonus
# token); and the histogram H, H[n] = the steps that accepted exactly n draft tokens.
SPEC_FIELDS = {
    "steps": ("spec_verify_ct",),
    "proposed": ("spec_num_proposed_drafts", "spec_proposed_drafts", "spec_draft_token_num"),
    "accepted": ("spec_num_correct_drafts", "spec_accepted_drafts", "spec_accept_token_num"),
    "histogram": ("spec_correct_drafts_histogram", "spec_accept_histogram"),
}
# SGLang's finish_reason types; an abort carries the server's message and fails the request.
_NATIVE_REASONS = ("length", "stop", "abort")


class NativeReader(StreamReader):
    """SGLang's native /generate answer: per event (or the whole body) `{"text", "output_ids", "meta_info"}`, where
    meta_info holds the counts so far (prompt_tokens, completion_tokens, cached_tokens) and, on the last one, the
    finish_reason (an object: its "type") and the speculative accounting (SPEC_FIELDS); an error is
    `{"error": {"message"}}`; the stream ends with [DONE].

    The text is the whole text so far in each event (SGLang's default), or only the new text with the server's
    --incremental-streaming-output. The output ids tell them apart: a whole-so-far event carries all of them, as
    many as completion_tokens; an incremental one only the new ones (the first event of either is the same).
    """

    def __init__(self) -> None:
        super().__init__()
        self._text_chars = 0  # of the text so far

    def read_body(self, body: object) -> None:
        try:
            if type(body) is not dict:
                raise _Unreadable(f"the server sent JSON that is not an object: {_short(body)}")
            if "error" in body:
                self.error = f"the server reported an error: {error_text(body)}"
                return
            meta = body.get("meta_info")
            if type(meta) is not dict:
                raise _Unreadable(f"the server sent a meta_info that is not an object: {_short(meta)}")
            completion_tokens = meta.get("completion_tokens")
            if completion_tokens is not None:
                completion_tokens = self.usage_completion_tokens = _count(
                    completion_tokens, "meta_info.completion_tokens"
                )
            if (prompt_tokens := meta.get("prompt_tokens")) is not None:
                self.usage_prompt_tokens = _count(prompt_tokens, "meta_info.prompt_tokens")
            if (cached := meta.get("cached_tokens")) is not None:
                self.usage_cached_tokens = _count(cached, "meta_info.cached_tokens")
            text = _text(body.get("text"), "text") or ""
            ids = body.get("output_ids")
            if type(ids) is list and len(ids) == completion_tokens:  # the whole text so far
                text = text[self._text_chars :]
            if text:
                self.text_parts.append(text)
                self._text_chars += len(text)
                self.n_tokens = self.n_tokens + 1 if completion_tokens is None else completion_tokens
            reason = meta.get("finish_reason")
            if reason is None:
                if completion_tokens is not None:
                    self.usage_source = CHUNK_USAGE if text else USAGE
                return
            kind = reason.get("type") if type(reason) is dict else None
            if kind not in _NATIVE_REASONS:
                raise _Unreadable(
                    f"the server sent a meta_info.finish_reason this client cannot read: {_short(reason)}"
                )
            if kind == "abort":
                self.error = f"the server aborted the request: {error_text(reason)}"
            self.server_finish_reason = kind
            if completion_tokens is not None:
                self.usage_source = USAGE
            self.speculation = _speculation(meta)
        except _Unreadable as exc:
            self.error = str(exc)


def _speculation(meta: dict) -> dict[str, int | list[int]]:
    """The SPEC_FIELDS that meta_info holds, by their keys: counts, and the histogram as a list of counts."""
    found: dict[str, int | list[int]] = {}
    for key, names in SPEC_FIELDS.items():
        name = next((name for name in names if meta.get(name) is not None), None)
        if name is None:
            continue
        value = meta[name]
        if key == "histogram":
            if type(value) is not list:
                raise _Unreadable(f"the server sent a meta_info.{name} that is not a list: {_short(value)}")
            found[key] = [_count(count, f"meta_info.{name} entry") for count in value]
        else:
            found[key] = _count(value, f"meta_info.{name}")
    return found


def _not_json(what: str, data: bytes, exc: ValueError) -> str:
    """Why `data` did not decode: orjson refuses invalid UTF-8 as it refuses bad JSON, and the message tells them
    apart (where the bytes are both, it names the UTF-8)."""
    try:
        data.decode()
    except UnicodeDecodeError as bad:
        return (
            f"the server sent {what} that is not UTF-8 ({bad.reason} at byte {bad.start}): {data[:ERROR_BODY_CHARS]!r}"
        )
    return f"the server sent {what} that is not JSON ({exc}): {data[:ERROR_BODY_CHARS]!r}"


def error_text(body: object) -> str:
    """The human part of an error body: OpenAI's {"error": {"message"}}, vLLM's {"message"}, FastAPI's {"detail"};
    else the body's start. At most ERROR_BODY_CHARS, whatever the body holds (never raises)."""
    if isinstance(body, (bytes, str)):
        try:
            decoded = _loads(body)
        except ValueError:  # not JSON, too deep, or not UTF-8
            decoded = None
        if not isinstance(decoded, dict):
            text = body[: 4 * ERROR_BODY_CHARS]
            text = text.decode(errors="replace") if isinstance(text, bytes) else text
            return text.strip()[:ERROR_BODY_CHARS]
        body = decoded
    if isinstance(body, dict):
        inner = body.get("error")
        for candidate in (
            inner.get("message") if isinstance(inner, dict) else inner,
            body.get("message"),
            body.get("detail"),
        ):
            if candidate:
                return candidate[:ERROR_BODY_CHARS] if isinstance(candidate, str) else _short(candidate)
    return _short(body)
