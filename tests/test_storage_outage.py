"""The database failing under a running memproxy (a PostgreSQL restart or failover, a full disk):
a chat answered 200 has its Manager job (its write is tried again within
``MEMPROXY_JOB_WRITE_TIMEOUT_SECONDS``, and beyond it the chat answers 503 with ``Retry-After``
and none of the answer), the memory API answers 503 with ``Retry-After`` rather than a bare 500,
and ``/readyz`` says not ready while writes fail. Not outages: another process holding SQLite's
write lock beyond the bound (the job write waits its turn, the chat answers 200), and an OSError
of memproxy's own (a 500, writes not said to fail).

The outage is made at the database (:class:`Outage`): on PostgreSQL the test's own database stops
taking connections (the open ones terminated, as a restart does) or turns read-only (new sessions
default to read-only transactions, as a standby after a failover); on SQLite, where another
process cannot take a file away from open connections, the statements fail as SQLite fails them
(``sqlite3`` errors: "disk I/O error" for every statement, or, for writes only, the "database or
disk is full" of a real database that reached its ``max_page_count``).
"""

from __future__ import annotations

import asyncio
import os
import re
import sqlite3
import time
from collections.abc import AsyncIterator
from concurrent.futures import Future
from contextlib import asynccontextmanager
from typing import Any, Literal

import httpx
import pytest
import respx
from sqlalchemy import event, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker

from app.memory.chat import job_write
from app.memory.learning.turns import load, role_of, text_of
from app.memory.store.db import create_engine, writing
from app.memory.store.tables import ManagerJob
from app.proxy import offload
from app.storage_faults import storage_failure, write_failure
from tests import databases
from tests.conftest import AppClientFactory
from tests.helpers import assert_openai_error, completion_json, sse, sse_response

ANN = {"X-User-Id": "ann"}
REMEMBER = "Remember that my locker number is 42"
Mode = Literal["down", "writes"]
WRITES = re.compile(r"^\s*(INSERT|UPDATE|DELETE|BEGIN IMMEDIATE)\b", re.IGNORECASE)


def _sqlite_error(kind: Mode) -> sqlite3.Error:
    """A real error of SQLite's: a full disk (``max_page_count`` reached) or a failing one."""
    connection = sqlite3.connect(":memory:")
    try:
        if kind == "down":
            connection.execute("PRAGMA max_page_count=1")
        connection.execute("CREATE TABLE t (x)")
        connection.execute("PRAGMA max_page_count=2")
        for _ in range(100):
            connection.execute("INSERT INTO t VALUES (?)", ("x" * 1000,))
    except sqlite3.Error as exc:
        if kind == "down":  # what SQLite says when the disk under it fails
            return sqlite3.OperationalError("disk I/O error")
        return exc
    finally:
        connection.close()
    raise AssertionError("SQLite took every write")


