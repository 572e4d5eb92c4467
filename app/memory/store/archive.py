"""The archive of forgotten memories (:class:`~app.memory.store.tables.ForgottenMemory`): what
forgetting over a capacity takes out of a user's memories, kept whole so that it can be put back
with the same id.

- :func:`forget` moves memories into the archive inside a unit of work (with the unit's other
  writes, e.g. the idle job it consumes): each gets a ``forgotten`` event with its reason, its
  provenance links are remembered by id and removed, pinned and profile memories are never
  taken;
- :class:`Archive` (a part of the memory store) reads the archive, drops a row once its memory
  is back (:meth:`Archive.drop`), and purges rows past the keep time;
- erasing a user erases their archive, moving a user moves it (:mod:`.whole`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import delete, func, or_, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.memory.store.db import writing
from app.memory.store.records import aware, now
from app.memory.store.tables import (
    EventAction,
    ForgottenMemory,
    Memory,
    MemoryLink,
    MemoryType,
)
from app.memory.store.unit import Writer

FORGET_CHUNK = 500
"""Memories per statement (a bound parameter list stays small)."""


@dataclass(frozen=True, slots=True)
class Forgotten:
    """One archived memory, as the page and the API show it."""

    id: str
    content: str
    type: str
    metadata: dict[str, Any]
    source: str
    created_at: datetime
    observed_at: datetime
    recall_count: int
    last_recalled_at: datetime | None
    index_text: str | None
    links: list[str]
    reason: str
    forgotten_at: datetime


@dataclass(frozen=True, slots=True)
class Standing:
    """What forgetting weighs of one of a user's memories (no text, no vector)."""

    key: int
    id: str
    type: str
    kept: bool
    """Pinned or in the profile: never forgotten."""
    linked: bool
    """A fact was written from it (an episode), or it was written from an episode (a fact)."""
    created_at: datetime
    updated_at: datetime
    recall_count: int
    last_recalled_at: datetime | None


def _forgotten(row: ForgottenMemory) -> Forgotten:
    return Forgotten(
        row.id, row.content, row.type, dict(row.meta or {}), row.source, aware(row.created_at),
        aware(row.observed_at), row.recall_count,
        aware(row.last_recalled_at) if row.last_recalled_at else None, row.index_text,
        list(row.links or []), row.reason, aware(row.forgotten_at),
    )  # fmt: skip


async def forget(w: Writer, reasons: Mapping[int, str]) -> list[int]:
    """Move the user's memories with these keys into the archive, each with its reason (in its
    ``forgotten`` event and its archive row), inside the unit `w`. Pinned and profile memories,
    and keys that are not the user's (or gone meanwhile), are left alone. The keys moved."""
    wanted = list(reasons)
    moved: list[int] = []
    stamp = now()
    for start in range(0, len(wanted), FORGET_CHUNK):
        chunk = wanted[start : start + FORGET_CHUNK]
        rows = list(
            (await w.execute(
                select(Memory).where(
                    Memory.user_id == w.user_id, Memory.key.in_(chunk),
                    Memory.pinned.is_(False), Memory.profile.is_(False),
                )
            )).scalars()
        )  # fmt: skip
        if not rows:
            continue
        ids = [row.id for row in rows]
        linked: dict[str, list[str]] = {i: [] for i in ids}
        links = await w.execute(
            select(MemoryLink.fact_id, MemoryLink.episode_id).where(
                MemoryLink.user_id == w.user_id,
                or_(MemoryLink.fact_id.in_(ids), MemoryLink.episode_id.in_(ids)),
            )
        )
        pairs = cast("list[tuple[str, str]]", links.all())
        for fact_id, episode_id in pairs:
            if fact_id in linked:
                linked[fact_id].append(episode_id)
            if episode_id in linked:
                linked[episode_id].append(fact_id)
        await w.execute(
            delete(MemoryLink).where(
                MemoryLink.user_id == w.user_id,
                or_(MemoryLink.fact_id.in_(ids), MemoryLink.episode_id.in_(ids)),
            )
        )
        for row in rows:
            w.archive(ForgottenMemory(
                id=row.id, user_id=w.user_id, content=row.content, type=row.type,
                meta=dict(row.meta or {}), source=row.source, created_at=row.created_at,
                observed_at=row.observed_at, recall_count=row.recall_count,
                last_recalled_at=row.last_recalled_at, index_text=row.index_text,
                links=linked[row.id], reason=reasons[row.key], forgotten_at=stamp,
            ))  # fmt: skip
            w.note(row.id, EventAction.FORGOTTEN, before=row.content, detail=reasons[row.key])
        keys = [row.key for row in rows]
        await w.execute(delete(Memory).where(Memory.key.in_(keys)))
        moved += keys
    return moved


