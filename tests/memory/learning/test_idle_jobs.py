"""Idle jobs (issue 27, point 1): a quiet user whose memories changed gets one idle job, queued
by whichever process looks (one per version of their memories, also when two look at once),
run through the Manager's queue after the user's chats' jobs, exactly once, never while a chat's
job of theirs waits; its work (forgetting over the capacities) is done in the unit that consumes
it, and no other is due until the memories change again."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import httpx
import pytest
from pydantic_ai.messages import ModelMessage, ModelResponse
from pydantic_ai.models.function import AgentInfo, FunctionModel
from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker

from app.memory.learning.applier import JobGone
from app.memory.learning.extraction import exchange
from app.memory.learning.idle import IdleWork
from app.memory.learning.idle_jobs import idle_job_id
from app.memory.learning.jobs import JobQueue
from app.memory.learning.manager import Manager
from app.memory.learning.turns import turn
from app.memory.learning.worker import Worker
from app.memory.service import MemoryService
from app.memory.store.memories import MemoryStore
from app.memory.store.records import NewMemory, now
from app.memory.store.tables import (
    ForgottenMemory,
    ManagerJob,
    ManagerState,
    Memory,
    MemoryEvent,
    MemorySource,
)
from app.metrics import Metrics
from tests.conftest import make_settings
from tests.fakes import FakeEmbedder
from tests.memory.learning.support import until

LEASE = 0.6


def queue_of(engine: AsyncEngine) -> JobQueue:
    return JobQueue(async_sessionmaker(engine, expire_on_commit=False), lease_seconds=LEASE)


async def facts(service: MemoryService, user: str, n: int) -> list[str]:
    written = await service.add(
        user, [NewMemory(f"{user} likes thing number {i}") for i in range(n)]
    )
    return [r.id for r in written.records]


async def chat_job(queue: JobQueue, user: str) -> str:
    found = exchange([turn("user", f"I live in Oslo ({now()})")], set(), threshold=1)
    assert found is not None
    queued = await queue.enqueue(user, "m", found, interval_seconds=0)
    assert queued is not None
    return queued.job_id


async def idle_jobs(queue: JobQueue) -> list[tuple[str, str, str]]:
    async with queue._sessions() as session:
        rows = await session.execute(
            select(ManagerJob.id, ManagerJob.user_id, ManagerJob.status)
            .where(ManagerJob.id.like("idle-%")).order_by(ManagerJob.key)
        )  # fmt: skip
        return [(a, b, c) for a, b, c in rows]


async def test_a_quiet_user_whose_memories_changed_gets_one_idle_job(
    engines: list[AsyncEngine],
) -> None:
    a, b = queue_of(engines[0]), queue_of(engines[1])
    service = MemoryService(MemoryStore(engines[0]), FakeEmbedder())
    await facts(service, "ann", 2)
    await facts(service, "bob", 1)
    # two replicas look at once: one job per user
    counts = await asyncio.gather(a.queue_idle(0), b.queue_idle(0))
    assert sum(counts) == 2  # each job inserted once: a second insert of its id is a no-op
    found = await idle_jobs(a)
    assert sorted(user for _, user, _ in found) == ["ann", "bob"]
    assert await a.queue_idle(0) == 0 and await b.queue_idle(0) == 0  # theirs are waiting
    (ann_job,) = [job for job, user, _ in found if user == "ann"]
    assert ann_job == idle_job_id("ann", 1)
    progress = await a.progress("ann")
    assert progress["pending"] == 0 and progress["idle"] == 1 and progress["queued"] == 1


async def test_no_idle_job_while_the_user_chats_or_has_a_job_waiting(engine: AsyncEngine) -> None:
    queue = queue_of(engine)
    service = MemoryService(MemoryStore(engine), FakeEmbedder())
    await facts(service, "ann", 1)
    await chat_job(queue, "ann")  # a chat's job queued: the user is not quiet
    assert await queue.queue_idle(600) == 0
    (job,) = await queue.claim(1, exclude_users=set())
    await queue.park(job.id, "test: set aside")  # a failed job does not hold idle work back...
    assert await queue.queue_idle(600) == 0  # ...but the chat was just now
    async with queue._sessions() as session, session.begin():
        await session.execute(
            update(ManagerState).values(last_job_at=now() - timedelta(seconds=601))
        )
    assert await queue.queue_idle(600) == 0  # its memory was written just now
    async with queue._sessions() as session, session.begin():
        await session.execute(update(Memory).values(updated_at=now() - timedelta(seconds=601)))
    assert await queue.queue_idle(600) == 1


async def test_an_erased_user_and_a_parked_idle_job_get_no_more(engine: AsyncEngine) -> None:
    queue = queue_of(engine)
    service = MemoryService(MemoryStore(engine), FakeEmbedder())
    await facts(service, "ann", 1)
    await facts(service, "bob", 1)
    await service.delete_all("bob")  # its version moved, and nothing of it is left
    assert await queue.queue_idle(0) == 1
    (job,) = await queue.claim(1, exclude_users=set())
    assert job.user_id == "ann"
    await queue.park(job.id, "test: failed for good")
    assert await queue.queue_idle(0) == 0  # the parked one holds its version's work
    await facts(service, "ann", 1)
    assert await queue.queue_idle(0) == 0  # until it is retried (`memproxy jobs retry`)
    assert await queue.retry_failed("ann") == 1


async def test_a_user_given_memories_is_weighed_afresh(engine: AsyncEngine) -> None:
    queue = queue_of(engine)
    service = MemoryService(MemoryStore(engine), FakeEmbedder())
    for _ in range(5):
        await facts(service, "anonymous", 1)  # anonymous at version 5
    await facts(service, "ann", 1)
    async with queue._sessions() as session, session.begin():
        session.add(ManagerState(user_id="anonymous", idle_version=5))
    assert await queue.queue_idle(0) == 1  # ann's
    await service.move("anonymous", "ann")
    async with queue._sessions() as session:
        state = await session.scalar(
            select(ManagerState.idle_version).where(ManagerState.user_id == "ann")
        )
    assert state is None  # not anonymous's 5, which ann's counter may be far from


async def test_no_idle_job_is_due_until_the_memories_change_again(engine: AsyncEngine) -> None:
    queue = queue_of(engine)
    service = MemoryService(MemoryStore(engine), FakeEmbedder())
    await facts(service, "ann", 1)
    async with service.store.writing("ann", MemorySource.UPKEEP) as w:  # done, nothing changed
        await w.lock()
        await queue.idle_done(w)
    assert w.version == 1
    assert await queue.queue_idle(0) == 0
    await facts(service, "ann", 1)  # version 2
    assert await queue.queue_idle(0) == 1
    assert [j for j, _, _ in await idle_jobs(queue)] == [idle_job_id("ann", 2)]


async def test_a_chat_job_goes_first_and_never_joins_the_idle_job(engine: AsyncEngine) -> None:
    queue = queue_of(engine)
    service = MemoryService(MemoryStore(engine), FakeEmbedder())
    await facts(service, "ann", 1)
    assert await queue.queue_idle(0) == 1
    chat = await chat_job(queue, "ann")
    async with queue._sessions() as session, session.begin():  # due in an hour (an interval)
        await session.execute(update(ManagerJob).where(ManagerJob.id == chat)
                              .values(next_attempt_at=now() + timedelta(hours=1)))  # fmt: skip
    assert chat != idle_job_id("ann", 1)
    ((idle_id, _, _),) = await idle_jobs(queue)
    async with queue._sessions() as session:
        payload = await session.scalar(select(ManagerJob.payload).where(ManagerJob.id == idle_id))
    assert payload is not None and payload["new"] == []  # the chat's turns are not in it
    # the chat's job is not due yet, and the idle job waits behind it
    assert await queue.claim(2, exclude_users=set()) == []
    async with queue._sessions() as session, session.begin():
        await session.execute(update(ManagerJob).where(ManagerJob.id == chat)
                              .values(next_attempt_at=now()))  # fmt: skip
    (first,) = await queue.claim(2, exclude_users=set())
    assert first.id == chat


class Unasked:
    """The Manager's model: an idle job must never ask it."""

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        raise AssertionError("an idle job asked the Manager")


