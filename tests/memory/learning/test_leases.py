"""Who runs a Manager job, across the processes sharing one database: a running (or awaiting) job
has an owner whose lease it renews; a job whose lease ran out is queued again for any process,
and its old owner can then neither apply it nor hand it back; the database allows one running
job per user, whatever each process read before it claimed."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app.memory.learning import leases
from app.memory.learning.extraction import exchange
from app.memory.learning.jobs import JobQueue
from app.memory.learning.turns import turn
from app.memory.store.db import writing
from app.memory.store.memories import MemoryStore
from app.memory.store.records import now
from app.memory.store.tables import JobStatus, ManagerJob, MemorySource
from tests import databases

LEASE = 0.4


def queues(engines: list[AsyncEngine], **options: Any) -> list[JobQueue]:
    return [
        JobQueue(async_sessionmaker(e, expire_on_commit=False), lease_seconds=LEASE, **options)
        for e in engines
    ]


async def queue_chat(queue: JobQueue, user: str, text: str, *, awaiting: bool = False) -> str:
    found = exchange([turn("user", text)], set(), threshold=1)
    assert found is not None
    queued = await queue.enqueue(user, "m", found, interval_seconds=0, awaiting=awaiting)
    assert queued is not None
    return queued.job_id


async def status(queue: JobQueue, job_id: str) -> tuple[str, str | None]:
    async with queue._sessions() as session:
        row = (
            await session.execute(
                select(ManagerJob.status, ManagerJob.owner).where(ManagerJob.id == job_id)
            )
        ).one()
    return row[0], row[1]


async def test_a_live_owner_keeps_its_job_and_a_dead_ones_job_is_taken_up_once(
    engines: list[AsyncEngine],
) -> None:
    a, b = queues(engines)
    job_id = await queue_chat(a, "ann", "I live in Oslo")
    (job,) = await a.claim(1, exclude_users=set())
    assert await status(a, job_id) == ("running", a.owner)
    for _ in range(4):  # A renews while it lives: B never takes the job
        await asyncio.sleep(LEASE / 2)
        assert await a.renew() == 1
        assert await b.expire() == 0 and await b.claim(1, exclude_users=set()) == []

    await asyncio.sleep(LEASE * 1.5)  # A stops renewing (killed, or cut off from the database)
    assert await b.expire() == 1
    (again,) = await b.claim(1, exclude_users=set())
    assert again.id == job_id and again.attempts == 2 and again.payload == job.payload
    assert await status(b, job_id) == ("running", b.owner)

    # A comes back to life: it can neither apply the job nor hand it back; B applies it once.
    store = MemoryStore(engines[0])
    async with store.writing("ann", MemorySource.MANAGER, job_id=job_id) as w:
        assert not await a.consume(w, job_id)
    assert not await a.retry_later(job_id, "late", 0) and not await a.park(job_id, "late")
    assert await a.renew() == 0  # its lease went with the job
    assert await status(b, job_id) == ("running", b.owner)
    async with MemoryStore(engines[1]).writing("ann", MemorySource.MANAGER, job_id=job_id) as w:
        assert await b.consume(w, job_id)
    assert sum((await b.counts()).values()) == 0


async def test_an_awaiting_job_of_a_dead_process_is_queued_without_its_answer(
    engines: list[AsyncEngine],
) -> None:
    a, b = queues(engines)
    job_id = await queue_chat(a, "ann", "I keep bees", awaiting=True)
    assert await status(a, job_id) == ("awaiting", a.owner)
    await asyncio.sleep(LEASE * 1.5)
    assert await b.expire() == 1
    assert await status(b, job_id) == ("queued", None)
    assert await a.complete(job_id, "Bees!", interval_seconds=0) == 0  # too late: nothing changes
    (job,) = await b.claim(1, exclude_users=set())
    assert [m.parts[0].content for m in job.turns()[1]] == ["I keep bees"]  # type: ignore[union-attr]


async def test_a_stopping_process_hands_its_jobs_back_and_no_other(
    engines: list[AsyncEngine],
) -> None:
    a, b = queues(engines)
    mine = await queue_chat(a, "ann", "I live in Oslo")
    (_job,) = await a.claim(1, exclude_users=set())
    awaiting = await queue_chat(a, "bob", "I keep bees", awaiting=True)
    others = await queue_chat(b, "cy", "I run", awaiting=True)
    assert await a.release() == 2
    for job_id in (mine, awaiting):
        assert await status(a, job_id) == ("queued", None)
    assert await status(b, others) == ("awaiting", b.owner)
    claimed = {job.id: job for job in await b.claim(5, exclude_users=set())}
    assert claimed[mine].attempts == 1  # the stop cut its attempt short: not counted


async def test_a_job_its_owner_dropped_lapses_and_another_process_takes_it_up(
    engines: list[AsyncEngine],
) -> None:
    """The owner's task ended without handing the job back (the database failed just then):
    the owner, alive, no longer renews it, so the user's learning does not stop for good."""
    a, b = queues(engines)
    job_id = await queue_chat(a, "ann", "I live in Oslo")
    other = await queue_chat(a, "bob", "I keep bees")
    assert len(await a.claim(2, exclude_users=set())) == 2
    a.let_go(job_id)
    for _ in range(3):
        await asyncio.sleep(LEASE / 2)
        assert await a.renew() == 1  # bob's job only
    assert await b.expire() == 1
    assert await status(b, job_id) == ("queued", None)
    assert await status(b, other) == ("running", a.owner)


