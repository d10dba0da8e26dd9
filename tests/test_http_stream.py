"""The client's own HTTP/1.1 reader (bench_core/engines/http_stream.py) against raw servers on 127.0.0.1.

A raw asyncio server writes exactly the bytes each test gives it (framing edge cases no web framework
would send: a response cut inside a chunk, split at any byte, Connection: close), so what the reader
makes of them is what a real server would get.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import ssl
import subprocess
import threading
from collections.abc import Awaitable, Callable, Iterator

import pytest
from own_loop import run_on_own_loop

from bench_core.engines.http_stream import (
    BadResponse,
    Connection,
    ConnectionPool,
    Origin,
    ResponseCut,
    ServerClosed,
)
from bench_core.engines.openai_client import run_requests
from bench_core.engines.openai_request import ServerSpec
from bench_core.engines.openai_stream import SSEParser
from bench_core.load.datasets import SampledRequest

Respond = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]

TOKENS = 5


def sse(text: str, finish: str | None = None, usage: dict | None = None) -> bytes:
    body = {"choices": [{"index": 0, "text": text, "finish_reason": finish}]} | ({"usage": usage} if usage else {})
    return b"data: " + json.dumps(body).encode() + b"\n\n"


STREAM = b"".join(sse(f"t{i}") for i in range(TOKENS)) + sse("", "length", {"completion_tokens": TOKENS})
STREAM += b"data: [DONE]\n\n"


def chunked(payload: bytes, sizes: list[int]) -> bytes:
    """`payload` in chunks of `sizes` (the rest in one more), one with an extension, a trailer at the end."""
    out, pos = [], 0
    for size in [*sizes, len(payload)]:
        piece = payload[pos : pos + size]
        if piece:
            out.append(
                b"%x;ext=1\r\n%s\r\n" % (len(piece), piece) if not out else b"%x\r\n%s\r\n" % (len(piece), piece)
            )
        pos += len(piece)
    return b"".join(out) + b"0\r\nX-Trailer: yes\r\n\r\n"


HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
RESPONSE = HEAD + chunked(STREAM, [7, 1, 60, 200])


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """One request's head and body (by its Content-Length); b"" when the client closed instead."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return b""
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
    )
    return head + await reader.readexactly(length)


@contextlib.contextmanager
def raw_server(respond: Respond, tls: ssl.SSLContext | None = None) -> Iterator[tuple[str, list[int]]]:
    """A server on 127.0.0.1 in a thread of its own: `respond(reader, writer, nth request on this connection)`
    answers each request, and the connection stays open (keep-alive) until `respond` closes it or the client
    does; over TLS where `tls` is given. Yields its base URL and a list that gets one entry per connection accepted."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="raw-server", daemon=True)
    thread.start()
    connections: list[int] = []
    handlers: set[asyncio.Task] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(len(connections))
        handlers.add(asyncio.current_task())
        nth = 0
        with contextlib.suppress(ConnectionError, asyncio.CancelledError):  # cancelled: the server stops
            while not writer.is_closing() and await read_request(reader):
                await respond(reader, writer, nth)
                nth += 1
        writer.close()

    server = asyncio.run_coroutine_threadsafe(asyncio.start_server(handle, "127.0.0.1", 0, ssl=tls), loop).result(10)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"{'https' if tls else 'http'}://127.0.0.1:{port}", connections
    finally:

        async def stop() -> None:
            server.close()
            for handler in handlers:
                handler.cancel()
            await asyncio.gather(*handlers, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


def writing(*pieces: bytes, close: bool = False) -> Respond:
    async def respond(reader, writer, nth) -> None:
        for i, piece in enumerate(pieces):
            if i:
                await asyncio.sleep(0.005)  # each piece its own network read; the close follows the last at once
            writer.write(piece)
            await writer.drain()
        if close:
            writer.close()

    return respond


def run(url: str, n: int = 1, concurrency: int | None = 1):
    spec = ServerSpec(url, read_timeout_s=5)
    requests = [SampledRequest("hi", 2, TOKENS)] * n
    client = run_requests(spec, "m", requests, max_concurrency=concurrency)
    events = list(client.events())
    return client.results, events


def post_through_pool(url: str, n: int, pause_s: float = 0.0) -> list[tuple[int, bytes]]:
    """(status, body) of `n` POSTs in turn over one pool, bodies read whole, `pause_s` between them."""

    async def main() -> list[tuple[int, bytes]]:
        pool = ConnectionPool(Origin(url), 5, {})
        answers = []
        try:
            for _ in range(n):
                connection = await pool.post("/v1/completions", b"{}")
                try:
                    answers.append((connection.status, await connection.body()))
                finally:
                    pool.release(connection)
                await asyncio.sleep(pause_s)
        finally:
            pool.close()
        return answers

    return run_on_own_loop(main())


# --- framing ---------------------------------------------------------------------------------------


def test_a_chunked_body_read_split_at_every_byte_is_the_same_events():
    """The decoder's state carries across reads wherever they cut: size lines, data, the CRLF after data, trailer."""
    expected = SSEParser().feed(STREAM)
    for cut in range(1, len(RESPONSE)):
        connection, parser, messages = Connection(), SSEParser(), []
        connection.begin()
        connection.stream_to(lambda part, parser=parser, messages=messages: bool(messages.extend(parser.feed(part))))
        connection.data_received(RESPONSE[:cut])
        connection.data_received(RESPONSE[cut:])
        assert connection.body_done and connection.keep_alive and connection.failure is None, cut
        assert messages == expected, cut


