"""Parsing a large JSON body a piece at a time, so that no one call into C holds the GIL for long.

``orjson.loads`` of a 50 MB chat is one call of ~100 ms, during which no other request moves
(:mod:`app.proxy.offload`). :func:`loads` gives the same result as ``orjson.loads`` but walks
the document's outer two levels here, over its bytes, a value at a time (the top-level object's
members, and each element of a list or object inside it: every message of ``messages``),
decoding each and handing it to the standard library's C scanner; a value too large for one
call (a message holding a pasted document or an image) is walked the same way, and a long
string is checked, decoded and unescaped a piece at a time (:mod:`app.proxy.json_strings`). The
body is never decoded whole: the one large object made in one call is each long string itself
(its join, a copy of a few tens of milliseconds per 50 MB, most of it the fresh memory's page
faults), and not even that for data the caller never reads (an image's: ``elide``).

:func:`loads_with_spans` also says where each member of the top-level object, and each element
of a list there (every message), lies in the body: :mod:`app.proxy.json_splice` writes the
parts memproxy did not change as the client's own bytes.

It accepts and rejects what orjson does, with the same values: NaN and Infinity are refused, an
integer outside 64 bits becomes a float, a number that overflows a double is refused, and so is
a lone UTF-16 surrogate escape (``"\\ud800"``: :class:`LoneSurrogate`, naming its place). One
difference: nesting deeper than Python's recursion allows (~900 levels, orjson reads 1024) is a
``RecursionError`` (memproxy cannot write more than 254 back in any case). Errors are
:class:`ValueError` (a :class:`json.JSONDecodeError` whose position is a byte's,
:class:`UnicodeDecodeError` or :class:`LoneSurrogate`) or :class:`RecursionError`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from app.proxy.json_strings import (
    BadJSON,
    LoneInElided,
    boundary,
    decoded,
    has_surrogate_escape,
    string,
)
from app.proxy.offload import PIECE_CHARS
from app.schemas.checks import json_problem

_SPACE = re.compile(rb"[ \t\n\r]*")
_TOKEN = re.compile(rb"[-+.0-9a-zA-Z]*")
"""What a number, ``true``, ``false`` or ``null`` (or a refused ``NaN``) may be made of."""
_MANUAL_DEPTH = 2
"""Containers this deep (the top level is 1) are walked here; a deeper one is one C call when
it is smaller than the largest of :data:`_TRIES`, else walked too."""
_TRIES = (1 << 12, 1 << 16, PIECE_CHARS)


@dataclass(frozen=True, slots=True)
class Span:
    """Where a value lies in the body: ``raw[start:end]``; `items` are its elements' spans
    when it is a list, else None."""

    start: int
    end: int
    items: list[tuple[int, int]] | None = None


Spans = dict[str, Span]
"""The top-level object's members by key (a repeated key: its last value's place)."""


def _int(text: str) -> int | float:
    value = int(text)
    if -(1 << 63) <= value < (1 << 64):
        return value
    return _float(text)  # orjson reads integers outside the 64-bit range as floats


def _float(text: str) -> float:
    value = float(text)  # a string never overflows: it becomes infinity
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"number is infinity when parsed as double: {text[:40]}")
    return value


def _constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


class LoneSurrogate(ValueError):
    """A lone UTF-16 surrogate escape (``"\\ud800"``), which orjson refuses too; `where` names
    its place in the document (``messages[0].content``), `why` says what is wrong there."""

    def __init__(self, where: str, why: str) -> None:
        super().__init__(f"{where} {why}")
        self.where = where


def _refuse_lone_surrogate(value: Any) -> None:
    if json_problem(value, numbers=False) is not None:
        raise ValueError("lone surrogate in a value that a later duplicate key replaced")


def _checked_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object whose duplicate keys' earlier values are checked for lone surrogates: orjson
    refuses those too, and the later value would otherwise hide them from the caller."""
    result = dict(pairs)
    if len(result) != len(pairs):
        for key, value in pairs:
            if result[key] is not value:
                _refuse_lone_surrogate(value)
    return result


_Scan = Callable[[str, int], tuple[Any, int]]
_options: dict[str, Any] = {"parse_int": _int, "parse_float": _float, "parse_constant": _constant}
_scan: _Scan = json.JSONDecoder(**_options).scan_once  # type: ignore[attr-defined]
_scan_checking: _Scan = json.JSONDecoder(  # type: ignore[attr-defined]
    **_options, object_pairs_hook=_checked_pairs
).scan_once


class _How(NamedTuple):
    scan: _Scan
    """The C scanner for a small container (checking duplicate keys' values, or not)."""
    elide: frozenset[str]
    """Keys whose long string values are left in the body (:class:`Elided`)."""


def _space(raw: bytes, at: int) -> int:
    """Where the whitespace from `at` ends."""
    return _run(_SPACE, raw, at)


def _run(pattern: re.Pattern[bytes], raw: bytes, at: int) -> int:
    """Where `pattern` (a run of a class of bytes) from `at` ends, matched a piece at a time
    (50 MB of spaces would be one call of ~85 ms)."""
    while True:
        limit = at + PIECE_CHARS
        end = pattern.match(raw, at, limit).end()  # type: ignore[union-attr]  # matches empty
        if end < limit or limit >= len(raw):
            return end
        at = end


