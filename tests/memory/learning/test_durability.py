"""Nothing a client was answered for is lost: the Manager's job is in the database before the
answer reaches the client (a kill -9 of a real server process at once after the chats loses no
turn), and writers of two processes on one SQLite file never fail with "database is locked"."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import respx
from sqlalchemy import event, func, select

from app.devtools.fake_upstream import FakeUpstream
from app.memory.learning.extraction import exchange
from app.memory.learning.jobs import JobQueue
from app.memory.learning.turns import load, role_of, text_of, turn
from app.memory.store.db import create_engine, upgrade
from app.memory.store.memories import MemoryStore
from app.memory.store.records import NewMemory
from app.memory.store.tables import ManagerJob, Memory, ProcessedTurn
from tests import databases
from tests.conftest import AppClientFactory
from tests.helpers import completion_json, free_port, sse_response
from tests.helpers import sse as sse_body
from tests.servers import serve

ROOT = Path(__file__).resolve().parents[3]
USERS = ["ann", "bob", "cy"]
SERVER = """
import sys

import uvicorn

from app.config import Settings
from app.main import create_app
from tests.fakes import FakeEmbedder

app = create_app(Settings(), embedder=FakeEmbedder())
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
"""


def start_server(data: Path, upstream_url: str, **env: str) -> tuple[subprocess.Popen[bytes], str]:
    """`memproxy` in a process of its own, as `memproxy serve` runs it (the fake embedder in
    place of the model); its Manager cannot be reached, so every job stays in the database.
    `env`: more (or other) MEMPROXY_ variables."""
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("MEMPROXY_")},
        "PYTHONPATH": str(ROOT),
        "MEMPROXY_DATABASE_URL": databases.url_in(data),
        "MEMPROXY_UPSTREAM_BASE_URL": upstream_url,
        "MEMPROXY_UPSTREAM_CHECK_AT_START": "false",
        "MEMPROXY_MANAGER_BASE_URL": f"http://127.0.0.1:{free_port()}/v1",
        "MEMPROXY_MANAGER_RETRY_SECONDS": "3600",
        "MEMPROXY_SQLITE_BUSY_TIMEOUT_SECONDS": "30",
        **env,
    }
    log = (data / "server.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(port)], cwd=data, env=env, stdout=log, stderr=log
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120  # a bound on a loaded machine, not a measurement
    while True:
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return process, url
        except httpx.HTTPError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"the server did not start:\n{(data / 'server.log').read_text()}")
        time.sleep(0.1)


async def chat(client: httpx.AsyncClient, user: str, text: str, *, stream: bool) -> str:
    """One chat, its whole answer read."""
    body = {"model": "m", "stream": stream, "messages": [{"role": "user", "content": text}]}
    async with client.stream(
        "POST", "/v1/chat/completions", json=body, headers={"X-User-Id": user}
    ) as response:
        answer = (await response.aread()).decode()
        assert response.status_code == 200, answer
    return answer


def queued_turns(database: Path) -> list[str]:
    """The user turns of every Manager job in the database, whatever the job's state."""
    with sqlite3.connect(database) as connection:
        payloads = [
            json.loads(p) for (p,) in connection.execute("SELECT payload FROM manager_jobs")
        ]
    return [text_of(t) for p in payloads for t in load(p["new"]) if role_of(t) == "user"]


@pytest.mark.sqlite_only  # holds SQLite's write lock from another connection
def test_a_completed_chat_survives_a_kill_at_once(tmp_path: Path) -> None:
    """Chats (streamed and not) whose answers were read to the end, then kill -9 at once: each
    one's turn is in a job. The database's write lock is held by another connection while the
    chats start (as a busy second process would), so a job written after the answer would
    still be waiting for it when the process dies."""
    texts = {f"user{i}": f"Remember that my locker number is {i}" for i in range(12)}
    database = tmp_path / "memproxy.db"
    with serve(FakeUpstream()) as upstream:
        process, url = start_server(tmp_path, f"{upstream}/v1")
        blocker = sqlite3.connect(database, isolation_level=None)
        try:
            blocker.execute("BEGIN IMMEDIATE")  # another process is writing

            async def chats() -> list[str]:
                async with httpx.AsyncClient(base_url=url, timeout=60) as client:
                    running = [
                        asyncio.ensure_future(chat(client, user, text, stream=i % 2 == 0))
                        for i, (user, text) in enumerate(texts.items())
                    ]
                    await asyncio.sleep(0.5)  # the chats are under way
                    blocker.execute("COMMIT")
                    return await asyncio.gather(*running)

            answers = asyncio.run(chats())
            process.kill()  # kill -9, the moment the last answer was read
            process.wait(10)
        finally:
            process.kill()
            blocker.close()
    assert all(answer.rstrip().endswith(("}", "[DONE]")) for answer in answers)  # whole
    assert sorted(queued_turns(database)) == sorted(texts.values())


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_the_job_is_pending_when_the_answer_returns(
    make_client: AppClientFactory, upstream: respx.Router, stream: bool
) -> None:
    answer = (
        sse_response(sse_body({"role": "assistant", "content": "Noted."}))
        if stream
        else httpx.Response(200, json=completion_json("Noted."))
    )
    upstream.post("/chat/completions").mock(return_value=answer)
    client = await make_client(manager_enabled=True, conversation_threshold=1)
    await client._transport.app.state.services.worker.stop()  # type: ignore[attr-defined]
    response = await client.post(
        "/v1/chat/completions",
        json={"model": "m", "stream": stream, "messages": [{"role": "user", "content": "I run"}]},
        headers={"X-User-Id": "ann"},
    )
    assert response.status_code == 200
    jobs: dict[str, Any] = (
        await client.get("/v1/memories/stats", headers={"X-User-Id": "ann"})
    ).json()["jobs"]
    assert jobs["awaiting"] + jobs["queued"] == 1, jobs


