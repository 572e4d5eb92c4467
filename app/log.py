"""Logging: every line carries the request id of the request it belongs to.

The id lives in a context variable set by :class:`app.middleware.RequestIdMiddleware`; tasks
spawned while handling a request (the completion hook) copy the context, so their lines carry it
too.

Two formats (``MEMPROXY_LOG_FORMAT``): ``text``, one readable line per record, and ``json``, one
JSON object per line for log shippers, with ``time``, ``level``, ``logger``, ``request_id``,
``message`` and the record's structured fields (a record logged with ``extra={"fields": {...}}``
has them as top-level keys: the access line's ``status``, ``duration_ms``, ``user``...). In json
mode uvicorn's own lines go through the same formatter, so every line parses.

What is never logged at INFO or above: message content, memory texts, keys. DEBUG adds the
memories injected into each chat (their texts), for diagnosing recall on a private machine.
"""

from __future__ import annotations

import logging
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

import orjson

request_id_var: ContextVar[str] = ContextVar("request_id", default="-")

_TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"
_UVICORN_LOGGERS = ("uvicorn", "uvicorn.error")


class RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id_var.get()
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per record (see the module docstring for its keys)."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "request_id": getattr(record, "request_id", "-"),
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            line.update(fields)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(line, default=str).decode()


def memproxy_handler() -> logging.Handler | None:
    """The handler :func:`configure_logging` gave the `memproxy` loggers, if it ran."""
    root = logging.getLogger("memproxy")
    return next((h for h in root.handlers if getattr(h, "_memproxy", False)), None)


def configure_logging(level: str, log_format: str = "text") -> None:
    """Give the `memproxy` loggers one handler in `log_format` (idempotent: a second call
    replaces the format and level). In json mode uvicorn's loggers use it too."""
    formatter = JsonFormatter() if log_format == "json" else logging.Formatter(_TEXT_FORMAT)
    root = logging.getLogger("memproxy")
    root.setLevel(level.upper())
    handler = memproxy_handler()
    if handler is None:
        handler = logging.StreamHandler()
        handler.addFilter(RequestIdFilter())
        handler._memproxy = True  # type: ignore[attr-defined]
        root.addHandler(handler)
    handler.setFormatter(formatter)
    root.propagate = False
    if log_format == "json":
        for name in _UVICORN_LOGGERS:
            uvicorn_logger = logging.getLogger(name)
            uvicorn_logger.handlers = [handler]
            uvicorn_logger.propagate = False
