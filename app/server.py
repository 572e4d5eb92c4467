"""How `memproxy serve` runs uvicorn: its options, and an HTTP protocol that bounds request heads.

uvicorn's httptools protocol reads a request's line and headers without a size limit and waits
for them forever, so a client could send megabytes of headers or hold connections open with half
a header. :class:`GuardedHttpToolsProtocol` caps the head at ``MEMPROXY_MAX_HEADER_BYTES`` (431),
gives up on a head not complete ``MEMPROXY_CLIENT_HEADER_TIMEOUT_SECONDS`` after the connection
opened or the request began (408; a connection that sent nothing is just closed), and answers
what uvicorn refuses itself (a malformed request line or header, e.g. a NUL byte in it; more than
``MEMPROXY_MAX_CONNECTIONS`` requests at once) in OpenAI's error shape instead of plain text.
Connections with nothing under way (nothing sent yet, or kept alive between requests; never one
part-way through a head) make room for requests (app.server_connections), and while they crowd
the cap, keep-alive connections wait ``MEMPROXY_CROWDED_KEEP_ALIVE_SECONDS`` for their next
request. Request bodies are guarded in the app (app.body_guard), so also under any other
ASGI server.

On shutdown (SIGTERM, Ctrl-C) the protocol starts the server's :class:`app.shutdown.ShutdownGrace`
and gives it to every request: ``MEMPROXY_SHUTDOWN_GRACE_SECONDS`` later the relay ends what is
still under way with an error; uvicorn cancels what remains ``SHUTDOWN_MARGIN_SECONDS`` after.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar, Literal

from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.flow_control import service_unavailable
from uvicorn.protocols.http.httptools_impl import (
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)

from app.config import Settings
from app.errors import (
    HeadersTooLarge,
    InvalidRequest,
    MemproxyError,
    RequestTimeout,
    ServerBusy,
    refusal,
    send_refusal,
)
from app.server_connections import ConnectionBook, book_of
from app.shutdown import EXTENSION, ShutdownGrace, grace_for

SHUTDOWN_MARGIN_SECONDS = 5.0
"""How long after the shutdown grace uvicorn cancels the requests still under way: those the
relay does not end itself (another route's), or a stream whose client does not read its last
event."""


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """Keyword arguments for `uvicorn.run` / `uvicorn.Config` (all but the app and address)."""
    return {
        "http": guarded_protocol(settings),
        # uvicorn's limit counts idle connections too: the protocol counts requests itself
        "limit_concurrency": None,
        "access_log": False,  # memproxy logs one line per request itself, with its request id
        "server_header": False,
        "log_level": settings.log_level.lower(),
        # The relay ends its exchanges at the grace (app.shutdown); uvicorn's limit is the
        # backstop for the rest (without one it waits for every request, however long).
        "timeout_graceful_shutdown": settings.shutdown_grace_seconds + SHUTDOWN_MARGIN_SECONDS,
    }


def guarded_protocol(settings: Settings) -> type[GuardedHttpToolsProtocol]:
    """The protocol class with the settings' limits (uvicorn builds it with its own arguments)."""

    class Protocol(GuardedHttpToolsProtocol):
        max_head_bytes = settings.max_header_bytes
        head_timeout = settings.client_header_timeout_seconds
        max_connections = settings.max_connections
        crowded_keep_alive = settings.crowded_keep_alive_seconds
        shutdown_grace = settings.shutdown_grace_seconds

    return Protocol


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, with a bounded head, OpenAI-shaped refusals, and a cap on
    requests served at once that idle connections do not fill."""

    max_head_bytes: ClassVar[int] = 64 * 1024
    head_timeout: ClassVar[float] = 10.0
    max_connections: ClassVar[int] = 1000
    crowded_keep_alive: ClassVar[float] = 1.0
    """The keep-alive timeout while connections crowd the cap (else uvicorn's)."""
    shutdown_grace: ClassVar[float] = 10.0
    """Seconds the requests under way have once the server shuts down."""
    _book: ConnectionBook
    _grace: ShutdownGrace
    _reading: Literal["idle", "head", "body"] = "idle"
    """Where the parser is: between requests, in a request's head, in its body."""
    _head_bytes = 0
    _heads_done = 0
    _head_timer: asyncio.TimerHandle | None = None
    _refusal: MemproxyError | None = None
    """Why a parser callback stopped the parser, for the answer (else: a malformed request)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._book = book_of(self.server_state, self.max_connections)
        self._book.opened(self, self.loop.time())
        self._grace = grace_for(self.server_state, self.shutdown_grace)
        self._start_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._book.closed(self)
        self._stop_head_timer()
        super().connection_lost(exc)

    def drop(self) -> None:
        """Close this connection to make room for a request (nothing is under way on it)."""
        self._stop_head_timer()
        self.transport.close()

    def shutdown(self) -> None:
        """The server is shutting down (uvicorn calls this on every open connection): the grace
        of the requests under way begins."""
        self._grace.begin()
        super().shutdown()

    def handle_websocket_upgrade(self) -> None:
        self._book.closed(self)  # handed to another protocol: uvicorn stops counting it too
        super().handle_websocket_upgrade()

    def data_received(self, data: bytes) -> None:
        if self.transport.is_closing():  # refused: what the client still sends is not read
            return
        counted = self._reading != "body"
        heads_done = self._heads_done
        super().data_received(data)
        if self._heads_done != heads_done:
            # A head ended in this chunk; any next one begun in it is counted from the next
            # chunk on (so the cap can be passed by at most one read, ~64-256 KiB).
            self._head_bytes = 0
        elif counted and self._reading != "body":
            self._head_bytes += len(data)
            if self._head_bytes > self.max_head_bytes and not self.transport.is_closing():
                self._refuse(_too_large(self.max_head_bytes))

    def on_message_begin(self) -> None:
        super().on_message_begin()
        # beside any extension uvicorn declares (a later uvicorn may declare some)
        self.scope.setdefault("extensions", {})[EXTENSION] = {"grace": self._grace}
        self._reading = "head"
        self._book.begun(self)  # under way: bounded by the head timer, not closed for room
        self._start_head_timer()

    def on_headers_complete(self) -> None:
        self._reading = "body"
        self._heads_done += 1
        self._stop_head_timer()
        # A whole head may come in one read, never counted by data_received: measured here.
        size = len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)
        if size > self.max_head_bytes:
            self._refusal = _too_large(self.max_head_bytes)
            raise self._refusal  # stops the parser: data_received answers with send_400_response
        # uvicorn refuses when its limit is reached (limit_concurrency is None otherwise): the
        # requests being served count, not the connections open
        over = len(self.tasks) >= self.max_connections
        self.limit_concurrency = 0 if over else None
        # a request served beyond the cap closes the connection idle the longest
        self._book.serving(self, self.loop.time(), make_room=not over)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._reading = "idle"
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.timeout_keep_alive_task is None:  # closing, or a pipelined request is served
            return
        if self._reading == "head":  # a pipelined head came in part: the head timer bounds it
            self._unset_keepalive_if_required()
            return
        self._book.idle(self)  # kept alive, waiting for the next request
        if self._book.crowded:
            self.timeout_keep_alive_task.cancel()
            self.timeout_keep_alive_task = self.loop.call_later(
                self.crowded_keep_alive, self.timeout_keep_alive_handler
            )

    def send_400_response(self, msg: str) -> None:
        """What uvicorn answers a request the parser refuses: here in OpenAI's shape."""
        self._refuse(
            self._refusal
            or InvalidRequest(
                "malformed HTTP request: bad request line, header name or header value "
                "(control characters such as NUL are not allowed in headers)",
                code="invalid_http_request",
            )
        )

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        if app is service_unavailable:  # over MEMPROXY_MAX_CONNECTIONS
            app = _server_busy
        super()._start_asgi_task(cycle, app)

    def _start_head_timer(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.head_timeout, self._head_timed_out)

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if self._reading != "head":  # opened and never used: nothing to answer
            self.transport.close()
            return
        self._refuse(
            RequestTimeout(
                f"request headers not complete within {self.head_timeout:g} s "
                "(MEMPROXY_CLIENT_HEADER_TIMEOUT_SECONDS)"
            )
        )

    def _refuse(self, error: MemproxyError) -> None:
        """Answer `error` and close the connection, unless a response is under way on it (a
        pipelined request's head): then only close."""
        if self.transport.is_closing():
            return
        if self.cycle is None or self.cycle.response_complete:
            self.transport.write(_raw_response(error, self.server_state.default_headers))
        self.transport.close()


def _too_large(limit: int) -> HeadersTooLarge:
    return HeadersTooLarge(
        f"request line and headers exceed {limit} bytes (MEMPROXY_MAX_HEADER_BYTES)"
    )


def _raw_response(error: MemproxyError, default_headers: list[tuple[bytes, bytes]]) -> bytes:
    body, headers = refusal(error)
    lines = [
        STATUS_LINE[error.status_code],
        *(n + b": " + v + b"\r\n" for n, v in [*default_headers, *headers]),
    ]
    return b"".join([*lines, b"\r\n", body])


async def _server_busy(scope: Scope, receive: Receive, send: Send) -> None:
    await send_refusal(
        send, ServerBusy("memproxy is handling as many connections as it may: retry shortly")
    )
