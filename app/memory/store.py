"""The memory store: the source of truth, every operation scoped to one user.

Promises:

- every method takes the user id, and never reads, changes or counts another user's memories;
- every write bumps that user's change sequence (:meth:`MemoryStore.version`) in the same
  transaction, so a cache built at version N is stale exactly when the version is no longer N,
  whichever process wrote;
- results are plain frozen :class:`MemoryRecord` values, safe to keep after the session closes.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app.memory.models import Memory, MemorySource, MemoryType, UserState


@dataclass(frozen=True, slots=True)
class MemoryRecord:
    key: int
    """Internal int64 id (the FAISS id)."""
    id: str
    user_id: str
    content: str
    type: str
    metadata: dict[str, Any]
    source: str
    pinned: bool
    created_at: datetime
    updated_at: datetime
    recall_count: int
    last_recalled_at: datetime | None
    embedding: bytes | None = field(repr=False)
    embedding_model: str | None


@dataclass(frozen=True, slots=True)
class NewMemory:
    content: str
    type: MemoryType = MemoryType.FACT
    metadata: dict[str, Any] = field(default_factory=dict)
    pinned: bool = False
    source: MemorySource = MemorySource.API
    id: str | None = None
    """Given on import (idempotent on id); otherwise a new UUID."""
    created_at: datetime | None = None
    embedding: bytes | None = None
    embedding_model: str | None = None


class MemoryStore:
    def __init__(self, engine: AsyncEngine) -> None:
        self._sessions = async_sessionmaker(engine, expire_on_commit=False)

    async def add(self, user_id: str, items: Sequence[NewMemory]) -> list[MemoryRecord]:
        """Create memories; an item whose id already exists (for this user) is left as it is and
        returned unchanged. An id that belongs to another user raises :class:`IdTaken`."""
        now = _now()
        async with self._sessions.begin() as session:
            given = [item.id for item in items if item.id]
            existing = {}
            if given:
                rows = await session.scalars(select(Memory).where(Memory.id.in_(given)))
                existing = {row.id: row for row in rows}
            out: list[Memory] = []
            for item in items:
                found = existing.get(item.id) if item.id else None
                if found is not None:
                    if found.user_id != user_id:
                        raise IdTaken(item.id or "")
                    out.append(found)
                    continue
                row = Memory(
                    id=item.id or str(uuid.uuid4()),
                    user_id=user_id,
                    content=item.content,
                    type=item.type.value,
                    meta=dict(item.metadata),
                    source=item.source.value,
                    pinned=item.pinned,
                    created_at=item.created_at or now,
                    updated_at=now,
                    recall_count=0,
                    embedding=item.embedding,
                    embedding_model=item.embedding_model,
                )
                session.add(row)
                out.append(row)
            if len(out) > len(existing):
                await _bump(session, user_id)
            await session.flush()
            return [_record(row) for row in out]

    async def get(self, user_id: str, memory_id: str) -> MemoryRecord | None:
        async with self._sessions() as session:
            row = await session.scalar(_own(user_id).where(Memory.id == memory_id))
            return _record(row) if row is not None else None

    async def list(
        self,
        user_id: str,
        *,
        types: Sequence[MemoryType] = (),
        contains: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> tuple[list[MemoryRecord], int]:
        """A page of the user's memories, newest first, and how many match in all."""
        query = _own(user_id)
        if types:
            query = query.where(Memory.type.in_([t.value for t in types]))
        if contains:
            query = query.where(
                func.lower(Memory.content).contains(contains.lower(), autoescape=True)
            )
        async with self._sessions() as session:
            total = await session.scalar(select(func.count()).select_from(query.subquery())) or 0
            rows = await session.scalars(
                query.order_by(Memory.created_at.desc(), Memory.key.desc())
                .limit(limit)
                .offset(offset)
            )
            return [_record(row) for row in rows], total

    async def update(self, user_id: str, memory_id: str, **changes: Any) -> MemoryRecord | None:
        """Change `content`, `type`, `metadata`, `pinned`, `embedding`/`embedding_model`."""
        unknown = set(changes) - {
            "content",
            "type",
            "metadata",
            "pinned",
            "embedding",
            "embedding_model",
        }
        if unknown:
            raise ValueError(f"cannot change {sorted(unknown)}")
        async with self._sessions.begin() as session:
            row = await session.scalar(_own(user_id).where(Memory.id == memory_id))
            if row is None:
                return None
            for name, value in changes.items():
                if name == "metadata":
                    row.meta = dict(value)
                elif name == "type":
                    row.type = MemoryType(value).value
                else:
                    setattr(row, name, value)
            row.updated_at = _now()
            await _bump(session, user_id)
            await session.flush()
            return _record(row)

    async def delete(self, user_id: str, memory_ids: Sequence[str]) -> int:
        """Delete the user's memories with these ids; how many there were."""
        async with self._sessions.begin() as session:
            result = await session.execute(
                delete(Memory).where(Memory.user_id == user_id, Memory.id.in_(list(memory_ids)))
            )
            count = int(result.rowcount or 0)  # type: ignore[attr-defined]
            if count:
                await _bump(session, user_id)
            return count

    async def delete_all(self, user_id: str) -> int:
        async with self._sessions.begin() as session:
            result = await session.execute(delete(Memory).where(Memory.user_id == user_id))
            await _bump(session, user_id)
            return int(result.rowcount or 0)  # type: ignore[attr-defined]

    async def count(self, user_id: str) -> int:
        async with self._sessions() as session:
            query = select(func.count()).where(Memory.user_id == user_id)
            return int(await session.scalar(query) or 0)

    async def version(self, user_id: str) -> int:
        """The user's change sequence: 0 before any write, then bumped by every write."""
        async with self._sessions() as session:
            value = await session.scalar(
                select(UserState.version).where(UserState.user_id == user_id)
            )
            return int(value or 0)


class IdTaken(Exception):
    """An imported memory's id already belongs to another user."""


def _own(user_id: str) -> Any:
    return select(Memory).where(Memory.user_id == user_id)


async def _bump(session: AsyncSession, user_id: str) -> None:
    """version += 1 for the user, creating the row on the first write: one atomic upsert, so
    two processes writing a new user's first memories at once cannot both insert it."""
    dialect = session.bind.dialect.name if session.bind is not None else "sqlite"
    insert = postgresql_insert if dialect == "postgresql" else sqlite_insert
    statement = insert(UserState).values(user_id=user_id, version=1)
    statement = statement.on_conflict_do_update(
        index_elements=[UserState.user_id], set_={"version": UserState.version + 1}
    )
    await session.execute(statement)


def _now() -> datetime:
    return datetime.now(UTC)


def _record(row: Memory) -> MemoryRecord:
    return MemoryRecord(
        key=row.key,
        id=row.id,
        user_id=row.user_id,
        content=row.content,
        type=row.type,
        metadata=dict(row.meta or {}),
        source=row.source,
        pinned=row.pinned,
        created_at=_aware(row.created_at),
        updated_at=_aware(row.updated_at),
        recall_count=row.recall_count,
        last_recalled_at=_aware(row.last_recalled_at) if row.last_recalled_at else None,
        embedding=row.embedding,
        embedding_model=row.embedding_model,
    )


def _aware(value: datetime) -> datetime:
    # SQLite keeps no time zone: what went in as UTC comes back naive.
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