async def test_the_database_allows_one_running_job_per_user(engine: AsyncEngine) -> None:
    (queue,) = queues([engine])
    first, second = [await queue_chat(queue, "ann", f"I live in {c}", awaiting=True) for c in "AB"]
    bobs = await queue_chat(queue, "bob", "I keep bees", awaiting=True)
    sessions = queue._sessions

    async def run(job_id: str) -> None:
        async with writing(sessions) as session:
            await session.execute(
                update(ManagerJob).where(ManagerJob.id == job_id).values(status="running")
            )

    await run(first)
    with pytest.raises(IntegrityError):
        await run(second)
    await run(bobs)  # another user's job runs beside it


class Paused(AsyncSession):
    """A session that stops after a claim's first read (the users with a job running) until the
    test lets it go on: another replica claims in between, as it may under load."""

    reads: asyncio.Event
    go_on: asyncio.Event

    async def scalars(self, statement: Any, *args: Any, **kwargs: Any) -> Any:
        result = await super().scalars(statement, *args, **kwargs)
        if "manager_jobs.status = " in str(statement) and not self.reads.is_set():
            self.reads.set()
            await self.go_on.wait()
        return result


@pytest.mark.skipif(not databases.on_postgresql(), reason="SQLite claims one at a time anyway")
async def test_a_claim_racing_another_replicas_claim_never_runs_two_jobs_of_a_user(
    engines: list[AsyncEngine],
) -> None:
    """B reads that ann has no job running; A claims ann's first job and commits; B, going on,
    finds her second job first in line. The database refuses it a second running job of ann:
    B claims bob's instead."""
    a, _ = queues(engines)
    Paused.reads, Paused.go_on = asyncio.Event(), asyncio.Event()
    b = JobQueue(
        async_sessionmaker(engines[1], class_=Paused, expire_on_commit=False), lease_seconds=LEASE
    )
    jobs = [await queue_chat(a, "ann", f"I live in city {i}", awaiting=True) for i in range(2)]
    bobs = await queue_chat(a, "bob", "I keep bees", awaiting=True)
    for job_id in [*jobs, bobs]:  # each its own job, due now (none merged into another)
        async with writing(a._sessions) as session:
            await session.execute(
                update(ManagerJob).where(ManagerJob.id == job_id).values(
                    status=JobStatus.QUEUED.value, next_attempt_at=now(), owner=None
                )
            )  # fmt: skip

    claiming = asyncio.ensure_future(b.claim(5, exclude_users=set()))
    await asyncio.wait_for(Paused.reads.wait(), 10)
    (first,) = await a.claim(1, exclude_users=set())
    assert first.id == jobs[0]
    Paused.go_on.set()
    taken = await asyncio.wait_for(claiming, 10)
    assert [job.id for job in taken] == [bobs]
    async with a._sessions() as session:
        running = list(await session.scalars(select(ManagerJob.user_id).where(
            ManagerJob.status == JobStatus.RUNNING.value)))  # fmt: skip
    assert sorted(running) == ["ann", "bob"]


@pytest.mark.skipif(not databases.on_postgresql(), reason="a SQLite file has one machine's clock")
async def test_leases_are_reckoned_on_the_databases_clock(
    engines: list[AsyncEngine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """B runs on a machine whose clock is an hour ahead: without the database's clock it would
    find A's live job expired at once."""
    a, b = queues(engines)
    job_id = await queue_chat(a, "ann", "I live in Oslo")
    await a.claim(1, exclude_users=set())
    real = leases.now
    monkeypatch.setattr(leases, "now", lambda: real() + timedelta(hours=1))
    await b.sync_clock()
    assert await b.expire() == 0 and await status(a, job_id) == ("running", a.owner)
    b._offset = timedelta(0)  # B's own clock, unsynced: A's live job taken from it
    assert await b.expire() == 1 and await status(a, job_id) == ("queued", None)
