"""Migration 0006 (issue 23, point 10): users stored before ids were normalised keep their
memories. An id stored in another form than NFC (``José`` typed with a combining accent) is
rewritten to its NFC form, in every table that holds a user id; where that form is a user too,
the two are one user (rows unique per user kept once), whose version passes every memory's
sequence. Nothing else is changed, whatever the rule of the running version says: ids it
refuses are counted in the log (a move takes them as stored). On SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import delete, func, insert, select, text
from sqlalchemy.ext.asyncio import AsyncEngine

import app.proxy.user_ids
from app.memory.store.db import create_engine, upgrade
from app.memory.store.memories import MemoryStore
from app.memory.store.tables import (
    ManagerJob,
    ManagerState,
    Memory,
    MemoryEvent,
    ProcessedTurn,
    UserState,
)
from tests.memory.store.old_schema import add_as_before, database, delete_as_before, migrate_to

NFC, NFD = "Jos\u00e9", "Jose\u0301"
ONLY_NFD, ONLY_NFC = "Rene\u0301e", "Ren\u00e9e"  # no NFC twin stored
REFUSED = "Jose\u0301\u200b"  # NFD with a zero-width space: refused now, yet put in NFC
REFUSED_NFC = "Jos\u00e9\u200b"
LOOK_ALIKE = "\u0430lice"  # a Cyrillic "а": refused now, and left as stored (it is in NFC)
EARLY, LATE = datetime(2024, 5, 1, tzinfo=UTC), datetime(2024, 6, 1, tzinfo=UTC)
TABLES = (Memory, UserState, MemoryEvent, ManagerJob, ProcessedTurn, ManagerState)


def job(user: str, status: str, key: int) -> dict[str, Any]:
    return {
        "key": key, "id": f"job-{key}", "user_id": user, "explicit": True, "status": status,
        "attempts": 0, "next_attempt_at": EARLY, "payload": {"new": []}, "created_at": EARLY,
        "owner": "old-process" if status == "running" else None,
        "lease_until": LATE if status == "running" else None,
    }  # fmt: skip


async def store_as_before(engine: AsyncEngine) -> dict[str, list[str]]:
    """What version 0005 could hold: the ids of each user's memories, by user."""
    ids: dict[str, list[str]] = {}
    for user, texts in (
        (NFD, ["Likes tea", "Plays chess", "Forgotten"]),
        (NFC, ["Lives in Lisbon"]),
        (ONLY_NFD, ["Likes jazz"]),
        (REFUSED, ["Hidden"]),
        (LOOK_ALIKE, ["Looks like alice"]),
        ("ann", ["Likes rain"]),
    ):
        ids[user] = await add_as_before(engine, user, texts)
    ids["forgotten"] = [ids[NFD].pop()]
    await delete_as_before(engine, NFD, ids["forgotten"][0])  # its history stays, and moves
    await add_as_before(engine, NFC, ["Reads a lot"])  # NFC's version is now ahead of NFD's
    async with engine.begin() as connection:
        await connection.execute(insert(ProcessedTurn), [
            {"user_id": NFD, "fingerprint": "f1", "created_at": EARLY},
            {"user_id": NFD, "fingerprint": "f2", "created_at": EARLY},
            {"user_id": NFC, "fingerprint": "f2", "created_at": LATE},
            {"user_id": NFC, "fingerprint": "f3", "created_at": LATE},
            {"user_id": ONLY_NFD, "fingerprint": "f4", "created_at": LATE},
        ])  # fmt: skip
        await connection.execute(insert(ManagerState), [
            {"user_id": NFD, "last_job_at": LATE},
            {"user_id": NFC, "last_job_at": EARLY},
            {"user_id": ONLY_NFD, "last_job_at": EARLY},
        ])  # fmt: skip
        await connection.execute(insert(ManagerJob), [
            job(NFC, "running", 11), job(NFD, "running", 12), job(NFD, "queued", 13),
            job(ONLY_NFD, "running", 14), job(REFUSED, "queued", 15),
        ])  # fmt: skip
    return ids


