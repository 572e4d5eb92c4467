"""Logging: every line carries the request id of the request it belongs to.

The id lives in a context variable set by :class:`app.middleware.RequestIdMiddleware`; tasks
spawned while handling a request (the completion hook) copy the context, so their lines carry it
too.

Two formats (``MEMPROXY_LOG_FORMAT``): ``text``, one readable line per record, and ``json``, one
JSON object per line for log shippers, with ``time``, ``level``, ``logger``, ``request_id``,
``message`` and the record's structured fields (a record logged with ``extra={"fields": {...}}``
has them as top-level keys: the access line's ``status``, ``duration_ms``, ``user``...). In json
mode uvicorn's own lines, Python warnings (``warnings.warn``, routed through logging as the
``py.warnings`` logger in both formats) and any other library's log records (the root logger)
go through the same formatter, so every line parses.

What is never logged at INFO or above: message content, memory texts, keys. DEBUG adds the
memories injected into each chat (their texts), for diagnosing recall on a private machine.

A record is always one line, whatever a client put in it (a path with ``%0d%0a``, a user id with
C1 controls): the text format escapes control characters in everything but the traceback (see
:func:`escape_controls`), and the JSON format escapes them in strings (orjson the C0 ones,
:class:`JsonFormatter` DEL, C1 and the Unicode line separators).

What uvicorn reports as errors of the app but are ends memproxy means, or the server's own
doing, is dropped from its error logger (:class:`ServerNoise`), each said otherwise: once the
server is shutting down, a task it cancels (a request at the end of the shutdown's limit; on a
second Ctrl-C every task), which uvicorn logs as "Exception in ASGI application" with the
traceback of wherever the request waited, and Starlette as a failed shutdown, a traceback too,
for the lifespan (the access line says ``ended=shutdown`` or ``cancelled``, the lifespan
``shutdown forced``); and a body the relay left unfinished on purpose, so that the client sees
a broken answer ("ASGI callable returned without completing response": the access line says
``ended=shutdown`` or ``ended=upstream_broke_off``). The same records at any other time, or
for another route, are logged as ever.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

import orjson

from app import shutdown

request_id_var: ContextVar[str] = ContextVar("request_id", default="-")


def new_request_id() -> str:
    """A request id of memproxy's own: 128 random bits in hex, as a uuid4. It parses as a UUID,
    which some upstreams require of an X-Request-ID (llama-cpp-python's server answers 400)."""
    return os.urandom(16).hex()


_TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"
_UVICORN_LOGGERS = ("uvicorn", "uvicorn.error")
_UNFINISHED = "ASGI callable returned without completing response."


class ServerNoise(logging.Filter):
    """On uvicorn's error logger: drops a record of a cancellation, whether it comes as the
    record's exception (a request's task) or as a traceback's text (the lifespan's, which
    Starlette sends uvicorn as the message of a failed shutdown), and uvicorn's complaint about
    a body left unfinished."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.msg if isinstance(record.msg, str) else ""
        if text == _UNFINISHED:
            return not shutdown.left_unfinished()
        if not shutdown.shutting_down():
            return True
        if record.exc_info and isinstance(record.exc_info[1], asyncio.CancelledError):
            return False
        if not text.startswith("Traceback (most recent call last):"):
            return True
        last = text.rstrip().rpartition("\n")[2]
        return not last.startswith(("asyncio.exceptions.CancelledError", "CancelledError"))


class RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id_var.get()
        return True


def _control_escapes() -> dict[int, str]:
    table = {code: f"\\x{code:02x}" for code in (*range(0x20), 0x7F, *range(0x80, 0xA0))}
    table |= {0x0A: "\\n", 0x0D: "\\r", 0x2028: "\\u2028", 0x2029: "\\u2029"}
    return table


_CONTROL_ESCAPES = _control_escapes()
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_JSON_ESCAPES = {code: f"\\u{code:04x}" for code in (0x7F, *range(0x80, 0xA0), 0x2028, 0x2029)}
_JSON_RAW = re.compile("[\x7f-\x9f\u2028\u2029]")


def escape_controls(text: str) -> str:
    """`text` with every character that could end or forge a log line written as an escape:
    CR and LF as ``\\r`` and ``\\n``, other C0 and C1 controls and DEL as ``\\xNN``, the Unicode
    line and paragraph separators as ``\\u2028``/``\\u2029``. Printable text is unchanged."""
    # The search first: nearly every line has nothing to escape, and translate() copies.
    return text.translate(_CONTROL_ESCAPES) if _CONTROL.search(text) else text


class TextFormatter(logging.Formatter):
    """``_TEXT_FORMAT``, one line per record: client input in the message or any field (a path,
    a user id, an error message quoting the body) cannot start a line of its own. The exception
    traceback, appended after, is memproxy's own text and keeps its lines."""

    def __init__(self) -> None:
        super().__init__(_TEXT_FORMAT)

    def formatMessage(self, record: logging.LogRecord) -> str:
        return escape_controls(super().formatMessage(record))


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
        text = orjson.dumps(line, default=str).decode()
        # orjson escapes C0 controls only; DEL, C1 controls and U+2028/9 (which splitlines(),
        # terminals and some viewers take as line breaks) can only sit inside a string here.
        return text.translate(_JSON_ESCAPES) if _JSON_RAW.search(text) else text


def memproxy_handler() -> logging.Handler | None:
    """The handler :func:`configure_logging` gave the `memproxy` loggers, if it ran."""
    root = logging.getLogger("memproxy")
    return next((h for h in root.handlers if getattr(h, "_memproxy", False)), None)


def configure_logging(level: str, log_format: str = "text") -> None:
    """Give the `memproxy` loggers one handler in `log_format` (idempotent: a second call
    replaces the format and level). Python warnings are logged through it in both formats; in
    json mode uvicorn's loggers and the root logger use it too, so no line is raw text."""
    formatter = JsonFormatter() if log_format == "json" else TextFormatter()
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
    server_errors = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, ServerNoise) for f in server_errors.filters):
        server_errors.addFilter(ServerNoise())
    # Re-armed on every call: whoever swapped `warnings.showwarning` since (a test runner's
    # catch_warnings) would otherwise keep warnings out of the log, written raw to stderr.
    logging.captureWarnings(False)
    logging.captureWarnings(True)
    py_warnings = logging.getLogger("py.warnings")
    py_warnings.handlers = [handler]
    py_warnings.propagate = False
    # Libraries that log without a handler of their own (the embedder's, alembic's) reach the
    # root logger; with none there, Python's last-resort handler writes them raw to stderr.
    top = logging.getLogger()
    if handler in top.handlers:
        top.removeHandler(handler)
    if log_format == "json":
        top.addHandler(handler)
        for name in _UVICORN_LOGGERS:
            uvicorn_logger = logging.getLogger(name)
            uvicorn_logger.handlers = [handler]
            uvicorn_logger.propagate = False


