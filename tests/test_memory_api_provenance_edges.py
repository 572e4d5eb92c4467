"""Provenance at its edges (the review of issue 25's point 2): hostile imports stay 4xx-or-fine and
bounded, a link put back between memories already stored reaches every process's index, a
delete says the links of all it took, and a line sent twice keeps its link and its key together."""

from __future__ import annotations

import itertools
import string

import httpx
import orjson
import pytest
from sqlalchemy import func, select

from app.memory.search.cache import IndexCache
from app.memory.search.parts import KEY_FACT_CHARS
from app.memory.store.memories import MemoryStore
from app.memory.store.records import NewMemory
from app.memory.store.tables import Memory, MemoryType
from tests.memory.learning.support import services
from tests.memory_api_support import ANN, add
from tests.test_memory_api_provenance import LINES, imported, index_text, stored_links

CELLO = {"id": "ep-1", "type": "episode", "content": "I play the cello on Sundays."}


async def fresh_links(client: httpx.AsyncClient) -> dict[int, set[int]]:
    """The links an index built now from the store holds (another process's first search)."""
    found = services(client)
    return (await IndexCache(found.store, found.memory.embedder).get("ann")).links


async def test_links_put_back_between_stored_memories_reach_the_index(
    client: httpx.AsyncClient,
) -> None:
    """A re-import that writes no memory, only the link between a fact and an episode the user
    has: the version moves and this process's index, read again, holds the link."""
    fact = await add(client, "Plays the cello")
    await imported(client, [CELLO])
    store, cache = services(client).store, services(client).memory.cache
    before, _ = await store.version("ann"), await cache.get("ann")
    assert (await imported(client, [{**fact, "linked": ["ep-1"]}]))["imported"] == 0
    assert ("ann", fact["id"], "ep-1") in await stored_links(client)
    assert await store.version("ann") > before
    assert (await cache.get("ann")).links == await fresh_links(client) != {}


async def test_another_process_catches_up_with_a_fact_linked_to_an_old_episode(
    client: httpx.AsyncClient,
) -> None:
    await imported(client, [CELLO])
    found = services(client)
    other = IndexCache(found.store, found.memory.embedder)  # another replica's index
    await other.get("ann")
    await imported(client, [{"id": "fact-1", "content": "Plays the cello", "linked": ["ep-1"]}])
    assert (await other.get("ann")).links == await fresh_links(client) != {}


def _ids(length: int) -> itertools.product[tuple[str, ...]]:
    return itertools.product(string.ascii_letters + string.digits, repeat=length)


@pytest.mark.parametrize("lines", [40, 300])
async def test_thousands_of_unknown_linked_ids_are_dropped_not_a_500(
    client: httpx.AsyncClient, lines: int
) -> None:
    """Over PostgreSQL's 32,767 bound parameters and SQLite's limit in one import."""
    names = ("".join(p) for p in _ids(4))
    raw = b"".join(
        orjson.dumps({"id": f"L{i}", "content": f"fact {i}", "linked": list(itertools.islice(names, 1000))}) + b"\n"
        for i in range(lines)
    )  # fmt: skip
    response = await client.post("/v1/memories/import", content=raw, headers=LINES)
    assert response.status_code == 200, response.text
    assert response.json()["imported"] == lines
    assert await stored_links(client) == set()
    assert (await client.get("/v1/memories/L0", headers=ANN)).json()["linked"] == []


async def test_an_episode_linked_to_many_long_facts_keeps_a_key_of_bounded_size(
    client: httpx.AsyncClient,
) -> None:
    facts = [{"id": f"f{i}", "content": f"fact{i} " + "likes long words " * 35} for i in range(30)]
    await imported(client, facts)
    episodes = [
        {"id": f"e{j}", "type": "episode", "content": f"words {j}", "linked": [f["id"] for f in facts]}
        for j in range(5)
    ]  # fmt: skip
    await imported(client, episodes)
    async with services(client).store.sessions() as session:
        longest = await session.scalar(select(func.max(func.length(Memory.index_text))))
    assert longest is not None and len("words 0") < longest <= len("words 0 ") + KEY_FACT_CHARS
    assert len((await client.get("/v1/memories/e0", headers=ANN)).json()["linked"]) == 30


async def test_a_line_sent_twice_with_new_ids_keeps_its_link_and_its_key_on_one_copy(
    client: httpx.AsyncClient,
) -> None:
    fact = {"id": "f1", "content": "Plays the cello", "linked": ["ep-1"]}
    await imported(client, [CELLO, fact, CELLO], ids="new")
    listed = (await client.get("/v1/memories", headers=ANN)).json()["data"]
    (copy,) = [m for m in listed if m["type"] == "fact"]
    (episode_id,) = copy["linked"]
    assert await index_text(client, episode_id) == f"{CELLO['content']} Plays the cello."


async def test_a_delete_says_the_links_of_an_episode_that_went_because_it_says_the_same(
    client: httpx.AsyncClient,
) -> None:
    """The deleted fact F has no episode; the episode E says what F says (so it goes too) and
    was written from another fact G, which stays: E comes back from the delete linked to G."""
    store: MemoryStore = services(client).store
    (f,) = (await store.add("ann", [NewMemory("Is vegetarian")])).records
    await imported(client, [{"id": "e2", "type": "episode", "content": "I am vegetarian."},
                            {"id": "g", "content": "Eats no meat", "linked": ["e2"]}])  # fmt: skip
    e2 = await store.get("ann", "e2")
    assert e2 is not None and e2.type == MemoryType.EPISODE.value
    removed = await store.delete("ann", [f.id], same={f.id: {e2.key: 0.9}})
    assert [r.id for r in removed.also] == ["e2"]
    assert removed.linked.get("e2") == ["g"]


async def test_a_stored_episode_an_import_links_facts_to_is_found_by_all_of_them(
    client: httpx.AsyncClient,
) -> None:
    """The episode is the user's already (another import, an earlier batch): the facts a later
    import links to it extend its index key, after those linked before, and this process's
    index finds it by them; a link sent again adds nothing to the key."""
    await imported(client, [CELLO, {"id": "f0", "content": "Has a cello", "linked": ["ep-1"]}])
    assert await index_text(client, "ep-1") == f"{CELLO['content']} Has a cello."
    before = await _score(client, "ep-1", "orchestra rehearsals")
    fact = {"id": "f1", "content": "Joined an orchestra for rehearsals", "linked": ["ep-1"]}
    await imported(client, [fact])
    key = f"{CELLO['content']} Has a cello. Joined an orchestra for rehearsals."
    assert await index_text(client, "ep-1") == key
    after = await _score(client, "ep-1", "orchestra rehearsals")
    assert after > before + 0.2, (before, after)
    await imported(client, [fact])  # again: the key as it was, nothing written
    assert await index_text(client, "ep-1") == key
    history = (await client.get("/v1/memories/ep-1/history", headers=ANN)).json()["data"]
    assert [e["action"] for e in history] == ["created"]  # its words never changed


async def _score(client: httpx.AsyncClient, memory_id: str, query: str) -> float:
    """The memory's score for the query in this process's index (0 when not found)."""
    found = await services(client).memory.search("ann", query, limit=10, min_score=0.0)
    return max((f.hit.score for f in found if f.memory.id == memory_id), default=0.0)
