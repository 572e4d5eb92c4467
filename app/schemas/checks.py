"""JSON values memproxy can store and write back, and the place in a request where one is not.

Python's JSON parser (FastAPI reads the memory API's bodies with it) accepts what memproxy
cannot keep: a lone surrogate from a ``"\\ud800"`` escape (not Unicode: neither SQLite nor
orjson can encode it), integers of any size (orjson, the export and most clients stop at 64
bits), ``NaN``/``Infinity`` (not JSON), and nesting as deep as the parser's recursion allows
(orjson writes at most 254 levels, pydantic fewer). Each is answered with a 4xx naming the
place (``metadata.a[3]``, ``messages[0].content``) instead of failing later with a 500.
"""

from __future__ import annotations

import json
import math
from typing import Any

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
WRITABLE_DEPTH = 254
"""Deepest nesting orjson writes (memproxy writes a chat body anew to inject memories: all of a
small one, the parts it changed of a large one: :mod:`app.proxy.json_splice`)."""


def lone_surrogate(text: str) -> str | None:
    """Why `text` is not valid Unicode (a lone surrogate, and where), or None when it is."""
    if text.isascii():  # the common case, without encoding a copy
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(text[exc.start])
        return (
            f"contains a lone surrogate (\\u{code:04x}) at character {exc.start}, "
            "which is not valid Unicode"
        )
    return None


def shown(path: str) -> str:
    """`path` safe to put in a message or a log: surrogates and control characters escaped,
    long keys cut (a path is built from the client's own keys)."""
    text = path.encode("utf-8", "backslashreplace").decode("utf-8")
    text = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in text)
    return text if len(text) <= 120 else text[:117] + "..."


def _step(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def json_problem(
    value: Any, path: str = "", *, max_depth: int | None = None, numbers: bool = True
) -> tuple[str, str] | None:
    """The first place in `value` (a parsed JSON value whose own place is `path`) that cannot be
    stored, as ``(path, reason)`` (the path made safe to show by :func:`shown`); None when all of
    it can.

    Checked: strings and keys are valid Unicode; with `max_depth`, containers nest at most that
    deep (`value` itself is level 1); with `numbers`, integers fit in 64 bits (signed) and
    floats are finite. Iterative: a deep value cannot exhaust the stack.
    """
    stack: list[tuple[Any, str, int]] = [(value, path, 1)]
    while stack:
        item, where, depth = stack.pop()
        if isinstance(item, dict | list):
            if max_depth is not None and depth > max_depth:
                return shown(where), f"is nested deeper than {max_depth} levels"
            pairs = list(item.items()) if isinstance(item, dict) else list(enumerate(item))
            for key, child in reversed(pairs):  # reversed onto the stack: the first comes first
                if isinstance(key, str) and (why := lone_surrogate(key)) is not None:
                    return shown(_step(where, key)), f"is a key that {why}"
                stack.append((child, _step(where, key), depth + 1))
        elif isinstance(item, str):
            if (why := lone_surrogate(item)) is not None:
                return shown(where), why
        elif isinstance(item, bool) or not numbers:
            continue
        elif isinstance(item, int) and not INT64_MIN <= item <= INT64_MAX:
            return shown(where), "is an integer outside the 64-bit range (-2^63 to 2^63-1)"
        elif isinstance(item, float) and not math.isfinite(item):
            return shown(where), f"is {item!r}, which is not a JSON number"
    return None


def lone_surrogate_in(raw: bytes | str) -> tuple[str, str] | None:
    """Where a JSON text that a strict parser refused holds a lone surrogate, as
    :func:`json_problem` says it; None when that is not why (or it is no JSON at all).

    Only on that error path: Python's parser, which accepts lone surrogates, reads it again.
    """
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    return json_problem(value, numbers=False)
