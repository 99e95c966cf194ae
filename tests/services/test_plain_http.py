"""The lean client (services/client/plain_http.py) through `Upstream(plain_http=True)`, against raw
asyncio servers on loopback that answer exactly what each case needs: keep-alive reuse, a
connection the server closed while idle, chunked bodies, the response cap, malformed and cut
replies, refused connections and deadlines."""

from __future__ import annotations

import asyncio
import gc
import shutil
import socket
import ssl
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import orjson
import pytest

from services.base.errors import UpstreamBadResponse, UpstreamUnavailable
from services.client.http import Upstream, UpstreamSettings
from services.client.plain_http import PlainHttpError, _Connection
from services.client.retries import RetryPolicy
from tests.helpers import Closing


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
ONCE = RetryPolicy(max_attempts=1)


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes] | None:
    """The request head and body, or None when the client closed the connection."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return head, await reader.readexactly(length)


def reply(body: bytes, status: str = "200 OK", extra: bytes = b"") -> bytes:
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: application/json; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\n".encode()
        + extra
        + b"\r\n"
        + body
    )


@asynccontextmanager
async def server(handler: Handler) -> AsyncIterator[str]:
    """A server running `handler` per connection; every connection is closed at the end."""
    writers: list[asyncio.StreamWriter] = []

    async def tracked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        await handler(reader, writer)

    listening = await asyncio.start_server(tracked, "127.0.0.1", 0)
    port = listening.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        listening.close()
        for writer in writers:
            writer.close()
        await listening.wait_closed()
        await asyncio.sleep(0.01)  # the handlers see their connections end


MakeClient = Callable[..., Upstream]


@pytest.fixture
async def client(closing: Closing) -> AsyncIterator[MakeClient]:
    """Makes lean-client upstreams of a base URL (settings overridden by keyword), each closed
    after the test, whatever it asserted."""

    def make(base: str, headers: dict[str, str] | None = None, **settings: object) -> Upstream:
        options: dict[str, object] = {"plain_http": True, "retry": ONCE, "read_timeout_s": 5.0}
        options.update(settings)
        settings_ = UpstreamSettings(base, **options)  # type: ignore[arg-type]
        return closing(Upstream("svc", settings_, headers=headers))

    yield make


@pytest.mark.anyio
async def test_requests_reuse_one_connection_and_carry_body_and_headers(client: MakeClient) -> None:
    connections = 0
    seen: list[tuple[bytes, bytes]] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        while (request := await read_request(reader)) is not None:
            seen.append(request)
            writer.write(reply(request[1]))
        writer.close()

    async with server(handler) as base:
        up = client(base + "/api", headers={"Authorization": "Bearer t"})
        for k in range(5):
            answer = await up.send("POST", "/echo", json={"k": k}, headers={"X-Key": "s"})
            assert orjson.loads(answer.content) == {"k": k}
            assert answer.headers["content-type"].startswith("application/json")
            assert answer.charset == "utf-8"
    assert connections == 1
    head = seen[0][0]
    assert head.startswith(b"POST /api/echo HTTP/1.1\r\n")
    for line in (b"Authorization: Bearer t", b"X-Key: s", b"Content-Type: application/json"):
        assert line in head


@pytest.mark.anyio
async def test_an_idle_connection_the_server_closed_is_replaced_without_a_retry(
    client: MakeClient,
) -> None:
    """The server answers and closes without saying so (its keep-alive ran out): the next
    request finds the connection dead before any reply byte, so it goes on a new one, with no
    retry spent (the policy allows one attempt)."""
    connections = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        if await read_request(reader) is not None:
            writer.write(reply(b"{}"))
            await writer.drain()
        writer.close()

    async with server(handler) as base:
        up = client(base)
        for _ in range(3):
            assert (await up.send("POST", "/x", json={})).status_code == 200
            await asyncio.sleep(0.05)  # the close reaches us, or is found on the next write
    assert connections == 3


@pytest.mark.anyio
async def test_a_connection_the_server_closes_is_freed_at_once_not_by_the_collector(
    client: MakeClient,
) -> None:
    """A server that closes every connection (Connection: close) must not leave a cycle per
    request (the parser calls back into its connection) holding that request's reply until the
    collector's next pass: with a service's larger GC thresholds that was 170-310 MB more at
    1,000 pages (tests/services/test_tool_server_memory.py). Here, with the collector saving
    what it finds: no connection of ours is in that garbage."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if await read_request(reader) is not None:
            writer.write(
                reply(b'{"page": "' + b"x" * 100_000 + b'"}', extra=b"Connection: close\r\n")
            )
            await writer.drain()
        writer.close()

    async with server(handler) as base:
        up = client(base)
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            for _ in range(20):
                assert len((await up.send("POST", "/page", json={})).content) > 100_000
            await asyncio.sleep(0.05)  # every connection_lost has run
            gc.collect()
            ours = [o for o in gc.garbage if type(o).__module__ == "services.client.plain_http"]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
    assert ours == []


