"""HTTP/1.1 for every request a benchmark makes: its streamed POSTs and its GETs (the model list, the server's
/metrics, a sweep's readiness check), on pooled keep-alive connections under one policy (`NetworkPolicy`).

The framing is httptools' (llhttp, the C parser under uvicorn); what is ours is the pooling and the callback
path. A general client (aiohttp) costs, per network read of a stream, a future, a task wake-up, its stream
reader's buffers and its chunked decoder's hand-off, before the caller's parser has seen a byte: at hundreds
of streams that was half of the client's CPU per token. Here `data_received` hands the read to the parser and
the body bytes it yields to the exchange's sink in the same callback, one call per read; the request's task
wakes only when the response's head has come, when the sink asks to stop, when the body ends, or on a failure.

Connection reuse is where real servers differ. A connection goes back to the pool only after a response read
to its end that keeps it alive; one the server has closed, or said it will close (Connection: close, a
Keep-Alive max reached, idle past its Keep-Alive timeout), is never handed out. Some servers (llama.cpp's)
close after every response while they advertise keep-alive, and the close can cross the next request on the
wire: a request whose reused connection ends before any byte of its response is sent again, once, on a fresh
connection (`Connection.resent`). Nothing was processed then, as urllib3 and aiohttp also assume.

The policy: proxies from the environment as curl and Go read them (`http_proxy`, `https_proxy`, `all_proxy`,
`no_proxy`, either case, lower case first), loopback always direct: plain HTTP through the proxy, HTTPS in a
CONNECT tunnel. TLS against the system's store, or a CA bundle, or unverified when asked. A GET follows
redirects within its origin only, so credentials never reach another host; a POST follows none. Timeouts:
connect, then the caller's (a GET's whole response; a stream's next token, `openai_client`).

What it does not do, because an OpenAI-compatible server needs none of it: cookies, compressed bodies (it asks
for identity), HTTP/2, https:// proxies, CIDR ranges in no_proxy, request bodies that are not one bytes object.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import socket
import ssl
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import httptools

from .http_route import DEFAULT_POLICY, NetworkPolicy, Origin, basic_auth, target_of

# Longest response head accepted: a server sending more is not speaking HTTP to us (llhttp sets no bound).
MAX_HEAD_BYTES = 64 * 1024
KEEPALIVE_S = 60.0  # an idle connection older than this is closed rather than reused (servers drop them)
MAX_REDIRECTS = 5
MAX_GET_BYTES = 64 * 1024 * 1024
_REDIRECTS = (301, 302, 303, 307, 308)

# Called with each network read's body bytes; True when the reading should stop (the body's rest is dropped).
BodySink = Callable[[bytes], bool]


class HTTPStreamError(Exception):
    """A failure of the connection or of the response's framing; its message names what failed."""


class ConnectFailed(HTTPStreamError):
    """No connection: refused, unknown host. `proxy`: the proxy it was to go through, if any."""

    def __init__(self, os_error: OSError, where: str, proxy: str | None = None) -> None:
        if os_error.errno and os_error.errno > 0 and not isinstance(os_error, socket.gaierror):
            cause = os.strerror(os_error.errno)  # asyncio's own words name the address, not what went wrong
        else:
            cause = os_error.strerror or str(os_error) or type(os_error).__name__
        to = f"the proxy {proxy} (for {where})" if proxy else where
        super().__init__(f"cannot connect to {to} ({cause})")
        self.os_error, self.proxy, self.cause = os_error, proxy, cause
        self.unresolved = isinstance(os_error, socket.gaierror)  # no address for the host name


class ConnectTimeout(HTTPStreamError):
    """No connection within the connect timeout."""


class TLSFailed(HTTPStreamError):
    """The TLS handshake failed: an untrusted or wrong certificate, or no TLS at that address."""


class ProxyFailed(HTTPStreamError):
    """The proxy refused the tunnel, or is not one this client can use."""


class ServerClosed(HTTPStreamError):
    """The server closed the connection before the response's head was complete."""

    def __init__(self, message: str, nothing_received: bool) -> None:
        super().__init__(message)
        self.nothing_received = nothing_received  # not one byte of the response came


class ResponseCut(HTTPStreamError):
    """The connection ended inside the response's body, before its framing said it was complete."""


class BadResponse(HTTPStreamError):
    """What came back is not an HTTP/1.x response this client can read."""


class ResponseTimeout(HTTPStreamError):
    """A GET's whole response did not come within its timeout."""


class BodyTooLarge(HTTPStreamError):
    """A GET's body is longer than its caller reads."""


class RedirectRefused(HTTPStreamError):
    """A GET redirected to another origin (or too many times): not followed."""


