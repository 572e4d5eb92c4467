"""The profile in every chat (issue 25, point 6): pinned and profile memories reach the upstream
whatever the question, first, within MEMPROXY_PROFILE_TOKEN_BUDGET (past it: the most recalled,
then the newest), never twice, never as recalls; not with ``X-Memory: off``; no longer once
unmarked. The upstream is respx; the embedder the deterministic fake (it scores "Is vegetarian"
against "What should I cook tonight?" at 0: no shared word). SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest
import respx

from app.memory.block import BLOCK_END, BLOCK_START, FOUND_HEADING, HEADER, PROFILE_HEADING
from tests.conftest import AppClientFactory
from tests.helpers import completion_json
from tests.memory.chat.test_recall_chat import TODAY, chat, remember, sent_messages
from tests.memory.learning.support import until
from tests.memory_api_support import ANN, add

COOK = [{"role": "user", "content": "What should I cook tonight?"}]


@pytest.fixture
def route(upstream: respx.Router) -> respx.Route:
    return upstream.post("/chat/completions").respond(json=completion_json())


def block(*lines: str) -> str:
    return f"{BLOCK_START}\n{HEADER}\n" + "\n".join(lines) + f"\n{BLOCK_END}"


def line(content: str, day: str = TODAY) -> str:
    return f"- [{day}] {content}"


async def patch(client: httpx.AsyncClient, memory: dict[str, Any], **changes: Any) -> None:
    response = await client.patch(f"/v1/memories/{memory['id']}", json=changes, headers=ANN)
    assert response.status_code == 200, response.text


async def test_profile_and_pinned_memories_reach_every_chat_whatever_the_question(
    client: httpx.AsyncClient, route: respx.Route
) -> None:
    await add(client, "Is vegetarian", profile=True)
    await add(client, "Prefers short answers", pinned=True)
    await remember(client, "Lives in Oslo", "Plays chess on Sundays")
    found = await client.post("/v1/memories/search", headers=ANN,
                              json={"query": COOK[0]["content"], "min_score": 0.2})  # fmt: skip
    assert found.json()["data"] == []  # below the threshold: search alone would show nothing

    response = await chat(client, COOK)
    assert response.headers["x-memories-injected"] == "2"
    system, user = sent_messages(route)
    assert system["content"] == block(
        PROFILE_HEADING, line("Prefers short answers"), line("Is vegetarian")
    )  # equally recalled (never): the newest first
    assert user == COOK[0]

    read_only = await chat(client, COOK, headers={**ANN, "X-Memory": "read-only"})
    assert read_only.headers["x-memories-injected"] == "2"
    off = await chat(client, COOK, headers={**ANN, "X-Memory": "off"})
    assert "x-memories-injected" not in off.headers
    assert sent_messages(route) == COOK  # nothing shown, nothing added


async def test_a_memory_is_shown_once_and_the_profile_counts_no_recall(
    client: httpx.AsyncClient, route: respx.Route
) -> None:
    violin = await add(client, "Plays the violin in an orchestra", profile=True)
    (teacher,) = await remember(client, "Violin teacher is called Berg")
    # every word of the question is in a memory: the fake embedder's scores reach the threshold
    response = await chat(client, [{"role": "user", "content": "Violin teacher called?"}])
    assert response.headers["x-memories-injected"] == "2"
    assert sent_messages(route)[0]["content"] == block(
        PROFILE_HEADING, line("Plays the violin in an orchestra"),
        FOUND_HEADING, line("Violin teacher is called Berg"),
    )  # fmt: skip

    async def marked() -> bool:
        got = await client.get(f"/v1/memories/{teacher['id']}", headers=ANN)
        return bool(got.json()["recall_count"] == 1)

    await until(marked)  # the searched memory counts as recalled; the profile's does not
    got = await client.get(f"/v1/memories/{violin['id']}", headers=ANN)
    assert got.json()["recall_count"] == 0


async def test_past_its_budget_the_most_recalled_then_the_newest(
    make_client: AppClientFactory, upstream: respx.Router
) -> None:
    route = upstream.post("/chat/completions").respond(json=completion_json())
    client = await make_client(profile_token_budget=30)  # two lines of ~13 tokens
    lines = [  # same length each: the budget alone cannot choose
        {"content": "Is vegetarian, A", "profile": True, "recall_count": 0,
         "observed_at": "2024-01-01T00:00:00Z"},
        {"content": "Is allergic to B", "profile": True, "recall_count": 0,
         "observed_at": "2025-06-01T00:00:00Z"},
        {"content": "Has two kids: C", "pinned": True, "recall_count": 3,
         "observed_at": "2023-01-01T00:00:00Z"},
    ]  # fmt: skip
    body = b"".join(orjson.dumps(m) + b"\n" for m in lines)
    imported = await client.post("/v1/memories/import", content=body, headers=ANN)
    assert imported.status_code == 200, imported.text
    await chat(client, COOK)
    assert sent_messages(route)[0]["content"] == block(
        PROFILE_HEADING,
        line("Has two kids: C", "2023-01-01"),
        line("Is allergic to B", "2025-06-01"),
    )  # each dated when it was said (observed_at), not when it was imported


async def test_unmarked_memories_are_no_longer_always_shown(
    client: httpx.AsyncClient, route: respx.Route
) -> None:
    veg = await add(client, "Is vegetarian", profile=True)
    short = await add(client, "Prefers short answers", pinned=True)
    (oslo,) = await remember(client, "Lives in Oslo")
    assert (await chat(client, COOK)).headers["x-memories-injected"] == "2"  # the index is built
    await patch(client, veg, profile=False)
    await patch(client, short, pinned=False)
    await patch(client, oslo, profile=True)
    response = await chat(client, COOK)
    assert response.headers["x-memories-injected"] == "1"
    assert sent_messages(route)[0]["content"] == block(PROFILE_HEADING, line("Lives in Oslo"))


async def test_a_budget_of_zero_shows_no_profile(
    make_client: AppClientFactory, upstream: respx.Router
) -> None:
    route = upstream.post("/chat/completions").respond(json=completion_json())
    default = await make_client()  # two apps on one database
    client = await make_client(profile_token_budget=0)
    await add(client, "Is vegetarian", profile=True)
    assert (await chat(default, COOK)).headers["x-memories-injected"] == "1"
    response = await chat(client, COOK)
    assert response.headers["x-memories-injected"] == "0" and sent_messages(route) == COOK
    # recalled as any memory is when the question finds it, under the block's usual header
    await chat(client, [{"role": "user", "content": "Am I vegetarian or not?"}])
    assert sent_messages(route)[0]["content"] == block(line("Is vegetarian"))


async def test_a_chat_without_a_user_message_still_gets_the_profile(
    client: httpx.AsyncClient, route: respx.Route
) -> None:
    await add(client, "Is vegetarian", profile=True)
    response = await chat(client, [{"role": "system", "content": "Suggest a dinner."}])
    assert response.headers["x-memories-injected"] == "1"
    assert sent_messages(route)[0]["content"] == (
        "Suggest a dinner.\n\n" + block(PROFILE_HEADING, line("Is vegetarian"))
    )
