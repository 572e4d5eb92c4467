"""SQLite connections (:mod:`app.memory.store.sqlite_connections`): each set up when made (WAL,
the busy timeout, ...); handed back to the pool without a needless rollback when a driver's read
ended outside any transaction; every other hand-back still rolled back, a connection left in a
transaction included."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import aiosqlite
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.pool import PoolResetState

from app.memory.store import direct, sqlite_connections
from app.memory.store.db import create_engine, upgrade
from app.memory.store.memories import MemoryStore
from app.memory.store.records import NewMemory

pytestmark = pytest.mark.sqlite_only  # asyncpg's adaptation makes no round trip to skip


@pytest.fixture
def rollbacks(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every rollback a driver's connection is asked for, by the connection."""
    asked: list[object] = []
    real = aiosqlite.Connection.rollback

    async def counted(self: aiosqlite.Connection) -> None:
        asked.append(self)
        await real(self)

    monkeypatch.setattr(aiosqlite.Connection, "rollback", counted)
    return asked


async def test_the_drivers_reads_are_handed_back_without_a_rollback(
    engine: AsyncEngine, rollbacks: list[object]
) -> None:
    store = MemoryStore(engine)
    await store.add("ann", [NewMemory("Ann keeps bees"), NewMemory("Ann lives in Lyon")])
    keys = sorted(await store.keys("ann"))
    rollbacks.clear()  # the writes' own

    versions = [await store.version("ann") for _ in range(5)]
    found = await store.get_many_linked("ann", keys)

    assert versions == [1] * 5
    assert sorted(r.content for r in found[0].values()) == ["Ann keeps bees", "Ann lives in Lyon"]
    assert rollbacks == []  # six hand-backs, each one a trip to the driver's thread before


async def test_sqlalchemys_own_reads_and_writes_are_still_rolled_back(
    engine: AsyncEngine, rollbacks: list[object]
) -> None:
    async with engine.connect() as connection:
        assert await connection.scalar(text("SELECT 1")) == 1
    assert len(rollbacks) == 1  # the connection's own transaction, ended as before
    store = MemoryStore(engine)
    rollbacks.clear()
    await store.add("ann", [NewMemory("Ann keeps bees")])
    assert len(rollbacks) == 1  # the pool's, after the commit: SQLAlchemy's path is unchanged
    assert await store.version("ann") == 1


async def test_a_detached_connection_is_rolled_back_and_closed(
    engine: AsyncEngine, rollbacks: list[object]
) -> None:
    """A detached connection's hand-back has no pool record to read a mark from: it is rolled
    back and closed, as by the pool's default."""
    async with engine.connect() as connection:
        handle = (await connection.get_raw_connection()).driver_connection
        await connection.run_sync(lambda sync: sync.detach())
    assert rollbacks == [handle]
    with pytest.raises(ValueError, match="no active connection"):  # closed
        await handle.execute("SELECT 1")


async def test_a_connection_left_in_a_transaction_is_rolled_back(
    engine: AsyncEngine, rollbacks: list[object]
) -> None:
    """A read block whose connection is still in a transaction when it ends gets the pool's
    rollback, also on the very connection a clean read was handed back without one (the mark
    serves one hand-back only)."""
    store = MemoryStore(engine)
    await store.add("ann", [NewMemory("Ann keeps bees")])
    rollbacks.clear()  # the write's own
    handles: list[Any] = []
    async with direct.reading(engine) as (_, found):
        assert found is not None
        handles.append(found[1])
    assert rollbacks == []

    async with direct.reading(engine) as (_, found):
        assert found is not None
        handle = found[1]
        handles.append(handle)
        await handle.execute("BEGIN IMMEDIATE")
        await handle.execute("UPDATE user_state SET version = version + 100")
        assert handle.in_transaction

    assert handles[0] is handles[1]  # the pool's one connection, marked clean a moment ago
    assert rollbacks == [handle]
    assert not handle.in_transaction  # nor does it hold the write lock for the next one
    assert await store.version("ann") == 1
    await store.add("ann", [NewMemory("Ann lives in Lyon")])  # the lock is free
    assert await store.version("ann") == 2


