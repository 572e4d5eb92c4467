"""Every bad input: the right 4xx in OpenAI's shape, nothing forwarded, and the server still serving."""

from __future__ import annotations

import httpx
import orjson
import pytest
import respx

from app.proxy.hooks import Preparation, RequestContext
from tests.helpers import RecordingHooks, assert_openai_error, chat_body, completion_json

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
    # OpenAI refuses anything but a JSON boolean, so a string that reads as one is refused too.
    *(
        (
            f"stream-{name}",
            b'{"model": "m", "stream": %s, "messages": [{"role": "user", "content": "x"}]}' % raw,
            422,
            "stream",
        )
        for name, raw in (("yes", b'"yes"'), ("true", b'"true"'), ("one", b"1"), ("zero", b"0"))
    ),
    (
        "user-wrong-type",
        b'{"model": "m", "user": 12, "messages": [{"role": "user", "content": "x"}]}',
        422,
        "user",
    ),
    # A "\ud800" escape is JSON's grammar but not Unicode: named like any other bad field.
    (
        "lone-surrogate-content",
        b'{"model": "m", "messages": [{"role": "user", "content": "a\\ud800b"}]}',
        422,
        "messages[0].content",
    ),
    (
        "lone-low-surrogate-in-part",
        b'{"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "\\udfff"}]}]}',
        422,
        "messages[0].content[0].text",
    ),
    (
        "lone-surrogate-key",
        b'{"model": "m", "\\ud800": 1, "messages": [{"role": "user", "content": "x"}]}',
        422,
        "\\ud800",
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


def nested(levels: int) -> object:
    """A JSON array `levels` deep: ``[[[...]]]``."""
    value: object = []
    for _ in range(levels - 1):
        value = [value]
    return value


def inject(ctx: RequestContext) -> Preparation:
    """What memory recall does to a chat body: a system message in front, the rest re-written."""
    memories = {"role": "system", "content": "The user plays chess."}
    return Preparation(body={**ctx.body, "messages": [memories, *ctx.body["messages"]]})


async def test_a_body_too_deep_to_rewrite_is_422_naming_where(
    make_client, upstream: respx.Router
) -> None:
    """orjson reads 1024 levels but writes 254: adding memories to a deeper body was a 500."""
    route = upstream.post("/chat/completions").respond(json=completion_json())
    client = await make_client(hooks=RecordingHooks(inject))
    deep = chat_body(extra={"a": nested(300)})
    response = await client.post("/v1/chat/completions", json=deep)
    error = assert_openai_error(response, 422)
    assert error["param"].startswith("extra.a[0][0]") and "254 levels" in error["message"]
    assert "X-Memory: off" in error["message"] and not route.called
    # Without memory the client's bytes go upstream untouched, however deep.
    off = await client.post("/v1/chat/completions", json=deep, headers={"x-memory": "off"})
    assert off.status_code == 200 and orjson.loads(route.calls.last.request.content) == deep
    # As deep as orjson writes (the body itself is level 1) is still rewritten.
    fits = chat_body(extra={"a": nested(252)})
    assert (await client.post("/v1/chat/completions", json=fits)).status_code == 200
    assert orjson.loads(route.calls.last.request.content)["messages"][0]["role"] == "system"


async def test_a_deep_body_inside_a_message_is_422_naming_the_message(
    make_client, upstream: respx.Router
) -> None:
    upstream.post("/chat/completions").respond(json=completion_json())
    client = await make_client(hooks=RecordingHooks(inject))
    body = {"model": "m", "messages": [{"role": "user", "content": "hi", "x": nested(260)}]}
    response = await client.post("/v1/chat/completions", json=body)
    # The place in the client's body, not in the rewritten one (memories went in front).
    assert assert_openai_error(response, 422)["param"].startswith("messages[0].x[0]")
