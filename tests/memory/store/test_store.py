"""The memory store over a real SQLite file: migrations, WAL, user isolation, change sequence,
restart, and two processes' engines on one database file."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app import cli
from app.memory.store.claims import IdTaken
from app.memory.store.db import create_engine, schema_is_current, upgrade
from app.memory.store.memories import MemoryStore
from app.memory.store.records import NewMemory
from app.memory.store.tables import MemorySource, MemoryType
from tests import databases
from tests.memory.store.old_schema import differences


def url_for(path: Path) -> str:
    return f"sqlite+aiosqlite:///{path}"


@pytest.fixture
def store(engine: AsyncEngine) -> MemoryStore:
    return MemoryStore(engine)


async def test_migrations_match_the_models_and_are_idempotent(engine: AsyncEngine) -> None:
    assert await schema_is_current(engine)
    await upgrade(engine)  # a second upgrade is a no-op

    assert await differences(engine) == []


@pytest.mark.skipif(
    not databases.on_postgresql(), reason="PostgreSQL only (MEMPROXY_TEST_DATABASE_URL)"
)
def test_replicas_starting_together_migrate_a_new_database_once() -> None:
    """Replicas all start at once on a new database: each migrates under the advisory lock, the
    later ones find the work done (without it: a unique violation on alembic_version)."""

    async def start_together(url: str) -> tuple[list[bool], int]:
        engines = [create_engine(url) for _ in range(4)]
        try:
            await asyncio.gather(*(upgrade(engine) for engine in engines))
            current = [await schema_is_current(engine) for engine in engines]
            async with engines[0].connect() as connection:
                rows = await connection.scalar(text("SELECT count(*) FROM alembic_version"))
            return current, int(rows or 0)
        finally:
            for engine in engines:
                await engine.dispose()

    with databases.empty() as url:  # (asyncio.run: the database is made outside any loop)
        assert asyncio.run(start_together(url)) == ([True] * 4, 1)


@pytest.mark.sqlite_only  # reads SQLite's own settings
async def test_sqlite_runs_in_wal_mode_with_a_busy_timeout(engine: AsyncEngine) -> None:
    async with engine.connect() as connection:
        assert (await connection.execute(text("PRAGMA journal_mode"))).scalar() == "wal"
        assert (await connection.execute(text("PRAGMA busy_timeout"))).scalar() == 5000


async def test_fresh_database_is_not_current_until_upgraded(tmp_path: Path) -> None:
    engine = create_engine(url_for(tmp_path / "new.db"))
    assert not await schema_is_current(engine)
    await upgrade(engine)
    assert await schema_is_current(engine)
    await engine.dispose()


async def test_add_get_list_update_delete(store: MemoryStore) -> None:
    written = await store.add("ann", [
        NewMemory("Lives in Oslo", MemoryType.FACT, {"from": "chat"}),
        NewMemory("Prefers short answers", MemoryType.PREFERENCE, pinned=True),
    ])  # fmt: skip
    created = written.records
    assert written.created == [True, True] and written.version == 1
    assert [m.content for m in created] == ["Lives in Oslo", "Prefers short answers"]
    first = created[0]
    assert len(first.id) == 36 and first.key > 0 and first.user_id == "ann"
    assert first.metadata == {"from": "chat"} and first.source == MemorySource.API.value
    assert first.created_at.tzinfo is not None
    assert await store.get("ann", first.id) == first

    page, total = await store.page("ann")
    assert total == 2 and [m.content for m in page] == ["Prefers short answers", "Lives in Oslo"]
    prefs, total = await store.page("ann", types=[MemoryType.PREFERENCE])
    assert total == 1 and prefs[0].pinned
    found, _ = await store.page("ann", contains="OSLO")
    assert [m.id for m in found] == [first.id]
    assert (await store.page("ann", contains="%"))[1] == 0  # wildcards are literal
    assert len((await store.page("ann", limit=1, offset=1))[0]) == 1

    result = await store.update("ann", first.id, content="Lives in Bergen", metadata={"v": 2})
    assert result is not None and result.version == 2
    changed = result.records[0]
    assert (
        changed is not None
        and changed.content == "Lives in Bergen"
        and changed.metadata == {"v": 2}
    )
    assert changed.updated_at >= first.updated_at and changed.created_at == first.created_at
    with pytest.raises(ValueError):
        await store.update("ann", first.id, source="import")

    deleted = await store.delete("ann", [first.id, "no-such-id"])
    assert deleted.keys == [first.key] and deleted.version == 3
    assert await store.get("ann", first.id) is None
    assert (await store.delete_all("ann")).count == 1 and await store.count("ann") == 0


async def test_users_never_see_each_other(store: MemoryStore) -> None:
    (ann,) = (await store.add("ann", [NewMemory("ann's secret")])).records
    await store.add("bob", [NewMemory("bob's note")])
    assert await store.get("bob", ann.id) is None
    assert await store.update("bob", ann.id, content="hijacked") is None
    assert (await store.delete("bob", [ann.id])).count == 0
    assert await store.get_many("bob", [ann.key]) == {}
    await store.mark_recalled("bob", [ann.key])
    assert all(r.key != ann.key for r in (await store.snapshot("bob")).rows)
    assert [m.content for m in (await store.page("bob"))[0]] == ["bob's note"]
    assert (await store.page("bob", contains="secret"))[1] == 0
    assert (await store.delete_all("bob")).count == 1
    assert (await store.get("ann", ann.id)) == ann and await store.count("ann") == 1


async def test_import_is_idempotent_on_id(store: MemoryStore) -> None:
    when = datetime(2023, 5, 8, 13, 56, tzinfo=UTC)
    item = NewMemory("Went hiking", MemoryType.EVENT, id="11111111-1111-1111-1111-111111111111",
                     source=MemorySource.IMPORT, created_at=when)  # fmt: skip
    (first,) = (await store.add("ann", [item])).records
    version = await store.version("ann")
    second = await store.add("ann", [item, item])
    assert second.records == [first, first] and second.created == [False, False]
    assert first.created_at == when and first.recall_count == 0
    assert await store.count("ann") == 1 and await store.version("ann") == version
    with pytest.raises(IdTaken):
        await store.add("bob", [item])
    assert await store.count("bob") == 0
    twice = NewMemory("Swam in the fjord", id="22222222-2222-2222-2222-222222222222")
    written = await store.add("ann", [twice, NewMemory("other"), twice])
    assert written.created == [True, True, False] and written.version == version + 1
    assert written.records[0] == written.records[2] and await store.count("ann") == 3


async def test_every_write_bumps_the_users_version(store: MemoryStore) -> None:
    assert await store.version("ann") == 0
    (memory,) = (await store.add("ann", [NewMemory("a")])).records
    assert await store.version("ann") == 1
    await store.update("ann", memory.id, pinned=True)
    assert await store.version("ann") == 2
    await store.delete("ann", [memory.id])
    assert await store.version("ann") == 3
    await store.delete("ann", [memory.id])  # nothing deleted: nothing changed
    assert await store.version("ann") == 3
    assert await store.version("bob") == 0


async def test_two_engines_on_one_file_see_each_others_writes(tmp_path: Path) -> None:
    """Two workers of one deployment: a write through one is visible, version and all, to the other."""
    url = url_for(tmp_path / "shared.db")
    one, two = create_engine(url), create_engine(url)
    await upgrade(one)
    await upgrade(two)
    store_one, store_two = MemoryStore(one), MemoryStore(two)
    (memory,) = (await store_one.add("ann", [NewMemory("from worker one")])).records
    assert await store_two.version("ann") == 1
    assert (await store_two.get("ann", memory.id)) == memory
    await store_two.update("ann", memory.id, content="edited by worker two")
    assert await store_one.version("ann") == 2
    assert (await store_one.get("ann", memory.id)).content == "edited by worker two"  # type: ignore[union-attr]
    await one.dispose()
    await two.dispose()


async def test_the_same_import_at_once_creates_each_memory_once(tmp_path: Path) -> None:
    """Two workers importing one file at once: the second finds the ids taken by the time it
    inserts, and counts them as existing (no unique-constraint error), with no version bump or
    event of its own; an id another user takes meanwhile is still refused."""
    url = url_for(tmp_path / "shared.db")
    one, two = create_engine(url), create_engine(url)
    await upgrade(one)
    stores = [MemoryStore(one), MemoryStore(two)]
    items = [NewMemory(f"memory {n}", id=f"00000000-0000-0000-0000-{n:012d}",
                       source=MemorySource.IMPORT) for n in range(1, 21)]  # fmt: skip
    results = await asyncio.gather(*(stores[n % 2].add("ann", items) for n in range(3)))
    assert sorted(sum(w.created) for w in results) == [0, 0, 20]
    for written in results:
        assert [r.id for r in written.records] == [i.id for i in items]
        assert [r.content for r in written.records] == [i.content for i in items]
        assert written.version == 1 and len({r.key for r in written.records}) == 20
    assert await stores[1].count("ann") == 20 and await stores[1].version("ann") == 1
    history = await stores[0].history("ann", items[4].id or "")
    assert [e.action for e in history] == ["created"]

    fresh = [NewMemory(f"new {n}", id=f"10000000-0000-0000-0000-{n:012d}") for n in range(5)]
    outcomes = await asyncio.gather(
        stores[0].add("ann", fresh), stores[1].add("bob", fresh), return_exceptions=True
    )
    assert sorted(type(o).__name__ for o in outcomes) == ["IdTaken", "Written"]
    loser = "bob" if isinstance(outcomes[1], IdTaken) else "ann"
    assert await stores[0].count(loser) == (20 if loser == "ann" else 0)
    assert await stores[0].version(loser) == (1 if loser == "ann" else 0)
    await one.dispose()
    await two.dispose()


async def test_memories_survive_a_restart(tmp_path: Path) -> None:
    url = url_for(tmp_path / "keep.db")
    engine = create_engine(url)
    await upgrade(engine)
    await MemoryStore(engine).add("ann", [NewMemory("remember me")])
    await engine.dispose()
    engine = create_engine(url)
    await upgrade(engine)
    assert [m.content for m in (await MemoryStore(engine).page("ann"))[0]] == ["remember me"]
    await engine.dispose()


def test_db_upgrade_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    target = tmp_path / "cli" / "memproxy.db"
    monkeypatch.setenv("MEMPROXY_DATABASE_URL", url_for(target))
    assert cli.main(["db", "upgrade"]) == 0
    assert target.exists() and "newest schema" in capsys.readouterr().out


async def test_snapshot_reads_only_what_changed_since_a_version(store: MemoryStore) -> None:
    """What an index cache reads to catch up: only rows written after the version it knows."""
    one = (await store.add("ann", [NewMemory("one"), NewMemory("two")])).records
    await store.add("bob", [NewMemory("bob's")])
    full = await store.snapshot("ann")
    assert (
        full.version == 1 and full.total == 2 and {r.content for r in full.rows} == {"one", "two"}
    )
    await store.update("ann", one[0].id, content="one, edited")
    await store.add("ann", [NewMemory("three")])
    delta = await store.snapshot("ann", since=full.version)
    assert delta.version == 3 and delta.total == 3
    assert sorted(r.content for r in delta.rows) == ["one, edited", "three"]
    await store.delete("ann", [one[1].id])
    after_delete = await store.snapshot("ann", since=delta.version)
    assert after_delete.rows == [] and after_delete.total == 2
    assert await store.keys("ann") == {r.key for r in delta.rows}


async def test_recall_bookkeeping_and_embeddings_bump_nothing(store: MemoryStore) -> None:
    (memory,) = (await store.add("ann", [NewMemory("tea")])).records
    await store.mark_recalled("ann", [memory.key])
    await store.mark_recalled("ann", [memory.key])
    await store.set_embeddings("ann", [(memory.key, b"\x00" * 8, "model-b")])
    after = await store.get("ann", memory.id)
    assert after is not None and after.recall_count == 2 and after.last_recalled_at is not None
    assert after.embedding == b"\x00" * 8 and after.embedding_model == "model-b"
    assert await store.version("ann") == 1
    stats = await store.stats("ann")
    assert stats["total"] == 1 and stats["recall_count"] == 2 and stats["by_type"] == {"fact": 1}
