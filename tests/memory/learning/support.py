"""What the extraction tests share: a Manager that remembers what it is shown, an app wired to
it, and waits on the database (the shared fixtures are in conftest.py)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from contextlib import suppress
from typing import Any

import httpx
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse
from pydantic_ai.models.function import AgentInfo, FunctionModel

from app.memory.learning.turns import role_of, text_of
from app.memory.learning.worker import Worker
from tests.conftest import AppClientFactory
from tests.fakes import decided

ANN = {"X-User-Id": "ann"}


def said(messages: list[ModelMessage]) -> list[tuple[str, str]]:
    """Who said what in these turns."""
    return [(role_of(m), text_of(m)) for m in messages]


def new_user_lines(messages: list[ModelMessage]) -> list[str]:
    prompt = str(next(m for m in messages if isinstance(m, ModelRequest)).parts[-1].content)  # type: ignore[union-attr]
    new = prompt.split("The new exchange (decide from this):", 1)[1]
    return re.findall(r"^USER: (.*)$", new, re.M)


class Remembering:
    """A Manager that makes each new user line a memory, and records what it was shown."""

    def __init__(self) -> None:
        self.seen: list[list[str]] = []

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        lines = new_user_lines(messages)
        self.seen.append(lines)
        ops = [{"op": "NEW", "content": line, "type": "fact"} for line in lines]
        return decided(info, {"operations": ops})


class Prompted(Remembering):
    """Remembering, keeping the text of every message the Manager was sent."""

    def __init__(self) -> None:
        super().__init__()
        self.prompts: list[str] = []

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        parts = [p for m in messages for p in m.parts]
        self.prompts.append(" ".join(str(getattr(p, "content", "")) for p in parts))
        return super().__call__(messages, info)


def services(client: httpx.AsyncClient) -> Any:
    return client._transport.app.state.services  # type: ignore[attr-defined]


async def until(check: Callable[[], Awaitable[bool]], seconds: float = 10) -> None:
    async def loop() -> None:
        while not await check():  # noqa: ASYNC110 (database state: nothing to await on)
            await asyncio.sleep(0.02)

    await asyncio.wait_for(loop(), seconds)


async def memories(
    client: httpx.AsyncClient, user: str = "ann", *, episodes: bool = False
) -> list[str]:
    """The user's facts (every memory but the episodes: what the Manager decided), sorted; with
    `episodes`, the episodes only (the user's words kept beside them)."""
    data = (
        await client.get("/v1/memories", params={"limit": 1000}, headers={"X-User-Id": user})
    ).json()["data"]
    return sorted(m["content"] for m in data if (m["type"] == "episode") == episodes)


async def manager_client(
    make_client: AppClientFactory, model: Any, **settings: Any
) -> httpx.AsyncClient:
    settings = {"manager_enabled": True, "processing_interval": 0, "conversation_threshold": 1,
                "manager_retry_seconds": 0, **settings}  # fmt: skip
    client: httpx.AsyncClient = await make_client(manager_model=FunctionModel(model), **settings)
    return client


async def equals(coro: Awaitable[list[str]], expected: list[str]) -> bool:
    return await coro == expected


async def no_jobs(client: httpx.AsyncClient) -> bool:
    counts = await services(client).jobs.counts()
    return sum(counts.values()) == 0


async def kill(worker: Worker) -> None:
    """What kill -9 does to a worker: its claims and lease renewals end, and nothing it holds is
    handed back (its jobs stay as they are until their leases run out)."""
    for task in (worker._loop_task, worker._upkeep_task, *worker._running):
        if task is not None:
            task.cancel()
            with suppress(asyncio.CancelledError):
                await task
