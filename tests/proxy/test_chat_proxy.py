"""The chat endpoint against a respx upstream: bytes, headers, auth policy, hooks, request ids."""

from __future__ import annotations

import httpx
import orjson
import pytest
import respx

from app.memory.block import BLOCK_START, insert_memory_block
from app.proxy.hooks import Outcome, Preparation
from app.proxy.kinds import MemoryMode, RequestKind
from tests.helpers import RecordingHooks, chat_body, completion_json, sse, sse_response

# Key order, spacing, unicode escapes and unknown fields must all survive the trip.
ODD_BODY = (
    b'{"messages":[{"role":"user","content":"caf\\u00e9 \xf0\x9f\x98\x80"}],  "model" : "llama3",'
    b'"num_keep": 5, "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],'
    b'"tool_choice": "auto", "response_format": {"type": "json_object"}, "temperature": 0.25}'
)


async def test_body_reaches_upstream_byte_for_byte(
    client: httpx.AsyncClient, upstream: respx.Router
) -> None:
    route = upstream.post("/chat/completions").respond(json=completion_json())
    response = await client.post(
        "/v1/chat/completions", content=ODD_BODY, headers={"content-type": "application/json"}
    )
    assert response.status_code == 200
    assert route.calls.last.request.content == ODD_BODY
    assert response.json() == completion_json()


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/embeddings"])
async def test_non_ascii_header_values_go_upstream_as_sent(
    client: httpx.AsyncClient, upstream: respx.Router, path: str
) -> None:
    """A UTF-8 header value (an app's `X-Title: Zoë`) reaches the upstream byte for byte; it
    was a 500 (httpx refuses non-ASCII str values)."""
    route = upstream.post(path.removeprefix("/v1")).respond(json=completion_json())
    title = "Zoë's notes".encode()
    response = await client.post(path, json=chat_body(), headers={"x-title": title})
    assert response.status_code == 200
    assert (b"x-title", title) in route.calls.last.request.headers.raw


async def test_path_without_v1_prefix_works(
    client: httpx.AsyncClient, upstream: respx.Router
) -> None:
    upstream.post("/chat/completions").respond(json=completion_json("x"))
    response = await client.post("/chat/completions", json=chat_body())
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == "x"


async def test_streaming_relays_upstream_bytes(
    client: httpx.AsyncClient, upstream: respx.Router
) -> None:
    body = sse({"role": "assistant", "content": ""}, {"content": "Hel"}, {"content": "lo"})
    upstream.post("/chat/completions").mock(return_value=sse_response(body))
    response = await client.post("/v1/chat/completions", json=chat_body(stream=True))
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.content == body


async def test_upstream_key_replaces_client_authorization(
    make_client, upstream: respx.Router
) -> None:
    route = upstream.post("/chat/completions").respond(json=completion_json())
    client = await make_client(upstream_api_key="sk-upstream")
    await client.post(
        "/v1/chat/completions", json=chat_body(), headers={"authorization": "Bearer sk-client"}
    )
    assert route.calls.last.request.headers["authorization"] == "Bearer sk-upstream"


async def test_client_authorization_passes_through_when_no_keys(
    client, upstream: respx.Router
) -> None:
    route = upstream.post("/chat/completions").respond(json=completion_json())
    await client.post(
        "/v1/chat/completions", json=chat_body(), headers={"authorization": "Bearer sk-own"}
    )
    assert route.calls.last.request.headers["authorization"] == "Bearer sk-own"


async def test_proxy_key_never_leaves_memproxy(make_client, upstream: respx.Router) -> None:
    route = upstream.post("/chat/completions").respond(json=completion_json())
    client = await make_client(api_keys=["sk-proxy"])
    response = await client.post(
        "/v1/chat/completions", json=chat_body(), headers={"authorization": "Bearer sk-proxy"}
    )
    assert response.status_code == 200
    assert "authorization" not in route.calls.last.request.headers


async def test_identity_headers_stay_here_others_go_upstream(
    client, upstream: respx.Router
) -> None:
    route = upstream.post("/chat/completions").respond(json=completion_json())
    await client.post(
        "/v1/chat/completions",
        json=chat_body(),
        headers={
            "x-openwebui-user-id": "u1",
            "x-openwebui-user-email": "a@b.c",
            "x-openwebui-user-name": "Ann",
            "x-user-id": "u1",
            "x-memory": "off",
            "x-openwebui-chat-id": "chat-9",
            "openai-organization": "org",
        },
    )
    sent = route.calls.last.request.headers
    for private in (
        "x-openwebui-user-id",
        "x-openwebui-user-email",
        "x-openwebui-user-name",
        "x-user-id",
        "x-memory",
    ):
        assert private not in sent
    assert sent["x-openwebui-chat-id"] == "chat-9"
    assert sent["openai-organization"] == "org"
    assert sent["accept-encoding"] == "identity"


