"""Any OpenAI-compatible server (LMDeploy api_server, vLLM, SGLang, transformers serve) as an engine.

"Loading" asks the server which model it serves (unless one is named) and loads that model's
tokenizer, which samples the prompts and recounts the answers; it costs seconds, so the engine is
reloaded whenever a setting changes, load settings included. `stream()` drives
`openai_client.run_requests` and passes its events on, with these adjustments:

- a request's last "tokens" event (the ticks of one network read) is held until its "finish", which carries the
  best final count (`RequestResult.output_tokens`: the server's usage; else, where it said it stopped for length, the
  tokens asked; else our retokenized count of the text): the last tick is corrected to that count, not followed by
  another (servers may put several tokens in one chunk, so chunks undercount; llama.cpp's put the tokens of one UTF-8
  character in one);
- the run's clock stops at the client's last event ("end"): our tokenizer's work (retokenizing every answer, counting
  a prompt built when sent) comes after it, so that a long answer's retokenizing is in no duration. A request whose
  count is that retokenizing (no usage, no length stop) finishes after the "end"; the others finish as they end and
  get our counts in a "counted" event after it;
- a request that streamed reasoning and never an answer ticks its reasoning chunks, held back by the client
  for an answer that did not come: its TTFT is then its first reasoning chunk (`first_answer_s` says so: NaN);
- a request whose output the server reported only in its usage (no chunk had text) ticks 0 at the
  stream's first byte (its TTFT) and its usage count at the stream's last line (its E2E, and its one
  ITL gap), and is flagged `usage_only`: its tokens count, with the only timing there is;
- the "finish" event says where the request's length stands where the count cannot
  (`RequestResult.length_status`): complete when the server, reporting no usage, said it stopped
  for length, or stopped at EOS without being asked to ignore it (the default kind, llama.cpp, any server that
  takes no ignore_eos); short, named so, when it stopped at EOS although asked to ignore it; overrun, with the
  limit field it seems to ignore, when it produced more than asked;
- the "finish" event carries the request's extras: the usage count (our retokenized one with it, or in "counted"),
  where its count came from, whether the length differs from the one asked, when the first answer and reasoning texts came, the E2E to the
  stream's last line (profile_restful_api.py's end; the ticks end at the last output, vLLM's), and
  when it was scheduled, sent and ended on the client's clock (the load actually delivered);
- a request a duration kept from being sent ends NOT_SENT: it stays unfinished rather than failed; one
  in flight when the duration ends comes as RUN_ENDED from the client: cancelled, not failed.

The load patterns map onto the client: request_rate uses the rate, burstiness and max concurrency;
concurrency N sends everything at once through N slots (profile_throughput.py); batch does the same
with every clock starting at t0 (the runner's ticks); trace sends each request at its trace time (load.schedule),
at most concurrency at once. Warm-up requests go out before the clock starts. The server's
usage.prompt_tokens_details.cached_tokens, where it sends one, is the request's cached prompt tokens. SGLang's native
/generate endpoint reports each request's speculative decoding in its answer: it lands in the embedded engine's
per-request columns (`openai_request.speculation_columns`).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import json
import math
import os
import threading
import urllib.parse
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np

from ..config import (
    EngineConfig,
    GenerationSettings,
    LoadConfig,
    client_in_workers,
    sampling_problems,
)
from ..config.catalog import AUTO_SERVER_KIND
from ..errors import ConfigError, ModelError
from ..load.datasets import SampledRequest
from ..load.schedule import SendSchedule, send_columns
from ..models.packages import install_command
from ..models.resolve import load_tokenizer
from ..redact import redact_text
from ..states import SERVED_REASONS, LoadPattern, RequestStatus
from .base import NOT_SENT, Backend, Engine, EngineEvent, EngineInfo

if TYPE_CHECKING:  # the client is imported where it is used: the registry imports this module
    from .client_workers import ClientWorkers, ProcessClientRun
    from .http_route import NetworkPolicy
    from .openai_client import ClientRun
    from .openai_request import RequestResult, ServerSpec
    from .server_metrics import MetricsScraper


def extra_body(engine: EngineConfig) -> dict | None:
    """The extra request body as a dict (None when empty); ConfigError when it is not a JSON object."""
    text = engine.extra_request_body.strip()
    if not text:
        return None
    try:
        body = json.loads(text)
    except ValueError as exc:
        raise ConfigError(
            f'The extra request body is not valid JSON ({exc}): write an object such as {{"temperature": 0}}.'
        ) from None
    if not isinstance(body, dict):
        raise ConfigError('The extra request body must be a JSON object, such as {"temperature": 0}.')
    return body


def server_spec(engine: EngineConfig, stream: bool = True) -> ServerSpec:
    """How to reach the server; ConfigError for an impossible URL, endpoint, kind or extra body. A kind left to
    AUTO_SERVER_KIND is the generic one here (SGLang on its native endpoint): the engine replaces a generic one with
    the kind it detects when it loads."""
    from .openai_request import GENERIC_KIND, NATIVE_ENDPOINT, NATIVE_KIND, ServerSpec

    if not engine.base_url.strip():
        raise ConfigError("No server URL given: enter the base URL of the server, like http://127.0.0.1:23333.")
    kind = engine.server_kind
    if kind == AUTO_SERVER_KIND:  # SGLang's native endpoint says which server it is
        kind = NATIVE_KIND if engine.endpoint == NATIVE_ENDPOINT else GENERIC_KIND
    return ServerSpec(
        base_url=engine.base_url.strip(),
        api_key=engine.api_key or None,
        endpoint=engine.endpoint,
        server_kind=kind,
        stream=stream,
        extra_body=extra_body(engine),
        chat_limit_field=engine.chat_limit_field,
        read_timeout_s=engine.read_timeout_s,
        network=network_policy(engine),
    )


def network_policy(engine: EngineConfig) -> NetworkPolicy:
    """How every request to the server travels: proxies and TLS, from the engine's settings."""
    from .http_route import NetworkPolicy

    return NetworkPolicy(engine.proxy_env, engine.ca_bundle.strip(), engine.insecure)


