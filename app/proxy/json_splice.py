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
ones in the client's own spelling (its escapes, spaces and number forms). This holds as long as
a change to the body is made on copies, never in place (as :mod:`app.memory.block` does): an
object changed in place would be sent as the client wrote it.
"""

from __future__ import annotations

from typing import Any

import orjson

from app.proxy.json_pieces import Span, Spans
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
            out.append(orjson.dumps(value))
    out.append(b"}")
    return out


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
            out.append(orjson.dumps(item))
    flush()
    out.append(b"]")
    return out
