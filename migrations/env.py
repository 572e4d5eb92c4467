"""Alembic environment. memproxy passes its own connection (`config.attributes["connection"]`);
the `alembic` command line builds an engine from `sqlalchemy.url` or MEMPROXY_DATABASE_URL."""

from __future__ import annotations

import asyncio
import os

from alembic import context
from sqlalchemy.engine import Connection

from app.memory.store.db import create_engine
from app.memory.store.tables import Base

target_metadata = Base.metadata
# batch mode: SQLite can only alter tables by copying them; Alembic does that when asked to.
_OPTIONS = {"target_metadata": target_metadata, "render_as_batch": True}


def run_with(connection: Connection) -> None:
    context.configure(connection=connection, **_OPTIONS)
    with context.begin_transaction():
        context.run_migrations()


async def run_from_url(url: str) -> None:
    engine = create_engine(url)
    async with engine.connect() as connection:
        await connection.run_sync(run_with)
        await connection.commit()
    await engine.dispose()


def main() -> None:
    config = context.config
    connection = config.attributes.get("connection")
    if connection is not None:
        run_with(connection)
        return
    url = config.get_main_option("sqlalchemy.url") or os.environ.get(
        "MEMPROXY_DATABASE_URL", "sqlite+aiosqlite:///./data/memproxy.db"
    )
    if context.is_offline_mode():
        context.configure(url=url, literal_binds=True, **_OPTIONS)
        with context.begin_transaction():
            context.run_migrations()
        return
    asyncio.run(run_from_url(url))


main()
