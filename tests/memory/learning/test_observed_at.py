"""What the Manager writes is dated when the user said it (issue 25, point 5): a memory created
or updated by a job is observed at the job's `created_at` (the chat's time), however long the
job waited; and the Manager is never offered the kind ``episode``."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import respx
from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncEngine

import app.memory.learning.jobs
from app.memory.learning.applier import Applier
from app.memory.learning.decisions import Decisions, Op, Operation, decisions_for
from app.memory.learning.extraction import exchange
from app.memory.learning.jobs import JobQueue
from app.memory.learning.prompt import instructions
from app.memory.learning.turns import turn
from app.memory.service import MemoryService
from app.memory.store.memories import MemoryStore
from app.memory.store.records import NewMemory, now
from app.memory.store.tables import FactType, ManagerJob, MemoryType
from tests.conftest import AppClientFactory
from tests.fakes import FakeEmbedder
from tests.memory.learning.support import (
    ANN,
    Prompted,
    manager_client,
    services,
    until,
)

SAID = datetime(2024, 5, 1, 9, 30, tzinfo=UTC)


async def test_a_claimed_job_carries_when_it_was_queued(engine: AsyncEngine) -> None:
    queue = JobQueue(MemoryStore(engine).sessions, limit=10)
    found = exchange([turn("user", "I live in Oslo"), turn("assistant", "ok")], set(), threshold=1)
    assert found is not None
    queued = await queue.enqueue("ann", "m", found, interval_seconds=0)
    assert queued is not None
    async with queue._sessions() as session, session.begin():
        await session.execute(
            update(ManagerJob).where(ManagerJob.id == queued.job_id).values(created_at=SAID)
        )
    (job,) = await queue.claim(5, exclude_users=set())
    assert job.created_at == SAID


async def test_what_a_job_writes_is_observed_when_it_was_said(engine: AsyncEngine) -> None:
    service = MemoryService(MemoryStore(engine), FakeEmbedder())  # type: ignore[arg-type]
    (oslo,) = (await service.add("ann", [NewMemory("Lives in Oslo")])).records
    outcomes = await Applier(service).apply("ann", [
        Operation(op=Op.NEW, content="Has a ginger cat called Tom"),
        Operation(op=Op.UPDATE, id=1, content="Lives in Oslo since May"),
    ], {1: oslo.id}, job_id="j", observed_at=SAID)  # fmt: skip
    assert [o.result for o in outcomes] == ["created", "updated"]
    for outcome in outcomes:
        memory = await service.get("ann", outcome.memory_id or "")
        assert memory is not None and memory.observed_at == SAID and not memory.profile
        assert memory.updated_at > SAID  # written now, said then
    before = now()
    (outcome,) = await Applier(service).apply(
        "ann", [Operation(op=Op.NEW, content="Plays the cello")], {}, job_id="k"
    )
    memory = await service.get("ann", outcome.memory_id or "")
    assert memory is not None and memory.observed_at >= before  # no time given: now


async def test_a_chat_s_memories_are_dated_by_the_chat(
    make_client: AppClientFactory, upstream_ok: respx.Route, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(app.memory.learning.jobs, "now", lambda: SAID)  # the job's clock
    manager = Prompted()
    client = await manager_client(make_client, manager)
    response = await client.post("/v1/chat/completions", headers=ANN, json={
        "model": "m", "messages": [{"role": "user", "content": "I live in Oslo"}],
    })  # fmt: skip
    assert response.status_code == 200

    async def learned() -> bool:
        return bool((await client.get("/v1/memories", headers=ANN)).json()["data"])

    await until(learned)
    both = (await client.get("/v1/memories", headers=ANN)).json()["data"]
    (memory,) = [m for m in both if m["type"] != "episode"]
    (episode,) = [m for m in both if m["type"] == "episode"]
    assert episode["observed_at"] == "2024-05-01T09:30:00Z"  # the user's words: dated alike
    assert memory["content"] == "Lives in Oslo"  # "I live in Oslo", in the third person
    assert memory["observed_at"] == "2024-05-01T09:30:00Z"
    assert memory["created_at"][:4] != "2024" and memory["profile"] is False
    assert not await services(client).jobs.jobs("ann", limit=10)
    # the Manager reads the chat's date, not today's: relative dates resolve from it
    assert "Current date and time: Wednesday 01 May 2024, 09:30" in manager.prompts[0]


@pytest.mark.parametrize("shown", [0, 3])
def test_the_manager_is_never_offered_the_kind_episode(shown: int) -> None:
    assert [t.value for t in FactType] == [t.value for t in MemoryType if t != "episode"]
    schema: type[Decisions] = decisions_for(shown)
    assert "episode" not in str(schema.model_json_schema())
    assert "fact, preference, knowledge, event, correction, feedback." in instructions(shape=True)
    assert "episode" not in instructions(shape=True)
