"""An HTTP forward proxy on 127.0.0.1, as squid or a corporate proxy is to the client: `http_proxy` points at it.

- An absolute-URI request (`GET http://host:port/path HTTP/1.1`) is relayed to that host in origin form (`GET /path`),
  its Proxy-* headers dropped; the connection to the host is kept for the next request of the same client connection
  while both ends keep it, and the host's bytes are passed back as they come (a stream streams). When the host closes,
  the client's connection is closed too, as the host left it.
- `CONNECT host:port` is answered `200 Connection established`, then bytes are passed both ways (TLS inside).
- Host names are looked up in `hosts` first: a test maps a name no resolver knows (`bench-target.invalid`, a
  reserved name that never resolves) to 127.0.0.1, so that a request can only reach the server through the proxy.
- A host that cannot be reached gets `502 Bad Gateway`.
`log` holds (method, target) of every request line it read, in order: ("GET", "http://bench-target.invalid:8/v1/models"),
("CONNECT", "bench-target.invalid:8").

    with ForwardProxy({"bench-target.invalid": "127.0.0.1"}) as proxy:
        monkeypatch.setenv("http_proxy", proxy.url)
"""

from __future__ import annotations

import asyncio
import contextlib
import urllib.parse
from collections.abc import Mapping

from raw_http_server import on_own_loop, respond

TARGET_HOST = "bench-target.invalid"


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Bytes from `reader` to `writer` as they come, until `reader` ends; then `writer` is closed."""
    with contextlib.suppress(ConnectionError, OSError):
        while data := await reader.read(64 * 1024):
            writer.write(data)
            await writer.drain()
    writer.close()


class ForwardProxy:
    def __init__(self, hosts: Mapping[str, str] | None = None):
        self.hosts = dict(hosts or {})
        self.log: list[tuple[str, str]] = []
        self.url = ""

    def __enter__(self) -> ForwardProxy:
        self._serving = on_own_loop(self._handle)
        self.url = f"http://127.0.0.1:{self._serving.__enter__()}"
        return self

    def __exit__(self, *exc_info) -> None:
        self._serving.__exit__(*exc_info)

    def paths(self) -> list[tuple[str, str]]:
        """(method, path) of each absolute-URI request relayed, (CONNECT, host:port) of each tunnel."""
        return [(m, t if m == "CONNECT" else urllib.parse.urlsplit(t).path) for m, t in self.log]

    async def _open(self, host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection(self.hosts.get(host, host), port)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream: tuple[tuple[str, int], asyncio.StreamWriter, asyncio.Task] | None = None
        try:
            while True:
                try:
                    request_head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                request_line, *lines = request_head.decode("latin-1").split("\r\n")
                method, target, version = request_line.split(" ", 2)
                self.log.append((method, target))
                if method == "CONNECT":
                    host, _, port = target.rpartition(":")
                    try:
                        up_reader, up_writer = await self._open(host.strip("[]"), int(port))
                    except OSError:
                        await respond(writer, 502, b"cannot reach " + target.encode(), "text/plain")
                        return
                    writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
                    return
                headers = [line for line in lines if line and not line.lower().startswith("proxy-")]
                length = next((int(h.split(":", 1)[1]) for h in headers if h.lower().startswith("content-length:")), 0)
                body = await reader.readexactly(length)
                parts = urllib.parse.urlsplit(target)
                if parts.scheme != "http" or not parts.hostname:
                    await respond(writer, 400, b"not an absolute http:// URI: " + target.encode(), "text/plain")
                    return
                where = (parts.hostname, parts.port or 80)
                if upstream is None or upstream[0] != where or upstream[2].done():
                    if upstream is not None:
                        upstream[2].cancel()
                        upstream[1].close()
                    try:
                        up_reader, up_writer = await self._open(*where)
                    except OSError:
                        await respond(writer, 502, b"cannot reach " + target.encode(), "text/plain")
                        return
                    upstream = (where, up_writer, asyncio.create_task(pipe(up_reader, writer)))
                origin_form = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
                relayed = "\r\n".join([f"{method} {origin_form} {version}", *headers]) + "\r\n\r\n"
                upstream[1].write(relayed.encode("latin-1") + body)
                await upstream[1].drain()
        finally:
            if upstream is not None:
                upstream[1].close()
                upstream[2].cancel()
