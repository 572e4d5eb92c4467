"""The Manager agent: what it is shown (asserted on the prompt a FunctionModel receives), what it
answers, retries of malformed answers, the OpenAI / Ollama wiring against an httpx2 mock transport
(the client pydantic-ai's providers take), and failures that name the URL and model."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import httpx2
import orjson
import pytest
import respx
from pydantic_ai import models
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import RequestUsage

from app.config import Settings
from app.log import memproxy_handler
from app.main import create_app
from app.memory.learning.decisions import Op
from app.memory.learning.jobs import JobQueue
from app.memory.learning.manager import (
    Manager,
    ManagerAnswerUnusable,
    ManagerUnavailable,
    build_http_client,
)
from app.memory.learning.prompt import Shown, build_prompt
from app.memory.learning.turns import role_of, text_of, turns_of
from app.proxy.history import convert
from app.schemas.openai import ChatCompletionRequest
from tests.conftest import make_settings
from tests.fakes import FakeEmbedder, decided
from tests.helpers import completion_json, free_port, running

NOW = datetime(2026, 11, 22, 15, 4, tzinfo=UTC)
MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant. SECRET-SYSTEM-PROMPT"},
    {"role": "user", "content": "I moved to Bergen last month."},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "TOOL-OUTPUT: rain in Bergen"},
    {"role": "assistant", "content": "Welcome to Bergen! Bring an umbrella."},
    {"role": "user", "content": "Thanks. Also, I no longer eat meat."},
]  # fmt: skip


@pytest.fixture(autouse=True)
def _no_real_models() -> Iterator[None]:
    before = models.ALLOW_MODEL_REQUESTS
    models.ALLOW_MODEL_REQUESTS = False
    yield
    models.ALLOW_MODEL_REQUESTS = before


def turns() -> list[ModelMessage]:
    history = convert(
        ChatCompletionRequest.model_validate({"model": "m", "messages": MESSAGES}).messages
    )
    return turns_of(history, "Noted, vegetarian dishes from now on.")


def conversation() -> dict[str, Any]:
    """What the worker gives :meth:`Manager.decide` for the turns above."""
    everything = turns()
    return {
        "now": NOW,
        "memories": [
            Shown(1, "Lives in Oslo", "fact", NOW),
            Shown(2, "Loves steak", "preference", NOW),
        ],
        "context": everything[:-2],
        "new": everything[-2:],
    }


def prompt(role_aware: bool = True) -> str:
    return build_prompt(role_aware=role_aware, **conversation())


def test_the_turns_are_the_users_and_assistants_text_only_as_messages() -> None:
    everything = turns()
    assert [type(m) for m in everything] == [ModelRequest, ModelResponse] * 2
    assert [(role_of(m), text_of(m)) for m in everything] == [
        ("user", "I moved to Bergen last month."),
        ("assistant", "Welcome to Bergen! Bring an umbrella."),
        ("user", "Thanks. Also, I no longer eat meat."),
        ("assistant", "Noted, vegetarian dishes from now on."),
    ]
    assert all(len(m.parts) == 1 for m in everything)  # no tool call, return or instructions


async def test_the_manager_sees_date_numbered_memories_and_marked_roles() -> None:
    seen: list[ModelMessage] = []

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.extend(messages)
        return decided(info, {"operations": [
            {"op": "UPDATE", "id": 1, "content": "Lives in Bergen since October 2026", "type": "fact"},
            {"op": "DELETE", "id": 2},
            {"op": "NEW", "content": "Is vegetarian", "type": "preference"},
        ]})  # fmt: skip

    manager = Manager(Settings(), http_client=httpx2.AsyncClient(), model=FunctionModel(answer))
    operations = await manager.decide("m", **conversation())
    assert operations is not None
    assert [(o.op, o.id) for o in operations] == [(Op.UPDATE, 1), (Op.DELETE, 2), (Op.NEW, None)]

    (request,) = [m for m in seen if isinstance(m, ModelRequest)]
    assert request.instructions is not None and "only" in request.instructions.lower()
    assert "never what the assistant says" in request.instructions.lower()
    user_prompt = str(request.parts[-1].content)  # type: ignore[union-attr]
    assert "Current date and time: Sunday 22 November 2026, 15:04 UTC" in user_prompt
    # Nothing beside a memory on its line: small models copied a "[fact, noted ...]" suffix.
    assert "\n1. Lives in Oslo\n2. Loves steak\n" in user_prompt
    assert "USER: I moved to Bergen last month." in user_prompt
    assert "ASSISTANT: Welcome to Bergen! Bring an umbrella." in user_prompt
    context, new = user_prompt.split("The new exchange (decide from this):")
    assert "I moved to Bergen" in context and "I no longer eat meat" in new
    assert "USER: Thanks. Also, I no longer eat meat.\nASSISTANT: Noted" in new
    assert "SECRET-SYSTEM-PROMPT" not in user_prompt and "TOOL-OUTPUT" not in user_prompt


def test_without_role_awareness_only_the_users_words_are_shown() -> None:
    text = prompt(role_aware=False)
    assert "USER: I moved to Bergen" in text and "ASSISTANT" not in text and "umbrella" not in text


@pytest.mark.parametrize("mode", ["tool", "json_schema", "prompted"])
async def test_an_answer_that_does_not_fit_is_retried_then_raised_with_the_answer(
    mode: str,
) -> None:
    calls = 0

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        nonlocal calls
        calls += 1
        return decided(info, {"operations": [{"op": "MAYBE"}]})

    manager = Manager(
        Settings(manager_max_retries=2, manager_output_mode=mode),
        http_client=httpx2.AsyncClient(),
        model=FunctionModel(answer),
    )
    with pytest.raises(ManagerAnswerUnusable) as raised:
        await manager.decide("m", **conversation())
    assert calls == 3  # the answer and two corrections
    assert json.loads(raised.value.answer) == {"operations": [{"op": "MAYBE"}]}
    assert str(raised.value).startswith(f"manager at http://localhost:11434/v1 (model m): {mode}")


@pytest.mark.parametrize("answer", [
    {},  # once taken as "nothing to remember"
    {"properties": {"operations": [{"op": "NEW", "content": "Lives in Lyon"}]}},  # a 1.5B's echo
    {"operations": [], "note": "nothing new"},  # a key the schema has not
    {"operations": [{"op": "NEW", "content": "Lives in Lyon", "id": 1}]},  # NEW never has an id
    {"operations": [{"op": "UPDATE", "id": 1}]},  # UPDATE without content
    {"operations": [{"op": "NEW", "content": "  "}]},  # content that is nothing
    {"operations": [{"op": "DELETE"}]},  # DELETE of no memory
])  # fmt: skip
async def test_answers_the_schema_does_not_allow_are_refused(answer: dict[str, Any]) -> None:
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return decided(info, answer)

    settings = Settings(manager_max_retries=0, manager_output_mode="json_schema")
    manager = Manager(settings, http_client=httpx2.AsyncClient(), model=FunctionModel(model))
    with pytest.raises(ManagerAnswerUnusable):
        await manager.decide("m", **conversation())


async def test_auto_falls_back_to_the_next_mode_and_remembers_what_worked() -> None:
    """A model that never calls tools and cannot keep to a schema in `json_schema` mode's
    grammar-less stand-in, but answers JSON when prompted: `auto` ends on `prompted`, and the
    next job starts there."""
    asked: list[str] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        mode = info.model_request_parameters.output_mode
        asked.append({"native": "json_schema"}.get(mode, mode))
        if asked[-1] == "prompted":
            return ModelResponse(parts=[TextPart('{"operations": []}')])
        return ModelResponse(parts=[TextPart("Sure! The user is vegetarian.")])

    manager = Manager(
        Settings(manager_max_retries=0),
        http_client=httpx2.AsyncClient(),
        model=FunctionModel(model),
    )
    assert await manager.decide("m", **conversation()) == []
    assert asked == ["json_schema", "tool", "prompted"]
    assert await manager.decide("m", **conversation()) == []
    assert asked[3:] == ["prompted"]


async def test_a_job_has_one_token_budget_across_modes_and_retries() -> None:
    calls = 0

    def rambling(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        nonlocal calls
        calls += 1
        return ModelResponse(parts=[TextPart("word " * 400)], usage=RequestUsage(output_tokens=400))

    settings = Settings(manager_max_retries=5, manager_job_max_tokens=1000)
    manager = Manager(settings, http_client=httpx2.AsyncClient(), model=FunctionModel(rambling))
    with pytest.raises(ManagerAnswerUnusable, match="within 1000 output tokens"):
        await manager.decide("m", **conversation())
    assert calls == 3  # not 3 modes x 6 attempts


async def test_a_job_has_one_time_bound_across_modes_and_retries() -> None:
    async def slow(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        await asyncio.sleep(0.2)
        return ModelResponse(parts=[TextPart("thinking...")])

    settings = Settings(manager_max_retries=5, manager_job_timeout_seconds=0.5)
    manager = Manager(settings, http_client=httpx2.AsyncClient(), model=FunctionModel(slow))
    with pytest.raises(ManagerUnavailable, match="MEMPROXY_MANAGER_JOB_TIMEOUT_SECONDS"):
        await manager.decide("m", **conversation())


async def test_a_corrected_answer_is_used() -> None:
    answers = iter([{"operations": [{"op": "NEW"}, {"op": "MAYBE"}]},
                    {"operations": [{"op": "NEW", "content": "Is vegetarian"}]}])  # fmt: skip

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return decided(info, next(answers))

    manager = Manager(
        Settings(manager_max_retries=1),
        http_client=httpx2.AsyncClient(),
        model=FunctionModel(answer),
    )
    operations = await manager.decide("m", **conversation())
    assert [o.content for o in operations] == ["Is vegetarian"]


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
    the requests (an httpx2 mock transport: respx fakes httpx only)."""

    def __init__(self, url: str, answer: dict[str, Any]) -> None:
        self.url = url
        self.answer = answer
        self.requests: list[httpx2.Request] = []

    def handle(self, request: httpx2.Request) -> httpx2.Response:
        self.requests.append(request)
        if request.method != "POST" or str(request.url) != self.url:
            return httpx2.Response(404, json={"error": f"no route {request.url}"})
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


async def test_an_answer_in_prose_is_no_decision() -> None:
    """A model that chats instead of calling the output tool is asked again, then given up on
    with what it said."""
    calls = 0

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        nonlocal calls
        calls += 1
        return ModelResponse(parts=[TextPart("I think the user is vegetarian now.")])

    manager = Manager(
        Settings(manager_max_retries=1, manager_output_mode="tool"),
        http_client=httpx2.AsyncClient(),
        model=FunctionModel(answer),
    )
    with pytest.raises(ManagerAnswerUnusable) as raised:
        await manager.decide("m", **conversation())
    assert calls == 2 and raised.value.answer == "I think the user is vegetarian now."
