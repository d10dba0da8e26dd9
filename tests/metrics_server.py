"""An OpenAI-compatible server on 127.0.0.1 serving its own Prometheus metrics, as LMDeploy, vLLM, SGLang and
llama.cpp's llama-server do.

It runs at most SLOTS requests at once; the others wait for a slot. Each request streams its max_tokens
chunks, the first FIRST_TOKEN_S after it got its slot, then one every CHUNK_GAP_S. Its metrics are kept
by prometheus_client itself (the library the Python servers use) under LMDeploy's, vLLM's, SGLang's or llama.cpp's
names, so GET /metrics answers with the exposition text those servers write: running and waiting requests, KV-cache
usage (running over SLOTS), prefix-cache figures, and TTFT, queue and end-to-end histograms observed on the server's
clock (llama.cpp: no histograms, no labels, and its prompt tokens leave out the cached ones).

Each flavour lives under its own prefix of the base URL (`{url}/lmdeploy`, `/vllm`, `/sglang`, `/llamacpp`), as do
servers that
fail at metrics: `/no-metrics` (404), `/garbled` (not Prometheus text), `/unknown` (metrics of no server we know),
`/flaky` (LMDeploy's page at the first read, HTTP 500 at every later one: the run's only).

`slow_metrics_server` is a server of its own, fresh for each test, whose /metrics is slow (a byte every 0.4 s) or
huge (300,000 label sets of one name), and which tells which process asked (`SlowMetricsServer`).
"""

from __future__ import annotations

import asyncio
import json
import threading

import prometheus_client
import psutil
import pytest
from aiohttp import web
from openai_server import add_openai_routes, serving

SLOTS = 2
FIRST_TOKEN_S = 0.05
CHUNK_GAP_S = 0.02
CACHED_TOKENS_PER_REQUEST = 3
PROMPT_TOKENS_PER_REQUEST = 12
SPEC_DRAFTS_PER_REQUEST, SPEC_ACCEPTED_PER_REQUEST = 4, 6  # mean acceptance length 1 + 6/4 = 2.5
# Of each request's 4 drafts of 3 tokens, 3 had their first token accepted, 2 their second, 1 their third: the 6.
SPEC_ACCEPTED_BY_POSITION = (3, 2, 1)
SPEC_DRAFT_TOKENS_PER_REQUEST = SPEC_DRAFTS_PER_REQUEST * len(SPEC_ACCEPTED_BY_POSITION)

prometheus_client.disable_created_metrics()  # as LMDeploy and vLLM do: no *_created samples