def test_an_interim_100_continue_in_a_read_of_its_own_is_skipped_for_the_real_response():
    with raw_server(writing(b"HTTP/1.1 100 Continue\r\n\r\n", RESPONSE)) as (url, _):
        (result,), _ = run(url)
    assert (result.finish_reason, result.n_tokens) == ("length", TOKENS)


def test_a_chunked_stream_cut_into_many_network_reads_is_read_whole_by_a_run():
    pieces = [RESPONSE[i : i + 37] for i in range(0, len(RESPONSE), 37)]
    with raw_server(writing(*pieces)) as (url, _):
        (result,), events = run(url)
    assert (result.finish_reason, result.n_tokens, result.text) == ("length", TOKENS, "t0t1t2t3t4")
    ticks = [e for e in events if e.kind == "tokens"]
    assert sum(len(e.earlier_ns) + 1 for e in ticks) == TOKENS  # one tick per event, batched per read


def test_connections_are_reused_for_the_next_request_while_the_server_keeps_them_alive():
    with raw_server(writing(RESPONSE)) as (url, connections):
        results, _ = run(url, n=4, concurrency=1)
    assert [r.finish_reason for r in results] == ["length"] * 4
    assert len(connections) == 1


def test_connection_close_makes_the_next_request_open_a_new_connection():
    closing = RESPONSE.replace(b"Transfer-Encoding", b"Connection: close\r\nTransfer-Encoding")
    with raw_server(writing(closing)) as (url, connections):
        results, _ = run(url, n=3, concurrency=1)
    assert [r.finish_reason for r in results] == ["length"] * 3
    assert len(connections) == 3


@pytest.mark.parametrize(
    "keep_alive, connections_for_three",
    [(b"timeout=5, max=1", 3), (b"timeout=1", 3), (b"timeout=5, max=100", 1)],
)
def test_a_keep_alive_header_that_announces_the_close_makes_the_pool_open_a_new_connection(
    keep_alive, connections_for_three
):
    # max=1: this answer is the connection's last; timeout=1: idle for longer than the pause below
    announcing = RESPONSE.replace(b"Transfer-Encoding", b"Keep-Alive: " + keep_alive + b"\r\nTransfer-Encoding")
    with raw_server(writing(announcing)) as (url, connections):
        answers = post_through_pool(url, 3, pause_s=0.01)
    assert [status for status, _ in answers] == [200] * 3
    assert len(connections) == connections_for_three


