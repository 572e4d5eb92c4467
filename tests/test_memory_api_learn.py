"""``POST /v1/memories/learn`` and ``GET /v1/memories/learn/{id}``: an export learned by the
Manager, each memory dated when it was said; sent again, nothing new; every bad input an
OpenAI-shaped 4xx with nothing queued; the memory API's keys and users."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import respx
from sqlalchemy import select

from app.memory.learning.history.queue import manager_model
from app.memory.learning.history.read import read_export
from app.memory.store.tables import ManagerJob
from tests.conftest import AppClientFactory
from tests.helpers import assert_openai_error
from tests.memory.learning.exports import dumped, gpt_linear, owui_linear
from tests.memory.learning.support import (
    ANN,
    Prompted,
    Remembering,
    manager_client,
    services,
    until,
)

ADMIN = {"Authorization": "Bearer sk-admin"}
AS_ANN = {"Authorization": "Bearer sk-ann"}
KEYS: dict[str, Any] = {"api_keys": ["sk-ann:ann", "sk-bob:bob"], "admin_keys": ["sk-admin"]}
OSLO = owui_linear("Moving", [("user", "I moved to Oslo yesterday"), ("assistant", "Welcome!")])


async def learn(
    client: httpx.AsyncClient, body: bytes, headers: dict[str, str] = ANN, **params: Any
) -> httpx.Response:
    return await client.post("/v1/memories/learn", content=body, headers=headers, params=params)


async def nothing_queued(client: httpx.AsyncClient) -> None:
    counts = await services(client).jobs.counts()
    assert sum(counts.values()) == 0, counts
    assert await services(client).jobs.processed("ann", []) == set()


async def test_an_export_is_learned_as_said_then(make_client: AppClientFactory) -> None:
    manager = Prompted()
    client = await manager_client(make_client, manager)
    response = await learn(client, dumped(OSLO, owui_linear("Empty", [])))
    assert response.status_code == 200, response.text
    result = response.json()
    run = result.pop("id")
    assert len(run) == 12 and result == {
        "object": "memory.learn", "user_id": "ann", "format": "openwebui", "conversations": 2,
        "messages": 2, "queued_conversations": 1, "jobs": 1, "already_learned": 0, "skipped": 1,
        "pending": result["pending"], "queued": result["queued"], "running": result["running"],
        "failed": 0,
    }  # fmt: skip
    await until(lambda: _done(client, run))
    written = (await client.get("/v1/memories", headers=ANN)).json()["data"]
    episode, fact = sorted(written, key=lambda m: str(m["type"]))
    assert (episode["type"], episode["content"]) == ("episode", "I moved to Oslo yesterday")
    # the Manager read that day as today (and "yesterday", written by rule, is that day's)
    assert "Current date and time: Wednesday 01 May 2024, 09:30 UTC" in manager.prompts[0]
    assert fact["content"] in ("Moved to Oslo yesterday", "Moved to Oslo on 30 April 2024")
    for memory in written:  # when it was said, not today
        assert memory["observed_at"] == "2024-05-01T09:30:00Z"

    again = await learn(client, dumped(OSLO, owui_linear("Empty", [])))
    assert again.status_code == 200
    assert {k: again.json()[k] for k in ("id", "jobs", "already_learned", "pending")} == {
        "id": run, "jobs": 0, "already_learned": 1, "pending": 0,
    }  # fmt: skip
    assert len(manager.seen) == 1 and await facts(client) == [fact["content"]]


async def _done(client: httpx.AsyncClient, run: str) -> bool:
    progress = (await client.get(f"/v1/memories/learn/{run}", headers=ANN)).json()
    assert progress["object"] == "memory.learn.progress" and progress["failed"] == 0
    return bool(progress["pending"] == 0)


async def test_what_a_chat_taught_is_already_learned(
    make_client: AppClientFactory, upstream: respx.Router
) -> None:
    upstream.post("/chat/completions").respond(json={
        "id": "c", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": "Noted."}}],
    })  # fmt: skip
    client = await manager_client(make_client, Remembering())
    chat = await client.post("/v1/chat/completions", headers=ANN, json={
        "model": "m", "messages": [{"role": "user", "content": "I play the cello"}],
    })  # fmt: skip
    assert chat.status_code == 200
    await until(lambda: _learned(client, ["Plays the cello"]))
    export = owui_linear("Cello", [("user", "I play the cello"), ("assistant", "Noted."),
                                   ("user", "I practise daily")])  # fmt: skip
    result = (await learn(client, dumped(export))).json()
    assert (result["already_learned"], result["jobs"]) == (0, 1)  # only the new turn
    await until(lambda: _learned(client, ["Plays the cello", "Practises daily"]))


async def facts(client: httpx.AsyncClient) -> list[str]:
    found = await client.get("/v1/memories", params={"type": "fact"}, headers=ANN)
    return sorted(m["content"] for m in found.json()["data"])


async def _learned(client: httpx.AsyncClient, expected: list[str]) -> bool:
    return await facts(client) == expected


async def test_keys_and_users(make_client: AppClientFactory) -> None:
    client = await manager_client(make_client, Remembering(), **KEYS)
    body = dumped(OSLO)
    mine = await learn(client, body, AS_ANN)
    assert mine.status_code == 200 and mine.json()["user_id"] == "ann"
    assert_openai_error(await learn(client, body, AS_ANN, user="bob"), 403, param="user")
    assert_openai_error(await learn(client, body, ADMIN), 400, param="user")
    for headers in ({}, {"Authorization": "Bearer nope"}):
        assert_openai_error(await learn(client, body, headers), 401)
    bobs = await learn(client, body, ADMIN, user="bob")
    assert bobs.status_code == 200 and bobs.json()["user_id"] == "bob"
    assert bobs.json()["id"] != mine.json()["id"]
    # a run is its user's: another's progress is not seen
    other = await client.get(f"/v1/memories/learn/{bobs.json()['id']}", headers=AS_ANN)
    assert other.status_code == 200 and other.json()["user_id"] == "ann"
    assert other.json()["pending"] + other.json()["failed"] == 0


def _no_model() -> bytes:
    return dumped(gpt_linear("Cello", [("user", "I play the cello")]))


BAD: list[tuple[str, bytes, dict[str, str], int, str | None, str]] = [
    ("not JSON", b'[{"chat": ', {}, 400, None, "invalid_json"),
    ("bad UTF-8", b'["\xff"]', {}, 400, None, "invalid_json"),
    ("empty body", b"", {}, 400, None, "empty"),
    ("no conversation", b"[]", {}, 400, None, "empty"),
    ("a number", b"12", {}, 422, None, "unknown_format"),
    ("unknown format", b'[{"messages": []}]', {}, 422, "[0]", "unknown_format"),
    ("not the named format", dumped(OSLO), {"format": "chatgpt"}, 422, "[0]", "unknown_format"),
    ("unknown format name", dumped(OSLO), {"format": "claude"}, 422, "query.format",
     "invalid_value"),
    ("an empty model", dumped(OSLO), {"model": ""}, 422, "query.model", "invalid_value"),
    ("content a number",
     dumped(OSLO, owui_linear("Bad", [("user", "ok"), ("assistant", 7)])), {}, 422,
     "[1].chat.history.messages.m1.content", "invalid_export"),
    ("a time in 3000",
     dumped({**gpt_linear("Later", [("user", "hi")]), "create_time": 32503680000}), {}, 422,
     "[0].create_time", "invalid_export"),
    ("no model for ChatGPT", _no_model(), {}, 422, "model", "model_required"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "params", "status", "param", "code"),
                         [b[1:] for b in BAD], ids=[b[0] for b in BAD])  # fmt: skip
async def test_bad_input_is_refused_with_nothing_queued(
    make_client: AppClientFactory,
    body: bytes,
    params: dict[str, str],
    status: int,
    param: str | None,
    code: str,
) -> None:
    client = await manager_client(make_client, Remembering())
    error = assert_openai_error(await learn(client, body, ANN, **params), status, param=param)
    assert error["code"] == code, error
    await nothing_queued(client)


async def test_a_file_too_large_and_a_manager_off(make_client: AppClientFactory) -> None:
    client = await manager_client(make_client, Remembering(), memory_max_body_bytes=1024)
    big = dumped(owui_linear("Big", [("user", "x" * 2000)]))
    error = assert_openai_error(await learn(client, big), 413)
    assert "MEMPROXY_MEMORY_MAX_BODY_BYTES" in error["message"]
    form = {**ANN, "Content-Type": "application/x-www-form-urlencoded"}  # curl's -d default
    assert_openai_error(await learn(client, dumped(OSLO), form), 415)
    await nothing_queued(client)
    off = await make_client()  # the tests' default: no Manager
    error = assert_openai_error(await learn(off, dumped(OSLO)), 409)
    assert error["code"] == "manager_disabled"


async def test_a_model_named_or_configured_learns_chatgpt_exports(
    make_client: AppClientFactory,
) -> None:
    client = await manager_client(make_client, Remembering())
    named = await learn(client, _no_model(), model="llama3")
    assert named.status_code == 200 and named.json()["format"] == "chatgpt"
    async with services(client).store.sessions() as session:
        (payload,) = (await session.scalars(select(ManagerJob.payload))).all()
    assert payload["model"] == "llama3"
    await until(lambda: _learned(client, ["Plays the cello"]))
    export = read_export(_no_model())
    assert manager_model(export, None, "qwen") == "qwen"  # MEMPROXY_MANAGER_MODEL
    assert manager_model(export, "llama3", "qwen") == "llama3"
    assert manager_model(read_export(dumped(OSLO)), None, "") is None  # the chat's own


async def test_progress_of_an_unknown_run(make_client: AppClientFactory) -> None:
    client = await manager_client(make_client, Remembering())
    assert_openai_error(await client.get("/v1/memories/learn/nope", headers=ANN), 404, param="run")
    unknown = (await client.get("/v1/memories/learn/0123456789ab", headers=ANN)).json()
    assert (unknown["pending"], unknown["failed"]) == (0, 0)
