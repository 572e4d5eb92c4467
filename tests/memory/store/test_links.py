"""Provenance links (`memory_links`: a fact and the episode it was written from) live and die with
their memories: deleting either memory, one by one, by id, every memory of the user, or by the
Manager, deletes its links in the same transaction; a move gives them to the new user. And a
memory's `observed_at` and `profile` are kept, changed and said in its history."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from sqlalchemy import insert, select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.memory.store.memories import MemoryStore
from app.memory.store.records import NewMemory, now
from app.memory.store.tables import MemoryLink, MemorySource, MemoryType

SAID = datetime(2024, 5, 1, 12, 0, tzinfo=timezone(timedelta(hours=2)))


@pytest.fixture
def store(engine: AsyncEngine) -> MemoryStore:
    return MemoryStore(engine)


async def linked(store: MemoryStore, user: str, facts: int = 2) -> tuple[list[str], str]:
    """`facts` facts of `user` written from one episode: their ids, and the episode's."""
    items = [NewMemory(f"{user}'s fact {i}") for i in range(facts)]
    items.append(NewMemory(f"{user} said something", MemoryType.EPISODE))
    ids = [r.id for r in (await store.add(user, items)).records]
    async with store.sessions() as session, session.begin():
        await session.execute(insert(MemoryLink), [
            {"user_id": user, "fact_id": f, "episode_id": ids[-1], "created_at": now()}
            for f in ids[:-1]
        ])  # fmt: skip
    return ids[:-1], ids[-1]


async def links(store: MemoryStore) -> set[tuple[str, str, str]]:
    async with store.sessions() as session:
        query = select(MemoryLink.user_id, MemoryLink.fact_id, MemoryLink.episode_id)
        return {(u, f, e) for u, f, e in await session.execute(query)}


async def test_deleting_a_fact_or_an_episode_deletes_its_links(store: MemoryStore) -> None:
    (one, two), episode = await linked(store, "ann")
    bob_facts, bob_episode = await linked(store, "bob", facts=1)
    await store.delete("ann", [episode])
    assert await links(store) == {("bob", bob_facts[0], bob_episode)}
    assert await store.get("ann", one) and await store.get("ann", two)  # an episode goes alone
    (three,), again = await linked(store, "ann", facts=1)
    await store.delete("ann", [three])  # a fact takes its episode (and so the episode's links)
    assert await store.get("ann", again) is None
    assert await links(store) == {("bob", bob_facts[0], bob_episode)}


async def test_the_manager_s_delete_and_delete_all_take_the_links(store: MemoryStore) -> None:
    (one, two), episode = await linked(store, "ann")
    await linked(store, "bob", facts=1)
    async with store.writing("ann", MemorySource.MANAGER, job_id="j") as w:
        went = await w.delete((await w.rows([one]))[one])
    assert [m.id for m in went] == [episode]  # the episode it was written from went with it
    assert {u for u, _, _ in await links(store)} == {"bob"}
    assert await store.get("ann", two) is not None  # the other fact stays, without its link
    await linked(store, "ann")
    await store.delete_all("ann")
    assert {u for u, _, _ in await links(store)} == {"bob"}
    assert await store.count("ann") == 0  # facts and episodes


async def test_a_move_gives_the_links_to_the_new_user(store: MemoryStore) -> None:
    (one, two), episode = await linked(store, "anonymous")
    await linked(store, "bob", facts=1)
    await store.move("anonymous", "ann")
    moved = {(u, f, e) for u, f, e in await links(store) if u != "bob"}
    assert moved == {("ann", one, episode), ("ann", two, episode)}
    await store.delete("ann", [episode])  # and they are the new user's to delete
    assert {u for u, _, _ in await links(store)} == {"bob"}


async def test_observed_at_and_profile_are_kept_changed_and_told(store: MemoryStore) -> None:
    (plain, marked) = (await store.add("ann", [
        NewMemory("Likes tea"), NewMemory("Is vegetarian", profile=True, observed_at=SAID),
    ])).records  # fmt: skip
    assert plain.profile is False and plain.observed_at == plain.created_at
    assert marked.profile is True and marked.observed_at == SAID
    assert marked.observed_at.tzinfo == UTC  # the same instant, kept in UTC
    got = await store.get("ann", marked.id)
    assert got is not None and (got.profile, got.observed_at) == (True, SAID)

    changed = await store.update("ann", plain.id, profile=True, observed_at=SAID)
    assert changed is not None
    (record,) = changed.records
    assert (record.profile, record.observed_at) == (True, SAID)
    assert record.created_at == plain.created_at
    (_, event) = await store.history("ann", plain.id)
    assert event.detail == (
        f"profile, observed {plain.observed_at:%Y-%m-%d %H:%MZ} -> 2024-05-01 10:00Z"
    )
    page, total = await store.page("ann", profile=True)
    assert total == 2 and {r.id for r in page} == {plain.id, marked.id}
    assert (await store.page("ann", profile=False))[1] == 0
    stats = await store.stats("ann")
    assert (stats["profile"], stats["pinned"]) == (2, 0)