# Each server's name for what the state below keeps (sglang: gauges where the others count).
NAMES = {
    "lmdeploy": dict(
        running="num_requests_running",
        waiting="num_requests_waiting",
        usage="gpu_cache_usage_perc",
        hit_rate="prefix_cache_hit_rate",
        cached="cached_tokens",
        queue="request_queue_time_seconds",
    ),
    "vllm": dict(
        running="num_requests_running",
        waiting="num_requests_waiting",
        usage="kv_cache_usage_perc",
        hits="prefix_cache_hits",
        queries="prefix_cache_queries",
        queue="request_queue_time_seconds",
    ),
    "sglang": dict(
        running="num_running_reqs",
        waiting="num_queue_reqs",
        usage="token_usage",
        hit_rate="cache_hit_rate",
        cached="cached_tokens",
        accept_length="spec_accept_length",
        accept_rate="spec_accept_rate",
        queue="queue_time_seconds",
    ),
    "llamacpp": dict(
        running="requests_processing",
        waiting="requests_deferred",
        usage="kv_cache_usage_ratio",
        cached="prompt_tokens_cached",
        processed="prompt_tokens",
        predicted="tokens_predicted",
    ),
}
BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class ServerState:
    """One flavour's slots and metrics, named as that server names them (`NAMES`)."""

    def __init__(self, flavour: str):
        self.registry = prometheus_client.CollectorRegistry()
        self.slots = asyncio.Semaphore(SLOTS)
        self.busy = 0  # requests holding a slot
        self.speculated = 0  # drafts made so far, for SGLang's gauge
        labels = {"model_name": "tiny", "engine": "0"} if flavour == "lmdeploy" else {"model_name": "tiny"}
        names = dict(NAMES[flavour])
        if flavour == "llamacpp":
            labels = {}
        else:
            names.update(ttft="time_to_first_token_seconds", e2e="e2e_request_latency_seconds")
        if flavour in ("lmdeploy", "vllm"):
            names.update(
                drafts="spec_decode_num_drafts",
                draft_tokens="spec_decode_num_draft_tokens",
                accepted="spec_decode_num_accepted_tokens",
            )
        if flavour in ("lmdeploy", "vllm"):  # both also count the accepted tokens per draft position (from 0)
            self.position_labels = labels
            self.accepted_per_position = prometheus_client.Counter(
                f"{flavour}:spec_decode_num_accepted_tokens_per_pos",
                "accepted draft tokens per position of the scripted server",
                [*labels, "position"],
                registry=self.registry,
            )
        gauge, histogram = prometheus_client.Gauge, prometheus_client.Histogram
        kinds = dict(
            running=gauge,
            waiting=gauge,
            usage=gauge,
            hit_rate=gauge,
            accept_length=gauge,
            accept_rate=gauge,
            ttft=histogram,
            queue=histogram,
            e2e=histogram,
        )
        for field, name in names.items():
            kind = kinds.get(field, prometheus_client.Counter)
            options = {"buckets": BUCKETS} if kind is histogram else {}
            made = kind(
                f"{flavour}:{name}", f"{field} of the scripted server", list(labels), registry=self.registry, **options
            )
            setattr(self, field, made.labels(**labels) if labels else made)

    def page(self) -> bytes:
        return prometheus_client.generate_latest(self.registry)

    def observe(self, histogram: str, seconds: float) -> None:
        """An observation of its "ttft", "queue" or "e2e" histogram, where this server keeps one."""
        if hasattr(self, histogram):
            getattr(self, histogram).observe(seconds)

    def served(self) -> None:
        """A request got its prompt's prefix looked up: some tokens hit, as a prefix cache counts them."""
        if hasattr(self, "hits"):
            self.hits.inc(CACHED_TOKENS_PER_REQUEST)
            self.queries.inc(PROMPT_TOKENS_PER_REQUEST)
        elif hasattr(self, "processed"):  # llama.cpp: the cached tokens, and the prompt tokens it processed
            self.cached.inc(CACHED_TOKENS_PER_REQUEST)
            self.processed.inc(PROMPT_TOKENS_PER_REQUEST - CACHED_TOKENS_PER_REQUEST)
        else:
            self.cached.inc(CACHED_TOKENS_PER_REQUEST)
            self.hit_rate.set(CACHED_TOKENS_PER_REQUEST / PROMPT_TOKENS_PER_REQUEST)

    def drafted(self) -> None:
        """Speculative decoding verified a request's drafts (`SPEC_DRAFTS_PER_REQUEST` of
        `SPEC_ACCEPTED_BY_POSITION`'s length) and accepted `SPEC_ACCEPTED_BY_POSITION` of their tokens."""
        drafts, accepted = SPEC_DRAFTS_PER_REQUEST, SPEC_ACCEPTED_PER_REQUEST
        if hasattr(self, "accept_length"):  # SGLang serves the mean acceptance length and rate itself
            self.accept_length.set(1 + accepted / drafts)
            self.accept_rate.set(accepted / SPEC_DRAFT_TOKENS_PER_REQUEST)
        elif hasattr(self, "drafts"):
            self.drafts.inc(drafts)
            self.draft_tokens.inc(SPEC_DRAFT_TOKENS_PER_REQUEST)
            self.accepted.inc(accepted)
        if hasattr(self, "accepted_per_position"):
            for position, count in enumerate(SPEC_ACCEPTED_BY_POSITION):
                self.accepted_per_position.labels(**self.position_labels, position=str(position)).inc(count)