# --- one connection --------------------------------------------------------------------------------------

_DISCARD = object()  # the sink after it asked to stop: what is left of the body is framed, not read


class Connection(asyncio.Protocol):
    """One keep-alive connection and the exchange on it, if any. Its state changes only in the loop's callbacks
    and in the owning task between awaits, so nothing here needs a lock. httptools calls the `on_*` methods from
    inside `feed_data`."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self.idle_limit_s = KEEPALIVE_S
        self.exchanges = 0  # responses read on it
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future | None = None
        self._tunnel: asyncio.Future | None = None  # a CONNECT's reply, while the tunnel is being made
        self.begin()
        self.in_exchange = False

    # --- the owning task's side ---

    def begin(self) -> None:
        """Ready for a new exchange: no head, no body, no failure."""
        self.in_exchange = True
        self.status, self.reason = 0, ""
        self.headers: dict[str, str] = {}
        self.head_done = self.body_done = False
        self.failure: BaseException | None = None
        self.keep_alive = False
        self.resent = False  # sent again after a reused connection closed under it (`ConnectionPool.request`)
        self.received = 0  # bytes of this exchange's response so far
        self._until_close = self._chunked = False
        self._parts: list[bytes] = []
        self.held: list[bytes] = []  # body bytes read before a sink was set
        self.held_bytes = 0
        self._sink: object = None

    async def wait_for(self, ready: Callable[[], bool]) -> None:
        """Until `ready()` holds; raises the exchange's failure (connection lost, bad framing, the sink's error)
        if it came first. A failure after it is left for the next wait: the body bytes read before a connection
        was cut are still read (and their tokens counted) before the cut is raised."""
        while not ready():
            if self.failure is not None:
                raise self.failure
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    async def body(self, limit: int | None = None) -> bytes:
        """The body read whole, or its first `limit` bytes (the rest left unread: the connection then closes)."""
        await self.wait_for(lambda: self.body_done or (limit is not None and self.held_bytes >= limit))
        body = b"".join(self.held)
        return body if limit is None else body[:limit]

    def stream_to(self, sink: BodySink) -> None:
        """From now on body bytes go to `sink` as each read brings them; what came with the head goes first."""
        self._sink = sink
        if self.held:
            held, self.held, self.held_bytes = b"".join(self.held), [], 0
            self._deliver(held)

    @property
    def stopped(self) -> bool:
        """The sink asked to stop reading."""
        return self._sink is _DISCARD

    @property
    def usable(self) -> bool:
        """Open, and not announced to close: fit to carry another exchange."""
        return not self.closed and self.transport is not None and not self.transport.is_closing()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    # --- the protocol's side ---

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._tunnel is not None and not self._tunnel.done():
            self._tunnel.set_exception(ProxyFailed("the proxy closed the connection instead of opening a tunnel"))
        if self.in_exchange and not self.body_done and self.failure is None:
            if not self.head_done:
                self._fail(ServerClosed("the server closed the connection", nothing_received=not self.received))
            elif self._until_close:
                self.body_done = True
            else:
                where = "in the middle of a chunk" if self._chunked else "before its Content-Length"
                self._fail(ResponseCut(f"the connection ended {where}"))
        self._wake()

    def data_received(self, data: bytes) -> None:
        if self._tunnel is not None:
            self._tunnel_reply(data)
            return
        if not self.in_exchange:  # bytes no request asked for, on an idle connection: it cannot be trusted again
            self.close()
            return
        if self.body_done or self.failure is not None:
            self.keep_alive = False  # the same, after this exchange's body: not to be reused
            return
        self.received += len(data)
        head_before = self.head_done
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            if self.failure is None:
                cause = exc.__context__ if isinstance(exc, httptools.HttpParserCallbackError) else exc
                what = f"{cause}: {data[:80]!r}" if not self.head_done else str(cause)
                self._fail(BadResponse(f"the server's answer is not HTTP/1.1 this client can read ({what})"))
            return
        if not self.head_done and self.received > MAX_HEAD_BYTES:
            self._fail(BadResponse(f"the response's head is longer than {MAX_HEAD_BYTES // 1024} KiB"))
            return
        if self._parts:
            parts, self._parts = self._parts, []
            self._deliver(parts[0] if len(parts) == 1 else b"".join(parts))
        if self.head_done != head_before or self.body_done:
            self._wake()

    # httptools' callbacks, from inside feed_data

    def on_message_begin(self) -> None:
        if self.body_done:  # a second response to one request
            self.keep_alive = False

    def on_status(self, reason: bytes) -> None:
        self.reason = reason.decode("latin-1")

    def on_header(self, name: bytes, value: bytes) -> None:
        key, text = name.decode("latin-1").lower(), value.decode("latin-1").strip()
        self.headers[key] = f"{self.headers[key]}, {text}" if key in self.headers else text

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if 100 <= status < 200:  # an interim response (100 Continue): the real one follows
            self.headers, self.reason = {}, ""
            return
        self.status, self.head_done = status, True
        self.keep_alive = self._parser.should_keep_alive() and self._keep_alive_allows()
        self._chunked = "chunked" in self.headers.get("transfer-encoding", "").lower()
        self._until_close = status not in (204, 304) and "content-length" not in self.headers and not self._chunked
        if self._until_close:
            self.keep_alive = False

    def on_body(self, body: bytes) -> None:
        self._parts.append(body)

    def on_message_complete(self) -> None:
        if self.head_done and not self.body_done:
            self.body_done = True
            self.exchanges += 1

    def _keep_alive_allows(self) -> bool:
        """What a Keep-Alive header announces: the requests left (`max`, this one included) and the idle timeout."""
        for param in self.headers.get("keep-alive", "").split(","):
            name, _, value = param.strip().partition("=")
            try:
                number = float(value)
            except ValueError:
                continue
            if name.lower() == "max" and number <= 1:
                return False
            if name.lower() == "timeout":  # closed a little before the server would, as its clock runs ahead
                self.idle_limit_s = min(KEEPALIVE_S, max(0.0, number - 1.0))
        return True

    def _deliver(self, body: bytes) -> None:
        sink = self._sink
        if sink is None:
            self.held.append(body)
            self.held_bytes += len(body)
            self._wake()  # a task reading a whole (or an error's) body counts what came
        elif sink is not _DISCARD:
            try:
                stop = sink(body)  # type: ignore[operator]
            except Exception as exc:  # the sink's own error (an event too large) ends the exchange
                self._fail(exc)
                return
            if stop:
                self._sink = _DISCARD
                self._wake()

    def _fail(self, exc: BaseException) -> None:
        if self.failure is None:
            self.failure = exc
        self.keep_alive = False
        if self.transport is not None:
            self.transport.close()
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    # --- a CONNECT tunnel through a proxy ---

    async def open_tunnel(self, request: bytes) -> None:
        """Send a CONNECT and wait for the proxy's reply head; ProxyFailed unless it is a 2xx."""
        self._tunnel = asyncio.get_running_loop().create_future()
        self._tunnel_head = b""
        self.transport.write(request)  # type: ignore[union-attr]
        try:
            await self._tunnel
        finally:
            self._tunnel = None

    def _tunnel_reply(self, data: bytes) -> None:
        tunnel = self._tunnel
        if tunnel is None or tunnel.done():
            return
        head = self._tunnel_head + data
        end = head.find(b"\r\n\r\n")
        if end < 0:
            self._tunnel_head = head
            if len(head) > MAX_HEAD_BYTES:
                tunnel.set_exception(ProxyFailed("the proxy's reply to CONNECT is not HTTP"))
            return
        status_line = head.split(b"\r\n", 1)[0].decode("latin-1")
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].startswith("2"):
            tunnel.set_exception(ProxyFailed(f"the proxy refused the tunnel: {status_line[:120]}"))
        elif end + 4 < len(head):
            tunnel.set_exception(ProxyFailed("the proxy sent bytes of its own after opening the tunnel"))
        else:
            tunnel.set_result(None)


