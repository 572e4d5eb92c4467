"""The archive of forgotten memories, read (:mod:`app.memory.store.archive` writes it): a part of
the memory store (:class:`~app.memory.store.memories.MemoryStore`)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import delete, func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.memory.store.archive import (
    FORGET_CHUNK,
    Forgotten,
    as_forgotten,
    held,
)
from app.memory.store.db import writing
from app.memory.store.tables import ForgottenMemory, Memory

PURGE_BATCH = 1000
"""Forgotten memories erased per statement (the rest at the next look)."""


class Archive:
    sessions: async_sessionmaker[AsyncSession]

    async def held(self, user_id: str) -> tuple[int, int]:
        """How many facts and episodes the user holds."""
        async with self.sessions() as session:
            return await held(session.execute, user_id)

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
            return [as_forgotten(row) for row in rows], total

    async def forgotten_one(self, user_id: str, memory_id: str) -> Forgotten | None:
        async with self.sessions() as session:
            row = await session.scalar(
                select(ForgottenMemory).where(
                    ForgottenMemory.user_id == user_id, ForgottenMemory.id == memory_id
                )
            )
            return None if row is None else as_forgotten(row)

    async def purge_forgotten(self, before: datetime, *, limit: int = PURGE_BATCH) -> int:
        """Erase, for every user, up to `limit` archived memories forgotten before `before`
        (oldest first): how many. No event: their ``forgotten`` event stays."""
        async with writing(self.sessions) as session:
            oldest = (
                select(ForgottenMemory.key).where(ForgottenMemory.forgotten_at < before)
                .order_by(ForgottenMemory.forgotten_at).limit(limit)
            )  # fmt: skip
            keys = list(await session.scalars(oldest))
            if keys:
                await session.execute(delete(ForgottenMemory).where(ForgottenMemory.key.in_(keys)))
            return len(keys)