def _chunk(endpoint: str, text: str, finish_reason: str | None = None, usage: dict | None = None) -> bytes:
    choice = (
        {"index": 0, "delta": {"content": text} if text else {}, "finish_reason": finish_reason}
        if endpoint == "chat"
        else {"index": 0, "text": text, "finish_reason": finish_reason}
    )
    return b"data: " + json.dumps({"choices": [choice]} | ({"usage": usage} if usage else {})).encode() + b"\n\n"


def _answering(state: ServerState):
    async def answer(request: web.Request, endpoint: str) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        arrived = loop.time()
        body = await request.json()
        n = body.get("max_tokens") or body.get("max_completion_tokens") or 4
        state.waiting.inc()
        async with state.slots:
            state.waiting.dec()
            state.busy += 1
            state.running.set(state.busy)
            state.usage.set(state.busy / SLOTS)
            state.observe("queue", loop.time() - arrived)
            state.served()
            try:
                response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
                await response.prepare(request)
                await asyncio.sleep(FIRST_TOKEN_S)
                for i in range(n):
                    if i:
                        await asyncio.sleep(CHUNK_GAP_S)
                    await response.write(_chunk(endpoint, " tok"))
                    if i == 0:
                        state.observe("ttft", loop.time() - arrived)
                state.drafted()
                usage = {
                    "prompt_tokens": PROMPT_TOKENS_PER_REQUEST,
                    "completion_tokens": n,
                    "total_tokens": n + PROMPT_TOKENS_PER_REQUEST,
                }
                await response.write(_chunk(endpoint, "", "length", usage))
                await response.write(b"data: [DONE]\n\n")
                state.observe("e2e", loop.time() - arrived)
                return response
            finally:
                state.busy -= 1
                state.running.set(state.busy)
                state.usage.set(state.busy / SLOTS)

    return answer


def _text_page(text: str):
    async def page(request: web.Request) -> web.Response:
        return web.Response(text=text, content_type="text/plain")

    return page


def _make_app() -> web.Application:
    app = web.Application()
    for flavour in NAMES:
        state = ServerState(flavour)
        add_openai_routes(app, _answering(state), prefix=f"/{flavour}")

        async def metrics(request: web.Request, state: ServerState = state) -> web.Response:
            return web.Response(body=state.page(), content_type="text/plain")

        app.router.add_get(f"/{flavour}/metrics", metrics)
    plain = ServerState("lmdeploy")
    for prefix in ("no-metrics", "garbled", "unknown", "flaky"):
        add_openai_routes(app, _answering(plain), prefix=f"/{prefix}")
    app.router.add_get("/garbled/metrics", _text_page("<html><body>Not here</body></html>\n{{{ 12 }\n"))
    app.router.add_get(
        "/unknown/metrics",
        _text_page(
            "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 12.5\n"
            "# TYPE tgi_queue_size gauge\ntgi_queue_size 3\n"
        ),
    )
    reads = {"flaky": 0}

    async def flaky(request: web.Request) -> web.Response:  # answers the first read, then breaks
        reads["flaky"] += 1
        if reads["flaky"] == 1:
            return web.Response(body=plain.page(), content_type="text/plain")
        return web.Response(status=500, text="metrics exporter crashed")

    app.router.add_get("/flaky/metrics", flaky)
    return app


@pytest.fixture(scope="session")
def metrics_server() -> str:
    """Base URL of the server above: append /lmdeploy, /vllm, /sglang, /llamacpp, /no-metrics, /garbled, /unknown or
    /flaky."""
    with serving(_make_app()) as url:
        yield url


# ---- a slow page and a huge one -----------------------------------------------------------------------------