# --- the pool --------------------------------------------------------------------------------------------


class ConnectionPool:
    """Keep-alive connections to one server, directly or through a proxy.

    It opens a connection when none is idle: the caller caps how many requests are in flight (the run's max
    concurrency), and so how many connections there are. A connection goes back to the pool only after a
    response read to its end with keep-alive; anything else (an error, a cancel, Connection: close, a body left
    unread) closes it.
    """

    def __init__(
        self,
        origin: Origin,
        connect_timeout_s: float,
        headers: Mapping[str, str],
        policy: NetworkPolicy = DEFAULT_POLICY,
    ) -> None:
        self.origin, self.connect_timeout_s = origin, connect_timeout_s
        for name, value in headers.items():
            if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
                raise ValueError(f"the {name} header must be one line")
        try:
            self.proxy = policy.proxy_for(origin)
            self._ssl = policy.ssl_context() if origin.https else None
        except ValueError as exc:
            raise ProxyFailed(str(exc)) from None
        except OSError as exc:  # ssl.SSLError too
            raise TLSFailed(f"the CA bundle {policy.ca_bundle} cannot be read ({exc.strerror or exc})") from None
        lines = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        if self.proxy is not None and self.proxy.user is not None and not origin.https:
            lines += f"Proxy-Authorization: {basic_auth(self.proxy.user, self.proxy.password)}\r\n"
        self._header_lines = lines
        # Through a proxy, a plain-HTTP request names its whole URL; in a tunnel, as to the server itself.
        self._prefix = f"http://{origin.host_header}" if self.proxy is not None and not origin.https else ""
        self._idle: list[Connection] = []
        self._open: set[Connection] = set()
        self.answered = False  # a response's head has come: a refusal from here on is a server that went away

    async def _connection(self, fresh: bool = False) -> Connection:
        """An idle connection fit for reuse, or (none, or `fresh`) a new one."""
        loop = asyncio.get_running_loop()
        while self._idle and not fresh:
            connection = self._idle.pop()
            if connection.usable and loop.time() - connection.idle_since < connection.idle_limit_s:
                return connection
            self._drop(connection)
        connection = Connection()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                await self._connect(loop, connection)
        except TimeoutError:
            connection.close()
            via = f" through the proxy {self.proxy.shown}" if self.proxy else ""
            raise ConnectTimeout(
                f"no connection to {self.origin.shown}{via} within {self.connect_timeout_s:g} s"
            ) from None
        except ssl.SSLError as exc:  # an OSError too: caught first
            connection.close()
            reason = getattr(exc, "verify_message", None) or exc.reason or str(exc)
            raise TLSFailed(f"the TLS handshake with {self.origin.shown} failed ({reason}: {exc})") from None
        except OSError as exc:  # refused, unknown host
            connection.close()
            raise ConnectFailed(exc, self.origin.shown, self.proxy.shown if self.proxy else None) from None
        except HTTPStreamError:
            connection.close()
            raise
        self._open.add(connection)
        return connection

    async def _connect(self, loop: asyncio.AbstractEventLoop, connection: Connection) -> None:
        if self.proxy is None:
            await loop.create_connection(
                lambda: connection,
                self.origin.host,
                self.origin.port,
                ssl=self._ssl,
                server_hostname=self.origin.host if self._ssl else None,
            )
            return
        await loop.create_connection(lambda: connection, self.proxy.host, self.proxy.port)
        if self._ssl is None:
            return
        auth = self.proxy.user is not None and basic_auth(self.proxy.user, self.proxy.password)
        await connection.open_tunnel(
            (
                f"CONNECT {self.origin.authority} HTTP/1.1\r\nHost: {self.origin.authority}\r\n"
                + (f"Proxy-Authorization: {auth}\r\n" if auth else "")
                + "\r\n"
            ).encode("latin-1")
        )
        plain = connection.transport
        assert plain is not None  # connection_made has run
        connection.transport = await loop.start_tls(plain, connection, self._ssl, server_hostname=self.origin.host)

    async def request(self, method: str, target: str, body: bytes | None = None) -> Connection:
        """Send `method target` (a JSON body with a POST) and return its connection once the response's head has
        come (`status`, `reason`, `headers`); hand it back with `release`, whatever happened. A request whose
        reused connection ended before any byte of its response goes again, once, on a fresh one."""
        connection = await self._connection()
        reused = connection.exchanges > 0
        head = self._head(method, target, body)
        try:
            await self._send(connection, head)
        except ServerClosed as exc:
            if not (reused and exc.nothing_received):
                raise
            connection = await self._connection(fresh=True)  # the other idle ones may have closed alike
            await self._send(connection, head)
            connection.resent = True
        self.answered = True
        return connection

    async def post(self, target: str, body: bytes) -> Connection:
        return await self.request("POST", target, body)

    def _head(self, method: str, target: str, body: bytes | None) -> bytes:
        content = f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n" if body is not None else ""
        return (
            f"{method} {self._prefix}{target} HTTP/1.1\r\nHost: {self.origin.host_header}\r\n{self._header_lines}"
            f"{content}Accept: */*\r\nAccept-Encoding: identity\r\nUser-Agent: llm-bench-studio\r\n\r\n"
        ).encode("latin-1") + (body or b"")

    async def _send(self, connection: Connection, head: bytes) -> None:
        """Write the request and wait for its response's head; the connection is released if that fails."""
        connection.begin()
        try:
            connection.transport.write(head)  # type: ignore[union-attr]
            await connection.wait_for(lambda: connection.head_done)
        except BaseException:
            self.release(connection)
            raise

    def release(self, connection: Connection) -> None:
        connection.in_exchange = False
        reusable = connection.body_done and connection.keep_alive and connection.failure is None
        if reusable and connection.usable:
            connection.idle_since = asyncio.get_running_loop().time()
            self._idle.append(connection)
        else:
            self._drop(connection)

    def _drop(self, connection: Connection) -> None:
        connection.close()
        self._open.discard(connection)

    def close(self) -> None:
        for connection in self._open:
            connection.close()
        self._open.clear()
        self._idle.clear()


