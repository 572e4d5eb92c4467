"""Open WebUI's retrieved documents, through the app: the upstream gets them as they came, while
recall searches with the user's question, and the Manager and the episodes see the question
alone; whether the template is in the user's message (the default, and earlier or custom
templates) or in the system message (``RAG_SYSTEM_CONTEXT=true``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
import respx
from pydantic_ai import models
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse
from pydantic_ai.models.function import AgentInfo

from app.memory.block import BLOCK_START
from tests.conftest import AppClientFactory
from tests.fakes import FakeEmbedder, decided
from tests.helpers import completion_json
from tests.memory.learning.support import ANN, manager_client, no_jobs, until
from tests.memory.openwebui_rag_texts import (
    CUSTOM_CONTEXT,
    DOCUMENT_WORDS,
    QUESTION,
    in_system_message,
    in_user_message,
    in_user_message_earlier,
)

SHED = "Painted the garden shed green last spring"
BEES = (
    "Is a member of the Bergen beekeeping association"  # the documents' words, not the question's
)
SYSTEM = "You are a helpful assistant."


@pytest.fixture(autouse=True)
def _no_real_models(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(models, "ALLOW_MODEL_REQUESTS", False)  # restored after the test
    yield


class Recording:
    """A Manager that writes nothing and keeps every prompt it was given."""

    def __init__(self) -> None:
        self.prompts: list[str] = []

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        request = next(m for m in messages if isinstance(m, ModelRequest))
        self.prompts.append(str(request.parts[-1].content))
        return decided(info, {"operations": []})


async def setup(
    make_client: AppClientFactory, upstream: respx.Router
) -> tuple[httpx.AsyncClient, respx.Route, Recording, FakeEmbedder]:
    route = upstream.post("/chat/completions").respond(json=completion_json("Try sage green."))
    manager, embedder = Recording(), FakeEmbedder()
    client = await manager_client(make_client, manager, embedder=embedder, episodes=True)
    added = await client.post(
        "/v1/memories/batch", json={"memories": [{"content": SHED}, {"content": BEES}]}, headers=ANN
    )
    assert added.status_code == 201, added.text
    return client, route, manager, embedder


async def chat(client: httpx.AsyncClient, messages: list[dict[str, Any]]) -> httpx.Response:
    response = await client.post(
        "/v1/chat/completions", json={"model": "m", "messages": messages}, headers=ANN
    )
    assert response.status_code == 200, response.text
    return response


async def episodes(client: httpx.AsyncClient) -> list[str]:
    listed = await client.get("/v1/memories", params={"type": "episode"}, headers=ANN)
    return sorted(m["content"] for m in listed.json()["data"])


def sent(route: respx.Route) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = orjson.loads(route.calls.last.request.content)["messages"]
    return messages


def injected(system: str) -> str:
    return system[system.index(BLOCK_START) :]


def assert_question_only(text: str) -> None:
    assert not any(word in text for word in DOCUMENT_WORDS), text
    assert "### Task" not in text and "<source" not in text and "<context>" not in text


FORMS = {
    "default": in_user_message(),
    "earlier_user_query": in_user_message_earlier(),
    "custom_context_tag": in_user_message(CUSTOM_CONTEXT),
}


@pytest.mark.parametrize("text", FORMS.values(), ids=FORMS.keys())
async def test_documents_in_the_users_message_go_upstream_and_nowhere_else(
    make_client: AppClientFactory, upstream: respx.Router, text: str
) -> None:
    client, route, manager, embedder = await setup(make_client, upstream)
    embedder.calls.clear()
    opening = [{"role": "system", "content": SYSTEM},
               {"role": "user", "content": "I'm doing up the garden this weekend."},
               {"role": "assistant", "content": "Sounds fun! What's first?"}]  # fmt: skip
    response = await chat(client, [*opening, {"role": "user", "content": text}])
    await until(lambda: no_jobs(client))

    upstream_messages = sent(route)
    assert upstream_messages[-1] == {"role": "user", "content": text}  # documents unchanged
    # recall searched with the question: the shed, not the beekeepers the documents are about
    block = injected(upstream_messages[0]["content"])
    assert SHED in block and BEES not in block
    assert response.headers["X-Memories-Injected"] == "1"
    searched = [t for call in embedder.calls for t in call]
    assert QUESTION in searched and all(DOCUMENT_WORDS[0] not in t for t in searched)
    # the Manager: the question, none of the template or the documents (one asks to remember)
    (prompt,) = manager.prompts
    assert QUESTION in prompt and "I'm doing up the garden" in prompt
    assert_question_only(prompt)
    assert await episodes(client) == sorted(["I'm doing up the garden this weekend.", QUESTION])

    # The next request resends the chat as Open WebUI keeps it: the question plain. It is the
    # same turn: not learned, nor kept as an episode, a second time.
    later = [*opening, {"role": "user", "content": QUESTION},
             {"role": "assistant", "content": "Try sage green."},
             {"role": "user", "content": "Sage green it is, thanks a lot!"}]  # fmt: skip
    await chat(client, later)
    await until(lambda: no_jobs(client))
    new_exchange = manager.prompts[1].split("The new exchange", 1)[1]
    assert QUESTION not in new_exchange and "Sage green it is" in new_exchange
    assert (await episodes(client)).count(QUESTION) == 1


@pytest.mark.parametrize("system", [SYSTEM, None], ids=["with_prompt", "without_prompt"])
async def test_documents_in_the_system_message_stay_there_for_the_upstream_only(
    make_client: AppClientFactory, upstream: respx.Router, system: str | None
) -> None:
    """RAG_SYSTEM_CONTEXT=true: the filled template ends the system message (or is one); the
    user's message is the question. memproxy's block goes after the documents."""
    client, route, manager, embedder = await setup(make_client, upstream)
    embedder.calls.clear()
    context = in_system_message(system)
    messages = [{"role": "system", "content": context}, {"role": "user", "content": QUESTION}]
    response = await chat(client, messages)
    await until(lambda: no_jobs(client))

    upstream_system, upstream_user = sent(route)
    assert upstream_system["content"].startswith(context.rstrip() + "\n\n" + BLOCK_START)
    assert upstream_user == {"role": "user", "content": QUESTION}
    block = injected(upstream_system["content"])
    assert SHED in block and BEES not in block and response.headers["X-Memories-Injected"] == "1"
    assert all(DOCUMENT_WORDS[0] not in t for call in embedder.calls for t in call)
    (prompt,) = manager.prompts
    assert QUESTION in prompt
    assert_question_only(prompt)
    assert await episodes(client) == [QUESTION]
