"""The Manager's queue under concurrency, as several replicas on one database put it to work (on
PostgreSQL when MEMPROXY_TEST_DATABASE_URL says so: READ COMMITTED, where a job read then
rewritten without a row lock lost turns; on SQLite, whose writes are one at a time anyway)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app.memory.learning.extraction import exchange
from app.memory.learning.jobs import JobQueue
from app.memory.learning.turns import load, role_of, text_of, turn
from app.memory.store.db import create_engine, upgrade
from app.memory.store.memories import MemoryStore
from app.memory.store.tables import JobStatus, ManagerJob, MemorySource
from tests import databases

USERS = ["ann", "bob", "cy"]
IDLE = {status.value: 0 for status in JobStatus}


async def test_many_chats_of_one_user_at_once_lose_no_turn(tmp_path: Path) -> None:
    """40 chats of one user end at once on two replicas: each answer joins the user's pending
    routine job (read, turns appended, written back). Every turn must be in a job once."""
    url = databases.url_in(tmp_path, "shared.db")
    engines = [create_engine(url) for _ in range(2)]
    await upgrade(engines[0])
    queues = [JobQueue(engine_sessions(engine)) for engine in engines]
    texts = [f"chat {i}: I keep {i} bees" for i in range(40)]

    async def chat(i: int) -> None:
        queue = queues[i % 2]
        found = exchange([turn("user", texts[i])], set(), threshold=1)
        assert found is not None
        queued = await queue.enqueue("ann", "m", found, interval_seconds=60, awaiting=True)
        assert queued is not None
        await asyncio.sleep(0)
        await queue.complete(queued.job_id, "Noted.", interval_seconds=60)

    try:
        await asyncio.gather(*(chat(i) for i in range(len(texts))))
        async with engine_sessions(engines[1])() as session:
            payloads = list(await session.scalars(select(ManagerJob.payload)))
    finally:
        for engine in engines:
            await engine.dispose()
    queued = [text_of(t) for p in payloads for t in load(p["new"]) if role_of(t) == "user"]
    assert sorted(queued) == sorted(texts)


async def test_two_replicas_claiming_while_chats_arrive_run_each_turn_once(tmp_path: Path) -> None:
    """Chats of three users end on two replicas while both replicas' workers claim and apply
    jobs: no job is run twice, and every turn is in exactly one job run (or still queued)."""
    url = databases.url_in(tmp_path, "shared.db")
    engines = [create_engine(url) for _ in range(2)]
    await upgrade(engines[0])
    stores = [MemoryStore(engine) for engine in engines]
    queues = [JobQueue(store.sessions) for store in stores]
    texts = [f"chat {i}: my locker is {i}" for i in range(60)]
    ran: list[tuple[str, list[str]]] = []
    chatting = True

    async def chat(i: int) -> None:
        queue = queues[i % 2]
        found = exchange([turn("user", texts[i])], set(), threshold=1)
        assert found is not None
        queued = await queue.enqueue(USERS[i % 3], "m", found, interval_seconds=0, awaiting=True)
        assert queued is not None
        await queue.complete(queued.job_id, "Noted.", interval_seconds=0)

    async def worker(n: int) -> None:
        while chatting or await queues[n].counts() != {**IDLE}:
            for job in await queues[n].claim(2, exclude_users=set()):
                async with stores[n].writing(job.user_id, MemorySource.MANAGER) as w:
                    assert await queues[n].consume(w, job.id)  # applied here, once
                ran.append((job.id, [text_of(t) for t in job.turns()[1] if role_of(t) == "user"]))
            await asyncio.sleep(0.001)

    workers = [asyncio.ensure_future(worker(n)) for n in range(2)]
    try:
        await asyncio.gather(*(chat(i) for i in range(len(texts))))
        chatting = False
        await asyncio.wait_for(asyncio.gather(*workers), 30)
    finally:
        for engine in engines:
            await engine.dispose()
    ids = [job_id for job_id, _ in ran]
    assert len(ids) == len(set(ids))
    assert sorted(text for _, said in ran for text in said) == sorted(texts)


def engine_sessions(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    """What one replica's queue works with."""
    return async_sessionmaker(engine, expire_on_commit=False)
