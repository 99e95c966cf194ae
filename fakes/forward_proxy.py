"""A loopback HTTP forward proxy for tests: what a site's egress proxy does, in ~50 lines.

It takes absolute-URI requests (`GET http://host:port/path HTTP/1.1`, how a client asks a
proxy for a plain http:// URL) and CONNECT tunnels (an https:// URL), optionally demands
`Proxy-Authorization`, and records every host asked for. `routes` maps a host name that does
not resolve (`serper.invalid`) to a loopback address: such a host is reachable only through
the proxy, so a request that arrives proves the client used it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from urllib.parse import urlsplit


class ForwardProxy:
    def __init__(self, routes: dict[str, tuple[str, int]], auth: tuple[str, str] | None = None):
        self.routes = routes
        self.expected = (
            "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode() if auth else None
        )
        self.seen: list[str] = []  # host:port of every request it forwarded
        self.url = ""
        self._open: set[asyncio.StreamWriter] = set()  # both ends of every exchange, to close
        self._server: asyncio.Server | None = None

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._open):
            writer.close()
        for writer in list(self._open):
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._open.add(writer)
        with contextlib.suppress(OSError, asyncio.IncompleteReadError, ValueError):
            head = await reader.readuntil(b"\r\n\r\n")
            method, target, _version = head.split(b"\r\n", 1)[0].decode().split(" ")
            headers = dict(
                line.split(": ", 1) for line in head.decode().split("\r\n")[1:] if ": " in line
            )
            if self.expected and headers.get("Proxy-Authorization") != self.expected:
                writer.write(
                    b"HTTP/1.1 407 Proxy Authentication Required\r\nContent-Length: 0\r\n\r\n"
                )
                await writer.drain()
                return
            if method == "CONNECT":
                host, _, port = target.rpartition(":")
            else:
                parts = urlsplit(target)
                host, port = parts.hostname or "", str(parts.port or 80)
                path = parts.path + (f"?{parts.query}" if parts.query else "")
                head = head.replace(target.encode(), (path or "/").encode(), 1)
            self.seen.append(f"{host}:{port}")
            address = self.routes.get(host, (host, int(port)))
            up_reader, up_writer = await asyncio.open_connection(*address)
            self._open.add(up_writer)
            if method == "CONNECT":
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                up_writer.write(head)
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        writer.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    writer.close()
