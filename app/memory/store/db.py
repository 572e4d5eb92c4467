"""The database engine and its schema migrations.

SQLite (the default) runs in WAL mode, so readers never block the writer, with a busy timeout, so
a writer waits for another process's write instead of failing at once. Write transactions go
through :func:`writing`, which on SQLite queues them within the process, takes the lock at their
start and retries a lock wait that ran out. Nothing else here is SQLite-specific: PostgreSQL URLs
work the same (``postgresql+asyncpg://...``).

Migrations are Alembic's, in ``migrations/``: applied at start (:func:`upgrade`) and by
``memproxy db upgrade``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import tempfile
import weakref
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import text
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

import migrations
from app.memory.store import sqlite_connections
from app.storage_faults import queued, reporting, waiting_turn

if TYPE_CHECKING:
    from app.config import Settings

MIGRATIONS = Path(migrations.__file__).resolve().parent
WRITE_PATIENCE_SECONDS = 60.0
"""How long a write transaction keeps trying to take SQLite's write lock before it fails."""
RETRY_SECONDS = 0.01
"""The first pause between two waits for the lock (each as long as the busy timeout); doubled
each time up to 0.25 s, with jitter: short, as a writer only gets the lock while it asks."""

logger = logging.getLogger("memproxy.db")
_write_locks: weakref.WeakKeyDictionary[Engine, tuple[asyncio.AbstractEventLoop, asyncio.Lock]] = (
    weakref.WeakKeyDictionary()
)


class DatabaseUnavailable(Exception):
    """A SQLite database file that cannot be opened or written, or (`missing`) is not there."""

    def __init__(self, path: Path, reason: str, *, missing: bool = False) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason
        self.missing = missing


def sqlite_file(url: str) -> Path | None:
    """The file a SQLite URL names, absolute; None for other databases and in-memory ones."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database).expanduser().absolute()


def check_database(url: str, *, create: bool) -> Path | None:
    """Before opening `url`, for a SQLite file: its folder can be created and written (WAL keeps
    two files beside the database) and the file opened for writing; when `create` is false, the
    file must already be there. Raises :class:`DatabaseUnavailable` naming the path and the
    cause. Returns the file (None for other databases: `/readyz` checks those at run time)."""
    path = sqlite_file(url)
    if path is None:
        return None
    if not path.exists() and not create:
        raise DatabaseUnavailable(path, "no such file", missing=True)
    _make_folder(path)
    try:
        with tempfile.TemporaryFile(dir=path.parent):
            pass
    except OSError as exc:
        raise DatabaseUnavailable(path, f"cannot write in {path.parent}: {exc.strerror}") from exc
    try:
        with path.open("ab"):  # creates an empty file, which SQLite takes as an empty database
            pass
    except OSError as exc:
        raise DatabaseUnavailable(path, exc.strerror or str(exc)) from exc
    return path


def _make_folder(path: Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        blocking = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
        reason = (
            f"{blocking} is a file, not a folder"
            if blocking is not None
            else f"cannot create the folder {path.parent}: {exc.strerror}"
        )
        raise DatabaseUnavailable(path, reason) from exc


@dataclass(frozen=True, slots=True)
class Pool:
    """How a PostgreSQL engine pools its connections (the ``MEMPROXY_DATABASE_*`` settings)."""

    size: int = 5
    max_overflow: int = 5
    pre_ping: bool = True
    pgbouncer: bool = False


def create_engine(
    url: str, *, busy_timeout_seconds: float = 5.0, pool: Pool | None = None
) -> AsyncEngine:
    """An async engine; for SQLite files, the folder is created and WAL set on every connection.
    A folder that cannot be created raises :class:`DatabaseUnavailable`. Other databases get
    `pool`'s sizes and pre-ping, and behind PgBouncer no statement cache."""
    parsed = make_url(url)
    is_sqlite = parsed.get_backend_name() == "sqlite"
    path = sqlite_file(url)
    if path is not None:
        _make_folder(path)
    if is_sqlite:
        options: dict[str, Any] = dict(sqlite_connections.OPTIONS)
    else:
        pool = pool or Pool()
        options = {"pool_size": pool.size, "max_overflow": pool.max_overflow,
                   "pool_pre_ping": pool.pre_ping}  # fmt: skip
        if pool.pgbouncer and parsed.get_driver_name() == "asyncpg":
            options["connect_args"] = {"statement_cache_size": 0,
                                       "prepared_statement_cache_size": 0}  # fmt: skip
    engine = create_async_engine(url, **options)
    if is_sqlite:  # WAL and the busy timeout; no rollback where there is nothing to undo
        sqlite_connections.install(engine, busy_timeout_seconds=busy_timeout_seconds)
    return engine


def engine_for(settings: Settings) -> AsyncEngine:
    """The engine the settings describe."""
    pool = Pool(
        settings.database_pool_size,
        settings.database_max_overflow,
        settings.database_pool_pre_ping,
        settings.database_pgbouncer,
    )
    return create_engine(
        settings.database_url,
        busy_timeout_seconds=settings.sqlite_busy_timeout_seconds,
        pool=pool,
    )


