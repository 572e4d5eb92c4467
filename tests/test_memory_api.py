"""The memory API over a real SQLite file (fake embedder): every route, user isolation on every
route, and every bad input answered with an OpenAI-shaped 4xx that changes nothing."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest

from app.config import Settings
from tests.conftest import AppClientFactory
from tests.helpers import assert_openai_error

ANN = {"X-User-Id": "ann"}
BOB = {"X-User-Id": "bob"}


async def add(
    client: httpx.AsyncClient, content: str, headers: dict[str, str] = ANN, **extra: Any
) -> dict[str, Any]:
    response = await client.post(
        "/v1/memories", json={"content": content, **extra}, headers=headers
    )
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


async def count(client: httpx.AsyncClient, headers: dict[str, str] = ANN) -> int:
    response = await client.get("/v1/memories", headers=headers)
    assert response.status_code == 200, response.text
    return int(response.json()["total"])


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
    assert deleted.json() == {"id": created["id"], "object": "memory.deleted", "deleted": 1}
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

    # into another user: new memories there, the same ids cannot be taken over
    taken = await client.post("/v1/memories/import", content=export.content, headers=BOB)
    assert_openai_error(taken, 409, param="id")
    assert await count(client, BOB) == 0
    fresh = [{**m, "id": f"bob-{i}"} for i, m in enumerate(lines)]
    moved = await client.post("/v1/memories/import", headers=BOB,
                              content=b"\n".join(orjson.dumps(m) for m in fresh) + b"\n\n")  # fmt: skip
    assert moved.json() == {"imported": 2, "skipped": 0}
    bobs = (await client.get("/v1/memories", headers=BOB)).json()["data"]
    lyon = next(m for m in bobs if m["content"] == "Grew up in Lyon")
    assert lyon["created_at"] == first["created_at"] and lyon["source"] == "import"
    assert lyon["user_id"] == "bob" and lyon["metadata"] == {"a": 1}
    hits = await client.post(
        "/v1/memories/search", headers=BOB, json={"query": "cello", "min_score": 0.05}
    )
    assert [h["content"] for h in hits.json()["data"]] == ["Plays the cello"]


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
    assert moved.status_code == 409  # the id is ann's; under a fresh id bob gets the same
    fresh = orjson.dumps({**line, "id": "bob-1"})
    assert (await client.post("/v1/memories/import", content=fresh, headers=BOB)).json() == {
        "imported": 1, "skipped": 0}  # fmt: skip
    (bobs,) = (await client.get("/v1/memories", headers=BOB)).json()["data"]
    assert bobs["metadata"] == metadata and bobs["content"] == created["content"]


async def test_no_user_can_reach_another_users_memories(client: httpx.AsyncClient) -> None:
    secret = await add(client, "Ann's bank PIN hint is the cat's name")
    await add(client, "Bob likes chess", BOB)
    path = f"/v1/memories/{secret['id']}"

    assert_openai_error(await client.get(path, headers=BOB), 404)
    assert_openai_error(await client.patch(path, json={"content": "owned"}, headers=BOB), 404)
    assert_openai_error(await client.delete(path, headers=BOB), 404)
    listed = (await client.get("/v1/memories", params={"q": "PIN"}, headers=BOB)).json()
    assert listed["total"] == 0
    found = await client.post(
        "/v1/memories/search", json={"query": "bank PIN cat", "min_score": 0}, headers=BOB
    )
    assert [h["content"] for h in found.json()["data"]] == ["Bob likes chess"]
    exported = (await client.get("/v1/memories/export", headers=BOB)).content
    assert b"PIN" not in exported and b"chess" in exported
    stats = (await client.get("/v1/memories/stats", headers=BOB)).json()
    assert stats["total"] == 1 and stats["user_id"] == "bob"
    await client.delete("/v1/memories", params={"confirm": "true"}, headers=BOB)

    assert (await client.get(path, headers=ANN)).json()["content"] == secret["content"]
    assert await count(client, ANN) == 1


async def test_admin_keys_name_the_user_and_other_keys_cannot(
    make_client: AppClientFactory,
) -> None:
    client = await make_client(api_keys=["sk-ann:ann", "sk-any"], admin_keys=["sk-admin"])
    as_ann = {"Authorization": "Bearer sk-ann"}
    created = await add(client, "Ann's own memory", as_ann)
    assert created["user_id"] == "ann"

    admin = {"Authorization": "Bearer sk-admin"}
    listed = await client.get("/v1/memories", params={"user": "ann"}, headers=admin)
    assert [m["id"] for m in listed.json()["data"]] == [created["id"]]
    made = await client.post(
        "/v1/memories", params={"user": "carl"}, json={"content": "for carl"}, headers=admin
    )
    assert made.status_code == 201 and made.json()["user_id"] == "carl"

    for headers in (as_ann, {"Authorization": "Bearer sk-any"}):
        denied = await client.get("/v1/memories", params={"user": "carl"}, headers=headers)
        assert_openai_error(denied, 403, param="user")
    # a bound key cannot borrow another user through the headers either (as in chat)
    assert_openai_error(
        await client.get("/v1/memories", headers={**as_ann, "X-User-Id": "carl"}), 403
    )
    assert_openai_error(
        await client.get("/v1/memories", headers={"Authorization": "Bearer nope"}), 401
    )
    assert_openai_error(await client.get("/v1/memories"), 401)
    assert_openai_error(
        await client.get("/v1/memories", params={"user": "  "}, headers=admin), 400, param="user"
    )
    # the admin key is for the memory API only
    assert_openai_error(
        await client.post(
            "/v1/chat/completions", json={"model": "m", "messages": []}, headers=admin
        ),
        401,
    )


BAD_REQUESTS = [
    ("empty content", "POST", "/v1/memories", {"content": ""}, 422, "content"),
    ("blank content", "POST", "/v1/memories", {"content": "   \n"}, 422, "content"),
    ("content too long", "POST", "/v1/memories", {"content": "x" * 201}, 422, "content"),
    ("content not a string", "POST", "/v1/memories", {"content": 5}, 422, "content"),
    ("missing content", "POST", "/v1/memories", {"type": "fact"}, 422, "content"),
    ("unknown type", "POST", "/v1/memories", {"content": "a", "type": "secret"}, 422, "type"),
    ("unknown field", "POST", "/v1/memories", {"content": "a", "pined": True}, 422, "pined"),
    (
        "metadata not an object",
        "POST",
        "/v1/memories",
        {"content": "a", "metadata": [1]},
        422,
        "metadata",
    ),
    (
        "metadata too large",
        "POST",
        "/v1/memories",
        {"content": "a", "metadata": {"k": "v" * 20000}},
        422,
        "metadata",
    ),
    ("empty batch", "POST", "/v1/memories/batch", {"memories": []}, 422, "memories"),
    (
        "batch over 1000",
        "POST",
        "/v1/memories/batch",
        {"memories": [{"content": "a"}] * 1001},
        422,
        "memories",
    ),
    (
        "bad item in batch",
        "POST",
        "/v1/memories/batch",
        {"memories": [{"content": "a"}, {"content": ""}]},
        422,
        "memories.1.content",
    ),
    (
        "long item in batch",
        "POST",
        "/v1/memories/batch",
        {"memories": [{"content": "a"}, {"content": "y" * 300}]},
        422,
        "memories.1.content",
    ),
    ("search without query", "POST", "/v1/memories/search", {"limit": 5}, 422, "query"),
    ("search blank query", "POST", "/v1/memories/search", {"query": " "}, 422, "query"),
    ("search limit 0", "POST", "/v1/memories/search", {"query": "a", "limit": 0}, 422, "limit"),
    ("search limit 101", "POST", "/v1/memories/search", {"query": "a", "limit": 101}, 422, "limit"),
    (
        "search min_score 2",
        "POST",
        "/v1/memories/search",
        {"query": "a", "min_score": 2},
        422,
        "min_score",
    ),
    (
        "search unknown type",
        "POST",
        "/v1/memories/search",
        {"query": "a", "types": ["nope"]},
        422,
        "types.0",
    ),
    ("list limit 0", "GET", "/v1/memories?limit=0", None, 422, "query.limit"),
    ("list negative offset", "GET", "/v1/memories?offset=-1", None, 422, "query.offset"),
    ("list unknown type", "GET", "/v1/memories?type=nope", None, 422, "query.type.0"),
    (
        "unknown id",
        "GET",
        "/v1/memories/00000000-0000-0000-0000-000000000000",
        None,
        404,
        "memory_id",
    ),
    ("malformed id", "GET", "/v1/memories/%20..%2F", None, 404, "memory_id"),
    ("patch unknown id", "PATCH", "/v1/memories/nope", {"content": "a"}, 404, "memory_id"),
    ("delete unknown id", "DELETE", "/v1/memories/nope", None, 404, "memory_id"),
    ("patch nothing", "PATCH", "/v1/memories/{id}", {}, 400, None),
    ("patch null content", "PATCH", "/v1/memories/{id}", {"content": None}, 422, "content"),
    ("patch blank content", "PATCH", "/v1/memories/{id}", {"content": ""}, 422, "content"),
    ("patch long content", "PATCH", "/v1/memories/{id}", {"content": "z" * 201}, 422, "content"),
    ("patch unknown type", "PATCH", "/v1/memories/{id}", {"type": "x"}, 422, "type"),
    ("import nothing", "POST", "/v1/memories/import", b"\n\n", 400, None),
    (
        "import not JSON",
        "POST",
        "/v1/memories/import",
        b'{"id": "a1", "content": "ok"}\nnot json\n',
        422,
        "line 2",
    ),
    ("import without id", "POST", "/v1/memories/import", b'{"content": "ok"}\n', 422, "line 1.id"),
    (
        "import bad id",
        "POST",
        "/v1/memories/import",
        b'{"id": "../x", "content": "ok"}\n',
        422,
        "line 1.id",
    ),
    (
        "import long content",
        "POST",
        "/v1/memories/import",
        b'{"id": "a2", "content": "' + b"w" * 300 + b'"}\n',
        422,
        "line 1.content",
    ),
    ("delete all unconfirmed", "DELETE", "/v1/memories?confirm=false", None, 400, "confirm"),
    ("bad user header", "GET", "/v1/memories", None, 400, "X-User-Id"),
    # What Python's JSON parser accepts and memproxy cannot store or write back (were 500s).
    (
        "metadata int over 64 bits",
        "POST",
        "/v1/memories",
        {"content": "a", "metadata": {"n": 2**63}},
        422,
        "metadata",
    ),
    (
        "metadata int under 64 bits",
        "POST",
        "/v1/memories",
        {"content": "a", "metadata": {"n": [-(2**63) - 1]}},
        422,
        "metadata",
    ),
    (
        "metadata huge int",
        "POST",
        "/v1/memories",
        {"content": "a", "metadata": {"n": 10**40}},
        422,
        "metadata",
    ),
    (
        "batch metadata int over 64 bits",
        "POST",
        "/v1/memories/batch",
        {"memories": [{"content": "a", "metadata": {"n": 2**64}}]},
        422,
        "memories.0.metadata",
    ),
    (
        "patch metadata int over 64 bits",
        "PATCH",
        "/v1/memories/{id}",
        {"metadata": {"n": 2**70}},
        422,
        "metadata",
    ),
    (
        "metadata nested 300 deep",
        "POST",
        "/v1/memories",
        b'{"content": "a", "metadata": {"a": ' + b"[" * 300 + b"]" * 300 + b"}}",
        422,
        "metadata",
    ),
    (
        "metadata nested 33 deep",
        "POST",
        "/v1/memories",
        b'{"content": "a", "metadata": {"a": ' + b"[" * 32 + b"]" * 32 + b"}}",
        422,
        "metadata",
    ),
    (
        "metadata NaN",
        "POST",
        "/v1/memories",
        b'{"content": "a", "metadata": {"x": NaN}}',
        422,
        "metadata",
    ),
    ("content lone surrogate", "POST", "/v1/memories", b'{"content": "a\\ud800"}', 422, "content"),
    (
        "content lone low surrogate",
        "POST",
        "/v1/memories",
        b'{"content": "\\udfffa"}',
        422,
        "content",
    ),
    (
        "metadata key lone surrogate",
        "POST",
        "/v1/memories",
        b'{"content": "a", "metadata": {"\\ud800": 1}}',
        422,
        "metadata",
    ),
    (
        "metadata value lone surrogate",
        "POST",
        "/v1/memories",
        b'{"content": "a", "metadata": {"k": ["\\ud800"]}}',
        422,
        "metadata",
    ),
    (
        "unknown field lone surrogate",
        "POST",
        "/v1/memories",
        b'{"content": "a", "\\ud800": 1}',
        422,
        "\\ud800",
    ),
    (
        "batch content lone surrogate",
        "POST",
        "/v1/memories/batch",
        b'{"memories": [{"content": "\\ud800"}]}',
        422,
        "memories.0.content",
    ),
    (
        "patch content lone surrogate",
        "PATCH",
        "/v1/memories/{id}",
        b'{"content": "x\\ud800"}',
        422,
        "content",
    ),
    (
        "search lone surrogate",
        "POST",
        "/v1/memories/search",
        b'{"query": "x\\ud800"}',
        422,
        "query",
    ),
    (
        "list offset 2^63",
        "GET",
        "/v1/memories?offset=9223372036854775808",
        None,
        422,
        "query.offset",
    ),
    ("list offset huge", "GET", f"/v1/memories?offset={10**30}", None, 422, "query.offset"),
    ("list limit huge", "GET", f"/v1/memories?limit={10**30}", None, 422, "query.limit"),
    (
        "import int over 64 bits",
        "POST",
        "/v1/memories/import",
        b'{"id": "b1", "content": "ok", "metadata": {"n": 18446744073709551616}}\n',
        422,
        "line 1.metadata",
    ),
    (
        "import lone surrogate",
        "POST",
        "/v1/memories/import",
        b'{"id": "b2", "content": "ok"}\n{"id": "b3", "content": "o\\ud800k"}\n',
        422,
        "line 2.content",
    ),
    (
        "import metadata nested 40 deep",
        "POST",
        "/v1/memories/import",
        b'{"id": "b4", "content": "ok", "metadata": {"a": ' + b"[" * 40 + b"]" * 40 + b"}}\n",
        422,
        "line 1.metadata",
    ),
]


@pytest.mark.parametrize(("method", "path", "body", "status", "param"),
                         [case[1:] for case in BAD_REQUESTS], ids=[case[0] for case in BAD_REQUESTS])  # fmt: skip
async def test_bad_input_is_an_openai_error_and_changes_nothing(
    make_client: AppClientFactory, method: str, path: str, body: Any, status: int, param: str | None
) -> None:
    client = await make_client(memory_max_chars=200)
    kept = await add(client, "the one memory that must survive")
    headers = {**ANN, "X-User-Id": "bad\x01user"} if param == "X-User-Id" else ANN
    kwargs: dict[str, Any] = {"headers": headers}
    if isinstance(body, bytes):
        kwargs["content"] = body
        if not path.endswith("/import"):
            kwargs["headers"] = {**headers, "content-type": "application/json"}
    elif body is not None:
        kwargs["json"] = body
    response = await client.request(method, path.replace("{id}", kept["id"]), **kwargs)
    assert_openai_error(response, status, param=param)
    assert (await client.get(f"/v1/memories/{kept['id']}", headers=ANN)).json() == kept
    assert await count(client) == 1
    assert (await client.get("/healthz")).status_code == 200


async def test_broken_json_body_is_400(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v1/memories", content=b'{"content": ', headers={**ANN, "content-type": "application/json"}
    )
    assert assert_openai_error(response, 400)["code"] == "invalid_json"
    assert await count(client) == 0
