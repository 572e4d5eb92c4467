"""Recall of both facts and episodes through the app: facts first, then the user's words, each
dated when said; a fact and the episode it came from never both; an episode found by the facts
drawn from it (its index key)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
import respx
from pydantic_ai.messages import ModelMessage, ModelResponse
from pydantic_ai.models.function import AgentInfo
from sqlalchemy import select, update

import app.memory.learning.jobs
from app.memory.block import BLOCK_END, BLOCK_START, SAID
from app.memory.store.records import NewMemory
from app.memory.store.tables import Memory
from tests.conftest import AppClientFactory
from tests.fakes import decided
from tests.helpers import completion_json
from tests.memory.chat.test_recall_chat import chat, sent_messages
from tests.memory.learning.support import (
    ANN,
    manager_client,
    memories,
    new_user_lines,
    no_jobs,
    services,
    until,
)

WHEN = datetime(2026, 11, 20, 18, 0, tzinfo=UTC)
FACT = "Is vegetarian and cooks most evenings"  # grounded: "cook", "evening" are the user's
MEAT = "I stopped eating meat years ago. I cook most evenings after my shift at the hospital."


class Drawing:
    """A Manager that draws one fact from the first user line, in other words than the user's:
    the case where the fact and the words are found by different questions."""

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        lines = new_user_lines(messages)
        ops = [{"op": "NEW", "content": FACT, "type": "fact"}] if lines else []
        return decided(info, {"operations": ops})


async def learned(
    make_client: AppClientFactory, monkeypatch: pytest.MonkeyPatch, **settings: Any
) -> httpx.AsyncClient:
    monkeypatch.setattr(app.memory.learning.jobs, "now", lambda: WHEN)  # when it was said
    client = await manager_client(make_client, Drawing(), **settings)
    assert (await chat(client, [{"role": "user", "content": MEAT}])).status_code == 200
    await until(lambda: no_jobs(client))
    assert await memories(client) == [FACT]
    assert len(await memories(client, episodes=True)) == 1
    return client


@pytest.fixture
def upstream_ok(upstream: respx.Router) -> respx.Route:
    return upstream.post("/chat/completions").respond(json=completion_json("Noted."))


def block_lines(route: respx.Route) -> list[str]:
    system = sent_messages(route)[0]["content"]
    assert BLOCK_START in system
    block = system.split(BLOCK_START, 1)[1].split(BLOCK_END, 1)[0]
    return [line for line in block.splitlines() if line.startswith("- ")]


async def test_the_users_words_are_shown_dated_after_the_facts(
    make_client: AppClientFactory, upstream_ok: respx.Route, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = await learned(make_client, monkeypatch)
    await services(client).memory.add(  # a fact the question also finds
        "ann", [NewMemory("Works night shifts at the hospital")]
    )
    question = [{"role": "user", "content": "What do I do after my shift at the hospital?"}]
    response = await chat(client, question, {**ANN, "X-Memory": "read-only"})
    assert response.status_code == 200
    lines = block_lines(upstream_ok)
    said = [line for line in lines if SAID in line]
    assert lines.index(said[0]) == len(lines) - len(said)  # facts first, then the words
    assert said == [f"- [2026-11-20] {SAID} {MEAT}"]  # dated when said, not today
    assert response.headers["x-memories-injected"] == str(len(lines))


async def test_a_fact_and_the_words_it_came_from_are_not_both_shown(
    make_client: AppClientFactory, upstream_ok: respx.Route, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = await learned(make_client, monkeypatch)
    question = [{"role": "user", "content": "Am I vegetarian or do I eat meat?"}]
    response = await chat(client, question, {**ANN, "X-Memory": "read-only"})
    lines = block_lines(upstream_ok)
    assert len(lines) == 1 and response.headers["x-memories-injected"] == "1"
    # both were found: each alone is shown when the other is not there
    found = await client.post("/v1/memories/search", headers=ANN,
                              json={"query": question[0]["content"], "limit": 5})  # fmt: skip
    assert len(found.json()["data"]) == 2


async def test_an_episode_is_found_by_the_facts_drawn_from_it(
    make_client: AppClientFactory, upstream_ok: respx.Route, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ "vegetarian" is not among the user's words: the episode is found by its index key (its
    words and the fact), kept in the database, so a rebuilt index finds it too."""
    client = await learned(make_client, monkeypatch)
    query = {"query": "vegetarian", "types": ["episode"], "limit": 5}

    async def found() -> list[str]:
        got = await client.post("/v1/memories/search", headers=ANN, json=query)
        assert got.status_code == 200, got.text
        return [hit["content"] for hit in got.json()["data"]]

    assert await found() == [MEAT]
    memory = services(client).memory
    async with memory.store.sessions() as session:
        row = (await session.scalars(select(Memory).where(Memory.type == "episode"))).one()
    assert row.content == MEAT and row.index_text == f"{MEAT} {FACT}."
    memory.cache.forget()  # a restart, another replica: rebuilt from the store
    assert await found() == [MEAT]
    async with memory.store.sessions() as session, session.begin():  # another model's vectors
        await session.execute(
            update(Memory).values(embedding_model="other").where(Memory.key == row.key)
        )
    memory.cache.forget()
    assert await found() == [MEAT]  # re-embedded from its key, not its words alone


