"""A small HTTP/1.1 server on 127.0.0.1 on asyncio streams, for what a web framework does not let a handler do:
close the socket right after a response that said keep-alive, drop a request unanswered, cut a response at a chosen
byte, answer any status with any headers. Every request it reads is logged, headers and all.

    async def handler(request: Request, writer: asyncio.StreamWriter) -> bool:   # True: keep the connection open
        await respond_json(writer, {"ok": True})
        return True

    with RawServer(handler) as server:      # over TLS with RawServer(handler, tls=context)
        server.url, server.log, server.connections

`on_own_loop(handle)` serves any asyncio stream handler the same way (tests/forward_proxy.py uses it).
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import json
import ssl
import threading
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field

StreamHandler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@dataclass
class Request:
    method: str
    target: str
    headers: dict[str, str]  # lower-case names
    body: bytes
    connection: int  # the connection it came on: 0, 1, ... in the order they were accepted
    nth: int  # its place on that connection: 0 is the connection's first request
    answer: str = ""  # what the handler did with it, in the handler's words ("streamed", "dropped", ...)

    def json(self) -> dict:
        return json.loads(self.body)


Handler = Callable[[Request, asyncio.StreamWriter], Awaitable[bool]]


@contextlib.contextmanager
def on_own_loop(handle: StreamHandler, tls: ssl.SSLContext | None = None) -> Iterator[int]:
    """Serve `handle` on a free port of 127.0.0.1 from an event loop in a thread of its own; yields the port. On
    leaving, the handlers still running are cancelled and their connections closed."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="raw-http-server", daemon=True)
    thread.start()
    tasks: set[asyncio.Task] = set()

    async def tracked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        tasks.add(asyncio.current_task())
        try:
            with contextlib.suppress(ConnectionError, asyncio.CancelledError, ssl.SSLError):
                await handle(reader, writer)
        finally:
            writer.close()
            tasks.discard(asyncio.current_task())

    server = asyncio.run_coroutine_threadsafe(asyncio.start_server(tracked, "127.0.0.1", 0, ssl=tls), loop).result(10)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:

        async def stop() -> None:
            server.close()
            for task in list(tasks):
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


async def read_request(reader: asyncio.StreamReader, connection: int, nth: int) -> Request | None:
    """The next request on a connection (its body by Content-Length); None when the client closed instead."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    request_line, *lines = head.decode("latin-1").split("\r\n")
    method, target, _version = request_line.split(" ", 2)
    headers: dict[str, str] = {}
    for line in filter(None, lines):
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return Request(method, target, headers, body, connection, nth)


@dataclass
class RawServer:
    """`handler` answers each request; the connection stays open while it returns True and the client keeps it."""

    handler: Handler
    tls: ssl.SSLContext | None = None
    log: list[Request] = field(default_factory=list)
    connections: int = 0  # accepted so far
    url: str = ""

    def __enter__(self) -> RawServer:
        self._serving = on_own_loop(self._handle, self.tls)
        port = self._serving.__enter__()
        self.url = f"{'https' if self.tls else 'http'}://127.0.0.1:{port}"
        return self

    def __exit__(self, *exc_info) -> None:
        self._serving.__exit__(*exc_info)

    def requests(self, method: str | None = None, path: str | None = None) -> list[Request]:
        """The requests logged, those of one method and target path where given."""
        return [
            r
            for r in self.log
            if (method is None or r.method == method) and (path is None or r.target.split("?")[0] == path)
        ]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection, self.connections = self.connections, self.connections + 1
        nth = 0
        while request := await read_request(reader, connection, nth):
            self.log.append(request)
            if not await self.handler(request, writer):
                break
            nth += 1


def head(status: int, headers: Iterable[tuple[str, str]] = ()) -> bytes:
    """A response's status line and headers, up to and with the blank line."""
    lines = [f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}", *(f"{name}: {value}" for name, value in headers)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def respond(
    writer: asyncio.StreamWriter,
    status: int,
    body: bytes = b"",
    content_type: str = "application/json",
    headers: Iterable[tuple[str, str]] = (),
) -> None:
    """A whole response with a Content-Length body."""
    framing = [("Content-Type", content_type), ("Content-Length", str(len(body)))]
    writer.write(head(status, [*headers, *framing]) + body)
    await writer.drain()


async def respond_json(writer: asyncio.StreamWriter, value, status: int = 200, headers=()) -> None:
    await respond(writer, status, json.dumps(value).encode(), headers=headers)


def chunk(data: bytes) -> bytes:
    """One chunk of a chunked body."""
    return b"%x\r\n%s\r\n" % (len(data), data)


LAST_CHUNK = b"0\r\n\r\n"
