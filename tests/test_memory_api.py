"""The memory API over a real SQLite file (fake embedder): every route, from create to delete,
batch, search and stats, export and import, and metadata at the limits of what is storable.
User isolation and every bad input: test_memory_api_errors.py."""

from __future__ import annotations

from typing import Any

import httpx
import orjson

from app.config import Settings
from tests.helpers import assert_openai_error
from tests.memory_api_support import ANN, BOB, add, count


async def test_create_get_list_update_delete(client: httpx.AsyncClient) -> None:
    created = await add(
        client, "  Lives in Oslo with two kids  ", type="fact", metadata={"src": "t"}
    )
    assert created["object"] == "memory" and created["content"] == "Lives in Oslo with two kids"
    assert created["user_id"] == "ann" and created["source"] == "api" and not created["pinned"]
    assert created["metadata"] == {"src": "t"} and created["recall_count"] == 0
    assert "key" not in created and "embedding" not in created
    await add(client, "Prefers short answers", type="preference", pinned=True)

    got = await client.get(f"/v1/memories/{created['id']}", headers=ANN)
    assert got.status_code == 200 and got.json() == created

    page = (await client.get("/v1/memories", params={"limit": 1}, headers=ANN)).json()
    assert page["object"] == "list" and page["total"] == 2 and page["has_more"] is True
    assert [m["content"] for m in page["data"]] == ["Prefers short answers"]
    prefs = (await client.get("/v1/memories", params={"type": "preference"}, headers=ANN)).json()
    assert [m["type"] for m in prefs["data"]] == ["preference"]
    text = (await client.get("/v1/memories", params={"q": "oslo"}, headers=ANN)).json()
    assert [m["id"] for m in text["data"]] == [created["id"]]

    patched = await client.patch(
        f"/v1/memories/{created['id']}",
        json={"content": "Lives in Bergen", "pinned": True},
        headers=ANN,
    )
    assert patched.status_code == 200
    assert patched.json()["content"] == "Lives in Bergen" and patched.json()["pinned"] is True
    assert patched.json()["created_at"] == created["created_at"]
    # the index follows the edit: the new words find it, the old ones no longer do
    hits = (
        await client.post(
            "/v1/memories/search", json={"query": "Bergen", "min_score": 0.05}, headers=ANN
        )
    ).json()
    assert [h["id"] for h in hits["data"]] == [created["id"]]
    hits = (
        await client.post(
            "/v1/memories/search", json={"query": "Oslo", "min_score": 0.05}, headers=ANN
        )
    ).json()
    assert hits["data"] == []

    deleted = await client.delete(f"/v1/memories/{created['id']}", headers=ANN)
    assert deleted.json() == {
        "id": created["id"], "object": "memory.deleted", "deleted": 1, "also_deleted": [],
    }  # fmt: skip
    assert_openai_error(await client.get(f"/v1/memories/{created['id']}", headers=ANN), 404)
    assert await count(client) == 1


async def test_batch_search_stats_and_delete_all(client: httpx.AsyncClient) -> None:
    batch = await client.post("/v1/memories/batch", headers=ANN, json={"memories": [
        {"content": "My dog Rex is a beagle", "type": "fact"},
        {"content": "I love hiking in the mountains", "type": "preference"},
        {"content": "Allergic to peanuts", "type": "fact", "pinned": True},
    ]})  # fmt: skip
    assert batch.status_code == 201 and len(batch.json()["data"]) == 3

    found = await client.post(
        "/v1/memories/search", headers=ANN, json={"query": "what breed is my dog Rex?"}
    )
    data = found.json()["data"]
    assert data[0]["content"] == "My dog Rex is a beagle" and 0 < data[0]["score"] <= 1
    threshold = Settings.model_fields["relevance_threshold"].default
    assert all(h["score"] >= threshold for h in data)  # the relevance threshold is the default
    assert [h["score"] for h in data] == sorted((h["score"] for h in data), reverse=True)
    everything = await client.post(
        "/v1/memories/search", headers=ANN, json={"query": "dog", "min_score": 0, "limit": 100}
    )
    assert len(everything.json()["data"]) == 3  # min_score 0 turns the threshold off
    prefs = await client.post(
        "/v1/memories/search",
        headers=ANN,
        json={"query": "mountains dog", "types": ["preference"], "min_score": 0},
    )
    assert [h["type"] for h in prefs.json()["data"]] == ["preference"]

    stats = (await client.get("/v1/memories/stats", headers=ANN)).json()
    assert stats["total"] == 3 and stats["by_type"] == {"fact": 2, "preference": 1}
    assert stats["pinned"] == 1 and stats["user_id"] == "ann" and stats["index"]["cached"]

    refused = assert_openai_error(
        await client.delete("/v1/memories", headers=ANN), 400, param="confirm"
    )
    assert refused["code"] == "confirmation_required" and await count(client) == 3
    done = await client.delete("/v1/memories", params={"confirm": "true"}, headers=ANN)
    assert done.json()["deleted"] == 3 and await count(client) == 0
    after = await client.post(
        "/v1/memories/search", headers=ANN, json={"query": "dog", "min_score": 0}
    )
    assert after.json()["data"] == []


