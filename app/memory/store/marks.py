"""Recall bookkeeping, coalesced: each chat that injects memories counts them as recalled
(``recall_count``, ``last_recalled_at``), and one write transaction per chat was the busiest
writer of a loaded server. Marks that arrive while a batch is being written wait and go together
in the next batch: one transaction for however many chats ended meanwhile, nothing counted twice
or lost (a failed batch is reported to each of its callers).

Several processes on one PostgreSQL write such batches at once, over the same memories: a batch
locks its rows in key order before it updates them (two batches locking in their own orders
deadlocked: hundreds of lost batches in a run of three replicas), and one that still meets a
deadlock (another writer's order) is written again."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.memory.store.db import is_deadlock, writing
from app.memory.store.records import now
from app.memory.store.tables import Memory
from app.proxy.offload import pieces

ATTEMPTS = 3
"""Writes of one batch that met a deadlock, before its callers are told."""
LOCK_BATCH = 1000
"""Keys locked per statement (a bound parameter each; asyncpg takes at most 32,767)."""


class RecallMarks:
    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self._sessions = sessions
        self._pending: dict[tuple[str, int], int] = {}
        """Marks not yet written: (user, memory key) -> how many times recalled."""
        self._batch: asyncio.Future[None] | None = None
        """Resolved when the pending marks are committed."""
        self._writer: asyncio.Task[None] | None = None

    async def mark(self, user_id: str, keys: Sequence[int]) -> None:
        """Count the user's memories with these keys as recalled once more, now; returns once
        that is committed (raises what the write raised)."""
        if not keys:
            return
        loop = asyncio.get_running_loop()
        for key in keys:
            self._pending[(user_id, key)] = self._pending.get((user_id, key), 0) + 1
        if self._batch is None:
            self._batch = loop.create_future()
            self._batch.add_done_callback(_retrieved)  # also when every caller gave up
        batch = self._batch
        if self._writer is None or self._writer.done():
            self._writer = loop.create_task(self._write(), name="mark-recalled")
        await asyncio.shield(batch)

    async def _write(self) -> None:
        while self._pending:
            pending, self._pending = self._pending, {}
            batch, self._batch = self._batch, None
            assert batch is not None
            for attempt in range(1, ATTEMPTS + 1):
                try:
                    await self._commit(pending)
                except Exception as exc:
                    if attempt < ATTEMPTS and is_deadlock(exc):
                        continue
                    batch.set_exception(exc)
                else:
                    batch.set_result(None)
                break

    async def _commit(self, pending: dict[tuple[str, int], int]) -> None:
        groups: dict[tuple[str, int], list[int]] = {}
        for (user_id, key), times in pending.items():
            groups.setdefault((user_id, times), []).append(key)
        keys = sorted({key for _, key in pending})
        stamp = now()
        async with writing(self._sessions) as session:
            for _, chunk in pieces(keys, LOCK_BATCH):  # SQLite ignores FOR UPDATE
                await session.execute(
                    select(Memory.key)
                    .where(Memory.key.in_(chunk))
                    .order_by(Memory.key)
                    .with_for_update()
                )
            for (user_id, times), group in groups.items():
                await session.execute(
                    update(Memory)
                    .where(Memory.user_id == user_id, Memory.key.in_(group))
                    .values(recall_count=Memory.recall_count + times, last_recalled_at=stamp)
                )


def _retrieved(batch: asyncio.Future[None]) -> None:
    if not batch.cancelled():
        batch.exception()  # reported to its callers already: no "exception never retrieved"
