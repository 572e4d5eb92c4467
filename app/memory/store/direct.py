"""Reads on a search's path, run by the database driver itself: what a search shows (its
memories, and the ids linked to each) in two statements on one pooled connection.

Through SQLAlchemy's async adaptation each statement is four hand-offs between the event loop
and the driver (a cursor, the statement, the fetch, the cursor's close) and each read its own
connection's reset; on a loaded 2-core machine a hand-off waits ~0.2-0.5 ms for a thread to
wake, and the API's search spent ~4 ms of its ~10 reading 10 records and their links
(docs/performance.md). Here each statement is one hand-off (aiosqlite's ``execute_fetchall``,
asyncpg's ``fetch``), as the version's read is (:mod:`app.memory.store.versions`), and on SQLite
the connection goes back to the pool without its reset's rollback when it is outside any
transaction (:func:`reading`). Another driver takes SQLAlchemy's way, with the same results.

The rows are decoded here as SQLAlchemy's types would: SQLite keeps a datetime as ISO text, a
boolean as 0/1 and JSON as text; asyncpg gives them typed (JSON decoded by the codec SQLAlchemy
sets on each connection). Each statement sees what was committed before it began, as two
separate reads did. A connection whose driver raised, or whose read was cancelled, is
invalidated, as SQLAlchemy does with one cut off: the pool opens a new one rather than hand it
out again (not an in-memory SQLite's single connection, which is its database).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from types import SimpleNamespace
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.pool import StaticPool

from app.memory.store import sqlite_connections
from app.memory.store.links import LINK_CHUNK, collect, links_of
from app.memory.store.records import RECORD_COLUMNS, MemoryRecord, record_of_row
from app.memory.store.tables import Memory, MemoryLink

Linked = dict[str, list[str]]
"""For each memory id, the ids linked to it, oldest link first (:func:`links.linked_ids`)."""

_NAMES = tuple(column.name for column in RECORD_COLUMNS)
"""Each is its column's name in the table too (the one label, ``metadata``, is the column's)."""
_COLUMNS = ", ".join(f'"{name}"' for name in _NAMES)
_RECORDS = {
    "aiosqlite": f'SELECT {_COLUMNS} FROM {Memory.__tablename__} WHERE "key" IN ({{marks}})',
    "asyncpg": f'SELECT {_COLUMNS} FROM {Memory.__tablename__} WHERE "key" = ANY($1::bigint[])',
}
_LINK_READ = f"SELECT fact_id, episode_id FROM {MemoryLink.__tablename__} WHERE user_id = "
_LINK_ORDER = " ORDER BY created_at, fact_id, episode_id"
_LINKS = {
    "aiosqlite": _LINK_READ
    + "? AND (fact_id IN ({marks}) OR episode_id IN ({marks}))"
    + _LINK_ORDER,
    "asyncpg": _LINK_READ
    + "$1 AND (fact_id = ANY($2::text[]) OR episode_id = ANY($2::text[]))"
    + _LINK_ORDER,
}


def _decoded(driver: str, raw: Sequence[Any]) -> SimpleNamespace:
    """A raw row as a Core row of ``RECORD_COLUMNS`` reads: by attribute, decoded."""
    values = dict(zip(_NAMES, raw, strict=True))
    if driver == "aiosqlite":
        meta = values["metadata"]
        values["metadata"] = json.loads(meta) if isinstance(meta, str | bytes) else meta
        for name in ("pinned", "profile"):
            values[name] = bool(values[name])
        for name in ("created_at", "updated_at", "observed_at", "last_recalled_at"):
            if isinstance(values[name], str):
                values[name] = datetime.fromisoformat(values[name])  # made UTC by the record
    return SimpleNamespace(**values)


async def driver_of(connection: AsyncConnection) -> tuple[str, Any] | None:
    """The connection's driver name and its own connection, for :func:`fetch`; None for a
    driver these reads have no statements for (SQLAlchemy's way then)."""
    name = connection.dialect.driver
    if name not in _RECORDS:
        return None
    raw = await connection.get_raw_connection()
    return name, raw.driver_connection


@asynccontextmanager
async def reading(
    engine: AsyncEngine,
) -> AsyncIterator[tuple[AsyncConnection, tuple[str, Any] | None]]:
    """A pooled connection and its driver (:func:`driver_of`). When the block ends without an
    error, having awaited each of its statements, on an aiosqlite connection still valid and
    outside any transaction (as SQLite says), the pool takes it back without a rollback
    (:mod:`app.memory.store.sqlite_connections`); never an in-memory database's, which every
    task shares (a ``StaticPool``)."""
    async with engine.connect() as connection:
        direct = await driver_of(connection)
        yield connection, direct
        if (
            direct is not None
            and direct[0] == "aiosqlite"
            and not connection.invalidated  # a failed fetch the block caught: closed
            and not direct[1].in_transaction
            and not isinstance(connection.sync_engine.pool, StaticPool)  # shared by all tasks
        ):
            sqlite_connections.no_rollback(connection.info)  # the pool record's: no hand-off


async def fetch(
    connection: AsyncConnection, driver: str, handle: Any, sql: str, params: Sequence[Any]
) -> list[Any]:
    """`sql`'s rows, run by the driver `handle` of `connection` in one hand-off (also the
    version's read, :mod:`app.memory.store.versions`); the connection invalidated when the
    driver raises or the read is cancelled (module docstring)."""
    try:
        if driver == "aiosqlite":
            return list(await handle.execute_fetchall(sql, tuple(params)))
        return list(await handle.fetch(sql, *params))
    except BaseException:  # a cancelled read too: the driver may still be in the statement
        if not isinstance(connection.sync_engine.pool, StaticPool):  # an in-memory SQLite's one
            await connection.invalidate()  # connection is its database: kept
        raise


async def records(
    engine: AsyncEngine, user_id: str, keys: Sequence[int], *, links: bool = False
) -> tuple[dict[int, MemoryRecord], Linked]:
    """The user's memories with these keys, by key (another user's keys and unknown ones left
    out; embeddings not loaded), and when `links`, the ids linked to each (one without links
    left out)."""
    wanted = list(dict.fromkeys(keys))
    if not wanted:
        return {}, {}
    found: dict[int, MemoryRecord] = {}
    linked: Linked = {}
    async with reading(engine) as (connection, direct):
        for start in range(0, len(wanted), LINK_CHUNK):
            chunk = wanted[start : start + LINK_CHUNK]
            rows = await _record_rows(connection, direct, chunk)
            mine = [record_of_row(r) for r in rows if r.user_id == user_id]
            found |= {r.key: r for r in mine}
            if links and mine:
                ids = [r.id for r in mine]
                collect(linked, await _link_rows(connection, direct, user_id, ids), set(ids))
    return found, linked


async def _record_rows(
    connection: AsyncConnection, direct: tuple[str, Any] | None, keys: list[int]
) -> list[Any]:
    # By primary key alone: with the user in the WHERE clause SQLite scans the user's index
    # (12 ms at 100k memories); the owner is checked by the caller instead.
    if direct is None:
        return list(await connection.execute(select(*RECORD_COLUMNS).where(Memory.key.in_(keys))))
    driver, handle = direct
    params: list[Any] = [keys]  # asyncpg: one array
    sql = _RECORDS[driver]
    if driver == "aiosqlite":
        sql, params = sql.format(marks=", ".join("?" * len(keys))), list(keys)
    return [_decoded(driver, row) for row in await fetch(connection, driver, handle, sql, params)]


async def _link_rows(
    connection: AsyncConnection, direct: tuple[str, Any] | None, user_id: str, ids: list[str]
) -> list[Any]:
    if direct is None:
        return list(await connection.execute(links_of(user_id, ids)))
    driver, handle = direct
    params: list[Any] = [user_id, ids]
    sql = _LINKS[driver]
    if driver == "aiosqlite":
        sql, params = sql.format(marks=", ".join("?" * len(ids))), [user_id, *ids, *ids]
    return await fetch(connection, driver, handle, sql, params)
