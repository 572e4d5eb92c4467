"""Keeping one big request from stalling every other one on the event loop.

A chat body of tens of megabytes costs hundreds of milliseconds of CPU to parse, check, convert
and write back. Done on the event loop, that time is taken from every other request (a probe
of ``/healthz`` waited seconds). So the heavy steps of a body larger than
:data:`LARGE_BODY_BYTES` run in a worker thread (:func:`off_loop`), and each step is cut into
pieces (:func:`pieces`) so that no single call into C (which keeps the GIL throughout) runs for
long: between two pieces the loop gets the GIL back. Small bodies keep the direct path: a thread
hop costs ~0.1 ms, several times what parsing a typical chat does.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Iterator, Sequence
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

LARGE_BODY_BYTES = 256 * 1024
"""Bodies larger than this are handled off the event loop."""
PIECE_CHARS = 1 << 20
"""The most characters (or bytes) one call into C is given at a time (about a millisecond)."""
PIECE_ITEMS = 1000
"""The most messages one call into pydantic or orjson is given at a time."""


def is_large(size: int) -> bool:
    return size > LARGE_BODY_BYTES


async def off_loop(size: int, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """`fn(*args, **kwargs)`: in a worker thread when `size` (the body's bytes) is large, else
    right here. The caller's context variables (the request id in log lines) go along."""
    if not is_large(size):
        return fn(*args, **kwargs)
    return await asyncio.to_thread(fn, *args, **kwargs)


def pieces(items: Sequence[T], size: int = PIECE_ITEMS) -> Iterator[tuple[int, Sequence[T]]]:
    """(offset, slice) of `items` in slices of at most `size`."""
    for start in range(0, len(items), size):
        yield start, items[start : start + size]


_SPACE = re.compile(r"\s")  # the same characters as str.isspace() and str.split()


def text_pieces(text: str, size: int = PIECE_CHARS) -> Iterator[str]:
    """`text` cut into consecutive pieces of about `size` characters, each cut just before a
    whitespace character, so that no word (of `str.split` or of the regex `\\w+`) is split."""
    start = 0
    while len(text) - start > size:
        cut = start + size
        found = None
        while found is None and cut < len(text):
            found = _SPACE.search(text, cut, cut + size)  # a bounded search: one piece at most
            cut += size
        if found is None:
            break
        yield text[start : found.start()]
        start = found.start()
    yield text[start:]
