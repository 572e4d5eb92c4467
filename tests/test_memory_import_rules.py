"""What an import makes of a line's date and id, on either database (issue 23, points 8 and 13):
dates with an offset are kept as the instant they name (read back in UTC), dates out of range
refuse the whole import, and an id that belongs to another user gets the import's answer an
unknown one gets (the line is kept under an id of the caller's own; the other user's memory is
untouched). Only the import's answer is promised alike: a read of the id afterwards differs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import httpx
import orjson
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from app.memory.store.memories import MemoryStore
from app.memory.store.records import NewMemory
from tests.helpers import assert_openai_error
from tests.memory_api_support import ANN, BOB, add, count


def lines(*memories: dict[str, Any]) -> bytes:
    return b"".join(orjson.dumps(m) + b"\n" for m in memories)


async def imported(client: httpx.AsyncClient, body: bytes, headers: dict[str, str]) -> Any:
    response = await client.post("/v1/memories/import", content=body, headers=headers)
    return response.status_code, response.json()


async def test_a_date_with_an_offset_reads_back_as_the_same_instant_in_utc(
    client: httpx.AsyncClient,
) -> None:
    body = lines(
        {"content": "Moved to Oslo", "created_at": "2024-05-01T10:00:00+02:00"},
        {"content": "Started the cello", "created_at": "2024-05-02T10:00:00"},  # naive: UTC
        {"content": "Adopted a dog", "created_at": "2024-05-03T23:30:00-14:00"},
    )
    assert await imported(client, body, ANN) == (200, {"imported": 3, "skipped": 0})
    wanted = {
        "Moved to Oslo": "2024-05-01T08:00:00Z",
        "Started the cello": "2024-05-02T10:00:00Z",
        "Adopted a dog": "2024-05-04T13:30:00Z",
    }
    page = (await client.get("/v1/memories", headers=ANN)).json()["data"]
    assert {m["content"]: m["created_at"] for m in page} == wanted
    assert [m["content"] for m in page] == ["Adopted a dog", "Started the cello", "Moved to Oslo"]
    for memory in page:
        got = (await client.get(f"/v1/memories/{memory['id']}", headers=ANN)).json()
        assert got["created_at"] == wanted[got["content"]]
    export = (await client.get("/v1/memories/export", headers=ANN)).content
    exported = [orjson.loads(line) for line in export.splitlines()]
    assert {m["content"]: m["created_at"] for m in exported} == wanted
    # The export read back is the same instants again (and nothing new: idempotent on id).
    assert await imported(client, export, ANN) == (200, {"imported": 0, "skipped": 3})


async def test_the_store_writes_every_date_in_utc(engine: AsyncEngine) -> None:
    """Below the API too: SQLite keeps no offset, so the store converts before it writes."""
    store = MemoryStore(engine)
    local = datetime(2024, 5, 1, 10, tzinfo=timezone(timedelta(hours=2)))
    naive = datetime(2024, 5, 2, 10)
    written = await store.add(
        "ann", [NewMemory("a", created_at=local), NewMemory("b", created_at=naive)]
    )
    for record, wanted in zip(written.records, (8, 10), strict=True):
        read = await store.get("ann", record.id)
        assert read is not None and read.created_at.hour == wanted
        assert read.created_at.utcoffset() == timedelta(0)


@pytest.mark.parametrize(
    "when",
    [
        "9999-12-31T23:59:59-14:00",
        "9999-12-31T23:59:59Z",
        "1969-12-31T23:59:59Z",
        "0001-01-01T00:00:00+14:00",
        "in two days",
    ],
)
async def test_a_date_out_of_range_refuses_the_whole_import(
    client: httpx.AsyncClient, when: str
) -> None:
    if when == "in two days":
        when = (datetime.now(UTC) + timedelta(days=2)).isoformat()
    body = lines(
        {"content": "Fine", "created_at": "2024-05-01T10:00:00Z"},
        {"content": "Out of range", "created_at": when},
    )
    response = await client.post("/v1/memories/import", content=body, headers=ANN)
    error = assert_openai_error(response, 422, param="line 2.created_at")
    assert "created_at" in error["message"] and "1970" in error["message"]
    assert await count(client) == 0  # all or nothing, as for any bad line


async def test_the_edges_of_the_range_are_accepted(client: httpx.AsyncClient) -> None:
    soon = (datetime.now(UTC) + timedelta(hours=12)).replace(microsecond=0)
    body = lines(
        {"content": "At the epoch", "created_at": "1970-01-01T00:00:00Z"},
        {"content": "Later today", "created_at": soon.isoformat()},
    )
    assert await imported(client, body, ANN) == (200, {"imported": 2, "skipped": 0})
    page = (await client.get("/v1/memories", headers=ANN)).json()["data"]
    assert {m["content"]: m["created_at"] for m in page} == {
        "At the epoch": "1970-01-01T00:00:00Z",
        "Later today": soon.isoformat().replace("+00:00", "Z"),
    }


async def test_another_user_s_id_is_answered_as_an_unknown_one(client: httpx.AsyncClient) -> None:
    ann = await add(client, "Lives in Oslo")
    history = (await client.get(f"/v1/memories/{ann['id']}/history", headers=ANN)).json()
    unknown = "0f0f0f0f-0000-4000-8000-000000000001"
    taken_line = lines({"id": ann["id"], "content": "Lives in Rome"})
    unknown_line = lines({"id": unknown, "content": "Lives in Rome"})

    taken = await client.post("/v1/memories/import", content=taken_line, headers=BOB)
    fresh = await client.post("/v1/memories/import", content=unknown_line, headers=BOB)
    assert (taken.status_code, taken.json()) == (fresh.status_code, fresh.json())
    assert taken.json() == {"imported": 1, "skipped": 0}
    assert taken.headers.keys() == fresh.headers.keys()
    # Read again, each is skipped alike (the copy of the taken id is kept under an id of bob's).
    again = [await imported(client, body, BOB) for body in (taken_line, unknown_line)]
    assert again == [(200, {"imported": 0, "skipped": 1})] * 2
    bobs = (await client.get("/v1/memories", headers=BOB)).json()["data"]
    assert sorted(m["content"] for m in bobs) == ["Lives in Rome", "Lives in Rome"]
    assert ann["id"] not in {m["id"] for m in bobs} and unknown in {m["id"] for m in bobs}
    for memory in bobs:  # neither says where it came from
        (event,) = (await client.get(f"/v1/memories/{memory['id']}/history", headers=BOB)).json()[
            "data"
        ]
        assert (event["action"], event["actor"], event["detail"]) == ("created", "import", None)

    # ann's memory is untouched: same content, owner and history; bob cannot reach it
    assert (await client.get(f"/v1/memories/{ann['id']}", headers=ANN)).json() == ann
    after = (await client.get(f"/v1/memories/{ann['id']}/history", headers=ANN)).json()
    assert after == history and await count(client, ANN) == 1
    assert_openai_error(await client.get(f"/v1/memories/{ann['id']}", headers=BOB), 404)
    # As README says: only the import's answer is alike; the unknown id is bob's now.
    assert (await client.get(f"/v1/memories/{unknown}", headers=BOB)).status_code == 200


async def test_a_whole_export_imported_by_another_user_is_copied_once(
    client: httpx.AsyncClient,
) -> None:
    for text in ("Grew up in Lyon", "Plays the cello"):
        await add(client, text)
    export = (await client.get("/v1/memories/export", headers=ANN)).content
    assert await imported(client, export, BOB) == (200, {"imported": 2, "skipped": 0})
    assert await imported(client, export, BOB) == (200, {"imported": 0, "skipped": 2})
    assert await count(client, BOB) == 2 and await count(client, ANN) == 2