async def test_export_then_import_is_idempotent_and_keeps_dates(client: httpx.AsyncClient) -> None:
    first = await add(client, "Grew up in Lyon", metadata={"a": 1})
    await add(client, "Plays the cello", type="knowledge")
    export = await client.get("/v1/memories/export", headers=ANN)
    assert export.status_code == 200 and export.headers["content-type"].startswith(
        "application/x-ndjson"
    )
    lines = [orjson.loads(line) for line in export.content.splitlines()]
    assert {m["content"] for m in lines} == {"Grew up in Lyon", "Plays the cello"}

    again = await client.post("/v1/memories/import", content=export.content, headers=ANN)
    assert again.json() == {"imported": 0, "skipped": 2} and await count(client) == 2

    # into another user: new memories there, under ids of bob's (ann's cannot be taken over)
    moved = await client.post("/v1/memories/import", content=export.content, headers=BOB)
    assert moved.json() == {"imported": 2, "skipped": 0}
    bobs = (await client.get("/v1/memories", headers=BOB)).json()["data"]
    assert not {m["id"] for m in bobs} & {m["id"] for m in lines}
    lyon = next(m for m in bobs if m["content"] == "Grew up in Lyon")
    assert lyon["created_at"] == first["created_at"] and lyon["source"] == "import"
    assert lyon["user_id"] == "bob" and lyon["metadata"] == {"a": 1}
    hits = await client.post(
        "/v1/memories/search", headers=BOB, json={"query": "cello", "min_score": 0.05}
    )
    assert [h["content"] for h in hits.json()["data"]] == ["Plays the cello"]


async def test_an_import_that_keeps_ids_keeps_source_and_recall_count(
    client: httpx.AsyncClient,
) -> None:
    """An exported line imported back under its id keeps its `source`, `recall_count` and
    `last_recalled_at` (display only: recall ranks by none of them); its history says it was
    imported. With new ids it is a copy: source `import`, never recalled."""
    memory = await add(client, "Grew up in Lyon")
    line = memory | {"source": "manager", "recall_count": 3,
                     "last_recalled_at": "2026-01-02T03:04:05Z"}  # fmt: skip
    await client.delete(f"/v1/memories/{memory['id']}", headers=ANN)
    raw = orjson.dumps(line) + b"\n"
    put_back = await client.post("/v1/memories/import", content=raw, headers=ANN)
    assert put_back.json() == {"imported": 1, "skipped": 0}
    back = (await client.get(f"/v1/memories/{memory['id']}", headers=ANN)).json()
    assert back["source"] == "manager" and back["recall_count"] == 3
    assert back["last_recalled_at"] == "2026-01-02T03:04:05Z"
    events = (await client.get(f"/v1/memories/{memory['id']}/history", headers=ANN)).json()
    assert [(e["action"], e["actor"]) for e in events["data"]][-1] == ("created", "import")

    copied = await client.post(
        "/v1/memories/import", params={"ids": "new"}, content=raw, headers=ANN
    )
    assert copied.json() == {"imported": 1, "skipped": 0}
    listed = (await client.get("/v1/memories", headers=ANN)).json()["data"]
    copy = next(m for m in listed if m["id"] != memory["id"])
    assert copy["source"] == "import" and copy["recall_count"] == 0
    assert copy["last_recalled_at"] is None

    odd = orjson.dumps({"content": "Owns a kayak", "source": "someone", "recall_count": 2})
    assert (await client.post("/v1/memories/import", content=odd, headers=ANN)).status_code == 200
    listed = (await client.get("/v1/memories", headers=ANN)).json()["data"]
    kayak = next(m for m in listed if m["content"] == "Owns a kayak")
    assert kayak["source"] == "import" and kayak["recall_count"] == 2
    negative = orjson.dumps({"content": "x", "recall_count": -1})
    response = await client.post("/v1/memories/import", content=negative, headers=ANN)
    assert_openai_error(response, 422, param="line 1.recall_count")


async def test_metadata_at_the_limits_is_kept_exported_and_imported(
    client: httpx.AsyncClient,
) -> None:
    """The edges of what is storable stay accepted: 64-bit extremes, 32 levels, astral text."""
    deep: Any = {}
    for _ in range(30):  # 31 levels, in the metadata object (level 1): 32
        deep = {"d": deep}
    metadata = {"max": 2**63 - 1, "min": -(2**63), "deep": deep, "emoji 😀": "naïve ☕ 😀"}
    created = await add(client, "Drinks coffee ☕ daily 😀", metadata=metadata)
    assert created["metadata"] == metadata
    page = (await client.get("/v1/memories", params={"offset": 2**63 - 1}, headers=ANN)).json()
    assert page["data"] == [] and page["total"] == 1 and page["offset"] == 2**63 - 1
    export = await client.get("/v1/memories/export", headers=ANN)
    line = orjson.loads(export.content)
    assert line["metadata"] == metadata
    moved = await client.post("/v1/memories/import", content=export.content, headers=BOB)
    assert moved.json() == {"imported": 1, "skipped": 0}  # under an id of bob's: it is ann's
    (bobs,) = (await client.get("/v1/memories", headers=BOB)).json()["data"]
    assert bobs["metadata"] == metadata and bobs["content"] == created["content"]
