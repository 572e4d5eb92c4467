"""The store's bulk reads: pages, exports, index snapshots, statistics. Every query is scoped to
one user, as the store promises (:mod:`app.memory.store.memories`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from datetime import datetime
from typing import Any, TypeAlias

from sqlalchemy import Row, Select, func, literal, select, union_all
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from sqlalchemy.orm import defer

from app.memory.store.links import key_links, linked_ids
from app.memory.store.records import (
    IndexRow,
    MemoryRecord,
    Snapshot,
    UserSummary,
    aware,
    record_of,
)
from app.memory.store.tables import (
    ManagerJob,
    ManagerState,
    Memory,
    MemoryEvent,
    MemoryType,
)
from app.memory.store.versions import VERSION, read_version

IndexColumns: TypeAlias = (
    "Row[int, str, str, datetime, bytes | None, str | None, bool, bool, datetime, int, str | None]"
)
"""A row of :func:`_index_query`, typed column by column, so mypy checks both the query that
makes it and every unpacking of it. (When this took ``Any``, mypy let a query of five columns
reach an unpacking of six.)"""


class MemoryQueries:
    _engine: AsyncEngine
    sessions: async_sessionmaker[AsyncSession]

    async def page(
        self,
        user_id: str,
        *,
        types: Sequence[MemoryType] = (),
        contains: str | None = None,
        profile: bool | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> tuple[list[MemoryRecord], int]:
        """A page of the user's memories, newest first, and how many match in all (`profile`:
        only profile facts, or only the others)."""
        query = own(user_id)
        if types:
            query = query.where(Memory.type.in_([t.value for t in types]))
        if profile is not None:
            query = query.where(Memory.profile.is_(profile))
        if contains:
            query = query.where(
                func.lower(Memory.content).contains(contains.lower(), autoescape=True)
            )
        async with self.sessions() as session:
            total = await session.scalar(select(func.count()).select_from(query.subquery())) or 0
            rows = await session.scalars(
                query.options(defer(Memory.embedding))
                .order_by(Memory.created_at.desc(), Memory.key.desc())
                .limit(limit)
                .offset(offset)
            )
            return [record_of(row, embedding=False) for row in rows], total

    async def iterate(self, user_id: str, *, page: int = 500) -> AsyncIterator[MemoryRecord]:
        """Every memory of the user, oldest key first, read a page at a time (for export)."""
        after = 0
        while True:
            query = (
                own(user_id)
                .options(defer(Memory.embedding))
                .where(Memory.key > after)
                .order_by(Memory.key)
                .limit(page)
            )
            async with self.sessions() as session:
                rows = [record_of(r, embedding=False) for r in await session.scalars(query)]
            for row in rows:
                yield row
            if len(rows) < page:
                return
            after = rows[-1].key

    async def count(self, user_id: str) -> int:
        async with self.sessions() as session:
            query = select(func.count()).where(Memory.user_id == user_id)
            return int(await session.scalar(query) or 0)

    async def version(self, user_id: str) -> int:
        """The user's change sequence: 0 before any write, then bumped by every write."""
        return await read_version(self._engine, user_id)  # on every recall: the driver's way

    async def snapshot(self, user_id: str, *, since: int = -1) -> Snapshot:
        """What an index of the user needs: the version, then the rows written after `since`
        (all rows by default) and how many rows the user has now.

        The version is read first: rows may be newer than it, never older, so a cache that
        records it at worst catches up once more than needed.
        """
        async with self.sessions() as session:
            version = await version_of(session, user_id)
            query = _index_query(user_id)
            if since >= 0:
                query = query.where(Memory.seq > since)
            rows = [_index_row(row) for row in await session.execute(query)]
            total = await session.scalar(select(func.count()).where(Memory.user_id == user_id))
            episodes = [r.key for r in rows if r.type == MemoryType.EPISODE.value]
            # A catch-up reads the links of its own episodes only, by key (the index on the
            # links' episode_id): filtering all the user's links by seq read 50k of them, 0.4-0.8 s.
            links = (
                []
                if not episodes
                else await key_links(session, user_id)
                if since < 0
                else await key_links(session, user_id, episodes)
            )
            return Snapshot(version, rows, int(total or 0), links)

    async def links(self, user_id: str, episode_keys: Sequence[int]) -> list[tuple[int, int]]:
        """(fact key, episode key) of the provenance links of these episodes of the user."""
        if not episode_keys:
            return []
        async with self.sessions() as session:
            return await key_links(session, user_id, episode_keys)

    async def linked(self, user_id: str, memory_ids: Sequence[str]) -> dict[str, list[str]]:
        """For each of these memories of the user, the ids of those linked to it, in one query
        (:func:`~app.memory.store.links.linked_ids`); those without links are left out."""
        async with self.sessions() as session:
            return await linked_ids(session, user_id, memory_ids)

    async def keys(self, user_id: str) -> set[int]:
        async with self.sessions() as session:
            return set(await session.scalars(select(Memory.key).where(Memory.user_id == user_id)))

    async def rows(self, user_id: str, keys: Sequence[int]) -> list[IndexRow]:
        """What an index needs of the user's memories with these keys (unknown keys skipped)."""
        if not keys:
            return []
        query = _index_query(user_id).where(Memory.key.in_(list(keys)))
        async with self.sessions() as session:
            return [_index_row(row) for row in await session.execute(query)]

    async def stats(self, user_id: str) -> dict[str, Any]:
        """Counts by type, pinned, profile, recall totals, oldest and newest, for one user."""
        async with self.sessions() as session:
            by_type = dict(
                (t, int(n))
                for t, n in await session.execute(
                    select(Memory.type, func.count())
                    .where(Memory.user_id == user_id)
                    .group_by(Memory.type)
                )
            )
            pinned, profile, recalled, oldest, newest = (
                await session.execute(
                    select(
                        func.count().filter(Memory.pinned.is_(True)),
                        func.count().filter(Memory.profile.is_(True)),
                        func.coalesce(func.sum(Memory.recall_count), 0),
                        func.min(Memory.created_at),
                        func.max(Memory.created_at),
                    ).where(Memory.user_id == user_id)
                )
            ).one()
            return {
                "total": sum(by_type.values()),
                "by_type": by_type,
                "pinned": int(pinned or 0),
                "profile": int(profile or 0),
                "recall_count": int(recalled or 0),
                "oldest": _aware(oldest),
                "newest": _aware(newest),
                "version": await version_of(session, user_id),
            }

    async def user_summaries(
        self, *, limit: int = 100, offset: int = 0
    ) -> tuple[list[UserSummary], int]:
        """Every user memproxy knows of (with memories, their history, or Manager jobs), latest
        activity first, a page at a time; and how many there are in all."""
        when = func.max(_activity.c.at)
        grouped = select(
            _activity.c.user_id, func.sum(_activity.c.memories).label("n"), when.label("at")
        ).group_by(_activity.c.user_id)
        async with self.sessions() as session:
            total = await session.scalar(select(func.count()).select_from(grouped.subquery()))
            rows = await session.execute(
                grouped.order_by(when.is_(None), when.desc(), _activity.c.user_id)
                .limit(limit)
                .offset(offset)
            )
            found = [UserSummary(u, int(n or 0), _aware(_instant(at))) for u, n, at in rows]
        return found, int(total or 0)

    async def users(self) -> list[tuple[str, int]]:
        """Every user with memories, and how many (for maintenance commands)."""
        query = (
            select(Memory.user_id, func.count()).group_by(Memory.user_id).order_by(Memory.user_id)
        )
        async with self.sessions() as session:
            return [(u, int(n)) for u, n in await session.execute(query)]


