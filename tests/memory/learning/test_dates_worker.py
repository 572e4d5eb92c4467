"""Through the worker (issue 25, point 5): a scripted Manager writes what small models write,
and what is stored has the absolute dates of the chat's day (the job's clock is fixed), not of
the day the test runs; a Manager that writes the absolute date itself is not refused for it."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import respx
from pydantic_ai.messages import ModelMessage, ModelResponse
from pydantic_ai.models.function import AgentInfo

import app.memory.learning.jobs
from tests.conftest import AppClientFactory
from tests.fakes import decided
from tests.memory.learning.support import ANN, manager_client, memories, no_jobs, until

SAID = datetime(2024, 5, 1, 9, 30, tzinfo=UTC)  # a Wednesday


class Scripted:
    """A Manager answering every job with the same NEW operations, and counting its calls."""

    def __init__(self, *contents: str) -> None:
        self.contents = contents
        self.calls = 0

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.calls += 1
        ops = [{"op": "NEW", "content": c, "type": "event"} for c in self.contents]
        return decided(info, {"operations": ops})


async def _learned(
    make_client: AppClientFactory, manager: Scripted, said: str, monkeypatch: pytest.MonkeyPatch
) -> list[str]:
    monkeypatch.setattr(app.memory.learning.jobs, "now", lambda: SAID)  # the job's clock
    client = await manager_client(make_client, manager, episodes=False)  # facts only
    response = await client.post("/v1/chat/completions", headers=ANN, json={
        "model": "m", "messages": [{"role": "user", "content": said}],
    })  # fmt: skip
    assert response.status_code == 200

    async def done() -> bool:
        return manager.calls > 0 and await no_jobs(client)

    await until(done)
    return await memories(client)


async def test_yesterday_is_stored_as_the_chat_s_yesterday(
    make_client: AppClientFactory, upstream_ok: respx.Route, monkeypatch: pytest.MonkeyPatch
) -> None:
    manager = Scripted("Went hiking yesterday", "Has a dentist appointment next Tuesday")
    stored = await _learned(
        make_client, manager,
        "I went hiking yesterday, and I have a dentist appointment next Tuesday.", monkeypatch,
    )  # fmt: skip
    assert stored == ["Has a dentist appointment on 7 May 2024", "Went hiking on 30 April 2024"]


async def test_a_date_the_manager_made_absolute_is_the_user_s(
    make_client: AppClientFactory, upstream_ok: respx.Route, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The grounds count the dates the user's own relative words stand for: "Went hiking on
    30 April 2024" after "I went hiking yesterday" was refused as 2 words of 5 the user's."""
    manager = Scripted("Went hiking on 30 April 2024")
    stored = await _learned(make_client, manager, "I went hiking yesterday", monkeypatch)
    assert stored == ["Went hiking on 30 April 2024"]


async def test_a_date_the_user_never_implied_is_still_refused(
    make_client: AppClientFactory, upstream_ok: respx.Route, monkeypatch: pytest.MonkeyPatch
) -> None:
    manager = Scripted("Went hiking on 12 March 2019")
    assert await _learned(make_client, manager, "I went hiking yesterday", monkeypatch) == []
