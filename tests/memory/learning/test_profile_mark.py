"""The Manager marks standing facts about the person (issue 25, point 6): an optional `profile` on
NEW and UPDATE in the answer's schema (a model that leaves it out still answers validly), set on
what is created or updated; an UPDATE without it keeps the mark. SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest
import respx
from pydantic_ai.messages import ModelMessage, ModelResponse
from pydantic_ai.models.function import AgentInfo
from sqlalchemy.ext.asyncio import AsyncEngine

from app.memory.block import PROFILE_HEADING
from app.memory.learning.applier import Applier
from app.memory.learning.decisions import Op, Operation, decisions_for
from app.memory.learning.prompt import instructions
from app.memory.service import MemoryService
from app.memory.store.memories import MemoryStore
from app.memory.store.records import NewMemory
from tests.conftest import AppClientFactory
from tests.fakes import FakeEmbedder, decided
from tests.memory.learning.support import (
    ANN,
    equals,
    manager_client,
    memories,
    new_user_lines,
    until,
)


@pytest.fixture
def service(engine: AsyncEngine) -> MemoryService:
    return MemoryService(MemoryStore(engine), FakeEmbedder())  # type: ignore[arg-type]


def test_the_schema_offers_profile_on_new_and_update_and_requires_it_nowhere() -> None:
    schema = decisions_for(2)
    for name in ("New", "Update"):
        definition = schema.model_json_schema()["$defs"][name]
        assert "profile" in definition["properties"] and "profile" not in definition["required"]
    (new, update) = schema.model_validate({"operations": [
        {"op": "NEW", "content": "Is vegetarian", "profile": True},
        {"op": "UPDATE", "id": 1, "content": "Lives in Bergen"},
    ]}).normalized()  # fmt: skip
    assert (new.profile, update.profile) == (True, None)
    (plain,) = schema.model_validate({"operations": [{"op": "NEW", "content": "X"}]}).normalized()
    assert plain.profile is False
    assert '"profile": true' in instructions(shape=True)  # the model is told what it is


async def test_new_sets_the_mark_and_an_update_without_it_keeps_it(
    service: MemoryService,
) -> None:
    records = (
        await service.add("ann", [NewMemory("Lives in Oslo"), NewMemory("Has a cat")])
    ).records
    aliases = {1: records[0].id, 2: records[1].id}
    outcomes = await Applier(service).apply("ann", [
        Operation(op=Op.NEW, content="Is vegetarian", profile=True),
        Operation(op=Op.UPDATE, id=1, content="Lives in Oslo city centre", profile=True),
        Operation(op=Op.UPDATE, id=2, content="Has a cat.", profile=True),  # same words: marked
    ], aliases, job_id="job-1")  # fmt: skip
    assert [o.result for o in outcomes] == ["created", "updated", "updated"]
    marked = {m.content: m.profile for m in (await service.page("ann"))[0]}
    assert marked == {"Is vegetarian": True, "Lives in Oslo city centre": True, "Has a cat": True}

    outcomes = await Applier(service).apply("ann", [
        Operation(op=Op.UPDATE, id=1, content="Lives in central Oslo"),  # no field: kept
        Operation(op=Op.UPDATE, id=2, content="Has a cat", profile=False),
    ], aliases, job_id="job-2")  # fmt: skip
    assert [o.result for o in outcomes] == ["updated", "updated"]
    marked = {m.content: m.profile for m in (await service.page("ann"))[0]}
    assert marked == {"Is vegetarian": True, "Lives in central Oslo": True, "Has a cat": False}
    history = await service.history("ann", aliases[2])
    assert [e.detail for e in history][1:] == ["profile", "not profile"]


class Marking:
    """A Manager that makes the first exchange's user line a profile memory, then rewrites
    memory 1 with the next one, saying nothing of the mark."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        (said,) = new_user_lines(messages)
        self.calls += 1
        op: dict[str, Any] = (
            {"op": "NEW", "content": said, "type": "fact", "profile": True}
            if self.calls == 1
            else {"op": "UPDATE", "id": 1, "content": said}
        )
        return decided(info, {"operations": [op]})


async def test_the_manager_marks_a_profile_fact_and_every_chat_shows_it(
    make_client: AppClientFactory, upstream_ok: respx.Route
) -> None:
    client = await manager_client(make_client, Marking())
    first = [{"role": "user", "content": "I am vegetarian"}]
    await chat(client, first)
    await until(lambda: equals(memories(client), ["Is vegetarian"]))
    assert [m["profile"] for m in await listed(client)] == [True]

    cook = [{"role": "user", "content": "What should I cook tonight?"}]
    response = await chat(client, cook, {**ANN, "X-Memory": "read-only"})
    assert response.headers["x-memories-injected"] == "1"
    system = _sent(upstream_ok)[0]["content"]
    assert f"{PROFILE_HEADING}\n- [" in system and system.endswith(
        "Is vegetarian\n</memproxy-memories>"
    )

    await chat(client, [*first, {"role": "assistant", "content": "Noted."},
                        {"role": "user", "content": "I am strictly vegetarian"}])  # fmt: skip
    await until(lambda: equals(memories(client), ["Is strictly vegetarian"]))
    assert [m["profile"] for m in await listed(client)] == [True]


async def chat(
    client: httpx.AsyncClient, messages: list[dict[str, str]], headers: dict[str, str] = ANN
) -> httpx.Response:
    response = await client.post(
        "/v1/chat/completions", json={"model": "m", "messages": messages}, headers=headers
    )
    assert response.status_code == 200, response.text
    return response


async def listed(client: httpx.AsyncClient) -> list[dict[str, Any]]:
    data: list[dict[str, Any]] = (await client.get("/v1/memories", headers=ANN)).json()["data"]
    return [m for m in data if m["type"] != "episode"]  # the facts


def _sent(route: respx.Route) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = orjson.loads(route.calls.last.request.content)["messages"]
    return messages
