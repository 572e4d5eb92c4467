"""Open WebUI's signed user (`MEMPROXY_OPENWEBUI_JWT_SECRET`): with the secret set the user comes
only from a valid `X-OpenWebUI-User-Jwt`; plain identity headers, bad tokens and the body's `user`
name nobody. Tokens are minted as Open WebUI mints them (backend/open_webui/utils/headers.py)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import jwt
import orjson
import pytest
import respx

from tests.conftest import AppClientFactory
from tests.helpers import RecordingHooks, assert_openai_error, chat_body, completion_json

SECRET = "a-shared-secret-of-at-least-32-bytes!"
TOKEN = "x-openwebui-user-jwt"


def mint(
    sub: str = "ann",
    *,
    secret: str = SECRET,
    lifetime: int = 86400,
    issued: int | None = None,
    **changes: Any,
) -> str:
    """A token with Open WebUI's claims; `changes` replaces or (None) removes claims. Valid for
    a day unless told: the parametrized ones are minted when the suite is collected, and a slow
    run reached them after Open WebUI's 300 s (wrong issuer: "it has expired")."""
    now = int(time.time()) if issued is None else issued
    claims: dict[str, Any] = {
        "sub": sub,
        "email": f"{sub}@example.org",
        "name": sub.title(),
        "role": "user",
        "iss": "open-webui",
        "iat": now,
        "exp": now + lifetime,
    }
    claims.update(changes)
    return jwt.encode({k: v for k, v in claims.items() if v is not None}, secret, algorithm="HS256")


@pytest.fixture
def route(upstream: respx.Router) -> respx.Route:
    return upstream.post("/chat/completions").respond(json=completion_json())


async def chat(client: httpx.AsyncClient, body: Any = None, **headers: str) -> httpx.Response:
    return await client.post("/v1/chat/completions", json=body or chat_body(), headers=headers)


async def user_of(
    client: httpx.AsyncClient, hooks: RecordingHooks, body: Any = None, **headers: str
) -> str:
    response = await chat(client, body, **headers)
    assert response.status_code == 200, response.text
    return hooks.prepared[-1].user_id


async def test_a_valid_token_gets_that_users_memories(
    make_client: AppClientFactory, route: respx.Route
) -> None:
    client = await make_client(openwebui_jwt_secret=SECRET)
    added = await client.post(
        "/v1/memories",
        json={"content": "My daughter Mia plays the violin"},
        headers={TOKEN: mint()},
    )
    assert added.status_code == 201, added.text
    question = chat_body(messages=[{"role": "user", "content": "Tips for Mia's violin practice?"}])

    response = await chat(client, question, **{TOKEN: mint()})
    assert response.headers["x-memories-injected"] == "1"
    sent = route.calls.last.request
    assert "Mia plays the violin" in orjson.loads(sent.content)["messages"][0]["content"]
    assert TOKEN not in sent.headers  # the token identifies a person: it stays here

    other = await chat(client, question, **{TOKEN: mint("bob")})
    assert other.headers["x-memories-injected"] == "0"
    listed = await client.get("/v1/memories", headers={TOKEN: mint("bob")})
    assert listed.status_code == 200 and listed.json()["data"] == []


@pytest.mark.parametrize("header", ["x-openwebui-user-id", "x-user-id"])
async def test_plain_identity_headers_are_refused(
    make_client: AppClientFactory, route: respx.Route, header: str
) -> None:
    client = await make_client(openwebui_jwt_secret=SECRET)
    for headers in ({header: "ann"}, {header: "ann", TOKEN: mint()}):
        error = assert_openai_error(await chat(client, **headers), 401)
        assert error["code"] == "unsigned_user_header" and error["type"] == "authentication_error"
        assert "FORWARD_USER_INFO_HEADER_JWT_SECRET" in error["message"]
    memory_api = await client.get("/v1/memories", headers={header: "ann"})
    assert assert_openai_error(memory_api, 401)["code"] == "unsigned_user_header"
    assert not route.calls


@pytest.mark.parametrize(
    ("token", "why"),
    [
        (mint(lifetime=-60), "expired"),
        # Open WebUI's default 300 s, long ago
        (mint(issued=int(time.time()) - 400, lifetime=300), "expired"),
        (mint(secret="another-secret-of-at-least-32-bytes!!"), "signature"),
        (mint(iss="someone-else"), "issuer"),
        (mint(iss=None), "'iss'"),
        (mint(exp=None), "'exp'"),
        (mint(sub=""), "'sub'"),
        ("not.a.token", "malformed"),
        (jwt.encode({"sub": "ann", "iss": "open-webui", "exp": 2**40}, None, "none"), "malformed"),
    ],
    ids=["expired", "default-lifetime-past", "wrong-secret", "wrong-issuer", "no-issuer",
         "no-expiry", "empty-sub", "garbage", "alg-none"],
)  # fmt: skip
async def test_bad_tokens_are_refused(
    make_client: AppClientFactory, route: respx.Route, token: str, why: str
) -> None:
    client = await make_client(openwebui_jwt_secret=SECRET)
    error = assert_openai_error(
        await chat(client, **{TOKEN: token}), 401, param="X-OpenWebUI-User-Jwt"
    )
    assert error["code"] == "invalid_user_token" and why in error["message"]
    memory_api = await client.get("/v1/memories", headers={TOKEN: token})
    assert assert_openai_error(memory_api, 401)["code"] == "invalid_user_token"
    assert not route.calls