def _latest(column: Any, user: Any, memories: Any = 0) -> Select[Any]:
    return select(
        user.label("user_id"), literal(memories).label("memories"), func.max(column).label("at")
    ).group_by(user)


_activity = union_all(
    select(
        Memory.user_id.label("user_id"),
        func.count().label("memories"),
        func.max(Memory.updated_at).label("at"),
    ).group_by(Memory.user_id),
    _latest(Memory.last_recalled_at, Memory.user_id),
    _latest(MemoryEvent.created_at, MemoryEvent.user_id),
    _latest(ManagerState.last_job_at, ManagerState.user_id),
    _latest(ManagerJob.created_at, ManagerJob.user_id),
).subquery()
"""One row per user and kind of activity: (user_id, memories, latest time)."""


def _instant(value: datetime | str | None) -> datetime | None:
    """A time from a UNION: SQLite hands back the stored text (the union drops its type)."""
    if isinstance(value, str):
        return datetime.fromisoformat(value)
    return value


def _index_query(
    user_id: str,
) -> Select[
    int, str, str, datetime, bytes | None, str | None, bool, bool, datetime, int, str | None
]:
    """The columns an index reads (:class:`IndexRow`'s), of the user's memories: one query for
    the full build, the catch-up by sequence and the fetch by key alike."""
    return select(
        Memory.key,
        Memory.type,
        Memory.content,
        Memory.created_at,
        Memory.embedding,
        Memory.embedding_model,
        Memory.pinned,
        Memory.profile,
        Memory.observed_at,
        Memory.recall_count,
        Memory.index_text,
    ).where(Memory.user_id == user_id)


def _index_row(row: IndexColumns) -> IndexRow:
    (
        key,
        type_,
        content,
        created_at,
        embedding,
        model,
        pinned,
        profile,
        observed,
        recalls,
        key_text,
    ) = row
    return IndexRow(
        key, type_, content, aware(created_at), embedding, model,
        pinned, profile, aware(observed), recalls, key_text,
    )  # fmt: skip


async def version_of(session: AsyncSession, user_id: str) -> int:
    """The user's change sequence (0 before any write)."""
    value = await session.scalar(VERSION, {"user_id": user_id})
    return int(value or 0)


def own(user_id: str) -> Select[Memory]:
    """Select the user's memories (never another's)."""
    return select(Memory).where(Memory.user_id == user_id)


def _aware(value: datetime | None) -> datetime | None:
    return aware(value) if value is not None else None
