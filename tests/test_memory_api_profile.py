"""A memory's `observed_at` (when what it says was said) and `profile` (a standing fact about the
person) through the memory API (issue 25, points 5 and 6): set on create, batch and update,
shown in every answer, a filter on the list, kept by export and import (a line of an export
from before: said when written, no profile); bad values are an OpenAI-shaped 422 naming the
field, and write nothing. On SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import orjson
import pytest

from tests.conftest import AppClientFactory
from tests.helpers import assert_openai_error
from tests.memory_api_support import ANN, BOB, add, count

SAID = "2024-05-01T09:30:00+02:00"
SAID_UTC = "2024-05-01T07:30:00Z"


def lines(*memories: dict[str, Any]) -> bytes:
    return b"".join(orjson.dumps(m) + b"\n" for m in memories)


async def listed(client: httpx.AsyncClient, **params: Any) -> list[str]:
    response = await client.get("/v1/memories", params=params, headers=ANN)
    assert response.status_code == 200, response.text
    return [m["content"] for m in response.json()["data"]]


async def test_create_batch_update_show_and_filter(client: httpx.AsyncClient) -> None:
    veg = await add(client, "Is vegetarian", profile=True, observed_at=SAID)
    assert (veg["profile"], veg["observed_at"]) == (True, SAID_UTC)
    assert veg["created_at"] > veg["observed_at"]  # written now, said then
    plain = await add(client, "Asked about trains")
    assert plain["profile"] is False and plain["observed_at"] == plain["created_at"]
    got = (await client.get(f"/v1/memories/{veg['id']}", headers=ANN)).json()
    assert got == veg

    batch = await client.post("/v1/memories/batch", headers=ANN, json={"memories": [
        {"content": "Has two kids", "profile": True},
        {"content": "I'm off to Rome", "type": "episode", "observed_at": "2023-12-31T23:00:00Z"},
    ]})  # fmt: skip
    assert batch.status_code == 201, batch.text
    kids, rome = batch.json()["data"]
    assert (kids["profile"], rome["type"], rome["observed_at"]) == (
        True, "episode", "2023-12-31T23:00:00Z",
    )  # fmt: skip

    assert sorted(await listed(client, profile="true")) == ["Has two kids", "Is vegetarian"]
    assert sorted(await listed(client, profile="false")) == [
        "Asked about trains",
        "I'm off to Rome",
    ]
    assert await listed(client, type="episode") == ["I'm off to Rome"]
    assert await listed(client, type="fact", profile="true", q="kids") == ["Has two kids"]

    patched = await client.patch(
        f"/v1/memories/{plain['id']}", headers=ANN,
        json={"profile": True, "observed_at": "2024-01-02T03:04:05-05:00"},
    )  # fmt: skip
    assert patched.status_code == 200, patched.text
    body = patched.json()
    assert (body["profile"], body["observed_at"]) == (True, "2024-01-02T08:04:05Z")
    assert (body["content"], body["created_at"]) == (plain["content"], plain["created_at"])
    history = (await client.get(f"/v1/memories/{plain['id']}/history", headers=ANN)).json()
    assert history["data"][-1]["detail"].startswith("profile, observed ")
    unmarked = await client.patch(f"/v1/memories/{veg['id']}", headers=ANN, json={"profile": False})
    assert unmarked.json()["profile"] is False and unmarked.json()["observed_at"] == SAID_UTC
    stats = (await client.get("/v1/memories/stats", headers=ANN)).json()
    assert (stats["profile"], stats["by_type"]["episode"]) == (2, 1)


async def test_export_and_import_keep_both(client: httpx.AsyncClient) -> None:
    await add(client, "Is vegetarian", profile=True, observed_at=SAID)
    await add(client, "Said hello", type="episode")
    export = (await client.get("/v1/memories/export", headers=ANN)).content
    exported = {m["content"]: m for m in map(orjson.loads, export.splitlines())}
    assert exported["Is vegetarian"]["observed_at"] == SAID_UTC
    for ids in ("keep", "new"):  # bob's copy, then ann's own back (nothing new: same ids)
        headers = BOB if ids == "new" else ANN
        response = await client.post(
            "/v1/memories/import", params={"ids": ids}, content=export, headers=headers
        )
        assert response.status_code == 200, response.text
    bob = (await client.get("/v1/memories", headers=BOB)).json()["data"]
    copied = {m["content"]: (m["type"], m["profile"], m["observed_at"]) for m in bob}
    original = {c: (m["type"], m["profile"], m["observed_at"]) for c, m in exported.items()}
    assert copied == original
    assert await count(client) == 2


async def test_an_import_from_before_is_said_when_written_and_no_profile(
    client: httpx.AsyncClient,
) -> None:
    before = datetime.now(UTC) - timedelta(seconds=5)
    body = lines(
        {"content": "Dated", "created_at": "2022-03-04T05:06:07Z", "pinned": True},
        {"content": "Undated"},
        {
            "content": "Naive",
            "created_at": "2022-03-04T05:06:07",
            "observed_at": "2021-01-01T00:00",
        },
    )
    response = await client.post("/v1/memories/import", content=body, headers=ANN)
    assert response.json() == {"imported": 3, "skipped": 0}
    got = {m["content"]: m for m in (await client.get("/v1/memories", headers=ANN)).json()["data"]}
    assert got["Dated"]["observed_at"] == "2022-03-04T05:06:07Z" and not got["Dated"]["profile"]
    assert datetime.fromisoformat(got["Undated"]["observed_at"]) >= before
    assert got["Naive"]["observed_at"] == "2021-01-01T00:00:00Z"  # in a line, naive is UTC


BAD = [
    ("naive", "POST", "/v1/memories", {"content": "a", "observed_at": "2024-05-01T10:00:00"},
     "observed_at"),
    ("future", "POST", "/v1/memories", {"content": "a", "observed_at": "2999-01-01T00:00:00Z"},
     "observed_at"),
    ("not a date", "POST", "/v1/memories", {"content": "a", "observed_at": "yesterday"},
     "observed_at"),
    ("before 1970", "POST", "/v1/memories", {"content": "a", "observed_at": "1969-12-31T23:00Z"},
     "observed_at"),
    ("profile a string", "POST", "/v1/memories", {"content": "a", "profile": "true"}, "profile"),
    ("profile a number", "POST", "/v1/memories", {"content": "a", "profile": 1}, "profile"),
    ("batch naive", "POST", "/v1/memories/batch", {"memories": [
        {"content": "a"}, {"content": "b", "observed_at": "2024-05-01"}]}, "memories.1.observed_at"),
    ("patch naive", "PATCH", "/v1/memories/{id}", {"observed_at": "2024-05-01T10:00:00"},
     "observed_at"),
    ("patch future", "PATCH", "/v1/memories/{id}", {"observed_at": "2999-01-01T00:00:00+14:00"},
     "observed_at"),
    ("patch null", "PATCH", "/v1/memories/{id}", {"observed_at": None}, "observed_at"),
    ("patch profile null", "PATCH", "/v1/memories/{id}", {"profile": None}, "profile"),
    ("patch profile yes", "PATCH", "/v1/memories/{id}", {"profile": "yes"}, "profile"),
    ("list profile maybe", "GET", "/v1/memories?profile=maybe", None, "query.profile"),
    ("import future", "POST", "/v1/memories/import",
     lines({"content": "a"}, {"content": "b", "observed_at": "2999-01-01T00:00:00Z"}),
     "line 2.observed_at"),
    ("import profile text", "POST", "/v1/memories/import", lines({"content": "a", "profile": "no"}),
     "line 1.profile"),
]  # fmt: skip


@pytest.mark.parametrize(("method", "path", "body", "param"), [c[1:] for c in BAD],
                         ids=[c[0] for c in BAD])  # fmt: skip
async def test_a_bad_date_or_mark_is_a_422_naming_it_and_writes_nothing(
    make_client: AppClientFactory, method: str, path: str, body: Any, param: str
) -> None:
    client = await make_client()
    kept = await add(client, "the one memory that must survive")
    kwargs: dict[str, Any] = {"headers": ANN}
    if isinstance(body, bytes):
        kwargs["content"] = body
    elif body is not None:
        kwargs["json"] = body
    response = await client.request(method, path.replace("{id}", kept["id"]), **kwargs)
    error = assert_openai_error(response, 422, param=param)
    if "2999" in str(body):
        assert "between 1970-01-01 and a day from now" in error["message"]
    if "T10:00:00'" in str(body):  # naive
        assert "timezone" in error["message"]
    assert (await client.get(f"/v1/memories/{kept['id']}", headers=ANN)).json() == kept
    assert await count(client) == 1
