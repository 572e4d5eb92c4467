"""Reading a user's index in a worker thread while the caller holds the index's lock, so that
the event loop goes on meanwhile: a large index's vector scan, with its BM25 scoring on the loop
at the same time (:func:`beside`), or a long check of its memories (:func:`in_thread`).

At 1,000,000 vectors the scan is ~7 ms and BM25's scoring of the question ~2 ms: one after the
other they were ~9 ms of each search, side by side the longer of the two (FAISS lets go of the
GIL while it scans; docs/performance.md).

The lock guards what the thread reads, so these return, or raise, only once the thread's call
has ended, also when the caller is cancelled meanwhile (the cancellation is raised then): the
lock is never let go while a thread still reads what a write would change. (A cancelled
``await asyncio.to_thread(...)`` lets go at once, its thread running on.)

The scans run on threads of their own (:data:`SCANS`, one a core), their FAISS calls on the
configured OpenMP threads (:func:`~app.memory.search.dense.on_faiss_threads`): a scan never
waits behind an index image or an IVF's training in the default pool, and never starts a team
of spinning threads on the cores the chats need.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from app.memory.search.cores import usable_cores
from app.memory.search.dense import on_faiss_threads

A = TypeVar("A")
B = TypeVar("B")

SCANS = ThreadPoolExecutor(max_workers=usable_cores(), thread_name_prefix="index-scan")
"""The threads large indexes are scanned on (its threads start at the first scan)."""


async def beside(scan: Callable[[], A], on_loop: Callable[[], B]) -> tuple[A, B]:
    """`scan()` on :data:`SCANS` while `on_loop()` runs here: both results (the loop's failure
    raised before the scan's). Ends only after `scan` has (the module docstring)."""
    work = asyncio.get_running_loop().run_in_executor(SCANS, on_faiss_threads, scan)
    try:
        here = on_loop()
    except BaseException:
        try:
            await finished(work)
        except asyncio.CancelledError:
            raise
        except BaseException:  # the scan's own failure: the loop's is the one raised
            pass
        raise
    return await finished(work), here


async def in_thread(call: Callable[[], A]) -> A:
    """`call()` in a worker thread of the loop's pool: its result. Ends only after `call` has
    (the module docstring)."""
    return await finished(asyncio.get_running_loop().run_in_executor(None, call))


async def finished(work: asyncio.Future[A]) -> A:
    """`work`'s result once it is done, however often this task is cancelled meanwhile (nothing
    cancels `work` itself: its thread would run on regardless); then the last cancellation
    received, if any, is raised instead (its message kept), `work`'s failure retrieved."""
    cancelled: asyncio.CancelledError | None = None
    while not work.done():
        try:
            await asyncio.wait({work})
        except asyncio.CancelledError as exc:
            cancelled = exc
    if cancelled is not None:
        work.exception()  # retrieved: not logged as "never retrieved" when it failed
        raise cancelled
    return work.result()
