"""Migration 0008 (issue 25, point 2): memories get `index_text`, the key an episode is found by
(its words and the facts drawn from it), NULL for every memory before and for what a replica of
the version before writes; the downgrade drops it and keeps every memory. On SQLite and
PostgreSQL."""

from __future__ import annotations

import asyncio
from pathlib import Path

import sqlalchemy as sa

from app.memory.store.db import create_engine, schema_is_current, upgrade
from app.memory.store.memories import MemoryStore
from tests.memory.store.old_schema import add_as_before, database, differences, migrate_to


async def scenario(url: str) -> None:
    engine = create_engine(url)
    try:
        await migrate_to(engine, "0007")
        (tea,) = await add_as_before(engine, "ann", ["Likes tea"])
        version = await MemoryStore(engine).version("ann")

        await upgrade(engine)

        async with engine.connect() as connection:
            assert await schema_is_current(engine) and await differences(engine) == []
        (old,) = await add_as_before(engine, "ann", ["Written by an old replica"])
        store = MemoryStore(engine)
        snapshot = await store.snapshot("ann")
        assert sorted((r.content, r.index_text, r.key_text) for r in snapshot.rows) == [
            ("Likes tea", None, "Likes tea"),
            ("Written by an old replica", None, "Written by an old replica"),
        ]
        assert version < await store.version("ann")  # the old replica's write, not the schema

        await migrate_to(engine, "0007", down=True)
        async with engine.connect() as connection:
            columns = await connection.run_sync(
                lambda c: {col["name"] for col in sa.inspect(c).get_columns("memories")}
            )
            left = await connection.execute(sa.text("SELECT id FROM memories"))
            assert sorted(row[0] for row in left) == sorted([tea, old])
        assert "index_text" not in columns and "observed_at" in columns
    finally:
        await engine.dispose()


def test_index_text_comes_and_goes_keeping_every_memory(tmp_path: Path) -> None:
    with database(tmp_path) as url:  # (asyncio.run: PostgreSQL's is made outside any loop)
        asyncio.run(scenario(url))
