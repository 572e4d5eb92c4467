"""A lean HTTP/1.1 transport for httpx: an asyncio protocol, llhttp (via httptools) to parse.

Why: profiling memproxy under load put ~40 % of its CPU in httpx's default transport stack
(httpcore's pool, h11, and AnyIO/sniffio lookups behind every lock, event and cancel scope),
more than in proxying itself. The httpx API is unchanged (``httpx.AsyncClient``, requests,
responses, timeouts, exceptions); only the wire work is done here, for HTTP/1.1 with keep-alive.

Promises:

- timeouts follow the request's httpx ``timeout`` extension: ``connect``, ``read`` (longest wait
  between two reads), ``write``, ``pool`` (waiting for a free connection);
- failures raise httpx's own exceptions (``ConnectError``, ``ReadTimeout``, ``RemoteProtocolError``
  ...), each carrying the request, mapped from one table (:data:`_ERRORS`, by phase);
- a request head with a byte that could end a header early is never sent
  (``LocalProtocolError``: :func:`app.proxy._http11.serialise`);
- a connection returns to the pool only after a complete response that allows keep-alive; a body
  closed early (the client left) closes its connection, which tells the upstream to stop;
- an idle connection the server closed is noticed from its ``connection_lost``, never reused; a
  request whose reused connection dies before any byte of answer is retried once on a new one
  (the keep-alive race: the server never saw it).

Not supported (not needed to reach an OpenAI-compatible server): HTTP/2, proxies, ``HEAD``.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx

from app.proxy._http11 import Connection, Dead, Piece, Pieces, serialise

__all__ = ["LeanTransport", "Piece", "Pieces", "PoolState"]

_NO_TIMEOUTS: dict[str, float | None] = {"connect": None, "read": None, "write": None, "pool": None}


_Failure = tuple[tuple[type[BaseException], ...], type[httpx.TransportError], str, bool]
_ERRORS: dict[str, tuple[_Failure, ...]] = {
    # phase: (what was raised, the httpx exception it becomes, its message, keep it as the cause)
    "pool": (((TimeoutError,), httpx.PoolTimeout, "no free upstream connection in time", False),),
    "connect": (
        ((TimeoutError,), httpx.ConnectTimeout, "timed out connecting to {where}", False),
        # The cause is kept: a failed certificate check is found there (app/proxy/tls.py).
        ((OSError, ssl.SSLError), httpx.ConnectError, "{exc}", True),
    ),
    "write": (
        ((TimeoutError,), httpx.WriteTimeout, "timed out waiting to write the upstream", False),
        (
            (Dead, OSError),
            httpx.RemoteProtocolError,
            "the upstream closed the connection ({exc})",
            False,
        ),
    ),
    "read": (
        ((TimeoutError,), httpx.ReadTimeout, "timed out waiting to read the upstream", False),
        (
            (Dead, OSError),
            httpx.RemoteProtocolError,
            "the upstream closed the connection ({exc})",
            False,
        ),
    ),
    "body": (
        ((TimeoutError,), httpx.ReadTimeout, "timed out reading from the upstream", False),
        (
            (Dead, OSError),
            httpx.RemoteProtocolError,
            "the upstream closed mid-response ({exc})",
            False,
        ),
    ),
}
"""Every failure of the wire, by the phase it happened in, as httpx's own exception (httpx maps
httpcore's the same way, from one table)."""
_WIRE = (TimeoutError, Dead, OSError, httpx.TransportError)
"""What :func:`_as_httpx` maps; anything else (a cancellation) goes through as it is."""


def _as_httpx(
    exc: BaseException, phase: str, request: httpx.Request, where: str = ""
) -> BaseException:
    """The httpx exception `exc` stands for (:data:`_ERRORS`), carrying the request."""
    if isinstance(exc, httpx.TransportError):
        exc.request = request
        return exc
    for kinds, error, message, keep_cause in _ERRORS[phase]:
        if isinstance(exc, kinds):
            text = message.format(exc=str(exc) or type(exc).__name__, where=where)
            mapped = error(text, request=request)
            mapped.__cause__ = exc if keep_cause else None
            mapped.__suppress_context__ = True
            return mapped
    return exc


class _Body(httpx.AsyncByteStream):
    def __init__(
        self,
        pool: LeanTransport,
        key: tuple[str, str, int],
        conn: Connection,
        request: httpx.Request,
        read_timeout: float | None,
    ) -> None:
        self._pool, self._key, self._conn = pool, key, conn
        self._request, self._timeout = request, read_timeout
        self._released = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            try:
                chunk = await self._conn.next_chunk(self._timeout)
            except _WIRE as exc:
                raise _as_httpx(exc, "body", self._request)  # noqa: B904 (its cause is set)
            if chunk is None:
                return
            yield chunk

    async def aclose(self) -> None:
        if not self._released:
            self._released = True
            self._pool._release(self._key, self._conn)


@dataclass(frozen=True, slots=True)
class PoolState:
    open: int
    idle: int
    waiting: int


