"""A user's index read in a worker thread under its lock (app/memory/search/beside.py): a large
index's vector scan beside BM25 on the loop, both at once and ranking as one after the other;
never a lock let go while the thread still reads the index, cancelled or not."""

from __future__ import annotations

import asyncio
import gc
import os
import threading
from typing import Any

import faiss
import numpy as np
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from app.memory.search import ranking as ranking_module
from app.memory.search import restating
from app.memory.search import upkeep as upkeep_module
from app.memory.search.beside import beside, in_thread
from app.memory.search.bm25_scores import Scores
from app.memory.search.dense import VectorIndex, configure_threads
from app.memory.search.ivf import build_ivf
from app.memory.store.records import NewMemory
from tests.memory.search.test_recall_index import ranking, sentences, service


async def test_the_scan_and_the_loops_part_run_at_once() -> None:
    loop_thread = threading.get_ident()
    scanning, scored = threading.Event(), threading.Event()
    where: dict[str, int] = {}

    def scan() -> str:  # one after the other, either way round, one of these waits in vain
        where["scan"] = threading.get_ident()
        scanning.set()
        assert scored.wait(5), "the loop's part never ran while the scan did"
        return "dense"

    def score() -> str:
        where["score"] = threading.get_ident()
        assert scanning.wait(5), "the scan never ran while the loop's part did"
        scored.set()
        return "bm25"

    assert await beside(scan, score) == ("dense", "bm25")
    assert where["score"] == loop_thread != where["scan"]