def loads(raw: bytes) -> Any:
    """``orjson.loads(raw)``, a piece at a time (module docstring)."""
    return loads_with_spans(raw)[0]


def loads_with_spans(raw: bytes, elide: frozenset[str] = frozenset()) -> tuple[Any, Spans]:
    """``orjson.loads(raw)`` and, when it is an object, where each member's value lies; a
    string of a piece or more under one of the keys `elide` (anywhere in the body) is an
    :class:`~app.proxy.json_strings.Elided` standing for it, checked as orjson would but not
    made (its value is a stand-in: see that class)."""
    if raw.startswith(b"\xef\xbb\xbf"):
        raise BadJSON("UTF-8 byte order mark (BOM) is not supported", raw, 0)
    spans: Spans = {}
    end = _space(raw, 0)
    # Lone surrogates are looked for (under duplicate keys too) only when there may be one.
    surrogates = has_surrogate_escape(raw)
    how = _How(_scan_checking if surrogates else _scan, elide)
    try:
        value, end = _value(raw, end, 1, how, members=spans)
    except LoneInElided:
        # Read again with every string made, to name the place (rare: base64 has no escapes).
        return loads_with_spans(raw)
    end = _space(raw, end)
    if end != len(raw):
        raise BadJSON("unexpected content after document", raw, end)
    if surrogates and (found := json_problem(value, numbers=False)) is not None:
        raise LoneSurrogate(*found)
    return value, spans


def _value(
    raw: bytes,
    at: int,
    depth: int,
    how: _How,
    members: Spans | None = None,
    items: list[tuple[int, int]] | None = None,
) -> tuple[Any, int]:
    """The value at `at` and the byte after it; `members` (an object's) or `items` (a list's)
    are given where each of its own values lies (:class:`Span`)."""
    opening = raw[at : at + 1]
    if opening == b'"':
        return string(raw, at)
    if opening in (b"{", b"[") and depth <= _MANUAL_DEPTH:
        return _container(raw, at, depth, how, members, items)
    if opening in (b"{", b"["):
        # One call when the value is small, found by trying bounded pieces of growing size (a
        # cut container never parses); a larger one is walked here like the outer levels.
        for size in _TRIES:
            if at + size >= len(raw):
                break  # the rest of the body is this small: one call below is bounded
            try:
                return _scanned(raw, at, boundary(raw, at + size), how.scan)
            except (StopIteration, ValueError):
                continue
        else:
            return _container(raw, at, depth, how)
        try:
            return _scanned(raw, at, len(raw), how.scan)
        except StopIteration:
            raise BadJSON("expected a value", raw, at) from None
    end = _run(_TOKEN, raw, at)
    if end == at:
        raise BadJSON("expected a value", raw, at)
    try:
        return _scanned(raw, at, end, how.scan)
    except StopIteration:
        raise BadJSON("expected a value", raw, at) from None


def _scanned(raw: bytes, at: int, end: int, scan: _Scan) -> tuple[Any, int]:
    """The value that begins at `at`, scanned in ``raw[at:end]`` (decoded), and the byte after
    it."""
    text = decoded(raw, at, end)
    value, stop = scan(text, 0)
    return value, at + (stop if text.isascii() else len(text[:stop].encode()))


def _container(
    raw: bytes,
    at: int,
    depth: int,
    how: _How,
    members: Spans | None = None,
    items: list[tuple[int, int]] | None = None,
) -> tuple[Any, int]:
    is_object = raw[at] == ord("{")
    closing = b"}" if is_object else b"]"
    result: Any = {} if is_object else []
    at = _space(raw, at + 1)
    if raw[at : at + 1] == closing:
        return result, at + 1
    while True:
        if is_object:
            if raw[at : at + 1] != b'"':
                raise BadJSON("expected a property name in double quotes", raw, at)
            key, at = string(raw, at)
            at = _space(raw, at)
            if raw[at : at + 1] != b":":
                raise BadJSON("expected ':' after a property name", raw, at)
            at = _space(raw, at + 1)
            if key in result and how.scan is _scan_checking:
                _refuse_lone_surrogate(result[key])
            start = at
            inner: list[tuple[int, int]] | None = (
                [] if members is not None and raw[at : at + 1] == b"[" else None
            )
            if key in how.elide and raw[at : at + 1] == b'"':
                result[key], at = string(raw, at, keep=False)
            else:
                result[key], at = _value(raw, at, depth + 1, how, items=inner)
            if members is not None:
                members[key] = Span(start, at, inner)
        else:
            start = at
            item, at = _value(raw, at, depth + 1, how)
            result.append(item)
            if items is not None:
                items.append((start, at))
        at = _space(raw, at)
        found = raw[at : at + 1]
        if found == closing:
            return result, at + 1
        if found != b",":
            raise BadJSON(f"expected ',' or '{closing.decode()}'", raw, at)
        at = _space(raw, at + 1)
