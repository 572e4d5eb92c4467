"""Distilling (issue 27, point 2): the episodes of an exchange that gave no fact are queued for
the Manager once more, as a job of a past conversation dated the day they were said; its turns
are the episodes' words (a short answer after its question, the assistant's); the worker runs it
as any job and links the facts to those episodes; each exchange is queued once, also when two
idle jobs look; a parked job's words are left to it; nothing without a model."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from pydantic_ai.messages import ModelMessage, ModelResponse
from pydantic_ai.models.function import AgentInfo, FunctionModel
from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker

from app.memory.learning import distilling as module
from app.memory.learning.distilling import Distilling
from app.memory.learning.jobs import JobQueue
from app.memory.learning.manager import Manager
from app.memory.learning.parking import KEPT
from app.memory.learning.turns import load, role_of, text_of
from app.memory.learning.worker import Worker
from app.memory.service import MemoryService
from app.memory.store.archive import forget
from app.memory.store.memories import MemoryStore
from app.memory.store.records import NewMemory
from app.memory.store.tables import JobStatus, ManagerJob, MemoryLink, MemorySource, MemoryType
from app.metrics import Metrics
from tests.conftest import make_settings
from tests.fakes import FakeEmbedder, decided
from tests.memory.learning.support import new_user_lines, until
from tests.memory.learning.test_idle_jobs import queue_of

SAID = datetime(2026, 2, 3, 18, 0, tzinfo=UTC)


class Pottery:
    """The model: a memory for each user line that names pottery, in the third person."""

    def __init__(self) -> None:
        self.seen: list[list[str]] = []

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        lines = new_user_lines(messages)
        self.seen.append(lines)
        ops = [{"op": "NEW", "content": "Signed up for a pottery class.", "type": "event"}
               for line in lines if "pottery" in line]  # fmt: skip
        return decided(info, {"operations": ops})


def distilling(engine: AsyncEngine, **options: Any) -> tuple[Distilling, JobQueue, MemoryService]:
    settings = make_settings(**options)
    service = MemoryService(MemoryStore(engine), FakeEmbedder())
    queue = queue_of(engine)
    return Distilling(queue, service, settings), queue, service


async def words(service: MemoryService, user: str, *texts: str) -> list[str]:
    """One exchange's episodes, written together (as one job writes them)."""
    written = await service.add(
        user, [NewMemory(t, type=MemoryType.EPISODE, observed_at=SAID) for t in texts]
    )
    return [r.id for r in written.records]


async def queued(queue: JobQueue) -> list[tuple[str, dict[str, Any], str]]:
    """The jobs queued but the idle ones."""
    async with queue._sessions() as session:
        rows = await session.execute(
            select(ManagerJob.id, ManagerJob.payload, ManagerJob.user_id)
            .where(~ManagerJob.id.like("idle-%")).order_by(ManagerJob.key)
        )  # fmt: skip
        return [(i, p, u) for i, p, u in rows]


async def held(queue: JobQueue, user: str) -> str:
    """An idle job of the user's, claimed by `queue`'s process: the one that distils."""
    async with queue._sessions() as session, session.begin():
        session.add(ManagerJob(id=f"idle-test-{user}", user_id=user, explicit=False,
                               status=JobStatus.QUEUED.value, attempts=0, next_attempt_at=SAID,
                               payload={"model": "m", "context": [], "new": [],
                                        "fingerprints": []}, created_at=SAID))  # fmt: skip
    (job,) = await queue.claim(1, exclude_users=set())
    return job.id


async def distilled(distil: Distilling, queue: JobQueue, user: str) -> None:
    """The user's idle job queues one distilling job, and is done."""
    job = await held(queue, user)
    assert (await distil.run(user, since=0, model="m", job_id=job)).queued == 1
    async with queue._sessions() as session, session.begin():
        await session.execute(delete(ManagerJob).where(ManagerJob.id == job))


async def run_jobs(worker: Worker, queue: JobQueue) -> None:
    """Run the worker until the queue is empty."""
    await worker.start()
    try:

        async def done() -> bool:
            return not await queued(queue)

        await until(done, seconds=15)
    finally:
        await worker.stop()


async def test_an_exchange_that_gave_no_fact_is_queued_once_as_that_days_turns(
    engines: list[AsyncEngine],
) -> None:
    distil, queue, service = distilling(engines[0])
    pottery, answer = await words(service, "ann", "I signed up for a pottery class last week.",
                                  'No. (answering "Do you eat honey?")')  # fmt: skip
    ann = await held(queue, "ann")
    done = await distil.run("ann", since=0, model="m", job_id=ann)
    assert (done.queued, done.stopped_at) == (1, None)
    ((job_id, payload, user),) = await queued(queue)
    assert job_id == module.distil_job_id(pottery) and user == "ann"
    assert payload[KEPT] == [pottery, answer] and payload["model"] == "m"
    assert datetime.fromisoformat(payload["said_at"]) == SAID
    assert [(role_of(t), text_of(t)) for t in load(payload["new"])] == [
        ("user", "I signed up for a pottery class last week."),
        ("assistant", "Do you eat honey?"),  # the question is never taken for the user's words
        ("user", "No."),
    ]
    # once: the same look again, or another process's, queues nothing
    other = Distilling(queue_of(engines[1]), service, make_settings())
    assert (await distil.run("ann", since=0, model="m", job_id=ann)).queued == 0  # marked
    assert (await other.run("ann", since=0, model="m", job_id=ann)).queued == 0  # not its job
    assert len(await queued(queue)) == 1


