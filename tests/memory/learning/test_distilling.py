"""Distilling at idle time (issue 27, point 2): the episodes of a conversation that gave no fact
are read by the Manager once more, as that day's user turns; the facts it writes go through the
same rules, are linked to those episodes and dated that day; once per episode; never episodes a
fact came from; nothing without a model; an idle job that lost its lease writes nothing."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from pydantic_ai.messages import ModelMessage, ModelResponse
from pydantic_ai.models.function import AgentInfo, FunctionModel
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker

from app.memory.learning.applier import JobGone
from app.memory.learning.distilling import Distilling
from app.memory.learning.manager import Manager
from app.memory.service import MemoryService
from app.memory.store.memories import MemoryStore
from app.memory.store.records import NewMemory
from app.memory.store.tables import MemoryLink, MemorySource, MemoryType
from app.memory.store.unit import Writer
from tests.conftest import make_settings
from tests.fakes import FakeEmbedder, decided
from tests.memory.learning.support import new_user_lines

SAID = datetime(2026, 2, 3, 18, 0, tzinfo=UTC)


class Pottery:
    """The model: a memory for each line that names pottery, in the third person."""

    def __init__(self) -> None:
        self.seen: list[list[str]] = []

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        lines = new_user_lines(messages)
        self.seen.append(lines)
        ops = [{"op": "NEW", "content": "Signed up for a pottery class.", "type": "event"}
               for line in lines if "pottery" in line]  # fmt: skip
        return decided(info, {"operations": ops})


def distilling(engine: AsyncEngine, **options: Any) -> tuple[Distilling, Pottery, MemoryService]:
    settings = make_settings(manager_steps="one", **options)
    model = Pottery()
    manager = Manager(settings, http_client=httpx.AsyncClient(), model=FunctionModel(model))
    service = MemoryService(MemoryStore(engine), FakeEmbedder())
    return Distilling(service, manager, settings), model, service


async def words(service: MemoryService, user: str, *texts: str) -> list[str]:
    """One conversation's episodes, written together (as one job writes them)."""
    written = await service.add(
        user, [NewMemory(t, type=MemoryType.EPISODE, observed_at=SAID) for t in texts]
    )
    return [r.id for r in written.records]


async def links(engine: AsyncEngine) -> set[tuple[str, str]]:
    async with async_sessionmaker(engine)() as session:
        rows = await session.execute(select(MemoryLink.fact_id, MemoryLink.episode_id))
        return {(a, b) for a, b in rows}


def later() -> float:
    return time.monotonic() + 60


async def test_the_words_of_a_conversation_that_gave_no_fact_are_distilled_once(
    engine: AsyncEngine,
) -> None:
    distil, model, service = distilling(engine)
    pottery, weather = await words(service, "ann", "I signed up for a pottery class last week.",
                                   "The weather was awful all day.")  # fmt: skip
    done = await distil.run("ann", since=0, model="m", job_id="idle-x", deadline=later())
    assert (done.conversations, done.facts, done.stopped_at) == (1, 1, None)
    assert model.seen == [["I signed up for a pottery class last week.",
                           "The weather was awful all day."]]  # fmt: skip
    (fact,) = [r for r in (await service.page("ann", limit=10, offset=0))[0]
               if r.type != MemoryType.EPISODE]  # fmt: skip
    assert fact.content == "Signed up for a pottery class."
    assert fact.observed_at == SAID  # the day it was said, not today
    assert (fact.id, pottery) in await links(engine)
    # once: the next idle job, from the version this one recorded, has nothing to read
    version = await service.store.version("ann")
    again = await distil.run("ann", since=version, model="m", job_id="idle-y", deadline=later())
    assert again.conversations == 0 and len(model.seen) == 1
    assert weather  # the other episode stays words


async def test_episodes_a_fact_came_from_and_users_without_a_model_are_left(
    engine: AsyncEngine,
) -> None:
    distil, model, service = distilling(engine)
    (episode,) = await words(service, "ann", "I signed up for a pottery class.")
    (fact,) = (await service.add("ann", [NewMemory("Signed up for a pottery class.")])).records
    async with service.store.writing("ann", MemorySource.API) as w:
        w.link(fact.id, episode)
    await words(service, "bob", "I signed up for a pottery class.")
    assert (await distil.run("ann", since=0, model="m", job_id="j", deadline=later())).facts == 0
    assert (await distil.run("bob", since=0, model="", job_id="j", deadline=later())).facts == 0
    assert model.seen == []


async def test_a_bound_stops_the_run_where_the_next_goes_on(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.memory.learning import distilling as module

    monkeypatch.setattr(module, "GROUPS", 1)
    distil, model, service = distilling(engine)
    await words(service, "ann", "I signed up for a pottery class.")
    await words(service, "ann", "My pottery teacher is strict.")
    first = await distil.run("ann", since=0, model="m", job_id="j", deadline=later())
    assert first.conversations == 1 and first.stopped_at is not None
    second = await distil.run("ann", since=first.stopped_at, model="m", job_id="j",
                              deadline=later())  # fmt: skip
    assert second.conversations == 1
    assert [lines[0] for lines in model.seen] == ["I signed up for a pottery class.",
                                                  "My pottery teacher is strict."]  # fmt: skip
    past = await distil.run("ann", since=0, model="m", job_id="j", deadline=time.monotonic() - 1)
    assert past.conversations == 0 and past.stopped_at is not None


async def test_a_job_no_longer_held_writes_nothing(engine: AsyncEngine) -> None:
    distil, _, service = distilling(engine)
    await words(service, "ann", "I signed up for a pottery class.")

    async def lost(w: Writer) -> bool:
        return False

    with pytest.raises(JobGone):
        await distil.run("ann", since=0, model="m", job_id="j", deadline=later(), holds=lost)
    held = (await service.page("ann", limit=10, offset=0))[0]
    assert [r.type for r in held] == [MemoryType.EPISODE]
