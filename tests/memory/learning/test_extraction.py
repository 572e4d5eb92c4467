"""Which turns become a Manager job: explicit requests to remember, the new turns of an
exchange, the conversation threshold, a long conversation or a huge turn, and no job for tasks,
tool continuations or memory off (a FunctionModel stands in for the LLM, respx for the upstream)."""

from __future__ import annotations

from typing import Any

import pytest
import respx
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse
from pydantic_ai.models.function import AgentInfo

from app.memory.learning.extraction import (
    CONTEXT_TURNS,
    MAX_JOB_TURNS,
    exchange,
    fingerprints_of,
    is_explicit,
)
from app.memory.learning.turns import role_of, turn
from tests.conftest import AppClientFactory
from tests.fakes import decided
from tests.helpers import completion_json
from tests.memory.learning.support import (
    ANN,
    Remembering,
    equals,
    manager_client,
    memories,
    no_jobs,
    said,
    services,
    until,
)

FACTS = [
    "I live in Oslo",
    "My cat is called Tom",
    "I work as a nurse",
    "Sushi is my favourite food",
    "My sister Eva studies law",
    "I run marathons",
    "We drive a green Volvo",
    "I speak Portuguese",
    "Jazz helps me relax",
    "Our garden has apple trees",
]  # distinct words: the fake embedder finds no near-duplicates among them
STORED = [
    "Lives in Oslo",
    "Their cat is called Tom",
    "Works as a nurse",
    "Sushi is their favourite food",
    "Their sister Eva studies law",
    "Runs marathons",
    "They drive a green Volvo",
    "Speaks Portuguese",
    "Jazz helps them relax",
    "Their garden has apple trees",
]
"""FACTS as stored: the Manager here copies them, the rules write them in the third person."""


@pytest.mark.parametrize("text", [
    "Please remember that my wife is called Ana", "remember my PIN hint is the cat", "Don't forget I'm vegan",
    "Keep in mind I live in Porto now", "Please note: I prefer metric units", "Forget that I live in Oslo",
    "That's no longer true, I quit smoking", "From now on call me Sam", "I no longer work at Acme",
])  # fmt: skip
def test_explicit_requests_are_recognised(text: str) -> None:
    assert is_explicit(text)


@pytest.mark.parametrize("text", [
    "Do you remember the capital of Peru?", "What is the weather like?", "I forgot my umbrella",
    "Note the difference between these two functions", "How long is a marathon?",
])  # fmt: skip
def test_ordinary_messages_are_not_explicit(text: str) -> None:
    assert not is_explicit(text)


def test_exchange_takes_only_new_turns_and_waits_for_the_threshold() -> None:
    turns = [
        turn("user", "I live in Oslo"),
        turn("assistant", "Nice!"),
        turn("user", "I have a cat"),
    ]
    assert exchange(turns[:1], set(), threshold=2) is None  # one user message: too early
    first = exchange(turns, set(), threshold=2)
    assert (
        first is not None
        and first.new == turns
        and first.context == []
        and len(first.fingerprints) == 2
    )
    later = [*turns, turn("assistant", "Cute"), turn("user", "I also run")]
    second = exchange(later, set(first.fingerprints), threshold=2)
    assert second is not None and second.context == later[:-1]
    assert said(second.new) == [("user", "I also run")] and len(second.fingerprints) == 1
    assert exchange(later, set(first.fingerprints + second.fingerprints), threshold=2) is None
    explicit = exchange([turn("user", "Remember that I'm allergic to nuts")], set(), threshold=5)
    assert explicit is not None and explicit.explicit


async def test_a_ten_turn_chat_creates_each_memory_once(
    make_client: AppClientFactory, upstream_ok: respx.Route
) -> None:
    manager = Remembering()
    client = await manager_client(make_client, manager)
    conversation: list[dict[str, Any]] = [{"role": "system", "content": "Be kind."}]
    for fact in FACTS:
        conversation.append({"role": "user", "content": fact})
        response = await client.post(
            "/v1/chat/completions", json={"model": "m", "messages": conversation}, headers=ANN
        )
        assert response.status_code == 200
        conversation.append({"role": "assistant", "content": "Noted."})
    expected = sorted(STORED)
    await until(lambda: equals(memories(client), expected))
    await until(lambda: no_jobs(client))
    shown = [line for call in manager.seen for line in call]
    assert sorted(shown) == sorted(FACTS)  # every user turn reached the Manager exactly once
    assert await memories(client) == expected


