"""A fake Manager model server for bench/manager_overhead.py: OpenAI chat completions that take
`MANAGER_DELAY_MS` (500) and answer with one NEW operation, in the output mode asked for: JSON
content for a `response_format` (what memproxy's `auto` asks first), else the output tool call."""

from __future__ import annotations

import asyncio
import itertools
import os
from typing import Any

import orjson

from app.devtools.fake_upstream import read_body

_counter = itertools.count()


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    request = await read_body(receive)
    await asyncio.sleep(int(os.environ.get("MANAGER_DELAY_MS", "500")) / 1000)
    arguments = orjson.dumps(
        {"operations": [{"op": "NEW", "content": f"Benchmark fact {next(_counter)}"}]}
    ).decode()
    call = {
        "id": "t",
        "type": "function",
        "function": {"name": "final_result", "arguments": arguments},
    }
    if "response_format" in orjson.loads(request or b"{}"):
        answer, finish = {"content": arguments}, "stop"
    else:
        answer, finish = {"content": None, "tool_calls": [call]}, "tool_calls"
    body = orjson.dumps({
        "id": "m", "object": "chat.completion", "created": 1, "model": "manager",
        "choices": [{"index": 0, "finish_reason": finish,
                     "message": {"role": "assistant", **answer}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    })  # fmt: skip
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json")]})  # fmt: skip
    await send({"type": "http.response.body", "body": body})
