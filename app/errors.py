"""Every error memproxy answers with, and the one handler that turns them into OpenAI's shape.

Exception tree (each class fixes its HTTP status, `type` and default `code`)::

    MemproxyError                      500 server_error
    ├── InvalidRequest                 400 invalid_request_error
    │   ├── InvalidJSON                400   code=invalid_json
    │   ├── ValidationFailed           422   code=invalid_value (param names the field)
    │   ├── BodyTooLarge               413   code=body_too_large
    │   ├── RequestTimeout             408   code=request_timeout (headers or body stalled)
    │   └── HeadersTooLarge            431   code=headers_too_large
    ├── AuthenticationFailed           401 authentication_error  code=invalid_api_key
    │   └── UserRequired               401   code=user_required
    ├── PermissionDenied               403 permission_error
    ├── NotFound                       404 not_found_error
    ├── Conflict                       409 conflict_error
    ├── ServerBusy                     503 server_error  code=server_busy (MEMPROXY_MAX_CONNECTIONS)
    └── UpstreamError                  502 upstream_error
        ├── UpstreamUnreachable        502   code=upstream_unreachable
        ├── UpstreamTimeout            504   code=upstream_timeout
        └── UpstreamStatusError        the upstream's own status, its error body normalised

Every response body is ``{"error": {"message", "type", "param", "code"}}``, its ``code`` a string
or null (as OpenAI's SDKs expect; an upstream's integer code is turned into a string); nothing
reaches the client as a bare 500 traceback: unexpected exceptions are logged and answered in the
same shape.
"""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any, ClassVar

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.types import Send

from app.schemas.checks import shown

logger = logging.getLogger("memproxy.errors")


def causes(exc: BaseException) -> list[BaseException]:
    """`exc` and what caused it, outermost first (``__cause__``, else ``__context__``): the
    error a library raises often wraps the one that says what went wrong."""
    chain: list[BaseException] = []
    link: BaseException | None = exc
    while link is not None and link not in chain:
        chain.append(link)
        link = link.__cause__ or link.__context__
    return chain


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


def json_response(
    status: int, body: dict[str, Any], headers: dict[str, str] | None = None
) -> Response:
    return Response(orjson.dumps(body), status, headers=headers, media_type="application/json")


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


def install_error_handlers(app: FastAPI) -> None:
    """Route every failure through one OpenAI-shaped response."""

    async def on_memproxy_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, MemproxyError)
        status = exc.upstream_status if isinstance(exc, UpstreamStatusError) else exc.status_code
        if status >= 500:
            logger.warning("%s: %s", type(exc).__name__, exc.message)
        return json_response(status, exc.to_body(), exc.headers)

    async def on_http_exception(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        type_ = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        message = exc.detail if isinstance(exc.detail, str) else "request failed"
        if exc.status_code == 404:
            message = f"no route for {request.method} {request.url.path}"
        body = error_body(message, type_, code=status_code_name(exc.status_code))
        return json_response(exc.status_code, body, dict(exc.headers or {}))

    async def on_validation_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        first = exc.errors()[0] if exc.errors() else {"msg": "invalid request", "loc": ()}
        if first.get("type") == "json_invalid":  # as the chat route answers a broken body
            return json_response(400, InvalidJSON("request body is not valid JSON").to_body())
        # The location holds the client's own keys (an unknown field): made safe to echo.
        param = shown(".".join(str(p) for p in first.get("loc", ()) if p != "body")) or None
        message = str(first["msg"]).removeprefix("Value error, ")
        if first.get("type") == "string_unicode":  # pydantic's words name no cause
            name = first.get("input")
            if param is None and isinstance(name, str):  # the name of a field is the bad string
                param = shown(name)
            message = f"{param or 'value'} must be valid Unicode (not a lone surrogate: \\ud800)"
        body = error_body(message, "invalid_request_error", param=param, code="invalid_value")
        return json_response(422, body)

    async def on_unexpected(request: Request, exc: Exception) -> Response:
        logger.exception("unhandled error on %s %s", request.method, request.url.path)
        return json_response(500, error_body("internal error in memproxy", "server_error"))

    app.add_exception_handler(MemproxyError, on_memproxy_error)
    app.add_exception_handler(StarletteHTTPException, on_http_exception)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(Exception, on_unexpected)
