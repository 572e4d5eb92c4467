"""One HTTP/1.1 client connection: an asyncio protocol fed to llhttp (via httptools).

Private to :mod:`app.proxy.transport`, which pools these and speaks httpx. A connection carries
one request at a time; :meth:`_Connection.begin` resets it for the next. It promises:

- the response head is complete when :meth:`read_head` returns; body chunks come from
  :meth:`next_chunk` in order, ``None`` at the end;
- waits time out with ``TimeoutError`` after the given seconds of silence;
- a connection that died before any byte of answer raises :class:`_Dead` (the caller may retry
  a reused connection: the keep-alive race);
- ``reusable`` is true only after a complete response that allowed keep-alive;
- a response head (status line and headers, informational ones included) over
  :data:`MAX_HEAD_BYTES` or with more than :data:`MAX_HEADERS` headers is refused with
  ``httpx.RemoteProtocolError`` and the connection closed: memory stays bounded whatever the
  upstream sends (llhttp itself has no limit).
"""

from __future__ import annotations

import asyncio
import re
from collections import deque
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import cast

import httptools
import httpx

from app.proxy.offload import is_large

_HIGH_WATER = 1024 * 1024
"""Unread body bytes at which the socket stops being read (resumed once they are taken)."""
Piece = bytes | memoryview
WRITE_SLICE = 1024 * 1024
"""The most bytes of a request given to the transport in one write (:meth:`Connection.send`)."""
MAX_HEAD_BYTES = 64 * 1024
"""Most bytes of response head accepted (h11, httpx's default parser, allows 16 KiB)."""
MAX_HEADERS = 256
"""Most response headers accepted (OpenAI sends about 30)."""


def expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


class Dead(Exception):
    """The connection died before the response's first byte (safe to retry on a reused one)."""


