"""API keys and user resolution, through the HTTP API."""

from __future__ import annotations

import httpx
import pytest
import respx

from app.config import ApiKey
from app.proxy.identity import Authenticator, resolve_user
from app.schemas.openai import EndUser
from tests.helpers import RecordingHooks, assert_openai_error, chat_body, completion_json


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