def worker_for(engine: AsyncEngine, metrics: Metrics, **options: Any) -> Worker:
    """A worker doing idle work at once, forgetting over 3 facts (the rest as configured: no
    model is named, so consolidation merges near copies only)."""
    settings = make_settings(idle_seconds=0.05, manager_lease_seconds=LEASE, max_facts=3, **options)
    service = MemoryService(MemoryStore(engine), FakeEmbedder())
    manager = Manager(settings, http_client=httpx.AsyncClient(), model=FunctionModel(Unasked()))
    return Worker(queue_of(engine), service, manager, settings, metrics)


async def forgotten_events(engine: AsyncEngine, user: str) -> int:
    async with async_sessionmaker(engine)() as session:
        return int(await session.scalar(
            select(func.count()).select_from(MemoryEvent)
            .where(MemoryEvent.user_id == user, MemoryEvent.action == "forgotten")
        ) or 0)  # fmt: skip


async def test_the_worker_forgets_over_the_capacity_once_and_is_then_done(
    engine: AsyncEngine,
) -> None:
    metrics = Metrics()
    service = MemoryService(MemoryStore(engine), FakeEmbedder())
    await facts(service, "ann", 5)
    worker = worker_for(engine, metrics)
    await worker.start()
    try:
        await until(lambda: _settled(engine, "ann", 3), seconds=15)
        await asyncio.sleep(LEASE)  # more looks: nothing more is due
        assert await idle_jobs(queue_of(engine)) == []
    finally:
        await worker.stop()
    assert await forgotten_events(engine, "ann") == 2
    assert metrics.idle_jobs._value.get() == 1
    assert metrics.memories_forgotten.labels("fact")._value.get() == 2
    async with async_sessionmaker(engine)() as session:
        done = await session.scalar(
            select(ManagerState.idle_version).where(ManagerState.user_id == "ann")
        )
    assert done == 2  # 1: the five facts; 2: the forgetting (the version it committed)


