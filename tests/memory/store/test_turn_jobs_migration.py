"""Migration 0012: a processed turn names the chat job that took it (`job_id`), NULL for every
turn before; the downgrade drops the column and keeps every turn. On SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

import sqlalchemy as sa

from app.memory.store.db import create_engine, schema_is_current, upgrade
from app.memory.store.tables import ProcessedTurn
from tests.memory.store.old_schema import database, differences, migrate_to

OLD_TURNS = sa.table(
    "processed_turns",
    sa.column("user_id", sa.String),
    sa.column("fingerprint", sa.String),
    sa.column("created_at", sa.DateTime(timezone=True)),
)
"""The table up to revision 0011."""
SAID = datetime(2026, 11, 1, 9, 30, tzinfo=UTC)


async def scenario(url: str) -> None:
    engine = create_engine(url)
    try:
        await migrate_to(engine, "0011")
        async with engine.begin() as connection:
            await connection.execute(
                sa.insert(OLD_TURNS),
                [{"user_id": "ann", "fingerprint": "a" * 64, "created_at": SAID}],
            )

        await upgrade(engine)

        async with engine.begin() as connection:
            assert await schema_is_current(engine) and await differences(engine) == []
            await connection.execute(
                sa.insert(ProcessedTurn).values(
                    user_id="ann", fingerprint="b" * 64, created_at=SAID, job_id="j1"
                )
            )
            rows = await connection.execute(
                sa.select(ProcessedTurn.fingerprint, ProcessedTurn.job_id)
            )
            assert sorted(rows.tuples()) == [("a" * 64, None), ("b" * 64, "j1")]

        await migrate_to(engine, "0011", down=True)
        async with engine.connect() as connection:
            columns = await connection.run_sync(
                lambda c: {col["name"] for col in sa.inspect(c).get_columns("processed_turns")}
            )
            left = await connection.execute(sa.text("SELECT fingerprint FROM processed_turns"))
            assert sorted(row[0] for row in left) == ["a" * 64, "b" * 64]
        assert columns == {"user_id", "fingerprint", "created_at"}
    finally:
        await engine.dispose()


def test_a_turns_job_comes_and_goes_keeping_every_turn(tmp_path: Path) -> None:
    with database(tmp_path) as url:  # (asyncio.run: PostgreSQL's is made outside any loop)
        asyncio.run(scenario(url))
