"""Every bad input: the right 4xx in OpenAI's shape, nothing forwarded, and the server still serving."""

from __future__ import annotations

import httpx
import orjson
import pytest
import respx

from tests.helpers import assert_openai_error, chat_body, completion_json

BAD_BODIES = [
    # (id, raw body, status, param)
    ("invalid-json", b'{"model": "m", "messages": [', 400, None),
    ("empty-body", b"", 400, None),
    ("array-body", b'[{"role": "user"}]', 400, None),
    ("string-body", b'"hello"', 400, None),
    ("missing-messages", b'{"model": "m"}', 422, "messages"),
    ("empty-messages", b'{"model": "m", "messages": []}', 422, "messages"),
    ("messages-not-list", b'{"model": "m", "messages": "hi"}', 422, "messages"),
    ("message-not-object", b'{"model": "m", "messages": ["hi"]}', 422, "messages[0]"),
    (
        "unknown-role",
        b'{"model": "m", "messages": [{"role": "robot", "content": "x"}]}',
        422,
        "messages[0]",
    ),
    ("missing-role", b'{"model": "m", "messages": [{"content": "x"}]}', 422, "messages[0]"),
    (
        "content-number",
        b'{"model": "m", "messages": [{"role": "user", "content": 5}]}',
        422,
        "messages[0].content",
    ),
    (
        "content-object",
        b'{"model": "m", "messages": [{"role": "user", "content": {"a": 1}}]}',
        422,
        "messages[0].content",
    ),
    (
        "part-not-object",
        b'{"model": "m", "messages": [{"role": "user", "content": [1]}]}',
        422,
        "messages[0].content[0]",
    ),
    (
        "text-part-no-text",
        b'{"model": "m", "messages": [{"role": "user", "content": [{"type": "text"}]}]}',
        422,
        "messages[0].content[0].text",
    ),
    (
        "image-part-bad",
        b'{"model": "m", "messages": [{"role": "user", "content": '
        b'[{"type": "image_url", "image_url": {"detail": "low"}}]}]}',
        422,
        "messages[0].content[0].image_url.url",
    ),
    (
        "tool-without-id",
        b'{"model": "m", "messages": [{"role": "tool", "content": "x"}]}',
        422,
        "messages[0].tool_call_id",
    ),
    ("missing-model", b'{"messages": [{"role": "user", "content": "x"}]}', 422, "model"),
    (
        "stream-not-bool",
        b'{"model": "m", "stream": "yes please", "messages": [{"role": "user", "content": "x"}]}',
        422,
        "stream",
    ),
    (
        "user-wrong-type",
        b'{"model": "m", "user": 12, "messages": [{"role": "user", "content": "x"}]}',
        422,
        "user",
    ),
]


@pytest.mark.parametrize(
    ("raw", "status", "param"), [b[1:] for b in BAD_BODIES], ids=[b[0] for b in BAD_BODIES]
)
async def test_bad_body_is_refused_in_openai_shape(
    client: httpx.AsyncClient, upstream: respx.Router, raw: bytes, status: int, param: str | None
) -> None:
    route = upstream.post("/chat/completions").respond(json=completion_json("still here"))
    response = await client.post(
        "/v1/chat/completions", content=raw, headers={"content-type": "application/json"}
    )
    error = assert_openai_error(response, status, param=param)
    assert error["type"] == "invalid_request_error"
    assert not route.called
    # ...and the server still serves the next good request.
    ok = await client.post("/v1/chat/completions", json=chat_body())
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] == "still here"


async def test_body_over_limit_is_413_before_forwarding(
    make_client, upstream: respx.Router
) -> None:
    route = upstream.post("/chat/completions").respond(json=completion_json())
    client = await make_client(max_body_bytes=2048)
    big = orjson.dumps(chat_body("x" * 5000))
    error = assert_openai_error(await client.post("/v1/chat/completions", content=big), 413)
    assert "MEMPROXY_MAX_BODY_BYTES" in error["message"]
    assert error["code"] == "body_too_large"

    async def chunked():  # no Content-Length: the limit is enforced while reading
        for i in range(0, len(big), 500):
            yield big[i : i + 500]

    assert_openai_error(await client.post("/v1/chat/completions", content=chunked()), 413)
    assert not route.called
    assert (await client.post("/v1/chat/completions", json=chat_body())).status_code == 200


async def test_default_limit_accepts_a_large_image(
    client: httpx.AsyncClient, upstream: respx.Router
) -> None:
    route = upstream.post("/chat/completions").respond(json=completion_json())
    image = "data:image/png;base64," + "A" * (12 * 1024 * 1024)
    body = {
        "model": "m",
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what is this"},
                    {"type": "image_url", "image_url": {"url": image}},
                ],
            }
        ],
    }
    response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200
    assert len(route.calls.last.request.content) > 12 * 1024 * 1024


async def test_unknown_memory_header_is_400(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v1/chat/completions", json=chat_body(), headers={"x-memory": "sometimes"}
    )
    assert assert_openai_error(response, 400, param="X-Memory")["code"] == "invalid_header"


async def test_user_id_too_long_is_400(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v1/chat/completions", json=chat_body(), headers={"x-user-id": "u" * 300}
    )
    assert_openai_error(response, 400)


async def test_unknown_route_and_method_are_openai_shaped(client: httpx.AsyncClient) -> None:
    assert_openai_error(await client.get("/nope"), 404)
    assert_openai_error(await client.post("/healthz"), 405)


async def test_unknown_content_part_types_are_forwarded(
    client: httpx.AsyncClient, upstream: respx.Router
) -> None:
    route = upstream.post("/chat/completions").respond(json=completion_json())
    body = {
        "model": "m",
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "video_url", "video_url": {"url": "http://x/v.mp4"}},
                    {"type": "text", "text": "see"},
                ],
            }
        ],
    }
    response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200
    assert orjson.loads(route.calls.last.request.content) == body
