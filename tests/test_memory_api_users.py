"""The routes the memory page and admins need: the users (`/v1/users`, `/v1/users/me`), moving a
user's memories to another, importing copies with new ids, and a user's Manager jobs. Each with
its isolation: a key bound to a user reaches none of them for another user."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
import respx
from pydantic_ai import models
from pydantic_ai.messages import ModelMessage, ModelResponse
from pydantic_ai.models.function import AgentInfo, FunctionModel

from tests.conftest import AppClientFactory
from tests.fakes import LEARN_AT_ONCE, decided, unusable_manager
from tests.helpers import assert_openai_error, completion_json
from tests.memory_api_support import ANN, BOB, add, count

ADMIN = {"Authorization": "Bearer sk-admin"}
AS_ANN = {"Authorization": "Bearer sk-ann"}
KEYS: dict[str, Any] = {"api_keys": ["sk-ann:ann", "sk-bob:bob"], "admin_keys": ["sk-admin"]}


async def test_users_are_listed_with_counts_latest_activity_first_for_admins_only(
    make_client: AppClientFactory,
) -> None:
    client = await make_client(**KEYS)
    for text in ("Ann one", "Ann two"):
        await add(client, text, AS_ANN)
    await add(client, "Bob one", {"Authorization": "Bearer sk-bob"})
    listed = await client.get("/v1/users", headers=ADMIN)
    assert listed.status_code == 200, listed.text
    body = listed.json()
    assert body["object"] == "list" and body["total"] == 2 and not body["has_more"]
    assert [(u["id"], u["memories"]) for u in body["data"]] == [("bob", 1), ("ann", 2)]
    assert all(u["object"] == "user" and u["last_activity"] for u in body["data"])

    page = (await client.get("/v1/users", params={"limit": 1, "offset": 1}, headers=ADMIN)).json()
    assert [u["id"] for u in page["data"]] == ["ann"] and page["total"] == 2

    # deleting everything of a user erases their history too: they are no longer listed
    everything = {"confirm": "true", "user": "bob"}
    assert (
        await client.delete("/v1/memories", params=everything, headers=ADMIN)
    ).status_code == 200
    await add(client, "Ann three", AS_ANN)
    after = (await client.get("/v1/users", headers=ADMIN)).json()["data"]
    assert [(u["id"], u["memories"]) for u in after] == [("ann", 3)]  # bob's history went too

    assert_openai_error(await client.get("/v1/users", headers=AS_ANN), 403)
    assert_openai_error(await client.get("/v1/users", headers={"Authorization": "Bearer x"}), 401)
    assert_openai_error(await client.get("/v1/users"), 401)


async def test_an_admin_key_on_a_user_route_must_name_the_user(
    make_client: AppClientFactory,
) -> None:
    client = await make_client(**KEYS)
    await add(client, "Ann's", AS_ANN)
    for method, path in (("GET", "/v1/memories"), ("GET", "/v1/memories/stats"),
                         ("GET", "/v1/memories/export"), ("GET", "/v1/memories/jobs")):  # fmt: skip
        error = assert_openai_error(await client.request(method, path, headers=ADMIN), 400)
        assert error["param"] == "user" and error["code"] == "missing_user"
    assert_openai_error(
        await client.post("/v1/memories", json={"content": "whose?"}, headers=ADMIN),
        400,
        param="user",
    )
    assert await count(client, AS_ANN) == 1


async def test_who_am_i_says_the_role_and_the_user(make_client: AppClientFactory) -> None:
    client = await make_client(**KEYS)
    me = (await client.get("/v1/users/me", headers=AS_ANN)).json()
    assert me == {"object": "identity", "role": "user", "user_id": "ann"}
    me = (await client.get("/v1/users/me", headers=ADMIN)).json()
    assert me == {"object": "identity", "role": "admin", "user_id": None}
    assert_openai_error(
        await client.get("/v1/users/me", headers={"Authorization": "Bearer x"}), 401
    )
    open_client = await make_client()
    me = (await open_client.get("/v1/users/me", headers=ANN)).json()
    assert me == {"object": "identity", "role": "open", "user_id": "ann"}
    # nothing names a user where one is required: no user (the page asks), not a 401
    strict = await make_client(require_user=True)
    me = (await strict.get("/v1/users/me")).json()
    assert me == {"object": "identity", "role": "open", "user_id": None}
    assert_openai_error(await strict.get("/v1/memories"), 401)
    # admin keys only: without a key, chat's user (open chat), and a key opens every user
    admins = await make_client(admin_keys=["sk-admin"])
    assert (await admins.get("/v1/users/me")).json()["role"] == "user"
    assert_openai_error(await admins.get("/v1/users"), 403)


async def test_moving_gives_every_memory_with_its_history_to_the_other_user(
    make_client: AppClientFactory,
) -> None:
    client = await make_client(**KEYS)
    anon = {"user": "anonymous"}
    first = (await client.post("/v1/memories", params=anon, headers=ADMIN,
                               json={"content": "Has a beagle called Rex"})).json()  # fmt: skip
    await client.patch(f"/v1/memories/{first['id']}", params=anon, headers=ADMIN,
                       json={"content": "Has a beagle called Rex, aged 3"})  # fmt: skip
    await client.post("/v1/memories", params=anon, headers=ADMIN, json={"content": "Likes tea"})
    await add(client, "Ann already knew this", AS_ANN)
    # anonymous's index is cached before the move; it must not keep finding what left
    query = {"query": "beagle Rex", "min_score": 0.05}
    found = await client.post("/v1/memories/search", params=anon, headers=ADMIN, json=query)
    assert [h["id"] for h in found.json()["data"]] == [first["id"]]

    denied = await client.post(
        "/v1/memories/move", json={"from_user": "anonymous", "to_user": "ann"}, headers=AS_ANN
    )
    assert_openai_error(denied, 403)
    moved = await client.post(
        "/v1/memories/move", json={"from_user": " anonymous ", "to_user": "ann"}, headers=ADMIN
    )
    assert moved.status_code == 200, moved.text
    assert moved.json() == {"object": "memory.moved", "from_user": "anonymous",
                            "to_user": "ann", "moved": 2, "jobs": 0}  # fmt: skip

    assert await count(client, AS_ANN) == 3
    assert (await client.get("/v1/memories", params=anon, headers=ADMIN)).json()["total"] == 0
    got = (await client.get(f"/v1/memories/{first['id']}", headers=AS_ANN)).json()
    assert got["user_id"] == "ann" and got["content"] == "Has a beagle called Rex, aged 3"
    history = (await client.get(f"/v1/memories/{first['id']}/history", headers=AS_ANN)).json()
    assert [e["action"] for e in history["data"]] == ["created", "updated", "moved"]
    assert history["data"][-1]["detail"] == "moved from user 'anonymous'"
    gone = await client.post("/v1/memories/search", params=anon, headers=ADMIN, json=query)
    assert gone.json()["data"] == []
    hits = (await client.post("/v1/memories/search", headers=AS_ANN, json=query)).json()["data"]
    assert [h["id"] for h in hits] == [first["id"]]
    assert_openai_error(
        await client.get(f"/v1/memories/{first['id']}/history", params=anon, headers=ADMIN), 404
    )
    again = await client.post(
        "/v1/memories/move", json={"from_user": "anonymous", "to_user": "ann"}, headers=ADMIN
    )
    assert_openai_error(again, 404, param="from_user")


async def test_an_export_imported_with_new_ids_is_a_copy(make_client: AppClientFactory) -> None:
    client = await make_client()
    mine = [await add(client, text, ANN) for text in ("Lives in Oslo", "Has two cats")]
    exported = (await client.get("/v1/memories/export", headers=ANN)).content

    copied = await client.post(
        "/v1/memories/import", params={"ids": "new"}, content=exported, headers=BOB
    )
    assert copied.json() == {"imported": 2, "skipped": 0}
    bobs = (await client.get("/v1/memories", headers=BOB)).json()["data"]
    assert sorted(m["content"] for m in bobs) == ["Has two cats", "Lives in Oslo"]
    assert not {m["id"] for m in bobs} & {m["id"] for m in mine}
    assert {m["source"] for m in bobs} == {"import"}
    oslo = next(m for m in bobs if m["content"] == "Lives in Oslo")
    (event,) = (await client.get(f"/v1/memories/{oslo['id']}/history", headers=BOB)).json()["data"]
    assert (
        event["action"] == "created"
        and event["detail"] == f"imported as a copy of memory {mine[0]['id']}"
    )
    for memory in mine:  # the originals are untouched
        assert (await client.get(f"/v1/memories/{memory['id']}", headers=ANN)).json() == memory
    assert await count(client, ANN) == 2

    # a line without an id is a new memory, each time it is imported
    for _ in range(2):
        line = await client.post(
            "/v1/memories/import", content=b'{"content": "Plays chess"}\n', headers=BOB
        )
        assert line.json() == {"imported": 1, "skipped": 0}
    assert await count(client, BOB) == 4


async def test_a_users_failed_jobs_are_listed_with_the_reason_and_requeued(
    make_client: AppClientFactory, upstream: respx.Router, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(models, "ALLOW_MODEL_REQUESTS", False)
    manager, calls = unusable_manager()
    upstream.post("/chat/completions").respond(json=completion_json("Noted."))
    client = await make_client(manager_model=manager, manager_max_retries=0, **LEARN_AT_ONCE)
    chat = {"model": "m", "messages": [{"role": "user", "content": "Remember I like tea"}]}
    await client.post("/v1/chat/completions", json=chat, headers=ANN)
    jobs = await _until_failed(client, ANN)
    (job,) = jobs
    assert job["object"] == "manager.job" and job["explicit"] and job["messages"] == 2
    assert job["error"] and job["answer"] == "sure! I will remember that"
    assert (await client.get("/v1/memories/jobs", headers=BOB)).json()["data"] == []
    assert_openai_error(
        await client.post("/v1/memories/jobs/retry", json={"job_id": job["id"]}, headers=BOB),
        404, param="job_id",
    )  # fmt: skip

    asked = len(calls)
    retried = await client.post("/v1/memories/jobs/retry", json={"job_id": job["id"]}, headers=ANN)
    assert retried.json() == {"object": "manager.requeued", "requeued": 1}
    (again,) = await _until_failed(client, ANN, more_than=asked, calls=calls)
    assert again["id"] == job["id"] and len(calls) > asked  # the Manager was asked again
    everything = await client.post("/v1/memories/jobs/retry", headers=ANN)
    assert everything.json()["requeued"] == 1


async def _until_failed(
    client: httpx.AsyncClient, headers: dict[str, str], *, more_than: int = 0,
    calls: list[int] | None = None,
) -> list[dict[str, Any]]:  # fmt: skip
    for _ in range(500):
        data: list[dict[str, Any]] = (
            await client.get("/v1/memories/jobs", headers=headers)
        ).json()["data"]
        asked = len(calls) if calls is not None else more_than + 1
        if data and all(j["status"] == "failed" for j in data) and asked > more_than:
            return data
        await asyncio.sleep(0.01)
    raise AssertionError(f"no failed job: {data}")


async def test_a_move_takes_the_learned_turns_along_so_the_chat_is_not_learned_again(
    make_client: AppClientFactory, upstream: respx.Router, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README's case: chats were all `anonymous` until Open WebUI forwarded its user headers.
    After the move, the same conversation resent as the real user is not learned from twice."""
    monkeypatch.setattr(models, "ALLOW_MODEL_REQUESTS", False)
    asked: list[int] = []

    def manager(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        asked.append(1)
        return decided(info, {"operations": [{"op": "NEW", "content": "Likes green tea"}]})

    upstream.post("/chat/completions").respond(json=completion_json("Noted."))
    client = await make_client(manager_model=FunctionModel(manager), **LEARN_AT_ONCE)
    chat = {
        "model": "m",
        "messages": [{"role": "user", "content": "Remember that I like green tea"}],
    }
    anonymous = {"X-User-Id": "anonymous"}
    await client.post("/v1/chat/completions", json=chat, headers=anonymous)
    for _ in range(500):  # the fact and the user's words (an episode)
        if await count(client, anonymous) == 2:
            break
        await asyncio.sleep(0.01)
    assert len(asked) == 1
    moved = await client.post(
        "/v1/memories/move", json={"from_user": "anonymous", "to_user": "ann"}
    )
    assert moved.json()["moved"] == 2
    users = (await client.get("/v1/users")).json()["data"]
    assert [(u["id"], u["memories"]) for u in users] == [("ann", 2)]  # anonymous left nothing

    await client.post("/v1/chat/completions", json=chat, headers=ANN)
    stats = (await client.get("/v1/memories/stats", headers=ANN)).json()
    assert stats["total"] == 2 and stats["jobs"]["pending"] == 0
    await asyncio.sleep(0.2)
    assert len(asked) == 1 and await count(client, ANN) == 2


async def test_moving_a_user_with_only_history_changes_nothing(client: httpx.AsyncClient) -> None:
    gone = await add(client, "Deleted long ago", BOB)
    await client.delete(f"/v1/memories/{gone['id']}", headers=BOB)
    moved = await client.post("/v1/memories/move", json={"from_user": "bob", "to_user": "ann"})
    assert_openai_error(moved, 404, param="from_user")
    history = (await client.get(f"/v1/memories/{gone['id']}/history", headers=BOB)).json()["data"]
    assert [e["action"] for e in history] == ["created", "deleted"]  # still bob's