@pytest.mark.anyio
async def test_a_request_on_a_connection_already_lost_fails_as_a_closed_connection() -> None:
    """The pool never hands out a closed connection, but should one be lost just before its
    request, the request fails as the server's close does (unanswered: safe to resend)."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    async with server(handler) as base:
        port = int(base.rsplit(":", 1)[1])
        loop = asyncio.get_running_loop()
        transport, connection = await loop.create_connection(_Connection, "127.0.0.1", port)
        transport.close()
        await asyncio.sleep(0.01)  # connection_lost has run
        with pytest.raises(PlainHttpError, match="closed the connection"):
            await connection.send(b"GET / HTTP/1.1\r\n\r\n", 1000, 1.0)
        assert not connection.answered


@pytest.mark.anyio
async def test_a_body_that_ends_with_the_connection_is_read_whole(client: MakeClient) -> None:
    """No Content-Length and no chunks: the body runs until the server closes (RFC 9112 6.3),
    as HTTP/1.0-style servers and some proxies answer. A reply cut short of its stated length
    still fails (test_broken_replies_are_transport_failures_in_plain_words)."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n"
        )
        await writer.drain()
        writer.write(b'{"until": ')
        await writer.drain()
        await asyncio.sleep(0.01)
        writer.write(b'"close"}')
        writer.close()

    async with server(handler) as base:
        up = client(base)
        for _ in range(2):  # and the next call opens a new connection
            assert orjson.loads((await up.send("GET", "/eof")).content) == {"until": "close"}


@pytest.mark.anyio
async def test_a_chunked_body_is_joined(client: MakeClient) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            b'3\r\n{"a\r\n5\r\n": 1}\r\n0\r\n\r\n'
        )
        writer.close()

    async with server(handler) as base:
        up = client(base)
        assert orjson.loads((await up.send("GET", "/c")).content) == {"a": 1}


@pytest.mark.anyio
async def test_a_body_over_the_cap_is_refused(client: MakeClient) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(reply(b"x" * 5000))
        writer.close()

    async with server(handler) as base:
        up = client(base, max_response_bytes=1000)
        with pytest.raises(UpstreamBadResponse, match="larger than 1000 bytes"):
            await up.send("GET", "/big")


@pytest.mark.parametrize(
    ("answer", "words"),
    [
        (b"NOT HTTP AT ALL\r\n\r\n", "malformed response"),
        (reply(b"0123456789")[:-4], "before the response was complete"),
        (b"", "the server closed the connection"),
    ],
)
@pytest.mark.anyio
async def test_broken_replies_are_transport_failures_in_plain_words(
    answer: bytes, words: str, client: MakeClient
) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(answer)
        await writer.drain()
        writer.close()

    async with server(handler) as base:
        up = client(base)
        with pytest.raises(UpstreamUnavailable, match=words):
            await up.send("POST", "/x", json={})


@pytest.mark.anyio
async def test_a_refused_connection(client: MakeClient) -> None:
    up = client(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(UpstreamUnavailable, match="could not connect"):
        await up.send("GET", "/x")


@pytest.mark.slow
@pytest.mark.anyio
async def test_a_silent_server_is_cut_at_the_deadline(client: MakeClient) -> None:
    """End to end on the real clock: a server that answers only after the test cannot cut the
    call; without the deadline the read timeout (30 s) would, so the bound is a third."""
    release = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await release.wait()
        writer.close()

    async with server(silent) as base:
        up = client(base, read_timeout_s=30.0)
        started = time.monotonic()
        try:
            with pytest.raises(UpstreamUnavailable, match="timed out"):
                await up.send("GET", "/x", deadline=time.monotonic() + 0.3)
            assert time.monotonic() - started < 10
        finally:
            release.set()


@pytest.mark.anyio
async def test_absolute_urls_and_query_parameters_stay_with_aiohttp(client: MakeClient) -> None:
    """What the lean client does not take (an absolute URL, query parameters) goes through
    aiohttp, which answers the same way; plain_http=False sends everything there."""
    connections = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        while await read_request(reader) is not None:
            writer.write(reply(b'{"ok": true}'))
        writer.close()

    async with server(handler) as base:
        up = client(base)
        absolute = await up.send("GET", f"{base}/abs")
        with_params = await up.send("GET", "/q", params={"a": "1"})
        relative = await up.send("GET", "/rel")
        assert absolute.content == with_params.content == relative.content == b'{"ok": true}'
        assert connections == 2  # one aiohttp connection, one of the lean client
        never = client(base, plain_http=False)
        assert never._plain is None
        assert (await never.send("GET", "/rel")).content == b'{"ok": true}'


@pytest.mark.anyio
async def test_a_compressed_reply_is_refused(client: MakeClient) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(reply(b"\x1f\x8b", extra=b"Content-Encoding: gzip\r\n"))
        writer.close()

    async with server(handler) as base:
        up = client(base)
        with pytest.raises(UpstreamUnavailable, match="compressed response"):
            await up.send("GET", "/z")


@pytest.fixture(scope="module")
def self_signed(tmp_path_factory: pytest.TempPathFactory) -> ssl.SSLContext:
    """A server TLS context with a certificate no CA signed."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a certificate")
    folder = tmp_path_factory.mktemp("tls")
    key, cert = folder / "key.pem", folder / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return context


@pytest.mark.anyio
async def test_tls_certificates_are_verified(
    self_signed: ssl.SSLContext, client: MakeClient
) -> None:
    """An https upstream never goes through the lean client, even where its settings ask for
    it: aiohttp verifies the certificate, and one no CA signed is refused in plain words."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(reply(b"{}"))
        writer.close()

    listening = await asyncio.start_server(handler, "127.0.0.1", 0, ssl=self_signed)
    async with listening:
        port = listening.sockets[0].getsockname()[1]
        up = client(f"https://127.0.0.1:{port}")
        assert up._plain is None
        with pytest.raises(UpstreamUnavailable, match="TLS certificate was refused"):
            await up.send("GET", "/x")
