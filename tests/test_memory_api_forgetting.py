"""Forgetting through the memory API (what the page calls): deleting a fact deletes the episodes
it was written from and the memories that say the same, lists them in ``also_deleted`` (so that
they can be shown, or put back by import) and says why in their history; an episode goes alone;
deleting everything deletes the episodes and their links."""

from __future__ import annotations

import httpx
import orjson
from sqlalchemy import select

from app.memory.learning.applier import Applier
from app.memory.learning.decisions import Op, Operation
from app.memory.store.tables import MemoryLink
from tests.memory.learning.support import services
from tests.memory_api_support import ANN, add


async def learned(client: httpx.AsyncClient, fact: str, said: str) -> tuple[str, str]:
    """A fact a job wrote from the user's words, linked to them: (fact id, episode id)."""
    service = services(client).memory
    (outcome,) = await Applier(service).apply(
        "ann", [Operation(op=Op.NEW, content=fact)], {}, job_id="j", episodes=[said]
    )
    listed, _ = await service.page("ann", contains=said)
    return outcome.memory_id or "", listed[0].id


async def contents(client: httpx.AsyncClient) -> list[str]:
    listed = (await client.get("/v1/memories", params={"limit": 100}, headers=ANN)).json()
    return sorted(m["content"] for m in listed["data"])


async def test_a_fact_goes_with_its_episodes_and_what_says_the_same(
    client: httpx.AsyncClient,
) -> None:
    fact, episode = await learned(client, "Is vegetarian", "I am vegetarian and I live in Lyon.")
    same = await add(client, "User is vegetarian")
    await add(client, "Is vegan")
    deleted = await client.delete(f"/v1/memories/{fact}", headers=ANN)
    assert deleted.status_code == 200
    body = deleted.json()
    assert (body["id"], body["deleted"]) == (fact, 3)
    gone = {m["id"]: m for m in body["also_deleted"]}
    assert set(gone) == {episode, same["id"]}
    assert gone[same["id"]] == same  # as it was: the page puts it back by import on Undo
    assert gone[episode]["type"] == "episode"
    assert await contents(client) == ["Is vegan"]
    history = (await client.get(f"/v1/memories/{episode}/history", headers=ANN)).json()["data"]
    assert history[-1]["action"] == "deleted"
    assert history[-1]["detail"] == f"an episode {fact} was written from: deleted with it"
    history = (await client.get(f"/v1/memories/{same['id']}/history", headers=ANN)).json()["data"]
    assert history[-1]["detail"].startswith(f"says what {fact} said (cosine ")
    # put back as the page's Undo does: the objects as import lines
    lines = "".join(orjson.dumps(m).decode() + "\n" for m in body["also_deleted"])
    restored = await client.post(
        "/v1/memories/import", content=lines,
        headers={**ANN, "Content-Type": "application/x-ndjson"},
    )  # fmt: skip
    assert restored.json() == {"imported": 2, "skipped": 0}
    assert await contents(client) == [
        "I am vegetarian and I live in Lyon.", "Is vegan", "User is vegetarian",
    ]  # fmt: skip


async def test_an_episode_goes_alone_and_everything_takes_the_episodes(
    client: httpx.AsyncClient,
) -> None:
    fact, episode = await learned(client, "Plays the cello", "I play the cello.")
    deleted = (await client.delete(f"/v1/memories/{episode}", headers=ANN)).json()
    assert (deleted["deleted"], deleted["also_deleted"]) == (1, [])
    assert await contents(client) == ["Plays the cello"]
    await learned(client, "Runs marathons", "I run marathons.")
    everything = await client.delete("/v1/memories", params={"confirm": "true"}, headers=ANN)
    assert everything.json() == {
        "id": None, "object": "memory.deleted", "deleted": 3, "also_deleted": [],
    }  # fmt: skip
    assert await contents(client) == []
    async with services(client).store.sessions() as session:
        assert (await session.execute(select(MemoryLink))).all() == []
    assert (await client.get(f"/v1/memories/{fact}", headers=ANN)).status_code == 404
