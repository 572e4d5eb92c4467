"""The Manager's turns are PydanticAI messages: from the proxy's history to a job and back."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, UserPromptPart
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.memory.learning.extraction import exchange
from app.memory.learning.jobs import JobQueue
from app.memory.learning.turns import dump, fingerprints_of, load, role_of, text_of, turn, turns_of
from app.memory.store.memories import MemoryStore
from app.memory.store.tables import ManagerJob
from app.proxy.history import convert
from app.schemas.openai import ChatCompletionRequest

MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "SYSTEM"},
    {"role": "user", "content": "I live in Oslo"},
    {"role": "user", "content": [{"type": "text", "text": "and I have a cat"},
                                 {"type": "image_url", "image_url": {"url": "https://x/cat.png"}}]},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "TOOL"},
    {"role": "assistant", "content": "Nice!"},
    {"role": "user", "content": "<memory_context>\n- OWUI MEMORY\n</memory_context>\nRemember I run"},
]  # fmt: skip


def said(messages: list[Any]) -> list[tuple[str, str]]:
    return [(role_of(m), text_of(m)) for m in messages]


def history() -> Any:
    request = ChatCompletionRequest.model_validate({"model": "m", "messages": MESSAGES})
    return convert(request.messages)


def test_turns_are_one_message_each_with_the_words_of_one_side() -> None:
    turns = turns_of(history(), "Noted.")
    assert said(turns) == [
        ("user", "I live in Oslo"),
        ("user", "and I have a cat"),  # two user messages in one request: two turns
        ("assistant", "Nice!"),  # the tool call's empty text is no turn
        ("user", "Remember I run"),  # Open WebUI's memory block is not the user's words
        ("assistant", "Noted."),
    ]
    for message in turns:
        part_type = UserPromptPart if isinstance(message, ModelRequest) else TextPart
        assert [type(p) for p in message.parts] == [part_type]
    assert "SYSTEM" not in str(turns) and "TOOL" not in str(turns)


def test_a_blank_reply_is_no_turn() -> None:
    assert said(turns_of(history(), "  \n"))[-1] == ("user", "Remember I run")


def test_a_job_stores_pydantic_ais_own_json_and_reads_it_back() -> None:
    turns = turns_of(history(), "Noted.")
    stored = json.loads(json.dumps(dump(turns)))  # through the database's JSON column
    assert [item["kind"] for item in stored] == ["request", "request", "response", "request",
                                                 "response"]  # fmt: skip
    assert load(stored) == list(turns)


def test_a_job_queued_before_the_upgrade_still_reads() -> None:
    """Jobs queued by an earlier memproxy hold ``[role, text]`` pairs: no turn is lost."""
    legacy = [["user", "I live in Oslo"], ["assistant", "Nice!"]]
    assert said(load(legacy)) == [("user", "I live in Oslo"), ("assistant", "Nice!")]
    mixed = [*legacy, *dump([turn("user", "I run")])]  # a new exchange merged into an old job
    assert said(load(mixed))[-1] == ("user", "I run")


def test_fingerprints_are_of_the_user_turns_and_ignore_whitespace() -> None:
    one = [turn("user", "I live  in\nOslo"), turn("assistant", "Nice!"), turn("user", "a cat")]
    two = [turn("user", "I live in Oslo"), ModelResponse(parts=[TextPart("Nice!")]),
           turn("user", " a  cat ")]  # fmt: skip
    assert [i for i, _ in fingerprints_of(one)] == [0, 2]
    assert fingerprints_of(one) == fingerprints_of(two)


def test_turns_are_made_as_read_and_fingerprinted_from_their_words() -> None:
    """A chat's turns become messages only when read: the same messages each time, and the
    same fingerprints as those of the messages themselves."""
    turns = turns_of(history(), "Noted.")
    assert turns[:] == list(turns) == [turns[i] for i in range(len(turns))]
    assert turns[-2:] == list(turns)[-2:] and isinstance(turns[0], ModelRequest)
    assert fingerprints_of(turns) == fingerprints_of(list(turns))
    assert said(turns) == said(load(dump(turns)))


@pytest.mark.parametrize("legacy", [False, True])
async def test_the_queue_gives_the_worker_messages(engine: AsyncEngine, legacy: bool) -> None:
    sessions = MemoryStore(engine).sessions
    queue = JobQueue(sessions, limit=100)
    found = exchange(turns_of(history(), None), set(), threshold=1)
    assert found is not None
    queued = await queue.enqueue("ann", "m", found, interval_seconds=0, awaiting=True)
    assert queued is not None
    if legacy:  # as an earlier memproxy stored it
        async with sessions() as session, session.begin():
            job = await session.scalar(select(ManagerJob))
            assert job is not None
            job.payload = {**job.payload, "new": [[role_of(t), text_of(t)] for t in found.new]}
    await queue.complete(queued.job_id, "Noted.", interval_seconds=0)
    (claimed,) = await queue.claim(1, exclude_users=set())
    context, new = claimed.turns()
    assert context == [] and claimed.model == "m"
    assert said(new) == said(turns_of(history(), "Noted."))
