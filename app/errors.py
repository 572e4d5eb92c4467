"""Every error memproxy answers with (the one handler that turns them into OpenAI's shape is
:func:`app.error_handlers.install_error_handlers`).

Exception tree (each class fixes its HTTP status, `type` and default `code`)::

    MemproxyError                      500 server_error
    ├── InvalidRequest                 400 invalid_request_error
    │   ├── InvalidJSON                400   code=invalid_json
    │   ├── ValidationFailed           422   code=invalid_value (param names the field)
    │   ├── BodyTooLarge               413   code=body_too_large
    │   ├── RequestTimeout             408   code=request_timeout (headers or body stalled)
    │   ├── HeadersTooLarge            431   code=headers_too_large
    │   ├── UnsupportedMediaType       415   code=unsupported_media_type (a body not JSON)
    │   └── HostNotAllowed             421   code=host_not_allowed (MEMPROXY_ALLOWED_HOSTS)
    ├── AuthenticationFailed           401 authentication_error  code=invalid_api_key
    │   └── UserRequired               401   code=user_required
    ├── PermissionDenied               403 permission_error
    │   └── CrossOrigin                403   code=cross_origin (a write from another site)
    ├── NotFound                       404 not_found_error
    ├── Conflict                       409 conflict_error
    ├── ServerBusy                     503 server_error  code=server_busy (MEMPROXY_MAX_CONNECTIONS)
    ├── StorageUnavailable             503 server_error  code=storage_unavailable (database failing)
    ├── ShuttingDown                   503 server_error  code=shutting_down (its grace passed)
    └── UpstreamError                  502 upstream_error
        ├── UpstreamUnreachable        502   code=upstream_unreachable
        ├── UpstreamTimeout            504   code=upstream_timeout
        └── UpstreamStatusError        the upstream's own status, its error body normalised

Every response body is ``{"error": {"message", "type", "param", "code"}}``, its ``code`` a string
or null (as OpenAI's SDKs expect; an upstream's integer code is turned into a string); nothing
reaches the client as a bare 500 traceback: unexpected exceptions are logged and answered in the
same shape, and the database failing (down, restarting, full: :mod:`app.storage_faults`) is a 503
``storage_unavailable`` with ``Retry-After``.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any, ClassVar

import orjson
from starlette.types import Send

STORAGE_MESSAGE = "memproxy's database is unavailable (restarting, unreachable or full): try again"
STORAGE_RETRY_AFTER_SECONDS = 2
"""What a 503 for a failing database asks the client to wait: a restart takes seconds."""


def causes(exc: BaseException) -> list[BaseException]:
    """`exc` and what caused it, outermost first (``__cause__``, else ``__context__``): the
    error a library raises often wraps the one that says what went wrong."""
    chain: list[BaseException] = []
    link: BaseException | None = exc
    while link is not None and link not in chain:
        chain.append(link)
        link = link.__cause__ or link.__context__
    return chain


def first_line(exc: BaseException, limit: int = 200) -> str:
    """The first line of `exc`'s message, at most `limit` characters (SQLAlchemy's statement and
    parameters, on the lines below, stay out of logs); its class's name when it has none."""
    lines = str(exc).strip().splitlines()
    return (lines[0] if lines else type(exc).__name__)[:limit]