class Archive:
    sessions: async_sessionmaker[AsyncSession]

    async def held(self, user_id: str) -> tuple[int, int]:
        """How many facts and episodes the user holds (one count query)."""
        episode = Memory.type == MemoryType.EPISODE.value
        async with self.sessions() as session:
            row = (await session.execute(
                select(func.count(), func.count().filter(episode))
                .where(Memory.user_id == user_id)
            )).one()  # fmt: skip
        total, episodes = int(row[0]), int(row[1])
        return total - episodes, episodes

    async def standing(self, user_id: str) -> list[Standing]:
        """Every memory of the user, as forgetting weighs it (one read: ~100 bytes a memory)."""
        async with self.sessions() as session:
            facts = set(await session.scalars(
                select(MemoryLink.fact_id).where(MemoryLink.user_id == user_id)
            ))  # fmt: skip
            episodes = set(await session.scalars(
                select(MemoryLink.episode_id).where(MemoryLink.user_id == user_id)
            ))  # fmt: skip
            rows = await session.execute(
                select(Memory.key, Memory.id, Memory.type, Memory.pinned, Memory.profile,
                       Memory.created_at, Memory.updated_at, Memory.recall_count,
                       Memory.last_recalled_at)
                .where(Memory.user_id == user_id)
            )  # fmt: skip
            return [
                Standing(key, memory_id, kind, bool(pinned or profile),
                         memory_id in facts or memory_id in episodes, aware(created),
                         aware(updated), int(count or 0), aware(last) if last else None)
                for key, memory_id, kind, pinned, profile, created, updated, count, last in rows
            ]  # fmt: skip

    async def contents(self, user_id: str, keys: list[int]) -> dict[int, str]:
        """The words of these memories of the user, by key."""
        found: dict[int, str] = {}
        async with self.sessions() as session:
            for start in range(0, len(keys), FORGET_CHUNK):
                chunk = keys[start : start + FORGET_CHUNK]
                found.update(
                    (int(k), str(c)) for k, c in await session.execute(
                        select(Memory.key, Memory.content)
                        .where(Memory.user_id == user_id, Memory.key.in_(chunk))
                    )
                )  # fmt: skip
        return found

    async def forgotten(
        self, user_id: str, *, limit: int, offset: int = 0
    ) -> tuple[list[Forgotten], int]:
        """The user's archived memories, most recently forgotten first, and how many in all."""
        mine = ForgottenMemory.user_id == user_id
        async with self.sessions() as session:
            total = int(await session.scalar(select(func.count()).where(mine)) or 0)
            rows = await session.scalars(
                select(ForgottenMemory).where(mine)
                .order_by(ForgottenMemory.forgotten_at.desc(), ForgottenMemory.key.desc())
                .limit(limit).offset(offset)
            )  # fmt: skip
            return [_forgotten(row) for row in rows], total

    async def forgotten_one(self, user_id: str, memory_id: str) -> Forgotten | None:
        async with self.sessions() as session:
            row = await session.scalar(
                select(ForgottenMemory).where(
                    ForgottenMemory.user_id == user_id, ForgottenMemory.id == memory_id
                )
            )
            return None if row is None else _forgotten(row)

    async def drop_forgotten(self, user_id: str, memory_id: str) -> bool:
        """Take one row out of the archive (its memory is back); False when it was not there."""
        async with writing(self.sessions) as session:
            result = await session.execute(
                delete(ForgottenMemory).where(
                    ForgottenMemory.user_id == user_id, ForgottenMemory.id == memory_id
                )
            )
            return bool(result.rowcount)  # type: ignore[attr-defined]

    async def purge_forgotten(self, user_id: str, before: datetime) -> int:
        """Erase the user's archived memories forgotten before `before`: how many."""
        async with writing(self.sessions) as session:
            result = await session.execute(
                delete(ForgottenMemory).where(
                    ForgottenMemory.user_id == user_id, ForgottenMemory.forgotten_at < before
                )
            )
            return int(result.rowcount or 0)  # type: ignore[attr-defined]