async def scenario(url: str) -> None:
    engine = create_engine(url)
    try:
        await migrate_to(engine, "0005")
        ids = await store_as_before(engine)
        store = MemoryStore(engine)
        versions = {user: await store.version(user) for user in (NFD, NFC, ONLY_NFD)}
        # a cache of the NFC user, before the upgrade, is at this version (its snapshot's columns,
        # those of today's index, are not all in that schema)
        cached_version = await store.version(NFC)

        await upgrade(engine)

        users = {u.user_id for u in (await store.user_summaries())[0]}
        assert users == {NFC, ONLY_NFC, REFUSED_NFC, LOOK_ALIKE, "ann"}
        async with engine.connect() as connection:
            for table in TABLES:
                held = set(await connection.scalars(select(table.user_id).distinct()))
                assert held <= users and not held & {NFD, ONLY_NFD, REFUSED}, table.__tablename__
        # The two Josés are one user: every memory, with its history (a deleted one's too).
        josé = {m.id: m.content for m in (await store.page(NFC))[0]}
        assert set(josé.values()) == {"Likes tea", "Plays chess", "Lives in Lisbon", "Reads a lot"}
        assert set(ids[NFD]) < set(josé)
        forgotten = await store.history(NFC, ids["forgotten"][0])
        assert [e.action for e in forgotten] == ["created", "deleted"]
        # A cache of the NFC user from before catches up on the memories it did not have.
        version = await store.version(NFC)
        assert version > max(versions[NFD], versions[NFC])
        caught_up = await store.snapshot(NFC, since=cached_version)
        assert {r.content for r in caught_up.rows} == {"Likes tea", "Plays chess"}
        assert await store.version(ONLY_NFC) > versions[ONLY_NFD]
        assert [m.content for m in (await store.page(ONLY_NFC))[0]] == ["Likes jazz"]
        assert [m.content for m in (await store.page(REFUSED_NFC))[0]] == ["Hidden"]
        assert [m.content for m in (await store.page(LOOK_ALIKE))[0]] == ["Looks like alice"]
        async with engine.connect() as connection:
            turns = await connection.execute(
                select(ProcessedTurn.user_id, ProcessedTurn.fingerprint)
            )
            assert sorted(turns) == [(NFC, "f1"), (NFC, "f2"), (NFC, "f3"), (ONLY_NFC, "f4")]
            state = select(ManagerState.user_id, ManagerState.last_job_at)
            states = {user: at for user, at in await connection.execute(state)}
            assert set(states) == {NFC, ONLY_NFC}
            assert str(states[NFC])[:10] == "2024-06-01"  # the later of the two
            jobs = {
                key: (user, status, owner)
                for key, user, status, owner in await connection.execute(
                    select(ManagerJob.key, ManagerJob.user_id, ManagerJob.status, ManagerJob.owner)
                )
            }
            assert jobs == {  # one running job per user still: the older runs, the other waits
                11: (NFC, "running", "old-process"),
                12: (NFC, "queued", None),
                13: (NFC, "queued", None),
                14: (ONLY_NFC, "running", "old-process"),
                15: (REFUSED_NFC, "queued", None),
            }
            rows = await connection.scalar(text("SELECT count(*) FROM user_state"))
            assert rows == 5  # NFC, ONLY_NFC, REFUSED_NFC, LOOK_ALIKE, ann: no NFD row left

        await upgrade(engine)  # once at the head, nothing more happens
        assert await store.version(NFC) == version
    finally:
        await engine.dispose()


def test_users_stored_in_another_form_than_nfc_become_the_nfc_user(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="alembic.runtime.migration")
    with database(tmp_path) as url:  # (asyncio.run: PostgreSQL's is made outside any loop)
        asyncio.run(scenario(url))
    (said,) = [r.getMessage() for r in caplog.records if "refuse" in r.getMessage()]
    assert said.startswith("2 stored user ids are refused") and "memories move --from" in said
    assert "Jos" not in said and "lice" not in said  # a count, no ids


async def version_passes_every_memory(url: str) -> None:
    """A user with memories and no ``user_state`` row (version 0) still gets a version past
    every one of its memories' ``seq`` when merged: a cache never misses a memory."""
    engine = create_engine(url)
    try:
        await migrate_to(engine, "0005")
        store = MemoryStore(engine)
        await add_as_before(engine, NFD, ["Likes tea"])
        for text_ in ("Lives in Lisbon", "Reads a lot", "Plays the cello"):
            await add_as_before(engine, NFC, [text_])
        async with engine.begin() as connection:
            await connection.execute(delete(UserState))

        await upgrade(engine)

        async with engine.connect() as connection:
            seq = await connection.scalar(select(func.max(Memory.seq)))
        assert await store.version(NFC) == seq == 4  # past NFC's 3 writes; the moved carry it
        assert len((await store.snapshot(NFC)).rows) == 4
    finally:
        await engine.dispose()


def test_a_merged_user_s_version_passes_its_memories(tmp_path: Path) -> None:
    with database(tmp_path) as url:
        asyncio.run(version_passes_every_memory(url))


async def only_nfc(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        await migrate_to(engine, "0005")
        store = MemoryStore(engine)
        for user in (NFD, " ann ", "bob", LOOK_ALIKE):
            await add_as_before(engine, user, [f"A memory of {user}"])
        await upgrade(engine)
        return {u.user_id for u in (await store.user_summaries())[0]}
    finally:
        await engine.dispose()


def test_the_migration_applies_nfc_whatever_the_running_rule_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """0006 does what it did when it was written: a later rule (here one that upper-cases and
    refuses nothing) changes no stored id."""
    monkeypatch.setattr(app.proxy.user_ids, "normal_user_id", lambda raw: raw.strip().upper())
    with database(tmp_path) as url:
        assert asyncio.run(only_nfc(url)) == {NFC, "ann", "bob", LOOK_ALIKE}
