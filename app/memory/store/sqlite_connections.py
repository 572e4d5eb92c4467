"""SQLite connections: set up when made (WAL, the busy timeout), and handed back to the pool
without a rollback that has nothing to undo.

Every connection gets WAL (readers never block the writer), ``synchronous=NORMAL`` (durable in
WAL mode, and much faster), foreign keys, and the busy timeout (a writer waits for another
process's write instead of failing at once): :func:`install`.

SQLAlchemy's pool rolls back every connection handed back to it (``reset_on_return``), whatever
ran on it. Through aiosqlite a rollback is a trip to the connection's thread and back: on a
loaded 2-core machine ~0.3 ms of every chat's recall, spent after the version's read
(:mod:`app.memory.store.versions`) while nothing else waits (docs/performance.md). A read run by
the driver itself (:func:`app.memory.store.direct.reading`) that ended outside any transaction,
as SQLite itself says (``in_transaction``), is handed back without it: :func:`no_rollback`.

Every other hand-back is reset as the pool's default would: the same dialect rollback, skipped
where the default skips it (the connection's own transaction already rolled back, or a
hand-back outside the event loop, where the pool only closes). Installed on SQLite engines only:
asyncpg's adaptation makes no round trip when no transaction was begun.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.pool import ConnectionPoolEntry, PoolResetState

OPTIONS: dict[str, Any] = {"pool_reset_on_return": None}
"""For ``create_async_engine``: the pool's own reset off, :func:`install`'s in its place."""
_CLEAN = "memproxy_no_rollback"
"""Set in a connection's pool record for its next hand-back only."""


def install(engine: AsyncEngine, *, busy_timeout_seconds: float) -> None:
    """Set up each of `engine`'s connections when made; reset them as the pool's default does,
    except those marked by :func:`no_rollback`. The engine must be made with :data:`OPTIONS`."""
    dialect = engine.sync_engine.dialect
    timeout_ms = int(busy_timeout_seconds * 1000)

    @event.listens_for(engine.sync_engine, "connect")
    def _pragmas(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={timeout_ms}")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine.sync_engine, "reset")
    def _reset(
        dbapi_connection: Any, record: ConnectionPoolEntry | None, state: PoolResetState
    ) -> None:
        if record is not None and record.info.pop(_CLEAN, False):  # None: a detached one
            return
        if state.asyncio_safe and not state.transaction_was_reset:
            dialect.do_rollback(dbapi_connection)


def no_rollback(info: dict[Any, Any]) -> None:
    """The next hand-back to the pool of the connection whose `info` this is (a valid
    connection's ``info``: its pool record's) skips the rollback. Only for a connection whose
    statements have all ended and that is outside any transaction; not for one a ``StaticPool``
    shares between tasks (an in-memory database's), whose next hand-back may be another task's."""
    info[_CLEAN] = True
