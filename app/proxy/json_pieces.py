"""Parsing a large JSON body a piece at a time, so that no one call into C holds the GIL for long.

``orjson.loads`` of a 50 MB chat is one call of ~100 ms, during which no other request moves
(:mod:`app.proxy.offload`). :func:`loads` gives the same result as ``orjson.loads`` but walks
the document's outer two levels here, over its bytes, a value at a time (the top-level object's
members, and each element of a list or object inside it: every message of ``messages``),
decoding each and handing it to the standard library's C scanner; a value too large for one
call (a message holding a pasted document or an image) is walked the same way, and a long
string is checked, decoded and unescaped a piece at a time. The body is never decoded whole:
the one large object made in one call is each long string itself (its join, a copy of a few
tens of milliseconds per 50 MB, most of it the fresh memory's page faults).

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
from typing import Any

from app.proxy.offload import PIECE_CHARS
from app.schemas.checks import json_problem

_SPACE = re.compile(rb"[ \t\n\r]*")
_TOKEN = re.compile(rb"[-+.0-9a-zA-Z]*")
"""What a number, ``true``, ``false`` or ``null`` (or a refused ``NaN``) may be made of."""
_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")
_MANUAL_DEPTH = 2
"""Containers this deep (the top level is 1) are walked here; a deeper one is one C call when
it is smaller than the largest of :data:`_TRIES`, else walked too."""
_TRIES = (1 << 12, 1 << 16, PIECE_CHARS)
_BODY = re.compile(rb'[^"\\\x00-\x1f]*(?:\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4})[^"\\\x00-\x1f]*)*')
"""The inside of a JSON string: what may stand between its quotes."""
_HIGH = re.compile(rb"\\u[dD][89abAB][0-9a-fA-F]{2}")
_scanstring: Callable[[str, int], tuple[str, int]] = json.decoder.scanstring  # type: ignore[attr-defined]


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


class _BadJSON(json.JSONDecodeError):
    """A :class:`json.JSONDecodeError` at a byte of the body: its line and column are counted
    a window at a time (one count over 50 MB would hold the GIL for milliseconds)."""

    def __init__(self, why: str, raw: bytes, at: int) -> None:
        at = min(at, len(raw))
        lines = sum(
            raw.count(b"\n", s, min(s + PIECE_CHARS, at)) for s in range(0, at, PIECE_CHARS)
        )
        line_start = 0
        for stop in range(at, 0, -PIECE_CHARS):
            found = raw.rfind(b"\n", max(stop - PIECE_CHARS, 0), stop)
            if found >= 0:
                line_start = found + 1
                break
        ValueError.__init__(
            self, f"{why}: line {lines + 1} column {at - line_start + 1} (byte {at})"
        )
        self.msg, self.doc, self.pos = why, "", at
        self.lineno, self.colno = lines + 1, at - line_start + 1


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


def _space(raw: bytes, at: int) -> int:
    """Where the whitespace from `at` ends."""
    return _SPACE.match(raw, at).end()  # type: ignore[union-attr]  # matches empty too


def _inside(raw: bytes, at: int, limit: int) -> int:
    """Where the inside of a string from `at` ends, looking no further than `limit`."""
    return _BODY.match(raw, at, limit).end()  # type: ignore[union-attr]  # matches empty too


def loads(raw: bytes) -> Any:
    """``orjson.loads(raw)``, a piece at a time (module docstring)."""
    return loads_with_spans(raw)[0]


def loads_with_spans(raw: bytes) -> tuple[Any, Spans]:
    """``orjson.loads(raw)`` and, when it is an object, where each member's value lies."""
    if raw.startswith(b"\xef\xbb\xbf"):
        raise _BadJSON("UTF-8 byte order mark (BOM) is not supported", raw, 0)
    spans: Spans = {}
    end = _space(raw, 0)
    # Lone surrogates are looked for (under duplicate keys too) only when there may be one.
    surrogates = has_surrogate_escape(raw)
    value, end = _value(raw, end, 1, _scan_checking if surrogates else _scan, members=spans)
    end = _space(raw, end)
    if end != len(raw):
        raise _BadJSON("unexpected content after document", raw, end)
    if surrogates and (found := json_problem(value, numbers=False)) is not None:
        raise LoneSurrogate(*found)
    return value, spans


def _value(
    raw: bytes,
    at: int,
    depth: int,
    scan: _Scan,
    members: Spans | None = None,
    items: list[tuple[int, int]] | None = None,
) -> tuple[Any, int]:
    """The value at `at` and the byte after it; `members` (an object's) or `items` (a list's)
    are given where each of its own values lies (:class:`Span`)."""
    opening = raw[at : at + 1]
    if opening == b'"':
        return _string(raw, at)
    if opening in (b"{", b"[") and depth <= _MANUAL_DEPTH:
        return _container(raw, at, depth, scan, members, items)
    if opening in (b"{", b"["):
        # One call when the value is small, found by trying bounded pieces of growing size (a
        # cut container never parses); a larger one is walked here like the outer levels.
        for size in _TRIES:
            if at + size >= len(raw):
                break  # the rest of the body is this small: one call below is bounded
            try:
                return _scanned(raw, at, _boundary(raw, at + size), scan)
            except (StopIteration, ValueError):
                continue
        else:
            return _container(raw, at, depth, scan)
        try:
            return _scanned(raw, at, len(raw), scan)
        except StopIteration:
            raise _BadJSON("expected a value", raw, at) from None
    end = _TOKEN.match(raw, at).end()  # type: ignore[union-attr]  # matches empty too
    if end == at:
        raise _BadJSON("expected a value", raw, at)
    try:
        return _scanned(raw, at, end, scan)
    except StopIteration:
        raise _BadJSON("expected a value", raw, at) from None


