"""What start-up says: where memproxy listens and what it talks to, the upstream's answer to
its check (a bad upstream is a warning, and memproxy serves anyway), and its warnings of an open
server or of client keys bound to no user."""

from __future__ import annotations

import io
import uuid
from typing import Any

import httpx
import pytest
import respx

from app import startup
from app.log import configure_logging
from tests.conftest import make_settings
from tests.helpers import completion_json, running
from tests.log_capture import build, capture, log_fixture  # noqa: F401 (the `log` fixture)


@pytest.mark.sqlite_only  # the line it checks names the SQLite file
async def test_start_up_says_where_what_and_warns_of_an_open_server(
    upstream: respx.Router, log: io.StringIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    upstream.get("/models").respond(json={"object": "list", "data": [{"id": "llama3.2"}]})
    app = build(upstream, upstream_check_at_start=True, host="0.0.0.0", port=8123)
    capture(log, monkeypatch)
    async with running(app) as client:
        await app.state.services.runner.drain(5)  # the upstream check runs in the background
        assert (await client.get("/healthz")).status_code == 200
    text = log.getvalue()
    assert "listening on http://0.0.0.0:8123 (OpenAI base URL: http://0.0.0.0:8123/v1)" in text
    assert "upstream: http://upstream.test/v1" in text
    assert (
        "database: sqlite+aiosqlite:///" in text
        and "embedding model: all-MiniLM-L6-v2 (bundled) (vectors fake-bow-64" in text
    )
    assert "WARNING" in text and "MEMPROXY_API_KEYS is empty" in text
    assert "upstream http://upstream.test/v1 answered: 1 model(s): llama3.2" in text


async def test_the_check_sends_a_request_id_that_servers_validating_it_accept(
    upstream: respx.Router, log: io.StringIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    """llama-cpp-python's server (starlette-context's RequestIdPlugin) answers 400 to an
    X-Request-ID that is not a UUID; the check's used to be "startup-check", so a server that
    answers GET /v1/models with 200 was reported as answering 400."""

    def models(request: httpx.Request) -> httpx.Response:
        try:
            uuid.UUID(request.headers.get("x-request-id", ""))
        except ValueError:
            return httpx.Response(400, json={"detail": "Invalid X-Request-ID"})
        return httpx.Response(200, json={"object": "list", "data": [{"id": "qwen"}]})

    upstream.get("/models").mock(side_effect=models)
    app = build(upstream, upstream_check_at_start=True)
    capture(log, monkeypatch)
    async with running(app):
        await app.state.services.runner.drain(5)
    assert "upstream http://upstream.test/v1 answered: 1 model(s): qwen" in log.getvalue()
    assert "answered 400" not in log.getvalue()


@pytest.mark.parametrize(
    ("answer", "warning"),
    [
        (httpx.ConnectError("connection refused"), "upstream not reachable at start"),
        (httpx.Response(401, json={"error": "bad key"}), "refused the model list (401)"),
        (httpx.Response(500, text="boom"), "answered 500 to GET /models"),
    ],
    ids=["unreachable", "refused", "broken"],
)
async def test_a_bad_upstream_is_a_warning_and_memproxy_serves_anyway(
    upstream: respx.Router,
    log: io.StringIO,
    monkeypatch: pytest.MonkeyPatch,
    answer: Any,
    warning: str,
) -> None:
    route = upstream.get("/models")
    if isinstance(answer, Exception):
        route.side_effect = answer
    else:
        route.return_value = answer
    upstream.post("/chat/completions").respond(json=completion_json())
    app = build(upstream, upstream_check_at_start=True, api_keys=["k1"])
    capture(log, monkeypatch)
    async with running(app) as client:
        await app.state.services.runner.drain(5)
        chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        response = await client.post(
            "/v1/chat/completions", json=chat, headers={"Authorization": "Bearer k1"}
        )
        assert response.status_code == 200  # started and serving
    text = log.getvalue()
    assert warning in text and "MEMPROXY_API_KEYS is empty" not in text
    assert "k1" not in text.replace("client keys: 1", "")


def unbound_warnings(log: io.StringIO) -> list[str]:
    return [line for line in log.getvalue().splitlines() if "bound to no user" in line]


@pytest.mark.parametrize(
    ("settings", "warned"),
    [
        ({"api_keys": ["sk-owui", "sk-b:bob", "sk-c"]}, True),
        ({"api_keys": ["sk-a:ann", "sk-b:bob"]}, False),
        ({"api_keys": ["sk-owui"], "openwebui_jwt_secret": "s" * 32}, False),
        ({"api_keys": ["sk-owui"], "unbound_keys_name_users": False}, False),
    ],
    ids=["unbound", "all-bound", "jwt-secret", "turned-off"],
)
def test_unbound_keys_that_may_name_users_are_warned_about_at_start(
    log: io.StringIO, monkeypatch: pytest.MonkeyPatch, settings: dict[str, Any], warned: bool
) -> None:
    configure_logging("INFO", "text")
    capture(log, monkeypatch)
    startup.report(
        make_settings(**settings), embedding_model="fake", keys=len(settings["api_keys"])
    )
    lines = unbound_warnings(log)
    if not warned:
        assert lines == []
        return
    (line,) = lines
    assert " WARNING memproxy " in line
    assert line.split(" [-] ", 1)[1].startswith(
        "2 of the 3 MEMPROXY_API_KEYS are bound to no user: whoever holds one can name any user "
        "(X-OpenWebUI-User-Id, X-User-Id, or the body's 'user') and read, export and delete"
    )
    assert "MEMPROXY_UNBOUND_KEYS_NAME_USERS=false" in line
    assert "MEMPROXY_OPENWEBUI_JWT_SECRET" in line and "sk-" not in line


@pytest.mark.parametrize(("secret", "warned"), [("abc", True), ("s" * 31, True),
                                                ("s" * 32, False), (None, False)])  # fmt: skip
def test_a_short_open_webui_secret_is_warned_about_at_start(
    log: io.StringIO, monkeypatch: pytest.MonkeyPatch, secret: str | None, warned: bool
) -> None:
    """HS256 with a short secret can be brute-forced offline from one token: then anyone signs
    tokens for any user."""
    configure_logging("INFO", "text")
    capture(log, monkeypatch)
    startup.report(make_settings(openwebui_jwt_secret=secret), embedding_model="fake", keys=0)
    lines = [line for line in log.getvalue().splitlines() if "JWT_SECRET is" in line]
    if not warned:
        assert lines == []
        return
    (line,) = lines
    assert " WARNING memproxy " in line and secret not in line
    assert f"MEMPROXY_OPENWEBUI_JWT_SECRET is {len(secret or '')} bytes" in line
    assert "32" in line and "openssl rand -hex 32" in line
