"""The database engine and its schema migrations.

SQLite (the default) runs in WAL mode, so readers never block the writer, with a busy timeout, so
a writer waits for another process's write instead of failing at once. Nothing else here is
SQLite-specific: PostgreSQL URLs work the same (``postgresql+asyncpg://...``).

Migrations are Alembic's, in ``migrations/``: applied at start (:func:`upgrade`) and by
``memproxy db upgrade``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import event
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

import migrations

MIGRATIONS = Path(migrations.__file__).resolve().parent


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


def create_engine(url: str, *, busy_timeout_seconds: float = 5.0) -> AsyncEngine:
    """An async engine; for SQLite files, the folder is created and WAL set on every connection.
    A folder that cannot be created raises :class:`DatabaseUnavailable`."""
    parsed = make_url(url)
    is_sqlite = parsed.get_backend_name() == "sqlite"
    path = sqlite_file(url)
    if path is not None:
        _make_folder(path)
    engine = create_async_engine(url)
    if is_sqlite:
        timeout_ms = int(busy_timeout_seconds * 1000)

        @event.listens_for(engine.sync_engine, "connect")
        def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute(f"PRAGMA busy_timeout={timeout_ms}")
            cursor.execute("PRAGMA synchronous=NORMAL")  # durable in WAL mode, and much faster
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()

    return engine


def alembic_config(url: str | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    if url is not None:
        config.set_main_option("sqlalchemy.url", url)
    return config


async def upgrade(engine: AsyncEngine) -> None:
    """Bring the schema to the newest migration (no-op when it is there)."""

    def run(connection: Connection) -> None:
        config = alembic_config()
        config.attributes["connection"] = connection
        command.upgrade(config, "head")

    async with engine.begin() as connection:
        await connection.run_sync(run)


async def schema_is_current(engine: AsyncEngine) -> bool:
    """True when the database is at the newest migration."""

    def check(connection: Connection) -> bool:
        heads = set(ScriptDirectory.from_config(alembic_config()).get_heads())
        return set(MigrationContext.configure(connection).get_current_heads()) == heads

    async with engine.connect() as connection:
        return await connection.run_sync(check)