def _scanned(raw: bytes, at: int, end: int, scan: _Scan) -> tuple[Any, int]:
    """The value that begins at `at`, scanned in ``raw[at:end]`` (decoded), and the byte after
    it."""
    text = _decoded(raw, at, end)
    value, stop = scan(text, 0)
    return value, at + (stop if text.isascii() else len(text[:stop].encode()))


def _decoded(raw: bytes, start: int, end: int) -> str:
    """``raw[start:end]`` as UTF-8 (strict); an error names its place in the whole body."""
    try:
        return raw[start:end].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UnicodeDecodeError(
            "utf-8", raw, start + exc.start, start + exc.end, exc.reason
        ) from None


def _boundary(raw: bytes, at: int) -> int:
    """`at`, or the start of the UTF-8 character it falls inside."""
    for _ in range(3):
        if at < len(raw) and raw[at] & 0xC0 == 0x80:
            at -= 1
    return at


def _container(
    raw: bytes,
    at: int,
    depth: int,
    scan: _Scan,
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
                raise _BadJSON("expected a property name in double quotes", raw, at)
            key, at = _string(raw, at)
            at = _space(raw, at)
            if raw[at : at + 1] != b":":
                raise _BadJSON("expected ':' after a property name", raw, at)
            at = _space(raw, at + 1)
            if key in result and scan is _scan_checking:
                _refuse_lone_surrogate(result[key])
            start = at
            inner: list[tuple[int, int]] | None = (
                [] if members is not None and raw[at : at + 1] == b"[" else None
            )
            result[key], at = _value(raw, at, depth + 1, scan, items=inner)
            if members is not None:
                members[key] = Span(start, at, inner)
        else:
            start = at
            item, at = _value(raw, at, depth + 1, scan)
            result.append(item)
            if items is not None:
                items.append((start, at))
        at = _space(raw, at)
        found = raw[at : at + 1]
        if found == closing:
            return result, at + 1
        if found != b",":
            raise _BadJSON(f"expected ',' or '{closing.decode()}'", raw, at)
        at = _space(raw, at + 1)


def _string(raw: bytes, at: int) -> tuple[str, int]:
    """The string whose opening quote is at `at`, and the byte after its closing quote. A long
    one is checked, decoded and unescaped a piece at a time, never cutting an escape, a
    surrogate pair or a UTF-8 character; its pieces are joined once."""
    start = at + 1
    size = max(PIECE_CHARS, 16)  # room for an escape, or a piece could hold none
    parts = []
    cut = start
    while True:
        end = _inside(raw, cut, cut + size)
        if end < cut + size and not _escape_at_cut(raw, end, cut + size):
            if raw[end : end + 1] != b'"':
                raise _BadJSON(_why_not(raw, end), raw, end)
            parts.append(_unescape(raw, cut, end))
            return (parts[0] if len(parts) == 1 else "".join(parts)), end + 1
        end = _boundary(raw, _before_high_surrogate(raw, cut, end))
        parts.append(_unescape(raw, cut, end))
        cut = end


def _why_not(raw: bytes, at: int) -> str:
    if at >= len(raw):
        return "Unterminated string"
    return "Invalid \\escape" if raw[at] == ord("\\") else "Invalid control character"


def _escape_at_cut(raw: bytes, end: int, limit: int) -> bool:
    """Whether the pattern stopped at `end` only because an escape starting there runs past
    the window's `limit`."""
    return raw[end : end + 1] == b"\\" and end + 6 > limit


def _before_high_surrogate(raw: bytes, cut: int, end: int) -> int:
    """`end`, or 6 earlier when the piece ends with the first half of a surrogate pair (an
    escape: preceded by an even run of backslashes)."""
    if end - 6 <= cut or _HIGH.fullmatch(raw, end - 6, end) is None:
        return end
    run = 0
    while end - 7 - run >= cut and raw[end - 7 - run] == ord("\\"):
        run += 1
    return end - 6 if run % 2 == 0 else end


def _unescape(raw: bytes, start: int, end: int) -> str:
    """The inside of a string, ``raw[start:end]`` (checked by the pattern: no quote, no control
    character, whole escapes), decoded and unescaped."""
    piece = _decoded(raw, start, end)
    if "\\" not in piece:
        return piece
    value, _ = _scanstring('"' + piece + '"', 1)
    return value


def has_surrogate_escape(raw: bytes) -> bool:
    """True when `raw` holds a ``\\uD800``-``\\uDFFF`` escape (a pair, or a lone half): searched
    a window at a time, windows overlapping by more than an escape."""
    for start in range(0, len(raw), PIECE_CHARS):
        if _SURROGATE.search(raw, start, start + PIECE_CHARS + 8) is not None:
            return True
    return False
