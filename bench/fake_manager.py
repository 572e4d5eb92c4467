"""A fake Manager model server for bench/manager_overhead.py: OpenAI chat completions that take
`MANAGER_DELAY_MS` (500) and answer with one NEW operation, in the output mode asked for: JSON
content for a `response_format` (what memproxy's `auto` asks first), else the output tool call.
:func:`completion` and :func:`lifespan` serve bench/replicas_manager.py too."""

from __future__ import annotations

import asyncio
import itertools
import os
from typing import Any

import orjson

from app.devtools.fake_upstream import read_body

_counter = itertools.count()


async def lifespan(receive: Any, send: Any) -> None:
    while (await receive())["type"] != "lifespan.shutdown":
        await send({"type": "lifespan.startup.complete"})
    await send({"type": "lifespan.shutdown.complete"})


def completion(request: dict[str, Any], operations: list[dict[str, Any]]) -> bytes:
    """A chat completion answering with these operations, as the request asks for them."""
    arguments = orjson.dumps({"operations": operations}).decode()
    call = {"id": "t", "type": "function",
            "function": {"name": "final_result", "arguments": arguments}}  # fmt: skip
    answer: dict[str, Any]
    if "response_format" in request:
        answer, finish = {"content": arguments}, "stop"
    else:
        answer, finish = {"content": None, "tool_calls": [call]}, "tool_calls"
    return orjson.dumps({
        "id": "m", "object": "chat.completion", "created": 1, "model": "manager",
        "choices": [{"index": 0, "finish_reason": finish,
                     "message": {"role": "assistant", **answer}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    })  # fmt: skip


async def respond(send: Any, body: bytes) -> None:
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json")]})  # fmt: skip
    await send({"type": "http.response.body", "body": body})


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        await lifespan(receive, send)
        return
    request = orjson.loads(await read_body(receive) or b"{}")
    await asyncio.sleep(int(os.environ.get("MANAGER_DELAY_MS", "500")) / 1000)
    operation = {"op": "NEW", "content": f"Benchmark fact {next(_counter)}"}
    await respond(send, completion(request, [operation]))
