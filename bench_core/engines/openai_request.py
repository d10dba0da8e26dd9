"""One request to an OpenAI-compatible server, or to SGLang's native /generate: where it goes and how it is asked
(`ServerSpec`, the body each server takes, as profile_restful_api.py sends it), and what came back (`RequestResult`:
times, texts, the server's usage, our retokenized count, what those say of its length, and the server's count of its
speculative decoding where it gives one). Pure: `openai_client` does the sending.
"""

from __future__ import annotations

import json
import os
import unicodedata
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..config import GenerationSettings, check_values, setting
from ..errors import ConfigError
from ..load.requests import SampledRequest
from ..states import SERVED_REASONS, RequestStatus
from .engine_api import ENGINE_POSITION_COLUMN, SPEC_COLUMNS
from .http_route import DEFAULT_POLICY, NetworkPolicy
from .openai_stream import CHUNKS, LIMIT, RETOKENIZED

NATIVE_ENDPOINT = "generate"  # SGLang's own API (profile_restful_api.py's sglang and sglang-native backends)
ENDPOINTS = {"completions": "/v1/completions", "chat": "/v1/chat/completions", NATIVE_ENDPOINT: "/generate"}
NATIVE_KIND = "sglang"  # the one server kind that serves NATIVE_ENDPOINT
SERVER_KINDS = ("lmdeploy", "vllm", "sglang", "transformers", "openai")
GENERIC_KIND = "openai"  # any other server: OpenAI's fields only
API_KEY_ENV = "OPENAI_API_KEY"
# The servers that take fields beyond OpenAI's (ignore_eos, top_k); "openai" (any other server) gets OpenAI's only.
_EXTENSION_FIELD_KINDS = ("lmdeploy", "vllm", "sglang")
_IGNORE_EOS_KINDS = (*_EXTENSION_FIELD_KINDS, "transformers")  # the kinds a request can ask to ignore EOS
GREEDY = {"temperature": 0.0}  # what profile_restful_api.py's request functions send, whatever its flags say
# One sentence for every such request, so that a run's reasons count them together.
EOS_DESPITE_IGNORE = "the server stopped at EOS before max_tokens although ignore_eos was sent"
REQUEST_DEADLINE_S = 6 * 60 * 60  # profile_restful_api.py's and vLLM's aiohttp total timeout


def api_root(base_url: str) -> str:
    """The server's address without a trailing slash or `/v1`, so either spelling of it works."""
    root = base_url.strip().rstrip("/")
    if not root.startswith(("http://", "https://")):
        raise ConfigError(
            f"The server URL must start with http:// or https://, like http://127.0.0.1:23333 (got '{base_url}')."
        )
    try:
        parts = urllib.parse.urlsplit(root)
        parts.port  # noqa: B018 (a port that is no number, or out of range, raises only when read)
    except ValueError as exc:
        raise ConfigError(f"The server URL '{base_url}' cannot be read ({exc}): like http://127.0.0.1:23333.") from None
    if not parts.hostname:
        raise ConfigError(f"The server URL '{base_url}' names no host: like http://127.0.0.1:23333.")
    return root.removesuffix("/v1")


def api_key_problem(api_key: str | None) -> str:
    """Why the API key (`api_key`, else $OPENAI_API_KEY) cannot be sent in a request's Authorization header, or
    "": a line break pasted with it would end the header early and start another, and a character beyond Latin-1
    cannot be written in one. The key is a secret: the sentence says where it came from and where the character
    is, never the key."""
    key = api_key or os.environ.get(API_KEY_ENV) or ""
    for position, char in enumerate(key, start=1):
        if char in "\r\n":
            what = "a line break"
        elif unicodedata.category(char) == "Cc" and char != "\t":
            what = "a control character"
        elif ord(char) > 0xFF:
            what = f"the character U+{ord(char):04X}"
        else:
            continue
        source = "the API key field" if api_key else f"${API_KEY_ENV}"
        return (
            f"The API key ({source}) holds {what} at character {position}, which an HTTP header cannot carry: "
            "set it again without it (the key is not shown here)."
        )
    return ""


