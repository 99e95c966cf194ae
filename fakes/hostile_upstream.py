"""An HTTP/1.1 upstream that breaks the protocol on purpose, on raw sockets (no framework would
send these): every client the project uses must survive it without mixing callers' replies
(design.md, section 7).

Each request is answered by `answer(path, body)`, the reply it deserves, wrapped in one
`Misbehaviour`:
- `overlong`: the body runs past its Content-Length into bytes shaped like a second reply
  (`inject`), in the same write; `overlong_late`: those bytes follow a moment later, while the
  connection sits idle in the client's pool (`late_writes` counts them, so a test can wait for
  them: bytes that arrive while the connection's next request is already in flight cannot be
  told from its reply, in HTTP/1.1, by any client);
- `unasked_late`: as `overlong_late`, the unasked reply `late_delay_s` after the answer (0.3 s
  by default: under load the connection is often in use again by then, and the bytes reach
  another request in flight); `head_late`: only the head of one, its body never sent;
- `redirect_json`: a `302 Found` whose body is `inject` (JSON), in place of the answer;
- `interim_100` / `interim_103`: `100 Continue` or `103 Early Hints` before the real reply;
- `endless_line`: a head whose one header line never ends; `endless_fields`: header fields
  without end. Bytes written are counted, so a test can see how much a client read.
- `trickle`: the reply's head at once, then its body one byte every TRICKLE_EVERY_S (padded
  to TRICKLE_BYTES): never silent for long, so only a bound on the whole exchange cuts it.

The server runs its own event loop in a thread, so sync and async tests use it alike.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Literal

Misbehaviour = Literal[
    "honest",
    "overlong",
    "overlong_late",
    "unasked_late",
    "head_late",
    "redirect_json",
    "interim_100",
    "interim_103",
    "endless_line",
    "endless_fields",
    "trickle",
]
TRICKLE_EVERY_S = 0.1
TRICKLE_BYTES = 300  # 30 s of trickling
Answer = Callable[[str, bytes], bytes]


def http_reply(
    body: bytes, content_type: str = "application/json", status: str = "200 OK"
) -> bytes:
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )


class HostileUpstream:
    def __init__(
        self,
        answer: Answer,
        behaviour: Misbehaviour,
        inject: bytes = b"",
        late_delay_s: float = 0.3,
    ) -> None:
        self.answer = answer
        self.late_delay_s = late_delay_s
        self.behaviour = behaviour
        self.inject = inject
        self.requests = 0
        self.endless_bytes = 0  # written into endless heads, summed over connections
        self.late_writes = 0  # `overlong_late`'s extra replies written so far
        self._late = threading.Condition()
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._writers: list[asyncio.StreamWriter] = []
        self._late_tasks: set[asyncio.Future[None]] = set()
        self._thread = threading.Thread(target=self._run, name="hostile-upstream", daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._serve())
        self._loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        self._ready.set()
        async with server:
            await self._stop.wait()
            server.close()
            for writer in self._writers:
                # abort, not close: a close waits for the write buffer to drain, and an endless
                # reply's never does once the client stops reading
                writer.transport.abort()
            tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await server.wait_closed()
            await asyncio.sleep(0)  # the aborted sockets close on the loop's next pass

    def start(self) -> None:
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the hostile upstream did not start")

    def wait_for_late_writes(self, count: int, timeout_s: float = 30.0) -> None:
        """Block until `overlong_late` has written `count` extra replies."""
        with self._late:
            if not self._late.wait_for(lambda: self.late_writes >= count, timeout_s):
                raise TimeoutError(f"{self.late_writes} late writes, not {count}")

    def stop(self) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.append(writer)
        try:
            while (request := await _read_request(reader)) is not None:
                self.requests += 1
                path, body = request
                await self._reply(writer, http_reply(self.answer(path, body)))
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def _reply(self, writer: asyncio.StreamWriter, reply: bytes) -> None:
        behaviour = self.behaviour
        if behaviour in ("endless_line", "endless_fields"):
            await self._endless(writer, behaviour == "endless_line")
            return
        if behaviour == "trickle":
            await self._trickle(writer, reply)
            return
        if behaviour == "interim_100":
            reply = b"HTTP/1.1 100 Continue\r\n\r\n" + reply
        elif behaviour == "interim_103":
            reply = b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n" + reply
        elif behaviour == "overlong":
            reply += http_reply(self.inject)
        elif behaviour == "redirect_json":
            reply = http_reply(self.inject, status="302 Found")
            reply = reply.replace(b"\r\n\r\n", b"\r\nLocation: /elsewhere\r\n\r\n", 1)
        writer.write(reply)
        await writer.drain()
        if behaviour in ("overlong_late", "unasked_late", "head_late"):
            # a task of its own: the connection's next request is read (and answered) meanwhile
            delay = 0.05 if behaviour == "overlong_late" else self.late_delay_s
            late = http_reply(self.inject)
            if behaviour == "head_late":  # a head promising a body that never comes
                late = http_reply(b"{" * 100_000)[:-100_000]
            task = asyncio.ensure_future(self._write_late(writer, late, delay))
            self._late_tasks.add(task)
            task.add_done_callback(self._late_tasks.discard)

    async def _write_late(self, writer: asyncio.StreamWriter, late: bytes, delay: float) -> None:
        await asyncio.sleep(delay)  # the client has its reply and pools the connection
        if writer.is_closing():
            return
        try:
            writer.write(late)
            await writer.drain()
        except ConnectionError:
            return
        with self._late:
            self.late_writes += 1
            self._late.notify_all()

    async def _trickle(self, writer: asyncio.StreamWriter, reply: bytes) -> None:
        head, _, body = reply.partition(b"\r\n\r\n")
        body = body.ljust(TRICKLE_BYTES)  # JSON with trailing spaces is still JSON
        head = head.replace(b"Content-Length: ", b"X-Original-Length: ")
        writer.write(head + f"\r\nContent-Length: {len(body)}\r\n\r\n".encode())
        for byte in range(len(body)):
            writer.write(body[byte : byte + 1])
            await writer.drain()
            await asyncio.sleep(TRICKLE_EVERY_S)

    async def _endless(self, writer: asyncio.StreamWriter, one_line: bool) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nX-Endless: ")
        chunk = b"a" * 16_384 if one_line else b"a\r\nX-More: " * 1_365
        while True:  # until the client gives up (ConnectionError) or the server stops
            writer.write(chunk)
            await writer.drain()
            self.endless_bytes += len(chunk)
            await asyncio.sleep(0)


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, bytes] | None:
    """The request's path and body, or None when the client closed the connection."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        return None
    lines = head.split(b"\r\n")
    path = lines[0].split(b" ")[1].decode("latin-1")
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return path, await reader.readexactly(length)


@contextmanager
def hostile_upstream(
    answer: Answer, behaviour: Misbehaviour, inject: bytes = b"", late_delay_s: float = 0.3
) -> Iterator[HostileUpstream]:
    upstream = HostileUpstream(answer, behaviour, inject, late_delay_s)
    upstream.start()
    try:
        yield upstream
    finally:
        upstream.stop()