# --- a GET, whole ----------------------------------------------------------------------------------------


@dataclass
class Response:
    status: int
    reason: str
    headers: dict[str, str]  # names in lower case
    body: bytes = field(repr=False)  # asyncio.run formats its result's repr: a 20 MB page cost 0.25 s of it


def failure_sentence(url: str, exc: HTTPStreamError) -> str:
    """One sentence for a GET of `url` that failed, naming what failed: the host name, the proxy, the server, TLS.
    `url` as given: a user-info in it is masked wherever the sentence is shown (bench_core/redact.py)."""
    if isinstance(exc, ConnectFailed):
        if exc.proxy:
            return f"Cannot reach {url} through the proxy {exc.proxy} ({exc.cause}). Is the proxy running?"
        if exc.unresolved:
            return f"Cannot reach {url}: its host name does not resolve ({exc.cause})."
        return f"Cannot reach {url} ({exc.cause}). Is the server running, and is the URL right?"
    verb = "reach" if isinstance(exc, (ConnectTimeout, TLSFailed, ProxyFailed)) else "read"
    return f"Cannot {verb} {url}: {exc}."


def status_sentence(url: str, response: Response) -> str:
    """One sentence for a GET of `url` answered with an HTTP error."""
    hint = " Check the API key." if response.status in (401, 403) else ""
    return f"{url} answered HTTP {response.status} {response.reason}.{hint}"


