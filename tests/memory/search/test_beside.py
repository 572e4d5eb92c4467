"""A large index's vector scan in a thread beside BM25 on the loop (app/memory/search/beside.py):
both at once, the same ranking as one after the other, and never a lock let go while the
thread still reads the index."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import numpy as np
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from app.memory.search import ranking as ranking_module
from app.memory.search.beside import beside
from app.memory.search.bm25_scores import Scores
from app.memory.store.records import NewMemory
from tests.memory.search.test_recall_index import ranking, sentences, service


async def test_the_threads_call_and_the_loops_run_at_once() -> None:
    loop_thread = threading.get_ident()
    scoring = threading.Event()
    where: dict[str, int] = {}

    def scan() -> str:
        where["scan"] = threading.get_ident()
        assert scoring.wait(5), "the loop's part never ran while the scan did"
        return "dense"

    def score() -> str:
        where["score"] = threading.get_ident()
        scoring.set()
        return "bm25"

    assert await beside(scan, score) == ("dense", "bm25")
    assert where["score"] == loop_thread != where["scan"]


@pytest.mark.parametrize("times", [1, 2])
async def test_cancelled_it_ends_only_after_the_thread_and_holds_the_lock_till_then(
    times: int,
) -> None:
    lock = asyncio.Lock()
    release, started = threading.Event(), threading.Event()
    order: list[str] = []

    def scan() -> None:
        started.set()
        release.wait(5)
        order.append("scan done")

    async def search() -> None:
        async with lock:
            await beside(scan, lambda: None)
        order.append("lock released")

    task = asyncio.ensure_future(search())
    assert await asyncio.to_thread(started.wait, 5)
    for _ in range(times):
        task.cancel()
        await asyncio.sleep(0.05)
        assert not task.done() and lock.locked()  # the scan still reads: the lock is kept
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert order == ["scan done"] and not lock.locked()


async def test_either_sides_error_is_raised_once_the_thread_is_done() -> None:
    release = threading.Event()
    done: list[str] = []

    def slow() -> str:
        release.wait(5)
        done.append("scan")
        return "dense"

    def failing_score() -> None:
        asyncio.get_running_loop().call_later(0.05, release.set)
        raise ValueError("bm25")

    with pytest.raises(ValueError, match="bm25"):
        await beside(slow, failing_score)
    assert done == ["scan"]

    def failing_scan() -> None:
        raise RuntimeError("faiss")

    with pytest.raises(RuntimeError, match="faiss"):
        await beside(failing_scan, lambda: "bm25")


async def test_a_large_index_ranks_the_same_with_bm25_beside_its_scan(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    memory = service(engine)
    await memory.add("ann", [NewMemory(t) for t in sentences(300)])
    queries = ["violin and garden", "kayak camping trip", "coffee", "nothing at all here"]
    inline = await ranking(memory, "ann", queries)

    loop_thread = threading.get_ident()
    calls: list[tuple[int, int]] = []

    async def spied(in_thread: Any, on_loop: Any) -> Any:
        where: dict[str, int] = {}

        def scan() -> Any:
            where["scan"] = threading.get_ident()
            return in_thread()

        def score() -> Any:
            where["score"] = threading.get_ident()
            return on_loop()

        found = await beside(scan, score)
        calls.append((where["scan"], where["score"]))
        assert isinstance(found[0][0], np.ndarray) and isinstance(found[1], Scores)
        return found

    monkeypatch.setattr(ranking_module, "beside", spied)
    assert await ranking(memory, "ann", queries) == inline  # below the size: inline
    assert calls == []
    monkeypatch.setattr(ranking_module, "OFFLOAD_ABOVE", 0)  # every index "large"
    assert await ranking(memory, "ann", queries) == inline
    assert len(calls) == len(queries)
    assert all(scan != loop_thread == score for scan, score in calls)
