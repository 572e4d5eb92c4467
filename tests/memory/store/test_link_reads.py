"""Provenance read by id (:mod:`app.memory.store.links`): what the API shows in `linked` costs one
query per response, a chunk of ids at a time, whatever the number of memories shown; only the
user's links are read; an import puts back a link once, a fact to an episode."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from app.memory.store import links
from app.memory.store.memories import MemoryStore
from app.memory.store.records import NewMemory
from app.memory.store.tables import MemoryType
from tests.memory.store.test_links import linked


@pytest.fixture
def store(engine: AsyncEngine) -> MemoryStore:
    return MemoryStore(engine)


@contextmanager
def statements(engine: AsyncEngine) -> Iterator[list[str]]:
    seen: list[str] = []

    def count(*args: Any) -> None:
        seen.append(args[2])

    event.listen(engine.sync_engine, "before_cursor_execute", count)
    try:
        yield seen
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", count)


async def test_the_links_of_many_memories_take_one_query_a_chunk(
    store: MemoryStore, engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    facts, episode = await linked(store, "ann", facts=5)
    await linked(store, "bob", facts=1)
    lonely = (await store.add("ann", [NewMemory("no links")])).records[0].id
    shown = [*facts, episode, lonely]
    with statements(engine) as seen:
        found = await store.linked("ann", shown)
    assert len(seen) == 1 and "memory_links" in seen[0]
    expected = {episode: sorted(facts), **{f: [episode] for f in facts}}
    assert {k: sorted(v) for k, v in found.items()} == expected  # none for `lonely`
    monkeypatch.setattr(links, "LINK_CHUNK", 3)
    with statements(engine) as seen:
        chunked = await store.linked("ann", shown)
    assert len(seen) == 3  # 7 ids, 3 a query
    assert {k: sorted(v) for k, v in chunked.items()} == expected
    assert await store.linked("bob", shown) == {}  # another user's ids: nothing of ann's


async def test_an_import_links_a_fact_to_an_episode_once(store: MemoryStore) -> None:
    items = [
        NewMemory("words", MemoryType.EPISODE, id="e1", linked=("f1",)),
        NewMemory("a fact", id="f1", linked=("e1",)),
        NewMemory("another fact", id="f2"),
    ]
    pairs = [("e1", "f1"), ("f1", "e1"), ("f1", "f2"), ("f2", "nobody")]
    written = await store.add("ann", items, links=pairs)
    assert written.links == [(written.records[1].key, written.records[0].key)]
    assert await store.linked("ann", ["e1", "f1", "f2"]) == {"e1": ["f1"], "f1": ["e1"]}
    again = await store.add("ann", items, links=pairs)  # re-imported: the link once
    assert again.created == [False, False, False]
    assert await store.linked("ann", ["e1"]) == {"e1": ["f1"]}