async def _whole_body(connection: Connection, max_bytes: int) -> None:
    await connection.wait_for(lambda: connection.body_done or connection.held_bytes > max_bytes)


async def fetch_async(
    url: str,
    headers: Mapping[str, str] | None = None,
    policy: NetworkPolicy = DEFAULT_POLICY,
    timeout_s: float = 10.0,
    max_bytes: int = MAX_GET_BYTES,
    method: str = "GET",
) -> Response:
    """GET `url` whole (or `method` it, with no body: a server's POST /reset_prefix_cache): connection, head and
    body within `timeout_s` (ResponseTimeout), the body at most `max_bytes` (BodyTooLarge). Redirects within the
    origin are followed; one to another scheme, host or port is not (RedirectRefused), so the credentials in
    `headers` reach no other server."""
    origin = Origin(url)
    pool = ConnectionPool(origin, timeout_s, headers or {}, policy)
    try:
        async with asyncio.timeout(timeout_s):
            for _ in range(MAX_REDIRECTS + 1):
                connection = await pool.request(method, target_of(url), b"" if method == "POST" else None)
                try:
                    await _whole_body(connection, max_bytes)
                    if connection.held_bytes > max_bytes:
                        raise BodyTooLarge(f"{origin.shown} sent more than {max_bytes // 2**20} MiB")
                    response = Response(
                        connection.status, connection.reason, connection.headers, b"".join(connection.held)
                    )
                finally:
                    pool.release(connection)
                location = response.headers.get("location")
                if response.status not in _REDIRECTS or not location:
                    return response
                url = urllib.parse.urljoin(url, location)
                if not Origin(url).same(origin):
                    shown = Origin(url).shown
                    raise RedirectRefused(
                        f"{origin.shown} redirects to another server ({shown}): not followed, so that the "
                        "credentials stay with the server they are for"
                    )
            raise RedirectRefused(f"{origin.shown} redirected more than {MAX_REDIRECTS} times")
    except TimeoutError:
        raise ResponseTimeout(f"no whole answer from {origin.shown} within {timeout_s:g} s") from None
    finally:
        pool.close()


def fetch(
    url: str,
    headers: Mapping[str, str] | None = None,
    policy: NetworkPolicy = DEFAULT_POLICY,
    timeout_s: float = 10.0,
    max_bytes: int = MAX_GET_BYTES,
    method: str = "GET",
) -> Response:
    """`fetch_async` from synchronous code, on a loop of its own (Ctrl-C ends it at once)."""

    def get() -> Response:
        return asyncio.run(fetch_async(url, headers, policy, timeout_s, max_bytes, method))

    try:
        asyncio.get_running_loop()
    except RuntimeError:  # the usual case: no loop in this thread
        return get()
    # Called under a running loop (a notebook's, a browser driver's): asyncio.run refuses to nest, so a thread runs it.
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="fetch") as worker:
        return worker.submit(get).result()