async def _settled(engine: AsyncEngine, user: str, left: int) -> bool:
    service = MemoryService(MemoryStore(engine), FakeEmbedder())
    held = len((await service.page(user, limit=100, offset=0))[0])
    return held == left and not await idle_jobs(queue_of(engine))


async def test_two_replicas_doing_idle_work_at_once_forget_each_memory_once(
    engines: list[AsyncEngine],
) -> None:
    service = MemoryService(MemoryStore(engines[0]), FakeEmbedder())
    users = [f"user{i}" for i in range(6)]
    for user in users:
        await facts(service, user, 6)
    workers = [worker_for(e, Metrics(), manager_concurrency=3) for e in engines]
    for worker in workers:
        await worker.start()
    try:
        for user in users:
            await until(lambda user=user: _settled(engines[0], user, 3), seconds=30)  # type: ignore[misc]
    finally:
        for worker in workers:
            await worker.stop()
    for user in users:
        assert await forgotten_events(engines[0], user) == 3
    async with async_sessionmaker(engines[0])() as session:
        kept = await session.scalar(select(func.count()).select_from(ForgottenMemory))
    assert kept == 3 * len(users)


async def test_an_idle_job_another_process_took_up_writes_nothing(
    engines: list[AsyncEngine],
) -> None:
    a, b = queue_of(engines[0]), queue_of(engines[1])
    service = MemoryService(MemoryStore(engines[0]), FakeEmbedder())
    await facts(service, "ann", 4)
    assert await a.queue_idle(0) == 1
    (job,) = await a.claim(1, exclude_users=set())
    await asyncio.sleep(LEASE * 1.5)  # A stops renewing: B takes the job up
    assert await b.expire() == 1
    (again,) = await b.claim(1, exclude_users=set())
    assert again.id == job.id
    settings = make_settings(max_facts=2)
    with pytest.raises(JobGone):
        await IdleWork(a, service, settings, Metrics()).run(job)
    assert len((await service.page("ann", limit=10, offset=0))[0]) == 4
    done = await IdleWork(b, service, settings, Metrics()).run(again)
    assert len(done.forgotten) == 2


