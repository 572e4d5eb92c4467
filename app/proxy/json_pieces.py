"""Parsing a large JSON body a piece at a time, so that no one call into C holds the GIL for long.

``orjson.loads`` of a 50 MB chat is one call of ~100 ms, during which no other request moves
(:mod:`app.proxy.offload`). :func:`loads` gives the same result as ``orjson.loads`` but walks
the document's outer two levels here, a value at a time (the top-level object's members, and
each element of a list or object inside it: every message of ``messages``), handing each to the
standard library's C scanner; a value too large for one call (a message holding a pasted
document or an image) is walked the same way, and a long string is checked and unescaped a
piece at a time. What is left as one call is the making of each large object itself (the
decoded text, a long string: a copy of a few milliseconds per 50 MB).

It accepts and rejects what orjson does, with the same values: NaN and Infinity are refused, an
integer outside 64 bits becomes a float, a number that overflows a double is refused, and so is
a lone UTF-16 surrogate escape (``"\\ud800"``: :class:`LoneSurrogate`, naming its place). One
difference: nesting deeper than Python's recursion allows (~900 levels, orjson reads 1024) is a
``RecursionError`` (memproxy cannot write more than 254 back in any case). Errors are
:class:`ValueError` (a :class:`json.JSONDecodeError`, :class:`UnicodeDecodeError` or
:class:`LoneSurrogate`) or :class:`RecursionError`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from app.proxy.offload import PIECE_CHARS
from app.schemas.checks import json_problem

_SPACE = re.compile(r"[ \t\n\r]*")
_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")
_MANUAL_DEPTH = 2
"""Containers this deep (the top level is 1) are walked here; a deeper one is one C call when
it is smaller than the largest of :data:`_TRIES`, else walked too."""
_TRIES = (1 << 12, 1 << 16, PIECE_CHARS)
_BODY = re.compile(r'[^"\\\x00-\x1f]*(?:\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4})[^"\\\x00-\x1f]*)*')
"""The inside of a JSON string: what may stand between its quotes."""
_HIGH = re.compile(r"\\u[dD][89abAB][0-9a-fA-F]{2}")
_scanstring: Callable[[str, int], tuple[str, int]] = json.decoder.scanstring  # type: ignore[attr-defined]


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


def _space(text: str, at: int) -> int:
    """Where the whitespace from `at` ends."""
    return _SPACE.match(text, at).end()  # type: ignore[union-attr]  # matches empty too


def _inside(text: str, at: int, limit: int) -> int:
    """Where the inside of a string from `at` ends, looking no further than `limit`."""
    return _BODY.match(text, at, limit).end()  # type: ignore[union-attr]  # matches empty too


def loads(raw: bytes) -> Any:
    """``orjson.loads(raw)``, a piece at a time (module docstring)."""
    text = _decode(raw)
    end = _space(text, 0)
    # Lone surrogates are looked for (under duplicate keys too) only when there may be one.
    surrogates = has_surrogate_escape(raw)
    value, end = _value(text, end, 1, _scan_checking if surrogates else _scan)
    end = _space(text, end)
    if end != len(text):
        raise json.JSONDecodeError("unexpected content after document", text, end)
    if surrogates and (found := json_problem(value, numbers=False)) is not None:
        raise LoneSurrogate(*found)
    return value


def _value(text: str, at: int, depth: int, scan: _Scan) -> tuple[Any, int]:
    opening = text[at : at + 1]
    if opening == '"':
        return _string(text, at)
    if opening in ("{", "[") and depth <= _MANUAL_DEPTH:
        return _container(text, at, depth, scan)
    if opening in ("{", "["):
        # One call when the value is small, found by trying bounded copies of growing size (a
        # cut container never parses); a larger one is walked here like the outer levels.
        for size in _TRIES:
            if at + size >= len(text):
                break  # the rest of the text is this small: one call below is bounded
            try:
                value, end = scan(text[at : at + size], 0)
            except (StopIteration, ValueError):
                continue
            return value, at + end
        else:
            return _container(text, at, depth, scan)
    try:
        return scan(text, at)
    except StopIteration:
        raise json.JSONDecodeError("expected a value", text, at) from None


def _container(text: str, at: int, depth: int, scan: _Scan) -> tuple[Any, int]:
    is_object = text[at] == "{"
    closing = "}" if is_object else "]"
    result: Any = {} if is_object else []
    at = _space(text, at + 1)
    if text[at : at + 1] == closing:
        return result, at + 1
    while True:
        if is_object:
            if text[at : at + 1] != '"':
                raise json.JSONDecodeError("expected a property name in double quotes", text, at)
            key, at = _string(text, at)
            at = _space(text, at)
            if text[at : at + 1] != ":":
                raise json.JSONDecodeError("expected ':' after a property name", text, at)
            at = _space(text, at + 1)
            if key in result and scan is _scan_checking:
                _refuse_lone_surrogate(result[key])
            result[key], at = _value(text, at, depth + 1, scan)
        else:
            item, at = _value(text, at, depth + 1, scan)
            result.append(item)
        at = _space(text, at)
        found = text[at : at + 1]
        if found == closing:
            return result, at + 1
        if found != ",":
            raise json.JSONDecodeError(f"expected ',' or '{closing}'", text, at)
        at = _space(text, at + 1)


def _string(text: str, at: int) -> tuple[str, int]:
    """The string whose opening quote is at `at`, and the index after its closing quote. A long
    one is checked and unescaped a piece at a time, never cutting an escape or a surrogate
    pair."""
    start = at + 1
    size = max(PIECE_CHARS, 16)  # room for an escape, or a piece could hold none
    first = _inside(text, start, start + size)
    if first < start + size and not _escape_at_cut(text, first, start + size):
        return _scanstring(text, start)  # it ends (or fails) within one piece
    parts = []
    cut = start
    while True:
        end = _inside(text, cut, cut + size)
        if end < cut + size and not _escape_at_cut(text, end, cut + size):
            if text[end : end + 1] != '"':
                raise json.JSONDecodeError(_why_not(text, end), text, end)
            parts.append(_unescape(text[cut:end]))
            return "".join(parts), end + 1
        end = _before_high_surrogate(text, cut, end)
        parts.append(_unescape(text[cut:end]))
        cut = end


def _why_not(text: str, at: int) -> str:
    if at >= len(text):
        return "Unterminated string"
    return "Invalid \\escape" if text[at] == "\\" else "Invalid control character"


def _escape_at_cut(text: str, end: int, limit: int) -> bool:
    """Whether the pattern stopped at `end` only because an escape starting there runs past
    the window's `limit`."""
    return text[end : end + 1] == "\\" and end + 6 > limit