DRIBBLE_GAP_S = 0.4  # between two bytes of the dribbling page
# One sample of a name we read, so that the page would do once it were whole (after some 20 s).
DRIBBLED_PAGE = b'lmdeploy:num_requests_running{model_name="tiny"} 0\n'
HUGE_NAME = "lmdeploy:gpu_cache_usage_perc"
HUGE_LABEL_SETS = 300_000


class SlowMetricsServer:
    """An OpenAI server as above (LMDeploy's names) under two prefixes whose /metrics misbehave:

    - `{url}/dribble/metrics` answers 200 and its Content-Length, then sends DRIBBLED_PAGE a byte every
      DRIBBLE_GAP_S: `dribbling` is set once a dribble has begun, `dribbled_whole` once one has sent its last byte
      (a client that leaves cuts it short: the handler is cancelled);
    - `{url}/huge/metrics` is LMDeploy's page with HUGE_LABEL_SETS label sets of HUGE_NAME (some 20 MB), in its
      group as Prometheus text has it.

    Who asked is kept as the pid of the process holding the client's end of the connection: `metrics_pids` for
    each GET of /huge/metrics, `completion_pids` for each completion request (`parent_pids` maps each to its
    parent's, read while it lived)."""

    def __init__(self) -> None:
        self.dribbling = threading.Event()
        self.dribbled_whole = threading.Event()
        self.metrics_pids: list[int] = []
        self.completion_pids: list[int] = []
        self.parent_pids: dict[int, int] = {}
        self.url = ""  # once served
        self.state = ServerState("lmdeploy")
        self.app = web.Application()
        answer = _answering(self.state)

        async def answer_and_note(request: web.Request, endpoint: str) -> web.StreamResponse:
            self.completion_pids.append(await self._client_pid(request))
            return await answer(request, endpoint)

        for prefix in ("dribble", "huge"):
            add_openai_routes(self.app, answer_and_note, prefix=f"/{prefix}")
        self.app.router.add_get("/dribble/metrics", self._dribble)
        self.app.router.add_get("/huge/metrics", self._huge)
        self._extra_label_sets = b"".join(
            f'{HUGE_NAME}{{engine="{engine}",model_name="tiny"}} 0.5\n'.encode() for engine in range(1, HUGE_LABEL_SETS)
        )

    async def _dribble(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/plain", "Content-Length": str(len(DRIBBLED_PAGE))})
        await response.prepare(request)
        self.dribbling.set()
        for byte in DRIBBLED_PAGE:
            await response.write(bytes([byte]))
            await asyncio.sleep(DRIBBLE_GAP_S)
        self.dribbled_whole.set()
        return response

    async def _huge(self, request: web.Request) -> web.Response:
        self.metrics_pids.append(await self._client_pid(request))
        page = self.state.page()
        first = page.index(f"{HUGE_NAME}{{".encode())
        after = page.index(b"\n", first) + 1
        return web.Response(body=page[:after] + self._extra_label_sets + page[after:], content_type="text/plain")

    async def _client_pid(self, request: web.Request) -> int:
        """The pid of the process at the other end of the request's connection (it is open while we ask)."""
        peer = request.transport.get_extra_info("peername")
        ours = request.transport.get_extra_info("sockname")

        def find() -> int:
            for connection in psutil.net_connections(kind="tcp4"):
                if tuple(connection.laddr) == tuple(peer) and tuple(connection.raddr) == tuple(ours):
                    self.parent_pids[connection.pid] = psutil.Process(connection.pid).ppid()
                    return connection.pid
            raise AssertionError(f"no process holds the client's end of {peer}")

        return await asyncio.to_thread(find)


@pytest.fixture
def slow_metrics_server() -> SlowMetricsServer:
    """A fresh `SlowMetricsServer`, its base URL in `.url`."""
    server = SlowMetricsServer()
    with serving(server.app) as url:
        server.url = url
        yield server