async def test_scans_and_the_ivfs_training_use_the_configured_faiss_threads(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OpenMP keeps its thread count per thread: a worker thread running FAISS sets it (one
    left to itself gets every core), on the scans' own threads and in the index's upkeep."""
    configure_threads(1)
    if (os.cpu_count() or 1) > 1:  # what the setting is there for
        assert await asyncio.to_thread(faiss.omp_get_max_threads) > 1
    where, _ = await beside(
        lambda: (faiss.omp_get_max_threads(), threading.current_thread().name), lambda: None
    )
    assert where[0] == 1 and where[1].startswith("index-scan")

    trained: list[int] = []

    def training(*args: Any) -> Any:
        trained.append(faiss.omp_get_max_threads())
        return build_ivf(*args)

    snapshot = VectorIndex.snapshot

    def snapshot_leaving_every_core(self: VectorIndex) -> Any:
        try:
            return snapshot(self)
        finally:  # the pool's thread left as a thread of its own would be
            faiss.omp_set_num_threads(max(2, os.cpu_count() or 1))

    monkeypatch.setattr(upkeep_module, "build_ivf", training)
    monkeypatch.setattr(VectorIndex, "snapshot", snapshot_leaving_every_core)
    memory = service(engine, ivf_min_vectors=300)
    await memory.add("ann", [NewMemory(t) for t in sentences(400)])
    entry = await memory.cache.get("ann")
    await memory.cache.settled()
    assert entry.vectors.approximate and trained == [1]


async def test_a_scan_failing_after_its_caller_was_cancelled_is_not_left_unretrieved() -> None:
    loop = asyncio.get_running_loop()
    unretrieved: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: unretrieved.append(context))
    release, started = threading.Event(), threading.Event()

    def failing_scan() -> None:
        started.set()
        release.wait(5)
        raise RuntimeError("faiss")

    task = asyncio.ensure_future(beside(failing_scan, lambda: None))
    assert await asyncio.to_thread(started.wait, 5)
    task.cancel()
    await asyncio.sleep(0.02)
    release.set()
    await asyncio.wait({task})
    assert task.cancelled()
    del task  # (it and its traceback hold the scan's future)
    gc.collect()
    await asyncio.sleep(0)
    loop.set_exception_handler(None)
    assert unretrieved == []


async def _cancelled_mid_read(read: Any, times: int) -> tuple[list[str], tuple[Any, ...]]:
    """`read(work)` under a lock, cancelled `times` (with a message) while `work` blocks in
    its thread: the lock is still held each time; what happened, in order, and the message."""
    lock = asyncio.Lock()
    release, started = threading.Event(), threading.Event()
    order: list[str] = []
    message: list[tuple[Any, ...]] = []

    def work() -> None:
        started.set()
        release.wait(5)
        order.append("thread done")

    async def search() -> None:
        try:
            async with lock:
                await read(work)
        except asyncio.CancelledError as exc:
            message.append(exc.args)
            order.append("lock released")
            raise

    task = asyncio.ensure_future(search())
    assert await asyncio.to_thread(started.wait, 5)
    for _ in range(times):
        task.cancel("the client left")
        await asyncio.sleep(0.05)
        assert not task.done() and lock.locked()  # the thread still reads: the lock is kept
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    return order, message[0]


@pytest.mark.parametrize("times", [1, 2])
@pytest.mark.parametrize("way", ["beside", "in_thread"])
async def test_cancelled_it_ends_only_after_the_thread_and_holds_the_lock_till_then(
    times: int, way: str
) -> None:
    async def read(work: Any) -> None:
        if way == "beside":
            await beside(work, lambda: None)
        else:
            await in_thread(work)

    order, message = await _cancelled_mid_read(read, times)
    assert order == ["thread done", "lock released"]
    assert message == ("the client left",)


async def test_either_sides_error_is_raised_once_the_thread_is_done() -> None:
    loop = asyncio.get_running_loop()
    unretrieved: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: unretrieved.append(context))
    release = threading.Event()
    done: list[str] = []

    def failing_slow_scan() -> str:
        release.wait(5)
        done.append("scan")
        raise RuntimeError("faiss")

    def failing_score() -> None:
        loop.call_later(0.05, release.set)
        raise ValueError("bm25")

    with pytest.raises(ValueError, match="bm25"):  # the loop's own failure, after the scan's end
        await beside(failing_slow_scan, failing_score)
    assert done == ["scan"]

    def failing_scan() -> None:
        raise RuntimeError("faiss")

    with pytest.raises(RuntimeError, match="faiss"):
        await beside(failing_scan, lambda: "bm25")
    gc.collect()
    await asyncio.sleep(0)
    assert unretrieved == []  # the scan's failure was not left unretrieved
    loop.set_exception_handler(None)


async def test_a_large_index_ranks_the_same_with_bm25_beside_its_scan(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    memory = service(engine)
    await memory.add("ann", [NewMemory(t) for t in sentences(300)])
    queries = ["violin and garden", "kayak camping trip", "coffee", "nothing at all here"]
    inline = await ranking(memory, "ann", queries)

    loop_thread = threading.get_ident()
    calls: list[tuple[int, int]] = []

    async def spied(scan: Any, on_loop: Any) -> Any:
        where: dict[str, int] = {}

        def scanning() -> Any:
            where["scan"] = threading.get_ident()
            return scan()

        def scoring() -> Any:
            where["score"] = threading.get_ident()
            return on_loop()

        found = await beside(scanning, scoring)
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


@pytest.mark.parametrize("reader", ["search", "restatements"])
async def test_a_search_cancelled_mid_read_keeps_the_users_index_locked_till_the_thread_ends(
    reader: str, engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write this process makes meanwhile is not applied in place (the index is locked), so
    the thread never reads an index being changed."""
    memory = service(engine)
    records = (await memory.add("ann", [NewMemory(t) for t in sentences(60)])).records
    await memory.search("ann", "warm up", limit=1, min_score=0)
    entry = memory.cache.cached("ann")
    assert entry is not None
    release, started = threading.Event(), threading.Event()

    def blocked(original: Any) -> Any:
        def reading(*args: Any, **kwargs: Any) -> Any:
            if threading.current_thread() is not threading.main_thread():
                started.set()
                release.wait(5)
            return original(*args, **kwargs)

        return reading

    if reader == "search":
        monkeypatch.setattr(ranking_module, "OFFLOAD_ABOVE", 0)
        monkeypatch.setattr(VectorIndex, "search", blocked(VectorIndex.search))
        task = asyncio.ensure_future(memory.search("ann", "violin", limit=5, min_score=0))
    else:
        monkeypatch.setattr(restating, "_checks", blocked(restating._checks))
        task = asyncio.ensure_future(memory.restatements("ann", [records[0].id]))
    assert await asyncio.to_thread(started.wait, 5)
    task.cancel()
    await asyncio.sleep(0.05)
    assert entry.lock.locked() and not task.done()
    version = entry.version
    await memory.add("ann", [NewMemory("a memory written while the index is read")])
    assert entry.version == version  # not applied in place: the next search catches up
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not entry.lock.locked()
    found = await memory.search("ann", "memory written while the index", limit=1, min_score=0)
    assert found[0].memory.content == "a memory written while the index is read"
