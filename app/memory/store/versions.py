"""The user's version, read on every recall (:meth:`app.memory.search.cache.IndexCache.get`):
what tells a process whether its index of the user is current, so that nothing stale is served.

The read is one statement, so it is run by the database driver itself on a pooled connection:
through SQLAlchemy's async adaptation it took five hand-offs between the event loop and the
driver (a cursor, the statement, the fetch, the cursor's close, the rollback ending the read),
half of recall's time on a loaded 2-core machine (docs/performance.md); by aiosqlite's
``execute_fetchall`` or asyncpg's ``fetch`` it is one (:func:`app.memory.store.direct.fetch`,
which also invalidates a connection whose read failed or was cancelled); the pool's reset of
the connection was another, skipped now where SQLite says no transaction is open
(:mod:`~app.memory.store.sqlite_connections`). Outside a transaction, each read sees what was
committed before it began: never an older version. Another driver takes SQLAlchemy's way
(:func:`~app.memory.store.direct.reading`).
"""

from __future__ import annotations

from sqlalchemy import bindparam, select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.memory.store.direct import fetch, reading
from app.memory.store.tables import UserState

VERSION = select(UserState.version).where(UserState.user_id == bindparam("user_id"))
"""The version's read, built once: SQLAlchemy's way (a unit of work reads it in its session)."""
_SQL = {
    "aiosqlite": f"SELECT version FROM {UserState.__tablename__} WHERE user_id = ?",
    "asyncpg": f"SELECT version FROM {UserState.__tablename__} WHERE user_id = $1",
}


async def read_version(engine: AsyncEngine, user_id: str) -> int:
    """The user's change sequence: 0 before any write, then bumped by every write."""
    async with reading(engine) as (connection, direct):
        if direct is None:
            value = await connection.scalar(VERSION, {"user_id": user_id})
            return int(value or 0)
        name, driver = direct
        rows = await fetch(connection, name, driver, _SQL[name], [user_id])
        return int(rows[0][0] or 0) if rows else 0
