"""The memory store: the source of truth, every operation scoped to one user.

Promises:

- every method takes the user id, and never reads, changes or counts another user's memories;
- every write bumps that user's change sequence (:meth:`MemoryStore.version`) in the same
  transaction and stamps the rows it wrote with the new value (``seq``); a write returns the
  version it committed. A cache built at version N is stale exactly when the version is no
  longer N, whichever process wrote, and catches up with :meth:`MemoryStore.snapshot`;
- recall bookkeeping (:meth:`MemoryStore.mark_recalled`) and re-embedding
  (:meth:`MemoryStore.set_embeddings`) change no content and bump nothing;
- results are plain frozen :class:`~app.memory.store.records.MemoryRecord` values, safe to keep
  after the session closes.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app.memory.store import events
from app.memory.store.db import insert_for, writing
from app.memory.store.marks import RecallMarks
from app.memory.store.queries import MemoryQueries, own
from app.memory.store.records import (
    RECORD_COLUMNS,
    MemoryRecord,
    NewMemory,
    Removed,
    Written,
    now,
    record_of,
    record_of_row,
)
from app.memory.store.tables import (
    EventAction,
    ManagerJob,
    Memory,
    MemoryEvent,
    MemorySource,
    MemoryType,
    ProcessedTurn,
    UserState,
)

_CHANGEABLE = frozenset({"content", "type", "metadata", "pinned", "embedding", "embedding_model"})
_INSERTED = (
    *("id", "user_id", "content", "type", "meta", "source", "pinned", "created_at"),
    *("updated_at", "recall_count", "last_recalled_at", "embedding", "embedding_model"),
)
"""What :meth:`MemoryStore.add` inserts of a new row (its ``seq`` is the version it bumps)."""


class IdTaken(Exception):
    """An imported memory's id already belongs to another user."""


class MemoryStore(MemoryQueries):
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self.sessions = async_sessionmaker(engine, expire_on_commit=False)
        """Also for writers that must share one transaction (the Manager's operations): they
        write through :func:`app.memory.store.db.writing`, bump the version with
        :func:`bump_version` and record events, as this class's do."""
        self._marks = RecallMarks(self.sessions)

    # --- writes (each bumps the user's version) ---------------------------------------------

    async def add(
        self, user_id: str, items: Sequence[NewMemory], *, job_id: str | None = None
    ) -> Written:
        """Create memories; an item whose id already exists (for this user) is left as it is and
        returned unchanged (``Written.created`` says which were new), also when a concurrent
        write (another request, another process) created it after this one looked: the insert
        skips ids that exist by then (``ON CONFLICT DO NOTHING``). An id that belongs to another
        user raises :class:`IdTaken`. Only created memories bump the version and get events."""
        stamp = now()
        async with writing(self.sessions) as session:
            existing = await _found(session, user_id, [item.id for item in items if item.id])
            fresh: dict[str, Memory] = {}
            ids: list[str] = []  # each item's memory
            for item in items:
                if item.id and (item.id in existing or item.id in fresh):
                    ids.append(item.id)  # the same id twice in one batch is one memory
                    continue
                row = Memory(
                    id=item.id or str(uuid.uuid4()),
                    user_id=user_id,
                    content=item.content,
                    type=item.type.value,
                    meta=dict(item.metadata),
                    source=item.source.value,
                    pinned=item.pinned,
                    created_at=item.created_at or stamp,
                    updated_at=stamp,
                    recall_count=0,
                    embedding=item.embedding,
                    embedding_model=item.embedding_model,
                )
                fresh[row.id] = row
                ids.append(row.id)
            version = await self._version_in(session, user_id)
            inserted: set[str] = set()
            if fresh:
                version = await bump_version(session, user_id)  # the lock orders the inserts
                inserted = await _insert(session, list(fresh.values()), version)
                raced = [memory_id for memory_id in fresh if memory_id not in inserted]
                if raced:  # committed by another write since the read above: they exist now
                    existing.update(await _found(session, user_id, raced, expected=True))
                if not inserted:  # nothing written after all: the version must not move
                    version = await _unbump(session, user_id)
                for memory_id in inserted:
                    row = fresh[memory_id]
                    events.record(
                        session, user_id, row.id, EventAction.CREATED, MemorySource(row.source),
                        after=row.content, job_id=job_id,
                    )  # fmt: skip
            rows = existing | {memory_id: fresh[memory_id] for memory_id in inserted}
            created = []
            for memory_id in ids:  # an id twice in the batch: created by its first item only
                created.append(memory_id in inserted)
                inserted.discard(memory_id)
            return Written([record_of(rows[i]) for i in ids], version, created)

    async def update(
        self,
        user_id: str,
        memory_id: str,
        *,
        actor: MemorySource = MemorySource.API,
        **changes: Any,
    ) -> Written | None:
        """Change `content`, `type`, `metadata`, `pinned`, `embedding`/`embedding_model`."""
        unknown = set(changes) - _CHANGEABLE
        if unknown:
            raise ValueError(f"cannot change {sorted(unknown)}")
        async with writing(self.sessions) as session:
            row = await session.scalar(own(user_id).where(Memory.id == memory_id))
            if row is None:
                return None
            before = row.content
            for name, value in changes.items():
                if name == "metadata":
                    row.meta = dict(value)
                elif name == "type":
                    row.type = MemoryType(value).value
                else:
                    setattr(row, name, value)
            row.updated_at = now()
            row.seq = await bump_version(session, user_id)
            events.record(session, user_id, row.id, EventAction.UPDATED, actor,
                          before=before, after=row.content)  # fmt: skip
            await session.flush()
            return Written([record_of(row)], row.seq, [False])

    async def delete(
        self, user_id: str, memory_ids: Sequence[str], *, actor: MemorySource = MemorySource.API
    ) -> Removed:
        """Delete the user's memories with these ids (unknown ids are ignored)."""
        return await self._delete(user_id, Memory.id.in_(list(memory_ids)), actor)

    async def delete_all(self, user_id: str, *, actor: MemorySource = MemorySource.API) -> Removed:
        """Erase everything kept about the user's memories: the memories, their history, the
        fingerprints of processed turns and the Manager jobs not yet applied."""
        deleted = await self._delete(user_id, None, actor)
        async with writing(self.sessions) as session:
            for table in (MemoryEvent, ProcessedTurn, ManagerJob):
                await session.execute(delete(table).where(table.user_id == user_id))
        return deleted

    async def _delete(self, user_id: str, condition: Any, actor: MemorySource) -> Removed:
        async with writing(self.sessions) as session:
            query = select(Memory.key, Memory.id, Memory.content).where(Memory.user_id == user_id)
            if condition is not None:
                query = query.where(condition)
            found = list(await session.execute(query))
            if not found:
                return Removed([], await self._version_in(session, user_id))
            keys = [key for key, _, _ in found]
            await session.execute(delete(Memory).where(Memory.key.in_(keys)))
            for _, memory_id, content in found:
                events.record(session, user_id, memory_id, EventAction.DELETED, actor,
                              before=content)  # fmt: skip
            return Removed(keys, await bump_version(session, user_id))

    async def history(self, user_id: str, memory_id: str) -> list[events.Event]:
        """Every write to one of the user's memories, oldest first, also after its deletion."""
        async with self.sessions() as session:
            return await events.history(session, user_id, memory_id)

    # --- bookkeeping (no version bump) ------------------------------------------------------

    async def mark_recalled(self, user_id: str, keys: Sequence[int]) -> None:
        """recall_count += 1 and last_recalled_at = now for these memories; returns once they
        are committed (coalesced with concurrent calls:
        :class:`~app.memory.store.marks.RecallMarks`)."""
        await self._marks.mark(user_id, keys)

    async def set_embeddings(self, user_id: str, vectors: Sequence[tuple[int, bytes, str]]) -> None:
        """Store (key, embedding, model) for memories whose text did not change."""
        async with writing(self.sessions) as session:
            for key, embedding, model in vectors:
                await session.execute(
                    update(Memory)
                    .where(Memory.user_id == user_id, Memory.key == key)
                    .values(embedding=embedding, embedding_model=model)
                )

    # --- reads ------------------------------------------------------------------------------

    async def get(self, user_id: str, memory_id: str) -> MemoryRecord | None:
        async with self.sessions() as session:
            row = await session.scalar(own(user_id).where(Memory.id == memory_id))
            return record_of(row) if row is not None else None

    async def get_many(self, user_id: str, keys: Sequence[int]) -> dict[int, MemoryRecord]:
        """The user's memories with these keys, by key (embeddings not loaded)."""
        if not keys:
            return {}
        # By primary key alone: with the user in the WHERE clause SQLite scans the user's index
        # (12 ms at 100k memories); the owner is checked here instead. Core rows, no ORM
        # session: this runs on every recall.
        query = select(*RECORD_COLUMNS).where(Memory.key.in_(list(keys)))
        async with self._engine.connect() as connection:
            rows = await connection.execute(query)
            return {row.key: record_of_row(row) for row in rows if row.user_id == user_id}


