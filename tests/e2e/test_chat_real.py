"""Chats through memproxy to a real model server, compared with the same request sent directly:
with temperature 0 and a seed the model answers the same, so any difference is memproxy's."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai

from bench.llm_server import LlamaServer

MESSAGES = [
    {"role": "system", "content": "You are a terse assistant."},
    {"role": "user", "content": "Name three primary colours, comma-separated."},
]
SAMPLING: dict[str, Any] = {"temperature": 0, "seed": 7, "max_tokens": 40}
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]  # fmt: skip


def clients(llm: LlamaServer, proxy: str) -> tuple[openai.OpenAI, openai.OpenAI]:
    def client(url: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=120)

    return client(llm.base_url), client(proxy)


def test_a_chat_answers_as_the_server_does_directly(llm: LlamaServer, proxy: str) -> None:
    direct, proxied = clients(llm, proxy)
    ask = {"model": llm.alias, "messages": MESSAGES, **SAMPLING}
    one = direct.chat.completions.create(**ask)
    two = proxied.with_raw_response.chat.completions.create(**ask, extra_headers={
        "X-Memory": "off"})  # fmt: skip
    answer = two.parse()
    assert answer.choices[0].message.content == one.choices[0].message.content
    assert answer.choices[0].message.content  # a real answer, not an empty echo
    assert answer.usage is not None and one.usage is not None
    assert answer.usage.completion_tokens == one.usage.completion_tokens


def test_a_streamed_chat_streams_the_same_text_and_the_usage_chunk(
    llm: LlamaServer, proxy: str
) -> None:
    direct, proxied = clients(llm, proxy)
    ask = {"model": llm.alias, "messages": MESSAGES, "stream": True,
           "stream_options": {"include_usage": True}, **SAMPLING}  # fmt: skip

    def read(client: openai.OpenAI) -> tuple[str, Any, int]:
        text, usage, chunks = "", None, 0
        for chunk in client.chat.completions.create(**ask, extra_headers={"X-Memory": "off"}):
            chunks += 1
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
            if chunk.usage is not None:
                usage = chunk.usage
        return text, usage, chunks

    (text_direct, usage_direct, _), (text, usage, chunks) = read(direct), read(proxied)
    assert text == text_direct and text
    assert chunks > 3  # streamed as it came, not one block
    assert usage is not None and usage.completion_tokens == usage_direct.completion_tokens


def test_a_tool_round_trip_reaches_the_model_and_back(llm: LlamaServer, proxy: str) -> None:
    """The tools, a tool call and its result go through memproxy as sent; the model answers from
    the result as it does directly."""
    direct, proxied = clients(llm, proxy)
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": "Lyon"})}}  # fmt: skip
    messages = [
        {"role": "user", "content": "What is the weather in Lyon?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 24 degrees Celsius"},
    ]
    ask = {"model": llm.alias, "messages": messages, "tools": TOOLS, **SAMPLING}
    one = direct.chat.completions.create(**ask)
    two = proxied.chat.completions.create(**ask)  # memory on: a chat with tools is still a chat
    assert two.choices[0].message.content == one.choices[0].message.content
    # What the 0.5B makes of it (it repeats the call as JSON text) is its own affair: the same.
    assert two.choices[0].message.content or two.choices[0].message.tool_calls


def test_memory_is_injected_and_the_model_uses_it(llm: LlamaServer, proxy: str) -> None:
    _, proxied = clients(llm, proxy)
    user = {"X-User-Id": "e2e-recall"}
    added = httpx.post(f"{proxy}/memories", headers=user,
                       json={"content": "The user's cat is called Pixel"})  # fmt: skip
    assert added.status_code == 201, added.text
    reply = proxied.with_raw_response.chat.completions.create(
        model=llm.alias, extra_headers=user, **SAMPLING,
        messages=[{"role": "user", "content": "What is my cat called? One word."}],
    )  # fmt: skip
    assert reply.headers["x-memories-injected"] == "1"
    assert "pixel" in (reply.parse().choices[0].message.content or "").lower()
