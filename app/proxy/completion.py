"""Reading what the assistant said from a copy of the relayed bytes, after the response is done.

Handles an OpenAI chat completion JSON body and an SSE stream of ``chat.completion.chunk`` events
(text deltas joined, tool-call deltas merged by index). Only choice 0 is read: that is the one a
chat client shows. Malformed pieces are skipped: this runs after the fact and must not fail.
Used lazily by :class:`app.proxy.hooks.Completion`: nothing is parsed unless a hook asks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from app.schemas.openai import content_text


@dataclass(slots=True)
class Reply:
    """The assistant's side of the exchange (choice 0)."""

    assistant_text: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None


def read_reply(captured: list[bytes], *, status: int, sse: bool) -> Reply:
    """Parse the captured bytes of a response; an error status or garbage gives an empty reply."""
    raw = b"".join(captured)
    reply = Reply()
    if status >= 400 or not raw:
        return reply
    if sse or raw.lstrip().startswith(b"data:"):
        _read_stream(raw, reply)
    else:
        _read_body(raw, reply)
    return reply


def _read_body(raw: bytes, completion: Reply) -> None:
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return
    choice = _first_choice(data)
    if choice is None:
        return
    message = choice.get("message") or {}
    content = message.get("content")
    completion.assistant_text = content_text(content, sep="")
    calls = message.get("tool_calls")
    completion.tool_calls = (
        [c for c in calls if isinstance(c, dict)] if isinstance(calls, list) else []
    )
    completion.finish_reason = choice.get("finish_reason")
    completion.usage = data.get("usage") if isinstance(data.get("usage"), dict) else None


def _read_stream(raw: bytes, completion: Reply) -> None:
    texts: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    for line in raw.splitlines():
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if not payload or payload == b"[DONE]":
            continue
        try:
            event = orjson.loads(payload)
        except orjson.JSONDecodeError:
            continue
        if not isinstance(event, dict):
            continue
        if isinstance(event.get("usage"), dict):
            completion.usage = event["usage"]
        choice = _first_choice(event)
        if choice is None:
            continue
        delta = choice.get("delta") or {}
        if isinstance(delta.get("content"), str):
            texts.append(delta["content"])
        for call in delta.get("tool_calls") or ():
            if isinstance(call, dict):
                _merge_call(calls, call)
        if choice.get("finish_reason"):
            completion.finish_reason = choice["finish_reason"]
    completion.assistant_text = "".join(texts)
    completion.tool_calls = [calls[i] for i in sorted(calls)]


def _merge_call(calls: dict[int, dict[str, Any]], delta: dict[str, Any]) -> None:
    index = delta.get("index", len(calls))
    call = calls.setdefault(
        index, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
    )
    if delta.get("id"):
        call["id"] = delta["id"]
    function = delta.get("function") or {}
    if isinstance(function.get("name"), str):
        call["function"]["name"] += function["name"]
    if isinstance(function.get("arguments"), str):
        call["function"]["arguments"] += function["arguments"]


def _first_choice(data: Any) -> dict[str, Any] | None:
    if not isinstance(data, dict):
        return None
    for choice in data.get("choices") or ():
        if isinstance(choice, dict) and choice.get("index", 0) == 0:
            return choice
    return None
