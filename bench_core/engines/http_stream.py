"""A lean HTTP/1.1 client for the one server a benchmark measures: pooled keep-alive connections whose
`asyncio.Protocol` hands each network read's body bytes straight to a callback.

A general client (aiohttp) costs, per network read of a stream, a future, a task wake-up, its stream
reader's buffers and its chunked decoder's hand-off, before the caller's parser has seen a byte: at
hundreds of streams that was half of the client's CPU per token. Here `data_received` decodes the
framing (Content-Length, chunked transfer-encoding, or until the server closes) and calls the
exchange's `on_body` in the same callback; the request's task wakes only when the response's head has
come, when `on_body` asks to stop, when the body ends, or on a failure.

What it does not do, because an OpenAI-compatible server needs none of it: proxies (a benchmark
measures the server, not what stands between), redirects, cookies, compressed bodies (it asks for
identity), HTTP/2, request bodies that are not one bytes object. TLS goes through the `ssl` module's
default context (certificates verified, as aiohttp does).
"""

from __future__ import annotations

import asyncio
import base64
import ssl
import urllib.parse
from collections.abc import Callable, Mapping

# Longest response head and chunk-size line accepted: a server sending more is not speaking HTTP to us.
MAX_HEAD_BYTES = 64 * 1024
MAX_CHUNK_LINE_BYTES = 1024
KEEPALIVE_S = 60.0  # an idle connection older than this is closed rather than reused (servers drop them)

# Called with each network read's body bytes; True when the reading should stop (the body's rest is dropped).
BodySink = Callable[[bytes], bool]


class HTTPStreamError(Exception):
    """A failure of the connection or of the response's framing."""


class ConnectFailed(HTTPStreamError):
    """No connection: refused, unknown host, TLS handshake failed."""

    def __init__(self, os_error: OSError) -> None:
        super().__init__(str(os_error))
        self.os_error = os_error


class ConnectTimeout(HTTPStreamError):
    """No connection within the connect timeout."""


class ServerClosed(HTTPStreamError):
    """The server closed the connection before the response's head was complete."""


class ResponseCut(HTTPStreamError):
    """The connection ended inside the response's body, before its framing said it was complete."""


class BadResponse(HTTPStreamError):
    """What came back is not an HTTP/1.x response this client can read."""


_CHUNKED, _LENGTH, _UNTIL_CLOSE = "chunked", "length", "until close"
_DISCARD = object()  # the sink after it asked to stop: what is left of the body is framed, not read