async def test_two_processes_hammering_one_file_never_see_database_is_locked(
    tmp_path: Path,
) -> None:
    """Two engines (as two processes would have) write at once, each with several writers in
    flight, with a busy timeout far shorter than the writes queue for: every write lands."""
    url = databases.url_in(tmp_path, "shared.db")
    engines = [create_engine(url, busy_timeout_seconds=0.02) for _ in range(2)]
    await upgrade(engines[0])
    stores = [MemoryStore(engine) for engine in engines]
    queues = [JobQueue(store.sessions) for store in stores]
    seeded = await stores[0].add("ann", [NewMemory(content=f"seed {i}") for i in range(3)])
    keys = [record.key for record in seeded.records]
    texts: list[str] = []
    rounds, writers = 10, 6

    async def writer(n: int) -> None:
        store, queue = stores[n % 2], queues[n % 2]
        for i in range(rounds):
            user = USERS[(n + i) % len(USERS)]
            text = f"writer {n} round {i}: I keep bees"
            texts.append(text)
            found = exchange([turn("user", text)], set(), threshold=1)
            assert found is not None
            queued = await queue.enqueue(user, "m", found, interval_seconds=0, awaiting=True)
            assert queued is not None
            await queue.complete(queued.job_id, "Noted.", interval_seconds=0)
            await store.add(user, [NewMemory(content=f"writer {n} memory {i}")])
            await store.mark_recalled("ann", keys)
            await queue.claim(1, exclude_users=set())

    try:
        await asyncio.gather(*(writer(n) for n in range(2 * writers)))
        async with stores[1].sessions() as session:
            payloads = list(await session.scalars(select(ManagerJob.payload)))
            turns = await session.scalar(select(func.count()).select_from(ProcessedTurn))
            memories = await session.scalar(select(func.count()).select_from(Memory))
            counts = list(
                await session.scalars(select(Memory.recall_count).where(Memory.key.in_(keys)))
            )
    finally:
        for engine in engines:
            await engine.dispose()
    queued = [text_of(t) for p in payloads for t in load(p["new"]) if role_of(t) == "user"]
    assert sorted(queued) == sorted(texts)  # each exchange in exactly one job
    assert turns == len(texts)
    assert memories == len(keys) + len(texts)
    assert counts == [len(texts)] * len(keys)  # every recall counted, none twice


async def test_recall_marks_of_concurrent_chats_are_written_together(tmp_path: Path) -> None:
    engine = create_engine(databases.url_in(tmp_path, "marks.db"))
    await upgrade(engine)
    store = MemoryStore(engine)
    ann = [r.key for r in (await store.add("ann", [NewMemory(content="a")])).records]
    bob = [r.key for r in (await store.add("bob", [NewMemory(content="b")])).records]
    commits = itertools.count()
    event.listen(engine.sync_engine, "commit", lambda _conn: next(commits))
    try:
        await asyncio.gather(
            *(store.mark_recalled("ann", ann) for _ in range(30)),
            *(store.mark_recalled("bob", bob) for _ in range(20)),
            store.mark_recalled("ann", bob),  # another user's key: not counted
        )
        written = next(commits)
        assert (await store.get_many("ann", ann))[ann[0]].recall_count == 30
        assert (await store.get_many("bob", bob))[bob[0]].recall_count == 20
    finally:
        await engine.dispose()
    assert written <= 3  # 51 calls, a few transactions (one per batch)
