"""API keys and user resolution, through the HTTP API."""

from __future__ import annotations

import httpx
import pytest
import respx

from app.config import ApiKey
from app.proxy.identity import Authenticator, resolve_user
from app.schemas.openai import EndUser
from tests.helpers import RecordingHooks, assert_openai_error, chat_body, completion_json
from tests.servers import serve_stack


@pytest.fixture
def ok(upstream: respx.Router) -> respx.Route:
    return upstream.post("/chat/completions").respond(json=completion_json())


async def user_of(
    client: httpx.AsyncClient, hooks: RecordingHooks, body=None, **headers: str
) -> str:
    response = await client.post("/v1/chat/completions", json=body or chat_body(), headers=headers)
    assert response.status_code == 200, response.text
    return hooks.prepared[-1].user_id


async def test_user_precedence(make_client, ok) -> None:
    hooks = RecordingHooks()
    client = await make_client(hooks=hooks)
    assert await user_of(client, hooks) == "anonymous"
    assert await user_of(client, hooks, chat_body(user="body-user")) == "body-user"
    assert await user_of(client, hooks, chat_body(user={"id": "owui-7", "name": "Ann"})) == "owui-7"
    assert (
        await user_of(client, hooks, chat_body(user="body-user"), **{"x-user-id": "hdr"}) == "hdr"
    )
    both = {"x-user-id": "generic", "x-openwebui-user-id": "owui"}
    assert await user_of(client, hooks, chat_body(user="body-user"), **both) == "owui"
    assert (
        await user_of(client, hooks, **{"x-openwebui-user-id": "  ", "x-user-id": "next"}) == "next"
    )


async def test_configurable_user_header(make_client, ok) -> None:
    hooks = RecordingHooks()
    client = await make_client(hooks=hooks, user_id_headers=["X-Remote-User"])
    assert (
        await user_of(client, hooks, **{"x-remote-user": "sso-1", "x-user-id": "ignored"})
        == "sso-1"
    )


async def test_keys_required_when_configured(make_client, ok) -> None:
    client = await make_client(api_keys=["sk-a", "sk-b:bob"])
    for headers in (
        {},
        {"authorization": "Bearer wrong"},
        {"authorization": "Basic sk-a"},
        {"authorization": "Bearer "},
    ):
        error = assert_openai_error(
            await client.post("/v1/chat/completions", json=chat_body(), headers=headers), 401
        )
        assert error["type"] == "authentication_error"
    assert_openai_error(await client.get("/v1/models"), 401)
    assert_openai_error(await client.post("/v1/embeddings", json={"input": "x"}), 401)
    assert (await client.get("/healthz")).status_code == 200
    good = await client.post(
        "/v1/chat/completions", json=chat_body(), headers={"authorization": "Bearer sk-a"}
    )
    assert good.status_code == 200
    assert not ok.calls.last.request.headers.get("authorization")


async def test_bound_key_acts_as_its_user_only(make_client, ok) -> None:
    hooks = RecordingHooks()
    client = await make_client(hooks=hooks, api_keys=["sk-bob:bob"])
    auth = {"authorization": "Bearer sk-bob"}
    assert await user_of(client, hooks, **auth) == "bob"
    assert await user_of(client, hooks, chat_body(user="alice"), **auth) == "bob"
    assert await user_of(client, hooks, **auth, **{"x-user-id": "bob"}) == "bob"
    response = await client.post(
        "/v1/chat/completions", json=chat_body(), headers={**auth, "x-user-id": "alice"}
    )
    assert assert_openai_error(response, 403)["code"] == "user_mismatch"
    response = await client.post(
        "/v1/chat/completions", json=chat_body(), headers={**auth, "x-openwebui-user-id": "alice"}
    )
    assert_openai_error(response, 403)


async def test_require_user(make_client, ok) -> None:
    hooks = RecordingHooks()
    client = await make_client(hooks=hooks, require_user=True)
    error = assert_openai_error(await client.post("/v1/chat/completions", json=chat_body()), 401)
    assert error["code"] == "user_required"
    assert await user_of(client, hooks, **{"x-user-id": "u"}) == "u"


def test_authenticator_compares_every_key() -> None:
    keys = [ApiKey("k1", None), ApiKey("k2", "u2")]
    auth = Authenticator(keys)
    assert auth.authenticate("Bearer k2") == keys[1]
    assert auth.authenticate("bearer k1") == keys[0]
    assert Authenticator([]).authenticate(None) is None


def test_resolve_user_object_and_control_characters() -> None:
    assert resolve_user({}, [], EndUser(id="x"), None, require_user=False) == "x"
    with pytest.raises(Exception, match="printable"):
        resolve_user({"x-user-id": "a\x00b"}, ["x-user-id"], None, None, require_user=False)


async def test_utf8_user_headers_name_the_same_user_as_the_body(make_client, ok) -> None:
    """HTTP carries header bytes; `José` in UTF-8 was read as latin-1 (`JosÃ©`), another user
    than the body's "José". Raw bytes, as curl and Open WebUI send them."""
    hooks = RecordingHooks()
    client = await make_client(hooks=hooks)
    assert await user_of(client, hooks, chat_body(user="José")) == "José"
    response = await client.post(
        "/v1/chat/completions", json=chat_body(), headers={"X-User-Id": "José".encode()}
    )
    assert response.status_code == 200 and hooks.prepared[-1].user_id == "José"
    owui = {"X-OpenWebUI-User-Id": "Zoë-東京".encode()}
    assert (await client.post("/v1/memories", json={"content": "likes tea"}, headers=owui)).json()[
        "user_id"
    ] == "Zoë-東京"
    listed = await client.get("/v1/memories", params={"user": "Zoë-東京"})
    assert [m["content"] for m in listed.json()["data"]] == ["likes tea"]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/memories"])