@dataclass(frozen=True)
class ServerSpec:
    """Where the server is and how to talk to it. Timeouts: connecting, the longest wait for a request's
    next token (its first included), and a request's whole life."""

    base_url: str
    api_key: str | None = field(default=None, repr=False)  # None: $OPENAI_API_KEY, if set
    endpoint: str = "completions"
    server_kind: str = "openai"
    stream: bool = True
    extra_body: dict | None = None
    sampling: dict | None = None  # temperature, top_p, top_k to send; None: GREEDY (`sampling_fields`)
    chat_limit_field: str = setting("chat_limit_field").default  # max_tokens, max_completion_tokens or both
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 300.0
    total_timeout_s: float = REQUEST_DEADLINE_S
    network: NetworkPolicy = DEFAULT_POLICY  # proxies and TLS, for the streams and every GET alike

    def __post_init__(self) -> None:
        api_root(self.base_url)
        if self.endpoint not in ENDPOINTS:
            raise ConfigError(f"Unknown endpoint '{self.endpoint}'; choose one of {', '.join(ENDPOINTS)}.")
        if self.server_kind not in SERVER_KINDS:
            raise ConfigError(f"Unknown server kind '{self.server_kind}'; choose one of {', '.join(SERVER_KINDS)}.")
        if self.endpoint == NATIVE_ENDPOINT and self.server_kind != NATIVE_KIND:
            raise ConfigError(
                f"The {NATIVE_ENDPOINT} endpoint is SGLang's native /generate API: set the server kind to "
                f"{NATIVE_KIND} (or auto), or choose the completions or chat endpoint for a {self.server_kind} server."
            )
        if self.chat_limit_field not in (fields := setting("chat_limit_field").choices or ()):
            raise ConfigError(f"Unknown chat limit field '{self.chat_limit_field}'; choose one of {', '.join(fields)}.")
        check_values(read_timeout_s=self.read_timeout_s)
        if not (self.connect_timeout_s > 0 and self.total_timeout_s > 0):
            raise ConfigError("Server timeouts must be above 0 seconds.")

    @property
    def url(self) -> str:
        return api_root(self.base_url) + ENDPOINTS[self.endpoint]


def limit_fields(spec: ServerSpec) -> tuple[str, ...]:
    """The fields of a request that say how many tokens it may produce."""
    if spec.endpoint == NATIVE_ENDPOINT:
        return ("max_new_tokens",)
    if spec.endpoint != "chat":
        return ("max_tokens",)
    return ("max_tokens", "max_completion_tokens") if spec.chat_limit_field == "both" else (spec.chat_limit_field,)


def overrun_advice(spec: ServerSpec) -> str:
    """Why requests came back longer than asked: the limit field the server seems to ignore, and the setting that
    sends another."""
    sent = limit_fields(spec)
    if spec.endpoint != "chat":
        return (
            f"more tokens than asked: the server seems to ignore {sent[0]}, the {spec.endpoint} endpoint's only limit"
        )
    if len(sent) == 2:
        return "more tokens than asked: the server seems to ignore both max_tokens and max_completion_tokens"
    other = "max_completion_tokens" if sent == ("max_tokens",) else "max_tokens"
    flag = setting("chat_limit_field").cli_flags[0]
    # No "; " here: it separates the reasons in a run's summary.
    return f"more tokens than asked: the server seems to ignore {sent[0]}: send {other} with {flag} {other} (or both)"


def sampling_fields(generation: GenerationSettings, server_kind: str) -> dict | None:
    """A request's sampling fields: None (GREEDY, profile_restful_api.py's temperature 0.0) unless the run samples;
    then benchmark_chat_completion.py's temperature, top_p and top_k, top_k only to the servers that take it
    (OpenAI's API has none, and `transformers serve` answers 422 to it)."""
    if not generation.do_sample:
        return None
    fields = {"temperature": generation.temperature, "top_p": generation.top_p}
    if server_kind in _EXTENSION_FIELD_KINDS:
        fields["top_k"] = generation.top_k
    return fields


def ignore_eos_sent(server_kind: str, ignore_eos: bool) -> bool:
    """Whether a run's requests ask the server to ignore EOS: the run asks it and this kind of server takes it."""
    return ignore_eos and server_kind in _IGNORE_EOS_KINDS


