"""The Manager's wiring: the OpenAI / Ollama providers against an httpx2 mock transport (the client
pydantic-ai's providers take), the output modes as they reach the server, and failures that name
the URL and model."""

from __future__ import annotations

import asyncio
import io
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import httpx
import httpx2
import orjson
import pytest
import respx
from pydantic_ai import models

from app.config import Settings
from app.log import memproxy_handler
from app.main import create_app
from app.memory.learning.decisions import Op
from app.memory.learning.jobs import JobQueue
from app.memory.learning.manager import (
    Manager,
    ManagerUnavailable,
    build_http_client,
)
from tests.conftest import make_settings
from tests.fakes import FakeEmbedder
from tests.helpers import completion_json, free_port, running
from tests.memory.learning.manager_conversation import conversation


def completion(message: dict[str, Any]) -> dict[str, Any]:
    return {"id": "x", "object": "chat.completion", "created": 1, "model": "m2",
            "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}  # fmt: skip


@pytest.fixture
def allow_http_models() -> Iterator[None]:
    """Provider wiring tests: the HTTP edge is faked (a mock transport, or a closed port), so the
    model may 'request'."""
    models.ALLOW_MODEL_REQUESTS = True
    yield
    models.ALLOW_MODEL_REQUESTS = False


class FakeServer:
    """The Manager's model server at the HTTP edge: answers POST `url` with `answer`, records
    the requests to it (an httpx2 mock transport: respx fakes httpx only) and, apart, the
    others (the Manager asking the model's size: answered 404)."""

    def __init__(self, url: str, answer: dict[str, Any]) -> None:
        self.url = url
        self.answer = answer
        self.requests: list[httpx2.Request] = []
        self.others: list[httpx2.Request] = []

    def handle(self, request: httpx2.Request) -> httpx2.Response:
        if request.method != "POST" or str(request.url) != self.url:
            self.others.append(request)
            return httpx2.Response(404, json={"error": f"no route {request.url}"})
        self.requests.append(request)
        return httpx2.Response(200, json=self.answer)

    def client(self) -> httpx2.AsyncClient:
        return httpx2.AsyncClient(transport=httpx2.MockTransport(self.handle))


@pytest.mark.usefixtures("allow_http_models")
async def test_openai_provider_in_tool_mode_uses_the_upstream_and_tool_calls() -> None:
    arguments = orjson.dumps({"operations": [{"op": "NEW", "content": "Is vegetarian"}]}).decode()
    server = FakeServer("http://upstream.test/v1/chat/completions", completion({"content": None, "tool_calls": [
        {"id": "t1", "type": "function", "function": {"name": "final_result", "arguments": arguments}}]}))  # fmt: skip
    settings = Settings(upstream_base_url="http://upstream.test/v1", upstream_api_key="sk-up",
                        manager_temperature=0.1, manager_max_tokens=300,
                        manager_output_mode="tool")  # fmt: skip
    async with server.client() as http:
        operations = await Manager(settings, http_client=http).decide(
            "chat-model", **conversation()
        )
    assert operations is not None and operations[0].content == "Is vegetarian"
    (sent,) = server.requests
    body = orjson.loads(sent.content)
    assert sent.headers["authorization"] == "Bearer sk-up"
    assert body["model"] == "chat-model" and body["temperature"] == 0.1
    assert 300 in (body.get("max_tokens"), body.get("max_completion_tokens"))
    assert [t["function"]["name"] for t in body["tools"]] == ["final_result"]


@pytest.mark.usefixtures("allow_http_models")
async def test_auto_asks_for_json_schema_output_first() -> None:
    """What llama.cpp, vLLM, Ollama and OpenAI enforce with a grammar: `response_format`."""
    text = orjson.dumps({"operations": [{"op": "NEW", "content": "Is vegetarian"}]}).decode()
    server = FakeServer("http://upstream.test/v1/chat/completions", completion({"content": text}))
    settings = Settings(upstream_base_url="http://upstream.test/v1")
    async with server.client() as http:
        operations = await Manager(settings, http_client=http).decide("m", **conversation())
    assert [o.content for o in operations] == ["Is vegetarian"]
    (sent,) = server.requests
    body = orjson.loads(sent.content)
    assert body["response_format"]["type"] == "json_schema" and "tools" not in body
    schema = body["response_format"]["json_schema"]["schema"]
    assert schema["required"] == ["operations"] and schema["additionalProperties"] is False


@pytest.mark.usefixtures("allow_http_models")
async def test_auto_passes_over_a_mode_the_server_refuses() -> None:
    """llama-cpp-python answers `json_schema` with a 500: the next mode is tried."""
    arguments = orjson.dumps({"operations": []}).decode()
    called = completion({"content": None, "tool_calls": [
        {"id": "t1", "type": "function", "function": {"name": "final_result", "arguments": arguments}}]})  # fmt: skip
    sent: list[dict[str, Any]] = []

    def handle(request: httpx2.Request) -> httpx2.Response:
        if request.method == "GET":  # the Manager asks the model's size: none given
            return httpx2.Response(404)
        sent.append(orjson.loads(request.content))
        if "response_format" in sent[-1]:
            return httpx2.Response(500, json={"error": {"message": "json_schema unsupported"}})
        return httpx2.Response(200, json=called)

    settings = Settings(upstream_base_url="http://upstream.test/v1")
    async with httpx2.AsyncClient(transport=httpx2.MockTransport(handle)) as http:
        assert await Manager(settings, http_client=http).decide("m", **conversation()) == []
    assert "response_format" in sent[0] and "tools" in sent[-1]  # (the SDK retries a 500)


@pytest.mark.usefixtures("allow_http_models")
async def test_ollama_provider_uses_json_output_and_its_own_url_and_model() -> None:
    text = orjson.dumps({"operations": [{"op": "DELETE", "id": 2}]}).decode()
    server = FakeServer(
        "http://ollama.test:11434/v1/chat/completions", completion({"content": text})
    )
    settings = Settings(manager_provider="ollama", manager_base_url="http://ollama.test:11434/v1",
                        manager_model="llama3.2")  # fmt: skip
    async with server.client() as http:
        operations = await Manager(settings, http_client=http).decide(
            "chat-model", **conversation()
        )
    assert operations is not None and [(o.op, o.id) for o in operations] == [(Op.DELETE, 2)]
    (sent,) = server.requests
    body = orjson.loads(sent.content)
    assert body["model"] == "llama3.2" and "tools" not in body
    assert "operations" in orjson.dumps(body["messages"]).decode()  # the schema is in the prompt


@pytest.mark.usefixtures("allow_http_models")
async def test_an_unreachable_manager_raises_naming_its_url_and_model() -> None:
    """A closed loopback port: the error says where and which model, not just "Connection error."."""
    base = f"http://memproxy:hunter2@127.0.0.1:{free_port()}/v1"
    settings = Settings(upstream_base_url=base, upstream_api_key="sk-up-secret",
                        manager_model="qwen", manager_max_retries=0)  # fmt: skip
    async with build_http_client(settings) as http:
        with pytest.raises(ManagerUnavailable) as raised:
            await Manager(settings, http_client=http).decide("chat-model", **conversation())
    expected = f"manager at {base.replace('hunter2', '***')} (model qwen): connection refused"
    assert str(raised.value) == expected
    assert "sk-up-secret" not in str(raised.value) and "hunter2" not in str(raised.value)


@pytest.mark.usefixtures("allow_http_models")
async def test_a_manager_answering_an_error_status_is_named_with_the_status() -> None:
    server = FakeServer("http://upstream.test/v1/chat/completions", {})
    settings = Settings(upstream_base_url="http://elsewhere.test/v1", manager_max_retries=0)
    async with server.client() as http:  # answers 404 to every other URL
        with pytest.raises(ManagerUnavailable, match=r"^manager at http://elsewhere.test/v1 "
                           r"\(model chat-model\): answered HTTP 404: .*no route"):  # fmt: skip
            await Manager(settings, http_client=http).decide("chat-model", **conversation())


@pytest.mark.usefixtures("allow_http_models")
async def test_a_parked_job_and_the_log_name_the_unreachable_manager(
    upstream: respx.Router, monkeypatch: pytest.MonkeyPatch
) -> None:
    upstream.post("/chat/completions").respond(json=completion_json("Noted."))
    manager_url = f"http://127.0.0.1:{free_port()}/v1"
    settings = make_settings(
        manager_enabled=True, processing_interval=0, conversation_threshold=1,
        manager_base_url=manager_url, manager_model="qwen", manager_api_key="sk-manager-secret",
        manager_job_attempts=1, manager_max_retries=0,
    )  # fmt: skip
    app = create_app(
        settings,
        upstream_transport=httpx.MockTransport(upstream.async_handler),
        embedder=FakeEmbedder(),
    )
    log = io.StringIO()
    monkeypatch.setattr(memproxy_handler(), "stream", log)
    async with running(app) as client:
        queue: JobQueue = app.state.services.jobs
        body = {"model": "m", "messages": [{"role": "user", "content": "I live in Oslo"}]}
        await client.post("/v1/chat/completions", json=body, headers={"X-User-Id": "ann"})
        await until(lambda: _parked(queue))
        ((_job, user, reason, answer),) = await queue.failed()
    expected = f"manager at {manager_url} (model qwen): connection refused"
    assert user == "ann" and reason == expected and answer is None
    (parked,) = [line for line in log.getvalue().splitlines() if "times, parked:" in line]
    assert " WARNING memproxy.manager " in parked and parked.endswith(expected)
    assert "sk-manager-secret" not in log.getvalue()


async def _parked(queue: JobQueue) -> bool:
    return (await queue.counts())["failed"] == 1


async def until(check: Callable[[], Awaitable[bool]], seconds: float = 30) -> None:
    async def loop() -> None:
        while not await check():  # noqa: ASYNC110 (database state: nothing to await on)
            await asyncio.sleep(0.05)

    await asyncio.wait_for(loop(), seconds)