class LeanTransport(httpx.AsyncBaseTransport):
    """HTTP/1.1 keep-alive pool; see the module docstring for what it promises."""

    def __init__(self, *, limits: httpx.Limits, verify: bool | ssl.SSLContext = True) -> None:
        self._max_connections = limits.max_connections or 10**6
        self._max_idle = limits.max_keepalive_connections or 0
        self._expiry = limits.keepalive_expiry if limits.keepalive_expiry is not None else 5.0
        self._ssl = (
            verify
            if isinstance(verify, ssl.SSLContext)
            else httpx.create_ssl_context(verify=verify)
        )
        self._idle: dict[tuple[str, str, int], list[Connection]] = {}
        self._open = 0
        self._waiters: deque[tuple[tuple[str, str, int], asyncio.Future[Connection | None]]] = (
            deque()
        )

    @property
    def pool(self) -> PoolState:
        """How many connections are open, how many of them idle, and how many requests wait
        for one (for tests and diagnostics)."""
        idle = sum(len(connections) for connections in self._idle.values())
        return PoolState(open=self._open, idle=idle, waiting=len(self._waiters))

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        timeouts: dict[str, Any] = request.extensions.get("timeout") or _NO_TIMEOUTS
        url = request.url
        key = (url.scheme, url.host, url.port or (443 if url.scheme == "https" else 80))
        stream = request.stream
        body = stream.pieces if isinstance(stream, Pieces) else [await request.aread()]
        data = serialise(request, body)
        for attempt in (1, 2):
            conn, reused = await self._acquire(key, request, timeouts)
            phase = "write"
            try:
                conn.begin()
                await conn.send(data, timeouts.get("write"))
                phase = "read"
                await conn.read_head(timeouts.get("read"))
                break
            except _WIRE as exc:
                self._discard(conn)
                if isinstance(exc, Dead) and reused and attempt == 1 and not conn.got_bytes:
                    continue  # the keep-alive race: the server closed it before reading our request
                raise _as_httpx(exc, phase, request)  # noqa: B904 (its cause is set)
            except (
                BaseException
            ):  # cancelled (the client left): the connection is in an unknown state
                self._discard(conn)
                raise
        return httpx.Response(
            conn.status,
            headers=conn.headers,
            stream=_Body(self, key, conn, request, timeouts.get("read")),
            extensions={"http_version": b"HTTP/1.1"},
        )

    async def _acquire(
        self, key: tuple[str, str, int], request: httpx.Request, timeouts: dict[str, Any]
    ) -> tuple[Connection, bool]:
        """An idle connection to `key`, a new one, or, at the limit, the next one released."""
        idle = self._idle.get(key)
        now = time.monotonic()
        while idle:
            conn = idle.pop()  # the most recently used: the least likely to have been closed
            if not conn.closed and now - conn.idle_since < self._expiry:
                return conn, True
            self._discard(conn)
        if self._open >= self._max_connections:
            self._evict_one_idle()  # an idle connection to another origin may free a slot
        if self._open < self._max_connections and not self._waiters:
            self._open += 1
        else:
            handed = await self._wait_turn(key, request, timeouts.get("pool"))
            if handed is not None:
                return handed, True
        try:
            return await self._connect(key, request, timeouts.get("connect")), False
        except BaseException:
            self._give_slot()
            raise

    async def _connect(
        self, key: tuple[str, str, int], request: httpx.Request, timeout: float | None
    ) -> Connection:
        scheme, host, port = key
        tls = self._ssl if scheme == "https" else None
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                _, conn = await loop.create_connection(
                    Connection, host, port, ssl=tls, server_hostname=host if tls else None
                )
        except (TimeoutError, OSError, ssl.SSLError) as exc:
            raise _as_httpx(exc, "connect", request, f"{host}:{port}")  # noqa: B904 (cause set)
        return conn

    async def _wait_turn(
        self, key: tuple[str, str, int], request: httpx.Request, timeout: float | None
    ) -> Connection | None:
        """Wait for a released connection to `key` (returned) or a freed slot (None)."""
        waiter: asyncio.Future[Connection | None] = asyncio.get_running_loop().create_future()
        entry = (key, waiter)
        self._waiters.append(entry)
        try:
            async with asyncio.timeout(timeout):
                return await waiter
        except TimeoutError as exc:
            raise _as_httpx(exc, "pool", request)  # noqa: B904 (its cause is set)
        except BaseException:
            if waiter.done() and not waiter.cancelled():  # handed something we will not use
                handed = waiter.result()
                if handed is None:
                    self._give_slot()
                else:
                    self._release(key, handed)
            raise
        finally:
            if entry in self._waiters:
                self._waiters.remove(entry)

    def _give_slot(self) -> None:
        """A connection is gone: its slot goes to the first waiter, or back to the pool."""
        while self._waiters:
            _, waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._open -= 1

    def _evict_one_idle(self) -> None:
        for idle in self._idle.values():
            if idle:
                self._discard(idle.pop(0))
                return

    def _release(self, key: tuple[str, str, int], conn: Connection) -> None:
        """Done with `conn`: hand it to a waiter for its origin, keep it idle, or close it."""
        if conn.reusable:
            for entry in self._waiters:
                if entry[0] == key and not entry[1].done():
                    self._waiters.remove(entry)
                    entry[1].set_result(conn)
                    return
            idle = self._idle.setdefault(key, [])
            if len(idle) < self._max_idle:
                conn.idle_since = time.monotonic()
                conn.in_use = False
                idle.append(conn)
                return
        self._discard(conn)

    def _discard(self, conn: Connection) -> None:
        conn.close()
        if conn.holds_slot:
            conn.holds_slot = False
            self._give_slot()

    async def aclose(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                self._discard(conn)
        self._idle.clear()
