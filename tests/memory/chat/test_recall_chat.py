"""Chat recall end to end in-process: the user's memories reach the upstream in the system message
(format, dedup, threshold, limit, budget), only for chat requests, and a failing recall never
fails the chat. The upstream is respx; the embedder the deterministic fake."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import respx
from fastapi import FastAPI

from app.memory.block import BLOCK_END, BLOCK_START, HEADER
from tests.conftest import AppClientFactory
from tests.fakes import FakeEmbedder
from tests.helpers import completion_json, sse, sse_response

ANN = {"X-User-Id": "ann"}
TODAY = datetime.now(UTC).date().isoformat()


def app_of(client: httpx.AsyncClient) -> FastAPI:
    transport = client._transport
    assert isinstance(transport, httpx.ASGITransport)
    app = transport.app
    assert isinstance(app, FastAPI)
    return app


async def remember(
    client: httpx.AsyncClient, *contents: str, user: str = "ann"
) -> list[dict[str, Any]]:
    response = await client.post(
        "/v1/memories/batch",
        json={"memories": [{"content": c} for c in contents]},
        headers={"X-User-Id": user},
    )
    assert response.status_code == 201, response.text
    data: list[dict[str, Any]] = response.json()["data"]
    return data


def sent_messages(route: respx.Route) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = orjson.loads(route.calls.last.request.content)["messages"]
    return messages


async def chat(
    client: httpx.AsyncClient,
    messages: list[dict[str, Any]],
    headers: dict[str, str] = ANN,
    **extra: Any,
) -> httpx.Response:
    return await client.post(
        "/v1/chat/completions", json={"model": "m", "messages": messages, **extra}, headers=headers
    )


@pytest.fixture
def route(upstream: respx.Router) -> respx.Route:
    return upstream.post("/chat/completions").respond(json=completion_json())


async def test_relevant_memories_go_into_the_system_message(
    client: httpx.AsyncClient, route: respx.Route
) -> None:
    await remember(client, "My daughter Mia plays the violin", "I work as a nurse in Oslo",
                   "Favourite food: spicy ramen")  # fmt: skip
    response = await chat(client, [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "Any tips for Mia's violin practice?"},
    ])  # fmt: skip
    assert response.status_code == 200 and response.json() == completion_json()
    assert response.headers["x-memories-injected"] == "1"
    timing = dict(m.split(";dur=") for m in response.headers["server-timing"].split(", "))
    assert list(timing) == ["recall", "recall-index", "recall-lexical", "recall-embedding",
                            "recall-dense", "recall-rank", "recall-choice"]  # fmt: skip
    phases = sum(float(v) for k, v in timing.items() if k != "recall")
    assert 0 < phases <= float(timing["recall"]) + 0.01  # each phase a part of the whole
    system, user = sent_messages(route)
    assert system["content"] == (
        f"You are helpful.\n\n{BLOCK_START}\n{HEADER}\n- [{TODAY}] My daughter Mia plays the violin\n{BLOCK_END}"
    )
    assert user == {"role": "user", "content": "Any tips for Mia's violin practice?"}


async def test_without_a_system_message_one_is_added_first(
    client: httpx.AsyncClient, route: respx.Route
) -> None:
    await remember(client, "I work as a nurse in Oslo")
    await chat(
        client, [{"role": "user", "content": "what should a nurse in Oslo pack for winter?"}]
    )
    messages = sent_messages(route)
    assert [m["role"] for m in messages] == ["system", "user"]
    assert (
        messages[0]["content"].startswith(BLOCK_START) and "nurse in Oslo" in messages[0]["content"]
    )


async def test_a_block_sent_back_is_replaced_not_duplicated(
    client: httpx.AsyncClient, route: respx.Route
) -> None:
    await remember(client, "I work as a nurse in Oslo")
    stale = f"Be brief.\n\n{BLOCK_START}\n- [2020-01-01] an old memory\n{BLOCK_END}"
    await chat(client, [
        {"role": "system", "content": stale},
        {"role": "user", "content": "Shift tips for a nurse in Oslo?"},
    ])  # fmt: skip
    system = sent_messages(route)[0]["content"]
    assert system.count(BLOCK_START) == 1 and "an old memory" not in system
    assert system.startswith("Be brief.\n\n") and "nurse in Oslo" in system
    # nothing relevant now: the stale block still goes, the rest is kept
    await chat(client, [
        {"role": "system", "content": stale},
        {"role": "user", "content": "Explain quantum tunnelling simply please"},
    ])  # fmt: skip
    assert sent_messages(route)[0]["content"] == "Be brief."


async def test_unrelated_chat_is_forwarded_byte_for_byte(
    client: httpx.AsyncClient, route: respx.Route
) -> None:
    await remember(client, "My daughter Mia plays the violin")
    raw = b'{"model":"m","messages":[{"role":"user","content":"Explain quantum tunnelling simply"}], "x": 1}'
    response = await client.post(
        "/v1/chat/completions", content=raw, headers={**ANN, "content-type": "application/json"}
    )
    assert response.headers["x-memories-injected"] == "0"
    assert route.calls.last.request.content == raw


async def test_only_the_users_own_memories_are_recalled(
    client: httpx.AsyncClient, route: respx.Route
) -> None:
    await remember(client, "Bob's violin is a Stradivarius copy", user="bob")
    response = await chat(client, [{"role": "user", "content": "Tell me about my violin please"}])
    assert response.headers["x-memories-injected"] == "0"
    assert "Stradivarius" not in route.calls.last.request.content.decode()


async def test_limit_and_token_budget(make_client: AppClientFactory, route: respx.Route) -> None:
    client = await make_client(recall_limit=2)
    await remember(client, *(f"Fact {i} about my garden roses" for i in range(5)))
    await chat(client, [{"role": "user", "content": "How are my garden roses doing?"}])
    assert sent_messages(route)[0]["content"].count("garden roses") == 2

    tight = await make_client(memory_token_budget=60, recall_limit=8)
    long = "garden roses " + "and the long story of pruning them " * 8
    await remember(tight, long, "Short: garden roses need sun", user="cy")
    response = await chat(
        tight, [{"role": "user", "content": "How are my garden roses doing?"}], {"X-User-Id": "cy"}
    )
    system = sent_messages(route)[0]["content"]
    assert response.headers["x-memories-injected"] == "1"
    assert "Short: garden roses need sun" in system and "long story" not in system


async def test_the_budget_counts_memories_not_the_fixed_header(
    make_client: AppClientFactory, route: respx.Route, caplog: pytest.LogCaptureFixture
) -> None:
    client = await make_client(memory_token_budget=40)  # less than the header alone
    await remember(client, "My garden roses need sun")
    response = await chat(client, [{"role": "user", "content": "How are my garden roses doing?"}])
    assert response.headers["x-memories-injected"] == "1"
    assert HEADER in sent_messages(route)[0]["content"]

    tiny = await make_client(memory_token_budget=5)
    await remember(tiny, "My garden roses need sun")
    with caplog.at_level(logging.WARNING, logger="memproxy"):
        for _ in range(2):
            response = await chat(
                tiny, [{"role": "user", "content": "How are my garden roses doing?"}]
            )
            assert response.headers["x-memories-injected"] == "0"
    said = [
        r.getMessage() for r in caplog.records if "MEMPROXY_MEMORY_TOKEN_BUDGET" in r.getMessage()
    ]
    assert len(said) == 1 and "=5 " in said[0]  # once per process, naming the setting


@pytest.mark.parametrize("headers", [
    {"X-OpenWebUI-Task": "title_generation"},
    {"X-Memory": "off"},
], ids=["task", "memory-off"])  # fmt: skip
async def test_no_recall_for_tasks_or_memory_off(
    client: httpx.AsyncClient, route: respx.Route, headers: dict[str, str]
) -> None:
    await remember(client, "My daughter Mia plays the violin")
    response = await chat(
        client, [{"role": "user", "content": "Mia violin practice tips"}], {**ANN, **headers}
    )
    assert "x-memories-injected" not in response.headers
    assert "Mia plays" not in route.calls.last.request.content.decode()


async def test_read_only_still_recalls(client: httpx.AsyncClient, route: respx.Route) -> None:
    await remember(client, "My daughter Mia plays the violin")
    response = await chat(
        client,
        [{"role": "user", "content": "Mia violin practice tips"}],
        {**ANN, "X-Memory": "read-only"},
    )
    assert response.headers["x-memories-injected"] == "1"


async def test_a_short_reply_is_searched_with_the_turn_before(
    make_client: AppClientFactory, route: respx.Route
) -> None:
    # the fake embedder scores the reply's pleasantries as words like any other: a low threshold
    # lets the test see which text was searched, not how the real model weighs it
    client = await make_client(relevance_threshold=0.1)
    await remember(client, "My daughter Mia plays the violin")
    alone = await chat(client, [{"role": "user", "content": "yes please"}])
    assert alone.headers["x-memories-injected"] == "0"
    response = await chat(client, [
        {"role": "user", "content": "Can you suggest a practice plan for Mia's violin?"},
        {"role": "assistant", "content": "Sure: scales, then a piece. Shall I detail it?"},
        {"role": "user", "content": "yes please"},
    ])  # fmt: skip
    assert response.headers["x-memories-injected"] == "1"


async def test_streaming_chat_gets_memories_and_headers(
    client: httpx.AsyncClient, upstream: respx.Router
) -> None:
    body = sse({"role": "assistant", "content": ""}, {"content": "ok"})
    route = upstream.post("/chat/completions").mock(return_value=sse_response(body))
    await remember(client, "My daughter Mia plays the violin")
    response = await chat(
        client, [{"role": "user", "content": "Mia violin practice tips"}], stream=True
    )
    assert response.content == body and response.headers["x-memories-injected"] == "1"
    assert "Mia plays the violin" in sent_messages(route)[0]["content"]


async def test_recall_counters_update_after_the_request(
    client: httpx.AsyncClient, upstream: respx.Router
) -> None:
    """Once the exchange is over: not while the upstream answers (the write kept off the way to
    the first byte)."""
    (memory,) = await remember(client, "My daughter Mia plays the violin")
    while_answering: list[int] = []

    async def answer(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(0.2)  # what was begun before forwarding has had time to commit
        got = await client.get(f"/v1/memories/{memory['id']}", headers=ANN)
        while_answering.append(got.json()["recall_count"])
        return httpx.Response(200, json=completion_json())

    upstream.post("/chat/completions").mock(side_effect=answer)
    await chat(client, [{"role": "user", "content": "Mia violin practice tips"}])
    assert while_answering == [0]
    for _ in range(100):
        got = (await client.get(f"/v1/memories/{memory['id']}", headers=ANN)).json()
        if got["recall_count"]:
            break
        await asyncio.sleep(0.01)
    assert got["recall_count"] == 1 and got["last_recalled_at"] is not None


def failures(client: httpx.AsyncClient, reason: str) -> float:
    value = app_of(client).state.services.metrics.registry.get_sample_value(
        "memproxy_recall_failures_total", {"reason": reason}
    )
    return float(value or 0)


async def test_embedder_failure_degrades_to_a_chat_without_memories(
    make_client: AppClientFactory, route: respx.Route, caplog: pytest.LogCaptureFixture
) -> None:
    embedder = FakeEmbedder()
    client = await make_client(embedder=embedder)
    await remember(client, "My daughter Mia plays the violin")
    embedder.fail_with = RuntimeError("onnxruntime fell over")
    with caplog.at_level(logging.WARNING, logger="memproxy.memory"):
        response = await chat(client, [{"role": "user", "content": "Mia violin practice tips"}])
    assert response.status_code == 200 and response.json() == completion_json()
    assert (
        response.headers["x-memories-injected"] == "0"
        and response.headers["x-memory-recall"] == "failed"
    )
    assert "Mia plays" not in route.calls.last.request.content.decode()
    assert any("recall failed" in r.getMessage() for r in caplog.records)
    assert failures(client, "RuntimeError") == 1
    embedder.fail_with = None
    again = await chat(client, [{"role": "user", "content": "Mia violin practice tips"}])
    assert again.headers["x-memories-injected"] == "1"


async def test_slow_recall_times_out_and_the_chat_goes_on(
    make_client: AppClientFactory, route: respx.Route
) -> None:
    embedder = FakeEmbedder()
    client = await make_client(embedder=embedder, recall_timeout_seconds=0.05)
    await remember(client, "My daughter Mia plays the violin")
    embedder.delay = 2.0
    response = await chat(client, [{"role": "user", "content": "Mia violin practice tips"}])
    assert response.status_code == 200 and response.headers["x-memory-recall"] == "failed"
    assert failures(client, "timeout") == 1


@pytest.mark.sqlite_only  # reads or breaks the SQLite file directly
async def test_database_failure_degrades_to_a_chat_without_memories(
    make_client: AppClientFactory, route: respx.Route, tmp_path: Path
) -> None:
    client = await make_client()
    await remember(client, "My daughter Mia plays the violin")
    database = sqlite3.connect(tmp_path / "memproxy.db")
    database.execute("ALTER TABLE user_state RENAME TO user_state_away")  # the store breaks
    database.commit()
    response = await chat(client, [{"role": "user", "content": "Mia violin practice tips"}])
    assert response.status_code == 200 and response.headers["x-memory-recall"] == "failed"
    assert failures(client, "OperationalError") == 1
    database.execute("ALTER TABLE user_state_away RENAME TO user_state")
    database.commit()
    database.close()
    again = await chat(client, [{"role": "user", "content": "Mia violin practice tips"}])
    assert again.headers["x-memories-injected"] == "1"


async def test_two_app_instances_on_one_database_see_each_others_writes(
    make_client: AppClientFactory, route: respx.Route
) -> None:
    """Two workers of one deployment: what one learns, the other recalls at its next chat."""
    one, two = await make_client(), await make_client()
    question = [{"role": "user", "content": "Mia violin practice tips"}]
    assert (await chat(two, question)).headers["x-memories-injected"] == "0"  # two's index is warm

    (memory,) = await remember(one, "My daughter Mia plays the violin")
    assert (await chat(two, question)).headers["x-memories-injected"] == "1"
    assert "Mia plays the violin" in sent_messages(route)[0]["content"]

    await one.patch(
        f"/v1/memories/{memory['id']}", json={"content": "My son Leo plays the cello"}, headers=ANN
    )
    await chat(two, [{"role": "user", "content": "Leo cello practice tips"}])
    assert "Leo plays the cello" in sent_messages(route)[0]["content"]

    await one.delete(f"/v1/memories/{memory['id']}", headers=ANN)
    assert (await chat(two, [{"role": "user", "content": "Leo cello practice tips"}])).headers[
        "x-memories-injected"
    ] == "0"
