"""Provenance through the memory API (issue 25, point 2): a fact names the episodes it was written
from and an episode the facts written from it (``linked``), on GET, the list, search, PATCH and
DELETE's ``also_deleted``; an export carries them and an import puts them back (and an imported
episode's index key), so the page's Undo after a delete restores the links too."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
from sqlalchemy import select

from app.memory.learning.applier import Applier
from app.memory.learning.decisions import Op, Operation
from app.memory.store.tables import Memory, MemoryLink
from tests.memory.learning.support import services
from tests.memory_api_support import ANN, BOB, add
from tests.test_memory_api_forgetting import learned

FACT = "Is vegetarian"
SAID = "I stopped eating meat years ago."
LINES = {**ANN, "Content-Type": "application/x-ndjson"}


async def one(client: httpx.AsyncClient, memory_id: str, headers: dict[str, str] = ANN) -> Any:
    response = await client.get(f"/v1/memories/{memory_id}", headers=headers)
    assert response.status_code == 200, response.text
    return response.json()


async def imported(
    client: httpx.AsyncClient,
    lines: list[dict[str, Any]],
    headers: dict[str, str] = LINES,
    **q: str,
) -> Any:
    raw = "".join(orjson.dumps(line).decode() + "\n" for line in lines)
    response = await client.post("/v1/memories/import", content=raw, headers=headers, params=q)
    assert response.status_code == 200, response.text
    return response.json()


async def stored_links(client: httpx.AsyncClient) -> set[tuple[str, str, str]]:
    async with services(client).store.sessions() as session:
        query = select(MemoryLink.user_id, MemoryLink.fact_id, MemoryLink.episode_id)
        return {(u, f, e) for u, f, e in await session.execute(query)}


async def index_text(client: httpx.AsyncClient, memory_id: str) -> str | None:
    async with services(client).store.sessions() as session:
        return await session.scalar(select(Memory.index_text).where(Memory.id == memory_id))


async def episodes_found(client: httpx.AsyncClient, query: str) -> list[str]:
    response = await client.post(
        "/v1/memories/search", headers=ANN,
        json={"query": query, "types": ["episode"], "min_score": 0},
    )  # fmt: skip
    assert response.status_code == 200, response.text
    return [hit["id"] for hit in response.json()["data"]]


async def test_a_fact_and_its_episode_name_each_other_wherever_shown(
    client: httpx.AsyncClient,
) -> None:
    fact, episode = await learned(client, FACT, SAID)
    other = await add(client, "Plays the cello")
    assert other["linked"] == []
    assert (await one(client, fact))["linked"] == [episode]
    assert (await one(client, episode))["linked"] == [fact]
    listed = (await client.get("/v1/memories", headers=ANN)).json()["data"]
    assert {m["id"]: m["linked"] for m in listed} == {
        fact: [episode], episode: [fact], other["id"]: [],
    }  # fmt: skip
    found = await client.post(
        "/v1/memories/search", headers=ANN, json={"query": "vegetarian meat", "min_score": 0}
    )
    hits = {h["id"]: h["linked"] for h in found.json()["data"]}
    assert hits[fact] == [episode] and hits[episode] == [fact]
    patched = await client.patch(f"/v1/memories/{fact}", headers=ANN, json={"pinned": True})
    assert patched.json()["linked"] == [episode]
    # another user sees none of it
    assert (await client.get(f"/v1/memories/{fact}", headers=BOB)).status_code == 404


async def test_undo_after_a_delete_puts_back_the_links_and_the_episode_s_key(
    client: httpx.AsyncClient,
) -> None:
    fact, episode = await learned(client, FACT, SAID)
    key = await index_text(client, episode)
    assert key == f"{SAID} {FACT}."
    assert await episodes_found(client, "vegetarian") == [episode]  # by the fact in its key
    line = await one(client, fact)
    deleted = (await client.delete(f"/v1/memories/{fact}", headers=ANN)).json()
    (gone,) = deleted["also_deleted"]
    assert (gone["id"], gone["linked"]) == (episode, [fact])  # read before the delete
    assert await stored_links(client) == set()
    # the page's Undo: the deleted memory's line and those that went with it, imported
    assert await imported(client, [line, *deleted["also_deleted"]]) == {
        "imported": 2, "skipped": 0,
    }  # fmt: skip
    assert await stored_links(client) == {("ann", fact, episode)}
    assert (await one(client, fact))["linked"] == [episode]
    assert (await one(client, episode))["linked"] == [fact]
    assert await index_text(client, episode) == key
    assert await episodes_found(client, "vegetarian") == [episode]


async def test_an_export_carries_the_links_and_an_import_puts_them_back(
    client: httpx.AsyncClient,
) -> None:
    fact, episode = await learned(client, FACT, SAID)
    exported = await client.get("/v1/memories/export", headers=ANN)
    lines = [orjson.loads(line) for line in exported.content.splitlines()]
    assert {line["id"]: line["linked"] for line in lines} == {fact: [episode], episode: [fact]}
    # into another user, as copies: the links follow the copies, within the import only
    bob = {**BOB, "Content-Type": "application/x-ndjson"}
    words = {"id": "bobs-words", "type": "episode", "content": "I moved to Lyon."}
    await imported(client, [words], bob)  # Bob's own: a copy does not link to it
    stranger = {"content": "Lives in Lyon", "id": "elsewhere", "linked": ["bobs-words"]}
    assert (await imported(client, [*lines, stranger], bob, ids="new"))["imported"] == 3
    copies = (await client.get("/v1/memories", headers=BOB)).json()["data"]
    by_text = {m["content"]: m for m in copies}
    copied_fact, copied_episode = by_text[FACT], by_text[SAID]
    assert copied_fact["linked"] == [copied_episode["id"]]
    assert copied_episode["linked"] == [copied_fact["id"]]
    assert by_text["Lives in Lyon"]["linked"] == []
    assert await index_text(client, copied_episode["id"]) == f"{SAID} {FACT}."
    assert ("bob", copied_fact["id"], copied_episode["id"]) in await stored_links(client)


async def test_an_import_links_to_what_the_user_has_and_drops_the_rest(
    client: httpx.AsyncClient,
) -> None:
    kept = await add(client, "Works night shifts at the hospital")
    theirs = await add(client, "Bob's own fact", BOB)
    episode = {
        "id": "episode-1", "type": "episode", "content": "I work nights.",
        "linked": [kept["id"], "nobody-has-this", theirs["id"], "fact-2", "episode-2"],
    }  # fmt: skip
    fact = {"id": "fact-2", "content": "Sleeps in the day", "linked": ["episode-1"]}
    other = {"id": "episode-2", "type": "episode", "content": "Other words."}
    assert (await imported(client, [episode, fact, other]))["imported"] == 3
    # fact -> episode only, each once; an unknown id and another user's id: dropped, silently
    assert await stored_links(client) == {
        ("ann", kept["id"], "episode-1"), ("ann", "fact-2", "episode-1"),
    }  # fmt: skip
    assert await index_text(client, "episode-1") == (
        "I work nights. Works night shifts at the hospital. Sleeps in the day."
    )
    assert await index_text(client, "episode-2") is None
    assert sorted((await one(client, kept["id"]))["linked"]) == ["episode-1"]
    assert (await one(client, theirs["id"], BOB))["linked"] == []
    # imported again: nothing new, the links once
    assert (await imported(client, [episode, fact, other]))["skipped"] == 3
    assert len(await stored_links(client)) == 2


async def test_a_bad_linked_field_is_a_422_naming_the_line(client: httpx.AsyncClient) -> None:
    for linked, where in (("abc", "line 1.linked"), (["no spaces allowed"], "line 1.linked.0")):
        raw = orjson.dumps({"content": "x", "linked": linked}) + b"\n"
        response = await client.post("/v1/memories/import", content=raw, headers=LINES)
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert (error["type"], error["param"]) == ("invalid_request_error", where)


async def test_the_openapi_schema_documents_linked(client: httpx.AsyncClient) -> None:
    schema = (await client.get("/openapi.json")).json()["components"]["schemas"]
    linked = schema["MemoryPublic"]["properties"]["linked"]
    assert linked["type"] == "array" and linked["items"] == {"type": "string"}
    assert "episodes" in linked["description"]


async def test_undo_gives_a_shared_episode_back_its_other_fact(client: httpx.AsyncClient) -> None:
    """An episode two facts were written from goes with the one deleted; its line names both,
    and Undo links it to the fact that stayed as well, and keys it by both again."""
    service = services(client).memory
    (first, second) = await Applier(service).apply(
        "ann",
        [Operation(op=Op.NEW, content=FACT), Operation(op=Op.NEW, content="Works at the hospital")],
        {}, job_id="j", episodes=["I stopped eating meat and I work at the hospital."],
    )  # fmt: skip
    fact, other = first.memory_id or "", second.memory_id or ""
    (episode,) = (await one(client, fact))["linked"]
    key = await index_text(client, episode)
    assert key and key.endswith(f"{FACT}. Works at the hospital.")
    line = await one(client, fact)
    deleted = (await client.delete(f"/v1/memories/{fact}", headers=ANN)).json()
    assert [(m["id"], sorted(m["linked"])) for m in deleted["also_deleted"]] == [
        (episode, sorted([fact, other])),
    ]  # fmt: skip
    assert (await one(client, other))["linked"] == []
    await imported(client, [line, *deleted["also_deleted"]])
    assert await stored_links(client) == {("ann", fact, episode), ("ann", other, episode)}
    assert sorted((await one(client, episode))["linked"]) == sorted([fact, other])
    assert await index_text(client, episode) == key


async def test_a_copy_never_links_to_the_memory_it_copies(client: httpx.AsyncClient) -> None:
    """A copy (``?ids=new``) of a fact line naming an episode the file does not hold (the user's
    original, say) links to nothing: the original is not linked to the copy."""
    fact, episode = await learned(client, FACT, SAID)
    line = {"id": fact, "content": FACT, "linked": [episode]}
    assert (await imported(client, [line], ids="new"))["imported"] == 1
    assert await stored_links(client) == {("ann", fact, episode)}
    assert (await one(client, episode))["linked"] == [fact]
