"""Pure ASGI middleware (no BaseHTTPMiddleware: it would buffer and slow the streams).

:class:`RequestIdMiddleware` gives each request an id (the client's ``X-Request-Id`` when it is a
sane token, else a fresh one), returns it in the response headers, puts it in every log line, and
logs one line per request (see :func:`_log_request`; never content).

A request that did not end whole says how it ended there (``ended=``, set in its state by the
relay, :func:`app.proxy.relay_failures.ended`; ``cancelled`` when the server cancelled it: a
shutdown's limit, a second Ctrl-C). One the client closed before its end is counted and logged
with status 499, as nginx does, whatever status was sent.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import Any
from urllib.parse import quote

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.log import new_request_id, request_id_var
from app.metrics import Metrics

logger = logging.getLogger("memproxy.access")
_TIMINGS = (("memory_ms", "ms"), ("injected", ""), ("upstream_ms", "ms"))
"""Optional parts of the access line, set in the request's state by the handlers: time spent
preparing memory (recall), memories injected, time until the upstream's response headers."""
CLIENT_CLOSED = 499
"""The status of a request the client closed before its end (nginx's)."""
_PROBES = frozenset({"/healthz", "/readyz", "/metrics"})
_SANE_ID = re.compile(r"\A[A-Za-z0-9._:\-]{1,128}\Z")
_PATH_SAFE = "/!$&'()*+,;=:@~-._"
"""What a path shows unencoded when the server gave no raw path (RFC 3986 pchar)."""


class RequestIdMiddleware:
    def __init__(self, app: ASGIApp, metrics: Metrics | None = None) -> None:
        self.app = app
        self._metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = _client_id(scope) or new_request_id()
        state = scope.setdefault("state", {})
        state["request_id"] = request_id
        token = request_id_var.set(request_id)
        started = time.perf_counter()
        status = 0
        id_header = (b"x-request-id", request_id.encode())

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", ()), id_header]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except asyncio.CancelledError:
            state.setdefault("ended", "cancelled")
            raise
        finally:
            if state.get("ended") == "client_closed":
                status = CLIENT_CLOSED
            if self._metrics is not None:
                route = scope.get("route")
                self._metrics.requests.labels(
                    getattr(route, "path", "unmatched"), str(status or 0), state.get("kind", "-")
                ).inc()
            _log_request(scope, state, status, time.perf_counter() - started)
            request_id_var.reset(token)


def _log_request(scope: Scope, state: dict[str, Any], status: int, seconds: float) -> None:
    """The access line: what was asked, by whom, how it ended and where the time went."""
    # Probes come every few seconds from orchestrators and scrapers: at DEBUG, not to drown
    # the requests that matter.
    level = logging.DEBUG if scope["path"] in _PROBES else logging.INFO
    if not logger.isEnabledFor(level):
        return
    fields: dict[str, Any] = {
        "method": scope["method"],
        "path": scope["path"],
        "status": status or None,
        "duration_ms": round(seconds * 1000, 1),
        "user": state.get("user_id"),
        "kind": state.get("kind"),
    }
    # Fields are split at spaces: the path as it came on the wire (percent-encoded, so a decoded
    # space cannot fake a field; control characters are escaped by the text formatter).
    # (Some servers, httpx's ASGI transport among them, leave the query in `raw_path`: cut.)
    raw_path = scope.get("raw_path")
    if raw_path:
        shown_path = raw_path.partition(b"?")[0].decode("latin-1")
    else:
        shown_path = quote(scope["path"], safe=_PATH_SAFE)
    text = (
        f"{fields['method']} {shown_path} {status or '-'} {fields['duration_ms']:.1f}ms "
        f"user={_value(fields['user'])} kind={fields['kind'] or '-'}"
    )
    for name, unit in _TIMINGS:
        value = state.get(name)
        if value is not None:
            fields[name] = value
            text += f" {name.removesuffix('_ms')}={value}{unit}"
    if ended := state.get("ended"):
        fields["ended"] = ended
        text += f" ended={ended}"
    logger.log(level, text, extra={"fields": fields})


def _value(value: str | None) -> str:
    """A client-chosen value (a user id) as one field of the text line: double-quoted, with
    ``"`` and ``\\`` escaped, when it has a space, a quote or an ``=`` (logfmt's rule)."""
    if not value:
        return "-"
    if any(c in value for c in ' "=\\'):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return value


def _client_id(scope: Scope) -> str | None:
    for name, value in scope["headers"]:
        if name == b"x-request-id":
            text = value.decode("latin-1")
            return text if _SANE_ID.match(text) else None
    return None