def test_a_body_until_the_connection_closes_and_a_content_length_body_are_read_whole():
    until_close = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n"
    with raw_server(writing(until_close, STREAM[:50], STREAM[50:], close=True)) as (url, connections):
        results, _ = run(url, n=2)
    assert [(r.finish_reason, r.n_tokens) for r in results] == [("length", TOKENS)] * 2
    assert len(connections) == 2  # a body that ends with its connection cannot keep it
    body = b'{"error": {"message": "the engine crashed"}}'
    error = b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    with raw_server(writing(error[:30], error[30:])) as (url, connections):
        assert post_through_pool(url, 2) == [(500, body)] * 2
    assert len(connections) == 1


def test_bytes_on_an_idle_connection_make_the_pool_drop_it():
    body = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"

    async def answer_then_babble(reader, writer, nth) -> None:
        writer.write(body)
        await asyncio.sleep(0.02)
        writer.write(b"HTTP/1.1 200 OK\r\n")  # no request asked for it

    with raw_server(answer_then_babble) as (url, connections):
        assert post_through_pool(url, 2, pause_s=0.1) == [(200, b"ok")] * 2
    assert len(connections) == 2


def test_a_server_that_closes_mid_chunk_cuts_the_response_after_the_tokens_it_sent():
    cut_at = RESPONSE.index(b"t3") + 1  # inside the chunk that holds the fourth token
    with raw_server(writing(RESPONSE[:cut_at], close=True)) as (url, _):
        (result,), _ = run(url)
    assert result.finish_reason == "error"
    assert result.message == "the response was cut after 3 tokens: the connection ended in the middle of a chunk"
    assert result.n_tokens == 3


def test_a_server_that_closes_before_answering_is_said_so():
    with raw_server(writing(b"HTTP/1.1 200 OK\r\nContent-", close=True)) as (url, _):
        (result,), _ = run(url)
    assert result.message == "the server closed the connection after 0 tokens"


@pytest.mark.parametrize(
    "response, words",
    [
        (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", "not HTTP/1.1"),
        (HEAD + b"zz\r\n", "Invalid character in chunk size"),
        (HEAD + b"-5\r\nabc\r\n", "Invalid character in chunk size"),
        (HEAD + b"3\r\nabcdef\r\n", "Expected LF after chunk data"),
    ],
)
def test_an_answer_that_is_not_http_is_one_error_naming_what_is_wrong(response, words):
    with raw_server(writing(response)) as (url, _):
        (result,), _ = run(url)
    assert result.finish_reason == "error" and words in result.message
    assert result.message.startswith("BadResponse: ")


def test_the_pool_raises_what_the_connection_saw():
    with raw_server(writing(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", close=True)) as (url, _):
        with pytest.raises(ResponseCut, match="before its Content-Length"):
            post_through_pool(url, 1)
    with raw_server(writing(b"", close=True)) as (url, _):
        with pytest.raises(ServerClosed):
            post_through_pool(url, 1)
    with raw_server(writing(b"HTTP/2 200\r\n\r\n")) as (url, _):
        with pytest.raises(BadResponse):
            post_through_pool(url, 1)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a certificate")
def test_https_is_read_the_same_and_an_untrusted_certificate_is_refused(tmp_path, monkeypatch):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert, "-days", "1"]
        + ["-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True,
        capture_output=True,
    )
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert, key)
    with raw_server(writing(RESPONSE), tls) as (url, connections):
        (refused,), _ = run(url)
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # the client's default context trusts it from here on
        results, _ = run(url, n=2)
    assert "TLS handshake" in refused.message and "CERTIFICATE_VERIFY_FAILED" in refused.message
    assert [(r.finish_reason, r.text) for r in results] == [("length", "t0t1t2t3t4")] * 2
    assert len(connections) == 1  # one kept alive for both (the refused handshake never reached the server's handler)