@pytest.mark.parametrize("error", [LookupError, asyncio.CancelledError])
async def test_a_failed_or_cancelled_block_is_rolled_back(
    engine: AsyncEngine, rollbacks: list[object], error: type[BaseException]
) -> None:
    """A block that raised after its reads, outside any transaction: no mark, the rollback."""
    store = MemoryStore(engine)
    await store.add("ann", [NewMemory("Ann keeps bees")])
    rollbacks.clear()
    with pytest.raises(error):
        async with direct.reading(engine) as (_, found):
            assert found is not None
            assert await found[1].execute_fetchall("SELECT version FROM user_state") == [(1,)]
            assert not found[1].in_transaction
            raise error("a read that went wrong")
    assert rollbacks == [found[1]]
    assert await store.version("ann") == 1


async def test_a_failed_fetch_caught_in_the_block_ends_it_quietly(engine: AsyncEngine) -> None:
    """The failed fetch closed its connection (invalidated): the block's end asks it nothing
    (a closed aiosqlite connection raises on any question) and the pool makes a new one."""
    async with direct.reading(engine) as (connection, found):
        assert found is not None
        with pytest.raises(sqlite3.OperationalError):
            await direct.fetch(connection, *found, "SELECT * FROM no_such_table", ())
        assert connection.invalidated
    assert await MemoryStore(engine).version("ann") == 0


class _Driver:
    """A driver's connection that counts the rollbacks it is asked for."""

    def __init__(self) -> None:
        self.rollbacks = 0

    def rollback(self) -> None:
        self.rollbacks += 1


class _Record:
    def __init__(self) -> None:
        self.info: dict[str, Any] = {}


@pytest.mark.parametrize(
    ("was_reset", "asyncio_safe", "marked", "rolled_back"),
    [
        (False, True, False, 1),  # the pool's default: a rollback
        (True, True, False, 0),  # the connection's own transaction already rolled back
        (False, False, False, 0),  # outside the event loop (garbage collected): closed only
        (False, True, True, 0),  # marked by a clean read
    ],
)
def test_the_reset_is_the_pools_default_but_for_a_marked_connection(
    tmp_path: Path, was_reset: bool, asyncio_safe: bool, marked: bool, rolled_back: int
) -> None:
    engine = create_engine(f"sqlite+aiosqlite:///{tmp_path}/reset.db")
    driver, record = _Driver(), _Record()
    if marked:
        sqlite_connections.no_rollback(record.info)
    state = PoolResetState(
        transaction_was_reset=was_reset, terminate_only=False, asyncio_safe=asyncio_safe
    )
    engine.sync_engine.pool.dispatch.reset(driver, record, state)
    assert driver.rollbacks == rolled_back
    assert record.info == {}  # a mark serves one hand-back
    engine.sync_engine.pool.dispatch.reset(driver, record, state)
    assert driver.rollbacks == 2 * rolled_back + (1 if marked else 0)  # unmarked again


@pytest.mark.parametrize("where", ["file", "memory"])
async def test_every_connection_is_set_up(tmp_path: Path, where: str) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path}/set_up.db" if where == "file" else "sqlite+aiosqlite://"
    engine = create_engine(url, busy_timeout_seconds=1.5)
    try:
        async with engine.connect() as connection:
            pragmas = {
                name: (await connection.execute(text(f"PRAGMA {name}"))).scalar()
                for name in ("journal_mode", "busy_timeout", "synchronous", "foreign_keys")
            }
    finally:
        await engine.dispose()
    # WAL where there is a file (an in-memory database keeps its journal in memory); NORMAL (1)
    # is durable in WAL mode
    journal = "wal" if where == "file" else "memory"
    assert pragmas == {
        "journal_mode": journal,
        "busy_timeout": 1500,
        "synchronous": 1,
        "foreign_keys": 1,
    }


async def test_an_in_memory_databases_shared_connection_is_never_marked(
    rollbacks: list[object],
) -> None:
    """``sqlite+aiosqlite:///:memory:``: one connection for every task (a ``StaticPool``), whose
    next hand-back may be another task's: no mark."""
    engine = create_engine("sqlite+aiosqlite:///:memory:")
    try:
        await upgrade(engine)
        rollbacks.clear()
        assert await MemoryStore(engine).version("ann") == 0
        assert len(rollbacks) == 1
    finally:
        await engine.dispose()
