"""A benchmark client for OpenAI-compatible servers (LMDeploy api_server, vLLM, SGLang, transformers serve), and for
SGLang's native /generate (its answers read by `openai_stream.NativeReader`).

Requests go out on the schedule of `arrivals.send_offsets` (optionally capped by a max concurrency)
from one asyncio event loop in its own thread, over one pool of keep-alive connections (`http_stream`, whose
protocol reads each network read's SSE events in its own callback). What happens to each request comes out as `base.EngineEvent`s on a thread-safe queue, so a synchronous
`Engine.stream()` can drain them from another thread:

- "admit" when the request is sent (its clock starts here, as in `profile_restful_api.py` and vLLM); under a
  concurrency cap, a request that is due waits for a free slot first (`RequestResult.slot_wait_s`: no lateness);
- "tokens": a tick each time an SSE event brings new output once the answer has begun (below), timestamped
  when that event is read (one timestamp per event, as profile_restful_api.py takes one per line: two events
  that arrive in one network read are two ticks a few microseconds apart). The ticks of one network read go
  out as one event (`EngineEvent.earlier_ts`/`earlier_ns`, then its own `ts`/`n_tokens`), so a token costs
  two list appends here and in the runner's session, not an event of its own. `n_tokens` is cumulative: the server's per-chunk
  `usage.completion_tokens` where it sends one, else one per chunk with text (vLLM's convention);
- "finish" once, with "length", "stop", "error", "abort" (a cancel) or RUN_ENDED (the run's duration
  ended while it was in flight) and a message for the user. Its `n_tokens` is the best final count
  the client has: the server's usage where reported, else the tokens asked where the server said it stopped for
  length, else the chunk count (the engine, having retokenized the text after the run's clock, puts that count
  before the chunks: `RequestResult.output_tokens`).

A request fails when no new token came for the read timeout, or when it ran past its deadline
(`ServerSpec`); bytes without tokens, such as SSE keep-alive comments, do not keep it alive.

Reading the answers (SSE, chunks, usage, errors mid-stream) is `openai_stream`'s pure code.
Timing follows profile_restful_api.py: TTFT from sending to the first chunk with answer text, ITL per
tick gap, E2E to the last output (vLLM's end). Reasoning (`reasoning_content` / `reasoning` deltas, as
vLLM's, SGLang's and LMDeploy's reasoning parsers stream it) counts as output, as servers count it in
usage, but ticks no TTFT: its chunks before the answer are held back (`RequestResult.reasoning_ticks`)
and their tokens come with the answer's first tick; the first one's time is a metric of its own
(`RequestResult.first_reasoning_ts`). A request that streamed reasoning and no answer at all has
only its reasoning to time, and the engine ticks that instead. Each request also keeps the first byte
of the stream and its last SSE line (the usage chunk or [DONE]), where profile_restful_api.py stops
its E2E and TPOT. Per request, a `RequestResult` keeps the texts, the server's usage and (after
`retokenize`) the retokenized count, LMDeploy's second output figure, so lengths can be checked
against what was asked.

The API key is sent as a Bearer header and is never logged, stored, or shown (`repr` hides it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import queue
import resource
import threading
import time
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from ..config import check_values
from ..errors import BenchError, ConfigError
from ..load.arrivals import ArrivalReport, arrival_report
from ..load.datasets import SampledRequest
from ..load.schedule import SendSchedule
from ..redact import remember_secrets
from ..states import SERVED_REASONS
from .base import NOT_SENT_AFTER_FAILURE, RUN_ENDED, EngineEvent
from .http_route import DEFAULT_POLICY, NetworkPolicy, Origin, basic_auth, target_of
from .http_stream import (
    MAX_GET_BYTES,
    BodySink,
    BodyTooLarge,
    ConnectFailed,
    Connection,
    ConnectionPool,
    ConnectTimeout,
    HTTPStreamError,
    ProxyFailed,
    ResponseCut,
    ServerClosed,
    TLSFailed,
    failure_sentence,
    fetch,
    status_sentence,
)
from .loop_lag import LoopLag
from .openai_request import (
    API_KEY_ENV,
    NATIVE_ENDPOINT,
    RequestResult,
    ServerSpec,
    api_key_problem,
    api_root,
    build_payload,
)
from .openai_stream import (
    ERROR_BODY_CHARS,
    EventTooLarge,
    NativeReader,
    SSEMessage,
    SSEParser,
    StreamReader,
    error_text,
)

# What the client waits, after [DONE], for the body to end (its connection is reused only then).
DONE_GRACE_S = 0.5
# The start of every request's message once a server that answered this run refuses, closes unanswered or says
# 503: one reason in the run's summary, however many requests it ended.
WENT_AWAY = "the server went away"


class ServerError(BenchError):
    """A server that cannot be reached, or that answers in a way a benchmark cannot use."""


def auth_headers(api_key: str | None, url: str) -> dict[str, str]:
    """The API key as a Bearer header, else the URL's user-info as Basic auth, else none; ConfigError for a key no
    header can carry. A key sent is remembered as a secret: no message shows it, whatever words quote it."""
    key = api_key or os.environ.get(API_KEY_ENV)
    if key:
        if problem := api_key_problem(api_key):
            raise ConfigError(problem)
        remember_secrets(api_key=key)
        return {"Authorization": f"Bearer {key}"}
    origin = Origin(url)
    return {"Authorization": basic_auth(origin.user, origin.password)} if origin.user is not None else {}


def http_get(
    url: str,
    api_key: str | None = None,
    timeout_s: float = 10.0,
    network: NetworkPolicy = DEFAULT_POLICY,
    max_bytes: int = MAX_GET_BYTES,
) -> bytes:
    """The body of GET `url`, whole within `timeout_s`, with the API key as a Bearer header (else the URL's
    user-info as Basic auth, as the run's requests send it), on the run's transport and policy (`http_stream`);
    ServerError when the server cannot be reached, answers with an HTTP error or redirects elsewhere."""
    try:
        response = fetch(url, auth_headers(api_key, url), network, timeout_s, max_bytes)
    except HTTPStreamError as exc:
        raise ServerError(failure_sentence(url, exc)) from None
    if response.status != 200:
        raise ServerError(status_sentence(url, response))
    return response.body


def check_reachable(
    base_url: str,
    api_key: str | None = None,
    timeout_s: float = 10.0,
    network: NetworkPolicy = DEFAULT_POLICY,
) -> None:
    """ServerError unless the server answers GET /v1/models with some HTTP response, by the run's own route (its
    proxy, its TLS): a benchmark that names its model needs no list, only a server that is there."""
    url = api_root(base_url) + "/v1/models"
    try:
        fetch(url, auth_headers(api_key, url), network, timeout_s, max_bytes=ERROR_BODY_CHARS)
    except BodyTooLarge:
        return  # it answered
    except HTTPStreamError as exc:
        raise ServerError(failure_sentence(api_root(base_url), exc)) from None


def discover_model(
    base_url: str,
    api_key: str | None = None,
    timeout_s: float = 10.0,
    network: NetworkPolicy = DEFAULT_POLICY,
) -> str:
    """The first model the server lists at GET /v1/models (what it serves when no model is named)."""
    url = api_root(base_url) + "/v1/models"
    try:
        models = listed_models(http_get(url, api_key, timeout_s, network))
    except ValueError:
        raise ServerError(f"{url} did not answer with JSON: is this an OpenAI-compatible server?") from None
    if not models:
        raise ServerError(f"{url} lists no model; name the model to benchmark.")
    return models[0]


def listed_models(body: bytes) -> list[str]:
    """The model ids of a GET /v1/models answer, in its order (none when it lists none); ValueError when it is not
    JSON."""
    listing = json.loads(body)
    models = listing.get("data") if isinstance(listing, dict) else None
    if not isinstance(models, list):
        return []
    return [str(model["id"]) for model in models if isinstance(model, dict) and "id" in model]


Emit = Callable[[EngineEvent], None]


class _Deadline:
    """Cancels the running request once it has gone `token_timeout_s` without a new token (the first
    one included), has run `total_s`, or has reached the run's end `ends_in_s` from now; `expired`
    says which. Only tokens count: a server that sends keep-alive comments (": ping") but no tokens
    would otherwise hold a request, and the run, forever.

    A read timeout that re-arms a timer on every packet (aiohttp's `sock_read`) costs about 2 us each: a fifth of
    the client's time per token at hundreds of streams. Here new tokens only note the time
    (`heard_token`), and the one timer re-arms itself when it comes due.
    """

    SILENT, TOO_LONG, DURATION_OVER = "silent", "too long", "duration over"
    expired: str | None

    def __init__(self, token_timeout_s: float, total_s: float, ends_in_s: float = math.inf) -> None:
        task = asyncio.current_task()
        assert task is not None, "a request is sent from a task"
        self.token_timeout_s, self.expired = token_timeout_s, None
        self._loop, self._task = asyncio.get_running_loop(), task
        self.last_token = self._loop.time()
        self._hard_reason = self.TOO_LONG if total_s <= ends_in_s else self.DURATION_OVER
        self._hard = self.last_token + min(total_s, ends_in_s)
        self._timer = self._loop.call_at(self._due(), self._check)

    def _due(self) -> float:
        return min(self.last_token + self.token_timeout_s, self._hard)

    def heard_token(self) -> None:
        self.last_token = self._loop.time()

    def _check(self) -> None:
        due, now = self._due(), self._loop.time()
        if now < due:
            self._timer = self._loop.call_at(due, self._check)
        else:
            self.expired = self._hard_reason if now >= self._hard else self.SILENT
            self._task.cancel()

    def stop(self) -> None:
        self._timer.cancel()
        if self.expired:
            self._task.uncancel()  # the cancel was ours, and has been handled


async def send_request(
    pool: ConnectionPool,
    spec: ServerSpec,
    payload: dict,
    result: RequestResult,
    emit: Emit,
    ends_at: float = math.inf,
) -> None:
    """Send one request and report it through `emit`: admit, tokens as they come, one finish.

    Every failure (refused connection, HTTP error, timeout, a stream cut short) ends the request
    with "error" and a message; the tokens received before it stay counted. One still running at
    `ends_at` (perf_counter seconds: the end of the run's duration) ends RUN_ENDED.
    """
    reader = NativeReader() if spec.endpoint == NATIVE_ENDPOINT else StreamReader()
    result.sent_ts = time.perf_counter()
    emit(EngineEvent(result.index, "admit", result.sent_ts))
    deadline = _Deadline(spec.read_timeout_s, spec.total_timeout_s, ends_at - result.sent_ts)
    connection = None
    try:
        connection = await pool.post(target_of(spec.url), json.dumps(payload).encode())
        result.resent = connection.resent
        if connection.status != 200:
            body = await connection.body(4 * ERROR_BODY_CHARS)
            via = f" through the proxy {pool.proxy.shown}" if pool.proxy else ""
            said = f"HTTP {connection.status} {connection.reason} from {spec.url}{via}: {error_text(body)}"
            if connection.status == 404 and spec.endpoint == NATIVE_ENDPOINT:
                said += " (only SGLang serves /generate, its native API: is this an SGLang server?)"
            # A server shutting down answers 503 to what it no longer takes (vLLM, SGLang, uvicorn's apps).
            reader.error = f"{WENT_AWAY} or is overloaded ({said})" if connection.status == 503 else said
        elif spec.stream:
            await _read_stream(connection, reader, result, emit, deadline)
        else:
            reader.read_json(await connection.body())
            usage = reader.usage_completion_tokens
            result.first_byte_ts = result.last_line_ts = time.perf_counter()
            ticks_ts: list[float] = []
            ticks_ns: list[int] = []
            _tick(reader, result, result.last_line_ts, reader.n_tokens if usage is None else usage, ticks_ts, ticks_ns)
            _emit_ticks(result, emit, ticks_ts, ticks_ns)
        reason, message = reader.finish()
    except asyncio.CancelledError:
        if deadline.expired == _Deadline.SILENT:
            reason, message = (
                "error",
                f"the server sent no token for {spec.read_timeout_s:g} s (read timeout) after {reader.n_tokens} tokens",
            )
        elif deadline.expired == _Deadline.TOO_LONG:
            reason, message = (
                "error",
                f"the request ran past its {spec.total_timeout_s:g} s deadline after {reader.n_tokens} tokens",
            )
        elif deadline.expired == _Deadline.DURATION_OVER:
            reason, message = RUN_ENDED, f"cancelled when the run's duration ended, after {reader.n_tokens} tokens"
        else:
            reason, message = "abort", "cancelled"
    except ConnectFailed as exc:
        to = f"the proxy {exc.proxy} (for {spec.url})" if exc.proxy else spec.url
        hint = (
            "is the proxy running?"
            if exc.proxy
            else "is the host name right?"
            if exc.unresolved
            else "is the server running?"
        )
        if pool.answered and not exc.proxy:  # it answered this run before: shut down or restarted since
            reason, message = "error", f"{WENT_AWAY} (cannot connect to {spec.url} any more: {exc.cause})"
        else:
            reason, message = "error", f"cannot connect to {to} ({exc.cause}): {hint}"
    except (TLSFailed, ProxyFailed) as exc:
        reason, message = "error", str(exc)
    except ConnectTimeout:
        reason, message = "error", f"no connection to {spec.url} within {spec.connect_timeout_s:g} s"
    except ResponseCut as exc:
        reason, message = "error", f"the response was cut after {reader.n_tokens} tokens: {exc}"
    except ServerClosed as exc:
        if exc.nothing_received and pool.answered:  # closed unanswered, even on a fresh connection
            reason, message = "error", f"{WENT_AWAY} (it closed the connection without answering)"
        else:
            reason, message = "error", f"the server closed the connection after {reader.n_tokens} tokens"
    except EventTooLarge as exc:
        reason, message = "error", f"{exc} after {reader.n_tokens} tokens"
    except Exception as exc:  # anything else fails this request alone: the rest of the run goes on
        reason, message = "error", f"{type(exc).__name__}: {exc}"
    finally:
        deadline.stop()
        if connection is not None:
            pool.release(connection)
    result.end_ts = time.perf_counter()
    result.usage_completion_tokens, result.usage_prompt_tokens = (
        reader.usage_completion_tokens,
        reader.usage_prompt_tokens,
    )
    result.usage_source = reader.usage_source
    result.usage_cached_tokens = reader.usage_cached_tokens
    result.speculation = reader.speculation
    result.text, result.reasoning_text = "".join(reader.text_parts), "".join(reader.reasoning_parts)
    result.finish_reason, result.message = reason, message
    emit(EngineEvent(result.index, "finish", result.end_ts, result.output_tokens, reason, message))


async def _read_stream(
    connection: Connection, reader: StreamReader, result: RequestResult, emit: Emit, deadline: _Deadline
) -> None:
    """Read the SSE body in the connection's callback, each network read as it comes (`_stream_sink`); this task
    wakes only when the body ends or the sink stops it."""
    parser = SSEParser()
    connection.stream_to(_stream_sink(parser, reader, result, emit, deadline))
    await connection.wait_for(lambda: connection.body_done or connection.stopped)
    if reader.error:
        connection.close()  # the rest of the body is not read: the connection cannot serve another request
    elif reader.done:  # after [DONE] nothing counts; the body's end is waited for, so that its connection is reused
        with contextlib.suppress(TimeoutError, HTTPStreamError):
            async with asyncio.timeout(DONE_GRACE_S):
                await connection.wait_for(lambda: connection.body_done)
    elif messages := parser.close():
        _read_events(messages, reader, result, emit)


def _stream_sink(
    parser: SSEParser, reader: StreamReader, result: RequestResult, emit: Emit, deadline: _Deadline
) -> BodySink:
    """What the connection calls with each network read's body bytes: SSE events read and ticked at once. True
    (stop reading) on [DONE], on an error, or once a server that ignores the limit has streamed far past it."""
    stop_after = _stop_reading_after(result.requested_tokens)
    clock = time.perf_counter

    def on_body(chunk: bytes) -> bool:
        if result.first_byte_ts is None:
            result.first_byte_ts = clock()
        if messages := parser.feed(chunk):
            tokens_before = result.n_tokens
            _read_events(messages, reader, result, emit)
            if result.n_tokens > tokens_before:
                deadline.heard_token()
        if result.n_tokens > stop_after:
            reader.error = (
                f"the server streamed {result.n_tokens} tokens for the {result.requested_tokens} asked "
                "and went on: stopped reading"
            )
        return reader.done or reader.error is not None

    return on_body


def _stop_reading_after(requested_tokens: int) -> int:
    # A server that ignores the limit (an overrun) is still measured up to here; one that streams forever is not
    # waited for until the request's deadline hours later.
    return 2 * requested_tokens + 64


def _read_events(messages: list[SSEMessage], reader: StreamReader, result: RequestResult, emit: Emit) -> None:
    """Read one network read's events in order, each timestamped as it is read (a tick per event that brought
    output), and hand the read's ticks on as one event."""
    read, clock = reader.read_message, time.perf_counter
    ticks_ts: list[float] = []
    ticks_ns: list[int] = []
    for message in messages:
        read(message)
        ts = clock()
        if reader.n_tokens > result.n_tokens:
            _tick(reader, result, ts, reader.n_tokens, ticks_ts, ticks_ns)
    result.last_line_ts = ts
    _emit_ticks(result, emit, ticks_ts, ticks_ns)


def _emit_ticks(result: RequestResult, emit: Emit, ticks_ts: list[float], ticks_ns: list[int]) -> None:
    if ticks_ts:
        ts, tokens = ticks_ts.pop(), ticks_ns.pop()
        emit(EngineEvent(result.index, "tokens", ts, tokens, earlier_ts=ticks_ts, earlier_ns=ticks_ns))


def _tick(
    reader: StreamReader, result: RequestResult, ts: float, tokens: int, ticks_ts: list[float], ticks_ns: list[int]
) -> None:
    """Note output that grew since the last tick, once the answer has begun (its first chunk is the TTFT, as in
    profile_restful_api.py; the reasoning before it is held back, its tokens counted in that tick), and note when
    answer and reasoning text first came."""
    if tokens > result.n_tokens:
        result.n_tokens = tokens
        if reader.text_parts:
            if result.first_answer_ts is None:
                result.first_answer_ts = ts
                result.reasoning_ticks = []
            ticks_ts.append(ts)
            ticks_ns.append(tokens)
        else:
            result.reasoning_ticks.append((ts, tokens))
    if reader.reasoning_parts and result.first_reasoning_ts is None:
        result.first_reasoning_ts = ts


_END = object()
FLUSH_S = 0.01  # how often events are handed to the reading thread
# The longest the reading thread goes without a batch while the loop runs (an empty one where nothing happened): a
# reader in another process (client_workers) tells a running loop from a stopped or hung one by it.
HEARTBEAT_S = 1.0


class ClientRun:
    """One benchmark against a server, running in its own thread. Made by `run_requests`.

    `events()` yields the requests' EngineEvents as they happen, from any thread. `results` holds
    one RequestResult per request (complete once `events()` is exhausted); warm-ups are not in it.
    """

    def __init__(
        self,
        spec: ServerSpec,
        model: str,
        requests: Sequence[SampledRequest],
        schedule: SendSchedule,
        request_rate: float,
        max_concurrency: int | None,
        warmup: int,
        duration_s: float | None,
        ignore_eos: bool,
        cancel: threading.Event,
        start_at: float | None = None,
    ) -> None:
        self.spec, self.model, self.requests = spec, model, requests
        self.request_rate, self.max_concurrency, self.warmup, self.duration_s = (
            request_rate,
            max_concurrency,
            warmup,
            duration_s,
        )
        self.ignore_eos, self.cancel, self.schedule = ignore_eos, cancel, schedule
        self.start_at = start_at  # a t0 shared with other clients (client_workers); None: when the warm-up ends
        # A turn that follows another is scheduled once that one ends (NaN until then).
        self.results = [
            RequestResult(i, r.output_len, math.nan if (offset := schedule.offset(i)) is None else offset)
            for i, r in enumerate(requests)
        ]
        self._released: dict[int, asyncio.Event] = {}  # per follower: told when the request it follows ends
        self._dropped: set[int] = set()
        self.t0: float | None = None  # perf_counter when the first request was due, after warm-up
        self.error: BaseException | None = None
        # Events cross to the reading thread in batches, one queue item per FLUSH_S: a queue item per token
        # would wake that thread for every token and cost the client a good part of its throughput.
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._pending: list[EngineEvent] = []  # touched by the event loop's thread only
        self._handed_at = time.monotonic()  # when the reading thread last got a batch
        self._tasks: list[asyncio.Task] = []  # warm-ups and requests, for the cancel watcher
        self._thread = threading.Thread(target=self._main, name="openai-client", daemon=True)
        self.loop_lag = LoopLag()  # how late the loop ran, so how good each event's timestamp is

    def start(self) -> ClientRun:
        self._thread.start()
        return self

    def events(self) -> Iterator[EngineEvent]:
        """Every event until the run ends; raises the run's error (a failed warm-up, say) at the end."""
        for batch in self.batches():
            yield from batch

    def batches(self) -> Iterator[list[EngineEvent]]:
        """`events()` in the batches they cross threads in, for a reader that passes them on in batches too; one at
        least every HEARTBEAT_S while the loop runs, empty where nothing happened."""
        while (batch := self._events.get()) is not _END:
            yield batch
        self._thread.join()
        if self.error is not None:
            raise self.error

    def arrivals(self) -> ArrivalReport:
        """The rate asked for against the rate and concurrency the requests were actually sent at."""
        sent = [(r, r.sent_ts) for r in self.results if r.sent_ts is not None]
        t0 = math.nan if self.t0 is None else self.t0  # set before the first request is sent
        return arrival_report(
            self.request_rate,
            [t0 + r.scheduled_s for r, _ in sent],
            [sent_ts for _, sent_ts in sent],
            [math.nan if r.end_ts is None else r.end_ts for r, _ in sent],
        )

    def _main(self) -> None:
        try:
            asyncio.run(self.loop_lag.around(self._drive()))
        except BaseException as exc:  # handed to the thread that reads events()
            self.error = exc
        finally:
            self._flush()
            self._events.put(_END)

    def _emit(self, event: EngineEvent) -> None:
        self._pending.append(event)

    def _flush(self, beat: bool = False) -> None:
        if self._pending or beat:
            batch, self._pending = self._pending, []
            self._events.put(batch)
            self._handed_at = time.monotonic()

    async def _flush_periodically(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_S)
            self._flush(beat=time.monotonic() - self._handed_at >= HEARTBEAT_S)

    async def _drive(self) -> None:
        _raise_open_file_limit(self.max_concurrency or len(self.requests) + self.warmup)
        # One connection per request in flight, so `slots` (max_concurrency) caps the connections too.
        try:
            pool = ConnectionPool(
                Origin(self.spec.url),
                self.spec.connect_timeout_s,
                auth_headers(self.spec.api_key, self.spec.url),
                self.spec.network,
            )
        except ValueError as exc:
            raise ConfigError(f"Cannot send requests with these settings: {exc}.") from None
        slots = asyncio.Semaphore(self.max_concurrency) if self.max_concurrency else contextlib.nullcontext()
        watcher = asyncio.create_task(self._cancel_on_request())
        flusher = asyncio.create_task(self._flush_periodically())
        try:
            await self._warm_up(pool, slots)
            self.t0 = t0 = time.perf_counter() if self.start_at is None else self.start_at
            self.schedule.start(t0)
            self._released = {i: asyncio.Event() for i, r in enumerate(self.requests) if r.follows is not None}
            if self.cancel.is_set():  # during the warm-up; from here on the watcher cancels the tasks
                for result in self.results:
                    self._not_sent(result, "not sent: cancelled")
                return
            requests = [asyncio.create_task(self._send_when_due(pool, slots, result, t0)) for result in self.results]
            self._tasks += requests
            await asyncio.gather(*requests)
        finally:
            watcher.cancel()
            flusher.cancel()
            pool.close()

    async def _warm_up(self, pool: ConnectionPool, slots) -> None:
        """Send the first prompt `warmup` times, unmeasured, as vLLM does; a failure stops the run."""
        if not self.warmup or not self.requests:
            return
        first = self.requests[0]
        payload = build_payload(self.spec, self.model, first.prompt, first.output_len, self.ignore_eos)

        async def warm_once(result: RequestResult) -> None:
            async with slots:
                await send_request(pool, self.spec, payload, result, lambda event: None)

        results = [RequestResult(-1, first.output_len, 0.0) for _ in range(self.warmup)]
        warm_ups = [asyncio.create_task(warm_once(result)) for result in results]
        self._tasks += warm_ups
        await asyncio.gather(*warm_ups, return_exceptions=True)  # a cancelled one has no result to check
        failed = [r for r in results if r.finish_reason not in SERVED_REASONS]
        if failed and not self.cancel.is_set():
            raise ServerError(
                f"The warm-up request failed, so nothing was measured: {failed[0].message or failed[0].finish_reason}."
            )

    async def _send_when_due(self, pool: ConnectionPool, slots, result: RequestResult, t0: float) -> None:
        index = result.index
        request = self.requests[index]
        deadline = math.inf if self.duration_s is None else t0 + self.duration_s
        try:
            if request.follows is not None:  # until the turn it follows has ended
                await self._released[index].wait()
                if index in self._dropped:
                    return self._not_sent(result, NOT_SENT_AFTER_FAILURE)
                offset = self.schedule.offset(index)
                assert offset is not None, "due once the turn it follows has ended"
                result.scheduled_s = offset
            await asyncio.sleep(max(0.0, min(t0 + result.scheduled_s, deadline) - time.perf_counter()))
            waiting_since = time.perf_counter()
            async with slots:
                result.slot_wait_s = time.perf_counter() - waiting_since
                if time.perf_counter() >= deadline:
                    return self._not_sent(result, f"not sent: the {self.duration_s:g} s duration had ended")
                outgoing = self.schedule.take(index)
                if outgoing.built:
                    result.built_prompt, result.built_messages = outgoing.prompt, outgoing.messages
                payload = build_payload(
                    self.spec,
                    self.model,
                    outgoing.prompt,
                    request.output_len,
                    self.ignore_eos,
                    outgoing.messages,
                    request.images,
                )
                await send_request(pool, self.spec, payload, result, self._emit, ends_at=deadline)
            self._ended(result)
        except asyncio.CancelledError:  # cancelled before it was sent; send_request reports its own
            if result.sent_ts is None:
                self._not_sent(result, "not sent: cancelled")

    def _ended(self, result: RequestResult) -> None:
        """Tell the schedule a sent request ended: the turns after it are due (or, when it failed, never sent)."""
        assert result.end_ts is not None, "send_request has set it"
        served = result.finish_reason in SERVED_REASONS
        answer = result.text if served and self.schedule.wants_answer(result.index) else None
        dropped = self.schedule.finish(result.index, result.end_ts, served, answer)
        self._dropped.update(dropped)
        for follower in (*self.schedule.followers(result.index), *dropped):
            self._released[follower].set()

    def _not_sent(self, result: RequestResult, message: str) -> None:
        result.finish_reason, result.message = "abort", message
        self._emit(EngineEvent(result.index, "finish", time.perf_counter(), 0, "abort", message))

    async def _cancel_on_request(self) -> None:
        while not self.cancel.is_set():
            await asyncio.sleep(0.05)
        for task in self._tasks:
            task.cancel()


def _raise_open_file_limit(connections: int) -> None:
    """Hundreds of open streams need as many sockets; raise the soft limit as LMDeploy's client does."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = connections + 256  # files the rest of the process keeps open
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(
            resource.RLIMIT_NOFILE, (wanted if hard == resource.RLIM_INFINITY else min(wanted, hard), hard)
        )


def run_requests(
    spec: ServerSpec,
    model: str,
    requests: Sequence[SampledRequest],
    request_rate: float = math.inf,
    burstiness: float = 1.0,
    max_concurrency: int | None = None,
    warmup: int = 0,
    duration_s: float | None = None,
    cancel: threading.Event | None = None,
    ignore_eos: bool = True,
    arrival_seed: int | np.random.RandomState = 0,
    exact_rate_arrivals: bool = False,
    schedule: SendSchedule | None = None,
    start_at: float | None = None,
) -> ClientRun:
    """Start sending `requests` to the server and return the run; read it with `ClientRun.events()`.

    Sends follow `send_offsets(len(requests), request_rate, burstiness, arrival_seed, exact_rate_arrivals)`: by
    default profile_restful_api.py's draw, with `exact_rate_arrivals` rescaled to the exact rate; or `schedule`
    where it is given (a trace's times). A multi-turn turn goes once the one it follows has ended. A request due while
    `max_concurrency` are in flight waits for a slot, and its clock starts when it is sent (vLLM).
    `duration_s` ends the run once that long has passed since t0: requests in flight end RUN_ENDED,
    the rest "abort" with a "not sent" message. Setting `cancel` aborts everything within 0.1 s. `start_at` (a
    perf_counter time) is t0 where several clients share one start (client_workers).
    """
    check_values(max_concurrency=max_concurrency, warmup_requests=warmup, duration_s=duration_s)
    if schedule is None:
        schedule = SendSchedule.at_rate(requests, request_rate, burstiness, arrival_seed, exact_rate_arrivals)
    run = ClientRun(
        spec,
        model,
        requests,
        schedule,
        request_rate,
        max_concurrency,
        warmup,
        duration_s,
        ignore_eos,
        cancel or threading.Event(),
        start_at,
    )
    return run.start()