async def bump_version(session: AsyncSession, user_id: str) -> int:
    """version += 1 for the user, creating the row on the first write; the new version.

    One atomic upsert, so two processes writing a new user's first memories at once cannot
    both insert it; the write lock it takes orders the user's writes across processes.
    """
    statement = (
        insert_for(session)(UserState)
        .values(user_id=user_id, version=1)
        .on_conflict_do_update(
            index_elements=[UserState.user_id], set_={"version": UserState.version + 1}
        )
        .returning(UserState.version)
    )
    return int((await session.execute(statement)).scalar_one())


async def _unbump(session: AsyncSession, user_id: str) -> int:
    """Undo this transaction's own :func:`bump_version` (exactly: the lock it took is held until
    the transaction ends, so no other write bumped since); the version before it."""
    statement = (
        update(UserState)
        .where(UserState.user_id == user_id)
        .values(version=UserState.version - 1)
        .returning(UserState.version)
    )
    return int((await session.execute(statement)).scalar_one())


async def _insert(session: AsyncSession, rows: Sequence[Memory], version: int) -> set[str]:
    """Insert the rows (their keys set on them), skipping those whose id exists by now; the ids
    inserted. Rows are data here, never added to the session."""
    statement = (
        insert_for(session)(Memory)
        .on_conflict_do_nothing(index_elements=[Memory.id])
        .returning(Memory.id, Memory.key)
    )
    values = [
        {column: getattr(row, column) for column in _INSERTED} | {"seq": version} for row in rows
    ]
    by_id = {row.id: row for row in rows}
    for memory_id, key in (taken := list(await session.execute(statement, values))):
        by_id[memory_id].key, by_id[memory_id].seq = key, version
    return {memory_id for memory_id, _ in taken}


async def _found(
    session: AsyncSession, user_id: str, ids: Sequence[str], *, expected: bool = False
) -> dict[str, Memory]:
    """The memories with these ids, by id; :class:`IdTaken` when one is another user's (or,
    `expected`: is not there, because another user's write took the id and it is gone again)."""
    if not ids:
        return {}
    rows = {r.id: r for r in await session.scalars(select(Memory).where(Memory.id.in_(ids)))}
    for memory_id in ids:
        row = rows.get(memory_id)
        if (row is not None and row.user_id != user_id) or (row is None and expected):
            raise IdTaken(memory_id)
    return rows
