"""A recording fake Manager model server for bench/replicas.py: OpenAI chat completions.

Each call takes `MANAGER_DELAY_MS` (400) give or take a quarter, and appends one JSON line to
`MANAGER_LOG`: the bench tokens (:data:`TOKEN`) found in the prompt's new exchange, after the
line :data:`~app.memory.learning.prompt.EXCHANGE` (memories shown and context turns come before
it and are not counted). It answers one NEW operation per token, "Code word is <token>", in the
output mode asked for: JSON content for a `response_format`, else the output tool call.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import time
from typing import Any

import orjson

from app.devtools.fake_upstream import read_body
from app.memory.learning.prompt import EXCHANGE
from bench.fake_manager import completion, lifespan, respond

TOKEN = re.compile(r"tok-u\d+-c\d+-t\d+")
"""A bench turn's token: user, conversation and turn numbers."""


def new_tokens(request: dict[str, Any]) -> list[str]:
    """The tokens of the new exchange in the Manager prompt (the last user message), in order."""
    users = [m for m in request.get("messages", ()) if m.get("role") == "user"]
    content = users[-1].get("content", "") if users else ""
    if isinstance(content, list):  # content parts
        content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    _, found, new = str(content).partition(EXCHANGE)
    return list(dict.fromkeys(TOKEN.findall(new))) if found else []


def _record(tokens: list[str]) -> None:
    with open(os.environ["MANAGER_LOG"], "a", encoding="utf-8") as log:
        log.write(orjson.dumps({"at": time.time(), "tokens": tokens}).decode() + "\n")


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        await lifespan(receive, send)
        return
    request = orjson.loads(await read_body(receive) or b"{}")
    tokens = new_tokens(request)
    _record(tokens)  # as asked: a call whose caller dies before the answer still counts
    delay = int(os.environ.get("MANAGER_DELAY_MS", "400")) / 1000
    await asyncio.sleep(delay * random.uniform(0.75, 1.25))
    operations = [{"op": "NEW", "content": f"Code word is {t}", "type": "fact"} for t in tokens]
    await respond(send, completion(request, operations))