class Connection(asyncio.Protocol):
    """One keep-alive connection and the exchange on it, if any. Its state changes only in the loop's callbacks
    and in the owning task between awaits, so nothing here needs a lock."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self._waiter: asyncio.Future | None = None
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
        self._head = b""
        self._framing = _UNTIL_CLOSE
        self._remaining = 0  # bytes of the current chunk (or of a Content-Length body) still to come
        self._chunk_tail = b""  # an unfinished chunk-size line or chunk-ending CRLF
        self._in_trailer = False
        self._after_data = False  # a chunk's data ended: its CRLF comes next
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

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    # --- the protocol's side ---

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.in_exchange and not self.body_done and self.failure is None:
            if not self.head_done:
                self._fail(ServerClosed("the server closed the connection"))
            elif self._framing == _UNTIL_CLOSE:
                self.body_done = True
            else:
                where = "in the middle of a chunk" if self._framing == _CHUNKED else "before its Content-Length"
                self._fail(ResponseCut(f"the connection ended {where}"))
        self._wake()

    def data_received(self, data: bytes) -> None:
        if not self.in_exchange:  # bytes no request asked for, on an idle connection: it cannot be trusted again
            self.close()
            return
        if self.body_done or self.failure is not None:
            self.keep_alive = False  # the same, after this exchange's body: not to be reused
            return
        if not self.head_done:
            data = self._read_head(data)
            if not self.head_done:
                return
            self._wake()
        if not data or self.body_done:
            if data:
                self.keep_alive = False
            return
        if self._framing == _CHUNKED:
            body = self._unchunk(data)
        elif self._framing == _LENGTH:
            body = data[: self._remaining]
            if len(data) > self._remaining:
                self.keep_alive = False
            self._remaining -= len(body)
            self.body_done = self._remaining == 0
        else:
            body = data
        if body:
            self._deliver(body)
        if self.body_done:
            self._wake()

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

    def _read_head(self, data: bytes) -> bytes:
        """Take the status line and headers from the start of the response; returns the body bytes after them."""
        head = self._head + data if self._head else data
        while True:
            end = head.find(b"\r\n\r\n")
            if end < 0:
                if len(head) > MAX_HEAD_BYTES:
                    self._fail(BadResponse(f"the response's head is longer than {MAX_HEAD_BYTES // 1024} KiB"))
                    return b""
                self._head = head
                return b""
            try:
                self._parse_head(head[:end].decode("latin-1"))
            except (ValueError, IndexError):
                self._fail(BadResponse(f"the server's answer is not HTTP/1.1: {head[:80]!r}"))
                return b""
            head = head[end + 4 :]
            if not 100 <= self.status < 200:  # an interim response (100 Continue) is followed by the real one
                break
        self._head = b""
        self.head_done = True
        return head

    def _parse_head(self, text: str) -> None:
        status_line, *lines = text.split("\r\n")
        version, status, *reason = status_line.split(" ", 2)
        if not version.startswith("HTTP/1."):
            raise ValueError(version)
        self.status, self.reason = int(status), reason[0] if reason else ""
        headers: dict[str, str] = {}
        for line in lines:
            name, sep, value = line.partition(":")
            if not sep:
                raise ValueError(line)
            name = name.strip().lower()
            value = value.strip()
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        self.headers = headers
        connection = {token.strip() for token in headers.get("connection", "").lower().split(",")}
        self.keep_alive = "keep-alive" in connection if version == "HTTP/1.0" else "close" not in connection
        if 100 <= self.status < 200:  # an interim response: its head is all there is, and the real one follows
            return
        encoding = headers.get("transfer-encoding", "").lower()
        if self.status in (204, 304):
            self._framing, self._remaining = _LENGTH, 0
            self.body_done = True
        elif encoding.rstrip().endswith("chunked"):
            self._framing = _CHUNKED
        elif "content-length" in headers:
            self._framing, self._remaining = _LENGTH, int(headers["content-length"])
            self.body_done = self._remaining == 0
        else:
            self._framing, self.keep_alive = _UNTIL_CLOSE, False

    def _unchunk(self, data: bytes) -> bytes:
        """The payload of a chunked body's bytes as they come, cut anywhere; sets body_done at its last chunk."""
        if self._chunk_tail:
            data, self._chunk_tail = self._chunk_tail + data, b""
        parts: list[bytes] = []
        pos, size_of_data, find = 0, len(data), data.find
        while pos < size_of_data:
            if not (self._remaining or self._after_data or self._in_trailer):
                # The usual read, between chunks: a whole chunk, sliced at once. Anything else (a chunk cut by the
                # read, an extension, the last chunk, a bad size) is left to the steps below.
                line_end = find(b"\r\n", pos)
                if line_end >= 0:
                    try:
                        size = int(data[pos:line_end], 16)
                    except ValueError:
                        size = 0
                    end = line_end + 2 + size
                    if size > 0 and data[end : end + 2] == b"\r\n":
                        parts.append(data[line_end + 2 : end])
                        pos = end + 2
                        continue
            if self._remaining:  # inside a chunk's data
                take = min(self._remaining, size_of_data - pos)
                parts.append(data[pos : pos + take])
                pos += take
                self._remaining -= take
                self._after_data = self._remaining == 0
                continue
            line_end = find(b"\r\n", pos)
            if line_end < 0:
                self._chunk_tail = data[pos:]
                if len(self._chunk_tail) > MAX_CHUNK_LINE_BYTES:
                    self._fail(BadResponse("the server sent a chunk-size line longer than 1 KiB"))
                break
            if self._after_data:  # the CRLF that ends a chunk's data
                if line_end != pos:
                    self._fail(BadResponse("a chunk of the response is longer than its size says"))
                    break
                self._after_data = False
                pos += 2
                continue
            if self._in_trailer:  # trailer fields, then the blank line that ends the body
                if line_end == pos:
                    self.body_done = True
                    if line_end + 2 < size_of_data:
                        self.keep_alive = False  # bytes after the body that no request asked for
                    break
                pos = line_end + 2
                continue
            try:
                size = int(data[pos:line_end].split(b";", 1)[0], 16)
                if size < 0:
                    raise ValueError(size)
            except ValueError:
                self._fail(BadResponse(f"the server sent a bad chunk size: {data[pos:line_end][:40]!r}"))
                break
            pos = line_end + 2
            if size:
                self._remaining = size
            else:
                self._in_trailer = True
        return parts[0] if len(parts) == 1 else b"".join(parts)

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


