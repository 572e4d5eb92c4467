"""Every write to memories is one unit of work (app/memory/store/unit.py): one transaction, an
event per change with the unit's actor and job, the user's version bumped once when anything
changed and never otherwise, every row written stamped with it."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.memory.store.memories import MemoryStore
from app.memory.store.records import NewMemory
from app.memory.store.tables import Memory, MemorySource


async def seqs(store: MemoryStore) -> dict[str, int]:
    """Each of ann's memories' ``seq``: the version of the write that last wrote it."""
    async with store.sessions() as session:
        query = select(Memory.id, Memory.seq).where(Memory.user_id == "ann")
        return {memory_id: seq for memory_id, seq in await session.execute(query)}


@pytest.fixture
def store(engine: AsyncEngine) -> MemoryStore:
    return MemoryStore(engine)


def row(memory_id: str, content: str) -> Memory:
    stamp = datetime.now(UTC)
    return Memory(
        id=memory_id, user_id="ann", content=content, type="fact", meta={},
        source=MemorySource.MANAGER.value, pinned=False, created_at=stamp, updated_at=stamp,
        recall_count=0,
    )  # fmt: skip


async def test_many_changes_bump_once_and_each_leaves_an_event(store: MemoryStore) -> None:
    written = await store.add(
        "ann", [NewMemory(content="likes tea", id="m1"), NewMemory(content="runs", id="m2")]
    )
    start = await store.version("ann")
    async with store.writing("ann", MemorySource.MANAGER, job_id="job-7") as w:
        rows = await w.rows(["m1", "m2", "nobody's"])
        assert set(rows) == {"m1", "m2"}
        rows["m1"].content = "likes green tea"
        w.update(rows["m1"], before="likes tea")
        await w.delete(rows["m2"])
        w.create(row("m3", "lives in Porto"), detail="because")
    assert w.version == start + 1 == await store.version("ann")
    assert written.version == start
    assert await seqs(store) == {"m1": start + 1, "m3": start + 1}
    for memory_id, action in (("m1", "updated"), ("m2", "deleted"), ("m3", "created")):
        event = (await store.history("ann", memory_id))[-1]
        assert (event.action, event.actor, event.job_id) == (action, "manager", "job-7")
    assert (await store.history("ann", "m3"))[-1].detail == "because"


async def test_a_unit_that_changes_nothing_bumps_nothing(store: MemoryStore) -> None:
    await store.add("ann", [NewMemory(content="likes tea", id="m1")])
    start = await store.version("ann")
    async with store.writing("ann", MemorySource.API) as w:
        assert await w.rows(["missing"]) == {}
        assert await w.delete_matching(Memory.id == "missing") == []
    assert w.version == start == await store.version("ann")
    assert await store.delete("ann", ["missing"]) == type(await store.delete("ann", []))([], start)


async def test_a_unit_that_fails_leaves_nothing(store: MemoryStore) -> None:
    await store.add("ann", [NewMemory(content="likes tea", id="m1")])
    start = await store.version("ann")
    with pytest.raises(RuntimeError):
        async with store.writing("ann", MemorySource.API) as w:
            rows = await w.rows(["m1"])
            rows["m1"].content = "changed"
            w.update(rows["m1"], before="likes tea")
            w.create(row("m2", "runs"))
            raise RuntimeError("the block failed")
    assert await store.version("ann") == start
    assert list(await seqs(store)) == ["m1"]
    assert (await store.get("ann", "m1")).content == "likes tea"  # type: ignore[union-attr]
    assert [e.action for e in await store.history("ann", "m1")] == ["created"]
    assert await store.history("ann", "m2") == []