def build_payload(
    spec: ServerSpec,
    model: str,
    prompt: str,
    max_tokens: int,
    ignore_eos: bool,
    messages: Sequence[Mapping] | None = None,
    images: Sequence[str] = (),
) -> dict:
    """The JSON body of one request, as `profile_restful_api.py` sends it: its fields, with `spec.sampling` for
    its temperature 0.0 (`spec.sampling` where the run samples), best_of 1 on the completions endpoint, and the usage asked for
    (README, "The request body"). A chat request's token limit goes in the field(s) `spec.chat_limit_field` names
    (theirs: max_completion_tokens).

    The chat endpoint gets `messages` where the request has them (custom records, multi-turn turns), else the
    prompt as one user message; `images` (data URIs) go before its text, as profile_restful_api.py puts them.
    The completions endpoint gets the prompt text (a conversation's transcript).

    ignore_eos goes the way each server takes it: an `ignore_eos` field for LMDeploy, vLLM and
    SGLang; a `generation_config` string for `transformers serve`, which answers 422 to the field
    (its generation_config replaces the model's, hence max_new_tokens too); nothing for others.
    `extra_body` is merged last, so it can override any of this.

    SGLang's native endpoint gets its own body instead (`native_payload`).
    """
    if spec.endpoint == NATIVE_ENDPOINT:
        return native_payload(spec, prompt, max_tokens, ignore_eos)
    payload: dict = {"model": model, "stream": spec.stream}
    if spec.endpoint == "chat":
        if images:
            parts = [
                *({"type": "image_url", "image_url": {"url": uri}} for uri in images),
                {"type": "text", "text": prompt},
            ]
            payload["messages"] = [{"role": "user", "content": parts}]
        else:
            payload["messages"] = [dict(m) for m in messages] if messages else [{"role": "user", "content": prompt}]
        payload.update(dict.fromkeys(limit_fields(spec), max_tokens))
    else:
        payload["prompt"] = prompt
        payload["max_tokens"] = max_tokens
    payload.update(spec.sampling or GREEDY)
    if spec.endpoint == "completions":
        payload["best_of"] = 1
    if spec.stream:
        payload["stream_options"] = {"include_usage": True}  # LMDeploy sends usage only when asked
    if ignore_eos_sent(spec.server_kind, ignore_eos) and spec.server_kind in _EXTENSION_FIELD_KINDS:
        payload["ignore_eos"] = True
    elif ignore_eos_sent(spec.server_kind, ignore_eos):  # transformers serve
        config = {"eos_token_id": -1, "max_new_tokens": max_tokens}
        if spec.sampling:  # this config replaces the model's: without do_sample the temperature would not sample
            config["do_sample"] = True
        payload["generation_config"] = json.dumps(config)
    payload.update(spec.extra_body or {})
    return payload


def native_payload(spec: ServerSpec, prompt: str, max_tokens: int, ignore_eos: bool) -> dict:
    """The body of a request to SGLang's /generate, as SGLang's bench_serving sends it: the prompt text (a
    conversation's transcript), the sampling parameters nested (max_new_tokens, GREEDY or the run's sampling,
    ignore_eos), stream; no model (the endpoint serves one). `extra_body` is merged last, at the top, as theirs is."""
    sampling = {"max_new_tokens": max_tokens, **(spec.sampling or GREEDY), "ignore_eos": ignore_eos}
    return {"text": prompt, "sampling_params": sampling, "stream": spec.stream, **(spec.extra_body or {})}


