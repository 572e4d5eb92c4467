"""A replica killed with -9 in the middle of a Manager job: the job stays running, held by the
dead process, until its lease runs out; then another replica takes it up and applies it once."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy.ext.asyncio import async_sessionmaker

from app.devtools.fake_upstream import FakeUpstream
from app.memory.learning.jobs import JobQueue
from app.memory.store.db import create_engine
from tests import databases
from tests.conftest import AppClientFactory
from tests.memory.learning.support import Remembering, equals, manager_client, memories, until
from tests.memory.learning.test_durability import chat, start_server
from tests.servers import serve


class Thinking:
    """A Manager model server that takes every request and never answers (counting them)."""

    def __init__(self) -> None:
        self.asked = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        self.asked += 1
        await asyncio.sleep(3600)

    async def was_asked(self) -> bool:
        return self.asked == 1


async def test_a_job_of_a_replica_killed_mid_job_is_finished_once_by_another(
    tmp_path: Path, make_client: AppClientFactory
) -> None:
    lease = "1.5"
    thinking = Thinking()
    with serve(FakeUpstream()) as upstream, serve(thinking, timeout_graceful_shutdown=1) as manager:
        process, url = start_server(
            tmp_path, f"{upstream}/v1",
            MEMPROXY_MANAGER_BASE_URL=f"{manager}/v1", MEMPROXY_MANAGER_LEASE_SECONDS=lease,
            MEMPROXY_CONVERSATION_THRESHOLD="1", MEMPROXY_PROCESSING_INTERVAL="0",
        )  # fmt: skip
        engine = create_engine(databases.url_in(tmp_path))
        queue = JobQueue(async_sessionmaker(engine, expire_on_commit=False))
        try:
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                await chat(client, "ann", "I live in Oslo", stream=False)
            await until(lambda: _running(queue))
            await until(thinking.was_asked)
            process.kill()  # kill -9 while the Manager thinks
            process.wait(10)

            remembering = Remembering()
            second = await manager_client(
                make_client, remembering, manager_lease_seconds=float(lease)
            )
            await asyncio.sleep(0.5)  # the dead process's lease still runs: nothing taken up
            assert remembering.seen == [] and await _running(queue)
            await until(lambda: equals(memories(second), ["Lives in Oslo"]), seconds=15)
            await asyncio.sleep(0.3)
            assert remembering.seen == [["I live in Oslo"]]
            assert sum((await queue.counts()).values()) == 0
        finally:
            process.kill()
            await engine.dispose()


async def _running(queue: JobQueue) -> bool:
    return (await queue.counts())["running"] == 1
