"""Recall marks written by several processes at once over the same memories: every mark counted,
no batch lost to a deadlock (on PostgreSQL two batches that locked the same rows in their own
orders deadlocked; SQLite writes one batch at a time)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from sqlalchemy import select

from app.memory.store.db import create_engine, upgrade
from app.memory.store.memories import MemoryStore
from app.memory.store.records import NewMemory
from app.memory.store.tables import Memory
from tests import databases


async def test_two_processes_marking_the_same_memories_in_opposite_orders_lose_nothing(
    tmp_path: Path,
) -> None:
    url = databases.url_in(tmp_path, "marks.db")
    engines = [create_engine(url) for _ in range(2)]
    await upgrade(engines[0])
    stores = [MemoryStore(engine) for engine in engines]
    try:
        written = await stores[0].add("ann", [NewMemory(content=f"fact {i}") for i in range(60)])
        keys = [record.key for record in written.records]
        low, high = keys[:30], keys[30:]
        rounds = 15

        async def marks(n: int) -> None:
            # One batch of two groups (recalled once, recalled twice), updated group by group:
            # store 0 reaches the low keys first, store 1 the high ones.
            first, second = (low, high) if n == 0 else (high, low)
            for _ in range(rounds):
                await asyncio.gather(
                    stores[n].mark_recalled("ann", first),
                    stores[n].mark_recalled("ann", second),
                    stores[n].mark_recalled("ann", second),
                )

        await asyncio.gather(marks(0), marks(1))
        async with stores[1].sessions() as session:
            counts = list(await session.scalars(
                select(Memory.recall_count).where(Memory.key.in_(keys))
            ))  # fmt: skip
    finally:
        for engine in engines:
            await engine.dispose()
    assert counts == [3 * rounds] * len(keys)  # once by one store, twice by the other
