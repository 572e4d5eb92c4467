"""For the tests of the migrations: an empty database, a schema at a given revision, how a
schema differs from the models', and memories written as a version before migration 0007 wrote them (no ``observed_at``, no
``profile``): today's store writes columns an old schema lacks. Each write is one transaction
that bumps the user's version, stamps its rows with it and leaves an event per change, as the
store did then."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.memory.store.db import alembic_config
from app.memory.store.tables import Base, MemoryEvent, UserState
from tests import databases

WRITTEN = datetime(2024, 5, 1, 9, 30, tzinfo=UTC)
"""When the old memories were written (unless a test says otherwise)."""

OLD_MEMORIES = sa.table(
    "memories",
    sa.column("key", sa.Integer),
    sa.column("id", sa.String),
    sa.column("user_id", sa.String),
    sa.column("content", sa.Text),
    sa.column("type", sa.String),
    sa.column("metadata", sa.JSON),
    sa.column("source", sa.String),
    sa.column("pinned", sa.Boolean),
    sa.column("created_at", sa.DateTime(timezone=True)),
    sa.column("updated_at", sa.DateTime(timezone=True)),
    sa.column("recall_count", sa.Integer),
    sa.column("seq", sa.BigInteger),
)
"""The memories table up to revision 0006 (the columns a write set)."""


@contextmanager
def database(tmp_path: Path) -> Iterator[str]:
    """An empty database: on PostgreSQL a new one (the tests' own come migrated already)."""
    if databases.on_postgresql():
        with databases.empty() as url:
            yield url
    else:
        yield f"sqlite+aiosqlite:///{tmp_path}/old.db"


async def migrate_to(engine: AsyncEngine, revision: str, *, down: bool = False) -> None:
    """Upgrade the database to `revision` (with `down`, downgrade it)."""

    def run(connection: Connection) -> None:
        config = alembic_config()
        config.attributes["connection"] = connection
        (command.downgrade if down else command.upgrade)(config, revision)

    async with engine.begin() as connection:
        await connection.run_sync(run)


async def differences(engine: AsyncEngine) -> list[object]:
    """How the database's schema differs from the models' (SQLite's batch copies a table: its
    indexes and constraints must come along)."""

    def diff(connection: Connection) -> list[object]:
        return list(compare_metadata(MigrationContext.configure(connection), Base.metadata))

    async with engine.connect() as connection:
        return await connection.run_sync(diff)


async def _bump(connection: AsyncConnection, user_id: str) -> int:
    where = UserState.user_id == user_id
    version = await connection.scalar(sa.select(UserState.version).where(where))
    if version is None:
        await connection.execute(sa.insert(UserState).values(user_id=user_id, version=1))
        return 1
    await connection.execute(sa.update(UserState).where(where).values(version=version + 1))
    return int(version) + 1


def _event(user_id: str, memory_id: str, action: str, text: str, at: datetime) -> sa.Insert:
    before, after = (text, None) if action == "deleted" else (None, text)
    return sa.insert(MemoryEvent).values(
        user_id=user_id, memory_id=memory_id, action=action, actor="api", before=before,
        after=after, created_at=at,
    )  # fmt: skip


async def add_as_before(
    engine: AsyncEngine, user_id: str, texts: Sequence[str], *, at: datetime = WRITTEN
) -> list[str]:
    """The user's new memories with these texts, written at `at`: their ids."""
    ids = [str(uuid.uuid4()) for _ in texts]
    async with engine.begin() as connection:
        version = await _bump(connection, user_id)
        for memory_id, text in zip(ids, texts, strict=True):
            await connection.execute(
                sa.insert(OLD_MEMORIES).values(
                    id=memory_id, user_id=user_id, content=text, type="fact", metadata={},
                    source="api", pinned=False, created_at=at, updated_at=at, recall_count=0,
                    seq=version,
                )
            )  # fmt: skip
            await connection.execute(_event(user_id, memory_id, "created", text, at))
    return ids


async def delete_as_before(engine: AsyncEngine, user_id: str, memory_id: str) -> None:
    """Delete one of the user's memories (its history stays)."""
    async with engine.begin() as connection:
        where = (OLD_MEMORIES.c.user_id == user_id) & (OLD_MEMORIES.c.id == memory_id)
        text = await connection.scalar(sa.select(OLD_MEMORIES.c.content).where(where))
        assert text is not None
        await _bump(connection, user_id)
        await connection.execute(sa.delete(OLD_MEMORIES).where(where))
        await connection.execute(_event(user_id, memory_id, "deleted", text, WRITTEN))
