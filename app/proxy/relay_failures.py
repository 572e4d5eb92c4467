"""What the relay (:mod:`app.proxy.relay`) answers and logs when an exchange fails.

A body that breaks off (a short Content-Length, broken chunks, a read timeout) never reaches the
client as a complete answer: before any of it was sent, the client gets a 502 (504 for a timeout);
after, the response is left unfinished (SSE: after a final error event, :func:`error_event`), so
the server drops the connection and the client's HTTP library reports the failure. An upstream
error status is relayed with its ``Retry-After`` and rate-limit headers; so is a refusal of the
answer before its first byte (:func:`send_error`).

An exchange that fails on the upstream's side is logged once, at WARNING, with the upstream URL
(password and query values masked), the status answered and the cause: an answer of 5xx
(unreachable: 502, timeout: 504, or the upstream's own 5xx), or a body broken off mid-way
(:func:`log_failure`).

How an exchange that did not end whole ended is named on the access line by :func:`ended`.
"""

from __future__ import annotations

import logging
from typing import Any

import httpx
import orjson
from starlette.types import Send

from app.errors import (
    MemproxyError,
    ShuttingDown,
    UpstreamStatusError,
    UpstreamTimeout,
    UpstreamUnreachable,
    error_body,
)
from app.log import mask_url
from app.proxy.hooks import Outcome
from app.proxy.upstream import RELAYED_HEADERS

logger = logging.getLogger("memproxy.upstream")


def log_failure(request: httpx.Request, status: int, cause: str, detail: str) -> None:
    """The WARNING line of an exchange that failed on the upstream's side."""
    url = mask_url(str(request.url))
    logger.warning(
        "upstream %s %s failed: %s (answered %d): %s",
        request.method,
        url,
        cause,
        status,
        detail[:300],  # an upstream's own message: bounded, whatever it sent
        extra={"fields": {"upstream_url": url, "status": status, "cause": cause}},
    )


def cause_of(exc: MemproxyError) -> str:
    """The cause :func:`log_failure` names for an exchange that failed before any answer."""
    if isinstance(exc, UpstreamTimeout):
        return "timeout"
    if isinstance(exc, UpstreamUnreachable):
        return "unreachable"
    if isinstance(exc, UpstreamStatusError):
        return f"upstream status {exc.upstream_status}"
    return type(exc).__name__


def error_event(exc: httpx.HTTPError) -> bytes:
    """The last SSE event of a stream the upstream broke off."""
    if isinstance(exc, httpx.TimeoutException):
        message, code = "the upstream stopped sending mid-stream (read timeout)", "upstream_timeout"
    else:
        message = f"the upstream broke off mid-stream ({type(exc).__name__})"
        code = "upstream_disconnected"
    body = error_body(message, "upstream_error", code=code)
    return b"data: " + orjson.dumps(body) + b"\n\n"


def event_of(error: MemproxyError) -> bytes:
    """`error` as a stream's last SSE event (OpenAI's SDKs raise it as an APIError)."""
    return b"data: " + orjson.dumps(error.to_body()) + b"\n\n"


def shutting_down(grace_seconds: float) -> ShuttingDown:
    """What a client whose answer memproxy's shutdown cut is told."""
    return ShuttingDown(
        f"memproxy is shutting down: the answer did not end within {grace_seconds:g} s "
        "(MEMPROXY_SHUTDOWN_GRACE_SECONDS)"
    )


def ended(outcome: Outcome, *, head_sent: bool) -> str | None:
    """How an exchange ended that the client did not get whole, for the access line (its status
    alone would say 200): ``client_closed`` (the client left first), ``shutdown`` (cut at the end
    of memproxy's shutdown grace), ``upstream_broke_off`` (mid-body); None otherwise (whole, or
    an error status that says it)."""
    if outcome is Outcome.CLIENT_DISCONNECTED:
        return "client_closed"
    if outcome is Outcome.SHUTDOWN:
        return "shutdown"
    if outcome is Outcome.UPSTREAM_FAILED and head_sent:
        return "upstream_broke_off"
    return None


async def send_error(
    send: Send, status: int, exc: MemproxyError, extra: list[tuple[bytes, bytes]]
) -> None:
    """`exc` as the whole answer, with `status`, its own headers (``Retry-After``...) and
    `extra`."""
    passed = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in exc.headers.items()]
    await send_json(send, status, exc.to_body(), passed + extra)


async def send_json(
    send: Send, status: int, body: dict[str, Any], extra: list[tuple[bytes, bytes]]
) -> None:
    """`body` as the whole answer, with `status` and the `extra` headers."""
    payload = orjson.dumps(body)
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(payload)).encode()),
        *RELAYED_HEADERS,  # it may quote the upstream's answer
        *extra,
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload, "more_body": False})
