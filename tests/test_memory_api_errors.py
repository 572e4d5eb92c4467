"""What the memory API refuses: another user's memories on every route, a user named by a key
that may not name one, and every bad input, each answered with an OpenAI-shaped 4xx that changes
nothing."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.conftest import AppClientFactory
from tests.helpers import assert_openai_error
from tests.memory_api_bad_requests import BAD_REQUESTS
from tests.memory_api_support import ANN, BOB, add, count


async def test_no_user_can_reach_another_users_memories(client: httpx.AsyncClient) -> None:
    secret = await add(client, "Ann's bank PIN hint is the cat's name")
    await add(client, "Bob likes chess", BOB)
    path = f"/v1/memories/{secret['id']}"

    assert_openai_error(await client.get(path, headers=BOB), 404)
    assert_openai_error(await client.patch(path, json={"content": "owned"}, headers=BOB), 404)
    assert_openai_error(await client.delete(path, headers=BOB), 404)
    listed = (await client.get("/v1/memories", params={"q": "PIN"}, headers=BOB)).json()
    assert listed["total"] == 0
    found = await client.post(
        "/v1/memories/search", json={"query": "bank PIN cat", "min_score": 0}, headers=BOB
    )
    assert [h["content"] for h in found.json()["data"]] == ["Bob likes chess"]
    exported = (await client.get("/v1/memories/export", headers=BOB)).content
    assert b"PIN" not in exported and b"chess" in exported
    stats = (await client.get("/v1/memories/stats", headers=BOB)).json()
    assert stats["total"] == 1 and stats["user_id"] == "bob"
    await client.delete("/v1/memories", params={"confirm": "true"}, headers=BOB)

    assert (await client.get(path, headers=ANN)).json()["content"] == secret["content"]
    assert await count(client, ANN) == 1


async def test_admin_keys_name_the_user_and_other_keys_cannot(
    make_client: AppClientFactory,
) -> None:
    client = await make_client(api_keys=["sk-ann:ann", "sk-any"], admin_keys=["sk-admin"])
    as_ann = {"Authorization": "Bearer sk-ann"}
    created = await add(client, "Ann's own memory", as_ann)
    assert created["user_id"] == "ann"

    admin = {"Authorization": "Bearer sk-admin"}
    listed = await client.get("/v1/memories", params={"user": "ann"}, headers=admin)
    assert [m["id"] for m in listed.json()["data"]] == [created["id"]]
    made = await client.post(
        "/v1/memories", params={"user": "carl"}, json={"content": "for carl"}, headers=admin
    )
    assert made.status_code == 201 and made.json()["user_id"] == "carl"

    for headers in (as_ann, {"Authorization": "Bearer sk-any"}):
        denied = await client.get("/v1/memories", params={"user": "carl"}, headers=headers)
        assert_openai_error(denied, 403, param="user")
    # a bound key cannot borrow another user through the headers either (as in chat)
    assert_openai_error(
        await client.get("/v1/memories", headers={**as_ann, "X-User-Id": "carl"}), 403
    )
    assert_openai_error(
        await client.get("/v1/memories", headers={"Authorization": "Bearer nope"}), 401
    )
    assert_openai_error(await client.get("/v1/memories"), 401)
    assert_openai_error(
        await client.get("/v1/memories", params={"user": "  "}, headers=admin), 400, param="user"
    )
    # the admin key is for the memory API only: chat says so (403 admin_key)
    refused = assert_openai_error(
        await client.post(
            "/v1/chat/completions", json={"model": "m", "messages": []}, headers=admin
        ),
        403,
    )
    assert refused["code"] == "admin_key"


@pytest.mark.parametrize(("method", "path", "body", "status", "param"),
                         [case[1:] for case in BAD_REQUESTS], ids=[case[0] for case in BAD_REQUESTS])  # fmt: skip
async def test_bad_input_is_an_openai_error_and_changes_nothing(
    make_client: AppClientFactory, method: str, path: str, body: Any, status: int, param: str | None
) -> None:
    client = await make_client(memory_max_chars=200)
    kept = await add(client, "the one memory that must survive")
    headers = {**ANN, "X-User-Id": "bad\x01user"} if param == "X-User-Id" else ANN
    kwargs: dict[str, Any] = {"headers": headers}
    if isinstance(body, bytes):
        kwargs["content"] = body
        if not path.endswith("/import"):
            kwargs["headers"] = {**headers, "content-type": "application/json"}
    elif body is not None:
        kwargs["json"] = body
    response = await client.request(method, path.replace("{id}", kept["id"]), **kwargs)
    assert_openai_error(response, status, param=param)
    assert (await client.get(f"/v1/memories/{kept['id']}", headers=ANN)).json() == kept
    assert await count(client) == 1
    assert (await client.get("/healthz")).status_code == 200


async def test_broken_json_body_is_400(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v1/memories", content=b'{"content": ', headers={**ANN, "content-type": "application/json"}
    )
    assert assert_openai_error(response, 400)["code"] == "invalid_json"
    assert await count(client) == 0