async def test_request_id_is_echoed_and_forwarded(client, upstream: respx.Router) -> None:
    route = upstream.post("/chat/completions").respond(json=completion_json())
    response = await client.post(
        "/v1/chat/completions", json=chat_body(), headers={"x-request-id": "req-42"}
    )
    assert response.headers["x-request-id"] == "req-42"
    assert route.calls.last.request.headers["x-request-id"] == "req-42"
    generated = await client.post("/v1/chat/completions", json=chat_body())
    assert len(generated.headers["x-request-id"]) == 32
    unsafe = await client.post(
        "/v1/chat/completions", json=chat_body(), headers={"x-request-id": "a b\tc"}
    )
    assert unsafe.headers["x-request-id"] != "a b\tc"


async def test_hook_rewrites_body_and_adds_headers(make_client, upstream: respx.Router) -> None:
    route = upstream.post("/chat/completions").respond(json=completion_json())
    hooks = RecordingHooks(
        lambda ctx: Preparation(
            body=insert_memory_block(ctx.body, "- likes tea"), headers={"x-memproxy-memories": "1"}
        )
    )
    client = await make_client(hooks=hooks)
    response = await client.post(
        "/v1/chat/completions", json=chat_body("what do I like?"), headers={"x-user-id": "ann"}
    )
    assert response.headers["x-memproxy-memories"] == "1"
    sent = orjson.loads(route.calls.last.request.content)
    assert sent["messages"][0]["role"] == "system"
    assert (
        BLOCK_START in sent["messages"][0]["content"]
        and "likes tea" in sent["messages"][0]["content"]
    )
    assert sent["messages"][1] == {"role": "user", "content": "what do I like?"}
    ctx = hooks.prepared[0]
    assert (ctx.user_id, ctx.kind, ctx.memory_mode) == ("ann", RequestKind.CHAT, MemoryMode.ON)


async def test_failing_hook_does_not_break_the_chat(make_client, upstream: respx.Router) -> None:
    route = upstream.post("/chat/completions").respond(json=completion_json("fine"))
    client = await make_client(hooks=RecordingHooks(fail=True))
    response = await client.post("/v1/chat/completions", content=ODD_BODY)
    assert response.status_code == 200
    assert route.calls.last.request.content == ODD_BODY


@pytest.mark.parametrize(
    ("messages", "headers"),
    [
        (
            [
                {
                    "role": "user",
                    "content": "### Task:\nGenerate a concise, 3-5 word title\n<chat_history>",
                }
            ],
            {},
        ),
        ([{"role": "user", "content": "hi"}], {"x-openwebui-task": "tags_generation"}),
        (
            [
                {"role": "user", "content": "q"},
                {
                    "role": "assistant",
                    "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": "{}"}}],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "42"},
            ],
            {},
        ),
        ([{"role": "user", "content": "hi"}], {"x-memory": "off"}),
    ],
    ids=["task-template", "task-header", "tool-continuation", "memory-off"],
)
async def test_no_recall_for_tasks_tools_and_opt_out(
    make_client, upstream, messages, headers
) -> None:
    upstream.post("/chat/completions").respond(json=completion_json())
    hooks = RecordingHooks()
    client = await make_client(hooks=hooks)
    response = await client.post(
        "/v1/chat/completions", json={"model": "m", "messages": messages}, headers=headers
    )
    assert response.status_code == 200
    assert hooks.prepared == []
    await hooks.wait_completed()
    ctx = hooks.completed[0][0]
    assert not ctx.write_allowed


async def test_completion_hook_gets_streamed_text_after_the_response(make_client, upstream) -> None:
    body = sse({"role": "assistant", "content": ""}, {"content": "I am "}, {"content": "here"})
    upstream.post("/chat/completions").mock(return_value=sse_response(body))
    hooks = RecordingHooks()
    client = await make_client(hooks=hooks)
    response = await client.post(
        "/v1/chat/completions",
        json=chat_body("hey", stream=True),
        headers={"x-openwebui-user-id": "u7"},
    )
    assert response.content == body
    await hooks.wait_completed()
    ctx, completion = hooks.completed[0]
    assert completion.outcome is Outcome.COMPLETED
    assert completion.assistant_text == "I am here"
    assert ctx.user_id == "u7" and ctx.write_allowed
    assert ctx.messages == [{"role": "user", "content": "hey"}]
    assert ctx.history.prompt == "hey"


async def test_completion_hook_gets_json_text_and_read_only_mode(make_client, upstream) -> None:
    upstream.post("/chat/completions").respond(json=completion_json("plain"))
    hooks = RecordingHooks()
    client = await make_client(hooks=hooks)
    await client.post("/v1/chat/completions", json=chat_body(), headers={"x-memory": "read-only"})
    await hooks.wait_completed()
    ctx, completion = hooks.completed[0]
    assert completion.assistant_text == "plain" and completion.finish_reason == "stop"
    assert ctx.recall_allowed and not ctx.write_allowed
    assert len(hooks.prepared) == 1


async def test_completion_hook_sees_upstream_failure(make_client, upstream) -> None:
    upstream.post("/chat/completions").respond(500, json={"error": {"message": "boom"}})
    hooks = RecordingHooks()
    client = await make_client(hooks=hooks)
    response = await client.post("/v1/chat/completions", json=chat_body())
    assert response.status_code == 500
    await hooks.wait_completed()
    assert hooks.completed[0][1].outcome is Outcome.UPSTREAM_FAILED
