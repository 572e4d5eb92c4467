"""Every error body's `code` is a string or null, as OpenAI's SDKs expect: memproxy's own 404 and
405, and whatever an upstream sent (an integer code, Ollama's bare string, a FastAPI `detail`,
an HTML page)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import respx

from app.errors import normalise_upstream_error
from tests.helpers import assert_openai_error, chat_body


async def test_an_unknown_route_is_404_with_a_string_code(client: httpx.AsyncClient) -> None:
    assert assert_openai_error(await client.get("/nope"), 404)["code"] == "not_found"


@pytest.mark.parametrize(
    ("method", "path"), [("POST", "/healthz"), ("DELETE", "/chat/completions")]
)
async def test_a_wrong_method_is_405_with_a_string_code(
    client: httpx.AsyncClient, method: str, path: str
) -> None:
    response = await client.request(method, path)
    assert assert_openai_error(response, 405)["code"] == "method_not_allowed"


@pytest.mark.parametrize(
    ("status", "answer", "code"),
    [
        (429, {"json": {"error": {"message": "slow down", "type": "rate", "code": 429}}}, "429"),
        (400, {"json": {"error": {"message": "bad", "code": "context_length"}}}, "context_length"),
        (400, {"json": {"error": {"message": "bad"}}}, None),
        (404, {"json": {"error": "model 'llama9' not found"}}, "not_found"),
        (405, {"json": {"detail": "Method Not Allowed"}}, "method_not_allowed"),
        (502, {"text": "<html>Bad Gateway</html>"}, "bad_gateway"),
        (599, {"text": ""}, None),
    ],
    ids=["integer", "string", "missing", "ollama", "fastapi", "html", "unknown-status"],
)
async def test_an_upstream_error_is_relayed_with_a_string_code(
    client: httpx.AsyncClient,
    upstream: respx.Router,
    status: int,
    answer: dict[str, Any],
    code: str | None,
) -> None:
    upstream.post("/chat/completions").respond(status, **answer)
    error = assert_openai_error(await client.post("/v1/chat/completions", json=chat_body()), status)
    assert error["code"] == code


def test_an_upstream_error_keeps_its_other_fields() -> None:
    body = b'{"error": {"message": "slow down", "code": 429, "param": "model"}, "extra": 1}'
    assert normalise_upstream_error(429, body) == {
        "error": {"message": "slow down", "type": "invalid_request_error", "param": "model",
                  "code": "429"},
        "extra": 1,
    }  # fmt: skip