async def test_a_huge_turn_reaches_the_manager_as_its_start_and_end(
    make_client: AppClientFactory, upstream: respx.Router
) -> None:
    """A pasted document in a turn is cut for the Manager (the job and its prompt stay small);
    the request to remember before it, and the question after it, are kept."""
    prompts: list[str] = []

    def manager(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        prompts.append(
            str(next(m for m in messages if isinstance(m, ModelRequest)).parts[-1].content)
        )  # type: ignore[union-attr]
        return decided(info, {"operations": []})

    upstream.post("/chat/completions").respond(json=completion_json("Noted. " + "y" * 50_000))
    client = await manager_client(make_client, manager)
    text = "Remember that I play chess. " + "x" * 300_000 + " What opening suits me?"
    response = await client.post(
        "/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": text}]},
        headers=ANN,
    )
    assert response.status_code == 200
    await until(lambda: no_jobs(client))
    (prompt,) = prompts
    assert len(prompt) < 20_000  # two turns of at most ~8k characters, and the frame
    assert "USER: Remember that I play chess." in prompt and "What opening suits me?" in prompt
    assert "characters left out ...]" in prompt


@pytest.mark.parametrize(("headers", "messages"), [
    ({"X-OpenWebUI-Task": "title_generation"}, [{"role": "user", "content": "My cat is Tom"}]),
    ({"X-Memory": "off"}, [{"role": "user", "content": "My cat is Tom"}]),
    ({"X-Memory": "read-only"}, [{"role": "user", "content": "My cat is Tom"}]),
    ({}, [{"role": "user", "content": "My cat is Tom"},
          {"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
          {"role": "tool", "tool_call_id": "c", "content": "tool says hi"}]),
], ids=["task", "memory off", "read-only", "tool continuation"])  # fmt: skip
async def test_no_job_for_tasks_tool_continuations_or_memory_off(
    make_client: AppClientFactory,
    upstream_ok: respx.Route,
    headers: dict[str, str],
    messages: list[dict[str, Any]],
) -> None:
    manager = Remembering()
    client = await manager_client(make_client, manager)
    await client.post(
        "/v1/chat/completions",
        json={"model": "m", "messages": messages},
        headers={**ANN, **headers},
    )
    await services(client).runner.drain(5)
    assert await services(client).jobs.counts() == {
        "awaiting": 0,
        "queued": 0,
        "running": 0,
        "failed": 0,
    }
    assert manager.seen == [] and await memories(client) == []


async def test_threshold_holds_routine_chats_but_not_explicit_requests(
    make_client: AppClientFactory, upstream_ok: respx.Route
) -> None:
    manager = Remembering()
    client = await manager_client(make_client, manager, conversation_threshold=3)
    await client.post(
        "/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "I like tea"}]},
        headers=ANN,
    )
    await services(client).runner.drain(5)
    assert manager.seen == []
    explicit = [{"role": "user", "content": "Please remember that my sister is Eva"}]
    await client.post(
        "/v1/chat/completions", json={"model": "m", "messages": explicit}, headers=ANN
    )
    await until(lambda: equals(memories(client), ["Please remember that their sister is Eva"]))


def test_a_long_conversation_first_seen_gives_its_last_turns_and_takes_them_all() -> None:
    turns = [
        turn("user" if i % 2 == 0 else "assistant", f"turn {i}")
        for i in range(2 * MAX_JOB_TURNS + 11)
    ]  # starts and ends with a user turn
    found = exchange(turns, set(), threshold=1)
    assert found is not None
    assert len(found.new) <= MAX_JOB_TURNS and role_of(found.new[0]) == "user"
    assert found.new == turns[-len(found.new) :] and len(found.new) >= MAX_JOB_TURNS - 1
    assert found.context == turns[-len(found.new) - CONTEXT_TURNS : -len(found.new)]
    assert len(found.fingerprints) == MAX_JOB_TURNS + 6  # every user turn is taken
    # The marks index context + new: the job keeps exactly the new user turns.
    marks = dict(found.marks)
    offset = len(found.context)
    assert [marks[offset + i] for i, t in enumerate(found.new) if role_of(t) == "user"] == [
        f for i, f in fingerprints_of(turns) if i >= len(turns) - len(found.new)
    ]
    assert exchange(turns, set(found.fingerprints), threshold=1) is None  # none left for later