async def test_words_a_fact_came_from_a_parked_jobs_words_and_users_without_a_model_are_left(
    engine: AsyncEngine,
) -> None:
    distil, queue, service = distilling(engine)
    (linked,) = await words(service, "ann", "I signed up for a pottery class.")
    (fact,) = (await service.add("ann", [NewMemory("Signed up for a pottery class.")])).records
    async with service.store.writing("ann", MemorySource.API) as w:
        w.link(fact.id, linked)
    (parked,) = await words(service, "ann", "My pottery teacher is strict.")
    async with async_sessionmaker(engine)() as session, session.begin():
        session.add(ManagerJob(id="parked-job", user_id="ann", explicit=False,
                               status=JobStatus.FAILED.value, attempts=5, next_attempt_at=SAID,
                               payload={"model": "m", "context": [], "new": [],
                                        "fingerprints": [], KEPT: [parked]},
                               created_at=SAID))  # fmt: skip
    await words(service, "bob", "I signed up for a pottery class.")
    ann, bob = await held(queue, "ann"), await held(queue, "bob")
    assert (await distil.run("ann", since=0, model="m", job_id=ann)).queued == 0
    assert (await distil.run("bob", since=0, model="", job_id=bob)).queued == 0
    off, _, _ = distilling(engine, consolidation=False)
    assert (await off.run("bob", since=0, model="m", job_id=bob)).queued == 0
    assert (await distil.run("bob", since=0, model="m", job_id=bob)).queued == 1


async def test_a_bound_stops_the_run_where_the_next_goes_on(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(module, "GROUPS", 1)
    distil, queue, service = distilling(engine)
    await words(service, "ann", "I signed up for a pottery class.")
    await words(service, "ann", "My pottery teacher is strict.")
    ann = await held(queue, "ann")
    first = await distil.run("ann", since=0, model="m", job_id=ann)
    assert first.queued == 1 and first.stopped_at is not None
    second = await distil.run("ann", since=first.stopped_at, model="m", job_id=ann)
    assert second.queued == 1 and second.stopped_at is None
    texts = [text_of(load(p["new"])[0]) for _, p, _ in await queued(queue)]
    assert texts == ["I signed up for a pottery class.", "My pottery teacher is strict."]


async def test_the_worker_learns_the_words_and_links_the_facts_to_them(engine: AsyncEngine) -> None:
    settings = make_settings(manager_steps="one", manager_lease_seconds=0.6)
    model = Pottery()
    manager = Manager(settings, http_client=httpx.AsyncClient(), model=FunctionModel(model))
    distil, queue, service = distilling(engine)
    (pottery,) = await words(service, "ann", "I signed up for a pottery class last week.")
    await distilled(distil, queue, "ann")
    await run_jobs(Worker(queue, service, manager, settings, Metrics()), queue)
    assert model.seen == [["I signed up for a pottery class last week."]]
    (fact,) = [r for r in (await service.page("ann", limit=10, offset=0))[0]
               if r.type != MemoryType.EPISODE]  # fmt: skip
    assert fact.content == "Signed up for a pottery class." and fact.observed_at == SAID
    async with async_sessionmaker(engine)() as session:
        links = list(await session.execute(select(MemoryLink.fact_id, MemoryLink.episode_id)))
    assert [tuple(x) for x in links] == [(fact.id, pottery)]


async def test_words_deleted_meanwhile_are_not_learned_and_left_facts_words_not_queued(
    engine: AsyncEngine,
) -> None:
    settings = make_settings(manager_steps="one", manager_lease_seconds=0.6)
    model = Pottery()
    manager = Manager(settings, http_client=httpx.AsyncClient(), model=FunctionModel(model))
    distil, queue, service = distilling(engine)
    (gone,) = await words(service, "ann", "I signed up for a pottery class last week.")
    await distilled(distil, queue, "ann")
    await service.delete("ann", [gone])  # the user deletes the words before the job runs
    await run_jobs(Worker(queue, service, manager, settings, Metrics()), queue)
    assert model.seen == []  # nothing learned from deleted words
    assert (await service.page("ann", limit=10, offset=0))[0] == []
    # the words a fact came from, once that fact leaves (merged, superseded, forgotten), are
    # not taken for words that gave no fact
    (kept,) = await words(service, "bob", "I moved to Lyon in 2020.")
    (fact,) = (await service.add("bob", [NewMemory("Lives in Lyon.")])).records
    async with service.store.writing("bob", MemorySource.API) as w:
        w.link(fact.id, kept)
    async with service.store.writing("bob", MemorySource.UPKEEP) as w:
        await forget(w, {fact.key: "superseded"}, cause="superseded")
    bob = await held(queue, "bob")
    assert (await distil.run("bob", since=0, model="m", job_id=bob)).queued == 0
