"""Two parts of a search at once: a large index's vector scan in a worker thread (FAISS lets go
of the GIL while it scans) and its BM25 scoring on the event loop, neither needing the other.

At 1,000,000 vectors the scan is ~7 ms and BM25's scoring of the question ~2 ms: one after the
other they were ~9 ms of each search, side by side the longer of the two (docs/performance.md).

The thread reads the user's index, which the caller's lock guards; so the call returns, or
raises, only once the thread is done, also when the caller is cancelled meanwhile: the lock is
never let go while a scan still reads what a write would change.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

A = TypeVar("A")
B = TypeVar("B")


async def beside(in_thread: Callable[[], A], on_loop: Callable[[], B]) -> tuple[A, B]:
    """`in_thread()` in a worker thread while `on_loop()` runs here: both results (an exception
    of either raised). Ends only after `in_thread` has; cancelled meanwhile, it waits for that,
    then raises :class:`asyncio.CancelledError`."""
    work = asyncio.get_running_loop().run_in_executor(None, in_thread)
    try:
        here = on_loop()
    except BaseException:
        await _outlast(work)
        raise
    await _outlast(work)
    return work.result(), here


async def _outlast(work: asyncio.Future[A]) -> None:
    """Wait until `work` is done, however often this task is cancelled meanwhile (nothing
    cancels `work` itself: its thread would run on regardless); then re-raise a cancellation."""
    cancelled = False
    while not work.done():
        try:
            await asyncio.wait({work})
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
