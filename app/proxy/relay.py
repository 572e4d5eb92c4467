"""The ASGI response that performs one upstream exchange and relays it to the client.

Everything that waits on the network happens inside :meth:`ProxyResponse.__call__`, under a
watcher of the client's connection: if the client goes away (while the upstream is still
thinking, or mid-stream) the upstream request is closed at once, so the model stops generating
for nobody.

Bytes are relayed as they arrive, never parsed or re-serialised. For an SSE body they are released
at event boundaries (``\\n\\n``): a chunk ending mid-event waits for the rest of its event, so
when the upstream breaks off mid-stream the client's last event is whole and the final
``data: {"error": ...}`` event memproxy adds is readable. A copy of the bytes (capped) is kept
for the completion hook, which reads the assistant's text from it after the response is done.

A body that breaks off never reaches the client as a complete answer, and an exchange that fails
on the upstream's side is logged once: :mod:`app.proxy.relay_failures`.

At the end of a shutdown's grace (:mod:`app.shutdown`) an exchange under way is ended as one
the client left is, then the client gets a 503 ``shutting_down`` or a stream its final error
event. How an exchange that did not end whole ended goes to the access line (``ended=``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from app.errors import MemproxyError, UpstreamStatusError
from app.proxy.hooks import Outcome
from app.proxy.relay_failures import (
    cause_of,
    ended,
    error_event,
    event_of,
    log_failure,
    send_error,
    send_json,
    shutting_down,
)
from app.proxy.upstream import Upstream
from app.shutdown import ShutdownGrace, grace_of, leave_unfinished

MAX_CAPTURE_BYTES = 8 * 1024 * 1024
"""Most bytes of a response kept for the completion hook; beyond it the copy is cut."""
MAX_PENDING_BYTES = 1024 * 1024
"""An SSE 'event' longer than this without a boundary is not SSE: relay it as it is."""

FinishCallback = Callable[[Outcome, int, list[bytes]], None]


class ProxyResponse(Response):
    """Open `request` upstream and relay the answer; `on_first_byte()` is awaited just before
    the answer's status line and first body byte are sent to the client (the client has none
    of it before that returns; when it raises a :class:`MemproxyError` the client gets that
    error instead, and the upstream's answer is closed unread), `on_finish(outcome, status,
    captured)` is called once the exchange is over, after the last byte was sent (or the client
    left)."""

    def __init__(
        self,
        upstream: Upstream,
        request: httpx.Request,
        *,
        extra_headers: list[tuple[bytes, bytes]] | None = None,
        on_finish: FinishCallback | None = None,
        on_first_byte: Callable[[], Awaitable[None]] | None = None,
        capture: bool = False,
    ) -> None:
        self.upstream = upstream
        self.upstream_request = request
        self.extra_headers = extra_headers or []
        self.on_finish = on_finish
        self.on_first_byte = on_first_byte
        self.capture = capture
        self.status_code = 0
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        state = _Exchange(capture=self.capture)
        task = asyncio.current_task()
        assert task is not None
        notes = scope.setdefault("state", {})
        grace = grace_of(scope)

        def end_early(outcome: Outcome) -> None:
            # Servers also report a disconnect once the last byte is out: that is no early exit.
            if not state.sent_last and not state.cancelled:
                state.outcome = outcome
                state.cancelled = True
                task.cancel()

        async def watch_disconnect() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            end_early(Outcome.CLIENT_DISCONNECTED)

        # Plain asyncio rather than an AnyIO task group: this runs for every request, and the
        # task group's per-call library lookups cost ~9 % of the proxy's CPU.
        watcher = asyncio.get_running_loop().create_task(watch_disconnect())
        unwatch = grace.watch(lambda: end_early(Outcome.SHUTDOWN)) if grace else None
        interrupted = False
        try:
            await self._exchange(send, state, notes)
        except asyncio.CancelledError:
            if not state.cancelled:
                if grace is not None and grace.begun:  # uvicorn's limit, or a second Ctrl-C
                    notes["ended"] = "shutdown"
                self._finish(state, escaped=True)
                raise  # not ours: let it propagate
            interrupted = True
        except BaseException:
            self._finish(state, escaped=True)
            raise
        else:
            if state.cancelled:
                # The watcher cancelled us after the exchange's last await: the cancellation is
                # still pending (3.11's uncancel() does not clear it), so take delivery here.
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.sleep(0)
        finally:
            watcher.cancel()
            if unwatch is not None:
                unwatch()
        if state.cancelled:
            task.uncancel()
        try:
            if interrupted and state.outcome is Outcome.SHUTDOWN:
                assert grace is not None
                await self._end_for_shutdown(send, state, grace)
        finally:  # also when a client reading nothing holds the last event past uvicorn's limit
            notes["ended"] = ended(state.outcome, head_sent=state.head_sent)
            self._finish(state, escaped=False)

    async def _end_for_shutdown(self, send: Send, state: _Exchange, grace: ShutdownGrace) -> None:
        """The exchange was interrupted at the end of the shutdown grace: the client is told,
        in a 503 when it has none of the answer, in a final event when it is a stream (a plain
        body begun cannot be ended short: the connection is dropped)."""
        error = shutting_down(grace.seconds)
        if state.head_sent:
            leave_unfinished()  # its end never comes: the connection is dropped
        # OSError: the client is gone; RuntimeError: the head's send was cut before it was out.
        with contextlib.suppress(OSError, RuntimeError):
            if not state.head_sent:
                state.status = error.status_code
                await send_error(send, error.status_code, error, self.extra_headers)
            elif state.sse:
                body = event_of(error)
                await send({"type": "http.response.body", "body": body, "more_body": True})

    def _finish(self, state: _Exchange, *, escaped: bool) -> None:
        """Tell `on_finish` how the exchange ended, once, whatever ended it: an exception that
        escapes the exchange (a shutdown, a bug) is a failure, never a completed answer."""
        hook, self.on_finish = self.on_finish, None
        if hook is None:
            return
        if escaped and state.outcome is Outcome.COMPLETED:
            state.outcome = Outcome.UPSTREAM_FAILED
        hook(state.outcome, state.status, state.captured)

    async def _exchange(self, send: Send, state: _Exchange, notes: dict[str, Any]) -> None:
        started = time.perf_counter()
        try:
            response = await self.upstream.open(self.upstream_request)
        except MemproxyError as exc:
            notes["upstream_ms"] = round((time.perf_counter() - started) * 1000, 1)
            state.outcome = Outcome.UPSTREAM_FAILED
            status = (
                exc.upstream_status if isinstance(exc, UpstreamStatusError) else exc.status_code
            )
            state.status = status
            state.sent_last = True
            if status >= 500:
                log_failure(self.upstream_request, status, cause_of(exc), exc.message)
            await send_error(send, status, exc, self.extra_headers)
            return
        notes["upstream_ms"] = round((time.perf_counter() - started) * 1000, 1)  # access log
        state.status = response.status_code
        headers = Upstream.response_headers(response)
        content_type = response.headers.get("content-type", "")
        state.sse = sse = content_type.startswith("text/event-stream")
        start = {
            "type": "http.response.start",
            "status": response.status_code,
            "headers": headers + self.extra_headers,
        }
        try:
            await self._relay(response, send, state, sse, start)
        except OSError:  # the client's socket is gone; uvicorn says so on send
            state.outcome = Outcome.CLIENT_DISCONNECTED
        finally:
            await response.aclose()

    async def _relay(
        self,
        response: httpx.Response,
        send: Send,
        state: _Exchange,
        sse: bool,
        start: dict[str, Any],
    ) -> None:
        # The head goes out with the first piece of body: a body that fails before it can still
        # be answered with a 502 instead of a 200 that ends early.
        pending = b""
        try:
            async for chunk in response.aiter_bytes():
                state.keep(chunk)
                if sse:
                    chunk, pending = _split_at_event_end(pending + chunk if pending else chunk)
                    if not chunk:
                        continue
                if not state.head_sent:
                    if not await self._before_first_byte(send, state):
                        return
                    state.head_sent = True  # before the send: interrupted in it, it may be out
                    await send(start)
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except httpx.HTTPError as exc:
            state.outcome = Outcome.UPSTREAM_FAILED
            cause = "timeout" if isinstance(exc, httpx.TimeoutException) else "broken off"
            detail = f"{type(exc).__name__}: {exc}"
            state.sent_last = True
            if not state.head_sent:
                error = self.upstream.body_error(exc)
                state.status = error.status_code
                where = f"{cause} before the body"
                log_failure(self.upstream_request, error.status_code, where, detail)
                await send_json(send, error.status_code, error.to_body(), self.extra_headers)
                return
            log_failure(self.upstream_request, response.status_code, f"{cause} mid-body", detail)
            if sse:  # a partial event is dropped: the client gets whole events, then the error
                await send(
                    {"type": "http.response.body", "body": error_event(exc), "more_body": True}
                )
            # No end of body: returning without it makes the server drop the connection, so the
            # client sees a broken answer (curl and httpx fail), never a well-framed short one.
            leave_unfinished()
            return
        if not state.head_sent and not await self._before_first_byte(send, state):
            return  # an empty answer is still an answer: it waits as well
        state.sent_last = True
        if not state.head_sent:
            state.head_sent = True
            await send(start)
        await send({"type": "http.response.body", "body": pending, "more_body": False})

    async def _before_first_byte(self, send: Send, state: _Exchange) -> bool:
        """Await `on_first_byte`; False when it refused the answer, the client answered with
        its error in its place (nothing of the answer was sent)."""
        hook, self.on_first_byte = self.on_first_byte, None
        if hook is None:
            return True
        try:
            await hook()
        except MemproxyError as exc:
            state.outcome = Outcome.REFUSED
            state.status = exc.status_code
            state.sent_last = True
            await send_error(send, exc.status_code, exc, self.extra_headers)
            return False
        return True


class _Exchange:
    __slots__ = (
        "cancelled", "capture", "captured", "head_sent", "outcome", "sent_last", "size", "sse",
        "status",
    )  # fmt: skip

    def __init__(self, *, capture: bool) -> None:
        self.capture = capture
        self.captured: list[bytes] = []
        self.size = 0
        self.outcome = Outcome.COMPLETED
        self.status = 0
        self.sent_last = False
        self.cancelled = False  # by the disconnect watcher or the shutdown grace
        self.head_sent = False  # the answer's status line (not an error memproxy answered)
        self.sse = False

    def keep(self, chunk: bytes) -> None:
        if self.capture and self.size < MAX_CAPTURE_BYTES:
            self.captured.append(chunk)
            self.size += len(chunk)


def _split_at_event_end(data: bytes) -> tuple[bytes, bytes]:
    """(what can be sent now, what must wait for the rest of its event)."""
    if data.endswith(b"\n\n") or data.endswith(b"\r\n\r\n"):
        return data, b""
    lf, crlf = data.rfind(b"\n\n"), data.rfind(b"\r\n\r\n")
    cut = max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)
    if cut == 0:  # no boundary yet
        return (data, b"") if len(data) > MAX_PENDING_BYTES else (b"", data)
    return data[:cut], data[cut:]
