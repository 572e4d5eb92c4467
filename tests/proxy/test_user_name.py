"""What the user is called (app/proxy/user_name.py): read from Open WebUI's forwarded header
(percent-encoded as it sends it, or not), X-User-Name, or the signed token's ``name``; never a
reason to refuse a chat; never sent upstream."""

from __future__ import annotations

import httpx
import pytest
import respx

from app.proxy.user_name import MAX_NAME_CHARS, clean_name, user_name
from tests.conftest import AppClientFactory
from tests.helpers import RecordingHooks, chat_body, completion_json
from tests.test_openwebui_jwt import SECRET, mint

NAMES = ("X-OpenWebUI-User-Name", "X-User-Name")


@pytest.mark.parametrize(
    ("raw", "name"),
    [
        ("Caroline", "Caroline"),
        ("Caroline%20Smith", "Caroline Smith"),  # Open WebUI: quote(user.name, safe=" ")
        ("Zo%C3%AB%20M%C3%BCller", "Zoë Müller"),
        ("  Ann   Lee ", "Ann Lee"),
        ("100% Ann", "100% Ann"),  # not percent-encoding: kept as written
        ("Zoe\u0308", "Zoë"),  # NFC
        ("", None),
        ("   ", None),
        ("Ann\x00", None),
        ("Ann%00", None),
        ("Ann\u202eLee", None),  # a bidirectional control: not a name
        ("A" * (MAX_NAME_CHARS + 1), None),
    ],
)
def test_a_name_is_cleaned_or_refused(raw: str, name: str | None) -> None:
    assert clean_name(raw) == name


def test_the_first_header_with_a_name_wins_and_raw_utf8_is_read() -> None:
    latin1 = "Zoë".encode().decode("latin-1")  # what Starlette hands over for UTF-8 bytes
    assert user_name({"X-User-Name": latin1}, NAMES, signed=False) == "Zoë"
    headers = {"X-OpenWebUI-User-Name": "\x01", "X-User-Name": "Bob"}
    assert user_name(headers, NAMES, signed=False) == "Bob"  # a bad one is no name: the next
    assert user_name({"X-User-Name": "\xff"}, NAMES, signed=False) is None  # not UTF-8
    assert user_name({}, NAMES, signed=False) is None
    assert user_name({"X-User-Name": "Bob"}, (), signed=False) is None  # no headers configured


@pytest.fixture
def route(upstream: respx.Router) -> respx.Route:
    return upstream.post("/chat/completions").respond(json=completion_json())


async def test_the_chat_gets_the_name_and_the_upstream_does_not(
    make_client: AppClientFactory, route: respx.Route
) -> None:
    hooks = RecordingHooks()
    client = await make_client(hooks=hooks)
    headers = {"X-User-Id": "ann", "X-OpenWebUI-User-Name": "Ann%20Lee", "X-User-Name": "Other"}
    response = await client.post("/v1/chat/completions", json=chat_body(), headers=headers)
    assert response.status_code == 200, response.text
    assert hooks.prepared[-1].user_name == "Ann Lee"
    sent = route.calls.last.request.headers
    assert "x-openwebui-user-name" not in sent and "x-user-name" not in sent

    bad = {"X-User-Id": "ann", "X-User-Name": "\x7fAnn\x00"}
    response = await client.post("/v1/chat/completions", json=chat_body(), headers=bad)
    assert response.status_code == 200, response.text  # no name, still served
    assert hooks.prepared[-1].user_name is None


async def test_with_signed_users_the_name_comes_from_the_token_only(
    make_client: AppClientFactory, route: respx.Route
) -> None:
    hooks = RecordingHooks()
    client = await make_client(hooks=hooks, openwebui_jwt_secret=SECRET)
    headers = {"X-OpenWebUI-User-Jwt": mint("ann", name="Ann Lee"), "X-User-Name": "Mallory"}
    response = await client.post("/v1/chat/completions", json=chat_body(), headers=headers)
    assert response.status_code == 200, response.text
    assert (hooks.prepared[-1].user_id, hooks.prepared[-1].user_name) == ("ann", "Ann Lee")
    nameless = {"X-OpenWebUI-User-Jwt": mint("ann", name=None), "X-User-Name": "Mallory"}
    response = await client.post("/v1/chat/completions", json=chat_body(), headers=nameless)
    assert response.status_code == 200, response.text
    assert hooks.prepared[-1].user_name is None
    assert "x-user-name" not in route.calls.last.request.headers


async def test_a_name_header_alone_names_no_user(
    make_client: AppClientFactory, route: respx.Route
) -> None:
    hooks = RecordingHooks()
    client: httpx.AsyncClient = await make_client(hooks=hooks)
    response = await client.post(
        "/v1/chat/completions", json=chat_body(), headers={"X-User-Name": "Ann"}
    )
    assert response.status_code == 200, response.text
    assert hooks.prepared[-1].user_id == "anonymous"  # a name is not an identity
