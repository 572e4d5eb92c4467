"""Forgetting over a capacity on a real database (app/memory/aging/forgetting.py,
app/memory/store/archive.py): what the dry run shows is what leaves; what leaves goes to the
archive whole, with a `forgotten` event naming the reason, and is no longer found; it comes back
with its id, words, dates and links; the archive is erased with its user, moved with its user,
and purged past the keep time."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from app.memory.aging.forgetting import Capacities, Forgetting
from app.memory.service import MemoryService
from app.memory.store.claims import IdTaken
from app.memory.store.memories import MemoryStore
from app.memory.store.records import NewMemory, now
from app.memory.store.tables import ForgottenMemory, Memory, MemorySource, MemoryType
from tests import databases
from tests.fakes import FakeEmbedder

pytestmark = pytest.mark.asyncio

WORDS = ["walks the dog at dawn", "plays chess on sundays", "grows tomatoes on the balcony",
         "collects old maps of Norway", "swims in the fjord every spring"]  # fmt: skip


@pytest.fixture
def service(engine: AsyncEngine) -> MemoryService:
    return MemoryService(MemoryStore(engine), FakeEmbedder())


async def used(service: MemoryService, memory_id: str, *, days: float, recalls: int = 0) -> None:
    """Make the memory last used `days` ago (written then, recalled then when `recalls`)."""
    at = now() - timedelta(days=days)
    values: dict[str, Any] = {"created_at": at, "updated_at": at, "recall_count": recalls}
    values["last_recalled_at"] = at if recalls else None
    async with service.store.sessions() as session, session.begin():
        await session.execute(update(Memory).where(Memory.id == memory_id).values(**values))


async def five_facts(service: MemoryService, user: str = "ann") -> list[str]:
    written = await service.add(user, [NewMemory(f"Ann {w}") for w in WORDS])
    ids = [r.id for r in written.records]
    for i, memory_id in enumerate(ids):  # the first least recently used
        await used(service, memory_id, days=100 - 10 * i)
    return ids


async def test_the_dry_run_shows_what_leaves_and_changes_nothing(service: MemoryService) -> None:
    ids = await five_facts(service)
    forgetting = Forgetting(service, Capacities(facts=3))
    planned = await forgetting.plan("ann")
    assert [m.id for m in planned] == ids[:2]
    assert planned[0].content == f"Ann {WORDS[0]}" and "capacity of 3 facts" in planned[0].reason
    assert len((await service.page("ann", limit=10, offset=0))[0]) == 5  # nothing left yet
    done = await forgetting.forget("ann")
    assert [m.id for m in done.leaving] == [m.id for m in planned]
    left = {r.id for r in (await service.page("ann", limit=10, offset=0))[0]}
    assert left == set(ids[2:])
    assert (await forgetting.forget("ann")).leaving == []  # within the capacity now


async def test_what_leaves_is_archived_with_its_reason_and_no_longer_found(
    service: MemoryService,
) -> None:
    ids = await five_facts(service)
    assert [f.memory.id for f in await service.search("ann", "old maps", limit=3, min_score=0.1)]
    forgetting = Forgetting(service, Capacities(facts=4))
    await used(service, ids[3], days=500)  # the maps: least used now
    (gone,) = (await forgetting.forget("ann")).leaving
    assert gone.id == ids[3]
    found = await service.search("ann", "old maps of Norway", limit=5, min_score=0.0)
    assert ids[3] not in [f.memory.id for f in found]
    kept, total = await forgetting.forgotten("ann", limit=10)
    assert total == 1 and kept[0].id == ids[3] and kept[0].content == f"Ann {WORDS[3]}"
    assert kept[0].reason == gone.reason and "500 days before" in kept[0].reason
    (event,) = [e for e in await service.history("ann", ids[3]) if e.action == "forgotten"]
    assert event.actor == "upkeep" and event.detail == gone.reason
    assert event.before == f"Ann {WORDS[3]}"


async def test_a_forgotten_memory_comes_back_whole_with_its_links(service: MemoryService) -> None:
    episode = (
        await service.add(
            "ann",
            [NewMemory("I swim in the fjord every spring, even in April", type=MemoryType.EPISODE)],
        )
    ).records[0]
    fact = (await service.add("ann", [NewMemory(
        "Ann swims in the fjord every spring", metadata={"k": 1}, id=str(uuid.uuid4()),
        observed_at=now() - timedelta(days=40), linked=(episode.id,))])).records[0]  # fmt: skip
    assert await service.store.linked("ann", [fact.id]) == {fact.id: [episode.id]}
    await used(service, fact.id, days=300)
    await service.add("ann", [NewMemory("Ann plays chess")])
    forgetting = Forgetting(service, Capacities(facts=1))
    (gone,) = (await forgetting.forget("ann")).leaving
    assert gone.id == fact.id
    assert await service.store.linked("ann", [episode.id]) == {}  # the link went with it
    back = await forgetting.restore("ann", fact.id)
    assert back is not None and back.id == fact.id
    assert (back.content, back.type, back.metadata) == (fact.content, "fact", {"k": 1})
    assert back.observed_at == fact.observed_at and back.created_at < now() - timedelta(days=200)
    assert await service.store.linked("ann", [fact.id]) == {fact.id: [episode.id]}
    assert (await forgetting.forgotten("ann", limit=10))[1] == 0
    found = await service.search("ann", "fjord every spring", limit=5, min_score=0.0)
    assert fact.id in [f.memory.id for f in found]
    history = await service.history("ann", fact.id)
    assert [e.action for e in history] == ["created", "forgotten", "created"]
    assert history[-1].detail is not None and history[-1].detail.startswith(
        "put back from the forgotten memories"
    )
    # written back now: the next run takes the other fact, not it again
    (next_gone,) = (await forgetting.forget("ann")).leaving
    assert next_gone.id != fact.id
    assert await forgetting.restore("ann", fact.id) is None  # not forgotten now
    assert await forgetting.restore("bob", next_gone.id) is None  # another user's


async def test_pinned_and_profile_facts_never_leave(service: MemoryService) -> None:
    pinned = await service.add("ann", [NewMemory("Ann is allergic to nuts", pinned=True)])
    profile = await service.add("ann", [NewMemory("Ann is vegetarian", profile=True)])
    keep = [pinned.records[0].id, profile.records[0].id]
    for memory_id in keep:
        await used(service, memory_id, days=2000)
    plain = (await service.add("ann", [NewMemory("Ann likes jazz")])).records[0].id
    forgetting = Forgetting(service, Capacities(facts=1))
    assert [m.id for m in (await forgetting.forget("ann")).leaving] == [plain]
    assert (await forgetting.forget("ann")).leaving == []  # over, but nothing may leave
    assert {r.id for r in (await service.page("ann", limit=10, offset=0))[0]} == set(keep)


async def test_the_archive_is_erased_with_its_user_moved_with_them_and_purged(
    service: MemoryService,
) -> None:
    await five_facts(service, "ann")
    await five_facts(service, "bob")
    forgetting = Forgetting(service, Capacities(facts=3), keep_days=30)
    assert len((await forgetting.forget("ann")).leaving) == 2
    assert len((await forgetting.forget("bob")).leaving) == 2
    await service.delete_all("bob")
    assert (await forgetting.forgotten("bob", limit=10))[1] == 0
    await service.move("ann", "carol")
    assert (await forgetting.forgotten("ann", limit=10))[1] == 0
    moved, total = await forgetting.forgotten("carol", limit=10)
    assert total == 2
    assert await forgetting.restore("carol", moved[0].id) is not None
    assert await forgetting.purge() == 0  # forgotten today: kept
    async with service.store.sessions() as session, session.begin():
        await session.execute(
            update(ForgottenMemory).values(forgotten_at=now() - timedelta(days=31))
        )
    assert await forgetting.purge() == 1
    async with service.store.sessions() as session:
        assert await session.scalar(select(func.count()).select_from(ForgottenMemory)) == 0


async def test_a_write_by_another_actor_names_it(service: MemoryService) -> None:
    ids = await five_facts(service)
    forgetting = Forgetting(service, Capacities(facts=4))
    (gone,) = (await forgetting.forget("ann", actor=MemorySource.CLI)).leaving
    assert gone.id == ids[0]
    (event,) = [e for e in await service.history("ann", ids[0]) if e.action == "forgotten"]
    assert event.actor == "cli"


async def test_a_memory_back_by_import_is_not_put_back_twice(service: MemoryService) -> None:
    ids = await five_facts(service)
    forgetting = Forgetting(service, Capacities(facts=4))
    (gone,) = (await forgetting.forget("ann")).leaving
    await service.add("ann", [NewMemory("Ann imported it again", id=gone.id)])  # an import
    with pytest.raises(IdTaken):
        await forgetting.restore("ann", gone.id)
    assert (await forgetting.forgotten("ann", limit=10))[1] == 1  # kept: nothing was lost
    assert gone.id == ids[0]


@pytest.mark.skipif(not databases.on_postgresql(), reason="a pin committed from another "
                    "connection mid-unit: SQLite runs one writer at a time")  # fmt: skip
async def test_a_memory_pinned_while_forgetting_begins_is_kept(service: MemoryService) -> None:
    ids = await five_facts(service)
    forgetting = Forgetting(service, Capacities(facts=4))
    assert [m.id for m in await forgetting.plan("ann")] == [ids[0]]

    async def pin_meanwhile(_w: Any) -> None:  # before the unit takes the user's lock
        await service.update("ann", ids[0], pinned=True)

    done = await forgetting.forget("ann", within=pin_meanwhile)
    assert [m.id for m in done.leaving] == [ids[1]]  # weighed under the lock: the pin seen
    assert (await service.get("ann", ids[0])) is not None
