"""Forgetting that holds (issue 25, point 3): when the Manager deletes a fact after "forget that
...", the user's words it was written from go with it, and so do the memories that say the same;
the turn that asks to forget keeps no episode. Through the chat endpoint: after "Please forget
that I am vegetarian", nothing about it reaches the model for "What should I cook tonight?"."""

from __future__ import annotations

import re
from typing import Any

import httpx
import orjson
import respx
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse
from pydantic_ai.models.function import AgentInfo
from sqlalchemy.ext.asyncio import AsyncEngine

from app.memory.learning.applier import Applier
from app.memory.learning.decisions import Op, Operation
from app.memory.learning.episodes import episode_texts
from app.memory.learning.turns import turn
from app.memory.service import MemoryService
from app.memory.store.memories import MemoryStore
from app.memory.store.records import NewMemory
from app.memory.store.tables import MemoryType
from tests.conftest import AppClientFactory
from tests.fakes import FakeEmbedder, decided
from tests.memory.learning.support import ANN, manager_client, new_user_lines, no_jobs, until


def test_a_request_to_forget_keeps_no_episode() -> None:
    """The request holds the very words being forgotten; what else the turn says is kept."""
    forget = [turn("user", "Please forget that I am vegetarian")]
    assert episode_texts([], forget) == []
    mixed = [turn("user", "Can you forget that I'm vegetarian? I eat fish now.")]
    assert episode_texts([], mixed) == ["I eat fish now."]
    for kept in ("I always forget my keys.", "Don't forget that I'm vegan."):
        assert episode_texts([], [turn("user", kept)]) == [kept]


async def test_the_manager_s_delete_takes_the_words_it_came_from(engine: AsyncEngine) -> None:
    service = MemoryService(MemoryStore(engine), FakeEmbedder())  # type: ignore[arg-type]
    applier = Applier(service)
    (written,) = await applier.apply(
        "ann", [Operation(op=Op.NEW, content="Is vegetarian")], {}, job_id="j1",
        episodes=episode_texts([], [turn("user", "I am vegetarian.")]),
    )  # fmt: skip
    # said again elsewhere: the fact is known already (nothing written, nothing linked)
    await applier.apply("ann", [], {}, job_id="j2", episodes=["I'm vegetarian, so no meat please."])
    await applier.apply("ann", [Operation(op=Op.NEW, content="Loves jazz")], {}, job_id="j3")
    forget = [turn("user", "Please forget that I am vegetarian")]
    (deleted,) = await applier.apply(
        "ann", [Operation(op=Op.DELETE, id=1)], {1: written.memory_id or ""}, job_id="j4",
        episodes=episode_texts([], forget),
    )  # fmt: skip
    assert (deleted.result, deleted.memory_id, len(deleted.also)) == (
        "deleted", written.memory_id, 2
    )  # fmt: skip
    listed, _ = await service.page("ann")
    assert [m.content for m in listed] == ["Loves jazz"]
    for memory_id in deleted.also:
        event = (await service.history("ann", memory_id))[-1]
        assert (event.action, event.actor, event.job_id) == ("deleted", "manager", "j4")
        assert event.detail is not None and written.memory_id in event.detail


async def test_a_job_s_later_operations_on_what_went_along(engine: AsyncEngine) -> None:
    """A DELETE of a memory that went with an earlier one of the same job is done; an UPDATE of
    one creates (its new text is kept)."""
    service = MemoryService(MemoryStore(engine), FakeEmbedder())  # type: ignore[arg-type]
    records = (await service.add("ann", [
        NewMemory("Is vegetarian"), NewMemory("User is vegetarian"),
        NewMemory("The user is vegetarian"),
    ])).records  # fmt: skip
    aliases = {i: r.id for i, r in enumerate(records, start=1)}
    outcomes = await Applier(service).apply("ann", [
        Operation(op=Op.DELETE, id=1), Operation(op=Op.DELETE, id=2),
        Operation(op=Op.UPDATE, id=3, content="Is vegan"),
    ], aliases, job_id="j")  # fmt: skip
    assert [(o.result, o.memory_id) for o in outcomes[:2]] == [
        ("deleted", aliases[1]), ("deleted", aliases[2])
    ]  # fmt: skip
    assert set(outcomes[0].also) == {aliases[2], aliases[3]}
    assert outcomes[1].reason == "went with a memory this job deleted"
    assert (outcomes[2].result, outcomes[2].reason) == (
        "created", "UPDATE of a memory deleted since; created"
    )  # fmt: skip
    listed, _ = await service.page("ann")
    assert [m.content for m in listed] == ["Is vegan"]


class Scripted:
    """A Manager that writes "Is vegetarian" (a profile fact) when told so, deletes the memories
    about it when asked to forget, and nothing else."""

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        prompt = str(next(m for m in messages if isinstance(m, ModelRequest)).parts[-1].content)  # type: ignore[union-attr]
        shown = dict(re.findall(r"^(\d+)\. (.*)$", prompt, re.M))
        operations: list[dict[str, Any]] = []
        for line in new_user_lines(messages):
            if "forget" in line.lower():
                operations += [{"op": "DELETE", "id": int(n)} for n, text in shown.items()
                               if "vegetarian" in text.lower()]  # fmt: skip
            elif "vegetarian" in line.lower():
                operations.append({"op": "NEW", "content": "Is vegetarian", "profile": True})
        return decided(info, {"operations": operations})


async def say(client: httpx.AsyncClient, text: str) -> None:
    """`text` as the first message of a conversation of its own, and its job done."""
    messages = [{"role": "user", "content": text}]
    response = await client.post(
        "/v1/chat/completions", headers=ANN, json={"model": "m", "messages": messages}
    )
    assert response.status_code == 200, response.text
    await until(lambda: no_jobs(client))


def reached(route: respx.Route) -> str:
    """Everything the last chat sent the model."""
    sent = orjson.loads(route.calls.last.request.content)["messages"]
    return " ".join(str(m["content"]) for m in sent)


async def stored(client: httpx.AsyncClient) -> list[tuple[str, str]]:
    listed = await client.get("/v1/memories", params={"limit": 1000}, headers=ANN)
    return sorted((m["type"], m["content"]) for m in listed.json()["data"])


async def test_after_forget_nothing_about_it_reaches_the_model(
    make_client: AppClientFactory, upstream_ok: respx.Route, bundled_embedder: Any
) -> None:
    client = await manager_client(make_client, Scripted(), episodes=True, embedder=bundled_embedder)
    await say(client, "I am vegetarian")
    # said again in another chat: the fact is known (the Manager's NEW is a duplicate), so this
    # episode is linked to nothing; it says the same, and goes all the same
    await say(client, "I am vegetarian, so no meat for me please.")
    episode = MemoryType.EPISODE.value
    assert await stored(client) == [
        (episode, "I am vegetarian"), (episode, "I am vegetarian, so no meat for me please."),
        ("fact", "Is vegetarian"),
    ]  # fmt: skip
    await say(client, "What should I cook tonight?")
    assert "Is vegetarian" in reached(upstream_ok)  # a profile fact: in every chat until...

    await say(client, "Please forget that I am vegetarian")
    await say(client, "What should I cook tonight?")
    assert "vegetarian" not in reached(upstream_ok).lower()
    assert await stored(client) == [(episode, "What should I cook tonight?")]  # learned once