def _credential_problems(spec) -> list[str]:
    """A request carries one credential, in a header: an API key no header can carry (a line break pasted with it),
    or a URL's user:password (basic auth) and an API key (a bearer header) both set, would make every request
    fail, so the run is refused before anything is sent."""
    from .openai_request import API_KEY_ENV, api_key_problem

    user_info = urllib.parse.urlsplit(spec.base_url).username is not None
    if problem := api_key_problem(spec.api_key):
        return [problem]
    if user_info and (spec.api_key or os.environ.get(API_KEY_ENV)):
        return [
            f"The server URL carries a user name or password and an API key is set too (the API key field or "
            f"${API_KEY_ENV}): a request sends only one credential. Remove one of them."
        ]
    return []


def _split_problems(load: LoadConfig) -> list[str]:
    """A concurrency limit the client processes cannot share (client_workers)."""
    from .client_workers import concurrency_problems

    slots = load.max_concurrency if load.load_pattern == LoadPattern.REQUEST_RATE else load.concurrency
    return concurrency_problems(load.client_processes, slots)


class OpenAIBackend(Backend):
    """Any OpenAI-compatible server, reached over HTTP."""

    names = ("openai",)
    order = 2
    in_process = False
    tokenizer_from_engine = True
    needs_model = False
    load_patterns = (
        LoadPattern.BATCH,
        LoadPattern.CONCURRENCY,
        LoadPattern.REQUEST_RATE,
        LoadPattern.TRACE,
    )  # no engine API over HTTP
    load_pattern = LoadPattern.REQUEST_RATE
    takes_images = True  # in chat messages, to a vision model's server

    @classmethod
    def context_window(cls, engine: EngineConfig) -> int | None:
        """None: the server enforces its own window."""
        return None

    @classmethod
    def availability(cls, backend: str) -> str | None:
        """None when the server metrics' parser is installed (the HTTP client is this project's own, http_stream)."""
        if importlib.util.find_spec("prometheus_client") is None:
            return f"The OpenAI-compatible client needs prometheus_client: {install_command(['prometheus_client'])}"
        return None

    @classmethod
    def validate(cls, engine: EngineConfig, load: LoadConfig) -> list[str]:
        try:
            spec = server_spec(engine)
        except ConfigError as exc:
            return [str(exc)]
        # top_k is left to the server: vLLM and SGLang take -1 for "no limit", LMDeploy 0.
        body = {key: value for key, value in (spec.extra_body or {}).items() if key != "top_k"}
        return (
            sampling_problems(body, "In the extra request body, ") + _credential_problems(spec) + _split_problems(load)
        )

    @classmethod
    def settings_key(cls, engine: EngineConfig, load: LoadConfig) -> tuple:
        """Every setting, load settings included: loading costs nothing and asks the server afresh which
        model it serves, so each new setting starts from what the server serves now."""
        return (*dataclasses.astuple(engine), *dataclasses.astuple(load))

    @classmethod
    def load(cls, engine: EngineConfig, load: LoadConfig) -> Engine:
        return OpenAIEngine(engine, load.client_processes)


