"""Logging: every line carries the request id of the request it belongs to.

The id lives in a context variable set by :class:`app.middleware.RequestIdMiddleware`; tasks
spawned while handling a request (the completion hook) copy the context, so their lines carry it
too. Lines never contain message content or keys.
"""

from __future__ import annotations

import logging
from contextvars import ContextVar

request_id_var: ContextVar[str] = ContextVar("request_id", default="-")

_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"


class RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id_var.get()
        return True


def configure_logging(level: str) -> None:
    """Give the `memproxy` loggers one handler with the request-id format (idempotent)."""
    root = logging.getLogger("memproxy")
    root.setLevel(level.upper())
    if not any(getattr(h, "_memproxy", False) for h in root.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(_FORMAT))
        handler.addFilter(RequestIdFilter())
        handler._memproxy = True  # type: ignore[attr-defined]
        root.addHandler(handler)
    root.propagate = False
