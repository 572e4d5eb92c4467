"""`remember` stores a statement once, however many calls send it at once (issue 23, point 9):
the look for the same text and the insert are one write holding the user's lock, so 40
concurrent calls, split between two apps on one database (two replicas), store one memory and
exactly one of them answers ``already_existed: false``. On SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from app.memory.store.records import NewMemory
from tests.conftest import AppClientFactory
from tests.memory_api_support import ANN, BOB, add, count

JSON_RPC = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
CALLS = 40


def remember(number: int, content: str) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": number,
        "method": "tools/call",
        "params": {"name": "remember", "arguments": {"content": content}},
    }


async def remembered(client: httpx.AsyncClient, number: int, text: str, who: dict[str, str]) -> Any:
    response = await client.post("/mcp", json=remember(number, text), headers=JSON_RPC | who)
    assert response.status_code == 200, response.text
    result = response.json()["result"]
    assert not result["isError"], result
    return result["structuredContent"]


async def test_forty_concurrent_remembers_of_one_text_store_it_once(
    make_client: AppClientFactory,
) -> None:
    replicas = [await make_client(), await make_client()]  # two apps, one database
    texts = ["The user plays chess", "the user  PLAYS chess"]  # the same words
    answers = await asyncio.gather(*(
        remembered(replicas[i % 2], i, texts[i % 3 % 2], ANN) for i in range(CALLS)
    ))  # fmt: skip
    assert [a["already_existed"] for a in answers].count(False) == 1
    assert len({a["id"] for a in answers}) == 1
    assert await count(replicas[0]) == 1 and await count(replicas[1]) == 1
    (memory,) = (await replicas[0].get("/v1/memories", headers=ANN)).json()["data"]
    history = (await replicas[0].get(f"/v1/memories/{memory['id']}/history", headers=ANN)).json()
    assert [e["action"] for e in history["data"]] == ["created"]
    # Another user, and another text, are not the same statement.
    bob = await remembered(replicas[1], 99, texts[0], BOB)
    other = await remembered(replicas[1], 100, "The user plays chess well", ANN)
    assert not bob["already_existed"] and not other["already_existed"]
    assert await count(replicas[0]) == 2 and await count(replicas[0], BOB) == 1


async def test_the_memory_api_s_create_still_stores_every_call(
    make_client: AppClientFactory,
) -> None:
    """POST /v1/memories never looked for the same text (a client may mean two memories); it
    keeps doing so, and has no such race to lose."""
    client = await make_client()
    await asyncio.gather(*(add(client, "The user plays chess") for _ in range(5)))
    assert await count(client) == 5


async def test_the_store_s_once_under_concurrency_and_within_one_batch(
    make_client: AppClientFactory,
) -> None:
    client = await make_client()
    services = client._transport.app.state.services  # type: ignore[attr-defined]
    store = services.store
    before = await store.version("ann")
    written = await asyncio.gather(*(
        store.add("ann", [NewMemory("Has a cat named Tom")], once=True) for _ in range(CALLS)
    ))  # fmt: skip
    assert sum(w.created[0] for w in written) == 1
    assert await store.version("ann") == before + 1  # one write bumped; the others gave back
    batch = await store.add(
        "ann", [NewMemory("Likes tea"), NewMemory("likes  TEA"), NewMemory("HAS a cat named tom")],
        once=True,
    )  # fmt: skip
    assert batch.created == [True, False, False]
    assert (
        batch.records[0] == batch.records[1] and batch.records[2].content == "Has a cat named Tom"
    )
    assert await count(client) == 2


@pytest.mark.parametrize(
    "texts",
    [
        ("Люблю чай", "люблю  ЧАЙ"),  # the issue's: instr(lower('Люблю чай'), 'люблю') = 0
        ("Παίζει πιάνο κάθε μέρα", "ΠΑΊΖΕΙ πιάνο κάθε  μέρα"),  # Greek, accented
        ("毎朝緑茶を飲む", "毎朝緑茶を飲む"),  # no spaces, no case
    ],
)
async def test_forty_concurrent_remembers_of_a_non_ascii_text_store_it_once(
    make_client: AppClientFactory, texts: tuple[str, str]
) -> None:
    """SQLite's lower() lowercases ASCII letters only: the look for the same text must not
    lowercase the stored text in the database where the word it looks for is not ASCII."""
    replicas = [await make_client(), await make_client()]
    answers = await asyncio.gather(*(
        remembered(replicas[i % 2], i, texts[i % 3 % 2], ANN) for i in range(CALLS)
    ))  # fmt: skip
    assert [a["already_existed"] for a in answers].count(False) == 1
    assert len({a["id"] for a in answers}) == 1
    assert await count(replicas[0]) == 1
    # Written in another case later, it is the same statement still.
    again = await remembered(replicas[1], 99, texts[0].upper(), ANN)
    assert again["already_existed"] and again["id"] == answers[0]["id"]