class Connection(asyncio.Protocol):
    """One upstream connection; one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.holds_slot = True  # every open connection, idle or busy, counts against the limit
        self.in_use = False
        self.idle_since = 0.0
        self._waiter: asyncio.Future[None] | None = None
        self._drain: asyncio.Future[None] | None = None
        self._reading_paused = False
        self.begin()

    def begin(self) -> None:
        self.in_use = True
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.headers_done = False
        self.complete = False
        self.framed = False  # content-length or chunked: the body does not end at EOF
        self.informational = False
        self.keep_alive = False
        self.body: deque[bytes] = deque()
        self.buffered = 0
        self.error: BaseException | None = None
        self.got_bytes = False
        self.head_bytes = 0

    # --- asyncio.Protocol -----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if not self.in_use or self.complete:
            # Bytes after the response, or on an idle keep-alive connection, belong to no
            # request: the parser would take them for the next response. Retire the connection.
            self.close()
            return
        self.got_bytes = True
        if not self.headers_done:
            self.head_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.error = httpx.RemoteProtocolError(f"malformed response from the upstream: {exc}")
            self.close()
        too_big = self.head_bytes > MAX_HEAD_BYTES or len(self.headers) > MAX_HEADERS
        if too_big and not self.headers_done and self.error is None:
            self.error = httpx.RemoteProtocolError(
                f"the upstream's response head is over {MAX_HEAD_BYTES // 1024} KiB or "
                f"{MAX_HEADERS} headers"
            )
            self.close()
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.headers_done and not self.complete and not self.framed and self.error is None:
            self.complete = True  # a body delimited by the end of the connection
        elif not self.complete and self.error is None:
            self.error = Dead(str(exc) if exc else "the upstream closed the connection")
        self._wake()
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    def pause_writing(self) -> None:
        self._drain = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)
        self._drain = None

    # --- httptools callbacks --------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self.headers = []
        self.framed = False

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(self.headers) > MAX_HEADERS:
            return  # refused once this feed is over (see data_received): keep no more
        self.headers.append((name, value))
        if name.lower() in (b"content-length", b"transfer-encoding"):
            self.framed = True

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200:  # e.g. 103 Early Hints: wait for the real response
            self.informational = True
            return
        if len(self.headers) > MAX_HEADERS:
            return  # never done: data_received refuses it
        self.status = status
        self.headers_done = True
        # Read now: llhttp resets its per-message flags once the message is complete.
        self.keep_alive = self.parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        self.body.append(body)
        self.buffered += len(body)
        if self.buffered > _HIGH_WATER and not self._reading_paused and self.transport is not None:
            self._reading_paused = True
            self.transport.pause_reading()

    def on_message_complete(self) -> None:
        if self.informational:
            self.informational = False
            return
        self.complete = True

    # --- used by the transport ------------------------------------------------------------------
    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def _wait(self, timeout: float | None) -> None:
        """Until the protocol has news; TimeoutError after `timeout` seconds of silence.

        A timer on the future rather than ``asyncio.timeout()``: this runs once per body chunk,
        and the context manager's task-cancellation machinery cost ~10 % of the proxy's CPU.
        """
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = loop.call_later(timeout, expire, waiter) if timeout is not None else None
        try:
            await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()

    async def send(self, data: Sequence[Piece], timeout: float | None) -> None:
        """Write `data`'s pieces in order (each as it is: a 50 MB body is not copied into one
        piece with its head), a large one :data:`WRITE_SLICE` bytes at a time, and after every
        :data:`WRITE_SLICE` bytes written wait until the transport's buffer is below its high
        mark again: asyncio's own transport copies what the socket does not take at once into
        its buffer, on the event loop (a 50 MB write held it ~65 ms). `timeout` bounds each of
        those waits (the socket taking nothing for that long), not the whole send."""
        if self.closed or self.transport is None:
            raise Dead("the connection is closed")
        unwaited = 0  # bytes written since the buffer was last seen below its mark
        for piece in data:
            view = memoryview(piece) if len(piece) > WRITE_SLICE else None
            for start in range(0, len(piece), WRITE_SLICE):
                part = piece if view is None else view[start : start + WRITE_SLICE]
                self.transport.write(part)
                unwaited += len(part)
                if unwaited >= WRITE_SLICE:
                    await self._drained(timeout)
                    unwaited = 0
        await self._drained(timeout)

    async def _drained(self, timeout: float | None) -> None:
        """Until the transport's buffer is below its high mark; :class:`Dead` once the
        connection is closed."""
        if self._drain is not None:
            async with asyncio.timeout(timeout):
                await self._drain
        if self.closed:
            raise Dead("the connection closed while sending")

    async def read_head(self, timeout: float | None) -> None:
        while not self.headers_done:
            if self.error is not None:
                raise self.error
            await self._wait(timeout)

    async def next_chunk(self, timeout: float | None) -> bytes | None:
        while not self.body:
            if self.complete:
                return None
            if self.error is not None:
                raise self.error
            await self._wait(timeout)
        # Everything that has arrived, in one piece: a burst of SSE events then costs the relay
        # one send (and one socket write) instead of one per event, and nothing waits for it.
        if len(self.body) == 1:
            chunk = self.body.popleft()
        else:
            chunk = b"".join(self.body)
            self.body.clear()
        self.buffered = 0
        if self._reading_paused and self.transport is not None:
            self._reading_paused = False
            self.transport.resume_reading()
        return chunk

    @property
    def reusable(self) -> bool:
        return self.complete and self.error is None and not self.closed and self.keep_alive

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        self.closed = True


_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_FIELD_VALUE = re.compile(rb"[^\x00-\x08\x0a-\x1f\x7f]*")
"""What a header value may hold (RFC 9110: visible characters, spaces, tabs, obs-text)."""
_TARGET = re.compile(rb"[^\x00-\x20\x7f]+")


def serialise(request: httpx.Request, body: Sequence[Piece]) -> list[Piece]:
    """The request's head and its body's pieces, to be written one after the other (joined, a
    50 MB body was copied once more on the event loop: ~10-30 ms); a body of up to
    :data:`~app.proxy.offload.LARGE_BODY_BYTES` comes joined to the head, in one piece.
    The body is always sent with a Content-Length.

    Every byte of the head is checked first, as h11 does: a method or header name that is not a
    token, a target with a space or control byte, or a header value with CR, LF, NUL or another
    control byte raises ``httpx.LocalProtocolError`` and nothing is sent (a value could
    otherwise end the header early and smuggle another into the upstream's request)."""
    method = request.method.encode("ascii")
    target = request.url.raw_path
    if not _TOKEN.fullmatch(method) or not _TARGET.fullmatch(target):
        raise httpx.LocalProtocolError(f"invalid request line: {method!r} {target[:200]!r}")
    lines = [method, b" ", target, b" HTTP/1.1\r\n"]
    for name, value in request.headers.raw:
        if not _TOKEN.fullmatch(name):
            raise httpx.LocalProtocolError(f"invalid header name {name[:100]!r}")
        if not _FIELD_VALUE.fullmatch(value):
            raise httpx.LocalProtocolError(
                f"header {name.decode('ascii')!r} has a control character (CR, LF, NUL...)"
            )
        if name.lower() not in (b"content-length", b"transfer-encoding"):
            lines += [name, b": ", value, b"\r\n"]
    size = sum(len(piece) for piece in body)
    if size or request.method in ("POST", "PUT", "PATCH"):
        lines += [b"content-length: ", str(size).encode("ascii"), b"\r\n"]
    lines.append(b"\r\n")
    if not is_large(size):  # one write, one segment for the usual request
        return [b"".join([*lines, *body])]
    return [b"".join(lines), *body]


class Pieces(httpx.SyncByteStream, httpx.AsyncByteStream):
    """A request body in pieces (bytes, or views of the client's body), which the transport
    writes as they are: joined first, views would be copied with the GIL held throughout (a
    join lets go of it only when every piece is ``bytes``). Read through httpx (a test's mock
    transport), each piece is a copy."""

    def __init__(self, pieces: Sequence[Piece]) -> None:
        self.pieces = pieces

    def __iter__(self) -> Iterator[bytes]:
        for piece in self.pieces:
            yield bytes(piece)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for piece in self.pieces:
            yield bytes(piece)