async def test_the_worker_erases_forgotten_memories_past_their_keep_time(
    engine: AsyncEngine,
) -> None:
    """Every user's, also one who never comes back (no idle job of theirs is ever due again)."""
    service = MemoryService(MemoryStore(engine), FakeEmbedder())
    settings = make_settings(max_facts=1, forgotten_keep_days=30, idle_seconds=0)
    work = IdleWork(queue_of(engine), service, settings, Metrics())
    for user in ("ann", "bob"):
        await facts(service, user, 3)
        assert len((await work.forgetting.forget(user)).leaving) == 2
    async with async_sessionmaker(engine)() as session, session.begin():
        await session.execute(
            update(ForgottenMemory)
            .where(ForgottenMemory.user_id == "ann")
            .values(forgotten_at=now() - timedelta(days=31))
        )
    assert await work.look() is False  # no idle work (MEMPROXY_IDLE_SECONDS=0), but the purge
    async with async_sessionmaker(engine)() as session:
        left = list(await session.scalars(select(ForgottenMemory.user_id)))
    assert sorted(left) == ["bob", "bob"]
    assert await work.look() is False  # within PURGE_SECONDS: nothing more is asked


async def test_one_slot_may_go_to_idle_work_while_chats_jobs_wait(engine: AsyncEngine) -> None:
    """A Manager busy for hours (chats' jobs always waiting) would otherwise never run idle
    work, and stores would grow past their capacities."""
    queue = queue_of(engine)
    service = MemoryService(MemoryStore(engine), FakeEmbedder())
    await facts(service, "ann", 1)
    assert await queue.queue_idle(0) == 1
    for user in ("bob", "carol", "dan"):
        await chat_job(queue, user)
    plain = await queue.claim(2, exclude_users=set())
    assert sorted(j.user_id for j in plain) == ["bob", "carol"]  # chats first
    await queue.release()  # handed back
    first = await queue.claim(2, exclude_users=set(), idle_first=True)
    assert [j.id for j in first] == [idle_job_id("ann", 1), first[1].id]
    assert first[1].user_id == "bob"  # the other slot: the oldest chat's job


async def test_a_user_who_keeps_chatting_past_a_capacity_gets_idle_work_anyway(
    engine: AsyncEngine,
) -> None:
    """Never quiet, always a chat's job waiting: past a capacity by 5 %, an idle job is queued
    that does not wait behind their chats' jobs."""
    queue = queue_of(engine)
    service = MemoryService(MemoryStore(engine), FakeEmbedder())
    work = IdleWork(queue, service, make_settings(max_facts=20), Metrics())
    await facts(service, "ann", 21)  # the capacity and one: within 5 % (one memory)
    assert await work.learned("ann") is False
    await facts(service, "ann", 1)
    await chat_job(queue, "ann")  # the user chats on
    assert await work.learned("ann") is True
    assert await work.learned("ann") is False  # one idle job at a time
    (over,) = [j for j, _, _ in await idle_jobs(queue)]
    assert over == idle_job_id("ann", 2, over=True)
    first = await queue.claim(2, exclude_users=set(), idle_first=True)
    assert [j.id for j in first] == [over]  # not held behind the chat's job
    done = await work.run(first[0])
    assert len(done.forgotten) == 2
    no_caps = IdleWork(queue, service, make_settings(max_facts=0, max_episodes=0), Metrics())
    assert await no_caps.learned("ann") is False