async def test_clock_skew_within_the_leeway_is_accepted(
    make_client: AppClientFactory, route: respx.Route
) -> None:
    hooks = RecordingHooks()
    client = await make_client(hooks=hooks, openwebui_jwt_secret=SECRET)
    assert await user_of(client, hooks, **{TOKEN: mint(lifetime=-10)}) == "ann"
    assert await user_of(client, hooks, **{TOKEN: mint(issued=int(time.time()) + 10)}) == "ann"


async def test_without_a_token_the_body_user_names_nobody(
    make_client: AppClientFactory, route: respx.Route
) -> None:
    hooks = RecordingHooks()
    client = await make_client(hooks=hooks, openwebui_jwt_secret=SECRET)
    assert await user_of(client, hooks, chat_body(user="mallory")) == "anonymous"
    assert await user_of(client, hooks, chat_body(user="mallory"), **{TOKEN: mint()}) == "ann"
    strict = await make_client(openwebui_jwt_secret=SECRET, require_user=True)
    error = assert_openai_error(await chat(strict, chat_body(user="mallory")), 401)
    assert error["code"] == "user_required"


async def test_with_the_secret_and_no_keys_user_query_names_nobody(
    make_client: AppClientFactory,
) -> None:
    """`?user=` on the memory API is for admin keys, or anyone on a server with no keys and no
    secret; with the secret only the signed token names users there too."""
    client = await make_client(openwebui_jwt_secret=SECRET)
    for method, path, body in (
        ("POST", "/v1/memories", {"content": "Alice keeps bees"}),
        ("GET", "/v1/memories", None),
        ("GET", "/v1/memories/export", None),
        ("DELETE", "/v1/memories", None),
    ):
        response = await client.request(method, path, params={"user": "alice"}, json=body)
        error = assert_openai_error(response, 403)
        assert error["param"] == "user", (method, path)
    signed = await client.post(
        "/v1/memories", json={"content": "Alice keeps bees"}, headers={TOKEN: mint("alice")}
    )
    assert signed.status_code == 201
    listed = await client.get("/v1/memories", headers={TOKEN: mint("alice")})
    assert [m["content"] for m in listed.json()["data"]] == ["Alice keeps bees"]


async def test_a_bound_key_stays_its_users(
    make_client: AppClientFactory, route: respx.Route
) -> None:
    hooks = RecordingHooks()
    client = await make_client(hooks=hooks, openwebui_jwt_secret=SECRET, api_keys=["sk-b:bob"])
    auth = {"authorization": "Bearer sk-b"}
    assert await user_of(client, hooks, **auth) == "bob"
    assert await user_of(client, hooks, **auth, **{TOKEN: mint("bob")}) == "bob"
    error = assert_openai_error(await chat(client, **auth, **{TOKEN: mint("ann")}), 403)
    assert error["code"] == "user_mismatch"


@pytest.mark.parametrize("secret", [None, "", "  "])
async def test_without_the_secret_nothing_changes(
    make_client: AppClientFactory, route: respx.Route, secret: str | None
) -> None:
    hooks = RecordingHooks()
    client = await make_client(hooks=hooks, openwebui_jwt_secret=secret)
    assert await user_of(client, hooks, **{"x-openwebui-user-id": "ann"}) == "ann"
    assert await user_of(client, hooks, chat_body(user="carl")) == "carl"
    # a token is not read (nor checked) when memproxy has no secret to check it with
    assert await user_of(client, hooks, **{TOKEN: mint("dora")}) == "anonymous"
    assert await user_of(client, hooks, **{TOKEN: "garbage"}) == "anonymous"


@pytest.mark.parametrize(
    "minted",
    [
        lambda now: mint(exp=253402300799),  # 9999-12-31
        lambda now: mint(lifetime=86400 + 3600),  # a day and an hour
        lambda now: mint(iat=None, exp=now + 2 * 86400),  # no `iat`: counted from now
        lambda now: mint(issued=0, lifetime=now + 60),  # issued in 1970, valid a minute more
    ],
    ids=["year-9999", "over-a-day", "no-iat", "issued-long-ago"],
)
async def test_a_token_living_longer_than_the_cap_is_refused(
    make_client: AppClientFactory, route: respx.Route, minted: Callable[[int], str]
) -> None:
    """Open WebUI's tokens live 300 s (FORWARD_USER_INFO_HEADER_JWT_EXPIRES_SECONDS); one that
    lives for years is a leaked key. The cap is a day unless set. (Minted when the test runs:
    the last two are valid for a minute or two from now.)"""
    token = minted(int(time.time()))
    client = await make_client(openwebui_jwt_secret=SECRET)
    error = assert_openai_error(
        await chat(client, **{TOKEN: token}), 401, param="X-OpenWebUI-User-Jwt"
    )
    assert error["code"] == "invalid_user_token"
    assert "MEMPROXY_OPENWEBUI_JWT_MAX_LIFETIME_SECONDS (86400)" in error["message"]
    assert "lives" in error["message"]
    memory_api = await client.get("/v1/memories", headers={TOKEN: token})
    assert assert_openai_error(memory_api, 401)["code"] == "invalid_user_token"
    assert not route.calls


async def test_the_lifetime_cap_is_a_setting(
    make_client: AppClientFactory, route: respx.Route
) -> None:
    hooks = RecordingHooks()
    client = await make_client(
        hooks=hooks, openwebui_jwt_secret=SECRET, openwebui_jwt_max_lifetime_seconds=600
    )
    assert await user_of(client, hooks, **{TOKEN: mint(lifetime=300)}) == "ann"  # Open WebUI's
    error = assert_openai_error(await chat(client, **{TOKEN: mint(lifetime=3600)}), 401)
    assert "MEMPROXY_OPENWEBUI_JWT_MAX_LIFETIME_SECONDS (600)" in error["message"]
