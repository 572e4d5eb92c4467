"""The relevance judge (issue 27, point 5): off by default; on, the Manager's model picks which of
a chat's best candidates help answer it, and those reach the upstream first, also below the
relevance threshold (a message that implies a memory shares no word with it); past its time box,
or on an unusable answer, the search's order stands and the chat goes on; answers are cached.
The model is a FunctionModel; the upstream respx; the embedder the deterministic fake."""

from __future__ import annotations

import asyncio
import re
import time
from datetime import UTC, datetime

import httpx
import pytest
import respx
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse
from pydantic_ai.models.function import AgentInfo, FunctionModel

from app.memory.chat import judge as judge_module
from bench.judge_eval import implicit_cases
from tests.conftest import AppClientFactory
from tests.fakes import decided
from tests.helpers import completion_json
from tests.memory.chat.test_recall_chat import chat, sent_messages
from tests.memory_api_support import add


class Knows:
    """The judge's model: picks the memory each message implies, as a person would (the
    mapping), and records what it was shown."""

    def __init__(self, delay: float = 0.0, answer: object = None) -> None:
        self.implied = dict(implicit_cases()[1])
        self.prompts: list[str] = []
        self.delay = delay
        self.answer = answer

    async def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        request = next(m for m in messages if isinstance(m, ModelRequest))
        prompt = str(request.parts[-1].content)  # type: ignore[union-attr]
        self.prompts.append(prompt)
        await asyncio.sleep(self.delay)
        if self.answer is not None:
            return decided(info, self.answer)
        message = re.search(r"^Message: (.*)$", prompt, re.M)
        assert message is not None
        wanted = self.implied.get(message.group(1))
        numbers = [int(n) for n, text in re.findall(r"^(\d+)\. (.*)$", prompt, re.M)
                   if text == wanted]  # fmt: skip
        return decided(info, {"relevant": numbers})


@pytest.fixture
def route(upstream: respx.Router) -> respx.Route:
    return upstream.post("/chat/completions").respond(json=completion_json())


SMALL = [
    "Is allergic to peanuts", "Plays the cello in a string quartet", "Has a cat named Pixel",
    "Drives a 2015 Toyota Corolla", "Studied chemistry at university", "Lives in Lyon",
]  # fmt: skip
"""A store the judge sees whole (the fake embedder scores what shares no word at 0, in no
order: with the real one, a snack and peanuts are near enough to be among the best 8)."""


async def judged_client(
    make_client: AppClientFactory, model: Knows, memories: list[str] = SMALL, **settings: object
) -> httpx.AsyncClient:
    client: httpx.AsyncClient = await make_client(
        manager_model=FunctionModel(model), recall_judge=True, **settings
    )
    for memory in memories:
        await add(client, memory)
    return client


def shown(route: respx.Route) -> str:
    """The memory block the upstream was sent ("" when none)."""
    first = sent_messages(route)[0]
    return str(first["content"]) if first["role"] == "system" else ""


async def test_the_memory_a_message_implies_reaches_the_chat_only_with_the_judge(
    make_client: AppClientFactory, route: respx.Route
) -> None:
    message = [{"role": "user", "content": "Can you suggest a snack to bring on my hike tomorrow?"}]
    plain: httpx.AsyncClient = await make_client()
    for memory in SMALL:
        await add(plain, memory)
    await chat(plain, message)
    assert "allergic to peanuts" not in shown(route)  # shares no word with the message

    model = Knows()
    client = await judged_client(make_client, model, memories=[])  # the same database
    response = await chat(client, message)
    assert response.status_code == 200
    block = shown(route)
    assert "Is allergic to peanuts" in block
    assert "Plays the cello" not in block  # it saw it and passed it over
    assert "Message: Can you suggest a snack" in model.prompts[0]
    assert len(re.findall(r"^\d+\. ", model.prompts[0], re.M)) == len(SMALL)
    await chat(client, message)  # the same message again: answered from the cache
    assert len(model.prompts) == 1


@pytest.mark.parametrize(
    ("model", "why"),
    [
        (Knows(delay=2.0), "timeout"),
        (Knows(answer={"relevant": "all of them"}), "unusable"),
        (Knows(answer={"relevant": [0, 99]}), "judged"),  # numbers it was not shown: none
    ],
    ids=["too-slow", "unusable", "no-valid-number"],
)
async def test_the_search_order_stands_when_the_judge_cannot_say(
    make_client: AppClientFactory, route: respx.Route, model: Knows, why: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setattr(judge_module, "CACHE_SIZE", 0)
    client = await judged_client(make_client, model, recall_judge_seconds=0.3,
                                 manager_max_retries=0)  # fmt: skip
    message = [{"role": "user", "content": "Plays the cello in a string quartet: any tips?"}]
    response = await chat(client, message)
    assert response.status_code == 200
    assert "Plays the cello in a string quartet" in shown(route)  # the search found it
    metrics = (await client.get("/metrics")).text
    assert f'memproxy_recall_judge_total{{outcome="{why}"}} 1.0' in metrics


async def test_off_by_default(make_client: AppClientFactory, route: respx.Route) -> None:
    model = Knows()
    client: httpx.AsyncClient = await make_client(manager_model=FunctionModel(model))
    await add(client, "Is allergic to peanuts")
    await add(client, "Plays the cello in a string quartet")
    await chat(client, [{"role": "user", "content": "Any snack ideas?"}])
    assert model.prompts == []


async def test_the_judge_takes_no_more_than_the_recall_has_left() -> None:
    """Its time box ends with the chat's recall time (less a margin): with none left, it does
    not ask, and the search's order stands."""
    from app.memory.chat.judge import RecallJudge
    from app.memory.learning.manager import Manager
    from app.memory.search.ranked import Hit
    from app.metrics import Metrics
    from tests.conftest import make_settings

    model = Knows(answer={"relevant": [1]})
    settings = make_settings(recall_judge=True, recall_judge_seconds=5)
    metrics = Metrics()
    judge = RecallJudge(Manager(settings, http_client=httpx.AsyncClient(),
                                model=FunctionModel(model)), settings, metrics)  # fmt: skip
    now = datetime.now(UTC)
    hits = [Hit(k, 0.5, 0.5, 0.5, f"memory {k}", now, now, "fact") for k in (1, 2)]
    late = time.monotonic() + judge_module.MARGIN / 2
    assert await judge.pick("ann", "m", "q", hits, deadline=late) is None
    assert model.prompts == []
    assert metrics.recall_judge.labels("timeout")._value.get() == 1
    soon = time.monotonic() + 10
    assert await judge.pick("ann", "m", "q", hits, deadline=soon) == [hits[0]]
    assert await judge.pick("ann", "other", "q", hits, deadline=soon) == [hits[0]]
    assert len(model.prompts) == 2  # cached per model too
