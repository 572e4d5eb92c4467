"""Indexes of users who stopped searching are dropped after MEMPROXY_INDEX_IDLE_SECONDS and the
memory given back to the system (app/memory/search/heap.py); the next search builds again."""

from __future__ import annotations

import platform
from types import SimpleNamespace

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from app.memory.search import cache as cache_module
from app.memory.search import heap
from app.memory.search.heap import give_back
from app.memory.service import MemoryService
from app.memory.store.memories import MemoryStore
from app.memory.store.records import NewMemory
from tests.fakes import FakeEmbedder
from tests.memory.search.test_recall_index import ranking, sentences


async def test_an_idle_users_index_is_dropped_and_its_memory_given_back(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [1000.0]
    monkeypatch.setattr(cache_module, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    trims: list[int] = []
    monkeypatch.setattr(cache_module, "give_back", lambda: trims.append(1))
    memory = MemoryService(
        MemoryStore(engine),
        FakeEmbedder(),  # type: ignore[arg-type]
        idle_seconds=60,
    )
    for user in ("ann", "bob"):
        await memory.add(user, [NewMemory(t) for t in sentences(40)])
    before = await ranking(memory, "ann", ["cello", "kayak"])
    clock[0] = 1040.0
    await ranking(memory, "bob", ["cello"])
    assert memory.cache.cached("ann") is not None  # 40 s: not idle yet
    clock[0] = 1070.0
    await ranking(memory, "bob", ["cello"])  # ann: 70 s without a search
    async with (await memory.cache.get("bob")).lock:  # one in use is never dropped
        clock[0] = 1200.0
        assert memory.cache.sweep(1130.0) == 1  # what the cache's sweeper does every 30 s
    await memory.cache.settled()
    assert memory.cache.cached("ann") is None and memory.cache.cached("bob") is not None
    assert memory.cache._sweeper is not None  # started by the first search
    assert trims == [1]
    loads = memory.cache.loads
    assert await ranking(memory, "ann", ["cello", "kayak"]) == before
    assert memory.cache.loads == loads + 1
    await memory.cache.close()  # its sweeper stopped
    assert memory.cache._sweeper is not None and memory.cache._sweeper.cancelled()


async def test_without_an_idle_time_indexes_stay(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [1000.0]
    monkeypatch.setattr(cache_module, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    memory = MemoryService(MemoryStore(engine), FakeEmbedder())  # type: ignore[arg-type]
    await memory.add("ann", [NewMemory(t) for t in sentences(10)])
    await ranking(memory, "ann", ["cello"])
    clock[0] = 1_000_000.0
    await ranking(memory, "bob", ["cello"])
    assert memory.cache.cached("ann") is not None and memory.cache._sweeper is None


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_on_glibc_memory_is_given_back_with_malloc_trim() -> None:
    assert heap._MALLOC_TRIM is not None
    give_back()
