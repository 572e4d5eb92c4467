"""A conventional FastAPI mock of an OpenAI streaming endpoint for `overhead.py --upstream fastapi`.

The bundled fake (`app/devtools/fake_upstream.py`) is raw ASGI and costs ~0.15 ms of CPU per
request, far less than any real model server; this one is written the way most OpenAI mocks and
Python model servers are (FastAPI, JSON parsing, a StreamingResponse generator), so the
throughput ratio can be read against an upstream with a plausible per-request cost. It honours
the same `X-Fake-Chunks` and `X-Fake-Delay-Ms` headers.

Run: uvicorn --factory bench.fastapi_upstream:create_app --port 9000
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse


def create_app() -> FastAPI:
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> StreamingResponse:
        body = await request.json()
        text = "echo: " + str(body["messages"][-1]["content"])
        chunks = int(request.headers.get("x-fake-chunks", 8))
        delay = int(request.headers.get("x-fake-delay-ms", 0)) / 1000
        size = max(1, -(-len(text) // chunks))
        base = {"id": "chatcmpl-b", "object": "chat.completion.chunk", "created": int(time.time()),
                "model": body["model"]}  # fmt: skip

        async def events() -> AsyncIterator[str]:
            first = {
                "index": 0,
                "delta": {"role": "assistant", "content": ""},
                "finish_reason": None,
            }
            yield "data: " + json.dumps({**base, "choices": [first]}) + "\n\n"
            for i in range(0, len(text), size):
                if delay:
                    await asyncio.sleep(delay)
                choice = {
                    "index": 0,
                    "delta": {"content": text[i : i + size]},
                    "finish_reason": None,
                }
                yield "data: " + json.dumps({**base, "choices": [choice]}) + "\n\n"
            last = {"index": 0, "delta": {}, "finish_reason": "stop"}
            yield "data: " + json.dumps({**base, "choices": [last]}) + "\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app
