"""Upstream faults: HTTP errors relayed OpenAI-shaped with their status; unreachable -> 502;
timeouts -> 504, each naming the URL and the setting to change."""

from __future__ import annotations

import httpx
import pytest
import respx

from app.config import Settings
from app.main import create_app
from tests.fakes import FakeEmbedder
from tests.helpers import UPSTREAM, assert_openai_error, chat_body, free_port, running


@pytest.mark.parametrize("stream", [False, True])
async def test_openai_error_relayed_with_status_and_body(
    client, upstream: respx.Router, stream: bool
) -> None:
    error = {
        "error": {
            "message": "Rate limit reached",
            "type": "requests",
            "param": None,
            "code": "rate_limit",
        }
    }
    upstream.post("/chat/completions").respond(429, json=error, headers={"retry-after": "3"})
    response = await client.post("/v1/chat/completions", json=chat_body(stream=stream))
    assert response.status_code == 429
    assert response.json() == error


async def test_ollama_error_string_is_made_openai_shaped(client, upstream: respx.Router) -> None:
    upstream.post("/chat/completions").respond(404, json={"error": "model 'llama9' not found"})
    error = assert_openai_error(await client.post("/v1/chat/completions", json=chat_body()), 404)
    assert error["message"] == "model 'llama9' not found"


async def test_partial_openai_error_gets_missing_keys(client, upstream: respx.Router) -> None:
    upstream.post("/chat/completions").respond(400, json={"error": {"message": "bad temperature"}})
    error = assert_openai_error(
        await client.post("/v1/chat/completions", json=chat_body()), 400, param=None
    )
    assert error["message"] == "bad temperature" and error["type"] == "invalid_request_error"


async def test_html_error_page_is_wrapped(client, upstream: respx.Router) -> None:
    upstream.post("/chat/completions").respond(502, text="<html>Bad Gateway</html>")
    error = assert_openai_error(await client.post("/v1/chat/completions", json=chat_body()), 502)
    assert "Bad Gateway" in error["message"]


@pytest.mark.parametrize("stream", [False, True])
async def test_connect_error_is_502_naming_url_and_setting(
    client, upstream: respx.Router, stream: bool
) -> None:
    upstream.post("/chat/completions").mock(
        side_effect=httpx.ConnectError("Name or service not known")
    )
    error = assert_openai_error(
        await client.post("/v1/chat/completions", json=chat_body(stream=stream)), 502
    )
    assert UPSTREAM in error["message"] and "MEMPROXY_UPSTREAM_BASE_URL" in error["message"]
    assert error["code"] == "upstream_unreachable"


@pytest.mark.parametrize(
    ("exc", "setting"),
    [
        (httpx.ReadTimeout("slow"), "MEMPROXY_UPSTREAM_READ_TIMEOUT_SECONDS"),
        (httpx.ConnectTimeout("slow"), "MEMPROXY_UPSTREAM_CONNECT_TIMEOUT_SECONDS"),
    ],
)
async def test_timeout_is_504_naming_the_setting(
    client, upstream: respx.Router, exc, setting: str
) -> None:
    upstream.post("/chat/completions").mock(side_effect=exc)
    error = assert_openai_error(await client.post("/v1/chat/completions", json=chat_body()), 504)
    assert setting in error["message"] and UPSTREAM in error["message"]
    assert error["code"] == "upstream_timeout"


async def test_real_refused_connection_is_502_and_server_keeps_serving() -> None:
    base = f"http://127.0.0.1:{free_port()}/v1"
    app = create_app(
        Settings(upstream_base_url=base, manager_enabled=False), embedder=FakeEmbedder()
    )
    async with running(app) as client:
        for _ in range(2):
            error = assert_openai_error(
                await client.post("/v1/chat/completions", json=chat_body()), 502
            )
            assert base in error["message"]
        assert (await client.get("/healthz")).status_code == 200
        assert_openai_error(await client.get("/v1/models"), 502)


RETRY_HEADERS = {
    "retry-after": "7",
    "x-ratelimit-limit-requests": "60",
    "x-ratelimit-remaining-requests": "0",
    "x-ratelimit-reset-requests": "7s",
    "ratelimit-policy": "60;w=60",
}


@pytest.mark.parametrize(
    ("method", "path", "upstream_path"),
    [
        ("POST", "/v1/chat/completions", "/chat/completions"),
        ("POST", "/v1/embeddings", "/embeddings"),
        ("GET", "/v1/models", "/models"),
    ],
)
@pytest.mark.parametrize("status", [429, 503])
async def test_retry_and_rate_limit_headers_pass_through_error_statuses(
    client, upstream: respx.Router, method: str, path: str, upstream_path: str, status: int
) -> None:
    error = {"error": {"message": "slow down", "type": "requests", "param": None, "code": None}}
    upstream.route(method=method, path=upstream_path).respond(
        status, json=error, headers={**RETRY_HEADERS, "x-internal": "not for clients"}
    )
    body = chat_body() if method == "POST" else None
    response = await client.request(method, path, json=body)
    assert_openai_error(response, status)
    for name, value in RETRY_HEADERS.items():
        assert response.headers.get(name) == value, name
    assert "x-internal" not in response.headers


async def test_rate_limit_headers_pass_through_a_success(client, upstream: respx.Router) -> None:
    upstream.post("/chat/completions").respond(json={"id": "x"}, headers=RETRY_HEADERS)
    response = await client.post("/v1/chat/completions", json=chat_body())
    assert response.status_code == 200
    for name, value in RETRY_HEADERS.items():
        assert response.headers.get(name) == value, name