async def test_an_edit_keeps_the_key_and_new_words_replace_it(
    make_client: AppClientFactory, upstream_ok: respx.Route, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A change beside the words (metadata, pinned) keeps what the episode is found by, in
    this process's index as in a rebuilt one; new words are found by themselves alone."""
    client = await learned(make_client, monkeypatch)
    query = {"query": "vegetarian", "types": ["episode"], "limit": 5}

    async def found() -> list[str]:
        got = await client.post("/v1/memories/search", headers=ANN, json=query)
        return [hit["content"] for hit in got.json()["data"]]

    (episode,) = (await client.get("/v1/memories", params={"type": "episode"}, headers=ANN)).json()[
        "data"
    ]
    path = f"/v1/memories/{episode['id']}"
    patched = await client.patch(path, json={"metadata": {"k": "v"}}, headers=ANN)
    assert patched.status_code == 200, patched.text
    assert await found() == [MEAT]  # the index updated in place keeps the key
    edited = await client.patch(path, json={"content": "I like jazz."}, headers=ANN)
    assert edited.status_code == 200, edited.text
    assert await found() == []
    services(client).memory.cache.forget()
    assert await found() == []  # nor does the store keep the old key


class Restating:
    """A small model's habit: each job restates the memory it was shown (an UPDATE to the words
    it has) beside what is new."""

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        lines = new_user_lines(messages)
        if "Paris" not in " ".join(lines):
            return decided(info, {"operations": [{"op": "NEW", "content": "Is vegetarian"}]})
        return decided(info, {"operations": [
            {"op": "UPDATE", "id": 1, "content": "Is vegetarian"},
            {"op": "NEW", "content": "Moved to Paris"},
        ]})  # fmt: skip


async def test_a_restated_fact_neither_keys_nor_takes_the_new_words(
    make_client: AppClientFactory, upstream_ok: respx.Route
) -> None:
    client = await manager_client(make_client, Restating())
    for said in ("I am vegetarian.", "I moved to Paris last month."):
        assert (await chat(client, [{"role": "user", "content": said}])).status_code == 200
        await until(lambda: no_jobs(client))
    assert await memories(client) == ["Is vegetarian", "Moved to Paris"]
    memory = services(client).memory
    async with memory.store.sessions() as session:
        paris = (
            await session.scalars(select(Memory).where(Memory.content.startswith("I moved")))
        ).one()
    assert "vegetarian" not in (paris.index_text or "")
    listed = (await client.get("/v1/memories", headers=ANN)).json()["data"]
    (fact,) = [m for m in listed if m["content"] == "Is vegetarian"]
    assert (await client.delete(f"/v1/memories/{fact['id']}", headers=ANN)).status_code == 200
    assert await memories(client, episodes=True) == ["I moved to Paris last month."]