def speculation_columns(speculation: Mapping[str, int | list[int]]) -> dict[str, int | str]:
    """A request's speculative accounting in the embedded engine's columns (engine_api.SPEC_COLUMNS and, from a
    histogram, ENGINE_POSITION_COLUMN), from what the server counted (openai_stream.SPEC_FIELDS' keys); none where it
    counted nothing.

    From SGLang's histogram H (H[n]: the steps that accepted exactly n draft tokens, every verify step counted, 0
    included): draft position i (1-based) was accepted in the steps that accepted i or more, sum(H[n] for n >= i);
    drafts: sum(H); accepted tokens: sum(n * H[n]). The draft tokens per step, k, are the proposed tokens / the
    steps, where the server says them (SGLang proposes speculative_num_draft_tokens - 1 each step). Else len(H) - 1,
    which may fall short of k: SGLang grows H only as far as the most a step accepted (Req's
    update_spec_correct_drafts_histogram), so the positions past that, none accepted, go unlisted and the drafted
    tokens are undercounted (the rate then overstated) by as many per step.
    """
    histogram = speculation.get("histogram")
    steps, proposed = speculation.get("steps"), speculation.get("proposed")
    if isinstance(histogram, list) and sum(histogram) > 0:
        drafts = sum(histogram)
        if isinstance(proposed, int) and isinstance(steps, int) and steps > 0:
            per_step, drafted = round(proposed / steps), proposed
        else:
            per_step = len(histogram) - 1
            drafted = drafts * per_step
        accepted_at = [sum(histogram[position:]) for position in range(1, per_step + 1)]
        counts = (drafts, drafted, sum(n * count for n, count in enumerate(histogram)))
        return {**dict(zip(SPEC_COLUMNS, counts)), ENGINE_POSITION_COLUMN: json.dumps(accepted_at)}
    accepted = speculation.get("accepted")
    if isinstance(steps, int) and steps > 0 and isinstance(proposed, int) and isinstance(accepted, int):
        return dict(zip(SPEC_COLUMNS, (steps, proposed, accepted)))  # an SGLang without the histogram: no positions
    return {}


@dataclass
class RequestResult:
    """One request as the client saw it. Times are `time.perf_counter()` seconds; None: never happened."""

    index: int
    requested_tokens: int
    scheduled_s: float  # from t0, by the arrival process
    sent_ts: float | None = None
    slot_wait_s: float = 0.0  # how long it waited, once due, for a free slot under the concurrency cap
    first_answer_ts: float | None = None  # first chunk with answer text: TTFT (profile_restful_api.py's)
    first_reasoning_ts: float | None = None  # first chunk with reasoning text
    # (time, tokens so far) of the chunks of reasoning before any answer: ticked only if no answer comes
    reasoning_ticks: list[tuple[float, int]] = field(default_factory=list)
    first_byte_ts: float | None = None  # first bytes of the response body
    last_line_ts: float | None = None  # the body's last SSE event: profile_restful_api.py's end of E2E
    end_ts: float | None = None
    n_tokens: int = 0  # as read: per-chunk usage, else one per chunk with text (reasoning included)
    usage_completion_tokens: int | None = None
    usage_source: str | None = None  # USAGE or CHUNK_USAGE (openai_stream); None: the server sent no usage
    usage_prompt_tokens: int | None = None
    usage_cached_tokens: int | None = None
    built_prompt: str | None = None  # the prompt made when it was sent (a turn repeating the model's answer)
    built_messages: Sequence[Mapping] | None = None  # the same as chat messages
    resent: bool = False  # sent again on a fresh connection: a reused one closed before any byte of the answer
    retokenized_tokens: int | None = None  # filled by `retokenize`
    finish_reason: str = ""
    # ignore_eos was not sent (the run did not ask it, or the server takes no such field): a "stop" before the
    # limit is where the answer ends, not an answer cut short
    eos_ends_answer: bool = False
    message: str = ""
    text: str = ""
    reasoning_text: str = ""
    # The server's count of its speculative decoding (openai_stream.SPEC_FIELDS' keys): SGLang's native answers only
    speculation: dict[str, int | list[int]] = field(default_factory=dict)

    @property
    def output_tokens(self) -> int:
        """The best count there is (`output_source` says which): the server's usage, in its last chunks or in
        each; else, where the server said it stopped for length, the number of tokens asked (the server's own count,
        whatever our tokenizer makes of the text); else our retokenized count of the text (chunks undercount:
        llama.cpp folds the tokens of one UTF-8 character into one chunk); else the chunks with text."""
        if self.usage_completion_tokens is not None:
            return self.usage_completion_tokens
        if self.stopped_at_limit:
            return self.requested_tokens
        return self.retokenized_tokens if self.retokenized_tokens is not None else self.n_tokens

    @property
    def output_source(self) -> str | None:
        """Where `output_tokens` came from; None for a request with no output to count (one that failed before its
        first token, say)."""
        if self.usage_source is not None:
            return self.usage_source
        if self.stopped_at_limit:
            return LIMIT
        if not (self.n_tokens or self.text or self.reasoning_text):
            return None
        return RETOKENIZED if self.retokenized_tokens is not None else CHUNKS

    @property
    def needs_recount(self) -> bool:
        """Its count is ours to make, by retokenizing its text: the server sent no usage and did not say it stopped at
        the limit."""
        return (
            self.usage_completion_tokens is None
            and not self.stopped_at_limit
            and bool(self.text or self.reasoning_text)
        )

    @property
    def overran(self) -> bool:
        """More tokens than asked, for certain: the server's count says so, or without one the chunks with text
        do (each holds a token at least), whatever a retokenized count makes of them."""
        floor = self.usage_completion_tokens if self.usage_completion_tokens is not None else self.n_tokens
        return floor > self.requested_tokens

    @property
    def length_status(self) -> str:
        """A served request's status where its count cannot give it (metrics.request_status): OVERRUN, or
        SUCCESS when the server stopped at the limit; "" leaves it to the count."""
        if self.finish_reason not in SERVED_REASONS:
            return ""
        if self.overran:
            return RequestStatus.OVERRUN
        return RequestStatus.SUCCESS if self.stopped_at_limit or self.stopped_at_eos_as_allowed else ""

    @property
    def stopped_at_eos_as_allowed(self) -> bool:
        return self.finish_reason == "stop" and self.eos_ends_answer

    @property
    def short_reason(self) -> str:
        """Why a served request came back shorter than asked, where the server said why ("" otherwise)."""
        if self.finish_reason != "stop" or self.eos_ends_answer or self.output_tokens >= self.requested_tokens:
            return ""
        return EOS_DESPITE_IGNORE

    @property
    def length_mismatch(self) -> bool:
        """Served, but not as long as asked: past the limit, or short of it without the server saying it got there."""
        status = self.length_status
        return self.finish_reason in SERVED_REASONS and (
            status == RequestStatus.OVERRUN or (not status and self.output_tokens < self.requested_tokens)
        )

    @property
    def stopped_at_limit(self) -> bool:
        """The server said it stopped for length, without a count of its own that could say otherwise: it ran
        to the requested limit, however many tokens the text recounts to."""
        return (
            self.finish_reason == "length"
            and self.usage_completion_tokens is None
            and self.n_tokens > 0
            and not self.overran
        )

    @property
    def usage_only(self) -> bool:
        """Output known from the server's usage alone: no chunk had text (tokens that decode to part of a
        UTF-8 character, say). It still counts; its TTFT is then the stream's first byte."""
        return self.n_tokens == 0 and bool(self.usage_completion_tokens)


