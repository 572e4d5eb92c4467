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
import contextvars
import functools
import gc
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ParamSpec, TypeVar

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


_LANE = ThreadPoolExecutor(max_workers=1, thread_name_prefix="memproxy-large")
"""The one thread the heavy steps of large bodies take turns on. Two threads running Python at
once leave the event loop starved: the GIL goes to whichever waiting thread the system wakes,
and with three wanting it the loop waited 38-47 ms at a time (a 50 MB chat's turns converted
for its job while its body was written back; bench/loop_stall.py). With one, no other large
body's work competes with the loop for the GIL, which it gets at every switch interval (5 ms)
while the lane runs (the Manager's own steps still run in threads of their own). The work is
the GIL's anyway: two threads of it would not finish sooner. A step waits for those queued
before it: a bound on a request's own time must not count that wait (`WriteBound.aside`)."""


async def off_loop(size: int, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """`fn(*args, **kwargs)`: on the large bodies' worker thread (:data:`_LANE`, in turn with
    the other large bodies' steps) when `size` (the body's bytes) is large, else right here.
    The caller's context variables (the request id in log lines) go along."""
    if not is_large(size):
        return fn(*args, **kwargs)
    return await in_lane(fn, *args, **kwargs)


async def in_lane(fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """`fn(*args, **kwargs)` on the large bodies' worker thread (:data:`_LANE`), with the
    caller's context variables: for Python-heavy work that must not run beside another such."""
    call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
    return await asyncio.get_running_loop().run_in_executor(_LANE, call)


def pieces(items: Sequence[T], size: int = PIECE_ITEMS) -> Iterator[tuple[int, Sequence[T]]]:
    """(offset, slice) of `items` in slices of at most `size`."""
    for start in range(0, len(items), size):
        yield start, items[start : start + size]


def empty(items: list[Any], size: int = PIECE_ITEMS) -> None:
    """Clear `items` from the end, `size` at a time: the loop gets the GIL between two slices
    while their objects are freed (run it in a worker thread)."""
    while items:
        del items[-size:]


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


def find(text: str, sub: str, start: int = 0, end: int | None = None) -> int:
    """``text.find(sub, start, end)`` (`start` >= 0), searched :data:`PIECE_CHARS` at a time:
    one ``str.find`` over 50 MB holds the GIL ~40 ms when `sub` is not there (measured)."""
    end = len(text) if end is None else min(end, len(text))
    if end - start <= PIECE_CHARS or not sub:
        return text.find(sub, start, end)
    overlap = len(sub) - 1  # a match across a cut lies whole in the window before it
    for at in range(start, end, PIECE_CHARS):
        found = text.find(sub, at, min(at + PIECE_CHARS + overlap, end))
        if found >= 0:
            return found
    return -1


def rfind(text: str, sub: str, start: int = 0, end: int | None = None) -> int:
    """``text.rfind(sub, start, end)`` (`start` >= 0), searched :data:`PIECE_CHARS` at a time
    from the end (:func:`find`)."""
    end = len(text) if end is None else min(end, len(text))
    if end - start <= PIECE_CHARS or not sub:
        return text.rfind(sub, start, end)
    overlap = len(sub) - 1
    for stop in range(end, start, -PIECE_CHARS):
        found = text.rfind(sub, max(stop - PIECE_CHARS - overlap, start), stop)
        if found >= 0:
            return found
    return -1


class CollectorPause:
    """The cyclic garbage collector held off while a large body's objects are alive.

    A 100,000-message chat is ~600,000 objects (validated messages, PydanticAI history, turns),
    and every full collection walks all of them with the GIL held: ~90-450 ms during which no
    other request moves. Reference counting frees them all when the request lets them go, so
    the collector has nothing to find in them; it is paused from when the body is parsed until
    the request has dropped them (:meth:`release`), and at most :data:`PAUSE_SECONDS`. Pauses
    nest: the collector runs again when the last one ends (unless it was off before the
    first). Cyclic garbage made meanwhile by other requests waits until then.
    """

    _held = 0
    _was_enabled = True
    _since = 0.0
    _lock = threading.Lock()

    def __init__(self) -> None:
        self._released = False
        with CollectorPause._lock:
            if CollectorPause._held == 0:
                CollectorPause._was_enabled = gc.isenabled()
                CollectorPause._since = time.monotonic()
                gc.disable()
            CollectorPause._held += 1

    @classmethod
    def paused_for(cls) -> float:
        """How long the collector has been held off without a break (0 when it is not)."""
        with cls._lock:
            return time.monotonic() - cls._since if cls._held else 0.0

    def release(self) -> None:
        """End this pause; later calls do nothing."""
        with CollectorPause._lock:
            if self._released:
                return
            self._released = True
            CollectorPause._held -= 1
            if CollectorPause._held == 0 and CollectorPause._was_enabled:
                gc.enable()


PAUSE_SECONDS = 60.0
"""The longest a :class:`CollectorPause` lasts when its request never releases it."""


def pause_collector(size: int) -> CollectorPause | None:
    """A :class:`CollectorPause` for a large body (released after :data:`PAUSE_SECONDS` at the
    latest), or None for a small one, or when the collector has been held off that long
    already: overlapping large bodies (one a minute would do) must not keep it off for good,
    and cyclic garbage of every request with it."""
    if not is_large(size) or CollectorPause.paused_for() > PAUSE_SECONDS:
        return None
    pause = CollectorPause()
    asyncio.get_running_loop().call_later(PAUSE_SECONDS, pause.release)
    return pause
