"""PostgreSQL's connections, as replicas see them in production (PostgreSQL only: skipped on the
SQLite pass). A server restart, or an idle timeout, closes every pooled connection under a
running memproxy: the next request must succeed (pre-ping), not answer 500."""

from __future__ import annotations

import asyncio
import os

import pytest
from sqlalchemy import text

from app.memory.store.db import create_engine
from tests import databases
from tests.conftest import AppClientFactory
from tests.memory_api_support import ANN, add, count

pytestmark = pytest.mark.skipif(
    not databases.on_postgresql(), reason="PostgreSQL only (MEMPROXY_TEST_DATABASE_URL)"
)


async def close_every_connection() -> int:
    """What a restart does to the pool: the server ends every session of the test's database."""
    url = os.environ["MEMPROXY_DATABASE_URL"]
    engine = create_engine(url)
    try:
        async with engine.connect() as connection:
            ended = await connection.scalar(text(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ))  # fmt: skip
            return int(ended or 0)
    finally:
        await engine.dispose()


@pytest.mark.parametrize("pre_ping", [True, False])
async def test_after_the_connections_are_closed_the_next_request_succeeds(
    make_client: AppClientFactory, pre_ping: bool
) -> None:
    client = await make_client(database_pool_pre_ping=pre_ping)
    await add(client, "Lives in Oslo")
    assert await count(client) == 1  # the pool holds connections now
    assert await close_every_connection() >= 1
    await asyncio.sleep(0.1)
    if pre_ping:
        response = await client.get("/v1/memories", headers=ANN)
        assert response.status_code == 200, response.text
        assert response.json()["total"] == 1
    else:  # what MEMPROXY_DATABASE_POOL_PRE_PING=false costs: the first request fails (a 503
        # with Retry-After, the connection's failure being the database's)
        failed = await client.get("/v1/memories", headers=ANN)
        assert failed.status_code == 503 and failed.headers["retry-after"], failed.text
        assert failed.json()["error"]["code"] == "storage_unavailable"
        assert (await client.get("/v1/memories", headers=ANN)).status_code == 200
    added = await client.post("/v1/memories", json={"content": "Has a cat"}, headers=ANN)
    assert added.status_code == 201


async def test_a_pgbouncer_setting_turns_the_statement_cache_off(
    make_client: AppClientFactory,
) -> None:
    client = await make_client(database_pgbouncer=True)
    await add(client, "Lives in Oslo")
    ready = await client.get("/readyz")
    assert ready.status_code == 200 and await count(client) == 1
    engine = client._transport.app.state.services.engine  # type: ignore[attr-defined]
    async with engine.connect() as connection:
        raw = await connection.get_raw_connection()
        assert raw.driver_connection._stmt_cache.get_max_size() == 0
