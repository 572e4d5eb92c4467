"""The official `openai` SDK against a real memproxy on loopback, compared with calling the fake
upstream directly: the upstream must receive the same body, the client the same content."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from app.devtools.fake_upstream import FakeUpstream
from tests.servers import serve_stack

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look something up",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}},
                "required": ["query"],
            },
        },
    }
]
TINY_PNG = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGBgAAAABQABpfZFQAAAAABJRU5ErkJggg=="


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[FakeUpstream, str, str]]:
    with serve_stack() as stack:
        yield stack.fake, stack.upstream_url, f"{stack.proxy_url}/v1"


def _both(servers: tuple[FakeUpstream, str, str], call: Any) -> tuple[Any, Any, bytes, bytes]:
    """Run `call(client)` directly and through memproxy; return both results and upstream bodies."""
    fake, direct_url, proxy_url = servers
    direct = call(openai.OpenAI(base_url=direct_url, api_key="sk-test", max_retries=0))
    direct_body = fake.received[-1].body
    proxied = call(openai.OpenAI(base_url=proxy_url, api_key="sk-test", max_retries=0))
    assert fake.received[-1].path == "/chat/completions"
    return direct, proxied, direct_body, fake.received[-1].body


def _content(completion: Any) -> Any:
    message = completion.choices[0].message
    calls = [(c.id, c.function.name, c.function.arguments) for c in message.tool_calls or ()]
    return message.content, calls, completion.choices[0].finish_reason, completion.model


def test_sync_non_streaming(servers) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
    direct, proxied, sent_direct, sent_proxied = _both(
        servers,
        lambda c: c.chat.completions.create(model="fake-model", messages=messages, temperature=0.2),
    )
    assert sent_proxied == sent_direct
    assert _content(proxied) == _content(direct) == ("echo: hi there", [], "stop", "fake-model")


def test_sync_streaming_with_usage(servers) -> None:
    def call(client: openai.OpenAI) -> list[Any]:
        stream = client.chat.completions.create(
            model="fake-model",
            messages=[{"role": "user", "content": "stream please"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        return list(stream)

    direct, proxied, sent_direct, sent_proxied = _both(servers, call)
    assert sent_proxied == sent_direct
    text = "".join(c.choices[0].delta.content or "" for c in proxied if c.choices)
    assert (
        text
        == "".join(c.choices[0].delta.content or "" for c in direct if c.choices)
        == "echo: stream please"
    )
    assert proxied[-1].usage.total_tokens == direct[-1].usage.total_tokens == 15


def test_tool_call_round_trip(servers) -> None:
    question = [{"role": "user", "content": "weather in Oslo?"}]
    direct, proxied, sent_direct, sent_proxied = _both(
        servers,
        lambda c: c.chat.completions.create(model="fake-model", messages=question, tools=TOOLS),
    )
    assert sent_proxied == sent_direct
    assert _content(proxied) == _content(direct)
    call = proxied.choices[0].message.tool_calls[0]
    assert call.function.name == "lookup"
    follow_up = [
        *question,
        proxied.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21C"},
    ]
    direct2, proxied2, sent_direct2, sent_proxied2 = _both(
        servers,
        lambda c: c.chat.completions.create(model="fake-model", messages=follow_up, tools=TOOLS),
    )
    assert sent_proxied2 == sent_direct2
    assert (
        proxied2.choices[0].message.content
        == direct2.choices[0].message.content
        == "tool said: sunny, 21C"
    )


def test_image_part(servers) -> None:
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is this?"},
                {"type": "image_url", "image_url": {"url": TINY_PNG}},
            ],
        }
    ]
    direct, proxied, sent_direct, sent_proxied = _both(
        servers, lambda c: c.chat.completions.create(model="fake-model", messages=messages)
    )
    assert sent_proxied == sent_direct
    assert proxied.choices[0].message.content == direct.choices[0].message.content
    assert proxied.choices[0].message.content == "echo: what is this? [1 image]"


async def test_async_streaming_and_not(servers) -> None:
    _fake, direct_url, proxy_url = servers
    results = {}
    for name, url in (("direct", direct_url), ("proxied", proxy_url)):
        client = openai.AsyncOpenAI(base_url=url, api_key="sk-test", max_retries=0)
        plain = await client.chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": "async hello"}]
        )
        stream = await client.chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": "async stream"}], stream=True
        )
        text = "".join([c.choices[0].delta.content or "" async for c in stream])
        results[name] = (plain.choices[0].message.content, text)
        await client.close()
    assert results["proxied"] == results["direct"] == ("echo: async hello", "echo: async stream")


def test_models_and_embeddings_through_one_base_url(servers) -> None:
    client = openai.OpenAI(base_url=servers[2], api_key="sk-test", max_retries=0)
    assert [m.id for m in client.models.list()] == ["fake-model", "fake-model-2"]
    embedding = client.embeddings.create(model="fake-embed", input=["a", "b"])
    assert len(embedding.data) == 2 and len(embedding.data[0].embedding) == 8


def test_errors_reach_the_sdk_as_api_errors(servers) -> None:
    client = openai.OpenAI(base_url=servers[2], api_key="sk-test", max_retries=0)
    with pytest.raises(openai.RateLimitError) as caught:
        client.chat.completions.create(
            model="fake-model",
            messages=[{"role": "user", "content": "x"}],
            extra_headers={"x-fake-status": "429"},
        )
    assert caught.value.status_code == 429
    with pytest.raises(openai.UnprocessableEntityError):
        client.chat.completions.create(
            model="fake-model", messages=[{"role": "wizard", "content": "x"}]
        )
    with pytest.raises(openai.APIError, match="mid-stream"):
        stream = client.chat.completions.create(
            model="fake-model",
            messages=[{"role": "user", "content": "x"}],
            stream=True,
            extra_headers={"x-fake-fail-after": "2"},
        )
        list(stream)