class Outage:
    """The test's database failing: `down` (nothing answers) or `writes` (writes fail, reads
    work). Started and ended by the test, from any task."""

    def __init__(self, engine: AsyncEngine, mode: Mode) -> None:
        self.engine = engine
        self.mode = mode
        self._postgres = engine.dialect.name == "postgresql"
        self._error = None if self._postgres else _sqlite_error(mode)
        self._on = False

    def _fail(self, _conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        assert self._error is not None
        if self.mode == "down" or WRITES.match(statement):
            raise self._error

    async def start(self) -> None:
        self._on = True
        if not self._postgres:
            event.listen(self.engine.sync_engine, "before_cursor_execute", self._fail)
            return
        if self.mode == "down":
            await self._admin("ALTER DATABASE {db} ALLOW_CONNECTIONS false")
        else:
            await self._admin("ALTER DATABASE {db} SET default_transaction_read_only = on")
        await self._terminate()

    async def end(self) -> None:
        """The database back (a no-op once it is)."""
        if not self._on:
            return
        self._on = False
        if not self._postgres:
            event.remove(self.engine.sync_engine, "before_cursor_execute", self._fail)
            return
        if self.mode == "down":
            await self._admin("ALTER DATABASE {db} ALLOW_CONNECTIONS true")
        else:
            await self._admin("ALTER DATABASE {db} RESET default_transaction_read_only")
            await self._terminate()  # the sessions opened meanwhile are read-only

    async def end_after(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
        await self.end()

    async def _terminate(self) -> None:
        await self._admin(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = '{name}' AND pid <> pg_backend_pid()"
        )

    async def _admin(self, statement: str) -> None:
        assert databases.SERVER_URL is not None
        name = make_url(self.engine.url).database
        connection = await databases._connect(databases.SERVER_URL)
        try:
            await connection.execute(statement.format(db=f'"{name}"', name=name))
        finally:
            await connection.close()


@asynccontextmanager
async def outage(client: httpx.AsyncClient, mode: Mode) -> AsyncIterator[Outage]:
    """The database failing for the block (or until the test ends it earlier)."""
    down = Outage(services(client).engine, mode)
    await down.start()
    try:
        yield down
    finally:
        await down.end()


def services(client: httpx.AsyncClient) -> Any:
    return client._transport.app.state.services  # type: ignore[attr-defined]


async def learning_client(make_client: AppClientFactory, **settings: Any) -> httpx.AsyncClient:
    """An app that queues every chat's job (its Manager stopped: the jobs stay in the database)."""
    client: httpx.AsyncClient = await make_client(
        manager_enabled=True, conversation_threshold=1, recall_timeout_seconds=0.5, **settings
    )
    await services(client).worker.stop()
    return client


async def jobs_with(client: httpx.AsyncClient, said: str) -> int:
    """How many Manager jobs, in any state, hold the user turn `said`."""
    sessions = async_sessionmaker(services(client).engine)
    async with sessions() as session:
        payloads = list(await session.scalars(select(ManagerJob.payload)))
    return sum(
        1 for p in payloads for t in load(p["new"]) if role_of(t) == "user" and text_of(t) == said
    )


def answer(upstream: respx.Router, *, stream: bool) -> respx.Route:
    reply = (
        sse_response(sse({"role": "assistant", "content": "Noted, locker 42."}))
        if stream
        else httpx.Response(200, json=completion_json("Noted, locker 42."))
    )
    return upstream.post("/chat/completions").mock(return_value=reply)


def chat(said: str, *, stream: bool) -> dict[str, Any]:
    return {"model": "m", "stream": stream, "messages": [{"role": "user", "content": said}]}


def assert_storage_503(response: httpx.Response) -> None:
    error = assert_openai_error(response, 503)
    assert error["code"] == "storage_unavailable", error
    assert error["type"] == "server_error", error
    assert int(response.headers["retry-after"]) >= 1


STREAMS = pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])


@STREAMS
@pytest.mark.parametrize("mode", ["down", "writes"])
async def test_a_blip_shorter_than_the_bound_keeps_the_answers_job(
    make_client: AppClientFactory, upstream: respx.Router, stream: bool, mode: Mode
) -> None:
    answer(upstream, stream=stream)
    client = await learning_client(make_client, job_write_timeout_seconds=10)
    async with outage(client, mode) as down:
        ending = asyncio.ensure_future(down.end_after(0.6))
        response = await client.post(
            "/v1/chat/completions", json=chat(REMEMBER, stream=stream), headers=ANN
        )
        await ending
    assert response.status_code == 200, response.text
    assert "locker 42" in response.text
    assert await jobs_with(client, REMEMBER) == 1


@STREAMS
@pytest.mark.parametrize("mode", ["down", "writes"])
async def test_an_outage_beyond_the_bound_is_a_503_with_none_of_the_answer(
    make_client: AppClientFactory, upstream: respx.Router, stream: bool, mode: Mode
) -> None:
    answer(upstream, stream=stream)
    client = await learning_client(make_client, job_write_timeout_seconds=0.5)
    async with outage(client, mode):
        refused = await client.post(
            "/v1/chat/completions", json=chat(REMEMBER, stream=stream), headers=ANN
        )
    assert_storage_503(refused)
    assert "locker 42" not in refused.text  # the upstream was asked meanwhile: its answer dropped

    # Still serving: the same chat again has its answer and its one job.
    again = await client.post(
        "/v1/chat/completions", json=chat(REMEMBER, stream=stream), headers=ANN
    )
    assert again.status_code == 200 and "locker 42" in again.text
    await asyncio.sleep(0.2)  # the refused chat's late write, if any, is kept meanwhile
    assert await jobs_with(client, REMEMBER) == 1