@asynccontextmanager
async def writing(sessions: async_sessionmaker[AsyncSession]) -> AsyncIterator[AsyncSession]:
    """A write transaction, as ``sessions.begin()``: committed when the block ends, rolled back
    when it raises. On SQLite it also

    - waits its turn behind the process's other write transactions, first come first served
      (SQLite's busy handler polls, unfairly: under load a writer lost the race for longer than
      the busy timeout, and "database is locked" was a write the client never heard of);
    - takes the write lock before its first statement (``BEGIN IMMEDIATE``), so what it reads
      is what it writes on, and nothing after the start can be refused;
    - when another process holds the lock beyond the busy timeout, tries again after a short
      pause, for up to ``WRITE_PATIENCE_SECONDS``, instead of failing.

    How it went is reported (``/readyz``), and its waits for its turn are told apart from
    failures (a chat's job write counts only these against its bound): :mod:`app.storage_faults`.
    """
    bind = sessions.kw.get("bind")
    with reporting(bind):
        if not isinstance(bind, AsyncEngine) or bind.dialect.name != "sqlite":
            async with sessions.begin() as session:
                yield session
        else:
            async with queued(_write_lock(bind)), sessions() as session:
                with waiting_turn():  # for another process's writer: the database answers, busy
                    await _begin_immediate(session)
                try:
                    yield session
                except BaseException:
                    await session.rollback()
                    raise
                await session.commit()


def insert_for(session: AsyncSession) -> Callable[..., Any]:
    """The dialect's INSERT, which has ``ON CONFLICT`` (SQLite's and PostgreSQL's alike)."""
    dialect = session.bind.dialect.name if session.bind is not None else "sqlite"
    return postgresql_insert if dialect == "postgresql" else sqlite_insert


def is_locked(exc: BaseException) -> bool:
    """SQLite's "database is locked": the write lock stayed taken beyond the busy timeout."""
    original = getattr(exc, "orig", None)
    code = getattr(original, "sqlite_errorcode", None)
    return isinstance(exc, OperationalError) and (
        (code is not None and code & 0xFF == 5) or "database is locked" in str(original)
    )


def is_deadlock(exc: BaseException) -> bool:
    """PostgreSQL's "deadlock detected" (SQLSTATE 40P01): the transaction was rolled back and
    may be tried again."""
    original = getattr(exc, "orig", None)
    state = getattr(original, "sqlstate", None) or getattr(original, "pgcode", None)
    return isinstance(exc, DBAPIError) and (state == "40P01" or "deadlock detected" in str(exc))


async def _begin_immediate(session: AsyncSession) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WRITE_PATIENCE_SECONDS
    for attempt in itertools.count(1):
        try:
            # pysqlite begins a transaction only before its first INSERT/UPDATE/DELETE; an
            # explicit BEGIN takes its place (and no read before it stays outside).
            await session.execute(text("BEGIN IMMEDIATE"))
            return
        except OperationalError as exc:
            await session.rollback()
            if not is_locked(exc) or loop.time() > deadline:
                raise
            pause = min(0.25, RETRY_SECONDS * 2 ** min(attempt - 1, 8)) * random.uniform(0.5, 1)
            logger.debug("database locked (attempt %d); trying again in %.3f s", attempt, pause)
            await asyncio.sleep(pause)


def _write_lock(engine: AsyncEngine) -> asyncio.Lock:
    """The engine's writers' queue in this process (one per event loop: tests run several)."""
    loop = asyncio.get_running_loop()
    held = _write_locks.get(engine.sync_engine)
    if held is None or held[0] is not loop:
        held = _write_locks[engine.sync_engine] = (loop, asyncio.Lock())
    return held[1]


def alembic_config(url: str | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    if url is not None:
        config.set_main_option("sqlalchemy.url", url)
    return config


MIGRATION_LOCK = 0x6D656D70726F7879 & 0x7FFFFFFFFFFFFFFF
"""PostgreSQL's advisory lock key that :func:`upgrade` holds ("memproxy" in ASCII)."""


async def upgrade(engine: AsyncEngine) -> None:
    """Bring the schema to the newest migration (no-op when it is there). On PostgreSQL under an
    advisory lock held to the end of its transaction: replicas starting together on a new
    database migrate one after the other, the later ones finding it done (without it, one died
    on a unique violation of ``alembic_version``). SQLite's write lock does the same there."""

    def run(connection: Connection) -> None:
        config = alembic_config()
        config.attributes["connection"] = connection
        command.upgrade(config, "head")

    async with engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            await connection.execute(
                text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK}
            )
        await connection.run_sync(run)


async def schema_is_current(engine: AsyncEngine) -> bool:
    """True when the database is at the newest migration."""

    def check(connection: Connection) -> bool:
        heads = set(ScriptDirectory.from_config(alembic_config()).get_heads())
        return set(MigrationContext.configure(connection).get_current_heads()) == heads

    async with engine.connect() as connection:
        return await connection.run_sync(check)
