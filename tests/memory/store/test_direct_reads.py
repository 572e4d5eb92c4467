"""A search's reads run by the driver itself (:mod:`app.memory.store.direct`): the same records and
links as SQLAlchemy's way gives, every type decoded (on SQLite and on PostgreSQL: the suite runs
on both), only the user's, without one statement through SQLAlchemy's cursor."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from app.memory.store import direct, versions
from app.memory.store.db import create_engine, upgrade
from app.memory.store.memories import MemoryStore
from app.memory.store.records import NewMemory
from app.memory.store.tables import MemorySource, MemoryType
from tests.memory.store.test_link_reads import statements
from tests.memory.store.test_links import linked


@pytest.fixture
def store(engine: AsyncEngine) -> MemoryStore:
    return MemoryStore(engine)


async def _written(store: MemoryStore) -> tuple[list[int], dict[str, list[str]]]:
    """Ann's memories of every shape, bob's, and the keys to read (ann's, bob's, an unknown);
    the links ann's facts and episode have."""
    facts, episode = await linked(store, "ann", facts=3)
    varied = [
        NewMemory(
            "Zoë lives in Zürich — «vraiment»",
            MemoryType.PREFERENCE,
            metadata={"tags": ["a", "ü"], "nested": {"n": 1.5, "none": None, "yes": True}},
            pinned=True,
            profile=True,
            source=MemorySource.MANAGER,
            recall_count=7,
            last_recalled_at=datetime(2025, 1, 2, 3, 4, 5, 678901, tzinfo=UTC),
            observed_at=datetime(2023, 5, 7, 12, 0, tzinfo=UTC),
            created_at=datetime(2024, 2, 29, 23, 59, 59, tzinfo=UTC),
        ),
        NewMemory("plain, at a whole second", created_at=datetime(2024, 1, 1, tzinfo=UTC)),
    ]
    await store.add("ann", varied)
    await store.add("bob", [NewMemory("bob's secret")])
    keys = sorted(await store.keys("ann"))
    bobs = sorted(await store.keys("bob"))
    expected = {episode: sorted(facts), **{f: [episode] for f in facts}}
    return [*keys, *bobs, 10**9], expected


async def _sqlalchemy_way(
    store: MemoryStore, keys: list[int], monkeypatch: pytest.MonkeyPatch
) -> tuple[dict[int, Any], dict[str, list[str]]]:
    async def none(connection: Any) -> None:
        return None

    with monkeypatch.context() as patched:
        patched.setattr(direct, "driver_of", none)  # as for a driver it has no statement for
        return await store.get_many_linked("ann", keys)