async def test_a_retry_that_finds_its_turns_taken_by_the_refused_chat_s_late_job_loses_none(
    make_client: AppClientFactory, upstream: respx.Router, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The order that lost a turn (seen ~1 run in 6 above): the refused chat's job lands after
    its 503, the client's retry finds the turns taken and queues nothing, then the refused
    chat's job was withdrawn. It is kept now: the turn is in exactly one job, due."""
    answer(upstream, stream=False)
    client = await learning_client(make_client, job_write_timeout_seconds=0.3)
    queue = services(client).jobs
    enqueue, gate, calls = queue.enqueue, asyncio.Event(), []

    async def slow_first(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:  # the refused chat's write: a database slower than the bound
            await asyncio.sleep(0.6)
        return await enqueue(*args, **kwargs)

    monkeypatch.setattr(queue, "enqueue", slow_first)
    for name in ("withdraw", "complete"):  # the refused chat's last word waits for the retry
        original = getattr(queue, name)

        async def held(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
            await gate.wait()
            return await _original(*args, **kwargs)

        monkeypatch.setattr(queue, name, held)
    refused = await client.post(
        "/v1/chat/completions", json=chat(REMEMBER, stream=False), headers=ANN
    )
    assert_storage_503(refused)
    for _ in range(100):  # its write lands late
        if await jobs_with(client, REMEMBER) == 1:
            break
        await asyncio.sleep(0.05)
    assert await jobs_with(client, REMEMBER) == 1
    again = await client.post(
        "/v1/chat/completions", json=chat(REMEMBER, stream=False), headers=ANN
    )
    assert again.status_code == 200 and "locker 42" in again.text
    gate.set()
    await asyncio.sleep(0.3)
    assert await jobs_with(client, REMEMBER) == 1
    async with async_sessionmaker(services(client).engine)() as session:
        (status,) = list(await session.scalars(select(ManagerJob.status)))
    assert status == "queued"


@pytest.mark.parametrize("delay", ["making", "queued"])
async def test_a_large_bodys_own_work_is_not_the_databases_time(
    make_client: AppClientFactory,
    upstream: respx.Router,
    monkeypatch: pytest.MonkeyPatch,
    delay: str,
) -> None:
    """The bound is the database's: a conversation whose turns take longer to make than the
    bound (a 50 MB history on a busy machine: bench/loop_stall.py answered 503), or whose job's
    exchange waits in the lane behind another request's long step (a large body's steps take
    turns on one thread: app/proxy/offload.py), still has its answer and its job; the
    database's own slowness still counts (the test above)."""
    answer(upstream, stream=False)
    client = await learning_client(make_client, job_write_timeout_seconds=0.3)
    made = job_write.turns_and_marks
    ahead: list[Future[None]] = []

    def delayed(ctx: Any) -> Any:  # runs in the lane, as for a large body
        if delay == "making":
            time.sleep(0.6)
        else:  # another request's step (its parse, say) queues behind this one
            ahead.append(offload._LANE.submit(time.sleep, 0.6))
        return made(ctx)

    monkeypatch.setattr(job_write, "turns_and_marks", delayed)
    monkeypatch.setattr(offload, "LARGE_BODY_BYTES", 0)  # this body as a large one: in the lane
    response = await client.post(
        "/v1/chat/completions", json=chat(REMEMBER, stream=False), headers=ANN
    )
    assert response.status_code == 200 and "locker 42" in response.text
    assert await jobs_with(client, REMEMBER) == 1
    assert all(f.done() for f in ahead)  # the exchange did wait for it


@pytest.mark.parametrize("memory", ["read-only", "off"])
async def test_a_chat_that_learns_nothing_never_waits_on_the_database(
    make_client: AppClientFactory, upstream: respx.Router, memory: str
) -> None:
    answer(upstream, stream=False)
    client = await learning_client(make_client, job_write_timeout_seconds=0.5)
    async with outage(client, "down"):
        response = await client.post(
            "/v1/chat/completions",
            json=chat(REMEMBER, stream=False),
            headers={**ANN, "X-Memory": memory},
        )
    assert response.status_code == 200 and "locker 42" in response.text


@pytest.mark.parametrize("mode", ["down", "writes"])
async def test_the_memory_api_answers_503_with_retry_after_when_storage_fails(
    client: httpx.AsyncClient, mode: Mode
) -> None:
    async with outage(client, mode):
        created = await client.post("/v1/memories", json={"content": "I keep bees"}, headers=ANN)
        imported = await client.post(
            "/v1/memories/import",
            content=b'{"content": "I keep wasps"}\n',
            headers={**ANN, "content-type": "application/x-ndjson"},
        )
        reads = [
            await client.get("/v1/memories", headers=ANN),
            await client.get("/v1/memories/stats", headers=ANN),
        ]
    assert_storage_503(created)
    assert_storage_503(imported)
    for read in reads:
        if mode == "down":
            assert_storage_503(read)
        else:
            assert read.status_code == 200, read.text
    after = await client.post("/v1/memories", json={"content": "I keep bees"}, headers=ANN)
    assert after.status_code == 201, after.text


async def test_readyz_is_not_ready_while_writes_fail(client: httpx.AsyncClient) -> None:
    assert (await client.get("/readyz")).status_code == 200
    async with outage(client, "writes"):
        failed = await client.post("/v1/memories", json={"content": "I keep bees"}, headers=ANN)
        assert failed.status_code == 503
        probe = await client.get("/readyz")
        assert probe.status_code == 503, probe.text
        assert probe.json()["checks"]["writes"].startswith("failing"), probe.json()
        assert "writes: failing" in probe.json()["reason"]
        assert probe.json()["checks"]["database"] == "ok"  # it reads; it cannot write
    ready = await client.get("/readyz")  # the next probe's write succeeds: ready again
    assert ready.status_code == 200, ready.text
    assert ready.json()["checks"]["writes"] == "ok"


def test_storage_failures_are_told_from_bugs(tmp_path: Any) -> None:
    """Real errors of SQLite's, of the network, and SQLAlchemy's wrappers of them."""
    full = _sqlite_error("writes")
    assert storage_failure(OperationalError("INSERT", {}, full))  # type: ignore[arg-type]
    read_only = tmp_path / "ro.db"
    sqlite3.connect(read_only).execute("CREATE TABLE t (x)").connection.close()
    os.chmod(read_only, 0o444)
    try:
        sqlite3.connect(read_only).execute("INSERT INTO t VALUES (1)")
    except sqlite3.OperationalError as exc:
        assert storage_failure(OperationalError("INSERT", {}, exc))  # type: ignore[arg-type]
    try:
        sqlite3.connect(tmp_path / "no" / "such.db")
    except sqlite3.OperationalError as exc:
        assert storage_failure(OperationalError(None, None, exc))  # type: ignore[arg-type]
    # Bugs and refusals of the data are not the database failing.
    connection = sqlite3.connect(":memory:")
    connection.execute("CREATE TABLE t (x UNIQUE)")
    connection.execute("INSERT INTO t VALUES (1)")
    try:
        connection.execute("INSERT INTO t VALUES (1)")
    except sqlite3.IntegrityError as exc:
        assert not storage_failure(IntegrityError("INSERT", {}, exc))  # type: ignore[arg-type]
    try:
        connection.execute("SELEC 1")
    except sqlite3.OperationalError as exc:  # SQLite calls a syntax error "operational"
        assert not storage_failure(OperationalError("SELEC 1", {}, exc))  # type: ignore[arg-type]
    assert not storage_failure(ValueError("bug"))
    assert not storage_failure(KeyError("bug"))


@pytest.mark.skipif(not databases.on_postgresql(), reason="PostgreSQL's own errors")
async def test_postgresql_outages_are_storage_failures(engine: AsyncEngine) -> None:
    down = Outage(engine, "down")
    async with engine.connect() as connection:
        await connection.execute(text("SELECT 1"))
        await down.start()
        try:
            with pytest.raises(Exception) as terminated:
                await connection.execute(text("SELECT 1"))
            with pytest.raises(Exception) as refused:
                async with engine.connect() as other:
                    await other.execute(text("SELECT 1"))
        finally:
            await down.end()
    assert storage_failure(terminated.value), repr(terminated.value)
    assert storage_failure(refused.value), repr(refused.value)


@pytest.mark.skipif(databases.on_postgresql(), reason="SQLite's write lock")
@STREAMS
async def test_a_job_write_waiting_its_turn_on_a_locked_file_is_not_cut_at_the_bound(
    make_client: AppClientFactory, upstream: respx.Router, stream: bool
) -> None:
    """Another process holding SQLite's write lock beyond the bound is contention, not an
    outage: the job write waits its turn (as every write does), and the answer with it."""
    answer(upstream, stream=stream)
    client = await learning_client(
        make_client, job_write_timeout_seconds=0.5, sqlite_busy_timeout_seconds=0.2
    )
    path = make_url(services(client).engine.url).database
    assert path is not None
    holder = sqlite3.connect(path, isolation_level=None)  # "another process"
    try:
        holder.execute("BEGIN IMMEDIATE")
        asyncio.get_running_loop().call_later(1.5, holder.execute, "COMMIT")
        response = await client.post(
            "/v1/chat/completions", json=chat(REMEMBER, stream=stream), headers=ANN
        )
    finally:
        holder.close()
    assert response.status_code == 200, response.text
    assert "locker 42" in response.text
    assert await jobs_with(client, REMEMBER) == 1


@pytest.mark.parametrize(
    "error",
    [TimeoutError("timed out"), FileNotFoundError(2, "No such file", "/data/x")],
    ids=["timeout", "file-not-found"],
)
async def test_an_os_error_of_memproxys_own_is_a_500_not_the_database_failing(
    client: httpx.AsyncClient, error: OSError
) -> None:
    """An OSError raised by memproxy's code (in a write transaction, even) is a bug of its
    own: a 500, and writes are not said to fail."""
    engine = services(client).engine

    async def failing() -> None:
        async with writing(async_sessionmaker(engine)) as session:
            await session.execute(text("SELECT 1"))
            raise error

    client._transport.app.add_api_route("/failing", failing)  # type: ignore[attr-defined]
    response = await client.get("/failing")
    error_object = assert_openai_error(response, 500)
    assert error_object["type"] == "server_error" and error_object["code"] is None, error_object
    assert "retry-after" not in response.headers
    assert write_failure(engine) is None
    assert (await client.get("/readyz")).json()["checks"]["writes"] == "ok"


async def test_only_the_drivers_os_errors_are_the_database_failing() -> None:
    """A connection refused while the engine connects is the database failing; the same
    error raised by anything else is not."""
    closed = create_engine("postgresql+asyncpg://postgres@127.0.0.1:9/none")  # discard port
    try:
        with pytest.raises(OSError) as refused:
            async with closed.connect() as connection:
                await connection.execute(text("SELECT 1"))
    finally:
        await closed.dispose()
    assert storage_failure(refused.value), repr(refused.value)
    for error in (
        ConnectionRefusedError(111, "Connect call failed"),
        TimeoutError(),
        FileNotFoundError(2, "No such file"),
    ):
        try:
            raise error
        except OSError as raised:
            assert not storage_failure(raised), repr(raised)
    try:
        try:
            raise ConnectionResetError(104, "Connection reset by peer")
        except OSError as reset:
            raise OperationalError("SELECT 1", {}, reset) from reset
    except OperationalError as wrapped:
        assert storage_failure(wrapped)  # under the driver's error: the network to the database
