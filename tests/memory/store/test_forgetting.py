"""Deleting a fact takes what would say it again (app/memory/store/unit.py, Writer.delete): the
episodes it was written from, also when they gave other facts too, and the memories said to
restate it, with their own episodes; never a pinned memory, nor one the same unit wrote. Each
removal is a ``deleted`` event saying which memory it went with. An episode goes alone."""

from __future__ import annotations

from sqlalchemy import insert, select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.memory.store.memories import MemoryStore
from app.memory.store.records import NewMemory, now
from app.memory.store.tables import Memory, MemoryLink, MemorySource, MemoryType

EPISODE = MemoryType.EPISODE


async def add(store: MemoryStore, *items: NewMemory) -> list[tuple[str, int]]:
    """(id, key) of each memory added for ann."""
    return [(r.id, r.key) for r in (await store.add("ann", list(items))).records]


async def link(store: MemoryStore, *pairs: tuple[str, str]) -> None:
    """(fact id, episode id) links of ann's, as a job writes them."""
    async with store.sessions() as session, session.begin():
        await session.execute(insert(MemoryLink), [
            {"user_id": "ann", "fact_id": f, "episode_id": e, "created_at": now()}
            for f, e in pairs
        ])  # fmt: skip


async def left(store: MemoryStore) -> list[str]:
    async with store.sessions() as session:
        query = select(Memory.content).where(Memory.user_id == "ann")
        return sorted(await session.scalars(query))


async def test_a_fact_takes_its_episodes_and_what_says_the_same(engine: AsyncEngine) -> None:
    store = MemoryStore(engine)
    (veg, vk), (lyon, _), (said, _), (again, _), (same, sk), (_, pk), _ = await add(
        store,
        NewMemory("Is vegetarian"),
        NewMemory("Lives in Lyon"),
        NewMemory("I am vegetarian and I live in Lyon.", EPISODE),
        NewMemory("Vegetarian, yes.", EPISODE),
        NewMemory("Follows a vegetarian diet"),
        NewMemory("Vegetarian since 2010", pinned=True),
        NewMemory("Likes jazz"),
    )  # fmt: skip
    await link(store, (veg, said), (lyon, said), (same, again))
    removed = await store.delete("ann", [veg], same={veg: {sk: 0.81, pk: 0.9}})
    # the episode that gave "Lives in Lyon" too goes: it holds the words being forgotten
    assert removed.ids == [veg]
    assert sorted(r.content for r in removed.also) == [
        "Follows a vegetarian diet", "I am vegetarian and I live in Lyon.", "Vegetarian, yes.",
    ]  # fmt: skip
    assert len(removed.keys) == 4 and vk in removed.keys
    assert await left(store) == ["Likes jazz", "Lives in Lyon", "Vegetarian since 2010"]
    async with store.sessions() as session:
        assert (await session.execute(select(MemoryLink))).all() == []
    event = (await store.history("ann", said))[-1]
    assert (event.action, event.actor) == ("deleted", "api")
    assert event.before == "I am vegetarian and I live in Lyon."
    assert event.detail == f"an episode {veg} was written from: deleted with it"
    event = (await store.history("ann", same))[-1]
    assert event.detail == f"says what {veg} said (cosine 0.81): deleted with it"
    event = (await store.history("ann", again))[-1]
    assert event.detail == (
        f"an episode {same} was written from, which says what {veg} said: deleted with {veg}"
    )
    assert [e.detail for e in await store.history("ann", veg)][-1] is None


async def test_an_episode_goes_alone_and_a_pinned_episode_stays(engine: AsyncEngine) -> None:
    store = MemoryStore(engine)
    (fact, _), (episode, _), (pinned, _) = await add(
        store,
        NewMemory("Plays the cello"),
        NewMemory("I play the cello.", EPISODE),
        NewMemory("My cello is from 1920.", EPISODE, pinned=True),
    )
    await link(store, (fact, episode), (fact, pinned))
    removed = await store.delete("ann", [episode])
    assert (removed.ids, removed.also) == ([episode], [])
    assert await left(store) == ["My cello is from 1920.", "Plays the cello"]
    removed = await store.delete("ann", [fact])
    assert (removed.ids, removed.also) == ([fact], [])  # the pinned one is never taken along
    assert await left(store) == ["My cello is from 1920."]


async def test_ids_asked_for_that_went_along_count_as_asked(engine: AsyncEngine) -> None:
    store = MemoryStore(engine)
    (fact, _), (episode, _) = await add(
        store, NewMemory("Runs marathons"), NewMemory("I run marathons.", EPISODE)
    )
    await link(store, (fact, episode))
    removed = await store.delete("ann", [fact, episode, fact, "unknown"])
    assert (removed.ids, removed.also, removed.count) == ([fact, episode], [], 2)
    assert await left(store) == []


async def test_what_the_unit_wrote_is_never_taken_along(engine: AsyncEngine) -> None:
    """A job that updates a memory, then deletes one that memory used to restate, keeps its
    update; another user's memories are never reached."""
    store = MemoryStore(engine)
    (veg, _), (diet, dk) = await add(
        store, NewMemory("Is vegetarian"), NewMemory("Follows a vegetarian diet")
    )
    (bob,) = (await store.add("bob", [NewMemory("Is vegetarian")])).records
    async with store.writing("ann", MemorySource.MANAGER, job_id="j") as w:
        rows = await w.rows([veg, diet])
        rows[diet].content = "Is vegan"
        w.update(rows[diet], before="Follows a vegetarian diet")
        assert await w.delete(rows[veg], same={dk: 0.8, bob.key: 0.99}) == []
        assert await w.delete(rows[veg]) == []  # gone already: nothing more
    assert await left(store) == ["Is vegan"]
    assert await store.get("bob", bob.id) is not None
