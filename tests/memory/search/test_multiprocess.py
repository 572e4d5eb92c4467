"""Several processes on one database: two apps on one SQLite file, and the CLI writing while an app
serves. Every way an app's search index catches up with another process's writes (a full build,
the rows written since its version, the key list after deletions, the rows fetched by key when a
write lands in the middle of a catch-up) must leave it holding exactly the store's state, seen
through the API and through chat recall; and the same import sent twice at once creates each
memory once and answers both requests."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import respx
from sqlalchemy import event
from sqlalchemy.engine import Engine

from app import cli
from tests.conftest import AppClientFactory
from tests.fakes import FakeEmbedder
from tests.helpers import completion_json

ANN = {"X-User-Id": "ann"}
FIRST = ["My cat Tom is ginger", "I work as a nurse in Oslo", "Favourite food is spicy ramen"]


@pytest.fixture
def route(upstream: respx.Router) -> respx.Route:
    return upstream.post("/chat/completions").respond(json=completion_json())


async def add(client: httpx.AsyncClient, *contents: str) -> list[str]:
    response = await client.post(
        "/v1/memories/batch", json={"memories": [{"content": c} for c in contents]}, headers=ANN
    )
    assert response.status_code == 201, response.text
    return [m["id"] for m in response.json()["data"]]


async def recalled(client: httpx.AsyncClient, route: respx.Route) -> set[str]:
    """What chat recall injects (from the app's index, not the database): every memory, as the
    app under test runs with a relevance threshold of 0."""
    response = await client.post(
        "/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "tell me about me"}]},
        headers=ANN,
    )
    assert response.status_code == 200, response.text
    system = orjson.loads(route.calls.last.request.content)["messages"][0]["content"]
    return {line.split("] ", 1)[1] for line in system.splitlines() if line.startswith("- [")}


async def search(client: httpx.AsyncClient, query: str) -> list[str]:
    response = await client.post(
        "/v1/memories/search", json={"query": query, "min_score": 0.3}, headers=ANN
    )
    assert response.status_code == 200, response.text
    return [hit["content"] for hit in response.json()["data"]]


async def indexed(client: httpx.AsyncClient) -> int:
    """How many memories the app's cached index of the user holds."""
    response = await client.get("/v1/memories/stats", headers=ANN)
    assert response.status_code == 200, response.text
    return int(response.json()["index"]["memories"])


async def assert_sees(client: httpx.AsyncClient, route: respx.Route, expected: set[str]) -> None:
    assert await recalled(client, route) == expected
    assert await indexed(client) == len(expected)
    for content in expected:  # each found by its own words, first
        assert (await search(client, content))[0] == content


async def two_apps(make_client: AppClientFactory) -> tuple[httpx.AsyncClient, httpx.AsyncClient]:
    """App A writes, app B serves, both on the test's database file; both inject every memory."""
    writer = await make_client(relevance_threshold=0.0, recall_limit=20)
    server = await make_client(relevance_threshold=0.0, recall_limit=20)
    return writer, server


Scenario = Callable[[httpx.AsyncClient, list[str]], Any]


async def added(client: httpx.AsyncClient, ids: list[str]) -> set[str]:
    await add(client, "I play the cello on Sundays")
    return {*FIRST, "I play the cello on Sundays"}


async def edited(client: httpx.AsyncClient, ids: list[str]) -> set[str]:
    response = await client.patch(
        f"/v1/memories/{ids[1]}", json={"content": "I work as a pilot in Bergen"}, headers=ANN
    )
    assert response.status_code == 200, response.text
    return {FIRST[0], "I work as a pilot in Bergen", FIRST[2]}


async def deleted(client: httpx.AsyncClient, ids: list[str]) -> set[str]:
    # Not the newest: SQLite gives the newest key to the next insert again, and then the index
    # replaces the deleted memory with the new one without needing the key list.
    response = await client.delete(f"/v1/memories/{ids[0]}", headers=ANN)
    assert response.status_code == 200, response.text
    return {FIRST[1], FIRST[2]}


async def mixed(client: httpx.AsyncClient, ids: list[str]) -> set[str]:
    await deleted(client, ids)
    await added(client, ids)
    await edited(client, ids)
    await add(client, "Allergic to peanuts")
    return {"I work as a pilot in Bergen", FIRST[2], "I play the cello on Sundays",
            "Allergic to peanuts"}  # fmt: skip


@pytest.mark.parametrize("write", [added, edited, deleted, mixed])
async def test_a_second_app_sees_exactly_what_the_first_wrote(
    make_client: AppClientFactory, route: respx.Route, write: Scenario
) -> None:
    writer, server = await two_apps(make_client)
    ids = await add(writer, *FIRST)
    await assert_sees(server, route, set(FIRST))  # B builds its index
    expected = await write(writer, ids)
    await assert_sees(server, route, expected)  # and catches up with A's writes
    if write in (edited, mixed):  # the old words no longer find the edited memory
        assert "I work as a nurse in Oslo" not in await search(server, "nurse Oslo")
    await assert_sees(writer, route, expected)  # A's own index kept up in place


@contextmanager
def writes_midway(marker: str, write: Callable[[], None]) -> Iterator[threading.Event]:
    """Another process's write, run once, right after any engine next runs a statement containing
    `marker`, before it runs its next one. The event loop waits for it (the write runs on a
    thread: the CLI runs its own loop)."""
    done = threading.Event()

    def hook(*args: Any) -> None:
        statement: str = args[2]
        if marker in statement and not done.is_set():
            done.set()
            thread = threading.Thread(target=write)
            thread.start()
            thread.join()

    event.listen(Engine, "after_cursor_execute", hook)
    try:
        yield done
    finally:
        event.remove(Engine, "after_cursor_execute", hook)


def memproxy(*argv: str) -> None:
    assert cli.main(list(argv), embedder=FakeEmbedder()) == 0


async def test_the_cli_writing_while_an_app_serves(
    make_client: AppClientFactory,
    route: respx.Route,
    tmp_path: Path,
) -> None:
    server = await make_client(relevance_threshold=0.0, recall_limit=20)
    ids = await add(server, *FIRST)
    await assert_sees(server, route, set(FIRST))
    await asyncio.to_thread(memproxy, "memories", "add", "--user", "ann", "Allergic to peanuts")
    await asyncio.to_thread(memproxy, "memories", "delete", "--user", "ann", ids[0])
    expected = {FIRST[1], FIRST[2], "Allergic to peanuts"}
    await assert_sees(server, route, expected)

    # A write that lands between the catch-up's read of the new rows and its count of them:
    # the count disagrees, the app lists the keys, drops the deleted memory and fetches the
    # rows it lacks by key.
    await asyncio.to_thread(memproxy, "memories", "delete", "--user", "ann", ids[1])
    await asyncio.to_thread(memproxy, "memories", "add", "--user", "ann", "I play the cello")
    lines = tmp_path / "midway.jsonl"
    lines.write_bytes(b"".join(orjson.dumps({"id": f"00000000-0000-0000-0000-00000000000{n}",
                                             "content": f"Written mid catch-up {n}"}) + b"\n"
                               for n in (1, 2)))  # fmt: skip
    midway = lambda: memproxy("memories", "import", "--user", "ann", str(lines))  # noqa: E731
    with writes_midway("memories.seq >", midway) as done:
        assert await search(server, "cello") == ["I play the cello"]
    assert done.is_set()
    await assert_sees(server, route, {FIRST[2], "Allergic to peanuts", "I play the cello",
                                      "Written mid catch-up 1", "Written mid catch-up 2"})  # fmt: skip


IMPORT = b"".join(
    orjson.dumps({"id": f"00000000-0000-0000-0000-{n:012d}", "content": f"Imported memory {n}"})
    + b"\n"
    for n in range(1, 41)
)


async def imported(client: httpx.AsyncClient) -> dict[str, int]:
    response = await client.post("/v1/memories/import", content=IMPORT, headers=ANN)
    assert response.status_code == 200, response.text
    result: dict[str, int] = response.json()
    return result


async def assert_imported_once(client: httpx.AsyncClient, results: list[dict[str, int]]) -> None:
    assert sum(r["imported"] for r in results) == 40
    assert all(r["imported"] + r["skipped"] == 40 for r in results)
    listed = (await client.get("/v1/memories", params={"limit": 100}, headers=ANN)).json()
    assert listed["total"] == 40
    assert len({m["id"] for m in listed["data"]}) == 40
    stats = (await client.get("/v1/memories/stats", headers=ANN)).json()
    assert stats["version"] == sum(1 for r in results if r["imported"])  # one bump per write
    history = await client.get(
        "/v1/memories/00000000-0000-0000-0000-000000000007/history", headers=ANN
    )
    assert [e["action"] for e in history.json()["data"]] == ["created"]  # skipped: no event


async def test_the_same_import_twice_at_once(client: httpx.AsyncClient) -> None:
    results = await asyncio.gather(imported(client), imported(client))
    await assert_imported_once(client, list(results))
    assert len(await search(client, "Imported memory 7")) >= 1 and await indexed(client) == 40


async def test_the_same_import_through_two_apps_at_once(make_client: AppClientFactory) -> None:
    one, two = await make_client(), await make_client()
    results = await asyncio.gather(imported(one), imported(two), imported(one))
    await assert_imported_once(two, list(results))
    for client in (one, two):
        assert len(await search(client, "Imported memory 7")) >= 1
        assert await indexed(client) == 40


async def test_overlapping_imports_at_once(client: httpx.AsyncClient) -> None:
    async def lines(numbers: range) -> dict[str, int]:
        body = b"".join(
            orjson.dumps({"id": f"00000000-0000-0000-0000-{n:012d}", "content": f"Memory {n}"})
            + b"\n"
            for n in numbers
        )
        response = await client.post("/v1/memories/import", content=body, headers=ANN)
        assert response.status_code == 200, response.text
        result: dict[str, int] = response.json()
        return result

    first, second = await asyncio.gather(lines(range(1, 41)), lines(range(21, 61)))
    assert first["imported"] + first["skipped"] == second["imported"] + second["skipped"] == 40
    assert first["imported"] + second["imported"] == 60
    stats = (await client.get("/v1/memories/stats", headers=ANN)).json()
    assert stats["total"] == 60 and stats["version"] == 2
    assert len(await search(client, "Memory 33")) >= 1 and await indexed(client) == 60


async def test_a_move_by_one_app_reaches_the_other_apps_indexes_of_both_users(
    make_client: AppClientFactory, route: respx.Route
) -> None:
    writer, server = await two_apps(make_client)
    anonymous = {"X-User-Id": "anonymous"}
    await add(writer, *FIRST[:2])
    moved = await writer.post(
        "/v1/memories/batch", json={"memories": [{"content": FIRST[2]}]}, headers=anonymous
    )
    assert moved.status_code == 201, moved.text
    await assert_sees(server, route, set(FIRST[:2]))  # B has both users' indexes cached
    assert [h["content"] for h in (await server.post(
        "/v1/memories/search", json={"query": FIRST[2], "min_score": 0.3}, headers=anonymous
    )).json()["data"]] == [FIRST[2]]  # fmt: skip

    response = await writer.post(
        "/v1/memories/move", json={"from_user": "anonymous", "to_user": "ann"}
    )
    assert response.json()["moved"] == 1
    await assert_sees(server, route, set(FIRST))  # ann's index caught up with what arrived
    left = await server.post(
        "/v1/memories/search", json={"query": FIRST[2], "min_score": 0.0}, headers=anonymous
    )
    assert left.json()["data"] == []  # and anonymous's dropped what left
    await assert_sees(writer, route, set(FIRST))
