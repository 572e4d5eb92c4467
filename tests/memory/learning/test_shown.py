"""The memories a job shows the Manager, numbered once (issue 26): the related ones first, then
those the two-step Manager finds per sentence; the numbers map back to the right memories."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from app.memory.learning.shown import ShownMemories
from app.memory.service import MemoryService
from app.memory.store.memories import MemoryStore
from app.memory.store.records import NewMemory
from app.memory.store.tables import MemoryType
from tests.fakes import FakeEmbedder


@pytest.fixture
def service(engine: AsyncEngine) -> MemoryService:
    return MemoryService(MemoryStore(engine), FakeEmbedder())  # type: ignore[arg-type]


async def test_each_memory_keeps_the_number_it_was_first_shown_with(
    service: MemoryService,
) -> None:
    written = await service.add("ann", [
        NewMemory("Lives in Lyon"), NewMemory("Plays the cello"),
        NewMemory("Keeps bees", type=MemoryType.EPISODE),
    ])  # fmt: skip
    ids = {r.content: r.id for r in written.records}
    book = ShownMemories(service, "ann", datetime.now(UTC))
    related = await book.related(["I play the cello in Lyon"])
    assert {s.content for s in related} == {"Lives in Lyon", "Plays the cello"}  # facts only
    assert [s.alias for s in related] == [1, 2]
    again = await book.like("cello lessons", 3)
    assert {s.alias for s in again} <= {1, 2}  # shown already: the same numbers
    teacher = (await service.add("ann", [NewMemory("Cello teacher is Ana")])).records[0].id
    found = await book.like("cello teacher Ana", 3)
    assert [s.alias for s in found if s.content == "Cello teacher is Ana"] == [3]
    assert {s.alias: (s.content, book.aliases[s.alias]) for s in book.shown} == {
        **{s.alias: (s.content, ids[s.content]) for s in related},
        3: ("Cello teacher is Ana", teacher),
    }  # fmt: skip
