"""The database each test gets: a SQLite file of its own, or, with ``MEMPROXY_TEST_DATABASE_URL``
set (``postgresql+asyncpg://postgres@127.0.0.1:5432/test``), a PostgreSQL database of its own,
made from a migrated template (``CREATE DATABASE ... TEMPLATE``: ~50 ms) and dropped after it.
The URL names the server and a database to connect to while creating and dropping the others."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from sqlalchemy.engine import make_url

from app.memory.store.db import create_engine, upgrade

SERVER_URL = os.environ.get("MEMPROXY_TEST_DATABASE_URL") or None
"""Read at import, before any test's fixture clears the ``MEMPROXY_`` variables."""


def on_postgresql() -> bool:
    return SERVER_URL is not None


async def _connect(url: str, patience: float = 60) -> Any:
    """A plain asyncpg connection to the database `url` names (no engine, no pool)."""
    import asyncpg  # the `postgres` extra

    parsed = make_url(url)
    return await asyncpg.connect(
        host=parsed.host, port=parsed.port or 5432, user=parsed.username,
        password=parsed.password, database=parsed.database, timeout=patience,
    )  # fmt: skip


async def _admin(*statements: str) -> None:
    assert SERVER_URL is not None
    connection = await _connect(SERVER_URL)
    try:
        for statement in statements:
            await connection.execute(statement)
    finally:
        await connection.close()


def _url(name: str) -> str:
    assert SERVER_URL is not None
    return make_url(SERVER_URL).set(database=name).render_as_string(hide_password=False)


@contextmanager
def _scratch(kind: str, template_name: str | None = None) -> Iterator[str]:
    """A new database (a copy of `template_name`, or empty), dropped after: its URL."""
    name = f"memproxy_{kind}_{uuid.uuid4().hex[:12]}"
    copy = f' TEMPLATE "{template_name}"' if template_name else ""
    asyncio.run(_admin(f'CREATE DATABASE "{name}"{copy}'))
    try:
        yield _url(name)
    finally:
        asyncio.run(_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@contextmanager
def template() -> Iterator[str]:
    """A database at the newest schema to copy from, for the whole run: its name."""
    with _scratch("template") as url:
        asyncio.run(_migrate(url))
        yield str(make_url(url).database)


async def _migrate(url: str) -> None:
    engine = create_engine(url)
    try:
        await upgrade(engine)
    finally:
        await engine.dispose()


def database(template_name: str) -> AbstractContextManager[str]:
    """A database of the test's own, migrated: its URL."""
    return _scratch("test", template_name)


def empty() -> AbstractContextManager[str]:
    """A database with no schema at all: its URL."""
    return _scratch("empty")


def url_in(folder: object, name: str = "memproxy.db") -> str:
    """The database a test's servers and engines share: on PostgreSQL the test's own (set by the
    `database_url` fixture), else a SQLite file `name` in `folder`. Outside a test's fixtures
    (a fixture of a whole module), always the file."""
    own = os.environ.get("MEMPROXY_DATABASE_URL")
    if on_postgresql() and own and not own.startswith("sqlite"):
        return own
    return f"sqlite+aiosqlite:///{folder}/{name}"


def _reachable(url: str) -> bool:
    """Whether PostgreSQL answers at `url` within 3 s (`make test` asks before its second pass)."""
    import asyncpg

    async def connect() -> None:
        await (await _connect(url, patience=3)).close()

    try:
        asyncio.run(connect())
    except (TimeoutError, OSError, asyncpg.PostgresError) as exc:
        print(f"{type(exc).__name__}: {exc}")
        return False
    return True


if __name__ == "__main__":  # python -m tests.databases reachable URL
    import sys

    sys.exit(0 if sys.argv[1:2] == ["reachable"] and _reachable(sys.argv[2]) else 1)