def error_body(
    message: str, type_: str, *, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """The OpenAI error object: `{"error": {"message", "type", "param", "code"}}`."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def status_code_name(status: int) -> str | None:
    """An HTTP status as an error `code`: 404 -> ``not_found``, 429 -> ``too_many_requests``."""
    try:
        return HTTPStatus(status).name.lower()
    except ValueError:
        return None


class MemproxyError(Exception):
    """Base of every error memproxy answers with. Subclasses fix status, type and code."""

    status_code: ClassVar[int] = 500
    error_type: ClassVar[str] = "server_error"
    default_code: ClassVar[str | None] = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code if code is not None else self.default_code

    def to_body(self) -> dict[str, Any]:
        return error_body(self.message, self.error_type, param=self.param, code=self.code)

    @property
    def headers(self) -> dict[str, str]:
        return {}


class InvalidRequest(MemproxyError):
    status_code = 400
    error_type = "invalid_request_error"


class InvalidJSON(InvalidRequest):
    default_code = "invalid_json"


class ValidationFailed(InvalidRequest):
    status_code = 422
    default_code = "invalid_value"


class BodyTooLarge(InvalidRequest):
    status_code = 413
    default_code = "body_too_large"


class RequestTimeout(InvalidRequest):
    status_code = 408
    default_code = "request_timeout"


class HeadersTooLarge(InvalidRequest):
    status_code = 431
    default_code = "headers_too_large"


class UnsupportedMediaType(InvalidRequest):
    status_code = 415
    default_code = "unsupported_media_type"


class HostNotAllowed(InvalidRequest):
    status_code = 421
    default_code = "host_not_allowed"


class AuthenticationFailed(MemproxyError):
    status_code = 401
    error_type = "authentication_error"
    default_code = "invalid_api_key"

    @property
    def headers(self) -> dict[str, str]:
        return {"WWW-Authenticate": "Bearer"}


class UserRequired(AuthenticationFailed):
    default_code = "user_required"


class PermissionDenied(MemproxyError):
    status_code = 403
    error_type = "permission_error"
    default_code = "permission_denied"


class CrossOrigin(PermissionDenied):
    default_code = "cross_origin"


class NotFound(MemproxyError):
    status_code = 404
    error_type = "not_found_error"
    default_code = "not_found"


class Conflict(MemproxyError):
    status_code = 409
    error_type = "conflict_error"
    default_code = "conflict"


class ServerBusy(MemproxyError):
    status_code = 503
    default_code = "server_busy"

    @property
    def headers(self) -> dict[str, str]:
        return {"Retry-After": "1"}


class StorageUnavailable(MemproxyError):
    """The database failed (:func:`app.storage_faults.storage_failure`): try again shortly."""

    status_code = 503
    default_code = "storage_unavailable"

    def __init__(self, message: str = STORAGE_MESSAGE) -> None:
        super().__init__(message)

    @property
    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(STORAGE_RETRY_AFTER_SECONDS)}


class ShuttingDown(MemproxyError):
    """memproxy was stopped and the answer did not end within MEMPROXY_SHUTDOWN_GRACE_SECONDS:
    a 503 when none of it was sent, else a stream's last event."""

    status_code = 503
    default_code = "shutting_down"


class UpstreamError(MemproxyError):
    status_code = 502
    error_type = "upstream_error"


class UpstreamUnreachable(UpstreamError):
    default_code = "upstream_unreachable"


class UpstreamTimeout(UpstreamError):
    status_code = 504
    default_code = "upstream_timeout"


class UpstreamStatusError(UpstreamError):
    """The upstream answered an HTTP error: relayed with its status, the body made OpenAI-shaped,
    and the `headers` the client needs to retry (``Retry-After``, rate limits)."""

    def __init__(self, status: int, body: bytes, headers: dict[str, str] | None = None):
        self.upstream_status = status
        self.body = normalise_upstream_error(status, body)
        self.retry_headers = headers or {}
        super().__init__(self.body["error"]["message"])

    def to_body(self) -> dict[str, Any]:
        return self.body

    @property
    def headers(self) -> dict[str, str]:
        return self.retry_headers


def normalise_upstream_error(status: int, body: bytes) -> dict[str, Any]:
    """Turn whatever an upstream sent with an error status into the OpenAI error shape.

    OpenAI and vLLM already send ``{"error": {...}}`` (kept, missing keys filled with null);
    Ollama sends ``{"error": "text"}``; a reverse proxy may send HTML or nothing.
    """
    try:
        parsed: Any = orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        parsed = None
    type_ = "upstream_error" if status >= 500 else "invalid_request_error"
    if isinstance(parsed, dict):
        err = parsed.get("error")
        if isinstance(err, dict):
            fixed = dict(err)
            fixed.setdefault("message", f"upstream returned HTTP {status}")
            fixed.setdefault("type", type_)
            fixed.setdefault("param", None)
            code = fixed.get("code")  # vLLM sends its status as an integer code: made a string
            fixed["code"] = code if code is None or isinstance(code, str) else str(code)
            return {**parsed, "error": fixed}
        if isinstance(err, str):
            return error_body(err, type_, code=status_code_name(status))
        if isinstance(parsed.get("detail"), str):  # FastAPI-style servers
            return error_body(parsed["detail"], type_, code=status_code_name(status))
    text = body.decode("utf-8", "replace").strip()[:500]
    message = f"upstream returned HTTP {status}" + (f": {text}" if text else "")
    return error_body(message, type_, code=status_code_name(status))


def refusal(error: MemproxyError) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """`error` answered below the routes (the HTTP protocol, an ASGI middleware), closing the
    connection so that whatever the client still sends is never read: body and headers."""
    body = orjson.dumps(error.to_body())
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
        *((name.lower().encode(), value.encode()) for name, value in error.headers.items()),
    ]
    return body, headers


async def send_refusal(send: Send, error: MemproxyError) -> None:
    """:func:`refusal` sent through ASGI."""
    body, headers = refusal(error)
    await send({"type": "http.response.start", "status": error.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": body})
