"""Small shared helpers: fake upstream answers, recording hooks, error-shape checks."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import orjson
from fastapi import FastAPI

from app.proxy.hooks import Completion, Preparation, RequestContext

UPSTREAM = "http://upstream.test/v1"


def free_port() -> int:
    """A loopback port nothing listens on (the OS's pick, released at once)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@asynccontextmanager
async def running(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """`app` with its lifespan entered, and an httpx client talking to it in-process."""
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://localhost") as client,
    ):
        yield client


def chat_body(text: str = "hello", **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": text}], **extra}


def completion_json(text: str = "hi there") -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }


def sse(*deltas: dict[str, Any], done: bool = True) -> bytes:
    out = b""
    for delta in deltas:
        event = {
            "id": "c",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
        }
        out += b"data: " + orjson.dumps(event) + b"\n\n"
    return out + (b"data: [DONE]\n\n" if done else b"")


def sse_response(body: bytes) -> httpx.Response:
    return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})


def assert_openai_error(
    response: httpx.Response, status: int, *, param: str | None = "*"
) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) >= {"error"}, body
    error = body["error"]
    assert set(error) >= {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"]
    assert error["code"] is None or isinstance(error["code"], str), error  # as OpenAI's SDKs expect
    if param != "*":
        assert error["param"] == param, error
    return dict(error)


class RecordingHooks:
    """Memory hooks that record what they were given; optionally rewrite the body or fail."""

    def __init__(
        self,
        prepare: Callable[[RequestContext], Preparation | None] | None = None,
        *,
        fail: bool = False,
    ) -> None:
        self.prepared: list[RequestContext] = []
        self.completed: list[tuple[RequestContext, Completion]] = []
        self._prepare = prepare
        self._fail = fail
        self._done = asyncio.Event()

    async def before_forward(self, ctx: RequestContext) -> Preparation | None:
        self.prepared.append(ctx)
        if self._fail:
            raise RuntimeError("memory is down")
        return self._prepare(ctx) if self._prepare else None

    async def after_response(self, ctx: RequestContext, completion: Completion) -> None:
        self.completed.append((ctx, completion))
        self._done.set()

    async def wait_completed(self, count: int = 1, seconds: float = 5.0) -> None:
        async def until() -> None:
            while len(self.completed) < count:
                self._done.clear()
                await self._done.wait()

        await asyncio.wait_for(until(), seconds)
