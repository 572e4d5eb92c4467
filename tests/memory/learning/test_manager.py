"""The Manager agent: what it is shown (asserted on the prompt a FunctionModel receives), what it
answers, the strict schema, retries of answers that do not fit, the output modes and the job's
bounds. Its wiring to real HTTP is in test_manager_wire.py."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx2
import pytest
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import RequestUsage

from app.config import Settings
from app.memory.learning.decisions import Op, complete_operations, decisions_for
from app.memory.learning.manager import (
    Manager,
    ManagerAnswerUnusable,
    ManagerUnavailable,
)
from app.memory.learning.turns import role_of, text_of
from tests.fakes import decided
from tests.memory.learning.manager_conversation import conversation, prompt, turns


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


LOOP = (
    '{"operations": [{"op": "NEW", "content": "Is vegetarian"}, '
    + ('{"op": "UPDATE", "id": 1, "content": "Lives in Bergen"}, ' * 30)
    + '{"op": "UPDATE", "id": 2, "content": "Loves st'
)


@pytest.mark.parametrize("mode", ["json_schema", "prompted"])
async def test_an_answer_cut_at_max_tokens_keeps_its_whole_operations_once(mode: str) -> None:
    """Small models loop until max_tokens: the whole operations before the cut are the answer,
    each once; the one the cut went through is not."""
    calls = 0

    def looping(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        nonlocal calls
        calls += 1
        return ModelResponse(parts=[TextPart(f"```json\n{LOOP}")], finish_reason="length")

    manager = Manager(Settings(manager_output_mode=mode), http_client=httpx2.AsyncClient(),
                      model=FunctionModel(looping))  # fmt: skip
    operations = await manager.decide("m", **conversation())
    assert [(o.op, o.id, o.content) for o in operations] == [
        (Op.NEW, None, "Is vegetarian"), (Op.UPDATE, 1, "Lives in Bergen"),
    ]  # fmt: skip
    assert calls == 1


def test_the_operation_the_cut_went_through_is_left_out_even_when_it_looks_whole() -> None:
    cut = '{"operations": [{"op": "DELETE", "id": 2}, {"op": "DELETE", "id": 1'  # of 12?
    assert [(o.op, o.id) for o in complete_operations(cut, decisions_for(12))] == [(Op.DELETE, 2)]


async def test_an_answer_cut_before_any_whole_operation_is_unusable() -> None:
    def cut(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return ModelResponse(parts=[TextPart('{"operations": [{"op": "NEW", "content": "Is')],
                             finish_reason="length")  # fmt: skip

    manager = Manager(Settings(manager_output_mode="json_schema"),
                      http_client=httpx2.AsyncClient(), model=FunctionModel(cut))  # fmt: skip
    with pytest.raises(ManagerAnswerUnusable) as raised:
        await manager.decide("m", **conversation())
    assert raised.value.answer.startswith('{"operations"')


async def test_an_operation_repeated_in_one_answer_counts_once() -> None:
    repeated = {"op": "UPDATE", "id": 1, "content": "Lives in Bergen"}

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return decided(info, {"operations": [repeated, {"op": "DELETE", "id": 2}, repeated]})

    manager = Manager(Settings(), http_client=httpx2.AsyncClient(), model=FunctionModel(answer))
    operations = await manager.decide("m", **conversation())
    assert [(o.op, o.id) for o in operations] == [(Op.UPDATE, 1), (Op.DELETE, 2)]
