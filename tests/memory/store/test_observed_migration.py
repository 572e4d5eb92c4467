"""Migration 0007 (issue 25, points 5 and 6): every memory gets `observed_at` (when what it says
was said: a memory stored before is taken as said when it was written) and `profile` (false),
and the provenance table `memory_links` is created. A replica of the version before still
writing meanwhile writes valid rows (server defaults). The downgrade drops all three, deletes
the episodes the version before does not know, and bumps their users' versions. On SQLite and
PostgreSQL."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from app.memory.store.db import create_engine, schema_is_current, upgrade
from app.memory.store.memories import MemoryStore
from app.memory.store.records import NewMemory, now
from app.memory.store.tables import MemoryLink, MemoryType
from tests.memory.store.old_schema import (
    WRITTEN,
    add_as_before,
    database,
    differences,
    migrate_to,
)

LATER = datetime(2025, 2, 3, 4, 5, 6, tzinfo=UTC)


async def _columns(engine: AsyncEngine, table: str) -> set[str]:
    def read(connection: sa.Connection) -> set[str]:
        inspector = sa.inspect(connection)
        if table not in inspector.get_table_names():
            return set()
        found = {c["name"] for c in inspector.get_columns(table)}
        return found | {i["name"] for i in inspector.get_indexes(table) if i["name"]}

    async with engine.connect() as connection:
        return await connection.run_sync(read)


async def upgrade_scenario(url: str) -> None:
    engine = create_engine(url)
    try:
        await migrate_to(engine, "0006")
        (tea,) = await add_as_before(engine, "ann", ["Likes tea"])
        (chess,) = await add_as_before(engine, "ann", ["Plays chess"], at=LATER)
        (rain,) = await add_as_before(engine, "bob", ["Likes rain"])
        store = MemoryStore(engine)
        version = await store.version("ann")

        await upgrade(engine)

        assert await schema_is_current(engine) and await differences(engine) == []
        for memory_id, user, written in ((tea, "ann", WRITTEN), (chess, "ann", LATER),
                                         (rain, "bob", WRITTEN)):  # fmt: skip
            record = await store.get(user, memory_id)
            assert record is not None
            assert record.observed_at == record.created_at == written
            assert record.profile is False
        assert await store.version("ann") == version  # a schema change, not a write
        assert {"observed_at", "profile", "ix_memories_user_observed"} <= await _columns(
            engine, "memories"
        )
        assert await _columns(engine, "memory_links") == {
            "user_id", "fact_id", "episode_id", "created_at", "ix_memory_links_user_episode",
        }  # fmt: skip

        # A replica of the version before, still running, writes without the new columns.
        before = now() - timedelta(seconds=5)
        (old,) = await add_as_before(engine, "ann", ["Written by an old replica"], at=now())
        record = await store.get("ann", old)
        assert record is not None and record.profile is False
        assert before <= record.observed_at <= now() + timedelta(seconds=5)
    finally:
        await engine.dispose()


def test_upgrade_dates_every_memory_when_it_was_written(tmp_path: Path) -> None:
    with database(tmp_path) as url:  # (asyncio.run: PostgreSQL's is made outside any loop)
        asyncio.run(upgrade_scenario(url))


async def downgrade_scenario(url: str) -> None:
    engine = create_engine(url)
    try:
        await upgrade(engine)
        store = MemoryStore(engine)
        kept = await store.add("ann", [NewMemory("Is vegetarian", profile=True)])
        (fact,) = kept.records
        episode = await store.add("ann", [NewMemory("I'm vegetarian", MemoryType.EPISODE)])
        (said,) = episode.records
        async with engine.begin() as connection:
            await connection.execute(sa.insert(MemoryLink).values(
                user_id="ann", fact_id=fact.id, episode_id=said.id, created_at=now()
            ))  # fmt: skip
        await store.add("bob", [NewMemory("Likes rain")])
        versions = {user: await store.version(user) for user in ("ann", "bob")}

        await migrate_to(engine, "0006", down=True)

        assert not {"observed_at", "profile"} & await _columns(engine, "memories")
        assert await _columns(engine, "memory_links") == set()
        async with engine.connect() as connection:
            left = await connection.execute(sa.text("SELECT user_id, content FROM memories"))
            assert sorted(left) == [("ann", "Is vegetarian"), ("bob", "Likes rain")]
        assert await store.version("ann") == versions["ann"] + 1  # its cache drops the episode
        assert await store.version("bob") == versions["bob"]

        await upgrade(engine)  # and up again: what is left is dated when it was written
        assert await differences(engine) == []
        record = await store.get("ann", fact.id)
        assert record is not None and record.observed_at == record.created_at
        assert record.profile is False  # the mark went with the downgrade
    finally:
        await engine.dispose()


def test_downgrade_drops_the_columns_links_and_episodes(tmp_path: Path) -> None:
    with database(tmp_path) as url:
        asyncio.run(downgrade_scenario(url))
