"""The one handler that turns every failure into OpenAI's shape (:mod:`app.errors` holds the
exception tree and the body).

- a :class:`~app.errors.MemproxyError` is answered with its status, body and headers;
- Starlette's HTTP errors (a route not found, a method not allowed) and FastAPI's validation
  errors are answered in the same shape (422 ``invalid_value`` naming the field);
- the database failing (:func:`app.storage_faults.storage_failure`: down, restarting, full,
  read-only) is a 503 ``storage_unavailable`` with ``Retry-After``, logged in one line;
- anything else is a bug of memproxy's: logged with its traceback and answered 500
  ``server_error``, never as a bare traceback.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from sqlalchemy.exc import SQLAlchemyError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from app.errors import (
    InvalidJSON,
    MemproxyError,
    StorageUnavailable,
    UpstreamStatusError,
    error_body,
    first_line,
    status_code_name,
)
from app.schemas.checks import shown
from app.storage_faults import storage_failure

logger = logging.getLogger("memproxy.errors")


def json_response(
    status: int, body: dict[str, Any], headers: dict[str, str] | None = None
) -> Response:
    return Response(orjson.dumps(body), status, headers=headers, media_type="application/json")


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
        if storage_failure(exc):  # the database's fault, not memproxy's: passes, say so
            logger.warning(
                "database failed on %s %s: %s: %s",
                request.method,
                request.url.path,
                type(exc).__name__,
                first_line(exc, 300),
            )
            error = StorageUnavailable()
            return json_response(error.status_code, error.to_body(), error.headers)
        logger.exception("unhandled error on %s %s", request.method, request.url.path)
        return json_response(500, error_body("internal error in memproxy", "server_error"))

    app.add_exception_handler(MemproxyError, on_memproxy_error)
    app.add_exception_handler(StarletteHTTPException, on_http_exception)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(Exception, on_unexpected)
    # Also below the catch-all (which re-raises to the server after answering): an error of the
    # database's, or an OSError or SQLAlchemy error of memproxy's own, is answered and done with,
    # as a MemproxyError is.
    app.add_exception_handler(SQLAlchemyError, on_unexpected)
    app.add_exception_handler(OSError, on_unexpected)
