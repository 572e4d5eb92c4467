"""Request bodies: the key checked before one is read, a size cap per route, a read deadline.

FastAPI reads and parses a route's body before its dependencies run, so a key checked in a
dependency comes too late: an unauthenticated client could make memproxy hold a body of any
size. :class:`BodyGuard`, a pure ASGI middleware, runs before any route:

- a request that carries a body (``Content-Length`` above 0, or ``Transfer-Encoding``) is
  answered 401 unless its key is accepted (:func:`app.deps.authenticate`), without reading it;
- a declared length over the route's limit is answered 413 at once; a streamed body (no
  ``Content-Length``) is counted as it arrives and answered 413 when it passes the limit. The
  memory API (``/v1/memories...``) and the MCP server (``/mcp``, chat keys only: no admin key)
  have their own, smaller limit (``MEMPROXY_MEMORY_MAX_BODY_BYTES``) than chat, whose bodies
  carry images (``MEMPROXY_MAX_BODY_BYTES``);
- a body that stalls for ``MEMPROXY_CLIENT_BODY_TIMEOUT_SECONDS``, or is still arriving after
  ``MEMPROXY_CLIENT_BODY_DEADLINE_SECONDS``, is answered 408.

Each refusal closes the connection (``Connection: close``): the rest of the body is never read.
Once refused, the route sees the client as gone and whatever it answers is dropped.
"""

from __future__ import annotations

import asyncio
import logging

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.mcp import MCP_PATH
from app.config import Settings
from app.deps import Services, authenticate
from app.errors import BodyTooLarge, MemproxyError, RequestTimeout, send_refusal
from app.proxy.body import too_large

logger = logging.getLogger("memproxy.body")
_DISCONNECT: Message = {"type": "http.disconnect"}


class BodyGuard:
    """See the module docstring; `settings` give the limits, the app's services the keys."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self._settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        length, streamed = _framing(scope) if scope["type"] == "http" else (0, False)
        if not length and not streamed:  # no body: nothing to guard (the routes check keys)
            await self.app(scope, receive, send)
            return
        memory = _is_memory_path(scope["path"])
        settings = self._settings
        limit, setting = (
            (settings.memory_max_body_bytes, "MEMPROXY_MEMORY_MAX_BODY_BYTES")
            if memory or scope["path"] == MCP_PATH
            else (settings.max_body_bytes, "MEMPROXY_MAX_BODY_BYTES")
        )
        # The app's services, once its lifespan has made them (Starlette puts the app in scope).
        services: Services | None = getattr(
            getattr(scope.get("app"), "state", None), "services", None
        )
        try:
            if services is not None:
                authenticate(services, _authorization(scope), admin_allowed=memory)
            if length is not None and length > limit:
                raise BodyTooLarge(too_large(limit, setting))
        except MemproxyError as exc:
            await send_refusal(send, exc)
            return
        guarded = _GuardedBody(
            receive,
            send,
            limit,
            setting,
            settings.client_body_timeout_seconds,
            settings.client_body_deadline_seconds,
        )
        try:
            await self.app(scope, guarded.receive, guarded.send)
        except Exception:
            if not guarded.refused:
                raise
            # The route failed reading a body it was told had gone (ClientDisconnect): the
            # client already has its 408 or 413.
            logger.debug("route ended after its body was refused", exc_info=True)


class _GuardedBody:
    """One request's `receive` and `send`, counting and timing the body on the way in."""

    def __init__(
        self, receive: Receive, send: Send, limit: int, setting: str, timeout: float, total: float
    ):
        self._receive = receive
        self._send = send
        self._limit = limit
        self._setting = setting
        self._timeout = timeout
        self._total = total
        self._deadline: float | None = None  # set at the first read: the whole body's limit
        self._size = 0
        self._complete = False
        self._started = False
        self.refused = False

    async def receive(self) -> Message:
        if self.refused:
            return _DISCONNECT
        if self._complete:  # after the body: waiting for a disconnect, for as long as it takes
            return await self._receive()
        now = asyncio.get_running_loop().time()
        if self._deadline is None:
            self._deadline = now + self._total
        pause_ends = now + self._timeout
        try:
            # A pause between two reads, and the whole body: a client trickling a byte just
            # under the pause limit would otherwise hold its connection for ever.
            async with asyncio.timeout_at(min(pause_ends, self._deadline)):
                message = await self._receive()
        except TimeoutError:
            if pause_ends <= self._deadline:
                why = (
                    f"the request body stalled: nothing received for {self._timeout:g} s "
                    "(MEMPROXY_CLIENT_BODY_TIMEOUT_SECONDS)"
                )
            else:
                why = (
                    f"the request body took longer than {self._total:g} s to arrive "
                    "(MEMPROXY_CLIENT_BODY_DEADLINE_SECONDS)"
                )
            return await self._refuse(RequestTimeout(why))
        if message["type"] == "http.request":
            self._size += len(message.get("body", b""))
            if self._size > self._limit:
                return await self._refuse(BodyTooLarge(too_large(self._limit, self._setting)))
            self._complete = not message.get("more_body", False)
        return message

    async def send(self, message: Message) -> None:
        if self.refused:
            return
        if message["type"] == "http.response.start":
            self._started = True
        await self._send(message)

    async def _refuse(self, error: MemproxyError) -> Message:
        self.refused = True
        if not self._started:  # else the answer has begun: the client just sees it cut off
            await send_refusal(self._send, error)
        return _DISCONNECT


def _framing(scope: Scope) -> tuple[int | None, bool]:
    """(the declared Content-Length or None, whether the body comes without a usable one)."""
    length: int | None = None
    streamed = False
    for name, value in scope["headers"]:
        if name == b"content-length" and value.isdigit():
            length = int(value)
        elif name in (b"transfer-encoding", b"content-length"):
            # Chunked; or a length that is not a number, which the server's parser refuses
            # before us: counted as it arrives, should one get through.
            streamed = True
    return length, streamed


def _is_memory_path(path: str) -> bool:
    return path == "/v1/memories" or path.startswith("/v1/memories/")


def _authorization(scope: Scope) -> str | None:
    for name, value in scope["headers"]:
        if name == b"authorization":
            return bytes(value).decode("latin-1")  # as Starlette's Request.headers reads it
    return None