# The route that drops a server's prefix cache, by server kind (a POST without a body).
PREFIX_CACHE_RESETS = {"vllm": "/reset_prefix_cache", "sglang": "/flush_cache"}
# Why a kind's reset route may be missing: vLLM serves its development routes only in its development mode.
PREFIX_CACHE_RESET_HINTS = {"vllm": " (vLLM serves it only when started with VLLM_SERVER_DEV_MODE=1)"}


class OpenAIEngine(Engine):
    """A server behind a base URL, measured with the semantics of profile_restful_api.py and vLLM."""

    resets_prefix_cache = True

    def __init__(self, engine: EngineConfig, client_processes: int = 1):
        from .openai_client import ServerError, discover_model
        from .openai_request import GENERIC_KIND, api_root, ignore_eos_sent
        from .server_identity import identify_server

        self.spec = server_spec(engine)
        self._metrics_interval_s = engine.server_metrics_interval_s if engine.server_metrics else None
        self._loop_lag: list[tuple[float, float]] = []  # the last run's (ClientRun.loop_lag)
        root = api_root(self.spec.base_url)
        notes = []
        if engine.server_kind == AUTO_SERVER_KIND and self.spec.server_kind == GENERIC_KIND:
            try:
                identity = identify_server(root, self.spec.api_key, self.spec.network)
            except ServerError as exc:
                if not engine.model.strip():  # the model was to come from that answer
                    raise
                # A named model needs no listing (a proxy may have none): the kind is then the plain OpenAI one.
                identity = None
                self.spec = dataclasses.replace(self.spec, server_kind=GENERIC_KIND)
                notes.append(f"server kind: {GENERIC_KIND}, as the server could not say ({exc})")
            if identity is not None:
                self.spec = dataclasses.replace(self.spec, server_kind=identity.kind)
                notes.append(identity.note)
                if not (engine.model.strip() or identity.models):
                    raise ServerError(f"{root}/v1/models lists no model; name the model to benchmark.")
                self.model = engine.model.strip() or identity.models[0]
            else:
                self.model = engine.model.strip()  # named: without it the failure was raised
        else:
            self.model = engine.model.strip() or discover_model(root, self.spec.api_key, network=self.spec.network)
        if not ignore_eos_sent(self.spec.server_kind, True):
            notes.append(
                f"ignore_eos: a server of kind {self.spec.server_kind} is not sent it, so an answer that stops at "
                "EOS before its token limit is whole (served), not short"
            )
        tokenizer_name = engine.tokenizer.strip() or self.model
        try:
            self._tokenizer = load_tokenizer(tokenizer_name, engine.trust_remote_code)
        except ModelError as exc:
            raise ModelError(
                f"{exc}. The server's model '{self.model}' must have a tokenizer here: name one "
                "(--tokenizer, or the Tokenizer field): a local folder, a built-in model or a hub id."
            ) from None
        shown_root = redact_text(root)  # the info is recorded and shown: no user-info from the URL
        self.info = EngineInfo(
            backend="openai",
            model=self.model,
            model_path=shown_root,
            dtype="server's",
            device=f"{self.spec.server_kind} server at {shown_root} ({self.spec.endpoint} endpoint)",
            notes=[*notes, f"tokenizer: {tokenizer_name}"],
        )
        self._client_processes = client_processes
        self._workers: ClientWorkers | None = None
        self._start_workers()

    def _start_workers(self) -> None:
        """The client's worker processes, where the run sends from several (client_workers): started with the
        engine, so that their start-up is not in a run's time."""
        if client_in_workers(self._client_processes) and (self._workers is None or self._workers.broken):
            from .client_workers import ClientWorkers

            if self._workers is not None:
                self._workers.close()
            self._workers = ClientWorkers(self._client_processes)

    def close(self) -> None:
        if self._workers is not None:
            self._workers.close()

    @property
    def tokenizer(self):
        return self._tokenizer

    def warmup(
        self,
        requests: Sequence[SampledRequest],
        generation: GenerationSettings,
        load: LoadConfig,
        cancel: threading.Event,
    ) -> None:
        """Send the first prompt `load.warmup_requests` times, unmeasured, as vLLM does; a failure stops the run."""
        from .openai_client import ServerError, run_requests

        count = load.warmup_requests
        if not count or not requests:
            return
        spec = self._spec_for(generation, load)
        if load.duration_s is not None:  # waiting longer for a token than the whole run may last: a failed warm-up
            spec = dataclasses.replace(spec, read_timeout_s=min(spec.read_timeout_s, load.duration_s))
        run = run_requests(
            spec,
            self.model,
            [requests[0]] * count,
            max_concurrency=load.max_concurrency,
            cancel=cancel,
            ignore_eos=generation.ignore_eos,
        )
        for _ in run.events():
            pass
        failed = [r for r in run.results if r.finish_reason not in SERVED_REASONS]
        if failed and not cancel.is_set():
            raise ServerError(
                f"The warm-up request failed, so nothing was measured: {failed[0].message or failed[0].finish_reason}."
            )

    def stream(
        self,
        requests: Sequence[SampledRequest],
        generation: GenerationSettings,
        load: LoadConfig,
        cancel: threading.Event,
        arrival_seed: int | np.random.RandomState = 0,
    ) -> Iterator[EngineEvent]:
        """`Engine.stream`; under a request rate, arrivals draw from `arrival_seed` (`arrivals.send_offsets`); a trace
        sends each request at its time, at most `load.concurrency` at once."""
        from .openai_client import run_requests
        from .openai_request import ignore_eos_sent, retokenize

        by_rate = load.load_pattern == LoadPattern.REQUEST_RATE
        trace = load.load_pattern == LoadPattern.TRACE
        spec = self._spec_for(generation, load)
        rate = load.request_rate if by_rate else math.inf
        limit = load.max_concurrency if by_rate else load.concurrency
        schedule = SendSchedule(requests, load) if trace else None
        if client_in_workers(self._client_processes):  # the schedule drawn here, once, as run_requests draws it
            self._start_workers()  # again, where a worker died in the last run
            schedule = schedule or SendSchedule.at_rate(
                requests, rate, load.burstiness, arrival_seed, load.exact_rate_arrivals
            )
            assert self._workers is not None, "started just above"
            run: ClientRun | ProcessClientRun = self._workers.run(
                spec, self.model, requests, schedule, limit, load.duration_s, generation.ignore_eos, cancel
            )
        else:
            run = run_requests(
                spec,
                self.model,
                requests,
                request_rate=rate,
                burstiness=load.burstiness,
                arrival_seed=arrival_seed,
                exact_rate_arrivals=load.exact_rate_arrivals,
                max_concurrency=limit,
                duration_s=load.duration_s,
                cancel=cancel,
                ignore_eos=generation.ignore_eos,
                schedule=schedule,
            )
        self._loop_lag = run.loop_lag.samples  # this run's, from now on, however it ends
        eos_ends_answer = not ignore_eos_sent(spec.server_kind, generation.ignore_eos)
        held: dict[int, tuple[EngineEvent, int]] = {}  # index -> (last tokens event, count ticked before it)
        recounted: dict[int, EngineEvent] = {}  # finishes whose count is our tokenizer's: told after the clock
        counted: list[int] = []  # the sent requests finished before the clock stopped, our own counts to come
        last_ts, error = None, None
        try:
            for event in run.events():
                last_ts = event.ts if last_ts is None else max(last_ts, event.ts)
                if event.kind == "tokens":
                    before = held.pop(event.index, None)
                    if before is not None:
                        yield before[0]
                    ticked_before = event.earlier_ns[-1] if event.earlier_ns else before[0].n_tokens if before else 0
                    held[event.index] = (event, ticked_before)
                elif event.kind == "finish":
                    result = run.results[event.index]
                    if result.sent_ts is None:
                        yield dataclasses.replace(event, finish_reason=NOT_SENT)
                        continue
                    result.eos_ends_answer = eos_ends_answer
                    if result.needs_recount:
                        recounted[event.index] = event
                        continue
                    counted.append(event.index)
                    yield from self._finished(event, result, held, run)
                else:  # an admit: a prompt built when it was sent is counted after the clock, with the rest
                    yield event
        except Exception as exc:  # the run's own error, raised once what it measured is handed over
            error = exc
        # The client's last event ends the run's clock: retokenizing (seconds for a long answer) is this client's own
        # work, not the server's, and stays out of every duration and throughput.
        if last_ts is not None:
            yield EngineEvent(0, "end", last_ts)
        retokenize(run.results, self._tokenizer)
        ours = {index: self._count_prompt(run.results[index], requests[index]) for index in (*counted, *recounted)}
        for event in recounted.values():
            yield from self._finished(event, run.results[event.index], held, run, ours[event.index])
        for index in counted:
            assert last_ts is not None, "its finish was an event"
            result = run.results[index]
            extra = self._own_counts(result, ours[index])
            yield EngineEvent(index, "counted", last_ts, extra=extra, input_len=_input_len(result, ours[index]))
        if error is not None:
            raise error

    def _finished(
        self,
        event: EngineEvent,
        result: RequestResult,
        held: dict[int, tuple[EngineEvent, int]],
        run: ClientRun | ProcessClientRun,
        our_input_len: int | None = None,
    ) -> Iterator[EngineEvent]:
        """A sent request's last ticks, corrected to its best count, then its "finish" with its columns; our own
        counts with them where they are made (`our_input_len`: after the clock), else the server's alone."""
        from .openai_request import overrun_advice

        count = result.output_tokens
        last = held.pop(event.index, None)
        if last is not None:
            last_event, ticked_before = last
            yield dataclasses.replace(last_event, n_tokens=max(count, ticked_before))
        elif result.reasoning_ticks:  # no answer came: its reasoning is all the output there is to time
            *before, (last_ts, _) = result.reasoning_ticks
            yield from (EngineEvent(event.index, "tokens", ts, tokens) for ts, tokens in before)
            yield EngineEvent(event.index, "tokens", last_ts, max(count, before[-1][1] if before else 0))
        elif result.usage_only:
            assert result.first_byte_ts is not None and result.last_line_ts is not None, "its body was read"
            yield EngineEvent(event.index, "tokens", result.first_byte_ts, 0)
            yield EngineEvent(event.index, "tokens", result.last_line_ts, count)
        length_status = result.length_status
        if length_status == RequestStatus.OVERRUN:
            message = overrun_advice(run.spec)
        else:
            message = event.message or result.short_reason
        extra = self._extras(result, run)
        if our_input_len is not None:
            extra.update(self._own_counts(result, our_input_len))
        input_len = _input_len(result, our_input_len)
        yield dataclasses.replace(
            event,
            n_tokens=count,
            message=message,
            text=result.text,
            extra=extra,
            length_status=length_status,
            input_len=input_len,
        )

    def client_pids(self) -> list[int]:
        return self._workers.pids if self._workers is not None else []

    def loop_lag(self) -> list[tuple[float, float]]:
        return self._loop_lag

    def _spec_for(self, generation: GenerationSettings, load: LoadConfig) -> ServerSpec:
        """The server, asked as this run asks it: streamed or not, greedy or sampling."""
        from .openai_request import sampling_fields

        return dataclasses.replace(
            self.spec, stream=load.stream_output, sampling=sampling_fields(generation, self.spec.server_kind)
        )

    def reset_prefix_cache(self) -> str:
        """The server's own reset, by its kind: vLLM's POST /reset_prefix_cache, SGLang's POST /flush_cache.
        LMDeploy's api_server has none (0.18: its /sleep and /wakeup free and restore memory, and nothing there resets
        the prefix trie), nor have the others."""
        from .http_stream import HTTPStreamError, failure_sentence, fetch, status_sentence
        from .openai_client import auth_headers
        from .openai_request import api_root

        route = PREFIX_CACHE_RESETS.get(self.spec.server_kind)
        if route is None:
            return f"a {self.spec.server_kind} server has no prefix-cache reset that this tool knows of"
        url = api_root(self.spec.base_url) + route
        try:
            response = fetch(url, auth_headers(self.spec.api_key, url), self.spec.network, method="POST")
        except HTTPStreamError as exc:
            return failure_sentence(url, exc)
        if 200 <= response.status < 300:
            return ""
        hint = PREFIX_CACHE_RESET_HINTS.get(self.spec.server_kind, "") if response.status == 404 else ""
        return status_sentence(url, response).removesuffix(".") + hint

    def metrics_scraper(self) -> MetricsScraper | None:
        """A reader of the server's Prometheus page at /metrics, unless the settings turned it off."""
        from .openai_client import auth_headers
        from .openai_request import api_root
        from .server_metrics import METRICS_SWITCHES, MetricsScraper

        if self._metrics_interval_s is None:
            return None
        url = api_root(self.spec.base_url) + "/metrics"
        return MetricsScraper(
            url,
            self._metrics_interval_s,
            auth_headers(self.spec.api_key, url),
            self.spec.network,
            METRICS_SWITCHES.get(self.spec.server_kind, ""),
        )

    def _extras(self, result: RequestResult, run: ClientRun | ProcessClientRun) -> dict:
        """The request-table columns of one sent request that need none of our tokenizer's work (times in seconds;
        NaN: never happened)."""
        from .openai_request import speculation_columns

        sent_ts, t0 = result.sent_ts, run.t0
        assert sent_ts is not None and t0 is not None, "sent, after the run's start"
        return {
            **speculation_columns(result.speculation),
            "usage_input_len": math.nan if result.usage_prompt_tokens is None else float(result.usage_prompt_tokens),
            "usage_output_len": math.nan
            if result.usage_completion_tokens is None
            else float(result.usage_completion_tokens),
            "cached_tokens": math.nan if result.usage_cached_tokens is None else float(result.usage_cached_tokens),
            "output_len_source": result.output_source,
            "length_mismatch": result.length_mismatch,
            "first_answer_s": _since(sent_ts, result.first_answer_ts),
            "first_reasoning_s": _since(sent_ts, result.first_reasoning_ts),
            "e2e_last_line_s": _since(sent_ts, result.last_line_ts),
            "usage_only": result.usage_only,
            "resent": result.resent,
            **send_columns(result.scheduled_s, sent_ts, result.end_ts, t0),
            "slot_wait_s": result.slot_wait_s,
        }

    @staticmethod
    def _own_counts(result: RequestResult, our_input_len: int) -> dict:
        """The request-table columns of our tokenizer's counts, made after the run's clock stopped."""
        return {"retokenized_output_len": result.retokenized_tokens, "tokenizer_input_len": our_input_len}

    def _count_prompt(self, result: RequestResult, request: SampledRequest) -> int:
        from .openai_request import count_prompt

        return count_prompt(result, request, self._tokenizer, self.spec.endpoint == "chat")


def _input_len(result: RequestResult, ours: int | None) -> int:
    """A request's input count: the server's prompt_tokens where it sent them, else ours (None: not made yet; 0 then
    leaves the request's own length in place)."""
    if result.usage_prompt_tokens is not None:
        return result.usage_prompt_tokens
    return ours or 0


def _since(start: float, end: float | None) -> float:
    return math.nan if end is None else end - start
