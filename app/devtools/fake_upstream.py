"""A fake OpenAI-compatible model server: for tests, benchmarks, and trying memproxy without an LLM.

Raw ASGI (no framework) so that in a benchmark it costs as little as possible. It answers
`/v1/chat/completions` (JSON or SSE), `/v1/models` and `/v1/embeddings`, with or without `/v1`.

Replies are predictable: ``echo: <last user text>`` (plus ``[N image(s)]`` when images were sent);
with ``tools`` and a user turn last it calls the first tool with ``{"query": <text>}``; after a
tool result it answers ``tool said: <result>``. A request carrying memproxy's Manager prompt gets
deterministic decisions from :mod:`app.devtools.fake_manager` (a tool call with ``tools``, JSON
content without). Request headers steer it (memproxy forwards them):

- ``X-Fake-Status: 429`` answer that status with an OpenAI error (``X-Fake-Error-Format: ollama``
  for Ollama's ``{"error": "text"}``, ``html`` for a reverse proxy's page);
- ``X-Fake-Chunks: N`` split the streamed reply into N content events (default 8);
- ``X-Fake-Delay-Ms: D`` wait D ms between events; ``X-Fake-Hang-Ms: H`` wait before answering;
- ``X-Fake-Fail-After: K`` after K content events write half an event and drop the connection;
- ``X-Fake-Split: 1`` write every event in two halves (with the delay between them);
- ``X-Fake-Echo-System: 1`` add ``system: <the system messages>`` on a line after the echo.

Every request is recorded in :attr:`FakeUpstream.received`; a client that goes away while the
fake is waiting is recorded in :attr:`FakeUpstream.disconnects` (monotonic time).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from dataclasses import dataclass
from typing import Any

import orjson

from app.devtools.fake_manager import decisions
from app.schemas.openai import content_text

MODEL_ID = "fake-model"
_SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
_JSON_HEADERS = [(b"content-type", b"application/json")]


@dataclass(frozen=True, slots=True)
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body)


class FakeUpstream:
    def __init__(self, keep: int = 1000) -> None:
        self.received: list[Received] = []
        self.disconnects: list[float] = []
        self._keep = keep

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = await read_body(receive)
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        path = scope["path"].removeprefix("/v1")
        self.received.append(Received(scope["method"], path, headers, body))
        del self.received[: -self._keep]

        hang = int(headers.get("x-fake-hang-ms", 0))
        if hang and await self._wait_or_disconnect(receive, hang):
            return
        status = int(headers.get("x-fake-status", 200))
        if status >= 400:
            await _send_error(send, status, headers.get("x-fake-error-format", "openai"))
        elif path == "/chat/completions" and scope["method"] == "POST":
            await self._chat(orjson.loads(body), headers, receive, send)
        elif path == "/models":
            created = 1_700_000_000
            data = {
                "object": "list",
                "data": [
                    {"id": MODEL_ID, "object": "model", "created": created, "owned_by": "fake"},
                    {
                        "id": "fake-model-2",
                        "object": "model",
                        "created": created,
                        "owned_by": "fake",
                    },
                ],
            }
            await _send_json(send, 200, data)
        elif path == "/embeddings" and scope["method"] == "POST":
            await _send_json(send, 200, _embeddings(orjson.loads(body)))
        else:
            await _send_error(send, 404, "openai", f"no route {scope['method']} {scope['path']}")

    async def _chat(
        self, request: dict[str, Any], headers: dict[str, str], receive: Any, send: Any
    ) -> None:
        text, tool_call = _reply(request, headers.get("x-fake-echo-system") == "1")
        model = request.get("model", MODEL_ID)
        if not request.get("stream"):
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if tool_call:
                message = {"role": "assistant", "content": None, "tool_calls": [tool_call]}
            await _send_json(
                send,
                200,
                {
                    "id": "chatcmpl-fake",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": model,
                    "choices": [
                        {
                            "index": 0,
                            "message": message,
                            "finish_reason": "tool_calls" if tool_call else "stop",
                        }
                    ],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
                },
            )
            return
        delay = int(headers.get("x-fake-delay-ms", 0))
        fail_after = int(headers.get("x-fake-fail-after", -1))
        split = headers.get("x-fake-split") == "1"
        events = _stream_events(
            model,
            text,
            tool_call,
            int(headers.get("x-fake-chunks", 8)),
            bool((request.get("stream_options") or {}).get("include_usage")),
        )
        await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
        for index, event in enumerate(events):
            if index == fail_after:
                await send(
                    {
                        "type": "http.response.body",
                        "body": b'data: {"choices": [{"del',
                        "more_body": True,
                    }
                )
                raise ConnectionAbortedError("fake upstream: failing mid-stream as asked")
            halves = (event[: len(event) // 2], event[len(event) // 2 :]) if split else (event,)
            for half in halves:
                await send({"type": "http.response.body", "body": half, "more_body": True})
                if delay and await self._wait_or_disconnect(receive, delay):
                    return
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _wait_or_disconnect(self, receive: Any, milliseconds: int) -> bool:
        """Sleep, unless the client disconnects first (then record it and say True)."""
        listener = asyncio.ensure_future(receive())
        done, _ = await asyncio.wait({listener}, timeout=milliseconds / 1000)
        if done and listener.result()["type"] == "http.disconnect":
            self.disconnects.append(time.monotonic())
            return True
        listener.cancel()
        return False


def _reply(request: dict[str, Any], echo_system: bool) -> tuple[str, dict[str, Any] | None]:
    messages = request.get("messages") or [{}]
    last = messages[-1]
    if last.get("role") == "tool":
        return f"tool said: {content_text(last.get('content'))}", None
    text = content_text(last.get("content"))
    tools = request.get("tools") or []
    answer = decisions(messages)
    if answer is not None and not tools:
        return orjson.dumps(answer).decode(), None
    if tools and last.get("role") == "user":
        name = tools[0].get("function", {}).get("name", "tool")
        arguments = answer if answer is not None else {"query": text}
        call = {
            "id": "call_fake_1",
            "type": "function",
            "function": {"name": name, "arguments": orjson.dumps(arguments).decode()},
        }
        return "", call
    content = last.get("content")
    images = (
        sum(1 for p in content if p.get("type") == "image_url") if isinstance(content, list) else 0
    )
    suffix = f" [{images} image{'s' if images != 1 else ''}]" if images else ""
    system = "\n".join(
        content_text(m.get("content")) for m in messages if m.get("role") == "system"
    )
    if echo_system and system:
        suffix += f"\nsystem: {system}"
    return f"echo: {text}{suffix}", None


def _stream_events(
    model: str, text: str, tool_call: dict[str, Any] | None, chunks: int, usage: bool
) -> list[bytes]:
    base = {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
    }

    def event(delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return b"data: " + orjson.dumps({**base, "choices": [choice]}) + b"\n\n"

    out = [event({"role": "assistant", "content": ""})]
    if tool_call:
        out.append(event({"tool_calls": [{"index": 0, **tool_call}]}))
    else:
        size = max(1, -(-len(text) // max(1, chunks)))
        out += [event({"content": text[i : i + size]}) for i in range(0, len(text), size)]
    out.append(event({}, "tool_calls" if tool_call else "stop"))
    if usage:
        stats = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        out.append(b"data: " + orjson.dumps({**base, "choices": [], "usage": stats}) + b"\n\n")
    out.append(b"data: [DONE]\n\n")
    return out


def _embeddings(request: dict[str, Any]) -> dict[str, Any]:
    inputs = request.get("input", "")
    items = inputs if isinstance(inputs, list) else [inputs]
    data = []
    for index, item in enumerate(items):
        digest = hashlib.sha256(str(item).encode()).digest()
        data.append(
            {"object": "embedding", "index": index, "embedding": [b / 255 for b in digest[:8]]}
        )
    return {
        "object": "list",
        "data": data,
        "model": request.get("model", "fake-embed"),
        "usage": {"prompt_tokens": len(items), "total_tokens": len(items)},
    }


async def read_body(receive: Any) -> bytes:
    """An ASGI request's whole body."""
    body = b""
    while True:
        message = await receive()
        body += bytes(message.get("body", b""))
        if not message.get("more_body"):
            return body


async def _send_json(send: Any, status: int, data: Any) -> None:
    body = orjson.dumps(data)
    await send({"type": "http.response.start", "status": status, "headers": _JSON_HEADERS})
    await send({"type": "http.response.body", "body": body})


async def _send_error(send: Any, status: int, fmt: str, message: str | None = None) -> None:
    message = message or f"fake upstream error {status}"
    if fmt == "html":
        body = f"<html><body><h1>{status} Bad Gateway</h1></body></html>".encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"text/html")],
            }
        )
        await send({"type": "http.response.body", "body": body})
    elif fmt == "ollama":
        await _send_json(send, status, {"error": message})
    else:
        await _send_json(
            send,
            status,
            {
                "error": {
                    "message": message,
                    "type": "invalid_request_error",
                    "param": None,
                    "code": "fake_error",
                }
            },
        )