def mask_url(url: str) -> str:
    """`url` fit for a log line, an error message or a page: the password of its user info is
    replaced by ``***``, and so is a user name that comes alone (``https://TOKEN@host``: often a
    key, not a name); so is every query value (``?key=***&api-version=***``: Google's and
    Azure's keys travel there) and the fragment. The one masking helper: every URL memproxy
    shows goes through it.

    It never fails, and it leans to hiding: a password with ``/``, ``?`` or ``#`` left
    unescaped (``user:pa/ss@host``, which SQLAlchemy reads so) is masked whole."""
    scheme, sep, rest = url.partition("://")
    if not sep:  # a bad setting may lack its scheme: the same rules for what remains
        scheme, rest = "", url
    shown = scheme + sep
    end = next((i for i, char in enumerate(rest) if char in "/?#"), len(rest))
    at = rest.rfind("@", 0, end)
    if at < 0 and (password := _unescaped_password(rest, end)) is not None:
        at = password
    if at >= 0:
        user, colon, _ = rest[:at].partition(":")
        shown += (f"{user}:***" if colon else "***") + "@"
        rest = rest[at + 1 :]
    rest, hash_sign, fragment = rest.partition("#")
    rest, question, query = rest.partition("?")
    if query:
        query = "&".join(_masked_pair(pair) for pair in query.split("&"))
    return shown + rest + question + query + hash_sign + ("***" if fragment else "")


_URL_IN_TEXT = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>`]+")
_AFTER_URL = ".,;:!?)]}"
"""Punctuation that ends a sentence or a bracket rather than the URL before it."""


def mask_urls_in(text: str) -> str:
    """`text` (free text: an error, a reason) with every URL in it (``scheme://...``: http(s),
    a database's) masked by :func:`mask_url`. For texts written before they were masked: a
    job's error stored by an older version names the Manager's URL as it was set."""

    def masked(match: re.Match[str]) -> str:
        url = match.group()
        kept = url.rstrip(_AFTER_URL)
        return mask_url(kept) + url[len(kept) :]

    return _URL_IN_TEXT.sub(masked, text) if "://" in text else text


_PORT = re.compile(r"\d*(?:[/?#]|$)")


def _unescaped_password(rest: str, end: int) -> int | None:
    """Where the user info ends in ``user:pa/ss@host`` (the `@` after the first `:`), or None
    when the text after the `:` is a port (``host:8080/v1?mail=a@b``). Digits then `/` are a
    port only when the `@` is in the query: ``user:12/ss@host`` is a password."""
    colon, at = rest.find(":"), rest.find("@")
    if rest.startswith("[") or not 0 <= colon < end or at < colon:
        return None
    query = rest.find("?")
    return None if _PORT.match(rest, colon + 1) and 0 <= query < at else at


def _masked_pair(pair: str) -> str:
    name, equals, value = pair.partition("=")
    if not equals:
        return "***" if name else name  # a bare value (`?TOKEN`) is a value
    return f"{name}={'***' if value else ''}"
