"""Writing a large body back as JSON, the parts memproxy left alone copied from the client's bytes.

A large chat is almost all what the client sent: memproxy changes its system message (the
memory block) and nothing else. ``orjson.dumps`` of the whole body writes 50 MB in one call,
holding the GIL ~30 ms (more on a busy machine) while every other request waits
(:mod:`app.proxy.offload`). :func:`splice` writes only what changed: each member of the
top-level object, and each element of a list there (every message), that is the very object
parsed from the body (identity, not equality) is a slice of the body's bytes, where
:func:`~app.proxy.json_pieces.loads_with_spans` found it; consecutive ones are one slice, the
client's commas and spaces between them kept. The rest goes through ``orjson.dumps``. The
pieces are never joined here: the transport writes them as they are
(:class:`~app.proxy.transport.Pieces`; a join of views would hold the GIL while it copies).

So the upstream receives the same JSON values as ``orjson.dumps`` would write, the untouched
ones in the client's own spelling (its escapes, spaces and number forms). A long string the
parser left in the body (:class:`~app.proxy.json_strings.Elided`: an image's data) is written
as the client's bytes too, wherever it is, in a part written anew as well. This holds as long as
a change to the body is made on copies, never in place (as :mod:`app.memory.block` does): an
object changed in place would be sent as the client wrote it.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import orjson

from app.proxy.json_pieces import Span, Spans
from app.proxy.json_strings import Elided
from app.proxy.transport import Piece


def splice(
    data: dict[str, Any], client_body: dict[str, Any], raw: bytes, spans: Spans
) -> list[Piece]:
    """The pieces of `data` as JSON (`client_body` as memproxy changed it; `client_body` parsed
    from `raw`, its members found at `spans`); ``orjson.JSONEncodeError`` as ``orjson.dumps``
    raises it for a part that is written anew."""
    view = memoryview(raw)
    out: list[Piece] = [b"{"]
    for key, value in data.items():
        if len(out) > 1:
            out.append(b",")
        out += [orjson.dumps(key), b":"]
        span = spans.get(key)
        before = client_body.get(key, _MISSING)
        if span is not None and value is before:
            out.append(view[span.start : span.end])
        elif span is not None and span.items is not None and isinstance(value, list):
            out += _list(value, before, view, span)
        else:
            out.append(_written(value, view))
    out.append(b"}")
    return out


def _written(value: Any, view: memoryview) -> bytes:
    """``orjson.dumps(value)``, an elided string in it written as the client's bytes."""
    return orjson.dumps(
        value, default=partial(_restored, view), option=orjson.OPT_PASSTHROUGH_SUBCLASS
    )


def _restored(view: memoryview, value: Any) -> Any:
    """What orjson writes for a subclass of a JSON type (the option above hands them here):
    an elided string's JSON, as the client sent it; any other as its base type."""
    if isinstance(value, Elided):
        return orjson.Fragment(bytes(view[value.start : value.end]))
    bases: tuple[type[Any], ...] = (str, int, float, dict, list)
    base = next((b for b in bases if isinstance(value, b)), None)
    if base is None:
        raise TypeError(f"{type(value).__name__} is not JSON")
    return str.__str__(value) if base is str else base(value)


_MISSING = object()


def _list(value: list[Any], before: list[Any], view: memoryview, span: Span) -> list[Piece]:
    """The pieces of `value`, a list that replaced `before` (the client's, found at `span`)."""
    assert span.items is not None and len(span.items) == len(before)
    where = {id(item): index for index, item in enumerate(before)}
    out: list[Piece] = [b"["]
    run: tuple[int, int] | None = None  # the client's elements [first, last] copied as one

    def flush() -> None:
        if run is not None:
            out.append(view[span.items[run[0]][0] : span.items[run[1]][1]])  # type: ignore[index]

    for item in value:
        index = where.get(id(item))  # the client's list holds it: an id is that object's
        if index is not None and run is not None and index == run[1] + 1:
            run = (run[0], index)
            continue
        flush()
        if len(out) > 1:
            out.append(b",")
        if index is not None:
            run = (index, index)
        else:
            run = None
            out.append(_written(item, view))
    flush()
    out.append(b"]")
    return out