async def test_the_drivers_read_gives_what_sqlalchemys_gives(
    store: MemoryStore, engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys, expected_links = await _written(store)
    with statements(engine) as seen:
        records, links = await store.get_many_linked("ann", keys)
    assert seen == []  # both statements run by the driver, none by SQLAlchemy's cursor
    reference, reference_links = await _sqlalchemy_way(store, keys, monkeypatch)
    assert len(records) == 6 and records == reference  # bob's and the unknown key left out
    assert {k: sorted(v) for k, v in links.items()} == expected_links
    assert links == reference_links  # and in the same order, oldest link first
    shown = next(r for r in records.values() if r.pinned)
    assert shown.metadata == {"tags": ["a", "ü"], "nested": {"n": 1.5, "none": None, "yes": True}}
    assert type(shown.pinned) is bool and type(shown.profile) is bool  # not SQLite's 1
    assert (shown.profile, shown.type, shown.source, shown.recall_count) == (
        True, "preference", "manager", 7,
    )  # fmt: skip
    assert shown.last_recalled_at == datetime(2025, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    assert shown.observed_at == datetime(2023, 5, 7, 12, 0, tzinfo=UTC)
    assert shown.created_at == datetime(2024, 2, 29, 23, 59, 59, tzinfo=UTC)
    whole = next(r for r in records.values() if r.content.startswith("plain"))
    assert whole.created_at == datetime(2024, 1, 1, tzinfo=UTC) and not whole.pinned
    assert whole.last_recalled_at is None and whole.metadata == {}
    assert await store.get_many("ann", keys) == records


async def test_many_keys_are_read_a_chunk_at_a_time(
    store: MemoryStore, engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys, expected_links = await _written(store)
    whole, whole_links = await store.get_many_linked("ann", keys)
    # the links as the API read them before (links.linked_ids, by id), in the same order
    assert whole_links == await store.linked("ann", [r.id for r in whole.values()])
    assert {k: sorted(v) for k, v in whole_links.items()} == expected_links
    fetched: list[int] = []
    fetch = direct.fetch

    async def counted(connection: Any, driver: str, handle: Any, sql: str, params: Any) -> Any:
        fetched.append(len(params))
        return await fetch(connection, driver, handle, sql, params)

    monkeypatch.setattr(direct, "fetch", counted)
    monkeypatch.setattr(direct, "LINK_CHUNK", 2)
    records, links = await store.get_many_linked("ann", [*keys, *keys])  # repeated: read once
    assert records == whole and links == whole_links
    if engine.dialect.driver == "aiosqlite":  # 8 keys, 2 a chunk: 4 record reads, 3 link reads
        assert len(fetched) == 7 and max(fetched) <= 5  # (bob's and the unknown key: no links)
    else:
        assert len(fetched) == 7
    assert await store.get_many_linked("ann", []) == ({}, {})
    assert await store.get_many_linked("bob", keys[:6]) == ({}, {})  # ann's keys: nothing


@pytest.mark.parametrize("how", ["raised", "cancelled"])
async def test_a_connection_whose_driver_failed_is_not_used_again(
    store: MemoryStore, engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    keys, _ = await _written(store)
    invalidated: list[object] = []
    event.listen(engine.sync_engine, "invalidate", lambda *args: invalidated.append(args))
    real = direct.driver_of
    reading = asyncio.Event()

    async def failing(connection: Any) -> Any:
        name, _ = await real(connection)

        class Broken:
            async def execute_fetchall(self, *args: Any) -> Any:
                if how == "raised":
                    raise ConnectionResetError("the database went away")
                reading.set()
                await asyncio.Event().wait()  # a statement that never ends

            fetch = execute_fetchall

        return name, Broken()

    with monkeypatch.context() as patched:
        patched.setattr(direct, "driver_of", failing)
        read = asyncio.ensure_future(store.get_many("ann", keys))
        if how == "cancelled":  # as a chat's recall past its timeout is
            await reading.wait()
            read.cancel()
        with pytest.raises(ConnectionResetError if how == "raised" else asyncio.CancelledError):
            await read
    assert len(invalidated) == 1  # the pool opens a new one
    assert len(await store.get_many("ann", keys)) == 6


async def test_an_in_memory_databases_one_connection_is_kept(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``sqlite+aiosqlite:///:memory:`` the pool's one connection is the database: a failed
    read does not throw it away."""
    engine = create_engine("sqlite+aiosqlite:///:memory:")
    await upgrade(engine)
    store = MemoryStore(engine)
    keys, _ = await _written(store)

    async def broken(connection: Any) -> Any:
        class Broken:
            async def execute_fetchall(self, *args: Any) -> Any:
                raise ConnectionResetError("a driver's error")

        return "aiosqlite", Broken()

    with monkeypatch.context() as patched:
        patched.setattr(direct, "driver_of", broken)
        with pytest.raises(ConnectionResetError):
            await store.get_many("ann", keys)
    assert len(await store.get_many("ann", keys)) == 6  # the memories are still there
    await engine.dispose()


async def test_the_versions_read_leaves_a_failed_connection_too(
    store: MemoryStore, engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every recall reads the user's version first, the same way: a read cut off there (a chat's
    recall past its timeout) does not hand its connection out again either."""
    await store.add("ann", [NewMemory("one")])
    version = await store.version("ann")
    invalidated: list[object] = []
    event.listen(engine.sync_engine, "invalidate", lambda *args: invalidated.append(args))

    class Broken:
        async def execute_fetchall(self, *args: Any) -> Any:
            raise ConnectionResetError("the database went away")

        fetch = execute_fetchall

    async def through_broken(connection: Any, driver: str, handle: Any, *rest: Any) -> Any:
        return await direct.fetch(connection, driver, Broken(), *rest)

    with monkeypatch.context() as patched:
        patched.setattr(versions, "fetch", through_broken)
        with pytest.raises(ConnectionResetError):
            await store.version("ann")
    assert len(invalidated) == 1 and await store.version("ann") == version > 0