def retokenize(results: Sequence[RequestResult], tokenizer) -> None:
    """Count each output again with the model's tokenizer (LMDeploy's "retokenized" total)."""
    for result in results:
        if result.sent_ts is not None:
            texts = [t for t in (result.reasoning_text, result.text) if t]
            result.retokenized_tokens = sum(len(tokenizer.encode(t, add_special_tokens=False)) for t in texts)


def count_prompt(result: RequestResult, request: SampledRequest, tokenizer, chat: bool) -> int:
    """Our count of the prompt as the server got it. On the chat endpoint: its messages in the tokenizer's own chat
    template, with the assistant's turn opened, as the server renders them before it counts (a tokenizer without a
    template, or messages with images, fall back to the text). Else the request's own length, or a prompt built when
    it was sent counted anew."""
    if chat and not request.images:
        from jinja2 import TemplateError  # transformers' own, which renders the template

        messages = result.built_messages or request.messages or ({"role": "user", "content": request.prompt},)
        try:
            text = tokenizer.apply_chat_template(
                [dict(m) for m in messages], add_generation_prompt=True, tokenize=False
            )
        except (ValueError, TypeError, KeyError, TemplateError):  # no template, or one that refuses these messages
            pass
        else:
            return len(tokenizer.encode(text, add_special_tokens=False))
    if result.built_prompt is not None:
        return len(tokenizer.encode(result.built_prompt))
    return request.input_len