class Origin:
    """Where one server is, as the request line and the connection need it."""

    def __init__(self, url: str) -> None:
        parts = urllib.parse.urlsplit(url)
        self.https = parts.scheme == "https"
        self.host = parts.hostname or ""
        self.port = parts.port or (443 if self.https else 80)
        default_port = self.port == (443 if self.https else 80)
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.host_header = host if default_port else f"{host}:{self.port}"
        self.user = urllib.parse.unquote(parts.username) if parts.username else None
        self.password = urllib.parse.unquote(parts.password or "")


def basic_auth(user: str, password: str) -> str:
    """The Authorization value for a URL's user-info (latin-1, as aiohttp and urllib send it)."""
    return "Basic " + base64.b64encode(f"{user}:{password}".encode("latin-1")).decode()


class ConnectionPool:
    """Keep-alive connections to one server, for POSTs of JSON.

    It opens a connection when none is idle: the caller caps how many requests are in flight (the run's
    max concurrency), and so how many connections there are. A connection goes back to the pool only after
    a response read to its end with keep-alive; anything else (an error, a cancel, Connection: close, a
    body left unread) closes it.
    """

    def __init__(self, origin: Origin, connect_timeout_s: float, headers: Mapping[str, str]) -> None:
        self.origin, self.connect_timeout_s = origin, connect_timeout_s
        for name, value in headers.items():
            if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
                raise ValueError(f"the {name} header must be one line")
        self._header_lines = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        self._ssl = ssl.create_default_context() if origin.https else None
        self._idle: list[Connection] = []
        self._open: set[Connection] = set()

    async def _connection(self) -> Connection:
        loop = asyncio.get_running_loop()
        while self._idle:
            connection = self._idle.pop()
            if not connection.closed and loop.time() - connection.idle_since < KEEPALIVE_S:
                return connection
            connection.close()
        connection = Connection()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                await loop.create_connection(
                    lambda: connection,
                    self.origin.host,
                    self.origin.port,
                    ssl=self._ssl,
                    server_hostname=self.origin.host if self._ssl else None,
                )
        except TimeoutError:
            raise ConnectTimeout(f"no connection within {self.connect_timeout_s:g} s") from None
        except OSError as exc:  # refused, unknown host, TLS
            raise ConnectFailed(exc) from None
        self._open.add(connection)
        return connection

    async def post(self, target: str, body: bytes) -> Connection:
        """Send POST `target` with a JSON body and return its connection once the response's head has come
        (`status`, `reason`, `headers`); hand it back with `release`, whatever happened."""
        connection = await self._connection()
        connection.begin()
        head = (
            f"POST {target} HTTP/1.1\r\nHost: {self.origin.host_header}\r\n{self._header_lines}"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            "Accept: */*\r\nAccept-Encoding: identity\r\nUser-Agent: llm-bench-studio\r\n\r\n"
        )
        try:
            connection.transport.write(head.encode("latin-1") + body)  # type: ignore[union-attr]
            await connection.wait_for(lambda: connection.head_done)
        except BaseException:
            self.release(connection)
            raise
        return connection

    def release(self, connection: Connection) -> None:
        connection.in_exchange = False
        reusable = connection.body_done and connection.keep_alive and connection.failure is None
        if reusable and not connection.closed:
            connection.idle_since = asyncio.get_running_loop().time()
            self._idle.append(connection)
        else:
            connection.close()
            self._open.discard(connection)

    def close(self) -> None:
        for connection in self._open:
            connection.close()
        self._open.clear()
        self._idle.clear()