def _before_high_surrogate(text: str, cut: int, end: int) -> int:
    """`end`, or 6 earlier when the piece ends with the first half of a surrogate pair (an
    escape: preceded by an even run of backslashes)."""
    if end - 6 <= cut or _HIGH.fullmatch(text, end - 6, end) is None:
        return end
    run = 0
    while end - 7 - run >= cut and text[end - 7 - run] == "\\":
        run += 1
    return end - 6 if run % 2 == 0 else end


def _unescape(piece: str) -> str:
    if "\\" not in piece:
        return piece  # checked by the pattern: no quote, no control character
    value, _ = _scanstring('"' + piece + '"', 1)
    return value


def _decode(raw: bytes, size: int = PIECE_CHARS) -> str:
    """`raw` as UTF-8 (strict), decoded `size` bytes at a time; a piece never ends inside a
    character."""
    if raw.startswith(b"\xef\xbb\xbf"):
        raise json.JSONDecodeError("UTF-8 byte order mark (BOM) is not supported", "", 0)
    parts = []
    start = 0
    while start < len(raw):
        end = min(start + size, len(raw))
        for _ in range(3):  # a continuation byte: the character began before the cut
            if end < len(raw) and raw[end] & 0xC0 == 0x80:
                end += 1
        try:
            parts.append(raw[start:end].decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise UnicodeDecodeError(
                "utf-8", raw, start + exc.start, start + exc.end, exc.reason
            ) from None
        start = end
    return "".join(parts)


def has_surrogate_escape(raw: bytes) -> bool:
    """True when `raw` holds a ``\\uD800``-``\\uDFFF`` escape (a pair, or a lone half): searched
    a window at a time, windows overlapping by more than an escape."""
    for start in range(0, len(raw), PIECE_CHARS):
        if _SURROGATE.search(raw, start, start + PIECE_CHARS + 8) is not None:
            return True
    return False