async def test_user_headers_that_are_not_utf8_are_refused_by_name(make_client, ok, path) -> None:
    client = await make_client()
    response = await client.request(
        "POST" if path.endswith("completions") else "GET",
        path,
        json=chat_body() if path.endswith("completions") else None,
        headers={"X-User-Id": b"Jos\xe9"},  # latin-1, not UTF-8
    )
    error = assert_openai_error(response, 400, param="X-User-Id")
    assert "UTF-8" in error["message"] and error["code"] == "invalid_user"


async def test_unbound_keys_may_name_users_by_default(make_client, ok) -> None:
    """What the README promises (one Open WebUI key serving all its users)."""
    hooks = RecordingHooks()
    client = await make_client(hooks=hooks, api_keys=["sk-owui"])
    auth = {"authorization": "Bearer sk-owui"}
    assert await user_of(client, hooks, **auth, **{"x-user-id": "alice"}) == "alice"
    assert await user_of(client, hooks, chat_body(user="bob"), **auth) == "bob"
    listed = await client.get("/v1/memories", headers={**auth, "x-user-id": "alice"})
    assert listed.status_code == 200


async def test_unbound_keys_cannot_name_users_when_turned_off(make_client, ok) -> None:
    """MEMPROXY_UNBOUND_KEYS_NAME_USERS=false: an unbound key is `anonymous`; a user header with
    it is refused (chat and every memory route), the body's user names nobody. Bound keys, admin
    keys and Open WebUI's signed token (tests/test_openwebui_jwt.py) are unaffected."""
    hooks = RecordingHooks()
    client = await make_client(
        hooks=hooks,
        api_keys=["sk-owui", "sk-bob:bob"],
        admin_keys=["sk-admin"],
        unbound_keys_name_users=False,
    )
    auth = {"authorization": "Bearer sk-owui"}
    assert await user_of(client, hooks, **auth) == "anonymous"
    assert await user_of(client, hooks, chat_body(user="alice"), **auth) == "anonymous"
    assert ok.calls.last.request.content.count(b'"alice"') == 1  # still forwarded as a tag
    named = {**auth, "x-openwebui-user-id": "alice"}
    error = assert_openai_error(
        await client.post("/v1/chat/completions", json=chat_body(), headers=named),
        403,
        param="X-OpenWebUI-User-Id",
    )
    assert error["code"] == "unbound_key" and "MEMPROXY_UNBOUND_KEYS_NAME_USERS" in error["message"]
    admin = {"authorization": "Bearer sk-admin"}
    created = await client.post("/v1/memories?user=alice", json={"content": "x"}, headers=admin)
    assert created.status_code == 201
    named = {**auth, "x-user-id": "alice"}
    for method, path in (
        ("GET", "/v1/memories"),
        ("GET", "/v1/memories/export"),
        ("DELETE", "/v1/memories?confirm=true"),
    ):
        response = await client.request(method, path, headers=named)
        assert_openai_error(response, 403, param="X-User-Id")
    assert (await client.get("/v1/memories?user=alice", headers=admin)).json()["data"]
    assert (await client.get("/v1/memories", headers=auth)).json()["data"] == []  # anonymous's
    bob = {"authorization": "Bearer sk-bob"}
    assert await user_of(client, hooks, **bob, **{"x-user-id": "bob"}) == "bob"


async def test_admin_keys_cannot_chat(make_client, ok) -> None:
    """An admin key belongs to no user: chat (JSON and stream, with or without a body) says so
    with 403 ``admin_key`` instead of calling the key invalid."""
    client = await make_client(api_keys=["sk-bob:bob"], admin_keys=["sk-admin"])
    admin = {"authorization": "Bearer sk-admin"}
    for body in (chat_body(), chat_body(stream=True)):
        response = await client.post("/v1/chat/completions", json=body, headers=admin)
        error = assert_openai_error(response, 403)
        assert error["type"] == "permission_error" and error["code"] == "admin_key"
        assert "client key" in error["message"]
    assert_openai_error(await client.get("/v1/models", headers=admin), 403)
    assert not ok.calls
    bad = {"authorization": "Bearer nope"}
    response = await client.post("/v1/chat/completions", json=chat_body(), headers=bad)
    assert assert_openai_error(response, 401)["code"] == "invalid_api_key"


async def test_unbound_keys_turned_off_with_require_user_are_refused(make_client, ok) -> None:
    client = await make_client(
        api_keys=["sk-owui"], unbound_keys_name_users=False, require_user=True
    )
    response = await client.post(
        "/v1/chat/completions",
        json=chat_body(user="alice"),
        headers={"authorization": "Bearer sk-owui"},
    )
    error = assert_openai_error(response, 401)
    assert error["code"] == "user_required" and "bound to no user" in error["message"]


def test_utf8_user_headers_over_a_real_server() -> None:
    """The bytes as uvicorn's HTTP parser hands them over (obs-text), not only over ASGI."""
    with serve_stack() as stack:
        url = f"{stack.proxy_url}/v1/memories"
        created = httpx.post(url, json={"content": "tea"}, headers={"X-User-Id": "José".encode()})
        assert created.status_code == 201 and created.json()["user_id"] == "José"
        listed = httpx.get(url, params={"user": "José"})
        assert [m["content"] for m in listed.json()["data"]] == ["tea"]
        refused = httpx.get(url, headers={"X-User-Id": b"Jos\xe9"})
        assert_openai_error(refused, 400, param="X-User-Id")
