"""The strings of a large JSON body, read from its bytes a piece at a time (for
:mod:`app.proxy.json_pieces`).

A long string is checked (the characters JSON allows, whole escapes, strict UTF-8), decoded and
unescaped a piece of :data:`~app.proxy.offload.PIECE_CHARS` bytes at a time, never cutting an
escape, a surrogate pair or a UTF-8 character, so that no one call into C holds the GIL for long;
only the joining of its pieces is one call (the string itself: a fresh 50 MB, ~30 ms here, most
of it page faults). A string that memproxy never reads (an image's data URI) need not be made at
all: read with ``keep=False`` it is checked the same way and stays in the body's bytes
(:class:`Elided`), for :mod:`app.proxy.json_splice` to write as the client sent it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from app.proxy.offload import PIECE_CHARS

_BODY = re.compile(rb'[^"\\\x00-\x1f]*(?:\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4})[^"\\\x00-\x1f]*)*')
"""The inside of a JSON string: what may stand between its quotes."""
_HIGH = re.compile(rb"\\u[dD][89abAB][0-9a-fA-F]{2}")
_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")
_scanstring: Callable[[str, int], tuple[str, int]] = json.decoder.scanstring  # type: ignore[attr-defined]


class BadJSON(json.JSONDecodeError):
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


def decoded(raw: bytes, start: int, end: int) -> str:
    """``raw[start:end]`` as UTF-8 (strict); an error names its place in the whole body."""
    try:
        return raw[start:end].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UnicodeDecodeError(
            "utf-8", raw, start + exc.start, start + exc.end, exc.reason
        ) from None


def boundary(raw: bytes, at: int) -> int:
    """`at`, or the start of the UTF-8 character it falls inside."""
    for _ in range(3):
        if at < len(raw) and raw[at] & 0xC0 == 0x80:
            at -= 1
    return at


def _inside(raw: bytes, at: int, limit: int) -> int:
    """Where the inside of a string from `at` ends, looking no further than `limit`."""
    return _BODY.match(raw, at, limit).end()  # type: ignore[union-attr]  # matches empty too


def string(raw: bytes, at: int, *, keep: bool = True) -> tuple[str, int]:
    """The string whose opening quote is at `at`, and the byte after its closing quote. A long
    one is checked, decoded and unescaped a piece at a time, never cutting an escape, a
    surrogate pair or a UTF-8 character; its pieces are joined once. Unless `keep`, a string
    of a piece or more is checked the same way but not made: it is an :class:`Elided`."""
    start = at + 1
    size = max(PIECE_CHARS, 16)  # room for an escape, or a piece could hold none
    parts = []
    cut = start
    while True:
        end = _inside(raw, cut, cut + size)
        if end < cut + size and not _escape_at_cut(raw, end, cut + size):
            if raw[end : end + 1] != b'"':
                raise BadJSON(_why_not(raw, end), raw, end)
            if keep or cut == start:
                parts.append(_unescape(raw, cut, end))
                return (parts[0] if len(parts) == 1 else "".join(parts)), end + 1
            _check(raw, cut, end)
            return Elided(raw, at, end + 1), end + 1
        end = boundary(raw, _before_high_surrogate(raw, cut, end))
        if keep:
            parts.append(_unescape(raw, cut, end))
        else:
            _check(raw, cut, end)
        cut = end


class Elided(str):
    """A long string left in the body: ``raw[start:end]`` is its JSON (quotes included). Its
    own text is a stand-in: what the value says before its data when it is a data URI
    (``data:image/png;base64,``), else nothing. Only :mod:`app.proxy.json_splice` writes it,
    as the client's bytes; a reader of the value sees the stand-in."""

    start: int
    end: int

    def __new__(cls, raw: bytes, start: int, end: int) -> Elided:
        head = raw[start + 1 : min(start + 1 + _HEAD_BYTES, end - 1)]
        marker = head.find(b";base64,") if head.startswith(b"data:") else -1
        stand_in = head[: marker + len(b";base64,")] if marker >= 0 else b""
        # checked with the rest (string()): whole escapes (a client may write "image\/png")
        self = super().__new__(cls, _unescape(stand_in, 0, len(stand_in)))
        self.start, self.end = start, end
        return self

    def __copy__(self) -> Elided:
        return self  # immutable, as a str

    def __deepcopy__(self, memo: object) -> Elided:
        return self


_HEAD_BYTES = 256
"""How much of an elided string is looked at for its data URI's head."""
_LONE = re.compile("[\ud800-\udfff]")


def _check(raw: bytes, start: int, end: int) -> None:
    """A piece of an elided string checked as :func:`_unescape` would read it: valid UTF-8,
    valid escapes, and no lone surrogate (orjson refuses one; the caller's check of the parsed
    body cannot see it)."""
    text = decoded(raw, start, end)
    if "\\" in text and _LONE.search(_unescaped(text)) is not None:  # none without an escape
        raise LoneInElided("a lone surrogate escape in a long string")


class LoneInElided(ValueError):
    """A lone surrogate escape in a string being elided, whose place in the document the
    parser does not keep (:func:`~app.proxy.json_pieces.loads_with_spans` reads the body again,
    every string made, to name it)."""


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
    return _unescaped(decoded(raw, start, end))


def _unescaped(piece: str) -> str:
    """`piece`, the inside of a string already decoded, with its escapes read."""
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
